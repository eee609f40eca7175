// GroupNorm over [N, C, *spatial] with the fusions of diffusers' ResNet blocks. Torch-free: the
// kernels, their launch plan and a host launcher.
//
//   h   = x                               (group_norm)
//       | round(x + bias_nc[n, c])        (add_group_norm: ResnetBlock2D's `h + temb[:, :, None, None]`)
//   y   = round(GroupNorm(h))             ATen's CUDA formula (group_norm_element) from fp32 statistics,
//                                         mean and rstd rounded to T first as ATen stores them
//   out = y | round(silu(y))              (activation "silu": F.silu of the rounded norm)
//
// Layouts, both read and written in place (the output keeps x's layout):
//   channels-first (NCHW, NCDHW): group (n, g) is one contiguous span of D * S elements
//     (D = C / G channels, S = prod(spatial));
//   channels-last (NHWC, NDHWC): sample n is S rows of C contiguous channels.
// Any batch stride. Statistics are fp32, two-level and deterministic (no atomics): every block
// that combines partial statistics does so in the same order.
//
// Plans (group_norm_plan):
//   channels-first, whole groups: one block per group, h kept in registers between the passes (one read).
//   channels-first, split groups: too few or too large groups for one block each. Kernel 1 writes the
//     moments of each chunk of a group; the normalizing kernel combines its group's chunk moments (one
//     warp; up to 32 chunks, else a finalize kernel combines them once per group in between) and
//     normalizes its chunk, visiting chunks in reverse order so that the chunks read last by kernel 1
//     are re-read from L2 first.
//   channels-last: kernel 1, one block per row tile of a sample (tiles sized so that the grid is one
//     full wave), writes each group's moments over the tile; kernel 2 combines each (n, g)'s tiles into
//     mean and rstd once (N * G warps); kernel 3 normalizes each tile, rows in reverse order (L2 reuse).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/activation_math.cuh"
#include "common/divmod.cuh"
#include "common/kernel.cuh"
#include "common/math.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "group_norm/group_norm_policy.cuh"

