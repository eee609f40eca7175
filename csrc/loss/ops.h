// The torch entry points of the fused linear cross-entropy
// (csrc/loss/fused_linear_cross_entropy.cu): the C++ signatures of its op schemas, registered in
// torch-ext/torch_binding.cpp. The family's .cu files include this header, so a definition that
// drifts from its declaration fails to compile.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

namespace transformer_kernels {

// hidden [N, H], weight [V, H], target [N] int64, bias [V]; -> (loss: [] or [N] fp32, grad_hidden [N, H],
// grad_weight [V, H], grad_bias [V]; ungiven gradients are empty [0] tensors)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_linear_cross_entropy(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
    int64_t ignore_index, std::string_view reduction, double label_smoothing, std::optional<double> softcap,
    std::array<bool, 3> compute_grads, int64_t chunk_rows);
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_cross_entropy_backward(
    const at::Tensor& grad_loss, const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, int64_t ignore_index, std::string_view reduction, double label_smoothing,
    std::optional<double> softcap, std::array<bool, 3> compute_grads, int64_t chunk_rows);

}  // namespace transformer_kernels
