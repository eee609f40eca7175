// Scalar conversions between the storage dtypes (float, half, bfloat16) and fp32.
// Torch-free: kernels include this, bindings never need to.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace transformer_kernels {

#define TK_DEVICE __device__ __forceinline__
#define TK_HOST_DEVICE __host__ __device__ __forceinline__

TK_DEVICE float to_float(float v) { return v; }
TK_DEVICE float to_float(__half v) { return __half2float(v); }
TK_DEVICE float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// Round-to-nearest-even, the rounding PyTorch uses for .to(dtype).
template <typename T>
TK_DEVICE T from_float(float v);
template <>
TK_DEVICE float from_float<float>(float v) { return v; }
template <>
TK_DEVICE __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
TK_DEVICE __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Round an fp32 value through T and back, as `y.to(T).float()` does in PyTorch.
template <typename T>
TK_DEVICE float round_through(float v) { return to_float(from_float<T>(v)); }

// Two fp32 values rounded to a 16-bit T with one instruction (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32
// on sm_80+): kernels that round every element several times, as eager code does op by op, would
// otherwise issue one conversion per value.
template <typename T>
TK_DEVICE void from_float_pair(float a, float b, T& lo, T& hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(a, b);
    lo = p.x, hi = p.y;
  } else if constexpr (std::is_same_v<T, __half>) {
    const __half2 p = __floats2half2_rn(a, b);
    lo = p.x, hi = p.y;
  } else {
    lo = from_float<T>(a), hi = from_float<T>(b);
  }
}

// from_float over N values, two per conversion instruction.
template <typename T, int N>
TK_DEVICE void from_floats(const float (&in)[N], T (&out)[N]) {
#pragma unroll
  for (int i = 0; i + 1 < N; i += 2) from_float_pair(in[i], in[i + 1], out[i], out[i + 1]);
  if constexpr (N % 2 == 1) out[N - 1] = from_float<T>(in[N - 1]);
}

// round_through over N values in place, two per conversion instruction (a no-op for float).
template <typename T, int N>
TK_DEVICE void round_through(float (&v)[N]) {
  if constexpr (!std::is_same_v<T, float>) {
    T rounded[N];
    from_floats(v, rounded);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = to_float(rounded[i]);
  }
}

}  // namespace transformer_kernels
