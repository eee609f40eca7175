// The torch entry points of the norm family (csrc/norm: norm.cu, gated_add.cu, norm_backward.cu):
// the C++ signatures of its op schemas, registered in torch-ext/torch_binding.cpp. The family's .cu
// files include this header, so a definition that drifts from its declaration fails to compile.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

namespace transformer_kernels {

at::Tensor rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                    std::string_view rounding);
void rms_norm_out(at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                  std::string_view rounding);

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                      const std::optional<at::Tensor>& weight, double eps,
                                                      std::string_view rounding);
void fused_add_rms_norm_out(at::Tensor& out, at::Tensor& residual_out, const at::Tensor& x, const at::Tensor& residual,
                            const std::optional<at::Tensor>& weight, double eps, std::string_view rounding);
void fused_add_rms_norm_inplace(at::Tensor& x, at::Tensor& residual, const std::optional<at::Tensor>& weight,
                                double eps, std::string_view rounding);

at::Tensor layer_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, double eps);
void layer_norm_out(at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                    const std::optional<at::Tensor>& bias, double eps);

at::Tensor norm_modulate(const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& shift,
                         const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
                         std::string_view norm);
void norm_modulate_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& scale,
                       const std::optional<at::Tensor>& shift, const std::optional<at::Tensor>& weight,
                       const std::optional<at::Tensor>& bias, double eps, std::string_view norm);

std::tuple<at::Tensor, at::Tensor> gated_add_norm_modulate(
    const at::Tensor& x, const at::Tensor& y, const std::optional<at::Tensor>& gate, const at::Tensor& scale,
    const std::optional<at::Tensor>& shift, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps, std::string_view norm);
void gated_add_norm_modulate_out(at::Tensor& out, at::Tensor& h_out, const at::Tensor& x, const at::Tensor& y,
                                 const std::optional<at::Tensor>& gate, const at::Tensor& scale,
                                 const std::optional<at::Tensor>& shift, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias, double eps, std::string_view norm);
// ---- FP8 outputs: each op's output in x's dtype, quantized per row as quantize_fp8 quantizes it (the same
// codes and scales), in the same pass: (codes [..., H] float8_e4m3fn, scale [..., 1] float32) ----
std::tuple<at::Tensor, at::Tensor> rms_norm_fp8(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                                double eps, std::string_view rounding);
// -> (codes, scale, residual_out)
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_fp8(const at::Tensor& x, const at::Tensor& residual,
                                                                      const std::optional<at::Tensor>& weight,
                                                                      double eps, std::string_view rounding);
std::tuple<at::Tensor, at::Tensor> layer_norm_fp8(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                                  const std::optional<at::Tensor>& bias, double eps);
std::tuple<at::Tensor, at::Tensor> norm_modulate_fp8(const at::Tensor& x, const at::Tensor& scale,
                                                     const std::optional<at::Tensor>& shift,
                                                     const std::optional<at::Tensor>& weight,
                                                     const std::optional<at::Tensor>& bias, double eps,
                                                     std::string_view norm);
// -> (codes, scale, h)
std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_add_norm_modulate_fp8(
    const at::Tensor& x, const at::Tensor& y, const std::optional<at::Tensor>& gate, const at::Tensor& scale,
    const std::optional<at::Tensor>& shift, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps, std::string_view norm);

// x, y: [..., H]; gate broadcast to x -> x + gate * y
at::Tensor gated_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate);
void gated_add_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate);

// ---- backward ops (csrc/norm/norm_backward.cu) ----
// Each takes the forward's inputs (or its saved h output), the gradients of its outputs, and
// output_mask: which gradients to compute; those not asked for (or of an absent parameter) come
// back as empty 1-D tensors. The row statistics are recomputed from x.
// -> (grad_x, grad_weight)
std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                     const std::optional<at::Tensor>& weight, double eps,
                                                     std::array<bool, 2> output_mask);
// -> (grad of x and of residual: one tensor, grad_weight); residual_out is the forward's h
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_backward(const at::Tensor& grad_out,
                                                               const std::optional<at::Tensor>& grad_residual_out,
                                                               const at::Tensor& residual_out,
                                                               const std::optional<at::Tensor>& weight, double eps,
                                                               std::array<bool, 2> output_mask);
// -> (grad_x, grad_weight, grad_bias)
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                                   const std::optional<at::Tensor>& weight,
                                                                   const std::optional<at::Tensor>& bias, double eps,
                                                                   std::array<bool, 3> output_mask);
// -> (grad_x, grad_scale, grad_shift, grad_weight, grad_bias), parameter gradients in their shapes
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> norm_modulate_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& shift,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps, std::string_view norm,
    std::array<bool, 5> output_mask);
// h: the forward's h output. -> (grad_x, grad_y (empty without a gate: it is grad_x),
// grad_gate, grad_scale, grad_shift, grad_weight, grad_bias)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
gated_add_norm_modulate_backward(const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_h,
                                 const at::Tensor& h, const at::Tensor& y, const std::optional<at::Tensor>& gate,
                                 const at::Tensor& scale, const std::optional<at::Tensor>& shift,
                                 const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                 double eps, std::string_view norm, std::array<bool, 7> output_mask);
// out = x + gate * y: grad_x is grad_out itself. -> (grad_y, grad_gate)
std::tuple<at::Tensor, at::Tensor> gated_add_backward(const at::Tensor& grad_out, const at::Tensor& y,
                                                      const at::Tensor& gate, std::array<bool, 2> output_mask);

}  // namespace transformer_kernels
