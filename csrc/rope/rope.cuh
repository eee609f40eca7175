// Rotary position embeddings on q and k in one launch. Torch-free: the kernel, its launch
// heuristics and a host launcher.
//
// q, k are addressed as [B, S, H, d] (any strides, last dim contiguous); cos, sin as [B, S, R]
// (stride 0 over B when shared), R = rotary dims <= d, shared by all heads. Pairs:
//   kNeox:        (i, i + R/2)   out[i] = x[i] cos[i] - x[i+R/2] sin[i];  out[i+R/2] = x[i+R/2] cos + x[i] sin
//   kInterleaved: (2i, 2i + 1)   out[2i] = x[2i] cos - x[2i+1] sin;       out[2i+1] = x[2i+1] cos + x[2i] sin
// Cached form (vLLM's rotary_embedding): the table row of token t is cos_sin_cache[positions[t]],
// R/2 cosines then R/2 sines, one per pair (kCache). A position outside [0, max_position) makes
// that token's rotated channels NaN rather than read out of bounds.
// Channels >= R pass through. Rounding (no FMA: the eager code rounds each op):
//   fp32_math = false (transformers: cos/sin in x's dtype): round(round(x*cos) + round(rot*sin))
//   fp32_math = true  (diffusers LTX/Flux: fp32 tables):   round_once(x*cos + rot*sin) in fp32
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/math.cuh"
#include "common/vec.cuh"

namespace transformer_kernels {

enum class RopeStyle { kNeox, kInterleaved };

// A [B, S, H, d] tensor's strides, in elements.
struct HeadStrides {
  int64_t b, s, h;
};

// q and k, inputs and outputs, as [B, S, H, d] views (any strides, last dim contiguous), taken as
// rows of d: row = token * (Hq + Hk) + head, q's heads first. Shared by the RoPE kernels.
template <typename T>
struct QkRows {
  T* q_out;  // [B, S, Hq, d]
  HeadStrides q_out_strides;
  const T* q;  // [B, S, Hq, d]
  HeadStrides q_strides;
  T* k_out;  // [B, S, Hk, d]
  HeadStrides k_out_strides;
  const T* k;  // [B, S, Hk, d]
  HeadStrides k_strides;
  int64_t batch, seq;
  int num_q_heads, num_k_heads;

  TK_HOST_DEVICE int heads() const { return num_q_heads + num_k_heads; }
  TK_HOST_DEVICE int64_t num_rows() const { return batch * seq * heads(); }

  // Row `row`'s token (b, s), its input x and its output.
  TK_DEVICE void locate(int64_t row, int64_t& b, int64_t& s, const T*& x, T*& out) const {
    const int head = static_cast<int>(row % heads());
    const int64_t token = row / heads();
    b = token / seq;
    s = token % seq;
    const bool is_q = head < num_q_heads;
    const int h = is_q ? head : head - num_q_heads;
    const HeadStrides& in = is_q ? q_strides : k_strides;
    const HeadStrides& o = is_q ? q_out_strides : k_out_strides;
    x = (is_q ? q : k) + b * in.b + s * in.s + h * in.h;
    out = (is_q ? q_out : k_out) + b * o.b + s * o.s + h * o.h;
  }