namespace transformer_kernels {

enum class GroupNormLayout { kChannelsFirst, kChannelsLast };

// How ATen's CUDA group_norm (aten/src/ATen/native/cuda/group_norm_kernel.cu) computes an element
// from its group's mean and rstd, with the FMAs where nvcc contracts ATen's expressions (read from
// the sm_90 SASS of torch 2.11's libtorch_cuda.so; 2.14's ComputeFusedParamsCUDAKernel is the same):
//   kPlain (no weight, no bias):      (x - mean) * rstd
//   kAffine (weight and/or bias):     a = rstd * w, b = bias - a * mean (ComputeFusedParamsCUDAKernel:
//                                     FMUL then FADD, not contracted): fma(a, x, b)
//   kAffine1d (S == 1, w and/or b):   fma((x - mean) * rstd, w, b), (x - mean) * rstd * w, fma(x - mean, rstd, b)
enum class GroupNormMath { kPlain, kAffine, kAffine1d };

// What the host decides once per call (group_norm_plan); the binding allocates the workspace it names.
struct GroupNormPlan {
  GroupNormLayout layout = GroupNormLayout::kChannelsFirst;
  int vec = 1;           // elements per vector access
  int threads = 0;       // per block
  int parts = 1;         // channels-first: chunks per group (1: whole groups); channels-last: row tiles per sample
  bool finalize = false; // a kernel combines each group's parts into (mean, rstd) before the normalization
  int64_t part_elems = 0;  // channels-first: elements per chunk (the last may be shorter)
  int col_threads = 0;   // channels-last: threads across a row's C / vec vectors
  int row_lanes = 0;     // channels-last: rows a block works on at once
  int smem_bytes = 0;    // channels-last kernel 1's dynamic shared memory
};

template <typename T>
struct GroupNormParams {
  const T* x;  // [N, C, *spatial] in `plan.layout`, batch stride x_batch_stride
  int64_t x_batch_stride;
  const T* bias_nc = nullptr;  // [N or 1, C], unit channel stride: added to x before the norm, or none
  int64_t bias_nc_batch_stride = 0;  // 0: one row for every sample
  const T* weight = nullptr;  // [C] or none
  const T* bias = nullptr;    // [C] or none
  T* out;  // x's shape and layout, batch stride out_batch_stride
  int64_t out_batch_stride;
  int64_t batch;   // N
  int channels;    // C
  int groups;      // G, dividing C
  int64_t spatial; // S; D * S < 2^31 (channels-first), S < 2^31 (channels-last)
  float eps;       // as ATen adds it: eps rounded to T, then to fp32
  // Round each group's mean and rstd to T before normalizing, as ATen's RowwiseMomentsCUDAKernel<T>
  // of torch 2.11 stores them (T mean[], T rstd[]); torch 2.14 keeps them fp32 (mean_acc, rstd_acc).
  // A no-op for float. The binding sets it from the torch version it is built against.
  bool stats_in_x_dtype = true;
  bool silu = false;
  GroupNormPlan plan;
  // Workspace of group_norm_workspace_floats(plan, N, G) floats, or none when that is 0:
  // [N, G, parts, 3] moments (count, mean, M2), then (plan.finalize) [N, G, 2] (mean, rstd).
  float* workspace = nullptr;
  FastDivmod spatial_div;  // S (channels-first: the channel of a group offset), set by group_norm_plan
  FastDivmod group_div;    // D = C / G (channels-last: the group of a channel)
};

namespace group_norm_detail {

constexpr int kMomentFloats = 3;   // count, mean, M2
constexpr int kGroupStatFloats = 2;  // mean, rstd
using P = GroupNormPolicy;

enum class CfPass { kWhole, kStats, kNormalize };

struct Moments {
  float count, mean, m2;
};

// Chan et al.'s pairwise update; `a` is the earlier part. Either may be empty.
TK_DEVICE Moments merge(const Moments& a, const Moments& b) {
  if (b.count == 0.f) return a;
  if (a.count == 0.f) return b;
  const float n = a.count + b.count;
  const float delta = b.mean - a.mean;
  const float wb = b.count / n;
  return {n, a.mean + delta * wb, a.m2 + b.m2 + delta * delta * a.count * wb};
}

// The moments of `parts` consecutive entries (count, mean, M2) combined by one full warp: lane l
// merges entries l, l + 32, ... in order, then a butterfly in which both lanes of a pair merge
// (lower lane, upper lane). The order is fixed, so every warp that combines the same entries gets
// the same bits. Every lane receives the result.
TK_DEVICE Moments warp_combine(const float* entries, int parts) {
  const int lane = threadIdx.x % kWarpSize;
  Moments m{0.f, 0.f, 0.f};
  for (int i = lane; i < parts; i += kWarpSize) {
    const float* e = entries + static_cast<int64_t>(i) * kMomentFloats;
    m = merge(m, Moments{e[0], e[1], e[2]});
  }
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const Moments other{__shfl_xor_sync(kFullMask, m.count, offset), __shfl_xor_sync(kFullMask, m.mean, offset),
                        __shfl_xor_sync(kFullMask, m.m2, offset)};
    m = (lane & offset) ? merge(other, m) : merge(m, other);
  }
  return m;
}

// The finalize kernel's [N, G, 2] (mean, rstd), after the moments in the workspace.
template <typename T>
TK_DEVICE float* finalized_stats(const GroupNormParams<T>& p) {
  return p.workspace + p.batch * p.groups * p.plan.parts * kMomentFloats;
}

// rstd as ATen computes it from Welford's (n, M2): the biased variance M2 / n, then rsqrt(var + eps).
TK_DEVICE float rstd_of(const Moments& m, float eps) { return rsqrtf(__fdiv_rn(m.m2, m.count) + eps); }

struct GroupStats {
  float mean, rstd;
};

// The (mean, rstd) a group is normalized with: from its moments, rounded to T where ATen stores them in T.
template <typename T>
TK_DEVICE GroupStats group_stats(const GroupNormParams<T>& p, const Moments& m) {
  const float rstd = rstd_of(m, p.eps);
  if constexpr (std::is_same_v<T, float>) {
    return {m.mean, rstd};
  } else {
    if (!p.stats_in_x_dtype) return {m.mean, rstd};
    return {round_through<T>(m.mean), round_through<T>(rstd)};
  }
}

// Per-channel coefficients of group_norm_element: (w, b) as given for kAffine1d, (a, b) for kAffine.
struct ChannelCoeffs {
  float a, b;
};

TK_DEVICE ChannelCoeffs channel_coeffs(GroupNormMath math, float mean, float rstd, bool has_w, float w, bool has_b,
                                       float b) {
  if (math == GroupNormMath::kAffine) {
    const float a = has_w ? __fmul_rn(rstd, w) : rstd;
    return {a, __fsub_rn(has_b ? b : 0.f, __fmul_rn(mean, a))};
  }
  return {w, b};
}

TK_DEVICE float group_norm_element(GroupNormMath math, float x, float mean, float rstd, const ChannelCoeffs& c,
                                   bool has_w, bool has_b) {
  if (math == GroupNormMath::kAffine) return __fmaf_rn(c.a, x, c.b);
  const float centered = __fsub_rn(x, mean);
  if (math == GroupNormMath::kPlain) return __fmul_rn(centered, rstd);
  if (!has_w) return __fmaf_rn(centered, rstd, c.b);
  const float normalized = __fmul_rn(centered, rstd);
  return has_b ? __fmaf_rn(normalized, c.a, c.b) : __fmul_rn(normalized, c.a);
}

template <typename T>
TK_DEVICE GroupNormMath math_of(const GroupNormParams<T>& p) {
  if (p.weight == nullptr && p.bias == nullptr) return GroupNormMath::kPlain;
  return p.spatial == 1 ? GroupNormMath::kAffine1d : GroupNormMath::kAffine;
}

// The output of N normalized values y (fp32): y rounded to T, or silu of the rounded y rounded again.
template <typename T, int N>
TK_DEVICE vec_t<T, N> finish(float (&y)[N], bool silu) {
  if (silu) {
    round_through<T>(y);
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = activate<Activation::kSilu>(y[i]);
  }
  vec_t<T, N> o;
  o.cast_from(y);
  return o;
}

// ---- channels-first ----

// One block per whole group (kWhole), per chunk of a group (kStats), or per chunk in reverse order
// (kNormalize, after kStats). A chunk's elements are the group's offsets [start, start + len).
template <typename T, int kVec, CfPass kPass>
TK_DEVICE void cf_body(const GroupNormParams<T>& p) {
  using vec = vec_t<T, kVec>;
  const int parts = p.plan.parts;
  const int64_t items = p.batch * p.groups * parts;
  const int64_t item = kPass == CfPass::kNormalize ? items - 1 - blockIdx.x : blockIdx.x;
  const int64_t ng = item / parts;
  const int part = static_cast<int>(item - ng * parts);
  const int64_t n = ng / p.groups;
  const int g = static_cast<int>(ng - n * p.groups);
  const int d = p.channels / p.groups;
  // Offsets within a group are 32-bit (the binding caps D * S below 2^31).
  const int group_len = static_cast<int>(d * p.spatial);
  const int start = static_cast<int>(part * p.plan.part_elems);
  const int len = group_len - start < p.plan.part_elems ? group_len - start : static_cast<int>(p.plan.part_elems);
  const int64_t offset = static_cast<int64_t>(g) * group_len + start;
  const T* x = p.x + n * p.x_batch_stride + offset;
  T* out = p.out + n * p.out_batch_stride + offset;
  const T* bias_nc = p.bias_nc != nullptr ? p.bias_nc + n * p.bias_nc_batch_stride + g * d : nullptr;
  const int num_vecs = len / kVec;  // kVec divides S, so every chunk is whole vectors
  const int t = threadIdx.x, threads = blockDim.x;

  // The channel (within the group) of vector v: one channel per vector, as kVec divides S.
  auto channel_of = [&](int v) { return static_cast<int>(p.spatial_div.div(static_cast<uint32_t>(start + v * kVec))); };
  auto load_h = [&](int v, int c) {
    vec h;
    h.load(x + v * kVec);
    if (bias_nc != nullptr) h = add_rn(h, filled<T, kVec>(bias_nc[c]));
    return h;
  };

  float mean, rstd;
  vec cached[P::kCachedVecs];
  if constexpr (kPass != CfPass::kNormalize) {
    // Two passes over the values in registers: the mean, then the squared deviations from it.
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < P::kCachedVecs; ++k) {
      const int v = t + k * threads;
      if (v < num_vecs) {
        cached[k] = load_h(v, bias_nc != nullptr ? channel_of(v) : 0);
#pragma unroll
        for (int i = 0; i < kVec; ++i) sum += to_float(cached[k][i]);
      }
    }
    for (int v = t + P::kCachedVecs * threads; v < num_vecs; v += threads) {  // groups beyond the cache
      const vec h = load_h(v, bias_nc != nullptr ? channel_of(v) : 0);
#pragma unroll
      for (int i = 0; i < kVec; ++i) sum += to_float(h[i]);
    }
    sum = row_reduce_sum<0>(sum);
    const float chunk_mean = __fdiv_rn(sum, static_cast<float>(len));
    float m2 = 0.f;
#pragma unroll
    for (int k = 0; k < P::kCachedVecs; ++k) {
      const int v = t + k * threads;
      if (v < num_vecs) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float dev = to_float(cached[k][i]) - chunk_mean;
          m2 += dev * dev;
        }
      }
    }
    for (int v = t + P::kCachedVecs * threads; v < num_vecs; v += threads) {
      const vec h = load_h(v, bias_nc != nullptr ? channel_of(v) : 0);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float dev = to_float(h[i]) - chunk_mean;
        m2 += dev * dev;
      }
    }
    m2 = row_reduce_sum<0, /*kBuffer=*/1>(m2);
    if constexpr (kPass == CfPass::kStats) {
      if (t == 0) {
        float* e = p.workspace + item * kMomentFloats;
        e[0] = static_cast<float>(len);
        e[1] = chunk_mean;
        e[2] = m2;
      }
      return;
    }
    const GroupStats s = group_stats(p, Moments{static_cast<float>(len), chunk_mean, m2});
    mean = s.mean;
    rstd = s.rstd;
  }

  const GroupNormMath math = math_of(p);
  const bool has_w = p.weight != nullptr, has_b = p.bias != nullptr;
  const T* weight = has_w ? p.weight + g * d : nullptr;
  const T* bias = has_b ? p.bias + g * d : nullptr;
  auto store_vec = [&](const vec& h, int v, int c) {
    const ChannelCoeffs coeffs = channel_coeffs(math, mean, rstd, has_w, has_w ? to_float(weight[c]) : 1.f, has_b,
                                                has_b ? to_float(bias[c]) : 0.f);
    float y[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = group_norm_element(math, to_float(h[i]), mean, rstd, coeffs, has_w, has_b);
    finish<T>(y, p.silu).store(out + v * kVec);
  };

  if constexpr (kPass == CfPass::kWhole) {
#pragma unroll
    for (int k = 0; k < P::kCachedVecs; ++k) {
      const int v = t + k * threads;
      if (v < num_vecs) store_vec(cached[k], v, channel_of(v));
    }
    for (int v = t + P::kCachedVecs * threads; v < num_vecs; v += threads) {
      const int c = channel_of(v);
      store_vec(load_h(v, c), v, c);
    }
  } else {
    // kNormalize: the first vectors' loads are issued before waiting for the group's statistics.
    vec buf[P::kUnroll];
    int chan[P::kUnroll];
    auto load_batch = [&](int base) {
#pragma unroll
      for (int u = 0; u < P::kUnroll; ++u) {
        const int v = base + u * threads;
        if (v < num_vecs) {
          chan[u] = channel_of(v);
          buf[u] = load_h(v, chan[u]);
        }
      }
    };
    load_batch(t);
    if (p.plan.finalize) {
      const float* s = finalized_stats(p) + ng * kGroupStatFloats;
      mean = s[0];
      rstd = s[1];
    } else {
      __shared__ float shared_stats[kGroupStatFloats];
      if (t < kWarpSize) {
        const Moments m = warp_combine(p.workspace + ng * parts * kMomentFloats, parts);
        if (t == 0) {
          const GroupStats s = group_stats(p, m);
          shared_stats[0] = s.mean;
          shared_stats[1] = s.rstd;
        }
      }
      __syncthreads();
      mean = shared_stats[0];
      rstd = shared_stats[1];
    }
    for (int base = t; base < num_vecs; base += threads * P::kUnroll) {
      if (base != t) load_batch(base);
#pragma unroll
      for (int u = 0; u < P::kUnroll; ++u) {
        const int v = base + u * threads;
        if (v < num_vecs) store_vec(buf[u], v, chan[u]);
      }
    }
  }
}

