// Cross-entropy over rows of logits, in place: each row's loss and, where asked, the row
// overwritten with the loss's gradient with respect to its logits. The fused linear cross-entropy
// (fused_linear_cross_entropy.cu) runs it on one chunk of logits at a time, between its GEMMs.
// Torch-free: the kernel, its launch heuristic and a host launcher.
//
// Row r with target t, logits l [V], label smoothing eps, soft-cap c (Gemma 2; c = 0: none):
//   z_v    = c tanh(l_v / c)  (soft-capped)  or  l_v
//   lse    = log sum_v exp(z_v)
//   loss_r = (1 - eps) (lse - z_t) + eps (lse - sum_v z_v / V)      (PyTorch's label smoothing)
//   dz_v   = scale_r (softmax(z)_v - (1 - eps) [v == t] - eps / V)
//   dl_v   = dz_v (1 - tanh^2(l_v / c))  (soft-capped)  or  dz_v
// scale_r is dloss / dloss_r: 1 / (rows not ignored) for "mean", 1 for "sum", the incoming
// gradient for "none". A row whose target is ignore_index has loss 0 and gradient 0; a target
// outside [0, V) gives NaN (loss and gradient) where PyTorch would stop on a device assert.
// All math in fp32 (exp2 of log2-scaled values); logits read, gradients written in T.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/kernel.cuh"
#include "common/math.cuh"
#include "common/reduce.cuh"
#include "common/schedule.cuh"
#include "common/vec.cuh"
#include "loss/cross_entropy_policy.cuh"

namespace transformer_kernels {

template <typename T>
struct CrossEntropyParams {
  T* logits;              // [rows, vocab], row stride logits_stride: read, then overwritten by dl when grad_scale
  int64_t logits_stride;  // elements
  const int64_t* target;  // [rows], stride target_stride
  int64_t target_stride;
  float* loss;            // [rows]
  const float* grad_scale = nullptr;  // [1] or [rows] (grad_scale_stride 0 or 1); nullptr: the loss only
  int64_t grad_scale_stride = 0;
  int64_t rows;
  int vocab;
  int64_t ignore_index;
  float label_smoothing;
  float softcap;  // 0: none
};

namespace cross_entropy_detail {

constexpr float kLog2e = 1.4426950408889634f;
// The tuning values (CrossEntropyPolicy, with their reasons), under the names the kernels use.
constexpr int kBlocksPerSm = CrossEntropyPolicy::kBlocksPerSm;
constexpr int kVecsPerThread = CrossEntropyPolicy::kVecsPerThread;

// (max, sum of exp(z - max), sum of z) of a part of a row, merged across threads.
struct RowStats {
  float max, sum_exp, sum_z;
};

TK_DEVICE RowStats merge(const RowStats& a, const RowStats& b) {
  const float m = fmaxf(a.max, b.max);
  // exp2((-inf) - (-inf)) would be NaN: a part with no finite logit contributes nothing.
  const float ea = a.max == -INFINITY ? 0.f : exp2f((a.max - m) * kLog2e);
  const float eb = b.max == -INFINITY ? 0.f : exp2f((b.max - m) * kLog2e);
  return {m, a.sum_exp * ea + b.sum_exp * eb, a.sum_z + b.sum_z};
}

// The block's merged stats, in every thread. One __syncthreads; the caller separates calls.
TK_DEVICE RowStats block_merge(RowStats s) {
  __shared__ RowStats warp_stats[kWarpSize];
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const RowStats o{__shfl_xor_sync(kFullMask, s.max, offset), __shfl_xor_sync(kFullMask, s.sum_exp, offset),
                     __shfl_xor_sync(kFullMask, s.sum_z, offset)};
    s = merge(s, o);
  }
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) warp_stats[warp] = s;
  __syncthreads();
  s = lane < static_cast<int>(blockDim.x / kWarpSize) ? warp_stats[lane] : RowStats{-INFINITY, 0.f, 0.f};
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const RowStats o{__shfl_xor_sync(kFullMask, s.max, offset), __shfl_xor_sync(kFullMask, s.sum_exp, offset),
                     __shfl_xor_sync(kFullMask, s.sum_z, offset)};
    s = merge(s, o);
  }
  return s;
}

