// The elementwise engine: activations and gated linear units over rows, and the gated add. One
// kernel, its launch heuristics and a host launcher, shared by the families whose ops are its forms
// (activation: act, act_mul; norm: gated_add; gemm: linear_gelu's separate GELU). Torch-free.
//
//   kAct:       out = act(x)
//   kActMul:    out = round(round(act(gate)) * gated)   (gated = up; the eager code rounds twice)
//   kGatedAdd:  out = round(x + round(gate * gated))    (gated = y; gate broadcast)
//
// `gate` is the operand that multiplies `gated` (activated first in kActMul); `x` is the operand
// the gate leaves alone. Each formula follows ATen's CUDA code op for op, so results match F.silu /
// F.gelu bit for bit: activations in fp32, products and sums of two T values in packed T arithmetic
// (vec.cuh's mul_rn / add_rn, which round as the fp32 op followed by the cast to T does).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/activation_math.cuh"
#include "common/elementwise_policy.cuh"
#include "common/kernel.cuh"
#include "common/math.cuh"
#include "common/rows.cuh"
#include "common/schedule.cuh"
#include "common/vec.cuh"

namespace transformer_kernels {

enum class Elementwise { kAct, kActMul, kGatedAdd };

template <typename T>
struct ElementwiseParams {
  const T* x = nullptr;  // [rows..., cols]: kAct, kGatedAdd
  RowIndexer x_rows;
  const T* gated = nullptr;  // [rows..., cols]: up (kActMul) or y (kGatedAdd)
  RowIndexer gated_rows;
  const T* gate = nullptr;  // [rows..., cols]: kActMul; kGatedAdd with broadcast rows allowed
  RowIndexer gate_rows;
  T* out;  // [rows..., cols]
  RowIndexer out_rows;
  int64_t num_rows;
  int64_t cols;
  int log2_threads_per_row;  // a row is handled by 2^k consecutive threads of a block
};

// The activation a form applies: kNone exactly for the form without one.
constexpr bool form_has_activation(Elementwise op) { return op != Elementwise::kGatedAdd; }

namespace elementwise_detail {

// Vectors each thread loads per step (Policy): the activations alone have their own count.
template <typename Policy, Elementwise kOp>
constexpr int vecs_per_thread() {
  return kOp == Elementwise::kAct ? Policy::kActVecsPerThread : Policy::kGatedVecsPerThread;
}

// One vector of results, rounded as the eager code rounds (module comment): the products and the
// sum of two T values in packed T arithmetic (mul_rn, add_rn: the same bits), the activation in fp32.
template <typename T, Elementwise kOp, Activation kAct, int N>
TK_DEVICE vec_t<T, N> apply(const vec_t<T, N>& x, const vec_t<T, N>& gated, const vec_t<T, N>& gate) {
  if constexpr (kOp == Elementwise::kGatedAdd) {
    return add_rn(x, mul_rn(gate, gated));
  } else {
    const vec_t<T, N>& in = kOp == Elementwise::kAct ? x : gate;  // what is activated
    float y[N];
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = activate<kAct>(to_float(in[i]));
    vec_t<T, N> act;
    act.cast_from(y);
    if constexpr (kOp == Elementwise::kAct) return act;
    else return mul_rn(act, gated);
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
  constexpr bool kX = kOp != Elementwise::kActMul, kGated = kOp != Elementwise::kAct;
  const T* __restrict__ x = kX ? p.x + p.x_rows.offset(row) : nullptr;
  const T* __restrict__ gated = kGated ? p.gated + p.gated_rows.offset(row) : nullptr;
  const T* __restrict__ gate = kGated ? p.gate + p.gate_rows.offset(row) : nullptr;
  T* __restrict__ out = p.out + p.out_rows.offset(row);
  // Column indices are 32-bit (the binding caps rows below 2^31 elements): cheaper addresses.
  const int cols = static_cast<int>(p.cols);
  const int num_vecs = cols / kVec;
  constexpr int kVecsPerThread = vecs_per_thread<Policy, kOp>();

  // kVecsPerThread vectors per thread per step, all loads issued before any math or store, so
  // that each thread keeps that many 16-byte loads of every operand in flight. Loads go in the
  // formula's order (kActMul: gate first).
  for (int base = lane; base < num_vecs; base += threads * kVecsPerThread) {
    vec xv[kVecsPerThread], gated_v[kVecsPerThread], gate_v[kVecsPerThread];
#pragma unroll
    for (int u = 0; u < kVecsPerThread; ++u) {
      const int v = base + u * threads;
      if (v < num_vecs) {
        if constexpr (kX) xv[u].load(x + v * kVec);
        if constexpr (kOp == Elementwise::kActMul) gate_v[u].load(gate + v * kVec);
        if constexpr (kGated) gated_v[u].load(gated + v * kVec);
        if constexpr (kOp == Elementwise::kGatedAdd) gate_v[u].load(gate + v * kVec);
      }
    }
#pragma unroll
    for (int u = 0; u < kVecsPerThread; ++u) {
      const int v = base + u * threads;
      if (v < num_vecs) apply<T, kOp, kAct>(xv[u], gated_v[u], gate_v[u]).store(out + v * kVec);
    }
  }
  for (int col = num_vecs * kVec + lane; col < cols; col += threads) {
    vec_t<T, 1> x1, gated1, gate1;
    if constexpr (kX) x1[0] = x[col];
    if constexpr (kOp == Elementwise::kActMul) gate1[0] = gate[col];
    if constexpr (kGated) gated1[0] = gated[col];
    if constexpr (kOp == Elementwise::kGatedAdd) gate1[0] = gate[col];
    out[col] = apply<T, kOp, kAct>(x1, gated1, gate1)[0];
  }
}

template <typename Policy, typename T, Elementwise kOp, Activation kAct, int kVec>
cudaError_t LaunchElementwise(ElementwiseParams<T> p, cudaStream_t stream) {
  // Threads per row: a power of two covering the row at vecs_per_thread vectors each, at most a
  // block; short rows share a block (rows of one element get one thread each).
  constexpr int kVecsPerThread = vecs_per_thread<Policy, kOp>();
  const int64_t num_vecs = std::max<int64_t>(1, ceil_div(p.cols, kVec));
  p.log2_threads_per_row = log2_threads_per_row(ceil_div(num_vecs, kVecsPerThread), Policy::kBlockThreads);
  const dim3 grid = grid_for(p.num_rows, Policy::kBlockThreads >> p.log2_threads_per_row);
  launch_kernel(kernel_entry_for<elementwise_register_cap<Policy, kOp>(), ElementwiseParams<T>,
                                 elementwise_body<Policy, T, kOp, kAct, kVec>>(),
                grid, Policy::kBlockThreads, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace elementwise_detail

// Host launcher: 16-byte vectors when every pointer and row stride allows it, scalar otherwise.
template <Elementwise kOp, Activation kAct, typename Policy = ElementwisePolicy, typename T>
cudaError_t elementwise(const ElementwiseParams<T>& p, cudaStream_t stream) {
  static_assert(form_has_activation(kOp) == (kAct != Activation::kNone), "kNone exactly for kGatedAdd");
  if (p.num_rows == 0 || p.cols == 0) return cudaSuccess;
  constexpr int kVec = vec_size<T>();
  auto aligned = [&](const void* ptr, const RowIndexer& rows) {
    return ptr == nullptr || (is_vec_aligned<T, kVec>(ptr) && rows.rows_aligned_to(kVec));
  };
  const bool vectorizable = aligned(p.x, p.x_rows) && aligned(p.gated, p.gated_rows) && aligned(p.gate, p.gate_rows) &&
                            aligned(p.out, p.out_rows);
  return vectorizable ? elementwise_detail::LaunchElementwise<Policy, T, kOp, kAct, kVec>(p, stream)
                      : elementwise_detail::LaunchElementwise<Policy, T, kOp, kAct, 1>(p, stream);
}

}  // namespace transformer_kernels
