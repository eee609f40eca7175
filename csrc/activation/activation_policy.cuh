// The values the activations' backward kernels are compiled and launched with (CUB-style tuning
// policy; the forwards are the elementwise engine's forms: common/elementwise_policy.cuh).
#pragma once

namespace transformer_kernels {

struct ActivationBackwardPolicy {
  // Threads of a block; short rows share one.
  static constexpr int kBlockThreads = 256;
  // 16-byte vectors of each operand a thread loads per step, all in flight together: the forwards
  // keep 4 (4 or 8 loads a thread with their one or two inputs); the backward reads two operands
  // (kAct: g, x) or three (kActMul: g, gate, gated), so 4 or 2 keep 8 or 6 loads in flight at 16 of
  // a vector's registers each. Assumed: NOTES.md §"Tuning values assumed, not measured".
  static constexpr int kActVecsPerThread = 4;
  static constexpr int kGatedVecsPerThread = 2;
};

}  // namespace transformer_kernels