// The capped logit z of l (kSoftcap), with t = tanh(l / c) for the chain rule.
template <bool kSoftcap>
TK_DEVICE float capped(float l, float cap, float inv_cap, float& t) {
  if constexpr (kSoftcap) {
    t = tanhf(l * inv_cap);
    return cap * t;
  } else {
    return l;
  }
}

// Adds N logits to a thread's stats: one rescale per vector, one exp2 per element.
template <bool kSoftcap, int N>
TK_DEVICE void accumulate(RowStats& s, const float (&l)[N], float cap, float inv_cap) {
  float z[N], tanh_l, m = s.max;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    z[i] = capped<kSoftcap>(l[i], cap, inv_cap, tanh_l);
    m = fmaxf(m, z[i]);
    s.sum_z += z[i];
  }
  if (m == -INFINITY) return;  // all -inf so far: nothing to add
  float sum = s.max == -INFINITY ? 0.f : s.sum_exp * exp2f((s.max - m) * kLog2e);
  const float m2 = m * kLog2e;
#pragma unroll
  for (int i = 0; i < N; ++i) sum += exp2f(fmaf(z[i], kLog2e, -m2));
  s.max = m, s.sum_exp = sum;
}

// dl of N logits starting at column v0 (module comment).
template <bool kSoftcap, int N>
TK_DEVICE void gradient(const float (&l)[N], int v0, int64_t t, float lse2, float smooth, float on_target,
                        float scale, float cap, float inv_cap, float (&dl)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float tanh_l = 0.f;
    const float z = capped<kSoftcap>(l[i], cap, inv_cap, tanh_l);
    float g = exp2f(fmaf(z, kLog2e, -lse2)) - smooth;
    if (v0 + i == t) g -= on_target;
    if constexpr (kSoftcap) g *= 1.f - tanh_l * tanh_l;
    dl[i] = g * scale;
  }
}

template <typename T, bool kSoftcap, int kVec>
TK_DEVICE void body(const CrossEntropyParams<T>& p) {
  using vec = vec_t<T, kVec>;
  const int vocab = p.vocab;
  const int num_vecs = vocab / kVec;
  const float cap = p.softcap, inv_cap = kSoftcap ? 1.f / p.softcap : 0.f;
  const float eps = p.label_smoothing;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    T* __restrict__ logits = p.logits + row * p.logits_stride;
    const int64_t t = p.target[row * p.target_stride];
    const bool ignored = t == p.ignore_index;
    const bool valid = !ignored && t >= 0 && t < vocab;
    float z_target = 0.f;
    if (threadIdx.x == 0 && valid) {  // read before any thread overwrites the row
      float unused;
      z_target = capped<kSoftcap>(to_float(logits[t]), cap, inv_cap, unused);
    }

    // Pass 1: the row's max, sum of exp and sum (for the smoothing term).
    RowStats s{-INFINITY, 0.f, 0.f};
    if (!ignored) {
      for (int base = threadIdx.x; base < num_vecs; base += blockDim.x * kVecsPerThread) {
        vec v[kVecsPerThread];
#pragma unroll
        for (int u = 0; u < kVecsPerThread; ++u)
          if (base + u * blockDim.x < num_vecs) v[u].load(logits + (base + u * blockDim.x) * kVec);
#pragma unroll
        for (int u = 0; u < kVecsPerThread; ++u) {
          if (base + u * blockDim.x < num_vecs) {
            float l[kVec];
            v[u].cast_to(l);
            accumulate<kSoftcap>(s, l, cap, inv_cap);
          }
        }
      }
      for (int col = num_vecs * kVec + threadIdx.x; col < vocab; col += blockDim.x) {
        const float l[1] = {to_float(logits[col])};
        accumulate<kSoftcap>(s, l, cap, inv_cap);
      }
    }
    s = block_merge(s);  // uniform: every thread takes part, ignored rows too
    const float lse = s.max + logf(s.sum_exp);
    if (threadIdx.x == 0) {
      const float nan = __int_as_float(0x7fc00000);
      p.loss[row] = ignored ? 0.f
                  : !valid  ? nan
                            : (1.f - eps) * (lse - z_target) + eps * (lse - s.sum_z / static_cast<float>(vocab));
    }

    // Pass 2: the gradient, in place.
    if (p.grad_scale != nullptr) {
      const float scale = valid ? p.grad_scale[row * p.grad_scale_stride] : (ignored ? 0.f : __int_as_float(0x7fc00000));
      const float smooth = eps / static_cast<float>(vocab), on_target = 1.f - eps;
      const float lse2 = lse * kLog2e;
      for (int base = threadIdx.x; base < num_vecs; base += blockDim.x * kVecsPerThread) {
        vec v[kVecsPerThread];
#pragma unroll
        for (int u = 0; u < kVecsPerThread; ++u)
          if (!ignored && base + u * blockDim.x < num_vecs) v[u].load(logits + (base + u * blockDim.x) * kVec);
#pragma unroll
        for (int u = 0; u < kVecsPerThread; ++u) {
          const int vi = base + u * blockDim.x;
          if (vi < num_vecs) {
            float dl[kVec];
            if (ignored) {
#pragma unroll
              for (int i = 0; i < kVec; ++i) dl[i] = 0.f;
            } else {
              float l[kVec];
              v[u].cast_to(l);
              gradient<kSoftcap>(l, vi * kVec, t, lse2, smooth, on_target, scale, cap, inv_cap, dl);
            }
            vec out;
            out.cast_from(dl);
            out.store(logits + vi * kVec);
          }
        }
      }
      for (int col = num_vecs * kVec + threadIdx.x; col < vocab; col += blockDim.x) {
        float dl[1] = {0.f};
        if (!ignored) {
          const float l[1] = {to_float(logits[col])};
          gradient<kSoftcap>(l, col, t, lse2, smooth, on_target, scale, cap, inv_cap, dl);
        }
        logits[col] = from_float<T>(dl[0]);
      }
    }
    __syncthreads();  // block_merge's shared stats are rewritten by the next row
  }
}