// ---- channels-last ----

// Where a channels-last block works: sample n, rows [row_begin, row_end) of it, columns
// [col, col + kVec) of each row (row lane `lane` of `lanes` takes every lanes-th row).
struct ClTile {
  int64_t n;
  int tile;
  int64_t row_begin, row_end;
  int col;
  int lane, lanes;
  bool active;  // false for the threads that round the block up to whole warps
};

template <typename T>
TK_DEVICE ClTile cl_tile(const GroupNormParams<T>& p, int vec) {
  ClTile w;
  const int parts = p.plan.parts;
  w.n = blockIdx.x / parts;
  w.tile = static_cast<int>(blockIdx.x - w.n * parts);
  // Tiles split the S rows evenly (sizes differ by at most one row): one block per SM slot, equal work.
  w.row_begin = p.spatial * w.tile / parts;
  w.row_end = p.spatial * (w.tile + 1) / parts;
  const int col_threads = p.plan.col_threads;
  w.lanes = p.plan.row_lanes;
  w.lane = threadIdx.x / col_threads;
  w.col = (threadIdx.x - w.lane * col_threads) * vec;
  w.active = w.lane < w.lanes;
  return w;
}

// Kernel 1: each group's moments over the tile, written to [n, g, tile]. Per channel, shifted sums
// sum(h - K) and sum((h - K)^2) with K the channel's value on the tile's first row (the shift keeps
// the variance accurate when the mean is large against the spread), summed over row lanes in
// shared memory, turned into (mean, M2) per channel and combined per group by the law of total
// variance (M2 = sum of the channels' M2 + rows * sum of (channel mean - group mean)^2).
template <typename T, int kVec>
TK_DEVICE void cl_stats_body(const GroupNormParams<T>& p) {
  using vec = vec_t<T, kVec>;
  extern __shared__ float smem[];  // [2][row_lanes][C]: the shifted sums, then [C]: the shifts
  const ClTile w = cl_tile(p, kVec);
  const int C = p.channels;
  const T* x = p.x + w.n * p.x_batch_stride + w.col;
  vec bias_nc;
  if (w.active && p.bias_nc != nullptr) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) bias_nc[i] = p.bias_nc[w.n * p.bias_nc_batch_stride + w.col + i];
  }
  auto load_h_at = [&](const T* ptr) {
    vec h;
    h.load(ptr);
    return p.bias_nc != nullptr ? add_rn(h, bias_nc) : h;
  };
  auto load_h = [&](int64_t row) { return load_h_at(x + row * C); };
  const int64_t rows = w.row_end - w.row_begin;
  // Rows of this lane: row_begin + lane + j * lanes for j < lane_rows, through a running pointer.
  const int lane_rows = w.active && rows > w.lane ? static_cast<int>((rows - w.lane + w.lanes - 1) / w.lanes) : 0;
  const int64_t stride = static_cast<int64_t>(w.lanes) * C;
  // The shift stays packed in T (converted at each use: 4 registers fewer for 16-bit T).
  vec shift = filled<T, kVec>(from_float<T>(0.f));
  float s1[kVec], s2[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) s1[i] = s2[i] = 0.f;
  if (w.active && rows > 0) shift = load_h(w.row_begin);
  const T* row_ptr = x + (w.row_begin + w.lane) * C;
  for (int j = 0; j < lane_rows; j += P::kUnroll, row_ptr += P::kUnroll * stride) {
    vec h[P::kUnroll];
#pragma unroll
    for (int u = 0; u < P::kUnroll; ++u)
      if (j + u < lane_rows) h[u] = load_h_at(row_ptr + u * stride);
#pragma unroll
    for (int u = 0; u < P::kUnroll; ++u) {
      if (j + u < lane_rows) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float dev = to_float(h[u][i]) - to_float(shift[i]);
          s1[i] += dev;
          s2[i] += dev * dev;
        }
      }
    }
  }
  float* sum1 = smem;
  float* sum2 = smem + w.lanes * C;
  float* shifts = smem + 2 * w.lanes * C;
  if (w.active) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      sum1[w.lane * C + w.col + i] = s1[i];
      sum2[w.lane * C + w.col + i] = s2[i];
      if (w.lane == 0) shifts[w.col + i] = to_float(shift[i]);
    }
  }
  __syncthreads();
  // Per channel: the row lanes' sums in lane order, then the channel's mean and M2 (into lane 0's slots).
  const float n_rows = static_cast<float>(rows);
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float a = 0.f, b = 0.f;
    for (int l = 0; l < w.lanes; ++l) {
      a += sum1[l * C + c];
      b += sum2[l * C + c];
    }
    const float mean_dev = rows > 0 ? __fdiv_rn(a, n_rows) : 0.f;
    sum1[c] = shifts[c] + mean_dev;
    sum2[c] = fmaxf(b - a * mean_dev, 0.f);
  }
  __syncthreads();
  // Per group: the mean of the channel means, then M2 by the law of total variance; one thread per
  // group for SD's few channels per group, a warp for many.
  const int d = C / p.groups;
  auto write_moments = [&](int g, float mean, float within, float between) {
    float* e = p.workspace + ((w.n * p.groups + g) * p.plan.parts + w.tile) * kMomentFloats;
    e[0] = n_rows * static_cast<float>(d);
    e[1] = mean;
    e[2] = within + n_rows * between;
  };
  if (d <= P::kSerialGroupChannels) {
    for (int g = threadIdx.x; g < p.groups; g += blockDim.x) {
      const float* means = sum1 + g * d;
      float mean_sum = 0.f;
      for (int j = 0; j < d; ++j) mean_sum += means[j];
      const float mean = __fdiv_rn(mean_sum, static_cast<float>(d));
      float between = 0.f, within = 0.f;
      for (int j = 0; j < d; ++j) {
        const float dev = means[j] - mean;
        between += dev * dev;
        within += sum2[g * d + j];
      }
      write_moments(g, mean, within, between);
    }
    return;
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  for (int g = warp; g < p.groups; g += blockDim.x / kWarpSize) {
    float mean_sum = 0.f;
    for (int j = lane; j < d; j += kWarpSize) mean_sum += sum1[g * d + j];
    const float mean = __fdiv_rn(group_reduce_sum(mean_sum), static_cast<float>(d));
    float between = 0.f, within = 0.f;
    for (int j = lane; j < d; j += kWarpSize) {
      const float dev = sum1[g * d + j] - mean;
      between += dev * dev;
      within += sum2[g * d + j];
    }
    between = group_reduce_sum(between);
    within = group_reduce_sum(within);
    if (lane == 0) write_moments(g, mean, within, between);
  }
}

