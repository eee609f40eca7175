// Deterministic reductions the backward kernels share (norm family, fused q/k norm + RoPE):
// sums over a row group of any width, and the two-stage column reduction of parameter gradients
// (per-block partial sums to a workspace, then a fixed-order sum over the blocks). No float
// atomics: the same inputs on the same device give the same bits. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/math.cuh"
#include "common/reduce.cuh"
#include "common/backward_policy.cuh"

namespace transformer_kernels {

// The tuning values (RowBackwardPolicy, with their reasons), under the names the kernels use.
constexpr int kBackwardElems = RowBackwardPolicy::kRowElems;
constexpr int kBackwardBlockThreads = RowBackwardPolicy::kBlockThreads;
constexpr int kBackwardMaxThreads = RowBackwardPolicy::kMaxThreads;
constexpr int kBackwardChunkElems = RowBackwardPolicy::kChunkElems;
static_assert(kBackwardChunkElems % 8 == 0, "chunks start on a vector of every dtype");

// Threads of a row group holding `vecs` vectors, `vecs_per_thread` each: a power of two up to a
// warp (groups stay aligned within a warp), whole warps beyond.
inline int backward_row_threads(int64_t vecs, int vecs_per_thread) {
  const int64_t wanted = std::max<int64_t>(1, (vecs + vecs_per_thread - 1) / vecs_per_thread);
  if (wanted <= kWarpSize) {
    int threads = 1;
    while (threads < wanted) threads *= 2;
    return threads;
  }
  return static_cast<int>((wanted + kWarpSize - 1) / kWarpSize * kWarpSize);
}

// Threads of a block of row groups of `row_threads`: as many groups as fit kBackwardBlockThreads.
inline int backward_block_threads(int row_threads) {
  return std::max(1, kBackwardBlockThreads / row_threads) * row_threads;
}

// A barrier for the `threads` threads (whole warps) of row group `group` alone (PTX named barrier
// 1 + group; 0 is __syncthreads'), so that the groups of a block do not wait for each other.
TK_DEVICE void row_group_barrier(int group, int threads) {
  asm volatile("bar.sync %0, %1;" : : "r"(1 + group), "r"(threads) : "memory");
}

// Groups wider than a warp a block can have: one named barrier each (16 in all, 0 taken).
constexpr int kMaxWideGroups = 15;
static_assert(kBackwardBlockThreads / (2 * kWarpSize) <= kMaxWideGroups, "a named barrier per wide group");

// Sum over this thread's row group (aligned groups of `row_threads`: a power of two <= 32, or
// whole warps); every thread of the group receives the sums. Every thread of a group calls it
// together: groups wider than a warp meet at two barriers of their own.
template <int N>
TK_DEVICE void row_group_sum(float (&v)[N], int row_threads) {
  __shared__ float warp_sums[N][kBackwardMaxThreads / kWarpSize];
  const int width = row_threads < kWarpSize ? row_threads : kWarpSize;
  for (int offset = width / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(kFullMask, v[i], offset);
  }
  if (row_threads <= kWarpSize) return;
  const int warp = threadIdx.x / kWarpSize;
  const int group = threadIdx.x / row_threads;
  row_group_barrier(group, row_threads);  // the previous call's readers are done with warp_sums
  if (threadIdx.x % kWarpSize == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) warp_sums[i][warp] = v[i];
  }
  row_group_barrier(group, row_threads);
  const int warps = row_threads / kWarpSize;
  const int first = group * warps;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float s = 0.f;
    for (int w = 0; w < warps; ++w) s += warp_sums[i][first + w];
    v[i] = s;
  }
}

// The rows a block works on. Rows come in consecutive segments of segment_rows rows (the rows
// that share one row of a broadcast parameter: all rows for a [hidden] weight, S rows for a
// [B, 1, hidden] scale); each segment is cut into `splits` items, so an item never spans two
// segments and its partial sums belong to one row of every reduced gradient.
struct RowItems {
  int64_t segment_rows = 1;
  int64_t splits = 1;

  TK_HOST_DEVICE int64_t count(int64_t num_rows) const { return num_rows / segment_rows * splits; }

  // Rows [first, last) of item `item` (possibly none).
  TK_HOST_DEVICE void rows_of(int64_t item, int64_t& first, int64_t& last) const {
    const int64_t segment = item / splits, part = item % splits;
    const int64_t per_item = (segment_rows + splits - 1) / splits;
    const int64_t begin = part * per_item, end = (part + 1) * per_item;
    first = segment * segment_rows + (begin < segment_rows ? begin : segment_rows);
    last = segment * segment_rows + (end < segment_rows ? end : segment_rows);
  }
};

// Items per segment for about `target_items` items in all, each of at least `min_rows` rows
// where the segment has them (a block's row groups then all have rows).
inline RowItems backward_items(int64_t num_rows, int64_t segment_rows, int64_t target_items, int64_t min_rows) {
  RowItems items;
  items.segment_rows = std::max<int64_t>(1, segment_rows);
  const int64_t segments = std::max<int64_t>(1, num_rows / items.segment_rows);
  const int64_t by_target = (target_items + segments - 1) / segments;
  const int64_t by_rows = std::max<int64_t>(1, items.segment_rows / std::max<int64_t>(1, min_rows));
  items.splits = std::max<int64_t>(1, std::min(by_target, by_rows));
  return items;
}

