// The backward of GroupNorm (+ SiLU) and of the added per-(sample, channel) bias, as ATen's CUDA
// autograd computes it. Torch-free: the kernels, their launch plan and a host launcher.
//
//   h  = x | round(x + bias_nc)                 the forward's normalized input, recomputed
//   dy = grad_out                               (activation "none")
//      | round(grad_out * silu'(y))             ("silu": y = the forward's rounded norm, recomputed with
//                                               its statistics and per-element formula, group_norm.cuh)
//   per (n, c):  ds = sum_s dy * h, db = sum_s dy, sh = sum_s h        (ATen's ComputeInternalGradients)
//   per (n, g):  c2 = (db_g * mean - ds_g) * rstd^3 / (D * S), c3 = -c2 * mean - db_g * rstd / (D * S),
//                ds_g, db_g the group's ds, db weighted by the channels' weights   (ATen's c2, c3)
//   dx = rstd * w_c * dy + c2 * h + c3                                 (ATen's GroupNormBackwardKernel)
//   dw_c = sum_n (ds - db * mean) * rstd, db_c = sum_n db              (ATen's GammaBetaBackward)
//   dbias_nc = sum_s dx = rstd * w_c * db + c2 * sh + c3 * S           (summed over n for a [1, C] bias)
//
// Everything in fp32, each output rounded once, no atomics: the same inputs give the same bits.
// The sums over a channel's spatial positions are split into tiles (channels x a range of positions),
// one block each, so that the grid fills the GPU whatever N, C and G are: a block's threads are
// `lanes` channels (1 channels-first: its positions contiguous; 32 channels-last: a row's channels
// contiguous) times `rows` positions; each tile writes its partial sums, combined over the tiles in
// order by the per-group kernels. Kernels: (1) each channel's moments (sums shifted by the channel's
// first value), (2) per (n, g): the group's mean and rstd (the channels' moments merged by Chan's
// update, rounded to T where the forward rounds them), (3) each channel's ds, db, sh, (4) per (n, g):
// c2 and c3, (5) dx over the same tiles, in x's layout, (6) one thread per channel: the parameter
// gradients, summed over the batch in order.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/activation_math.cuh"
#include "common/kernel.cuh"
#include "common/math.cuh"
#include "common/reduce.cuh"
#include "common/schedule.cuh"
#include "group_norm/group_norm.cuh"
#include "group_norm/group_norm_policy.cuh"