  // True when every pointer and stride allows vec_t<T, kElems> (host side).
  template <int kElems>
  bool aligned() const {
    auto strides_ok = [](const HeadStrides& st) { return st.b % kElems == 0 && st.s % kElems == 0 && st.h % kElems == 0; };
    return is_vec_aligned<T, kElems>(q) && is_vec_aligned<T, kElems>(k) && is_vec_aligned<T, kElems>(q_out) &&
           is_vec_aligned<T, kElems>(k_out) && strides_ok(q_strides) && strides_ok(k_strides) &&
           strides_ok(q_out_strides) && strides_ok(k_out_strides);
  }
};

template <typename T, typename table_t>
struct RopeParams {
  QkRows<T> qk;
  const table_t* cos;  // [B, S, R]; cached form: cos_sin_cache [max_position, R]
  const table_t* sin;  // [B, S, R]; cached form: unused (the sines follow the cosines in each row)
  int64_t table_b, table_s;  // strides of cos and sin (same layout), in elements
  const int64_t* positions = nullptr;  // [B * S], cached form only
  int64_t max_position = 0;            // rows of cos_sin_cache, cached form only
  int head_dim;
  int rotary_dim;
  bool copy_pass_through;  // out-of-place: copy channels >= rotary_dim
  int log2_threads_per_row;
};

namespace rope_detail {

constexpr int kThreadsPerBlock = 256;

// Rotates kPairs pairs (x1[i], x2[i]) into y1, y2: y1 = x1*c1 - x2*s1, y2 = x2*c2 + x1*s2, in fp32
// with one rounding (kFp32Math), or as transformers' model-dtype code rounds each product and the
// sum. Roundings go two per conversion instruction (y1 and y2 interleaved in one array).
template <typename T, bool kFp32Math, int kPairs>
TK_DEVICE void rotate_pairs(const float (&x1)[kPairs], const float (&x2)[kPairs], const float (&c1)[kPairs],
                            const float (&c2)[kPairs], const float (&s1)[kPairs], const float (&s2)[kPairs],
                            T (&y1)[kPairs], T (&y2)[kPairs]) {
  float cos_terms[2 * kPairs], sin_terms[2 * kPairs];
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    cos_terms[2 * i] = __fmul_rn(x1[i], c1[i]), sin_terms[2 * i] = __fmul_rn(-x2[i], s1[i]);
    cos_terms[2 * i + 1] = __fmul_rn(x2[i], c2[i]), sin_terms[2 * i + 1] = __fmul_rn(x1[i], s2[i]);
  }
  if constexpr (!kFp32Math) {
    round_through<T>(cos_terms);
    round_through<T>(sin_terms);
  }
  float y[2 * kPairs];
#pragma unroll
  for (int i = 0; i < 2 * kPairs; ++i) y[i] = __fadd_rn(cos_terms[i], sin_terms[i]);
  T rounded[2 * kPairs];
  from_floats(y, rounded);
#pragma unroll
  for (int i = 0; i < kPairs; ++i) y1[i] = rounded[2 * i], y2[i] = rounded[2 * i + 1];
}

// One thread handles kPairs pairs per step; a row is one (token, head) of q or k.
template <typename T, typename table_t, RopeStyle kStyle, bool kFp32Math, int kPairs, bool kCache>
__global__ void rope_kernel(const RopeParams<T, table_t> p) {
  const int threads = 1 << p.log2_threads_per_row;
  const int lane = threadIdx.x & (threads - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> p.log2_threads_per_row) +
                      (threadIdx.x >> p.log2_threads_per_row);
  if (row >= p.qk.num_rows()) return;
  int64_t b, s;
  const T* x;
  T* out;
  p.qk.locate(row, b, s, x, out);
  const int num_pairs = p.rotary_dim / 2;
  const table_t* cos;
  const table_t* sin;
  bool position_ok = true;
  if constexpr (kCache) {
    const int64_t pos = p.positions[b * p.qk.seq + s];
    position_ok = pos >= 0 && pos < p.max_position;
    cos = p.cos + (position_ok ? pos : 0) * p.table_s;
    sin = cos + num_pairs;
  } else {
    cos = p.cos + b * p.table_b + s * p.table_s;
    sin = p.sin + b * p.table_b + s * p.table_s;
  }
  // Element index of the two halves of pair j.
  auto first = [&](int j) { return kStyle == RopeStyle::kNeox ? j : 2 * j; };
  auto second = [&](int j) { return kStyle == RopeStyle::kNeox ? j + num_pairs : 2 * j + 1; };

  for (int j0 = lane * kPairs; j0 < num_pairs; j0 += threads * kPairs) {
    float x1[kPairs], x2[kPairs], c1[kPairs], c2[kPairs], s1[kPairs], s2[kPairs];
    if constexpr (kCache) {  // one cosine and one sine per pair, shared by its two elements
      if constexpr (kPairs == 1) {
        c1[0] = to_float(cos[j0]), s1[0] = to_float(sin[j0]);
      } else {
        vec_t<table_t, kPairs> cv, sv;
        cv.load(cos + j0);
        sv.load(sin + j0);
        cv.cast_to(c1);
        sv.cast_to(s1);
      }
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        if (!position_ok) c1[i] = s1[i] = __int_as_float(0x7fc00000);  // NaN: the position has no row
        c2[i] = c1[i], s2[i] = s1[i];
      }
    }
    if constexpr (kPairs == 1) {  // any alignment: element by element
      x1[0] = to_float(x[first(j0)]), x2[0] = to_float(x[second(j0)]);
      if constexpr (!kCache) {
        c1[0] = to_float(cos[first(j0)]), c2[0] = to_float(cos[second(j0)]);
        s1[0] = to_float(sin[first(j0)]), s2[0] = to_float(sin[second(j0)]);
      }
    } else if constexpr (kStyle == RopeStyle::kNeox) {
      vec_t<T, kPairs> a, bv;
      a.load(x + j0);
      bv.load(x + j0 + num_pairs);
      a.cast_to(x1);
      bv.cast_to(x2);
      if constexpr (!kCache) {
        vec_t<table_t, kPairs> ca, cb, sa, sb;
        ca.load(cos + j0);
        cb.load(cos + j0 + num_pairs);
        sa.load(sin + j0);
        sb.load(sin + j0 + num_pairs);
        ca.cast_to(c1);
        cb.cast_to(c2);
        sa.cast_to(s1);
        sb.cast_to(s2);
      }
    } else {
      vec_t<T, 2 * kPairs> xv;
      xv.load(x + 2 * j0);
#pragma unroll
      for (int i = 0; i < kPairs; ++i) x1[i] = to_float(xv[2 * i]), x2[i] = to_float(xv[2 * i + 1]);
      if constexpr (!kCache) {
        vec_t<table_t, 2 * kPairs> cv, sv;
        cv.load(cos + 2 * j0);
        sv.load(sin + 2 * j0);
#pragma unroll
        for (int i = 0; i < kPairs; ++i) {
          c1[i] = to_float(cv[2 * i]), c2[i] = to_float(cv[2 * i + 1]);
          s1[i] = to_float(sv[2 * i]), s2[i] = to_float(sv[2 * i + 1]);
        }
      }
    }
    T y1[kPairs], y2[kPairs];
    rotate_pairs<T, kFp32Math>(x1, x2, c1, c2, s1, s2, y1, y2);
    if constexpr (kPairs == 1) {
      out[first(j0)] = y1[0];
      out[second(j0)] = y2[0];
    } else if constexpr (kStyle == RopeStyle::kNeox) {
      vec_t<T, kPairs> a, bv;
#pragma unroll
      for (int i = 0; i < kPairs; ++i) a[i] = y1[i], bv[i] = y2[i];
      a.store(out + first(j0));
      bv.store(out + second(j0));
    } else {
      vec_t<T, 2 * kPairs> o;
#pragma unroll
      for (int i = 0; i < kPairs; ++i) o[2 * i] = y1[i], o[2 * i + 1] = y2[i];
      o.store(out + first(j0));
    }
  }
  if (p.copy_pass_through)
    for (int c = p.rotary_dim + lane; c < p.head_dim; c += threads) out[c] = x[c];
}

}  // namespace rope_detail

