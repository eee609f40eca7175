// Elementwise activations and gated linear units over rows. Torch-free: functors, two kernels,
// their launch heuristics and a host launcher.
//
//   kAct:       out = act(a)
//   kActMul:    out = round(round(act(a)) * b)     (a = gate, b = up; the eager code rounds twice)
//   kGatedAdd:  out = round(a + round(c * b))      (a = x, b = y, c = gate broadcast)
//
// Each formula follows ATen's CUDA code op for op, in fp32, so results match F.silu / F.gelu.
// Both kernels compute an element through the same `apply_vec`, so which one runs never changes a
// result bit.
//
//   flat kernel: a grid over all output vectors of the tensor, a few per thread; used when every
//                operand is 16-byte aligned with aligned row strides and rows are whole vectors.
//   row kernel:  a power of two of threads per row, a scalar tail; every other case.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/divmod.cuh"
#include "common/math.cuh"
#include "common/rows.cuh"
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

constexpr int kThreadsPerBlock = 256;
// Vectors each thread loads per step (all in flight together); also what sizes a row's threads.
constexpr int kVecsPerThread = 4;

// Flat path knobs, for A/B builds (TK_CUDA_FLAGS="-DTK_ELEMENTWISE_FLAT=0" python tools/build_kernel.py).
// TK_ELEMENTWISE_FLAT=0 sends every launch to the row kernel, as before the flat path existed.
#ifndef TK_ELEMENTWISE_FLAT
#define TK_ELEMENTWISE_FLAT 1
#endif
// Threads per block: 4 warps as Inductor's pointwise kernels; small blocks make the grid's last,
// partial wave short.
#ifndef TK_ELEMENTWISE_FLAT_THREADS
#define TK_ELEMENTWISE_FLAT_THREADS 128
#endif
// Vectors per thread, all loaded before any math: the row kernel's 4 (64 bytes per operand in
// flight per thread).
#ifndef TK_ELEMENTWISE_FLAT_VECS
#define TK_ELEMENTWISE_FLAT_VECS 4
#endif
// Resident blocks per SM the compiler must allow (__launch_bounds__'s second argument). 0 leaves
// registers to ptxas (sm_90, 4 vectors: 35-71, bf16 gated_add 93, so 5 blocks of 128 threads);
// 8 caps them at 64, which spills in bf16 gelu-tanh act_mul. (1 is not neutral: ptxas then takes
// up to 92 registers elsewhere too.)
#ifndef TK_ELEMENTWISE_FLAT_MIN_BLOCKS
#define TK_ELEMENTWISE_FLAT_MIN_BLOCKS 0
#endif
constexpr bool kFlatEnabled = TK_ELEMENTWISE_FLAT != 0;
constexpr int kFlatThreads = TK_ELEMENTWISE_FLAT_THREADS;
constexpr int kFlatVecsPerThread = TK_ELEMENTWISE_FLAT_VECS;
constexpr int kFlatMinBlocksPerSm = TK_ELEMENTWISE_FLAT_MIN_BLOCKS;
constexpr int kFlatVecsPerBlock = kFlatThreads * kFlatVecsPerThread;
static_assert(kFlatThreads % 32 == 0 && kFlatThreads <= 1024, "flat blocks are whole warps");
static_assert(kFlatVecsPerThread >= 1, "a flat thread handles at least one vector");

// What the flat kernel reads: ElementwiseParams with the division by the row length and each
// operand's row decoding precomputed, for vector indices below kFastDivmodLimit.
template <typename T>
struct FlatElementwiseParams {
  const T* a;    // [rows..., cols]
  const T* b;    // [rows..., cols] or null
  const T* c;    // [rows..., cols], broadcast rows allowed, or null
  T* out;        // [rows..., cols]
  FastRowIndexer a_rows, b_rows, c_rows, out_rows;
  uint32_t dense;           // kFlat* bits of the operands whose rows lie back to back
  FastDivmod vecs_per_row;  // cols / vec
  uint32_t num_vecs;        // rows * cols / vec
};
// Bits of FlatElementwiseParams::dense: vector i of such an operand is at i * vec, no row needed.
constexpr uint32_t kFlatA = 1, kFlatB = 2, kFlatC = 4, kFlatOut = 8;

template <typename T, Elementwise kOp, Activation kAct>
TK_DEVICE float apply(float a, float b, float c) {
  if constexpr (kOp == Elementwise::kAct) {
    return activate<kAct>(a);
  } else if constexpr (kOp == Elementwise::kActMul) {
    return __fmul_rn(round_through<T>(activate<kAct>(a)), b);
  } else {
    return __fadd_rn(a, round_through<T>(__fmul_rn(c, b)));
  }
}

