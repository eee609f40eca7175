// Backward of the activations and gated units (activation.cuh). Torch-free: the derivatives, one
// kernel, its launch heuristic and a host launcher. g is the gradient of the forward's output.
//
//   kAct:     dx = act'(x) * g                                   (out = act(x))
//   kActMul:  dgated = round(g * round(act(gate)))               (out = round(round(act(gate)) * gated))
//             dgate  = act'(gate) * round(g * gated)
//
// The activation is recomputed from the saved input (cheaper than reading a saved copy). Rounding
// follows eager autograd of the forward's code op for op: the product's backward in packed T
// arithmetic (vec.cuh's mul_rn), the activation's backward in fp32 with ATen's formulas
// (silu_backward, gelu_backward in ActivationSiluKernel.cu / ActivationGeluKernel.cu), rounded once.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/elementwise.cuh"
#include "activation/activation_policy.cuh"
#include "common/kernel.cuh"
#include "common/math.cuh"
#include "common/rows.cuh"
#include "common/schedule.cuh"
#include "common/vec.cuh"

namespace transformer_kernels {

// dy * act'(x), as ATen computes it in fp32.
template <Activation kAct>
TK_DEVICE float activate_backward(float dy, float x) {
  if constexpr (kAct == Activation::kSilu) {
    // silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
    const float s = 1.f / (1.f + expf(-x));
    return dy * s * (1.f + x * (1.f - s));
  } else if constexpr (kAct == Activation::kGelu) {
    // gelu'(x) = Phi(x) + x phi(x)
    constexpr float kBeta = 0.39894228040143267794f;   // M_2_SQRTPI * M_SQRT1_2 * 0.5 = 1 / sqrt(2 pi)
    constexpr float kAlpha = 0.70710678118654752440f;  // M_SQRT1_2
    const float cdf = 0.5f * (1.f + erff(x * kAlpha));
    const float pdf = expf(-0.5f * x * x) * kBeta;
    return dy * (cdf + x * pdf);
  } else {
    // d/dx of 0.5 x (1 + tanh(inner)), inner = beta (x + kappa x^3)
    constexpr float kBeta = 0.79788456080286535588f;  // M_SQRT2 * M_2_SQRTPI * 0.5
    constexpr float kKappa = 0.044715f;
    const float x_sq = x * x;
    const float x_cube = x_sq * x;
    const float inner = kBeta * (x + kKappa * x_cube);
    const float tanh_inner = tanhf(inner);
    const float left = 0.5f * x;
    const float right = 1.f + tanh_inner;
    const float left_derivative = 0.5f * right;
    const float tanh_derivative = 1.f - tanh_inner * tanh_inner;
    const float inner_derivative = kBeta * (1.f + 3.f * kKappa * x_sq);
    const float right_derivative = left * tanh_derivative * inner_derivative;
    return dy * (left_derivative + right_derivative);
  }
}

// The operands as ElementwiseParams names them: the activated input is x (kAct) or gate (kActMul),
// gated what the gate multiplies; absent ones null.
template <typename T>
struct ActivationBackwardParams {
  const T* grad;  // [rows..., cols]: the gradient of the forward's output
  RowIndexer grad_rows;
  const T* x = nullptr;  // [rows..., cols]: kAct's input
  RowIndexer x_rows;
  const T* gate = nullptr;  // [rows..., cols]: kActMul's activated input
  RowIndexer gate_rows;
  const T* gated = nullptr;  // [rows..., cols]: what the gate multiplies (kActMul)
  RowIndexer gated_rows;
  T* grad_x = nullptr;  // [rows..., cols] (kAct)
  RowIndexer grad_x_rows;
  T* grad_gate = nullptr;  // [rows..., cols] (kActMul)
  RowIndexer grad_gate_rows;
  T* grad_gated = nullptr;  // [rows..., cols] (kActMul)
  RowIndexer grad_gated_rows;
  int64_t num_rows;
  int64_t cols;
  int log2_threads_per_row;  // a row is handled by 2^k consecutive threads of a block
};

namespace activation_backward_detail {

constexpr int kThreadsPerBlock = ActivationBackwardPolicy::kBlockThreads;

// Vectors of each operand a thread loads per step (ActivationBackwardPolicy).
template <Elementwise kOp>
constexpr int vecs_per_thread() {
  return kOp == Elementwise::kAct ? ActivationBackwardPolicy::kActVecsPerThread
                                  : ActivationBackwardPolicy::kGatedVecsPerThread;
}

// One vector of gradients, rounded as eager autograd rounds (module comment).
// `in` is the activated input (x or gate), `gated` what it multiplies (kActMul); d_in and d_gated
// their gradients.
template <typename T, Elementwise kOp, Activation kAct, int N>
TK_DEVICE void apply(const vec_t<T, N>& g, const vec_t<T, N>& in, const vec_t<T, N>& gated, vec_t<T, N>& d_in,
                     vec_t<T, N>& d_gated) {
  float y[N];
  if constexpr (kOp == Elementwise::kAct) {
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = activate_backward<kAct>(to_float(g[i]), to_float(in[i]));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = activate<kAct>(to_float(in[i]));
    vec_t<T, N> act;  // the forward's rounded act(gate)
    act.cast_from(y);
    d_gated = mul_rn(g, act);
    const vec_t<T, N> g_gated = mul_rn(g, gated);  // the gradient reaching act(gate)
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = activate_backward<kAct>(to_float(g_gated[i]), to_float(in[i]));
  }
  d_in.cast_from(y);
}

template <typename T, Elementwise kOp, Activation kAct, int kVec>
TK_DEVICE void body(const ActivationBackwardParams<T>& p) {
  using vec = vec_t<T, kVec>;
  constexpr bool kGated = kOp == Elementwise::kActMul;
  const PowerOfTwoRows slot(p.log2_threads_per_row);
  const int threads = slot.threads, lane = slot.lane;
  const int64_t row = slot.row;
  if (row >= p.num_rows) return;
  // The binding rejects outputs that overlap inputs, so later loads may pass earlier stores.
  const T* __restrict__ g = p.grad + p.grad_rows.offset(row);
  const T* __restrict__ a = kGated ? p.gate + p.gate_rows.offset(row) : p.x + p.x_rows.offset(row);
  const T* __restrict__ b = kGated ? p.gated + p.gated_rows.offset(row) : nullptr;
  T* __restrict__ da = kGated ? p.grad_gate + p.grad_gate_rows.offset(row) : p.grad_x + p.grad_x_rows.offset(row);
  T* __restrict__ db = kGated ? p.grad_gated + p.grad_gated_rows.offset(row) : nullptr;
  // Column indices are 32-bit (the binding caps rows below 2^31 elements); row offsets 64-bit.
  const int cols = static_cast<int>(p.cols);
  const int num_vecs = cols / kVec;
  constexpr int kVecsPerThread = vecs_per_thread<kOp>();

  for (int base = lane; base < num_vecs; base += threads * kVecsPerThread) {
    vec gv[kVecsPerThread], av[kVecsPerThread], bv[kVecsPerThread];
#pragma unroll
    for (int u = 0; u < kVecsPerThread; ++u) {
      const int v = base + u * threads;
      if (v < num_vecs) {
        gv[u].load(g + v * kVec);
        av[u].load(a + v * kVec);
        if constexpr (kGated) bv[u].load(b + v * kVec);
      }
    }
#pragma unroll
    for (int u = 0; u < kVecsPerThread; ++u) {
      const int v = base + u * threads;
      if (v < num_vecs) {
        vec dav, dbv;
        apply<T, kOp, kAct>(gv[u], av[u], bv[u], dav, dbv);
        dav.store(da + v * kVec);
        if constexpr (kGated) dbv.store(db + v * kVec);
      }
    }
  }
  for (int col = num_vecs * kVec + lane; col < cols; col += threads) {
    vec_t<T, 1> g1, a1, b1, da1, db1;
    g1[0] = g[col];
    a1[0] = a[col];
    if constexpr (kGated) b1[0] = b[col];
    apply<T, kOp, kAct>(g1, a1, b1, da1, db1);
    da[col] = da1[0];
    if constexpr (kGated) db[col] = db1[0];
  }
}

// The launch heuristic (schedule.cuh): threads per row a power of two covering the row at
// vecs_per_thread vectors each, at most a block; short rows share a block.
template <typename T, Elementwise kOp, Activation kAct, int kVec>
cudaError_t LaunchActivationBackward(ActivationBackwardParams<T> p, cudaStream_t stream) {
  const int64_t num_vecs = std::max<int64_t>(1, ceil_div(p.cols, kVec));
  p.log2_threads_per_row = log2_threads_per_row(ceil_div(num_vecs, vecs_per_thread<kOp>()), kThreadsPerBlock);
  const dim3 grid = grid_for(p.num_rows, kThreadsPerBlock >> p.log2_threads_per_row);
  launch_kernel(kernel_entry<ActivationBackwardParams<T>, body<T, kOp, kAct, kVec>>,
                grid, kThreadsPerBlock, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace activation_backward_detail

// Host launcher: 16-byte vectors when every pointer and row stride allows it, scalar otherwise.
template <Elementwise kOp, Activation kAct, typename T>
cudaError_t ActivationBackward(const ActivationBackwardParams<T>& p, cudaStream_t stream) {
  static_assert(kOp != Elementwise::kGatedAdd, "gated_add's backward belongs to the norm family's files");
  if (p.num_rows == 0 || p.cols == 0) return cudaSuccess;
  constexpr int kVec = vec_size<T>();
  auto aligned = [&](const void* ptr, const RowIndexer& rows) {
    return ptr == nullptr || (is_vec_aligned<T, kVec>(ptr) && rows.rows_aligned_to(kVec));
  };
  const bool vectorizable = aligned(p.grad, p.grad_rows) && aligned(p.x, p.x_rows) && aligned(p.gate, p.gate_rows) &&
                            aligned(p.gated, p.gated_rows) && aligned(p.grad_x, p.grad_x_rows) &&
                            aligned(p.grad_gate, p.grad_gate_rows) && aligned(p.grad_gated, p.grad_gated_rows);
  return vectorizable ? activation_backward_detail::LaunchActivationBackward<T, kOp, kAct, kVec>(p, stream)
                      : activation_backward_detail::LaunchActivationBackward<T, kOp, kAct, 1>(p, stream);
}

}  // namespace transformer_kernels
