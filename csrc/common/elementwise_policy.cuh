// The values the elementwise engine (common/elementwise.cuh) is compiled and launched with (CUB-style
// tuning policy). Kernels take the policy as a template parameter; the kernel lab (workshop/lab)
// derives alternatives from this one. Measurements behind each value: benchmarks/NOTES.md §activation.
#pragma once

namespace transformer_kernels {

struct ElementwisePolicy {
  // Threads of a block; short rows share one. NOTES.md §activation
  static constexpr int kBlockThreads = 256;
  // Vectors each thread loads per step, all in flight together, for the activations alone (2
  // gained in the lab; 4 stays until the micro-benchmarks of record show 2). NOTES.md §activation
  static constexpr int kActVecsPerThread = 4;
  // The same for the gated forms (act_mul, gated_add), where 2 lost. NOTES.md §activation
  static constexpr int kGatedVecsPerThread = 4;
  // Registers of the gated units (act_mul): ptxas picks 66 (3 blocks an SM), at 64 four fit; the
  // gated add spills under 64 and keeps ptxas's choice. NOTES.md §activation
  static constexpr int kActMulRegisterCap = 64;
};

}  // namespace transformer_kernels