// One vector of results; b and c are read only by the ops that have them.
template <typename T, Elementwise kOp, Activation kAct, int kVec>
TK_DEVICE vec_t<T, kVec> apply_vec(const vec_t<T, kVec>& a, const vec_t<T, kVec>& b, const vec_t<T, kVec>& c) {
  vec_t<T, kVec> out;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const float bf = kOp != Elementwise::kAct ? to_float(b[i]) : 0.f;
    const float cf = kOp == Elementwise::kGatedAdd ? to_float(c[i]) : 0.f;
    out[i] = from_float<T>(apply<T, kOp, kAct>(to_float(a[i]), bf, cf));
  }
  return out;
}

template <typename T, Elementwise kOp, Activation kAct, int kVec>
__global__ void elementwise_kernel(const ElementwiseParams<T> p) {
  using vec = vec_t<T, kVec>;
  const int threads = 1 << p.log2_threads_per_row;
  const int lane = threadIdx.x & (threads - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> p.log2_threads_per_row) +
                      (threadIdx.x >> p.log2_threads_per_row);
  if (row >= p.num_rows) return;
  // The binding rejects outputs that overlap inputs, so loads of later vectors may be issued
  // before earlier stores.
  const T* __restrict__ a = p.a + p.a_rows.offset(row);
  const T* __restrict__ b = kOp != Elementwise::kAct ? p.b + p.b_rows.offset(row) : nullptr;
  const T* __restrict__ c = kOp == Elementwise::kGatedAdd ? p.c + p.c_rows.offset(row) : nullptr;
  T* __restrict__ out = p.out + p.out_rows.offset(row);
  const int64_t num_vecs = p.cols / kVec;

  // kVecsPerThread vectors per thread per step, all loads issued before any math or store, so
  // that each thread keeps that many 16-byte loads of every operand in flight.
  for (int64_t base = lane; base < num_vecs; base += static_cast<int64_t>(threads) * kVecsPerThread) {
    vec av[kVecsPerThread], bv[kVecsPerThread], cv[kVecsPerThread];
#pragma unroll
    for (int u = 0; u < kVecsPerThread; ++u) {
      const int64_t v = base + static_cast<int64_t>(u) * threads;
      if (v < num_vecs) {
        av[u].load(a + v * kVec);
        if constexpr (kOp != Elementwise::kAct) bv[u].load(b + v * kVec);
        if constexpr (kOp == Elementwise::kGatedAdd) cv[u].load(c + v * kVec);
      }
    }
#pragma unroll
    for (int u = 0; u < kVecsPerThread; ++u) {
      const int64_t v = base + static_cast<int64_t>(u) * threads;
      if (v < num_vecs) apply_vec<T, kOp, kAct>(av[u], bv[u], cv[u]).store(out + v * kVec);
    }
  }
  for (int64_t col = num_vecs * kVec + lane; col < p.cols; col += threads) {
    const float bf = kOp != Elementwise::kAct ? to_float(b[col]) : 0.f;
    const float cf = kOp == Elementwise::kGatedAdd ? to_float(c[col]) : 0.f;
    out[col] = from_float<T>(apply<T, kOp, kAct>(to_float(a[col]), bf, cf));
  }
}

// Block b covers output vectors [b, b + 1) * kFlatVecsPerBlock of the whole tensor (row-major);
// its thread t takes kFlatVecsPerThread of them kFlatThreads apart, so each load instruction of a
// warp covers 512 contiguous bytes, and issues all their loads before any math. No thread waits on
// a row's end and only the grid's last block is partial.
template <typename T, Elementwise kOp, Activation kAct, int kVec>
__global__ void __launch_bounds__(kFlatThreads, kFlatMinBlocksPerSm)
    flat_elementwise_kernel(const FlatElementwiseParams<T> p) {
  using vec = vec_t<T, kVec>;
  const uint32_t first = blockIdx.x * static_cast<uint32_t>(kFlatVecsPerBlock) + threadIdx.x;
  // Element offset of vector i (row `row`, column vector `col`) of one operand.
  auto at = [&](uint32_t bit, const FastRowIndexer& rows, uint32_t i, uint32_t row, uint32_t col) {
    return (p.dense & bit) ? static_cast<int64_t>(i) * kVec : rows.offset(row) + static_cast<int64_t>(col) * kVec;
  };
  // As in the row kernel, outputs never overlap inputs (the binding checks), so every load may be
  // issued before the first store.
  const T* __restrict__ a = p.a;
  const T* __restrict__ b = p.b;
  const T* __restrict__ c = p.c;
  T* __restrict__ out = p.out;
  vec av[kFlatVecsPerThread], bv[kFlatVecsPerThread], cv[kFlatVecsPerThread];
#pragma unroll
  for (int u = 0; u < kFlatVecsPerThread; ++u) {
    const uint32_t i = first + u * kFlatThreads;
    if (i < p.num_vecs) {
      uint32_t row, col;
      p.vecs_per_row.divmod(i, &row, &col);
      av[u].load(a + at(kFlatA, p.a_rows, i, row, col));
      if constexpr (kOp != Elementwise::kAct) bv[u].load(b + at(kFlatB, p.b_rows, i, row, col));
      if constexpr (kOp == Elementwise::kGatedAdd) cv[u].load(c + at(kFlatC, p.c_rows, i, row, col));
    }
  }
#pragma unroll
  for (int u = 0; u < kFlatVecsPerThread; ++u) {
    const uint32_t i = first + u * kFlatThreads;
    if (i < p.num_vecs) {
      uint32_t row, col;
      p.vecs_per_row.divmod(i, &row, &col);
      apply_vec<T, kOp, kAct>(av[u], bv[u], cv[u]).store(out + at(kFlatOut, p.out_rows, i, row, col));
    }
  }
}