// Kernel 2 (both layouts, plan.finalize): (mean, rstd) of every (n, g) from its parts' moments, one
// warp each.
template <typename T>
TK_DEVICE void finalize_body(const GroupNormParams<T>& p) {
  const int64_t ng = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (ng >= p.batch * p.groups) return;  // whole warps leave together
  const Moments m = warp_combine(p.workspace + ng * p.plan.parts * kMomentFloats, p.plan.parts);
  if (threadIdx.x % kWarpSize == 0) {
    const GroupStats stats = group_stats(p, m);
    float* s = finalized_stats(p) + ng * kGroupStatFloats;
    s[0] = stats.mean;
    s[1] = stats.rstd;
  }
}

// Kernel 3: normalize the tile, its rows in reverse order (the rows kernel 1 read last come first).
template <typename T, int kVec>
TK_DEVICE void cl_normalize_body(const GroupNormParams<T>& p) {
  using vec = vec_t<T, kVec>;
  const ClTile w = cl_tile(p, kVec);
  if (!w.active) return;
  const int C = p.channels;
  const T* x = p.x + w.n * p.x_batch_stride + w.col;
  T* out = p.out + w.n * p.out_batch_stride + w.col;
  const float* sample_stats = finalized_stats(p) + w.n * p.groups * kGroupStatFloats;
  // kPlain or kAffine (S == 1 is channels-first): per channel (mean, rstd) or (a, b).
  const bool affine = math_of(p) == GroupNormMath::kAffine;
  const bool has_w = p.weight != nullptr, has_b = p.bias != nullptr;
  const int64_t rows = w.row_end - w.row_begin;
  const int lane_rows = rows > w.lane ? static_cast<int>((rows - w.lane + w.lanes - 1) / w.lanes) : 0;
  const int64_t stride = static_cast<int64_t>(w.lanes) * C;
  // This lane's rows from the last: row_end - 1 - lane - j * lanes.
  const int64_t first = w.row_end - 1 - w.lane;
  const T* in_ptr = x + first * C;
  T* out_ptr = out + first * C;
  vec h[P::kUnroll];
  auto load_rows = [&](int j) {
#pragma unroll
    for (int u = 0; u < P::kUnroll; ++u)
      if (j + u < lane_rows) h[u].load(in_ptr - u * stride);
  };
  load_rows(0);  // issued before the coefficients' loads are waited for
  vec bias_nc;
  ChannelCoeffs coeffs[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const int c = w.col + i;
    const float* s = sample_stats + p.group_div.div(static_cast<uint32_t>(c)) * kGroupStatFloats;
    coeffs[i] = affine ? channel_coeffs(GroupNormMath::kAffine, s[0], s[1], has_w, has_w ? to_float(p.weight[c]) : 1.f,
                                        has_b, has_b ? to_float(p.bias[c]) : 0.f)
                       : ChannelCoeffs{s[0], s[1]};
    if (p.bias_nc != nullptr) bias_nc[i] = p.bias_nc[w.n * p.bias_nc_batch_stride + c];
  }
  for (int j = 0; j < lane_rows; j += P::kUnroll, in_ptr -= P::kUnroll * stride, out_ptr -= P::kUnroll * stride) {
    if (j > 0) load_rows(j);
#pragma unroll
    for (int u = 0; u < P::kUnroll; ++u) {
      if (j + u < lane_rows) {
        if (p.bias_nc != nullptr) h[u] = add_rn(h[u], bias_nc);
        float y[kVec];
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float v = to_float(h[u][i]);
          y[i] = affine ? __fmaf_rn(coeffs[i].a, v, coeffs[i].b) : __fmul_rn(__fsub_rn(v, coeffs[i].a), coeffs[i].b);
        }
        finish<T>(y, p.silu).store(out_ptr - u * stride);
      }
    }
  }
}

