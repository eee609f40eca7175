// Rotary position embeddings on q and k in one launch. Torch-free: the kernel, its launch
// heuristics and a host launcher.
//
// q, k are addressed as [B, S, H, d] (any strides, last dim contiguous); cos, sin as [B, S, R]
// (stride 0 over B when shared), R = rotary dims <= d, shared by all heads. Pairs:
//   kNeox:        (i, i + R/2)   out[i] = x[i] cos[i] - x[i+R/2] sin[i];  out[i+R/2] = x[i+R/2] cos + x[i] sin
//   kInterleaved: (2i, 2i + 1)   out[2i] = x[2i] cos - x[2i+1] sin;       out[2i+1] = x[2i+1] cos + x[2i] sin
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

template <typename T, typename table_t>
struct RopeParams {
  T* q_out;  // [B, S, Hq, d]
  HeadStrides q_out_strides;
  const T* q;  // [B, S, Hq, d]
  HeadStrides q_strides;
  T* k_out;  // [B, S, Hk, d]
  HeadStrides k_out_strides;
  const T* k;  // [B, S, Hk, d]
  HeadStrides k_strides;
  const table_t* cos;  // [B, S, R]
  const table_t* sin;  // [B, S, R]
  int64_t table_b, table_s;  // strides of cos and sin (same layout), in elements
  int64_t batch, seq;
  int num_q_heads, num_k_heads;
  int head_dim;
  int rotary_dim;
  bool copy_pass_through;  // out-of-place: copy channels >= rotary_dim
  // A token (all its q and k heads) is handled by 2^(log2_step_threads + log2_head_groups)
  // consecutive threads: step lanes across the rotary pairs times head groups; each thread loads
  // its cos/sin once and applies them to every head of its group.
  int log2_step_threads;
  int log2_head_groups;
};

namespace rope_detail {

constexpr int kThreadsPerBlock = 256;
// Threads a token gets at most (step lanes x head groups): with Llama's 40 heads of 128 in bf16,
// 8 step lanes x 4 head groups, each thread rotating 10 heads, 4 in flight, with one load of cos/sin.
constexpr int kTokenThreads = 32;
// Heads whose loads one thread issues together (registers: 2 x kPairs floats each).
constexpr int kHeadsInFlight = 4;

template <typename T, bool kFp32Math>
TK_DEVICE float rotate(float x, float partner_signed, float c, float s) {
  if constexpr (kFp32Math) {
    return __fadd_rn(__fmul_rn(x, c), __fmul_rn(partner_signed, s));
  } else {
    return __fadd_rn(round_through<T>(__fmul_rn(x, c)), round_through<T>(__fmul_rn(partner_signed, s)));
  }
}

// One thread handles kPairs pairs per step, for the heads of its head group.
template <typename T, typename table_t, RopeStyle kStyle, bool kFp32Math, int kPairs>
__global__ void rope_kernel(const RopeParams<T, table_t> p) {
  const int step_threads = 1 << p.log2_step_threads;
  const int head_groups = 1 << p.log2_head_groups;
  const int log2_token_threads = p.log2_step_threads + p.log2_head_groups;
  const int lane = threadIdx.x & ((1 << log2_token_threads) - 1);
  const int step_lane = lane & (step_threads - 1);
  const int head_group = lane >> p.log2_step_threads;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> log2_token_threads) +
                        (threadIdx.x >> log2_token_threads);
  if (token >= p.batch * p.seq) return;
  const int64_t b = token / p.seq, s = token % p.seq;
  const int heads = p.num_q_heads + p.num_k_heads;
  const table_t* cos = p.cos + b * p.table_b + s * p.table_s;
  const table_t* sin = p.sin + b * p.table_b + s * p.table_s;
  // Head `head` of this token: q's heads first, then k's.
  auto head_ptrs = [&](int head, const T*& x, T*& out) {
    const bool is_q = head < p.num_q_heads;
    const int h = is_q ? head : head - p.num_q_heads;
    const HeadStrides& in_st = is_q ? p.q_strides : p.k_strides;
    const HeadStrides& out_st = is_q ? p.q_out_strides : p.k_out_strides;
    x = (is_q ? p.q : p.k) + b * in_st.b + s * in_st.s + h * in_st.h;
    out = (is_q ? p.q_out : p.k_out) + b * out_st.b + s * out_st.s + h * out_st.h;
  };