// Host launcher. Vector steps (16 bytes of x per load) when pointers, strides and the rotary
// width allow, one pair per step otherwise.
template <RopeStyle kStyle, bool kFp32Math, bool kCache, typename T, typename table_t>
cudaError_t rope(RopeParams<T, table_t> p, cudaStream_t stream) {
  const int64_t rows = p.qk.num_rows();
  if (rows == 0 || p.head_dim == 0) return cudaSuccess;
  // Pairs per vector step: 16 bytes of x per load (NeoX loads both halves, interleaved one vector
  // holding both elements of each pair).
  constexpr int kVecPairs = kStyle == RopeStyle::kNeox ? vec_size<T>() : vec_size<T>() / 2;
  constexpr int kVecElems = kStyle == RopeStyle::kNeox ? kVecPairs : 2 * kVecPairs;
  const int num_pairs = p.rotary_dim / 2;
  const bool vectorizable = num_pairs % kVecPairs == 0 && p.qk.template aligned<kVecElems>() &&
                            is_vec_aligned<table_t, kVecElems>(p.cos) && is_vec_aligned<table_t, kVecElems>(p.sin) &&
                            p.table_b % kVecElems == 0 && p.table_s % kVecElems == 0 &&
                            (!kCache || num_pairs % kVecElems == 0);  // the sines' offset keeps alignment
  const int pairs_per_step = vectorizable ? kVecPairs : 1;
  // Threads per row: a power of two covering the row's steps (at least one), at most a block.
  const int steps = (num_pairs + pairs_per_step - 1) / pairs_per_step;
  int log2 = 0;
  while ((1 << log2) < steps && (1 << log2) < rope_detail::kThreadsPerBlock) ++log2;
  p.log2_threads_per_row = log2;
  const int64_t rows_per_block = rope_detail::kThreadsPerBlock >> log2;
  const dim3 grid(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block));
  if (vectorizable) {
    rope_detail::rope_kernel<T, table_t, kStyle, kFp32Math, kVecPairs, kCache>
        <<<grid, rope_detail::kThreadsPerBlock, 0, stream>>>(p);
  } else {
    rope_detail::rope_kernel<T, table_t, kStyle, kFp32Math, 1, kCache>
        <<<grid, rope_detail::kThreadsPerBlock, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace transformer_kernels
