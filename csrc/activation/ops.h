// The torch entry points of the activation family (csrc/activation: activation.cu,
// activation_backward.cu): the C++ signatures of its op schemas, registered in
// torch-ext/torch_binding.cpp. The family's .cu files include this header, so a definition that
// drifts from its declaration fails to compile.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

namespace transformer_kernels {

// act: "silu" | "gelu" | "gelu_tanh"
at::Tensor activation(const at::Tensor& x, std::string_view activation);
void activation_out(at::Tensor& out, const at::Tensor& x, std::string_view activation);
// x: [..., 2 * H] -> [..., H]; act_first: act(x[..., :H]) * x[..., H:], else x[..., :H] * act(x[..., H:])
at::Tensor act_and_mul(const at::Tensor& x, std::string_view activation, bool act_first);
void act_and_mul_out(at::Tensor& out, const at::Tensor& x, std::string_view activation, bool act_first);
// gate, up: [..., H] -> act(gate) * up
at::Tensor act_mul(const at::Tensor& gate, const at::Tensor& up, std::string_view activation);
void act_mul_out(at::Tensor& out, const at::Tensor& gate, const at::Tensor& up, std::string_view activation);
// grad: the forward output's gradient; returns the inputs' gradients ([..., 2H] for act_and_mul).
at::Tensor activation_backward(const at::Tensor& grad, const at::Tensor& x, std::string_view activation);
at::Tensor act_and_mul_backward(const at::Tensor& grad, const at::Tensor& x, std::string_view activation, bool act_first);
std::tuple<at::Tensor, at::Tensor> act_mul_backward(const at::Tensor& grad, const at::Tensor& gate,
                                                    const at::Tensor& up, std::string_view activation);

}  // namespace transformer_kernels
