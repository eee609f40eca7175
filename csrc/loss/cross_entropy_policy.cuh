// The values the cross-entropy row kernels are compiled and launched with (CUB-style tuning policy),
// each with its reason. What was measured, and what is assumed until the GPU lab tries
// alternatives: benchmarks/NOTES.md §"Tuning values assumed, not measured".
#pragma once

namespace transformer_kernels {

struct CrossEntropyPolicy {
  // A block per row at a time (the grid strides over rows): 1024 threads keep 64 KB of loads in
  // flight per SM, and one row per SM in flight (256 KB of bf16 at a 128 K vocabulary, 33 MB over
  // 132 SMs) lets the second pass over the row find it in L2. Assumed (NOTES.md).
  static constexpr int kBlocksPerSm = 1;
  // 16-byte loads of one pass a thread keeps in flight.
  static constexpr int kVecsPerThread = 4;
};

}  // namespace transformer_kernels
