// dtype dispatch from a torch ScalarType to the CUDA storage type the kernels use.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

namespace transformer_kernels {

template <typename T>
struct type_tag {
  using type = T;
};

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

}  // namespace transformer_kernels