namespace transformer_kernels {

// The tiles of the channel sums, decided once per call (group_norm_backward_plan).
struct GroupNormBackwardPlan {
  int lanes = 1;            // channels of a tile (threads across them): 1 channels-first, 32 channels-last
  int rows = 0;             // threads across positions: blockDim.x / lanes
  int channel_tiles = 0;    // ceil(C / lanes)
  int splits = 1;           // position ranges per channel
  int64_t split_len = 0;    // positions per range (the last may be shorter)
};

template <typename T>
struct GroupNormBackwardParams {
  const T* grad_out;  // x's shape and layout, batch stride grad_out_batch_stride
  int64_t grad_out_batch_stride;
  const T* x;  // [N, C, *spatial] in `layout`, batch stride x_batch_stride
  int64_t x_batch_stride;
  const T* bias_nc = nullptr;  // [N or 1, C], unit channel stride, or none
  int64_t bias_nc_batch_stride = 0;
  const T* weight = nullptr;  // [C] or none
  const T* bias = nullptr;    // [C] or none (only the SiLU's recomputed y reads it)
  T* grad_x = nullptr;        // x's shape and layout, batch stride grad_x_batch_stride; or none
  int64_t grad_x_batch_stride = 0;
  T* grad_bias_nc = nullptr;  // [grad_bias_nc_rows, C] contiguous, or none
  int64_t grad_bias_nc_rows = 0;  // 1 (a bias shared by the batch: summed over n) or N
  T* grad_weight = nullptr;   // [C] contiguous, or none
  T* grad_bias = nullptr;     // [C] contiguous, or none
  int64_t batch;    // N
  int channels;     // C
  int groups;       // G, dividing C
  int64_t spatial;  // S; D * S < 2^31
  float eps;        // as the forward adds it
  bool stats_in_x_dtype = true;  // as GroupNormParams
  bool silu = false;
  GroupNormLayout layout = GroupNormLayout::kChannelsFirst;
  GroupNormBackwardPlan plan;
  // group_norm_backward_workspace_floats: the tiles' partial sums [N, splits, C, 3], each channel's
  // (ds, db, sh) [N, C, 3], each group's (mean, rstd, c2, c3) [N, G, 4].
  float* workspace;
};

inline GroupNormBackwardPlan group_norm_backward_plan(GroupNormLayout layout, int64_t batch, int channels,
                                                      int64_t spatial, int sm_count) {
  GroupNormBackwardPlan plan;
  const int threads = GroupNormPolicy::kBackwardBlockThreads;
  plan.lanes = layout == GroupNormLayout::kChannelsFirst ? 1 : kWarpSize;
  plan.rows = threads / plan.lanes;
  plan.channel_tiles = static_cast<int>(ceil_div(channels, plan.lanes));
  // Enough tiles for GroupNormPolicy::kBackwardBlocksPerSm blocks an SM, each thread with at least
  // kBackwardMinRowsPerThread positions.
  const int64_t wanted = static_cast<int64_t>(sm_count) * GroupNormPolicy::kBackwardBlocksPerSm;
  const int64_t tiles = std::max<int64_t>(1, batch * plan.channel_tiles);
  const int64_t max_splits =
      std::max<int64_t>(1, spatial / (static_cast<int64_t>(plan.rows) * GroupNormPolicy::kBackwardMinRowsPerThread));
  plan.splits = static_cast<int>(std::min<int64_t>(max_splits, ceil_div(wanted, tiles)));
  plan.split_len = ceil_div(std::max<int64_t>(spatial, 1), plan.splits);
  return plan;
}

inline int64_t group_norm_backward_workspace_floats(int64_t batch, int channels, int groups, int splits) {
  return batch * splits * channels * 3 + batch * channels * 3 + batch * groups * 4;
}

namespace group_norm_backward_detail {

constexpr int kChannelSums = 3;  // ds, db, sh (or the moments' shifted sum, sum of squares)
constexpr int kGroupTerms = 4;   // mean, rstd, c2, c3
using P = GroupNormPolicy;

// The offset within sample n of channel c, spatial position s, in the layout.
template <typename T>
TK_DEVICE int64_t element_offset(const GroupNormBackwardParams<T>& p, int c, int64_t s) {
  return p.layout == GroupNormLayout::kChannelsFirst ? static_cast<int64_t>(c) * p.spatial + s
                                                     : s * p.channels + c;
}

template <typename T>
TK_DEVICE float* tile_sums(const GroupNormBackwardParams<T>& p, int64_t n, int split, int c) {
  return p.workspace + ((n * p.plan.splits + split) * p.channels + c) * kChannelSums;
}

template <typename T>
TK_DEVICE float* channel_sums(const GroupNormBackwardParams<T>& p, int64_t n, int c) {
  return p.workspace + (p.batch * p.plan.splits * p.channels + n * p.channels + c) * kChannelSums;
}

template <typename T>
TK_DEVICE float* group_terms(const GroupNormBackwardParams<T>& p, int64_t ng) {
  return p.workspace + p.batch * (p.plan.splits + 1) * p.channels * kChannelSums + ng * kGroupTerms;
}

// The forward's normalized input: x, or x + bias_nc rounded to T (add_group_norm).
template <typename T>
TK_DEVICE float input_value(const GroupNormBackwardParams<T>& p, int64_t n, int c, int64_t offset) {
  const float x = to_float(p.x[n * p.x_batch_stride + offset]);
  if (p.bias_nc == nullptr) return x;
  return round_through<T>(x + to_float(p.bias_nc[n * p.bias_nc_batch_stride + c]));
}

template <typename T>
TK_DEVICE GroupNormMath backward_math(const GroupNormBackwardParams<T>& p) {
  if (p.weight == nullptr && p.bias == nullptr) return GroupNormMath::kPlain;
  return p.spatial == 1 ? GroupNormMath::kAffine1d : GroupNormMath::kAffine;
}

template <typename T>
TK_DEVICE group_norm_detail::ChannelCoeffs coeffs_of(const GroupNormBackwardParams<T>& p, int c, float mean,
                                                     float rstd) {
  const bool has_w = p.weight != nullptr, has_b = p.bias != nullptr;
  return group_norm_detail::channel_coeffs(backward_math(p), mean, rstd, has_w, has_w ? to_float(p.weight[c]) : 1.f,
                                           has_b, has_b ? to_float(p.bias[c]) : 0.f);
}

// The gradient reaching the norm's output: grad_out, or through the SiLU of the forward's rounded
// output y (recomputed as the forward computes it), rounded to T as eager's silu_backward is.
template <typename T>
TK_DEVICE float norm_output_grad(const GroupNormBackwardParams<T>& p, float grad, float h, float mean, float rstd,
                                 const group_norm_detail::ChannelCoeffs& coeffs) {
  if (!p.silu) return grad;
  const float y = round_through<T>(group_norm_detail::group_norm_element(
      backward_math(p), h, mean, rstd, coeffs, p.weight != nullptr, p.bias != nullptr));
  const float sig = 1.f / (1.f + expf(-y));
  return round_through<T>(grad * (sig * (1.f + y * (1.f - sig))));
}

enum class TilePass { kMoments, kGradSums, kGradX };

// (1), (3) and (5): one block per tile (n, channel tile, split). Thread (row r, lane l) takes channel
// c0 + l at positions split start + r, + rows, ... (kBackwardUnroll of them in flight); for the sums,
// the rows' sums of each channel are then added in a fixed tree over the rows (shared memory) and
// written as the tile's partial sums; kGradX writes dx at each position instead.
template <typename T, TilePass kPass>
TK_DEVICE void tile_body(const GroupNormBackwardParams<T>& p) {
  const GroupNormBackwardPlan& plan = p.plan;
  const int64_t tile = blockIdx.x;
  const int split = static_cast<int>(tile % plan.splits);
  const int64_t nc = tile / plan.splits;
  const int64_t n = nc / plan.channel_tiles;
  const int channel_tile = static_cast<int>(nc - n * plan.channel_tiles);
  const int lane = static_cast<int>(threadIdx.x) % plan.lanes, row = static_cast<int>(threadIdx.x) / plan.lanes;
  const int c = channel_tile * plan.lanes + lane;
  const int64_t begin = split * plan.split_len;
  const int64_t end = std::min<int64_t>(p.spatial, begin + plan.split_len);
  float sums[kChannelSums] = {0.f, 0.f, 0.f};
  if (c < p.channels) {
    if constexpr (kPass == TilePass::kMoments) {
      // Shifted by the channel's first value, so that the sum of squares does not cancel.
      const float shift = input_value(p, n, c, element_offset(p, c, 0));
#pragma unroll P::kBackwardUnroll
      for (int64_t s = begin + row; s < end; s += plan.rows) {
        const float d = input_value(p, n, c, element_offset(p, c, s)) - shift;
        sums[0] += d;
        sums[1] += d * d;
      }
    } else if constexpr (kPass == TilePass::kGradX) {
      const float* terms = group_terms(p, n * p.groups + c / (p.channels / p.groups));
      const float mean = terms[0], rstd = terms[1], c2 = terms[2], c3 = terms[3];
      const group_norm_detail::ChannelCoeffs coeffs = coeffs_of(p, c, mean, rstd);
      const float a = rstd * (p.weight != nullptr ? to_float(p.weight[c]) : 1.f);
      const T* grad = p.grad_out + n * p.grad_out_batch_stride;
      T* grad_x = p.grad_x + n * p.grad_x_batch_stride;
#pragma unroll P::kBackwardUnroll
      for (int64_t s = begin + row; s < end; s += plan.rows) {
        const int64_t offset = element_offset(p, c, s);
        const float h = input_value(p, n, c, offset);
        const float dy = norm_output_grad(p, to_float(grad[offset]), h, mean, rstd, coeffs);
        grad_x[offset] = from_float<T>(a * dy + c2 * h + c3);
      }
    } else {
      const float* terms = group_terms(p, n * p.groups + c / (p.channels / p.groups));
      const float mean = terms[0], rstd = terms[1];
      const group_norm_detail::ChannelCoeffs coeffs = coeffs_of(p, c, mean, rstd);
      const T* grad = p.grad_out + n * p.grad_out_batch_stride;
#pragma unroll P::kBackwardUnroll
      for (int64_t s = begin + row; s < end; s += plan.rows) {
        const int64_t offset = element_offset(p, c, s);
        const float h = input_value(p, n, c, offset);
        const float dy = norm_output_grad(p, to_float(grad[offset]), h, mean, rstd, coeffs);
        sums[0] += dy * h;
        sums[1] += dy;
        sums[2] += h;
      }
    }
  }
  if constexpr (kPass != TilePass::kGradX) {
    __shared__ float partial[P::kBackwardBlockThreads][kChannelSums];
#pragma unroll
    for (int k = 0; k < kChannelSums; ++k) partial[threadIdx.x][k] = sums[k];
    __syncthreads();
    for (int stride = plan.rows / 2; stride > 0; stride /= 2) {
      if (row < stride) {
#pragma unroll
        for (int k = 0; k < kChannelSums; ++k) partial[threadIdx.x][k] += partial[threadIdx.x + stride * plan.lanes][k];
      }
      __syncthreads();
    }
    if (row == 0 && c < p.channels) {
      float* out = tile_sums(p, n, split, c);
#pragma unroll
      for (int k = 0; k < kChannelSums; ++k) out[k] = partial[threadIdx.x][k];
    }
  }
}

template <typename T>
TK_DEVICE void moments_body(const GroupNormBackwardParams<T>& p) {
  tile_body<T, TilePass::kMoments>(p);
}

template <typename T>
TK_DEVICE void grad_sums_body(const GroupNormBackwardParams<T>& p) {
  tile_body<T, TilePass::kGradSums>(p);
}

template <typename T>
TK_DEVICE void grad_x_body(const GroupNormBackwardParams<T>& p) {
  tile_body<T, TilePass::kGradX>(p);
}

// (2) One thread per (n, g): the channels' moments (their tiles' shifted sums added in order) merged
// in channel order by Chan's update, then mean and rstd as the forward rounds them.
template <typename T>
TK_DEVICE void group_stats_body(const GroupNormBackwardParams<T>& p) {
  const int64_t ng = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ng >= p.batch * p.groups) return;
  const int64_t n = ng / p.groups;
  const int g = static_cast<int>(ng - n * p.groups);
  const int d = p.channels / p.groups;
  const float count = static_cast<float>(p.spatial);
  group_norm_detail::Moments m{0.f, 0.f, 0.f};
  for (int c = g * d; c < (g + 1) * d; ++c) {
    float shifted = 0.f, squares = 0.f;
    for (int split = 0; split < p.plan.splits; ++split) {
      const float* t = tile_sums(p, n, split, c);
      shifted += t[0];
      squares += t[1];
    }
    const float shift = input_value(p, n, c, element_offset(p, c, 0));
    const float mean_offset = shifted / count;
    m = group_norm_detail::merge(m, {count, shift + mean_offset, fmaxf(squares - shifted * mean_offset, 0.f)});
  }
  float mean = m.mean;
  float rstd = group_norm_detail::rstd_of(m, p.eps);
  if constexpr (!std::is_same_v<T, float>) {
    if (p.stats_in_x_dtype) mean = round_through<T>(mean), rstd = round_through<T>(rstd);
  }
  float* terms = group_terms(p, ng);
  terms[0] = mean, terms[1] = rstd;
}

// (4) One thread per (n, g): each channel's (ds, db, sh) from its tiles, in order; the group's c2, c3.
template <typename T>
TK_DEVICE void group_coeffs_body(const GroupNormBackwardParams<T>& p) {
  const int64_t ng = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ng >= p.batch * p.groups) return;
  const int64_t n = ng / p.groups;
  const int g = static_cast<int>(ng - n * p.groups);
  const int d = p.channels / p.groups;
  float ds_group = 0.f, db_group = 0.f;
  for (int c = g * d; c < (g + 1) * d; ++c) {
    float sums[kChannelSums] = {0.f, 0.f, 0.f};
    for (int split = 0; split < p.plan.splits; ++split) {
      const float* t = tile_sums(p, n, split, c);
#pragma unroll
      for (int k = 0; k < kChannelSums; ++k) sums[k] += t[k];
    }
    float* out = channel_sums(p, n, c);
#pragma unroll
    for (int k = 0; k < kChannelSums; ++k) out[k] = sums[k];
    const float w = p.weight != nullptr ? to_float(p.weight[c]) : 1.f;
    ds_group += sums[0] * w;
    db_group += sums[1] * w;
  }
  float* terms = group_terms(p, ng);
  const float mean = terms[0], rstd = terms[1];
  const float inv_count = 1.f / static_cast<float>(static_cast<int64_t>(d) * p.spatial);
  const float c2 = (db_group * mean - ds_group) * rstd * rstd * rstd * inv_count;
  terms[2] = c2;
  terms[3] = -c2 * mean - db_group * rstd * inv_count;
}

