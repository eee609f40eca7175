// The torch entry points of GroupNorm (csrc/group_norm: group_norm.cu, group_norm_backward.cu): the
// C++ signatures of its op schemas, registered in torch-ext/torch_binding.cpp. The family's .cu files
// include this header, so a definition that drifts from its declaration fails to compile.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

namespace transformer_kernels {

// x: [N, C, *spatial], channels-first (NCHW, NCDHW) or channels-last (NHWC, NDHWC), any batch stride;
// weight, bias: [C] in x's dtype; activation "none" | "silu". The output keeps x's layout.
at::Tensor group_norm(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, double eps, std::string_view activation);
void group_norm_out(at::Tensor& out, const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
                    const std::optional<at::Tensor>& bias, double eps, std::string_view activation);
// The same of h = x + bias_nc ([N or 1, C] or [N or 1, C, 1, ...], x's dtype): ResnetBlock2D's time embedding.
at::Tensor add_group_norm(const at::Tensor& x, const at::Tensor& bias_nc, int64_t num_groups,
                          const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
                          std::string_view activation);
void add_group_norm_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& bias_nc, int64_t num_groups,
                        const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
                        std::string_view activation);

// The backward of group_norm (bias_nc none) and add_group_norm, + SiLU: the forward's inputs and
// grad_out (x's shape and layout). -> (grad_x in x's layout, grad_bias_nc in bias_nc's shape,
// grad_weight, grad_bias): those output_mask asks for (and of an operand given), else empty [0].
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> group_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const std::optional<at::Tensor>& bias_nc, int64_t num_groups,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
    std::string_view activation, std::array<bool, 4> output_mask);

}  // namespace transformer_kernels
