// The torch entry points of the gemm family (csrc/gemm/: linear + GELU, the FP8 linear, the decode linear): the C++ signatures of its op
// schemas, registered in torch-ext/torch_binding.cpp. The family's .cu files include this header,
// so a definition that drifts from its declaration fails to compile.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

namespace transformer_kernels {

// x [..., K], weight [N, K], bias [N] or None, one float dtype -> gelu_tanh(x @ weight^T + bias) [..., N]
at::Tensor linear_gelu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);
void linear_gelu_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                     const std::optional<at::Tensor>& bias);
// Whether linear_gelu(x, weight, bias) runs as one cuBLASLt matmul with the GELU epilogue here
// (else it takes the separate GEMM and activation); a host query, for tests and benchmarks.
bool linear_gelu_fused(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);
// x [..., K] float8_e4m3fn with x_scale [..., 1] float32, weight [N, K] float8_e4m3fn with weight_scale [N]
// float32, bias [N] in out_dtype (bfloat16/float16), activation "none" | "gelu_tanh" ->
// act((x * x_scale) @ (weight * weight_scale)^T + bias) [..., N] in out_dtype (csrc/gemm/linear_fp8.cuh).
at::Tensor linear_fp8(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                      const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias, c10::ScalarType out_dtype,
                      std::string_view activation);

// x [..., K] with at most 8 rows (a decode step's tokens), weight [N, K] in x's dtype or float8_e4m3fn
// (weight_scale [N] float32: weight-only FP8), bias [N] -> x @ (weight * weight_scale)^T + bias [..., N]
// in x's dtype, streaming the weight once (csrc/gemm/decode_linear.cuh).
at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& weight_scale,
                         const std::optional<at::Tensor>& bias);

}  // namespace transformer_kernels