// (6) One thread per channel: the weight's, bias's and bias_nc's gradients, summed over n in order.
template <typename T>
TK_DEVICE void param_grads_body(const GroupNormBackwardParams<T>& p) {
  const int c = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.channels) return;
  const int d = p.channels / p.groups;
  const float w = p.weight != nullptr ? to_float(p.weight[c]) : 1.f;
  float dw = 0.f, db = 0.f, dbias_nc = 0.f;
  for (int64_t n = 0; n < p.batch; ++n) {
    const float* sums = channel_sums(p, n, c);
    const float* terms = group_terms(p, n * p.groups + c / d);
    const float mean = terms[0], rstd = terms[1];
    dw += (sums[0] - sums[1] * mean) * rstd;
    db += sums[1];
    const float dbias_n = rstd * w * sums[1] + terms[2] * sums[2] + terms[3] * static_cast<float>(p.spatial);
    if (p.grad_bias_nc != nullptr && p.grad_bias_nc_rows > 1) {
      p.grad_bias_nc[n * p.channels + c] = from_float<T>(dbias_n);
    } else {
      dbias_nc += dbias_n;
    }
  }
  if (p.grad_weight != nullptr) p.grad_weight[c] = from_float<T>(dw);
  if (p.grad_bias != nullptr) p.grad_bias[c] = from_float<T>(db);
  if (p.grad_bias_nc != nullptr && p.grad_bias_nc_rows == 1) p.grad_bias_nc[c] = from_float<T>(dbias_nc);
}

}  // namespace group_norm_backward_detail