template <typename T, int kVec, CfPass kPass>
constexpr auto cf_kernel() {
  return kernel_entry_for<P::kRegisterCap, GroupNormParams<T>, cf_body<T, kVec, kPass>>();
}
template <typename T, int kVec>
constexpr auto cl_stats_kernel() {
  return kernel_entry_for<P::kStatsRegisterCap, GroupNormParams<T>, cl_stats_body<T, kVec>>();
}
template <typename T>
constexpr auto finalize_kernel() {
  return &kernel_entry<GroupNormParams<T>, finalize_body<T>>;
}
template <typename T, int kVec>
constexpr auto cl_normalize_kernel() {
  return kernel_entry_for<P::kRegisterCap, GroupNormParams<T>, cl_normalize_body<T, kVec>>();
}


template <typename T>
bool vectorizable(const GroupNormParams<T>& p, GroupNormLayout layout) {
  constexpr int kVec = vec_size<T>();
  const bool inner = layout == GroupNormLayout::kChannelsFirst ? p.spatial % kVec == 0 : p.channels % kVec == 0;
  return inner && is_vec_aligned<T, kVec>(p.x) && is_vec_aligned<T, kVec>(p.out) &&
         (p.batch <= 1 || (p.x_batch_stride % kVec == 0 && p.out_batch_stride % kVec == 0));
}

