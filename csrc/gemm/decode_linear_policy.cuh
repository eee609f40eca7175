// The values the decode linear layer is compiled and launched with (CUB-style tuning policy).
// Assumed, not measured: benchmarks/NOTES.md §Decode linear layers.
#pragma once

namespace transformer_kernels {

struct DecodeLinearPolicy {
  // Threads of a block: its warps each take kChannelsPerWarp output channels.
  static constexpr int kBlockThreads = 128;
  // Output channels a warp computes for every row: each of its lanes streams 16 bytes of each
  // channel's weight row per step and reuses the step's x values across them.
  static constexpr int kChannelsPerWarp = 2;
  // Steps each lane loads before it multiplies: the bytes in flight that keep the memory busy.
  static constexpr int kStepsInFlight = 4;
};

}  // namespace transformer_kernels
