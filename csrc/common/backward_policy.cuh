// The values the row-wise backward kernels are compiled and launched with (CUB-style tuning
// policy): the norm family's and the fused q/k norm + RoPE backward, which share their row groups
// and parameter-gradient reduction (grad_reduce.cuh). What was measured, and what is assumed until
// the GPU lab tries alternatives: benchmarks/NOTES.md §"Tuning values assumed, not measured".
#pragma once

namespace transformer_kernels {

struct RowBackwardPolicy {
  // Elements each backward thread holds per row: the row's inputs and the parameter gradients'
  // running sums stay in registers, and 8 of each keep the widest kernels (the gated, modulated,
  // affine LayerNorm, ~10 arrays) within the registers of a 512-thread block.
  static constexpr int kRowElems = 8;
  // Threads per block: row groups narrower than this share a block (several rows at once), so each
  // block's parameter partial sums cover several rows before they go to the workspace. 256 rather
  // than 512: the fused kernels take 64-80 registers, at which a 512-thread block leaves an SM one
  // block (16 warps) where 256-thread blocks fit three; the price is more workspace rows (one per
  // resident block). Assumed (NOTES.md).
  static constexpr int kBlockThreads = 256;
  // The widest row group (a block).
  static constexpr int kMaxThreads = 1024;
  // Rows wider than one group can hold are split into chunks of this many columns (a multiple of
  // every vector width).
  static constexpr int kChunkElems = 2048;
  // Stage two (the column sums of the workspace): columns per block, one warp's coalesced 128 bytes,
  // and item lanes per column, summed in lane order at the end.
  static constexpr int kColumnSumCols = 32;
  static constexpr int kColumnSumLanes = 8;
};

}  // namespace transformer_kernels
