// dtype dispatch from a torch ScalarType to the CUDA storage type the kernels use.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include "common/float_type.h"

namespace transformer_kernels {

// Calls f(type_tag<T>{}) with T = float, __half or __nv_bfloat16 for dtype float32, float16 or
// bfloat16; raises TypeError naming `what` for any other dtype. Inside f:
//   using scalar_t = typename decltype(tag)::type;
template <typename F>
void dispatch_float_dtype(c10::ScalarType dtype, const char* what, F&& f) {
  switch (dtype) {
    case c10::ScalarType::Float: f(type_tag<float>{}); break;
    case c10::ScalarType::Half: f(type_tag<__half>{}); break;
    case c10::ScalarType::BFloat16: f(type_tag<__nv_bfloat16>{}); break;
    default:
      TORCH_CHECK_TYPE(false, what, " must be float32, float16 or bfloat16, got ", dtype);
  }
}

// The FloatType of a float32, float16 or bfloat16 dtype; raises TypeError naming `what` for any other.
inline FloatType float_type(c10::ScalarType dtype, const char* what) {
  FloatType type = FloatType::kFloat32;
  dispatch_float_dtype(dtype, what, [&](auto tag) { type = float_type_of<typename decltype(tag)::type>(); });
  return type;
}

}  // namespace transformer_kernels