inline int round_up_to_warps(int64_t threads) {
  return static_cast<int>((threads + kWarpSize - 1) / kWarpSize * kWarpSize);
}

template <typename T, int kVec>
GroupNormPlan cf_plan(const GroupNormParams<T>& p, int sm_count) {
  GroupNormPlan plan;
  plan.layout = GroupNormLayout::kChannelsFirst;
  plan.vec = kVec;
  const int64_t group_len = static_cast<int64_t>(p.channels / p.groups) * p.spatial;
  const int64_t num_groups = p.batch * p.groups;
  const int64_t chunk = static_cast<int64_t>(P::kSplitThreads) * P::kCachedVecs * kVec;
  const int64_t whole_cap = static_cast<int64_t>(P::kMaxThreads) * P::kCachedVecs * kVec;
  const int64_t groups_to_fill = static_cast<int64_t>(P::kWholeGroupsPerSm) * sm_count;
  if (group_len <= chunk || (group_len <= whole_cap && num_groups >= groups_to_fill)) {
    const int64_t wanted = (group_len / kVec + P::kCachedVecs - 1) / P::kCachedVecs;
    plan.threads = std::min(P::kMaxThreads, std::max(kWarpSize, round_up_to_warps(wanted)));
    plan.parts = 1;
    plan.part_elems = group_len;
  } else {
    plan.threads = P::kSplitThreads;
    plan.parts = static_cast<int>((group_len + chunk - 1) / chunk);
    plan.part_elems = chunk;
    plan.finalize = plan.parts > P::kInlineCombineParts;
  }
  return plan;
}

