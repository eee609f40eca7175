// The values the quantization kernels are compiled and launched with (CUB-style tuning policy).
#pragma once

namespace transformer_kernels {

struct QuantPolicy {
  // Threads of the block that quantizes one row (a row per block: the row's amax is a block
  // reduction). Assumed, not measured: NOTES.md §FP8 linear layers.
  static constexpr int kBlockThreads = 256;
};

}  // namespace transformer_kernels
