// The linear layer of decode steps: out [rows, N] = x [rows, K] @ (weight [N, K] * weight_scale)^T +
// bias for a few rows (rows <= kDecodeMaxRows: the tokens of a batch-1..8 decode step), where the
// weight's bytes are the whole cost and a GEMM tiled for large M reads them below the memory's rate.
// Each warp takes DecodeLinearPolicy::kChannelsPerWarp output channels for every row: its lanes
// stream 16 bytes of each channel's weight row per step (kStepsInFlight steps loaded before they are
// multiplied), read the step's x values (every warp of the grid reads the same x: L1/L2-resident),
// and accumulate in fp32; a butterfly reduction per (row, channel) ends it, then the per-channel
// scale (e4m3 weights: weight-only FP8, one float32 scale per output channel), the bias, and one
// rounding to x's dtype. Weights in x's dtype, or e4m3 codes. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/fp8.cuh"
#include "common/kernel.cuh"
#include "common/reduce.cuh"
#include "common/schedule.cuh"
#include "common/vec.cuh"
#include "gemm/decode_linear_policy.cuh"

namespace transformer_kernels {

// The most rows (tokens) one call takes: the accumulators of every row stay in registers.
constexpr int kDecodeMaxRows = 8;

// T: x's, the bias's and the output's dtype; W: the weight's (T, or uint8_t e4m3 codes).
template <typename T, typename W>
struct DecodeLinearParams {
  const T* x;  // [rows, K], rows x_row_stride elements apart
  int64_t x_row_stride;
  const W* weight;                      // [N, K] contiguous
  const float* weight_scale = nullptr;  // [N] contiguous: the e4m3 weight's per-channel scales
  const T* bias = nullptr;              // [N] contiguous, or none
  T* out;                               // [rows, N] contiguous
  int rows;
  int64_t n;
  int64_t k;  // a multiple of decode_linear_k_multiple<T, W>()
};

// K must be a whole number of steps: one 16-byte load of the weight and the x values it multiplies,
// both 16-byte aligned.
template <typename T, typename W>
constexpr int decode_linear_k_multiple() {
  return vec_size<W>() > vec_size<T>() ? vec_size<W>() : vec_size<T>();
}

namespace decode_linear_detail {

template <typename W, int N>
TK_DEVICE void weight_values(const vec_t<W, N>& w, float (&f)[N]) {
  if constexpr (std::is_same_v<W, uint8_t>) {
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = fp8_value(w[i]);
  } else {
    w.cast_to(f);
  }
}

// kRows: the row count rounded up to a power of two (rows past p.rows are neither read nor written).
template <typename Policy, typename T, typename W, int kRows>
__device__ void decode_linear_body(const DecodeLinearParams<T, W>& p) {
  constexpr int kStep = vec_size<W>();  // weight elements per 16-byte load
  constexpr int kChannels = Policy::kChannelsPerWarp;
  constexpr int kInFlight = Policy::kStepsInFlight;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize) * kChannels;
  if (n0 >= p.n) return;  // whole warps leave together
  const int64_t steps = p.k / kStep;
  float acc[kRows * kChannels];
#pragma unroll
  for (int i = 0; i < kRows * kChannels; ++i) acc[i] = 0.f;
  // One step s of every channel of this warp, times the x values of every row.
  auto multiply = [&](const vec_t<W, kStep> (&w)[kChannels], int64_t s) {
    float wf[kChannels][kStep];
#pragma unroll
    for (int c = 0; c < kChannels; ++c) weight_values(w[c], wf[c]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r < p.rows) {
        vec_t<T, kStep> xv;
        xv.load(p.x + r * p.x_row_stride + s * kStep);
        float xf[kStep];
        xv.cast_to(xf);
#pragma unroll
        for (int c = 0; c < kChannels; ++c) {
#pragma unroll
          for (int i = 0; i < kStep; ++i) acc[r * kChannels + c] += xf[i] * wf[c][i];
        }
      }
    }
  };
  auto load = [&](vec_t<W, kStep>(&w)[kChannels], int64_t s) {
#pragma unroll
    for (int c = 0; c < kChannels; ++c) {
      if (n0 + c < p.n) w[c].load(p.weight + (n0 + c) * p.k + s * kStep);
      else w[c] = vec_t<W, kStep>{};  // a channel past N: zeros, never stored
    }
  };
  int64_t s = lane;
  for (; s + (kInFlight - 1) * kWarpSize < steps; s += kInFlight * kWarpSize) {
    vec_t<W, kStep> w[kInFlight][kChannels];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) load(w[j], s + j * kWarpSize);
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) multiply(w[j], s + j * kWarpSize);
  }
  for (; s < steps; s += kWarpSize) {
    vec_t<W, kStep> w[kChannels];
    load(w, s);
    multiply(w, s);
  }
  group_reduce<SumOp>(acc);
  // Lane i stores (row, channel) i: the epilogue spread over the warp.
#pragma unroll
  for (int i = 0; i < kRows * kChannels; ++i) {
    const int r = i / kChannels, c = i % kChannels;
    if (lane == i % kWarpSize && r < p.rows && n0 + c < p.n) {
      float y = acc[i];
      if (p.weight_scale != nullptr) y *= p.weight_scale[n0 + c];
      if (p.bias != nullptr) y += to_float(p.bias[n0 + c]);
      p.out[r * p.n + n0 + c] = from_float<T>(y);
    }
  }
}

}  // namespace decode_linear_detail

// Host launcher: cudaErrorInvalidValue for more than kDecodeMaxRows rows, a K that is not a whole
// number of steps, misaligned x rows or weight, or e4m3 weights without their scales. K = 0 writes
// each row's bias (zeros without one).
template <typename Policy = DecodeLinearPolicy, typename T, typename W>
cudaError_t DecodeLinear(const DecodeLinearParams<T, W>& p, cudaStream_t stream) {
  if (p.rows == 0 || p.n == 0) return cudaSuccess;
  constexpr int kMultiple = decode_linear_k_multiple<T, W>();
  const bool aligned = p.k == 0 ||  // nothing is read
                       (reinterpret_cast<uintptr_t>(p.x) % kVecBytes == 0 &&
                        reinterpret_cast<uintptr_t>(p.weight) % kVecBytes == 0 &&
                        (p.rows == 1 || p.x_row_stride % vec_size<T>() == 0));
  if (p.rows > kDecodeMaxRows || p.k % kMultiple != 0 || !aligned ||
      (std::is_same_v<W, uint8_t> && p.weight_scale == nullptr))
    return cudaErrorInvalidValue;
  const int64_t channels_per_block = (Policy::kBlockThreads / kWarpSize) * Policy::kChannelsPerWarp;
  const dim3 grid = grid_for(p.n, channels_per_block);
  auto launch = [&](auto rows_tag) {
    constexpr int kRows = decltype(rows_tag)::value;
    launch_kernel(kernel_entry<DecodeLinearParams<T, W>, decode_linear_detail::decode_linear_body<Policy, T, W, kRows>>,
                  grid, Policy::kBlockThreads, 0, stream, p);
  };
  if (p.rows == 1) launch(std::integral_constant<int, 1>{});
  else if (p.rows == 2) launch(std::integral_constant<int, 2>{});
  else if (p.rows <= 4) launch(std::integral_constant<int, 4>{});
  else launch(std::integral_constant<int, 8>{});
  return cudaGetLastError();
}

}  // namespace transformer_kernels