template <typename T, int kVec>
GroupNormPlan cl_plan(const GroupNormParams<T>& p, int sm_count) {
  GroupNormPlan plan;
  plan.layout = GroupNormLayout::kChannelsLast;
  plan.vec = kVec;
  plan.col_threads = p.channels / kVec;
  plan.row_lanes = std::max(1, std::min(P::kMaxRowLanes, P::kRowThreads / plan.col_threads));
  plan.threads = round_up_to_warps(static_cast<int64_t>(plan.col_threads) * plan.row_lanes);
  plan.smem_bytes = static_cast<int>((2 * static_cast<int64_t>(plan.row_lanes) + 1) * p.channels * sizeof(float));
  // One full wave: as many tiles as blocks of both kernels fit on the GPU at once.
  int stats_blocks = 0, normalize_blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&stats_blocks, cl_stats_kernel<T, kVec>(), plan.threads,
                                                    plan.smem_bytes) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&normalize_blocks, cl_normalize_kernel<T, kVec>(), plan.threads,
                                                    0) != cudaSuccess) {
    (void)cudaGetLastError();  // the query failed: plan for one block per SM
    stats_blocks = normalize_blocks = 1;
  }
  const int64_t slots = static_cast<int64_t>(sm_count) * std::max(1, std::min(stats_blocks, normalize_blocks));
  const int64_t max_parts = std::max<int64_t>(1, (p.spatial + plan.row_lanes - 1) / plan.row_lanes);
  plan.parts = static_cast<int>(std::max<int64_t>(1, std::min(max_parts, slots / std::max<int64_t>(1, p.batch))));
  plan.finalize = true;
  return plan;
}

}  // namespace group_norm_detail

