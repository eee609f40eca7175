// The values the RoPE kernels are compiled and launched with (CUB-style tuning policy). Kernels take
// the policy as a template parameter; the kernel lab (workshop/lab) derives alternatives from this
// one. Measurements behind each value: benchmarks/NOTES.md §rope. (The fused q/k norm + RoPE kernels'
// policy: qk_norm_rope/qk_norm_rope_policy.cuh.)
#pragma once

#include "common/schedule.cuh"

namespace transformer_kernels {

struct RopePolicy {
  // Threads of a block; rows of few pairs share one. NOTES.md §rope
  static constexpr int kBlockThreads = 256;
  // At most this many consecutive heads of a token share one load of its cos/sin in the table form
  // (a power of two; the cache form keeps one: more registers than it saves). NOTES.md §rope
  static constexpr int kMaxHeadsPerGroup = 2;
  // Rows sharing one computation of cos/sin in LTX's coordinate form: q's and k's of a token (1 or 2).
  // NOTES.md §rope
  static constexpr int kLtxCoordsRows = 2;
  // Vector steps of a row a thread of the coordinate form takes at a time, all loads first: its
  // loads are few and its sines long. NOTES.md §rope
  static constexpr int kLtxCoordsSteps = 2;
  // Registers of the coordinate form: four blocks an SM at two steps (12 bytes of spills). NOTES.md §rope
  static constexpr int kLtxCoordsRegisterCap = 64;
};

}  // namespace transformer_kernels
