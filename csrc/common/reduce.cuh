// Sum reductions over a warp, a group of lanes, or a whole thread block. Torch-free.
#pragma once

#include "common/math.cuh"

namespace transformer_kernels {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Butterfly sum over aligned groups of `kWidth` lanes (kWidth a power of two <= 32); every
// lane of the group receives the group's sum. `mask` names the lanes taking part (whole groups).
// The array form sums N values at once (rows that share a lane group), each in the scalar order.
template <int kWidth = kWarpSize, int N>
TK_DEVICE void group_reduce_sum(float (&v)[N], unsigned mask = kFullMask) {
  static_assert(kWidth >= 1 && kWidth <= kWarpSize && (kWidth & (kWidth - 1)) == 0,
                "group width must be a power of two no larger than a warp");
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(mask, v[i], offset);
  }
}

template <int kWidth = kWarpSize>
TK_DEVICE float group_reduce_sum(float v, unsigned mask = kFullMask) {
  float a[1] = {v};
  group_reduce_sum<kWidth>(a, mask);
  return a[0];
}

// Sum over all threads of a one-dimensional block (blockDim.x a multiple of 32, at most 1024);
// every thread receives the total, of each of the N values. Uses one __syncthreads, so call it at
// most once per kernel and kBuffer (each buffer its own shared array), unless the caller separates
// calls with another barrier.
template <int N, int kBuffer = 0>
TK_DEVICE void block_reduce_sum(float (&v)[N]) {
  __shared__ float warp_sums[N][kWarpSize];  // one array per (N, kBuffer)
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  group_reduce_sum(v);
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) warp_sums[i][warp] = v[i];
  }
  __syncthreads();
  // Every warp re-reduces the per-warp sums itself: no second barrier or broadcast needed.
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = lane < num_warps ? warp_sums[i][lane] : 0.f;
  group_reduce_sum(v);
}

TK_DEVICE float block_reduce_sum(float v) {
  float a[1] = {v};
  block_reduce_sum(a);
  return a[0];
}

// Sum over the threads that share one row. kThreadsPerRow == 0 means "the whole block"
// (blockDim.x threads); otherwise an aligned group of kThreadsPerRow <= 32 lanes, `mask` naming
// the lanes of the warp whose groups have a row (see row_group_mask). The array form sums the N
// rows a group may hold together, each as the scalar form would.
// kBuffer: block_reduce_sum's shared array (block mode).
template <int kThreadsPerRow, int N, int kBuffer = 0>
TK_DEVICE void row_reduce_sum(float (&v)[N], unsigned mask = kFullMask) {
  if constexpr (kThreadsPerRow == 0) {
    block_reduce_sum<N, kBuffer>(v);
  } else {
    group_reduce_sum<kThreadsPerRow>(v, mask);
  }
}

template <int kThreadsPerRow, int kBuffer = 0>
TK_DEVICE float row_reduce_sum(float v, unsigned mask = kFullMask) {
  float a[1] = {v};
  row_reduce_sum<kThreadsPerRow, 1, kBuffer>(a, mask);
  return a[0];
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

}  // namespace transformer_kernels
