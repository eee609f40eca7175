// Backward of the activations and gated units (activation.cuh). Torch-free: the derivatives, one
// kernel, its launch heuristic and a host launcher. g is the gradient of the forward's output.
//
//   kAct:     da = act'(a) * g                                   (out = act(a))
//   kActMul:  db = round(g * round(act(a)))                      (out = round(round(act(a)) * b))
//             da = act'(a) * round(g * b)
//
// The activation is recomputed from the saved input (cheaper than reading a saved copy). Rounding
// follows eager autograd of the forward's code op for op: the product's backward in packed T
// arithmetic (vec.cuh's mul_rn), the activation's backward in fp32 with ATen's formulas
// (silu_backward, gelu_backward in ActivationSiluKernel.cu / ActivationGeluKernel.cu), rounded once.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "activation/activation.cuh"
#include "common/kernel.cuh"
#include "common/math.cuh"
#include "common/rows.cuh"
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

template <typename T>
struct ActivationBackwardParams {
  const T* grad;  // [rows..., cols]: the gradient of the forward's output
  RowIndexer grad_rows;
  const T* a;  // [rows..., cols]: the activated input (the gate)
  RowIndexer a_rows;
  const T* b = nullptr;  // [rows..., cols]: the input it multiplies (kActMul)
  RowIndexer b_rows;
  T* grad_a;  // [rows..., cols]
  RowIndexer grad_a_rows;
  T* grad_b = nullptr;  // [rows..., cols] (kActMul)
  RowIndexer grad_b_rows;
  int64_t num_rows;
  int64_t cols;
  int log2_threads_per_row;  // a row is handled by 2^k consecutive threads of a block
};

namespace activation_backward_detail {

constexpr int kThreadsPerBlock = 256;

// 16-byte vectors of each operand a thread loads per step, all in flight together: the forwards
// keep 4 (4 or 8 loads a thread with their one or two inputs); the backward reads two operands
// (kAct: g, a) or three (kActMul: g, a, b), so 4 or 2 keep 8 or 6 loads in flight at 16 of a
// vector's registers each. Not yet measured (a lab knob to tune on the GPU).
template <Elementwise kOp>
constexpr int vecs_per_thread() {
  return kOp == Elementwise::kAct ? 4 : 2;
}

// One vector of gradients, rounded as eager autograd rounds (module comment).
template <typename T, Elementwise kOp, Activation kAct, int N>
TK_DEVICE void apply(const vec_t<T, N>& g, const vec_t<T, N>& a, const vec_t<T, N>& b, vec_t<T, N>& da,
                     vec_t<T, N>& db) {
  float y[N];
  if constexpr (kOp == Elementwise::kAct) {
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = activate_backward<kAct>(to_float(g[i]), to_float(a[i]));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = activate<kAct>(to_float(a[i]));
    vec_t<T, N> act;  // the forward's rounded act(a)
    act.cast_from(y);
    db = mul_rn(g, act);
    const vec_t<T, N> g_b = mul_rn(g, b);  // the gradient reaching act(a)
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = activate_backward<kAct>(to_float(g_b[i]), to_float(a[i]));
  }
  da.cast_from(y);
}

template <typename T, Elementwise kOp, Activation kAct, int kVec>
TK_DEVICE void body(const ActivationBackwardParams<T>& p) {
  using vec = vec_t<T, kVec>;
  constexpr bool kGated = kOp == Elementwise::kActMul;
  const int threads = 1 << p.log2_threads_per_row;
  const int lane = threadIdx.x & (threads - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> p.log2_threads_per_row) +
                      (threadIdx.x >> p.log2_threads_per_row);
  if (row >= p.num_rows) return;
  // The binding rejects outputs that overlap inputs, so later loads may pass earlier stores.
  const T* __restrict__ g = p.grad + p.grad_rows.offset(row);
  const T* __restrict__ a = p.a + p.a_rows.offset(row);
  const T* __restrict__ b = kGated ? p.b + p.b_rows.offset(row) : nullptr;
  T* __restrict__ da = p.grad_a + p.grad_a_rows.offset(row);
  T* __restrict__ db = kGated ? p.grad_b + p.grad_b_rows.offset(row) : nullptr;
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

// The launch heuristic: threads per row a power of two covering the row at vecs_per_thread
// vectors each, at most a block; short rows share a block. Returns the grid.
inline dim3 plan(int64_t num_rows, int64_t cols, int vec, int vecs_per_thread, int* log2_threads_per_row) {
  const int64_t num_vecs = std::max<int64_t>(1, (cols + vec - 1) / vec);
  const int64_t wanted = (num_vecs + vecs_per_thread - 1) / vecs_per_thread;
  int log2 = 0;
  while ((int64_t{1} << log2) < wanted && (1 << log2) < kThreadsPerBlock) ++log2;
  *log2_threads_per_row = log2;
  const int64_t rows_per_block = kThreadsPerBlock >> log2;
  return dim3(static_cast<unsigned>((num_rows + rows_per_block - 1) / rows_per_block));
}

template <typename T, Elementwise kOp, Activation kAct, int kVec>
cudaError_t launch(ActivationBackwardParams<T> p, cudaStream_t stream) {
  const dim3 grid = plan(p.num_rows, p.cols, kVec, vecs_per_thread<kOp>(), &p.log2_threads_per_row);
  kernel_entry<ActivationBackwardParams<T>, body<T, kOp, kAct, kVec>><<<grid, kThreadsPerBlock, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace activation_backward_detail

// Host launcher: 16-byte vectors when every pointer and row stride allows it, scalar otherwise.
template <Elementwise kOp, Activation kAct, typename T>
cudaError_t activation_backward(const ActivationBackwardParams<T>& p, cudaStream_t stream) {
  static_assert(kOp != Elementwise::kGatedAdd, "gated_add's backward belongs to the norm family's files");
  if (p.num_rows == 0 || p.cols == 0) return cudaSuccess;
  constexpr int kVec = vec_size<T>();
  auto aligned = [&](const void* ptr, const RowIndexer& rows) {
    return ptr == nullptr || (is_vec_aligned<T, kVec>(ptr) && rows.rows_aligned_to(kVec));
  };
  const bool vectorizable = aligned(p.grad, p.grad_rows) && aligned(p.a, p.a_rows) && aligned(p.b, p.b_rows) &&
                            aligned(p.grad_a, p.grad_a_rows) && aligned(p.grad_b, p.grad_b_rows);
  return vectorizable ? activation_backward_detail::launch<T, kOp, kAct, kVec>(p, stream)
                      : activation_backward_detail::launch<T, kOp, kAct, 1>(p, stream);
}

}  // namespace transformer_kernels
