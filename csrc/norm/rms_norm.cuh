// RMSNorm over the last dimension: out = round_out(round_mid(x * rsqrt(mean(x^2) + eps)) * w).
// Torch-free: the kernel, its launch heuristics and a host launcher that returns cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/math.cuh"
#include "common/reduce.cuh"
#include "common/rows.cuh"
#include "common/vec.cuh"

namespace transformer_kernels {

template <typename in_t, typename weight_t, typename out_t>
struct RmsNormParams {
  out_t* out;              // [rows..., hidden], rows addressed by out_rows
  const in_t* x;           // [rows..., hidden], rows addressed by x_rows
  const weight_t* weight;  // [hidden] contiguous, or nullptr for no weight
  RowIndexer x_rows;
  RowIndexer out_rows;
  int64_t num_rows;
  int64_t hidden;
  float eps;
  // Round x * inv_rms to in_t before the weight multiply (HF transformers and diffusers do;
  // torch.nn.RMSNorm multiplies in fp32 and rounds once).
  bool round_normalized;
};

namespace rms_norm_detail {

// Vectors each thread keeps in registers between the reduction and the normalization, so
// x is read from memory once. Rows wider than threads * kCachedVecs * vec re-read the rest
// (from L2, since the row was just read).
constexpr int kCachedVecs = 4;
// Rows of at most kWarpSize * kCachedVecs vectors get one warp each, this many per block:
// short rows (LLM decode, head-dim norms) would leave most of a block idle.
constexpr int kWarpRowsPerBlock = 8;
constexpr int kMaxThreads = 1024;

// kThreadsPerRow: 32 = one warp per row (blockDim = (32, rows per block));
//                 0  = one block per row (blockDim = (threads, 1)).
template <typename in_t, typename weight_t, typename out_t, int kVec, int kThreadsPerRow>
__global__ void rms_norm_kernel(const RmsNormParams<in_t, weight_t, out_t> p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  // In block mode blockDim.y == 1, so a whole block leaves together (no barrier is skipped).
  if (row >= p.num_rows) return;
  const int lane = threadIdx.x;
  const int threads = kThreadsPerRow == 0 ? blockDim.x : kThreadsPerRow;

  const in_t* x = p.x + p.x_rows.offset(row);
  out_t* out = p.out + p.out_rows.offset(row);
  const int64_t num_vecs = p.hidden / kVec;
  const int64_t tail_start = num_vecs * kVec;
  const bool has_tail_elem = tail_start + lane < p.hidden;  // tail < kVec <= 8 < threads

  // Pass 1: load (keeping up to kCachedVecs vectors per thread) and sum the squares.
  vec_t<in_t, kVec> cached[kCachedVecs];
#pragma unroll
  for (int k = 0; k < kCachedVecs; ++k) {
    const int64_t v = lane + static_cast<int64_t>(k) * threads;
    if (v < num_vecs) cached[k].load(x + v * kVec);
  }
  const float tail_val = has_tail_elem ? to_float(x[tail_start + lane]) : 0.f;

  float sum_sq = tail_val * tail_val;
#pragma unroll
  for (int k = 0; k < kCachedVecs; ++k) {
    const int64_t v = lane + static_cast<int64_t>(k) * threads;
    if (v < num_vecs) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float f = to_float(cached[k][i]);
        sum_sq += f * f;
      }
    }
  }
  for (int64_t v = lane + static_cast<int64_t>(kCachedVecs) * threads; v < num_vecs; v += threads) {
    vec_t<in_t, kVec> xv;
    xv.load(x + v * kVec);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float f = to_float(xv[i]);
      sum_sq += f * f;
    }
  }
  sum_sq = row_reduce_sum<kThreadsPerRow>(sum_sq);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(p.hidden) + p.eps);

  // Pass 2: normalize, apply the weight with the requested rounding, store.
  const bool has_weight = p.weight != nullptr;
  auto finish = [&](float f, float w) {
    float y = f * inv_rms;
    if (p.round_normalized) y = round_through<in_t>(y);
    return has_weight ? y * w : y;
  };
  auto normalize_store_vec = [&](const vec_t<in_t, kVec>& xv, int64_t v) {
    float w[kVec];
    if (has_weight) {
      vec_t<weight_t, kVec> wv;
      wv.load(p.weight + v * kVec);
      wv.cast_to(w);
    }
    vec_t<out_t, kVec> ov;
#pragma unroll
    for (int i = 0; i < kVec; ++i) ov[i] = from_float<out_t>(finish(to_float(xv[i]), has_weight ? w[i] : 1.f));
    ov.store(out + v * kVec);
  };

#pragma unroll
  for (int k = 0; k < kCachedVecs; ++k) {
    const int64_t v = lane + static_cast<int64_t>(k) * threads;
    if (v < num_vecs) normalize_store_vec(cached[k], v);
  }
  for (int64_t v = lane + static_cast<int64_t>(kCachedVecs) * threads; v < num_vecs; v += threads) {
    vec_t<in_t, kVec> xv;
    xv.load(x + v * kVec);
    normalize_store_vec(xv, v);
  }
  if (has_tail_elem) {
    const int64_t col = tail_start + lane;
    out[col] = from_float<out_t>(finish(tail_val, has_weight ? to_float(p.weight[col]) : 1.f));
  }
}

template <typename in_t, typename weight_t, typename out_t, int kVec>
cudaError_t launch(const RmsNormParams<in_t, weight_t, out_t>& p, cudaStream_t stream) {
  const int64_t num_vecs = p.hidden / kVec;
  if (num_vecs <= static_cast<int64_t>(kWarpSize) * kCachedVecs) {
    const dim3 block(kWarpSize, kWarpRowsPerBlock);
    const dim3 grid(static_cast<unsigned>((p.num_rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock));
    rms_norm_kernel<in_t, weight_t, out_t, kVec, kWarpSize><<<grid, block, 0, stream>>>(p);
  } else {
    // Enough threads that each keeps at most kCachedVecs vectors, rounded to whole warps.
    const int64_t wanted = (num_vecs + kCachedVecs - 1) / kCachedVecs;
    const int threads = static_cast<int>(
        std::min<int64_t>(kMaxThreads, (wanted + kWarpSize - 1) / kWarpSize * kWarpSize));
    rms_norm_kernel<in_t, weight_t, out_t, kVec, 0>
        <<<dim3(static_cast<unsigned>(p.num_rows)), dim3(threads), 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace rms_norm_detail

// Host launcher. Uses 16-byte vectors when every pointer and row stride allows it, scalar
// accesses otherwise. Rows beyond the grid limit are rejected by the caller.
template <typename in_t, typename weight_t, typename out_t>
cudaError_t rms_norm(const RmsNormParams<in_t, weight_t, out_t>& p, cudaStream_t stream) {
  if (p.num_rows == 0 || p.hidden == 0) return cudaSuccess;
  constexpr int kVec = vec_size<in_t>();
  const bool vectorizable = is_vec_aligned<in_t, kVec>(p.x) && is_vec_aligned<out_t, kVec>(p.out) &&
                            (p.weight == nullptr || is_vec_aligned<weight_t, kVec>(p.weight)) &&
                            p.x_rows.rows_aligned_to(kVec) && p.out_rows.rows_aligned_to(kVec);
  return vectorizable ? rms_norm_detail::launch<in_t, weight_t, out_t, kVec>(p, stream)
                      : rms_norm_detail::launch<in_t, weight_t, out_t, 1>(p, stream);
}

}  // namespace transformer_kernels
