// Torch entry points of the norm family's backward ops (and gated_add's): validate, allocate the
// gradients asked for, and hand the launch to dispatch_norm_backward (compiled per variant in
// backward/, on the current stream of x's device). Gradients not asked for in output_mask, or of
// an absent parameter, come back as empty 1-D tensors of x's dtype.
#include <c10/cuda/CUDAGuard.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

#include "common/alloc.h"
#include "common/checks.h"
#include "norm/norm_backward_call.h"
#include "norm/ops.h"

namespace transformer_kernels {
namespace {

using norm_backward_binding::dispatch_norm_backward;
using norm_backward_binding::NormBackwardCall;
using OptTensor = std::optional<at::Tensor>;

const at::Tensor* ptr(const OptTensor& t) { return t ? &*t : nullptr; }

at::Tensor not_asked(const at::Tensor& x) { return empty_tensor({0}, x.options()); }

// A gradient of `like`'s shape and dtype when asked for and `like` exists.
at::Tensor grad_for(bool asked, const at::Tensor* like, const at::Tensor& x) {
  return asked && like != nullptr ? empty_tensor(like->sizes(), like->options().memory_format(at::MemoryFormat::Contiguous))
                                  : not_asked(x);
}

// An incoming gradient: x's device and shape, contiguous last dimension, one of `dtypes`.
void check_grad(const char* op, const at::Tensor& g, const char* name, const at::Tensor& x, c10::ScalarType dtype,
                c10::ScalarType alt_dtype) {
  check_same_device(op, g, name, x, "x");
  TORCH_CHECK_TYPE(g.scalar_type() == dtype || g.scalar_type() == alt_dtype, op, ": ", name,
                   " must have the dtype of the forward's output (", dtype, "), got ", g.scalar_type());
  check_same_shape(op, g, name, x, "x");
  check_last_dim_contiguous(op, g, name);
}

NormType resolve_norm_type(const char* op, std::string_view norm) {
  if (norm == "rms") return NormType::kRms;
  if (norm == "layer") return NormType::kLayer;
  TORCH_CHECK_VALUE(false, op, ": norm must be \"rms\" or \"layer\", got \"", norm, "\"");
}

// The (norm, features) kernels the ops use; nothing else is instantiated.
void launch_norm_backward_call(const NormBackwardCall& c) {
  const at::Tensor& x = c.h != nullptr ? *c.h : *c.dout;
  if (validation_only(x)) return;
  const at::cuda::OptionalCUDAGuard device_guard(x.device());
  if (num_rows(x) == 0) {  // no rows: the reduced gradients are sums of nothing
    for (at::Tensor* g : c.grads)
      if (g != nullptr) g->zero_();
    return;
  }
  using N = NormType;
  const bool mod = c.scale != nullptr, gated = c.gate != nullptr, affine = c.weight != nullptr || c.bias != nullptr;
  if (c.type == N::kNone) return dispatch_norm_backward<N::kNone, kBackwardGated>(c);
  if (!mod) {
    return c.type == N::kRms ? dispatch_norm_backward<N::kRms, kBackwardAffine>(c)
                             : dispatch_norm_backward<N::kLayer, kBackwardAffine>(c);
  }
  const bool rms = c.type == N::kRms;
  constexpr int M = kBackwardMod, G = kBackwardGated, A = kBackwardAffine;
  if (!gated && !affine) return rms ? dispatch_norm_backward<N::kRms, M>(c) : dispatch_norm_backward<N::kLayer, M>(c);
  if (!gated) return rms ? dispatch_norm_backward<N::kRms, M | A>(c) : dispatch_norm_backward<N::kLayer, M | A>(c);
  if (!affine) return rms ? dispatch_norm_backward<N::kRms, M | G>(c) : dispatch_norm_backward<N::kLayer, M | G>(c);
  return rms ? dispatch_norm_backward<N::kRms, M | G | A>(c) : dispatch_norm_backward<N::kLayer, M | G | A>(c);
}

bool anything_asked(const NormBackwardCall& c) {
  bool any = c.dh != nullptr || c.dy != nullptr;
  for (const at::Tensor* g : c.grads) any = any || g != nullptr;
  return any;
}

std::tuple<at::Tensor, at::Tensor> rms_backward(const char* op, const at::Tensor& grad_out, const OptTensor& grad_h,
                                                const at::Tensor& x, const OptTensor& weight, double eps,
                                                std::array<bool, 2> mask) {
  check_row_input(op, x, "x");
  check_norm_param(op, weight, "weight", x);
  check_eps(op, eps);
  // hf / diffusers with an fp32 weight output fp32; torch's rounding outputs x's dtype
  check_grad(op, grad_out, "grad_out", x, x.scalar_type(), weight ? weight->scalar_type() : x.scalar_type());
  if (grad_h) check_grad(op, *grad_h, "grad_residual_out", x, x.scalar_type(), x.scalar_type());
  at::Tensor dx = mask[0] ? empty_tensor(x.sizes(), x.options()) : not_asked(x);
  at::Tensor dw = grad_for(mask[1], ptr(weight), x);
  NormBackwardCall c{op, NormType::kRms, &grad_out, ptr(grad_h), &x, ptr(weight)};
  c.eps = eps;
  c.dh = mask[0] ? &dx : nullptr;
  c.grads[kGradWeight] = mask[1] && weight ? &dw : nullptr;
  if (anything_asked(c)) launch_norm_backward_call(c);
  return {dx, dw};
}

// The modulated norms' checks: x, the norm, its parameters, scale/shift broadcast to x.
NormType check_modulated(const char* op, const at::Tensor& x, const at::Tensor& scale,
                                 const OptTensor& shift, const OptTensor& weight, const OptTensor& bias, double eps,
                                 std::string_view norm) {
  check_row_input(op, x, "x");
  const NormType type = resolve_norm_type(op, norm);
  check_norm_param(op, weight, "weight", x);
  check_norm_param(op, bias, "bias", x);
  if (weight && bias)
    TORCH_CHECK_TYPE(weight->scalar_type() == bias->scalar_type(), op, ": weight and bias must have one dtype, got ",
                     weight->scalar_type(), " and ", bias->scalar_type());
  TORCH_CHECK_VALUE(type == NormType::kLayer || !bias, op, ": bias is only used with norm=\"layer\"");
  if (type == NormType::kRms && weight)
    TORCH_CHECK_TYPE(weight->scalar_type() == x.scalar_type(), op,
                     ": with norm=\"rms\" the weight must have x's dtype, got ", weight->scalar_type());
  check_broadcasts_to(op, scale, "scale", x);
  if (shift) check_broadcasts_to(op, *shift, "shift", x);
  check_eps(op, eps);
  return type;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                     const OptTensor& weight, double eps,
                                                     std::array<bool, 2> output_mask) {
  return rms_backward("rms_norm_backward", grad_out, std::nullopt, x, weight, eps, output_mask);
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_backward(const at::Tensor& grad_out,
                                                               const OptTensor& grad_residual_out,
                                                               const at::Tensor& residual_out, const OptTensor& weight,
                                                               double eps, std::array<bool, 2> output_mask) {
  return rms_backward("fused_add_rms_norm_backward", grad_out, grad_residual_out, residual_out, weight, eps,
                      output_mask);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                                   const OptTensor& weight, const OptTensor& bias,
                                                                   double eps, std::array<bool, 3> output_mask) {
  constexpr const char* op = "layer_norm_backward";
  check_row_input(op, x, "x");
  check_norm_param(op, weight, "weight", x);
  check_norm_param(op, bias, "bias", x);
  if (weight && bias)
    TORCH_CHECK_TYPE(weight->scalar_type() == bias->scalar_type(), op, ": weight and bias must have one dtype, got ",
                     weight->scalar_type(), " and ", bias->scalar_type());
  check_eps(op, eps);
  check_grad(op, grad_out, "grad_out", x, x.scalar_type(), x.scalar_type());
  at::Tensor dx = output_mask[0] ? empty_tensor(x.sizes(), x.options()) : not_asked(x);
  at::Tensor dw = grad_for(output_mask[1], ptr(weight), x);
  at::Tensor db = grad_for(output_mask[2], ptr(bias), x);
  NormBackwardCall c{op, NormType::kLayer, &grad_out, nullptr, &x, ptr(weight), ptr(bias)};
  c.eps = eps;
  c.dh = output_mask[0] ? &dx : nullptr;
  c.grads[kGradWeight] = output_mask[1] && weight ? &dw : nullptr;
  c.grads[kGradBias] = output_mask[2] && bias ? &db : nullptr;
  if (anything_asked(c)) launch_norm_backward_call(c);
  return {dx, dw, db};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> norm_modulate_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& scale, const OptTensor& shift,
    const OptTensor& weight, const OptTensor& bias, double eps, std::string_view norm,
    std::array<bool, 5> output_mask) {
  constexpr const char* op = "norm_modulate_backward";
  const NormType type = check_modulated(op, x, scale, shift, weight, bias, eps, norm);
  check_grad(op, grad_out, "grad_out", x, x.scalar_type(), x.scalar_type());
  at::Tensor dx = output_mask[0] ? empty_tensor(x.sizes(), x.options()) : not_asked(x);
  at::Tensor dscale = grad_for(output_mask[1], &scale, x);
  at::Tensor dshift = grad_for(output_mask[2], ptr(shift), x);
  at::Tensor dw = grad_for(output_mask[3], ptr(weight), x);
  at::Tensor db = grad_for(output_mask[4], ptr(bias), x);
  NormBackwardCall c{op, type, &grad_out, nullptr, &x, ptr(weight), ptr(bias), &scale, ptr(shift)};
  c.eps = eps;
  c.dh = output_mask[0] ? &dx : nullptr;
  c.grads[kGradScale] = output_mask[1] ? &dscale : nullptr;
  c.grads[kGradShift] = output_mask[2] && shift ? &dshift : nullptr;
  c.grads[kGradWeight] = output_mask[3] && weight ? &dw : nullptr;
  c.grads[kGradBias] = output_mask[4] && bias ? &db : nullptr;
  if (anything_asked(c)) launch_norm_backward_call(c);
  return {dx, dscale, dshift, dw, db};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
gated_add_norm_modulate_backward(const OptTensor& grad_h, const at::Tensor& grad_out, const at::Tensor& h,
                                 const at::Tensor& y, const OptTensor& gate, const at::Tensor& scale,
                                 const OptTensor& shift, const OptTensor& weight, const OptTensor& bias, double eps,
                                 std::string_view norm, std::array<bool, 7> output_mask) {
  constexpr const char* op = "gated_add_norm_modulate_backward";
  const NormType type = check_modulated(op, h, scale, shift, weight, bias, eps, norm);
  check_grad(op, grad_out, "grad_out", h, h.scalar_type(), h.scalar_type());
  if (grad_h) check_grad(op, *grad_h, "grad_h", h, h.scalar_type(), h.scalar_type());
  check_same_as_x(op, y, "y", h, "h");
  if (gate) check_broadcasts_to(op, *gate, "gate", h);
  // Without a gate, y's gradient is x's: the Python side returns dx for both.
  const bool want_dx = output_mask[0] || (output_mask[1] && !gate);
  at::Tensor dx = want_dx ? empty_tensor(h.sizes(), h.options()) : not_asked(h);
  at::Tensor dy = output_mask[1] && gate ? empty_tensor(h.sizes(), h.options()) : not_asked(h);
  at::Tensor dgate = grad_for(output_mask[2], ptr(gate), h);
  at::Tensor dscale = grad_for(output_mask[3], &scale, h);
  at::Tensor dshift = grad_for(output_mask[4], ptr(shift), h);
  at::Tensor dw = grad_for(output_mask[5], ptr(weight), h);
  at::Tensor db = grad_for(output_mask[6], ptr(bias), h);
  NormBackwardCall c{op, type, &grad_out, ptr(grad_h), &h, ptr(weight), ptr(bias), &scale, ptr(shift)};
  if (gate) c.y = &y, c.gate = &*gate;
  c.eps = eps;
  c.dh = want_dx ? &dx : nullptr;
  c.dy = output_mask[1] && gate ? &dy : nullptr;
  c.grads[kGradGate] = output_mask[2] && gate ? &dgate : nullptr;
  c.grads[kGradScale] = output_mask[3] ? &dscale : nullptr;
  c.grads[kGradShift] = output_mask[4] && shift ? &dshift : nullptr;
  c.grads[kGradWeight] = output_mask[5] && weight ? &dw : nullptr;
  c.grads[kGradBias] = output_mask[6] && bias ? &db : nullptr;
  if (anything_asked(c)) launch_norm_backward_call(c);
  return {dx, dy, dgate, dscale, dshift, dw, db};
}

std::tuple<at::Tensor, at::Tensor> gated_add_backward(const at::Tensor& grad_out, const at::Tensor& y,
                                                      const at::Tensor& gate, std::array<bool, 2> output_mask) {
  constexpr const char* op = "gated_add_backward";
  check_row_input(op, grad_out, "grad_out");
  check_same_as_x(op, y, "y", grad_out, "grad_out");
  check_broadcasts_to(op, gate, "gate", grad_out);
  at::Tensor dy = output_mask[0] ? empty_tensor(grad_out.sizes(), grad_out.options()) : not_asked(grad_out);
  at::Tensor dgate = grad_for(output_mask[1], &gate, grad_out);
  NormBackwardCall c{op, NormType::kNone, &grad_out};
  c.y = &y;
  c.gate = &gate;
  c.dy = output_mask[0] ? &dy : nullptr;
  c.grads[kGradGate] = output_mask[1] ? &dgate : nullptr;
  if (anything_asked(c)) launch_norm_backward_call(c);
  return {dy, dgate};
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&rms_norm_backward,
    &fused_add_rms_norm_backward, &layer_norm_backward, &norm_modulate_backward, &gated_add_norm_modulate_backward,
    &gated_add_backward);

}  // namespace transformer_kernels