// Floats per thread in the dynamic shared memory of store_block_partials: the thread's `elems`
// elements, padded by one so that consecutive threads' slots fall in different banks.
constexpr int partial_slot_stride(int elems) { return elems + 1; }

inline size_t backward_shared_bytes(int block_threads, int elems) {
  return static_cast<size_t>(block_threads) * partial_slot_stride(elems) * sizeof(float);
}

// Dynamic shared memory a launch may use without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize).
constexpr size_t kBackwardMaxSharedBytes = 48 * 1024;

// The block's partial sums of one parameter gradient to out[0, width) (a row of the workspace
// [items, hidden], at the block's first column): each thread holds acc[e], e < kElems, for the
// columns slot_of maps to it; its row group's rows are already summed there, and the groups' sums
// are added in group order. slot_of(col, lane, e): the lane of a group and the element holding
// column col. Every thread of the block calls it together (two barriers); needs
// backward_shared_bytes(blockDim.x, kElems) of dynamic shared memory.
template <int kElems, typename SlotOf>
TK_DEVICE void store_block_partials(const float (&acc)[kElems], float* out, int width, int row_threads,
                                    SlotOf slot_of) {
  constexpr int kStride = partial_slot_stride(kElems);
  extern __shared__ float partial_slots[];  // [blockDim.x][kStride]
  __syncthreads();  // the previous call's readers are done
#pragma unroll
  for (int e = 0; e < kElems; ++e) partial_slots[threadIdx.x * kStride + e] = acc[e];
  __syncthreads();
  const int groups = blockDim.x / row_threads;
  for (int col = threadIdx.x; col < width; col += blockDim.x) {
    int lane, e;
    slot_of(col, lane, e);
    float s = 0.f;
    for (int g = 0; g < groups; ++g) s += partial_slots[(g * row_threads + lane) * kStride + e];
    out[col] = s;
  }
}

// ---- stage two: the column sums of the workspace ----

constexpr int kMaxColumnSums = 5;
constexpr int kColumnSumCols = RowBackwardPolicy::kColumnSumCols;
constexpr int kColumnSumLanes = RowBackwardPolicy::kColumnSumLanes;

// out[r, c] = sum over items [r * items_per_row, (r + 1) * items_per_row) of partials[item, c],
// in item order within each lane (lane l takes items l, l + 8, ...), lanes in order.
template <typename O>
struct ColumnSum {
  const float* partials;  // [items, hidden]
  O* out;                 // [out_rows, hidden] contiguous
  int64_t items_per_row;
  int64_t out_rows;
};

template <typename O>
struct ColumnSumParams {
  ColumnSum<O> sums[kMaxColumnSums];
  int num_sums = 0;
  int64_t hidden = 0;
  int64_t col_blocks = 0;
};

template <typename O>
__global__ void column_sum_kernel(const ColumnSumParams<O> p) {
  const ColumnSum<O>& s = p.sums[blockIdx.y];
  const int64_t out_row = blockIdx.x / p.col_blocks;
  if (out_row >= s.out_rows) return;
  const int64_t col = (blockIdx.x % p.col_blocks) * kColumnSumCols + threadIdx.x;
  float acc = 0.f;
  if (col < p.hidden) {
    const float* src = s.partials + out_row * s.items_per_row * p.hidden + col;
#pragma unroll 4
    for (int64_t i = threadIdx.y; i < s.items_per_row; i += kColumnSumLanes) acc += src[i * p.hidden];
  }
  __shared__ float lanes[kColumnSumLanes][kColumnSumCols + 1];
  lanes[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < p.hidden) {
    float total = 0.f;
#pragma unroll
    for (int l = 0; l < kColumnSumLanes; ++l) total += lanes[l][threadIdx.x];
    s.out[out_row * p.hidden + col] = from_float<O>(total);
  }
}

template <typename O>
cudaError_t column_sums(const ColumnSumParams<O>& p, cudaStream_t stream) {
  if (p.num_sums == 0 || p.hidden == 0) return cudaSuccess;
  int64_t rows = 0;
  for (int i = 0; i < p.num_sums; ++i) rows = std::max(rows, p.sums[i].out_rows);
  if (rows == 0) return cudaSuccess;
  ColumnSumParams<O> q = p;
  q.col_blocks = (p.hidden + kColumnSumCols - 1) / kColumnSumCols;
  const dim3 grid(static_cast<unsigned>(rows * q.col_blocks), static_cast<unsigned>(p.num_sums));
  launch_kernel(column_sum_kernel<O>, grid, dim3(kColumnSumCols, kColumnSumLanes), 0, stream, q);
  return cudaGetLastError();
}

// Items to aim for: every block slot of every SM busy once, for blocks of `block_threads`.
template <auto kKernel>
int64_t backward_target_blocks(int block_threads, size_t shared_bytes, int sm_count) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, block_threads, shared_bytes) != cudaSuccess ||
      per_sm < 1) {
    (void)cudaGetLastError();  // clear the query's error: the launch reports its own
    per_sm = 1;
  }
  return static_cast<int64_t>(per_sm) * std::max(1, sm_count);
}

}  // namespace transformer_kernels
