// Reductions (sum, and a max that keeps NaN) over a warp, a group of lanes, or a whole thread
// block. Torch-free.
#pragma once

#include <cfloat>

#include "common/math.cuh"

namespace transformer_kernels {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// How two partial results combine: the sum, or the largest value where a NaN wins (a row's amax
// must be NaN when the row holds one; fmaxf would drop it).
struct SumOp {
  static constexpr float kIdentity = 0.f;
  TK_DEVICE float operator()(float a, float b) const { return a + b; }
};
struct NanMaxOp {
  static constexpr float kIdentity = -FLT_MAX;
  TK_DEVICE float operator()(float a, float b) const { return (a != a || b != b) ? a + b : fmaxf(a, b); }
};

// Butterfly reduction over aligned groups of `kWidth` lanes (kWidth a power of two <= 32); every
// lane of the group receives the group's result. `mask` names the lanes taking part (whole groups).
// The array form reduces N values at once (rows that share a lane group), each in the scalar order.
template <typename Op, int kWidth = kWarpSize, int N>
TK_DEVICE void group_reduce(float (&v)[N], unsigned mask = kFullMask) {
  static_assert(kWidth >= 1 && kWidth <= kWarpSize && (kWidth & (kWidth - 1)) == 0,
                "group width must be a power of two no larger than a warp");
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = Op{}(v[i], __shfl_xor_sync(mask, v[i], offset));
  }
}

template <int kWidth = kWarpSize, int N>
TK_DEVICE void group_reduce_sum(float (&v)[N], unsigned mask = kFullMask) {
  group_reduce<SumOp, kWidth>(v, mask);
}

template <int kWidth = kWarpSize>
TK_DEVICE float group_reduce_sum(float v, unsigned mask = kFullMask) {
  float a[1] = {v};
  group_reduce_sum<kWidth>(a, mask);
  return a[0];
}

// Reduction over all threads of a one-dimensional block (blockDim.x a multiple of 32, at most
// 1024); every thread receives the result, of each of the N values. Uses one __syncthreads, so call
// it at most once per kernel and kBuffer (each buffer its own shared array), unless the caller
// separates calls with another barrier.
template <typename Op, int N, int kBuffer = 0>
TK_DEVICE void block_reduce(float (&v)[N]) {
  __shared__ float warp_results[N][kWarpSize];  // one array per (Op, N, kBuffer)
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  group_reduce<Op>(v);
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) warp_results[i][warp] = v[i];
  }
  __syncthreads();
  // Every warp re-reduces the per-warp results itself: no second barrier or broadcast needed.
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = lane < num_warps ? warp_results[i][lane] : Op::kIdentity;
  group_reduce<Op>(v);
}

template <int N, int kBuffer = 0>
TK_DEVICE void block_reduce_sum(float (&v)[N]) {
  block_reduce<SumOp, N, kBuffer>(v);
}

TK_DEVICE float block_reduce_sum(float v) {
  float a[1] = {v};
  block_reduce_sum(a);
  return a[0];
}

// Reduction over the threads that share one row. kThreadsPerRow == 0 means "the whole block"
// (blockDim.x threads); otherwise an aligned group of kThreadsPerRow <= 32 lanes, `mask` naming
// the lanes of the warp whose groups have a row (RowGroup::mask, schedule.cuh). The array form
// reduces the N rows a group may hold together, each as the scalar form would.
// kBuffer: block_reduce's shared array (block mode).
template <typename Op, int kThreadsPerRow, int N, int kBuffer = 0>
TK_DEVICE void row_reduce(float (&v)[N], unsigned mask = kFullMask) {
  if constexpr (kThreadsPerRow == 0) {
    block_reduce<Op, N, kBuffer>(v);
  } else {
    group_reduce<Op, kThreadsPerRow>(v, mask);
  }
}

template <typename Op, int kThreadsPerRow, int kBuffer = 0>
TK_DEVICE float row_reduce(float v, unsigned mask = kFullMask) {
  float a[1] = {v};
  row_reduce<Op, kThreadsPerRow, 1, kBuffer>(a, mask);
  return a[0];
}

template <int kThreadsPerRow, int N, int kBuffer = 0>
TK_DEVICE void row_reduce_sum(float (&v)[N], unsigned mask = kFullMask) {
  row_reduce<SumOp, kThreadsPerRow, N, kBuffer>(v, mask);
}

template <int kThreadsPerRow, int kBuffer = 0>
TK_DEVICE float row_reduce_sum(float v, unsigned mask = kFullMask) {
  return row_reduce<SumOp, kThreadsPerRow, kBuffer>(v, mask);
}

}  // namespace transformer_kernels
