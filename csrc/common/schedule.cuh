// How the row kernels map rows onto threads, for every family: row groups (several rows a block,
// a fixed number of lanes each) or a block per row, rows split over several blocks, power-of-two
// threads per row, grid sizes, and block sizes within a kernel's register budget. Torch-free.
// The numbers these are called with are each family's policy (<family>_policy.cuh).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/math.cuh"
#include "common/reduce.cuh"

namespace transformer_kernels {

// The most threads a block can have (every architecture we build for).
constexpr int kMaxBlockThreads = 1024;

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One-dimensional grid of blocks for `items` row groups at `per_block` a block.
inline dim3 grid_for(int64_t items, int64_t per_block) { return dim3(static_cast<unsigned>(ceil_div(items, per_block))); }

// The fewest whole warps that leave each thread at most `per_thread` of `items`.
constexpr int warps_covering(int64_t items, int per_thread) {
  return static_cast<int>(ceil_div(ceil_div(items, per_thread), kWarpSize) * kWarpSize);
}

// ---- row groups or a block per row (norms, fused q/k norm + RoPE) ----

// The lanes of the row groups a kernel family compiles: ascending powers of two up to a warp
// (a policy's RowGroups).
template <int... kLanes>
struct RowGroupWidths {
  static_assert(sizeof...(kLanes) > 0, "at least one width");
  static_assert(((kLanes >= 1 && kLanes <= kWarpSize && (kLanes & (kLanes - 1)) == 0) && ...),
                "powers of two up to a warp");
};

// Lanes a row takes: the narrowest of the widths that holds its `units` at `per_lane` a lane, or 0
// (a whole block per row) when none does.
template <int... kLanes>
constexpr int row_group_lanes(RowGroupWidths<kLanes...>, int64_t units, int per_lane) {
  int lanes = 0;
  for (int w : {kLanes...}) {
    if (lanes == 0 && units <= static_cast<int64_t>(w) * per_lane) lanes = w;
  }
  return lanes;
}

// Calls f(std::integral_constant<int, lanes>{}) for a row_group_lanes choice (0: a block per row),
// so that its kernel is picked at compile time.
template <int kLanes, int... kWider, typename F>
decltype(auto) with_row_group_lanes(RowGroupWidths<kLanes, kWider...>, int lanes, F&& f) {
  if (lanes == kLanes) return f(std::integral_constant<int, kLanes>{});
  if constexpr (sizeof...(kWider) > 0) {
    return with_row_group_lanes(RowGroupWidths<kWider...>{}, lanes, static_cast<F&&>(f));
  } else {
    return f(std::integral_constant<int, 0>{});
  }
}

// Lanes of this thread's warp whose row groups have a row, when groups of kThreadsPerRow lanes
// take consecutive rows starting at `warp_first_row`: a prefix of the warp. Groups without a row
// exit early, so shuffles must not name their lanes.
template <int kThreadsPerRow>
TK_DEVICE unsigned row_group_mask(int64_t warp_first_row, int64_t num_rows) {
  if constexpr (kThreadsPerRow == 0 || kThreadsPerRow == kWarpSize) {
    return kFullMask;
  } else {
    const int64_t lanes = (num_rows - warp_first_row) * kThreadsPerRow;
    return lanes >= kWarpSize ? kFullMask : (1u << lanes) - 1u;
  }
}

// Where this thread works when rows are handled by aligned groups of kThreadsPerRow lanes, several
// rows per block (kThreadsPerRow <= 32), or by a whole block each (kThreadsPerRow == 0).
template <int kThreadsPerRow>
struct RowGroup {
  int lane;       // this thread's index among its row's threads
  int threads;    // threads per row
  int64_t row;    // may be >= num_rows: the group then has no row and must leave
  unsigned mask;  // lanes of this warp whose groups have a row: what row_reduce_sum may name

  TK_DEVICE explicit RowGroup(int64_t num_rows) {
    const int groups_per_block = kThreadsPerRow == 0 ? 1 : blockDim.x / kThreadsPerRow;
    lane = kThreadsPerRow == 0 ? threadIdx.x : threadIdx.x % kThreadsPerRow;
    threads = kThreadsPerRow == 0 ? blockDim.x : kThreadsPerRow;
    const int64_t block_first_row = static_cast<int64_t>(blockIdx.x) * groups_per_block;
    row = kThreadsPerRow == 0 ? block_first_row : block_first_row + threadIdx.x / kThreadsPerRow;
    mask = row_group_mask<kThreadsPerRow>(
        block_first_row + (threadIdx.x / kWarpSize) * (kWarpSize / (kThreadsPerRow == 0 ? kWarpSize : threads)),
        num_rows);
  }
};

// ---- rows split over several blocks (a few very wide rows) ----

// Chunks of `chunk_elems` columns each row of `hidden` is split into: 1 (not split) unless rows are
// wider than `min_hidden` and fewer than two per SM, which would otherwise leave most SMs idle.
inline int split_row_chunks(int64_t num_rows, int64_t hidden, int sm_count, int64_t min_hidden, int chunk_elems) {
  if (hidden <= min_hidden || num_rows >= 2 * static_cast<int64_t>(sm_count)) return 1;
  return static_cast<int>(ceil_div(hidden, chunk_elems));
}

// ---- power-of-two threads per row, chosen at launch (activations, RoPE) ----

// log2 of the threads a row takes: the smallest power of two that covers its `steps` (one step a
// thread; at least one thread), at most `block_threads`. Short rows then share a block.
inline int log2_threads_per_row(int64_t steps, int block_threads) {
  int log2 = 0;
  while ((int64_t{1} << log2) < steps && (1 << log2) < block_threads) ++log2;
  return log2;
}

// Where this thread works when each row (or row group) takes 2^log2_threads consecutive threads.
struct PowerOfTwoRows {
  int threads;  // threads per row
  int lane;     // this thread's index among them
  int64_t row;  // may be past the last row: the thread then has nothing to do

  TK_DEVICE explicit PowerOfTwoRows(int log2_threads)
      : threads(1 << log2_threads),
        lane(threadIdx.x & (threads - 1)),
        row(static_cast<int64_t>(blockIdx.x) * (blockDim.x >> log2_threads) + (threadIdx.x >> log2_threads)) {}
};

// ---- block size within a kernel's register budget ----

// The most threads a block of kKernel can have with its register use (cudaFuncAttributes::
// maxThreadsPerBlock, queried once), in whole warps. `fallback` where the query fails.
template <auto kKernel>
int max_block_threads(int fallback) {
  static const int max_threads = [fallback] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, kKernel) == cudaSuccess ? attr.maxThreadsPerBlock : fallback;
  }();
  return max_threads / kWarpSize * kWarpSize;
}

}  // namespace transformer_kernels