  const int num_pairs = p.rotary_dim / 2;
  // Element index of the two halves of pair j.
  auto first = [&](int j) { return kStyle == RopeStyle::kNeox ? j : 2 * j; };
  auto second = [&](int j) { return kStyle == RopeStyle::kNeox ? j + num_pairs : 2 * j + 1; };

  for (int j0 = step_lane * kPairs; j0 < num_pairs; j0 += step_threads * kPairs) {
    float c1[kPairs], c2[kPairs], s1[kPairs], s2[kPairs];  // this step's table entries, for every head
    if constexpr (kPairs == 1) {  // any alignment: element by element
      c1[0] = to_float(cos[first(j0)]), c2[0] = to_float(cos[second(j0)]);
      s1[0] = to_float(sin[first(j0)]), s2[0] = to_float(sin[second(j0)]);
    } else if constexpr (kStyle == RopeStyle::kNeox) {
      vec_t<table_t, kPairs> ca, cb, sa, sb;
      ca.load(cos + j0);
      cb.load(cos + j0 + num_pairs);
      sa.load(sin + j0);
      sb.load(sin + j0 + num_pairs);
      ca.cast_to(c1);
      cb.cast_to(c2);
      sa.cast_to(s1);
      sb.cast_to(s2);
    } else {
      vec_t<table_t, 2 * kPairs> cv, sv;
      cv.load(cos + 2 * j0);
      sv.load(sin + 2 * j0);
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        c1[i] = to_float(cv[2 * i]), c2[i] = to_float(cv[2 * i + 1]);
        s1[i] = to_float(sv[2 * i]), s2[i] = to_float(sv[2 * i + 1]);
      }
    }
    // kHeadsInFlight heads at a time: every head's loads are issued before any math or store, so a
    // thread keeps that many 16-byte loads of x in flight.
    for (int head0 = head_group; head0 < heads; head0 += kHeadsInFlight * head_groups) {
      float x1[kHeadsInFlight][kPairs], x2[kHeadsInFlight][kPairs];
#pragma unroll
      for (int u = 0; u < kHeadsInFlight; ++u) {
        const int head = head0 + u * head_groups;
        if (head >= heads) break;
        const T* x;
        T* out;
        head_ptrs(head, x, out);
        if constexpr (kPairs == 1) {
          x1[u][0] = to_float(x[first(j0)]), x2[u][0] = to_float(x[second(j0)]);
        } else if constexpr (kStyle == RopeStyle::kNeox) {
          vec_t<T, kPairs> a, bv;
          a.load(x + j0);
          bv.load(x + j0 + num_pairs);
          a.cast_to(x1[u]);
          bv.cast_to(x2[u]);
        } else {
          vec_t<T, 2 * kPairs> xv;
          xv.load(x + 2 * j0);
#pragma unroll
          for (int i = 0; i < kPairs; ++i) x1[u][i] = to_float(xv[2 * i]), x2[u][i] = to_float(xv[2 * i + 1]);
        }
      }
#pragma unroll
      for (int u = 0; u < kHeadsInFlight; ++u) {
        const int head = head0 + u * head_groups;
        if (head >= heads) break;
        const T* x;
        T* out;
        head_ptrs(head, x, out);
        T y1[kPairs], y2[kPairs];
#pragma unroll
        for (int i = 0; i < kPairs; ++i) {
          y1[i] = from_float<T>(rotate<T, kFp32Math>(x1[u][i], -x2[u][i], c1[i], s1[i]));
          y2[i] = from_float<T>(rotate<T, kFp32Math>(x2[u][i], x1[u][i], c2[i], s2[i]));
        }
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
    }
  }
  if (p.copy_pass_through) {
    for (int head = head_group; head < heads; head += head_groups) {
      const T* x;
      T* out;
      head_ptrs(head, x, out);
      for (int c = p.rotary_dim + step_lane; c < p.head_dim; c += step_threads) out[c] = x[c];
    }
  }
}

}  // namespace rope_detail

