// The torch entry points of linear + GELU (csrc/gemm/linear_gelu.cu): the C++ signatures of its op
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

}  // namespace transformer_kernels
