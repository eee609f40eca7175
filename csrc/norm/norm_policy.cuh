// The values the norm kernels are compiled and launched with (CUB-style tuning policy). Kernels
// take the policy as a template parameter; the kernel lab (workshop/lab) derives alternatives from
// this one and times them side by side. Measurements behind each value: benchmarks/NOTES.md §norm.
#pragma once

#include <cstdint>

#include "common/schedule.cuh"

namespace transformer_kernels {

struct NormPolicy {
  // Vectors a thread keeps in registers across the passes of an unfused norm in a row group, so
  // that each input is read once (wider rows re-read the rest, from L2). NOTES.md §norm
  static constexpr int kCachedVecs = 4;
  // The same with a block per row: 8 leaves too few warps per SM, 2 and 1 re-read. NOTES.md §norm
  static constexpr int kBlockCachedVecs = 4;
  // The same for the fused norms (a pre-add or a modulation): 2 and 8 each lost overall. NOTES.md §norm
  static constexpr int kFusedCachedVecs = 4;
  // Threads of a block in the row-group modes (several rows a block). NOTES.md §norm
  static constexpr int kGroupBlockThreads = 256;
  // Row groups: 4 lanes for head-dim norms (128 bf16 = 16 vectors, 4 a lane), a warp up to 32
  // lanes' cached vectors; a block per row beyond. NOTES.md §norm
  using RowGroups = RowGroupWidths<4, 32>;
  // Registers of the modulated RMSNorms (ptxas picks 72-88): at 64 more rows fit per SM. NOTES.md §norm
  static constexpr int kModulatedRmsRegisterCap = 64;
  // Rows wider than this and fewer than two per SM are split over blocks (else SMs idle). NOTES.md §norm
  static constexpr int64_t kSplitMinHidden = 16384;
  // Columns of a split row's chunk, a block each (a multiple of every vector width). NOTES.md §norm
  static constexpr int kSplitChunkElems = 8192;
};

}  // namespace transformer_kernels