// Host launcher. Vector steps (16 bytes of x per load) when pointers, strides and the rotary
// width allow, one pair per step otherwise.
template <RopeStyle kStyle, bool kFp32Math, typename T, typename table_t>
cudaError_t rope(RopeParams<T, table_t> p, cudaStream_t stream) {
  const int64_t rows = p.batch * p.seq * (p.num_q_heads + p.num_k_heads);
  if (rows == 0 || p.head_dim == 0) return cudaSuccess;
  // Pairs per vector step: 16 bytes of x per load (NeoX loads both halves, interleaved one vector
  // holding both elements of each pair).
  constexpr int kVecPairs = kStyle == RopeStyle::kNeox ? vec_size<T>() : vec_size<T>() / 2;
  constexpr int kVecElems = kStyle == RopeStyle::kNeox ? kVecPairs : 2 * kVecPairs;
  auto aligned = [&](const void* ptr, int elem_bytes) {
    const int bytes = kVecElems * elem_bytes < kVecBytes ? kVecElems * elem_bytes : kVecBytes;
    return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
  };
  auto strides_ok = [&](const HeadStrides& st) {
    return st.b % kVecElems == 0 && st.s % kVecElems == 0 && st.h % kVecElems == 0;
  };
  const int num_pairs = p.rotary_dim / 2;
  const bool vectorizable = num_pairs % kVecPairs == 0 && aligned(p.q, sizeof(T)) && aligned(p.k, sizeof(T)) &&
                            aligned(p.q_out, sizeof(T)) && aligned(p.k_out, sizeof(T)) &&
                            aligned(p.cos, sizeof(table_t)) && aligned(p.sin, sizeof(table_t)) &&
                            strides_ok(p.q_strides) && strides_ok(p.k_strides) && strides_ok(p.q_out_strides) &&
                            strides_ok(p.k_out_strides) && p.table_b % kVecElems == 0 && p.table_s % kVecElems == 0;
  const int pairs_per_step = vectorizable ? kVecPairs : 1;
  // Per token: step lanes, a power of two covering the rotary pairs' steps (at most a block), times
  // head groups, a power of two up to kTokenThreads in all and no more than the heads need.
  const int steps = (num_pairs + pairs_per_step - 1) / pairs_per_step;
  const int heads = p.num_q_heads + p.num_k_heads;
  int log2_steps = 0;
  while ((1 << log2_steps) < steps && (1 << log2_steps) < rope_detail::kThreadsPerBlock) ++log2_steps;
  int log2_groups = 0;
  while ((1 << (log2_steps + log2_groups)) < rope_detail::kTokenThreads && (1 << log2_groups) < heads) ++log2_groups;
  p.log2_step_threads = log2_steps;
  p.log2_head_groups = log2_groups;
  const int64_t tokens_per_block = rope_detail::kThreadsPerBlock >> (log2_steps + log2_groups);
  const int64_t tokens = p.batch * p.seq;
  const dim3 grid(static_cast<unsigned>((tokens + tokens_per_block - 1) / tokens_per_block));
  if (vectorizable) {
    rope_detail::rope_kernel<T, table_t, kStyle, kFp32Math, kVecPairs>
        <<<grid, rope_detail::kThreadsPerBlock, 0, stream>>>(p);
  } else {
    rope_detail::rope_kernel<T, table_t, kStyle, kFp32Math, 1><<<grid, rope_detail::kThreadsPerBlock, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace transformer_kernels
