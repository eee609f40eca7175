// Elementwise activations and gated linear units over rows. Torch-free: functors, one kernel,
// its launch heuristics and a host launcher.
//
//   kAct:       out = act(a)
//   kActMul:    out = round(round(act(a)) * b)     (a = gate, b = up; the eager code rounds twice)
//   kGatedAdd:  out = round(a + round(c * b))      (a = x, b = y, c = gate broadcast)
//
// Each formula follows ATen's CUDA code op for op, so results match F.silu / F.gelu bit for bit:
// activations in fp32, products and sums of two T values in packed T arithmetic (vec.cuh's
// mul_rn / add_rn, which round as the fp32 op followed by the cast to T does).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/kernel.cuh"
#include "common/math.cuh"
#include "common/rows.cuh"
#include "common/schedule.cuh"
#include "activation/activation_policy.cuh"
#include "common/vec.cuh"

namespace transformer_kernels {

enum class Activation { kSilu, kGelu, kGeluTanh };
enum class Elementwise { kAct, kActMul, kGatedAdd };

// silu(x) = x / (1 + exp(-x))
template <Activation kAct>
TK_DEVICE float activate(float x) {
  if constexpr (kAct == Activation::kSilu) {
    return x / (1.f + expf(-x));
  } else if constexpr (kAct == Activation::kGelu) {
    // gelu(x) = x * 0.5 * (1 + erf(x / sqrt(2)))
    constexpr float kAlpha = 0.70710678118654752440f;  // M_SQRT1_2
    return x * 0.5f * (1.f + erff(x * kAlpha));
  } else {
    // gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
    constexpr float kBeta = 0.79788456080286535588f;  // M_SQRT2 * M_2_SQRTPI * 0.5
    constexpr float kKappa = 0.044715f;
    const float x_cube = x * x * x;
    const float inner = kBeta * (x + kKappa * x_cube);
    return 0.5f * x * (1.f + tanhf(inner));
  }
}

template <typename T>
struct ElementwiseParams {
  const T* a;  // [rows..., cols]: the activated operand, or x for kGatedAdd
  RowIndexer a_rows;
  const T* b = nullptr;  // [rows..., cols]: up (kActMul) or y (kGatedAdd)
  RowIndexer b_rows;
  const T* c = nullptr;  // [rows..., cols], broadcast rows allowed: gate (kGatedAdd)
  RowIndexer c_rows;
  T* out;  // [rows..., cols]
  RowIndexer out_rows;
  int64_t num_rows;
  int64_t cols;
  int log2_threads_per_row;  // a row is handled by 2^k consecutive threads of a block
};

namespace elementwise_detail {

// Vectors each thread loads per step (Policy): the activations alone have their own count.
template <typename Policy, Elementwise kOp>
constexpr int vecs_per_thread() {
  return kOp == Elementwise::kAct ? Policy::kActVecsPerThread : Policy::kGatedVecsPerThread;
}

// One vector of results, rounded as the eager code rounds (module comment): the products and the
// sum of two T values in packed T arithmetic (mul_rn, add_rn: the same bits), the activation in fp32.
template <typename T, Elementwise kOp, Activation kAct, int N>
TK_DEVICE vec_t<T, N> apply(const vec_t<T, N>& a, const vec_t<T, N>& b, const vec_t<T, N>& c) {
  if constexpr (kOp == Elementwise::kGatedAdd) {
    return add_rn(a, mul_rn(c, b));
  } else {
    float y[N];
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = activate<kAct>(to_float(a[i]));
    vec_t<T, N> act;
    act.cast_from(y);
    if constexpr (kOp == Elementwise::kAct) return act;
    else return mul_rn(act, b);
  }
}

// The gated units (kActMul) run under Policy::kActMulRegisterCap; the others keep ptxas's choice.
template <typename Policy, Elementwise kOp>
constexpr int elementwise_register_cap() {
  return kOp == Elementwise::kActMul ? Policy::kActMulRegisterCap : kNoRegisterCap;
}

template <typename Policy, typename T, Elementwise kOp, Activation kAct, int kVec>
TK_DEVICE void elementwise_body(const ElementwiseParams<T>& p) {
  using vec = vec_t<T, kVec>;
  const PowerOfTwoRows slot(p.log2_threads_per_row);
  const int threads = slot.threads, lane = slot.lane;
  const int64_t row = slot.row;
  if (row >= p.num_rows) return;
  // The binding rejects outputs that overlap inputs, so loads of later vectors may be issued
  // before earlier stores.
  const T* __restrict__ a = p.a + p.a_rows.offset(row);
  const T* __restrict__ b = kOp != Elementwise::kAct ? p.b + p.b_rows.offset(row) : nullptr;
  const T* __restrict__ c = kOp == Elementwise::kGatedAdd ? p.c + p.c_rows.offset(row) : nullptr;
  T* __restrict__ out = p.out + p.out_rows.offset(row);
  // Column indices are 32-bit (the binding caps rows below 2^31 elements): cheaper addresses.
  const int cols = static_cast<int>(p.cols);
  const int num_vecs = cols / kVec;
  constexpr int kVecsPerThread = vecs_per_thread<Policy, kOp>();

  // kVecsPerThread vectors per thread per step, all loads issued before any math or store, so
  // that each thread keeps that many 16-byte loads of every operand in flight.
  for (int base = lane; base < num_vecs; base += threads * kVecsPerThread) {
    vec av[kVecsPerThread], bv[kVecsPerThread], cv[kVecsPerThread];
#pragma unroll
    for (int u = 0; u < kVecsPerThread; ++u) {
      const int v = base + u * threads;
      if (v < num_vecs) {
        av[u].load(a + v * kVec);
        if constexpr (kOp != Elementwise::kAct) bv[u].load(b + v * kVec);
        if constexpr (kOp == Elementwise::kGatedAdd) cv[u].load(c + v * kVec);
      }
    }
#pragma unroll
    for (int u = 0; u < kVecsPerThread; ++u) {
      const int v = base + u * threads;
      if (v < num_vecs) apply<T, kOp, kAct>(av[u], bv[u], cv[u]).store(out + v * kVec);
    }
  }
  for (int col = num_vecs * kVec + lane; col < cols; col += threads) {
    vec_t<T, 1> a1, b1, c1;
    a1[0] = a[col];
    if constexpr (kOp != Elementwise::kAct) b1[0] = b[col];
    if constexpr (kOp == Elementwise::kGatedAdd) c1[0] = c[col];
    out[col] = apply<T, kOp, kAct>(a1, b1, c1)[0];
  }
}

template <typename Policy, typename T, Elementwise kOp, Activation kAct, int kVec>
cudaError_t launch(ElementwiseParams<T> p, cudaStream_t stream) {
  // Threads per row: a power of two covering the row at vecs_per_thread vectors each, at most a
  // block; short rows share a block (rows of one element get one thread each).
  constexpr int kVecsPerThread = vecs_per_thread<Policy, kOp>();
  const int64_t num_vecs = std::max<int64_t>(1, ceil_div(p.cols, kVec));
  p.log2_threads_per_row = log2_threads_per_row(ceil_div(num_vecs, kVecsPerThread), Policy::kBlockThreads);
  const dim3 grid = grid_for(p.num_rows, Policy::kBlockThreads >> p.log2_threads_per_row);
  kernel_entry_for<elementwise_register_cap<Policy, kOp>(), ElementwiseParams<T>,
                   elementwise_body<Policy, T, kOp, kAct, kVec>>()
      <<<grid, Policy::kBlockThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace elementwise_detail

// Host launcher: 16-byte vectors when every pointer and row stride allows it, scalar otherwise.
template <Elementwise kOp, Activation kAct, typename Policy = ElementwisePolicy, typename T>
cudaError_t elementwise(const ElementwiseParams<T>& p, cudaStream_t stream) {
  if (p.num_rows == 0 || p.cols == 0) return cudaSuccess;
  constexpr int kVec = vec_size<T>();
  auto aligned = [&](const void* ptr, const RowIndexer& rows) {
    return ptr == nullptr || (is_vec_aligned<T, kVec>(ptr) && rows.rows_aligned_to(kVec));
  };
  const bool vectorizable =
      aligned(p.a, p.a_rows) && aligned(p.b, p.b_rows) && aligned(p.c, p.c_rows) && aligned(p.out, p.out_rows);
  return vectorizable ? elementwise_detail::launch<Policy, T, kOp, kAct, kVec>(p, stream)
                      : elementwise_detail::launch<Policy, T, kOp, kAct, 1>(p, stream);
}

}  // namespace transformer_kernels