// The launch heuristic (schedule.cuh): threads a power of two covering the row at kVecsPerThread
// vectors each (32 to kMaxBlockThreads, and no more than the kernel's registers allow:
// `max_threads`), and at most kBlocksPerSm blocks per SM striding over the rows.
inline void plan(int64_t rows, int vocab, int vec, int sm_count, int max_threads, dim3* grid, dim3* block) {
  const int64_t vecs = std::max<int64_t>(1, ceil_div(vocab, vec));
  const int threads = 1 << log2_threads_per_row(ceil_div(vecs, kVecsPerThread), kMaxBlockThreads);
  *block = dim3(std::max(kWarpSize, std::min(threads, max_threads)));
  *grid = dim3(static_cast<unsigned>(std::min<int64_t>(rows, static_cast<int64_t>(sm_count) * kBlocksPerSm)));
}

template <typename T, bool kSoftcap, int kVec>
cudaError_t LaunchCrossEntropy(const CrossEntropyParams<T>& p, int sm_count, cudaStream_t stream) {
  constexpr auto kKernel = &kernel_entry<CrossEntropyParams<T>, body<T, kSoftcap, kVec>>;
  dim3 grid, block;
  // The soft-capped kernels use more than 64 registers: 1024 threads would not fit an SM's 64 K.
  plan(p.rows, p.vocab, kVec, sm_count, max_block_threads<kKernel>(kMaxBlockThreads / 2), &grid, &block);
  launch_kernel(kKernel, grid, block, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace cross_entropy_detail

// Host launcher: 16-byte vectors when the logits and their row stride allow it, scalar otherwise.
template <typename T>
cudaError_t cross_entropy_rows(const CrossEntropyParams<T>& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  int device = 0, sm_count = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  constexpr int kVec = vec_size<T>();
  const bool vectorizable = is_vec_aligned<T, kVec>(p.logits) && p.logits_stride % kVec == 0;
  const bool softcap = p.softcap > 0.f;
  using namespace cross_entropy_detail;
  if (vectorizable) {
    return softcap ? LaunchCrossEntropy<T, true, kVec>(p, sm_count, stream)
                   : LaunchCrossEntropy<T, false, kVec>(p, sm_count, stream);
  }
  return softcap ? LaunchCrossEntropy<T, true, 1>(p, sm_count, stream)
                 : LaunchCrossEntropy<T, false, 1>(p, sm_count, stream);
}

}  // namespace transformer_kernels