// True when an operand's rows lie back to back (one row counts as such).
inline bool rows_dense(const RowIndexer& rows, int64_t cols) {
  return rows.ndim == 1 && (rows.sizes[0] == 1 || rows.strides[0] == cols);
}

// Host-side work is a few integer operations and a 64-bit division per divisor (the row length,
// and the inner sizes of an operand whose rows need more than one stride): decode calls are
// host-bound. No allocation.
template <typename T, Elementwise kOp, Activation kAct, int kVec>
cudaError_t launch_flat(const ElementwiseParams<T>& p, int64_t num_vecs, cudaStream_t stream) {
  FlatElementwiseParams<T> f;
  f.a = p.a;
  f.b = p.b;
  f.c = p.c;
  f.out = p.out;
  f.a_rows = make_fast_row_indexer(p.a_rows);
  f.b_rows = make_fast_row_indexer(p.b_rows);
  f.c_rows = make_fast_row_indexer(p.c_rows);
  f.out_rows = make_fast_row_indexer(p.out_rows);
  f.dense = (rows_dense(p.a_rows, p.cols) ? kFlatA : 0) | (rows_dense(p.b_rows, p.cols) ? kFlatB : 0) |
            (rows_dense(p.c_rows, p.cols) ? kFlatC : 0) | (rows_dense(p.out_rows, p.cols) ? kFlatOut : 0);
  f.vecs_per_row = FastDivmod(static_cast<uint32_t>(p.cols / kVec));
  f.num_vecs = static_cast<uint32_t>(num_vecs);
  const dim3 grid(static_cast<unsigned>((num_vecs + kFlatVecsPerBlock - 1) / kFlatVecsPerBlock));
  flat_elementwise_kernel<T, kOp, kAct, kVec><<<grid, kFlatThreads, 0, stream>>>(f);
  return cudaGetLastError();
}

template <typename T, Elementwise kOp, Activation kAct, int kVec>
cudaError_t launch(ElementwiseParams<T> p, cudaStream_t stream) {
  // Threads per row: a power of two covering the row at kVecsPerThread vectors each, at most a
  // block; short rows share a block (rows of one element get one thread each).
  const int64_t num_vecs = std::max<int64_t>(1, (p.cols + kVec - 1) / kVec);
  const int64_t wanted = (num_vecs + kVecsPerThread - 1) / kVecsPerThread;
  int log2 = 0;
  while ((int64_t{1} << log2) < wanted && (1 << log2) < kThreadsPerBlock) ++log2;
  p.log2_threads_per_row = log2;
  const int64_t rows_per_block = kThreadsPerBlock >> log2;
  const dim3 grid(static_cast<unsigned>((p.num_rows + rows_per_block - 1) / rows_per_block));
  elementwise_kernel<T, kOp, kAct, kVec><<<grid, kThreadsPerBlock, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace elementwise_detail

// Host launcher: 16-byte vectors when every pointer and row stride allows it, scalar otherwise;
// the flat kernel when rows are also whole vectors and the vector count fits its 32-bit indices
// (2^31 vectors = 32 GiB of bf16 per operand; beyond, the row kernel's 64-bit indexing).
template <Elementwise kOp, Activation kAct, typename T>
cudaError_t elementwise(const ElementwiseParams<T>& p, cudaStream_t stream) {
  if (p.num_rows == 0 || p.cols == 0) return cudaSuccess;
  constexpr int kVec = vec_size<T>();
  auto aligned = [&](const void* ptr, const RowIndexer& rows) {
    return ptr == nullptr || (is_vec_aligned<T, kVec>(ptr) && rows.rows_aligned_to(kVec));
  };
  const bool vectorizable =
      aligned(p.a, p.a_rows) && aligned(p.b, p.b_rows) && aligned(p.c, p.c_rows) && aligned(p.out, p.out_rows);
  if (!vectorizable) return elementwise_detail::launch<T, kOp, kAct, 1>(p, stream);
  if constexpr (elementwise_detail::kFlatEnabled) {  // else not even compiled: the A/B baseline
    const int64_t num_vecs = p.num_rows * (p.cols / kVec);  // at most numel / kVec: no overflow
    if (p.cols % kVec == 0 && num_vecs < int64_t{kFastDivmodLimit})
      return elementwise_detail::launch_flat<T, kOp, kAct, kVec>(p, num_vecs, stream);
  }
  return elementwise_detail::launch<T, kOp, kAct, kVec>(p, stream);
}

}  // namespace transformer_kernels
