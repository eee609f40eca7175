// The values the fused q/k norm + RoPE kernels are compiled and launched with (CUB-style tuning
// policy). Kernels take the policy as a template parameter; the kernel lab (workshop/lab) derives
// alternatives from this one. Measurements behind each value: benchmarks/NOTES.md §rope.
#pragma once

#include "common/schedule.cuh"

namespace transformer_kernels {

struct QkNormRopePolicy {
  // Vectors a thread holds between the reduction and the store, in a row group and for the widest
  // rows (the whole row stays in registers: this sets the widest row). NOTES.md §rope
  static constexpr int kCachedVecs = 4;
  // The same with a block per row, where the row allows it (2 beat 4 for LTX's rows). NOTES.md §rope
  static constexpr int kBlockCachedVecs = 2;
  // q's and k's rows of a token share one thread group and its cos/sin loads when each has one norm
  // group (LTX), in the table form. NOTES.md §rope
  static constexpr bool kShareTables = true;
  // Threads of a block in the row-group modes. NOTES.md §rope
  static constexpr int kGroupBlockThreads = 256;
  // Row groups: the narrowest that holds a row (4 lanes: one head of 128 bf16), else a warp; a
  // block per row beyond. NOTES.md §rope
  using RowGroups = RowGroupWidths<4, 32>;
  // Rows sharing one computation of cos/sin in LTX's coordinate form: q's and k's (1 or 2). NOTES.md §rope
  static constexpr int kLtxCoordsRows = 2;
};

}  // namespace transformer_kernels
