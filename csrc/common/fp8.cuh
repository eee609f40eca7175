// Per-row dynamic FP8 (e4m3) quantization, the pieces every quantizing kernel shares: a row's scale
// from its amax, and a value's code (reference/fp8.py is their float64 model). Torch-free.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/math.cuh"

namespace transformer_kernels {

// The largest finite e4m3 value; the smallest amax a scale is formed from (torchao's floor), so
// that an all-zero row gets a finite scale (and zero values).
constexpr float kFp8E4m3Max = 448.f;
constexpr float kFp8AmaxFloor = 1e-12f;

// A row's scale from its amax (a NaN-keeping max of |value|): max(amax, floor) / 448, rounded once.
// A NaN amax gives a NaN scale, an infinite one an infinite scale: either dequantizes to NaN.
TK_DEVICE float fp8_row_scale(float amax) {
  const float floored = amax != amax ? amax : fmaxf(amax, kFp8AmaxFloor);
  return __fdiv_rn(floored, kFp8E4m3Max);
}

// The e4m3 code of x / scale: the quotient rounded once in fp32, then to nearest even in e4m3,
// saturating (NaN stays NaN).
TK_DEVICE uint8_t fp8_code(float x, float scale) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3));
}

// The value of an e4m3 code (exact in half precision, then in fp32).
TK_DEVICE float fp8_value(uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3)));
}

}  // namespace transformer_kernels