// Queues the six kernels on `stream` (p.plan from group_norm_backward_plan; the workspace holds
// group_norm_backward_workspace_floats floats). Returns the launch error; nothing is synchronized.
template <typename T>
cudaError_t GroupNormBackward(const GroupNormBackwardParams<T>& p, cudaStream_t stream) {
  using namespace group_norm_backward_detail;
  if (p.batch == 0 || p.channels == 0 || p.spatial == 0) return cudaSuccess;
  const int threads = P::kBackwardBlockThreads;
  const auto blocks = [&](int64_t items) { return dim3(static_cast<unsigned>(ceil_div(items, threads))); };
  const dim3 tiles(static_cast<unsigned>(p.batch * p.plan.channel_tiles * p.plan.splits));
  const int64_t group_items = p.batch * p.groups;
  launch_kernel(kernel_entry<GroupNormBackwardParams<T>, moments_body<T>>, tiles, threads, 0, stream, p);
  launch_kernel(kernel_entry<GroupNormBackwardParams<T>, group_stats_body<T>>, blocks(group_items), threads, 0, stream,
                p);
  launch_kernel(kernel_entry<GroupNormBackwardParams<T>, grad_sums_body<T>>, tiles, threads, 0, stream, p);
  launch_kernel(kernel_entry<GroupNormBackwardParams<T>, group_coeffs_body<T>>, blocks(group_items), threads, 0, stream,
                p);
  if (p.grad_x != nullptr) {
    launch_kernel(kernel_entry<GroupNormBackwardParams<T>, grad_x_body<T>>, tiles, threads, 0, stream, p);
  }
  if (p.grad_weight != nullptr || p.grad_bias != nullptr || p.grad_bias_nc != nullptr) {
    launch_kernel(kernel_entry<GroupNormBackwardParams<T>, param_grads_body<T>>, blocks(p.channels), threads, 0, stream,
                  p);
  }
  return cudaGetLastError();
}

}  // namespace transformer_kernels