// Channels-last takes one thread per vector across a row: C / plan.vec <= kGroupNormMaxRowThreads
// (plan.vec is 16 bytes' worth when C is a multiple of it and the pointers are aligned, else 1).
constexpr int kGroupNormMaxRowThreads = GroupNormPolicy::kMaxColThreads;

inline bool group_norm_plan_supported(const GroupNormPlan& plan) {
  return plan.layout == GroupNormLayout::kChannelsFirst || plan.col_threads <= kGroupNormMaxRowThreads;
}

// The launch plan for p (x, out, batch strides and sizes set) in `layout`; also sets p's dividers.
// Launch only plans that group_norm_plan_supported accepts (the binding checks).
template <typename T>
GroupNormPlan group_norm_plan(GroupNormParams<T>& p, GroupNormLayout layout, int sm_count) {
  using namespace group_norm_detail;
  constexpr int kVec = vec_size<T>();
  p.spatial_div = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(p.spatial, kFastDivmodLimit - 1))));
  p.group_div = FastDivmod(static_cast<uint32_t>(std::max(1, p.channels / std::max(1, p.groups))));
  const bool vec = vectorizable(p, layout);
  if (layout == GroupNormLayout::kChannelsFirst) return vec ? cf_plan<T, kVec>(p, sm_count) : cf_plan<T, 1>(p, sm_count);
  return vec ? cl_plan<T, kVec>(p, sm_count) : cl_plan<T, 1>(p, sm_count);
}

// Floats of workspace the plan needs (0: none).
inline int64_t group_norm_workspace_floats(const GroupNormPlan& plan, int64_t batch, int groups) {
  using namespace group_norm_detail;
  if (plan.layout == GroupNormLayout::kChannelsFirst && plan.parts == 1) return 0;
  return batch * groups * (static_cast<int64_t>(plan.parts) * kMomentFloats + (plan.finalize ? kGroupStatFloats : 0));
}

namespace group_norm_detail {

template <typename T, int kVec>
cudaError_t LaunchGroupNorm(const GroupNormParams<T>& p, cudaStream_t stream) {
  const GroupNormPlan& plan = p.plan;
  const int64_t num_groups = p.batch * p.groups;
  const dim3 finalize_grid(
      static_cast<unsigned>((num_groups * kWarpSize + P::kFinalizeThreads - 1) / P::kFinalizeThreads));
  if (plan.layout == GroupNormLayout::kChannelsFirst) {
    const dim3 grid(static_cast<unsigned>(num_groups * plan.parts));
    if (plan.parts == 1) {
      launch_kernel(cf_kernel<T, kVec, CfPass::kWhole>(), grid, plan.threads, 0, stream, p);
    } else {
      launch_kernel(cf_kernel<T, kVec, CfPass::kStats>(), grid, plan.threads, 0, stream, p);
      if (plan.finalize) launch_kernel(finalize_kernel<T>(), finalize_grid, P::kFinalizeThreads, 0, stream, p);
      launch_kernel(cf_kernel<T, kVec, CfPass::kNormalize>(), grid, plan.threads, 0, stream, p);
    }
    return cudaGetLastError();
  }
  const dim3 grid(static_cast<unsigned>(p.batch * plan.parts));
  launch_kernel(cl_stats_kernel<T, kVec>(), grid, plan.threads, plan.smem_bytes, stream, p);
  launch_kernel(finalize_kernel<T>(), finalize_grid, P::kFinalizeThreads, 0, stream, p);
  launch_kernel(cl_normalize_kernel<T, kVec>(), grid, plan.threads, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace group_norm_detail

// Host launcher. p.plan from group_norm_plan (with its dividers), p.workspace of
// group_norm_workspace_floats floats when that is not 0.
template <typename T>
cudaError_t GroupNorm(const GroupNormParams<T>& p, cudaStream_t stream) {
  using namespace group_norm_detail;
  if (p.batch == 0 || p.channels == 0 || p.spatial == 0) return cudaSuccess;
  if (p.groups <= 0 || p.channels % p.groups != 0 || p.plan.threads <= 0 || !group_norm_plan_supported(p.plan) ||
      (group_norm_workspace_floats(p.plan, p.batch, p.groups) > 0 && p.workspace == nullptr))
    return cudaErrorInvalidValue;
  constexpr int kVec = vec_size<T>();
  return p.plan.vec == kVec ? LaunchGroupNorm<T, kVec>(p, stream) : LaunchGroupNorm<T, 1>(p, stream);
}

}  // namespace transformer_kernels
