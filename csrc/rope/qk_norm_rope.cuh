// RMSNorm of q and k followed by interleaved RoPE, q and k in one launch: the first steps of
// LTX-Video's attention (norm across all heads, [B, S, H*d]) and Flux's (norm per head,
// [B, S, H, d]). Torch-free: the kernel, its launch heuristics and a host launcher.
//
// q, k are addressed as [B, S, G, L] (QkRows; G norm groups of width L: G = 1 for LTX, G = heads
// for Flux); weights [L]; cos, sin fp32 [B or 1, S, L]. Per row:
//   n   = round(x * rsqrt(mean(x^2) + eps) * w)        (torch.nn.RMSNorm: fp32 math, one rounding)
//   out = round(n * cos + rotate(n) * sin)              (diffusers' apply_rotary_emb: fp32, one rounding)
// with rotate(n)[2i] = -n[2i+1], rotate(n)[2i+1] = n[2i]. A row is held in registers between the
// reduction and the rotation (rows up to kMaxRowVecs vectors), so each input is read once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/math.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "rope/rope.cuh"

namespace transformer_kernels {

template <typename T, typename weight_t>
struct QkNormRopeParams {
  QkRows<T> qk;              // rows of width L: the norm groups of q, then of k
  const weight_t* q_weight;  // [L] contiguous
  const weight_t* k_weight;  // [L] contiguous
  const float* cos;          // [B or 1, S, L]
  const float* sin;          // [B or 1, S, L]
  int64_t table_b, table_s;  // strides of cos and sin (same layout), in elements; table_b 0 when shared
  int width;  // L, even
  float eps;
};

namespace qk_norm_rope_detail {

constexpr int kCachedVecs = 4;  // vectors per thread, all held between the reduction and the store
constexpr int kGroupThreadsPerBlock = 256;
constexpr int kSmallGroup = 4;  // lanes per row for rows of <= kSmallGroup * kCachedVecs vectors
constexpr int kMaxThreads = 1024;
constexpr int kMaxRowVecs = kMaxThreads * kCachedVecs;

// kThreadsPerRow lanes per row (0: the whole block); kVec elements per vector, even, so that each
// vector holds whole pairs.
template <typename T, typename weight_t, int kVec, int kThreadsPerRow>
__global__ void qk_norm_rope_kernel(const QkNormRopeParams<T, weight_t> p) {
  using vec = vec_t<T, kVec>;
  const int64_t num_rows = p.qk.num_rows();
  const RowGroup<kThreadsPerRow> group(num_rows);
  const int lane = group.lane, threads = group.threads;
  const int64_t row = group.row;
  const unsigned lanes_with_rows = group.mask;
  if (row >= num_rows) return;

  int64_t b, s;
  const T* x;
  T* out;
  p.qk.locate(row, b, s, x, out);
  const weight_t* weight = row % p.qk.heads() < p.qk.num_q_heads ? p.q_weight : p.k_weight;
  const float* cos = p.cos + b * p.table_b + s * p.table_s;
  const float* sin = p.sin + b * p.table_b + s * p.table_s;
  const int num_vecs = p.width / kVec;

  vec cached[kCachedVecs];
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < kCachedVecs; ++c) {
    const int v = lane + c * threads;
    if (v < num_vecs) {
      cached[c].load(x + v * kVec);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc += to_float(cached[c][i]) * to_float(cached[c][i]);
    }
  }
  acc = row_reduce_sum<kThreadsPerRow>(acc, lanes_with_rows);
  const float inv_rms = rsqrtf(acc / static_cast<float>(p.width) + p.eps);

#pragma unroll
  for (int c = 0; c < kCachedVecs; ++c) {
    const int v = lane + c * threads;
    if (v >= num_vecs) continue;
    float w[kVec], cs[kVec], sn[kVec], n[kVec];
    vec_t<weight_t, kVec> wv;
    wv.load(weight + v * kVec);
    wv.cast_to(w);
    vec_t<float, kVec> cv, sv;
    cv.load(cos + v * kVec);
    sv.load(sin + v * kVec);
    cv.cast_to(cs);
    sv.cast_to(sn);
#pragma unroll
    for (int i = 0; i < kVec; ++i) n[i] = round_through<T>(__fmul_rn(__fmul_rn(to_float(cached[c][i]), inv_rms), w[i]));
    vec o;
#pragma unroll
    for (int i = 0; i < kVec; i += 2) {
      o[i] = from_float<T>(__fadd_rn(__fmul_rn(n[i], cs[i]), __fmul_rn(-n[i + 1], sn[i])));
      o[i + 1] = from_float<T>(__fadd_rn(__fmul_rn(n[i + 1], cs[i + 1]), __fmul_rn(n[i], sn[i + 1])));
    }
    o.store(out + v * kVec);
  }
}

template <typename T, typename weight_t, int kVec>
cudaError_t launch(const QkNormRopeParams<T, weight_t>& p, cudaStream_t stream) {
  const int64_t rows = p.qk.num_rows();
  const int num_vecs = p.width / kVec;
  auto grid_for = [&](int rows_per_block) {
    return dim3(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block));
  };
  if (num_vecs <= kSmallGroup * kCachedVecs) {
    qk_norm_rope_kernel<T, weight_t, kVec, kSmallGroup>
        <<<grid_for(kGroupThreadsPerBlock / kSmallGroup), kGroupThreadsPerBlock, 0, stream>>>(p);
  } else if (num_vecs <= kWarpSize * kCachedVecs) {
    qk_norm_rope_kernel<T, weight_t, kVec, kWarpSize>
        <<<grid_for(kGroupThreadsPerBlock / kWarpSize), kGroupThreadsPerBlock, 0, stream>>>(p);
  } else {
    const int wanted = (num_vecs + kCachedVecs - 1) / kCachedVecs;
    const int threads = (wanted + kWarpSize - 1) / kWarpSize * kWarpSize;  // <= kMaxThreads: host-checked
    qk_norm_rope_kernel<T, weight_t, kVec, 0><<<grid_for(1), threads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace qk_norm_rope_detail

// Rows hold at most this many elements of T (the whole row stays in registers): with 16-byte
// vectors, or with one pair per vector when pointers or strides do not allow 16 bytes.
template <typename T>
constexpr int64_t qk_norm_rope_max_width(bool vectorized) {
  return static_cast<int64_t>(qk_norm_rope_detail::kMaxRowVecs) * (vectorized ? vec_size<T>() : 2);
}

// True when every pointer and stride allows vectors of kElems elements (kElems even).
template <int kElems, typename T, typename weight_t>
bool qk_norm_rope_aligned(const QkNormRopeParams<T, weight_t>& p) {
  return p.width % kElems == 0 && p.qk.template aligned<kElems>() && is_vec_aligned<weight_t, kElems>(p.q_weight) &&
         is_vec_aligned<weight_t, kElems>(p.k_weight) && is_vec_aligned<float, kElems>(p.cos) &&
         is_vec_aligned<float, kElems>(p.sin) && p.table_b % kElems == 0 && p.table_s % kElems == 0;
}

// Host launcher: 16-byte vectors when every pointer and stride allows it, else one pair per
// vector. The caller checks width (even, <= qk_norm_rope_max_width<T>(vectorized)) and pair
// alignment (qk_norm_rope_aligned<2>(p)).
template <typename T, typename weight_t>
cudaError_t qk_norm_rope(const QkNormRopeParams<T, weight_t>& p, cudaStream_t stream) {
  if (p.qk.num_rows() == 0 || p.width == 0) return cudaSuccess;
  constexpr int kVec = vec_size<T>();
  return qk_norm_rope_aligned<kVec>(p) ? qk_norm_rope_detail::launch<T, weight_t, kVec>(p, stream)
                                       : qk_norm_rope_detail::launch<T, weight_t, 2>(p, stream);
}

}  // namespace transformer_kernels
