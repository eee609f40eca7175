// The values the 8-bit attention kernels are compiled and launched with (CUB-style tuning policy).
// What is assumed rather than measured is said in benchmarks/NOTES.md §8-bit attention.
#pragma once

namespace transformer_kernels {

struct AttentionPolicy {
  // Keys per block: the unit of k's INT8 scale, of the online softmax's step and of a shared-memory
  // stage (two k32 steps of the P·V product).
  static constexpr int kBlockKeys = 64;
  // Warps of the attention block.
  static constexpr int kWarps = 4;
  // m16 tiles (16 query rows) each warp owns with 16-bit values: a k or v fragment read from shared
  // memory serves every tile of its warp. Two fit 255 registers at head dim 64 (253, sm_90 build);
  // at 128 two spill (208 bytes of stack), so one.
  static constexpr int row_tiles_per_warp(int head_dim) { return head_dim <= 64 ? 2 : 1; }
  static constexpr int kMaxRowTilesPerWarp = 2;
  // Rows (of q and of k, v) each block of the column-statistics pass covers.
  static constexpr int kStatsChunk = 256;
  // Threads of the statistics and quantization blocks.
  static constexpr int kPrepThreads = 256;
};

}  // namespace transformer_kernels
