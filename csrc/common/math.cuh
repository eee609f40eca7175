// Scalar conversions between the storage dtypes (float, half, bfloat16) and fp32.
// Torch-free: kernels include this, bindings never need to.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

}  // namespace transformer_kernels
