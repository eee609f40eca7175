// Per-row (per-token) dynamic FP8 quantization to e4m3: each row's amax, its scale
// max(amax, kFp8AmaxFloor) / 448 and the row's values v / scale rounded to nearest even and
// saturated at ±448, each division rounded once in fp32 (reference/fp8.py). A row holding a NaN gets
// a NaN scale, one holding an infinity an infinite scale: either dequantizes to NaN. The values are
// x itself, or (kAct set) the gated unit act(gate) * up computed as act_mul computes it (act in fp32
// rounded to T, the product rounded to T): the quantization fused into the activation that produces
// the down projection's input, bit for bit quantize_fp8(act_mul(gate, up)). Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/fp8.cuh"
#include "common/kernel.cuh"
#include "common/reduce.cuh"
#include "common/rows.cuh"
#include "common/schedule.cuh"
#include "common/activation_math.cuh"
#include "common/vec.cuh"
#include "quant/quant_policy.cuh"

namespace transformer_kernels {

template <typename T>
struct QuantizeFp8Params {
  const T* x;  // [rows..., hidden]: the values, or the gate (kAct set)
  RowIndexer x_rows;
  const T* up = nullptr;  // [rows..., hidden]: what the activated gate multiplies (kAct set)
  RowIndexer up_rows;
  uint8_t* out;  // [rows..., hidden]: e4m3 codes (torch.float8_e4m3fn)
  RowIndexer out_rows;
  float* scale;  // [rows] contiguous: each row's scale
  int64_t num_rows;
  int64_t hidden;
};

namespace quant_detail {

// The kVec values at vector i of a row: x's, or act(gate) * up rounded as act_mul rounds it.
template <Activation kAct, typename T, int kVec>
TK_DEVICE void row_values(const T* x, const T* up, int64_t i, float (&f)[kVec]) {
  vec_t<T, kVec> v;
  v.load(x + i * kVec);
  if constexpr (kAct != Activation::kNone) {
    float g[kVec];
    v.cast_to(g);
#pragma unroll
    for (int k = 0; k < kVec; ++k) g[k] = activate<kAct>(g[k]);
    vec_t<T, kVec> activated, gated;
    activated.cast_from(g);
    gated.load(up + i * kVec);
    v = mul_rn(activated, gated);
  }
  v.cast_to(f);
}

// One block per row: the row's amax (a NaN-keeping block max), its scale, then the row again
// (from L1/L2) to its codes. kVec elements per access: 16-byte loads, kVec bytes of codes.
template <typename Policy, typename T, int kVec, Activation kAct>
__device__ void quantize_fp8_body(const QuantizeFp8Params<T>& p) {
  const int64_t row = blockIdx.x;
  const T* x = p.x + p.x_rows.offset(row);
  const T* up = kAct == Activation::kNone ? nullptr : p.up + p.up_rows.offset(row);
  uint8_t* out = p.out + p.out_rows.offset(row);
  const int64_t vecs = p.hidden / kVec;
  float amax[1] = {0.f};
  for (int64_t i = threadIdx.x; i < vecs; i += blockDim.x) {
    float f[kVec];
    row_values<kAct>(x, up, i, f);
#pragma unroll
    for (int k = 0; k < kVec; ++k) amax[0] = NanMaxOp{}(amax[0], fabsf(f[k]));
  }
  block_reduce<NanMaxOp, 1>(amax);
  const float scale = fp8_row_scale(amax[0]);
  if (threadIdx.x == 0) p.scale[row] = scale;
  for (int64_t i = threadIdx.x; i < vecs; i += blockDim.x) {
    float f[kVec];
    row_values<kAct>(x, up, i, f);
    vec_t<uint8_t, kVec> codes;
#pragma unroll
    for (int k = 0; k < kVec; ++k) codes[k] = fp8_code(f[k], scale);
    codes.store(out + i * kVec);
  }
}

// The 16-byte path: the width a multiple of the vector, x's rows and base 16-byte aligned, the codes'
// rows and base aligned to a vector's bytes.
template <typename T>
bool quantize_fp8_vectorizable(const QuantizeFp8Params<T>& p, int vec) {
  const bool up_ok = p.up == nullptr || (reinterpret_cast<uintptr_t>(p.up) % kVecBytes == 0 && p.up_rows.rows_aligned_to(vec));
  return p.hidden % vec == 0 && reinterpret_cast<uintptr_t>(p.x) % kVecBytes == 0 && p.x_rows.rows_aligned_to(vec) &&
         up_ok && reinterpret_cast<uintptr_t>(p.out) % vec == 0 && p.out_rows.rows_aligned_to(vec);
}

}  // namespace quant_detail

// Host launcher: a block per row, 16-byte vectors where quantize_fp8_vectorizable allows, element by
// element otherwise. Rows of no elements get the floor's scale. kAct: the values are act(x) * up
// (p.up set), kNone: x.
template <Activation kAct = Activation::kNone, typename Policy = QuantPolicy, typename T>
cudaError_t QuantizeFp8(const QuantizeFp8Params<T>& p, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  // Rows of no elements read neither operand (an empty tensor's data pointer may be null).
  if (p.hidden > 0 && (kAct == Activation::kNone) != (p.up == nullptr)) return cudaErrorInvalidValue;
  constexpr int kVec = vec_size<T>();
  constexpr auto kVectorized =
      &kernel_entry<QuantizeFp8Params<T>, quant_detail::quantize_fp8_body<Policy, T, kVec, kAct>>;
  constexpr auto kScalar = &kernel_entry<QuantizeFp8Params<T>, quant_detail::quantize_fp8_body<Policy, T, 1, kAct>>;
  const auto kernel = quant_detail::quantize_fp8_vectorizable(p, kVec) ? kVectorized : kScalar;
  launch_kernel(kernel, grid_for(p.num_rows, 1), Policy::kBlockThreads, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace transformer_kernels
