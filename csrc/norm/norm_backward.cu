// Torch entry points of the norm family's backward ops (and gated_add's): validate, allocate the
// gradients asked for, and hand the launch to the planner and launcher of its (norm, features)
// combination (compiled in backward/, on the current stream of x's device). Gradients not asked for
// in output_mask, or of an absent parameter, come back as empty 1-D tensors of x's dtype.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/dispatch.h"
#include "common/variants.h"
#include "norm/norm_backward_call.h"
#include "norm/norm_choices.h"
#include "norm/ops.h"

namespace transformer_kernels {
namespace {

using norm_backward_binding::NormBackwardCall;
using OptTensor = std::optional<at::Tensor>;

const at::Tensor* ptr(const OptTensor& t) { return t ? &*t : nullptr; }

at::Tensor not_asked(const at::Tensor& x) { return empty_tensor({0}, x.options()); }

// A gradient of `like`'s shape and dtype when asked for and `like` exists.
at::Tensor grad_for(bool asked, const at::Tensor* like, const at::Tensor& x) {
  return asked && like != nullptr ? empty_tensor(like->sizes(), like->options().memory_format(at::MemoryFormat::Contiguous))
                                  : not_asked(x);
}

// An incoming gradient: x's device and shape, contiguous last dimension, one of `dtypes`. `x_name`:
// what the op calls x.
void check_grad(const char* op, const at::Tensor& g, const char* name, const at::Tensor& x, c10::ScalarType dtype,
                c10::ScalarType alt_dtype, const char* x_name = "x") {
  check_same_device(op, g, name, x, x_name);
  TORCH_CHECK_TYPE(g.scalar_type() == dtype || g.scalar_type() == alt_dtype, op, ": ", name,
                   " must have the dtype of the forward's output (", dtype, "), got ", g.scalar_type());
  check_same_shape(op, g, name, x, x_name);
  check_last_dim_contiguous(op, g, name);
}

// How the gradient of a parameter broadcast to x is formed: row by row (segment_rows 1: the
// parameter has a row per row of x), reduced over segments of segment_rows consecutive rows (its
// leading dimensions are x's up to one, size 1 from there on: [hidden], [B, 1, hidden], [B, F, 1,
// hidden]), or, for any other broadcast ([1, S, hidden]), row by row into a temporary of x's shape
// that torch then sums to the parameter's shape (sum_after: in fp32, rounded once).
struct GradLayout {
  int64_t segment_rows;
  bool sum_after;
};

GradLayout grad_layout(const at::Tensor& param, const at::Tensor& x) {
  const int64_t lead = x.dim() - 1;
  const int64_t offset = lead - (param.dim() - 1);  // the parameter's leading dims, right-aligned
  auto param_size = [&](int64_t d) { return d < offset ? int64_t{1} : param.size(d - offset); };
  int64_t first_broadcast = lead;
  for (int64_t d = 0; d < lead && first_broadcast == lead; ++d)
    if (param_size(d) == 1 && x.size(d) > 1) first_broadcast = d;
  int64_t segment_rows = 1;
  for (int64_t d = first_broadcast; d < lead; ++d) {
    if (x.size(d) > 1 && param_size(d) != 1) return {1, true};
    segment_rows *= x.size(d);
  }
  return {segment_rows, false};
}

// The parameters whose gradients the ParamGrad slots hold.
std::array<const at::Tensor*, kNumParamGrads> grad_params(const NormBackwardCall& c) {
  return {c.weight, c.bias, c.scale, c.shift, c.gate};
}

// The launch's parameters, pointers type-erased (the planners and launchers in backward/ give them
// types), and the gradient outputs as the kernels write them: `sum_after` gets the row-by-row fp32
// temporaries that torch sums to their parameters' shapes afterwards.
NormBackwardLaunch backward_params(const NormBackwardCall& c, const at::Tensor& x,
                                   std::array<at::Tensor, kNumParamGrads>& sum_after) {
  NormBackwardLaunch l;
  l.x_type = float_type(x.scalar_type(), "x");
  const at::Tensor* param = c.weight != nullptr ? c.weight : c.bias;  // weight and bias share one dtype (checked)
  l.weight_type = param != nullptr ? float_type(param->scalar_type(), "weight") : l.x_type;
  l.grad_type = float_type(c.dout->scalar_type(), "grad_out");
  NormBackwardParams<void, void, void>& p = l.params;
  p.dout = c.dout->const_data_ptr();
  p.dout_rows = row_indexer(c.op, *c.dout, "grad_out");
  if (c.dh_in != nullptr) {
    p.dh_in = c.dh_in->const_data_ptr();
    p.dh_in_rows = row_indexer(c.op, *c.dh_in, "grad_h");
  }
  if (c.h != nullptr) {
    p.h = c.h->const_data_ptr();
    p.h_rows = row_indexer(c.op, *c.h, "x");
  }
  if (c.weight != nullptr) p.weight = c.weight->const_data_ptr();
  if (c.bias != nullptr) p.bias = c.bias->const_data_ptr();
  if (c.scale != nullptr) {
    p.scale = c.scale->const_data_ptr();
    p.scale_rows = broadcast_row_indexer(c.op, *c.scale, "scale", x);
  }
  if (c.y != nullptr) {
    p.y = c.y->const_data_ptr();
    p.y_rows = row_indexer(c.op, *c.y, "y");
  }
  if (c.gate != nullptr) {
    p.gate = c.gate->const_data_ptr();
    p.gate_rows = broadcast_row_indexer(c.op, *c.gate, "gate", x);
  }
  if (c.dh != nullptr) p.dh = c.dh->data_ptr();
  if (c.dy != nullptr) p.dy = c.dy->data_ptr();
  p.num_rows = num_rows(x);
  p.hidden = x.size(-1);
  p.eps = static_cast<float>(c.eps);
  set_segment_rows(p);

  const auto params = grad_params(c);
  for (int i = 0; i < kNumParamGrads; ++i) {
    at::Tensor* grad = c.grads[i];
    if (grad == nullptr) continue;
    if (i == kGradWeight || i == kGradBias) {
      p.reduced[i] = grad->data_ptr();
      p.reduced_segment_rows[i] = p.num_rows;
      continue;
    }
    const GradLayout layout = grad_layout(*params[i], x);
    if (layout.sum_after) {  // fp32 rows: rows rounded to T before the sum would add a rounding each
      sum_after[i] = empty_tensor(x.sizes(), x.options().dtype(at::kFloat));
      p.full_f32[i] = sum_after[i].data_ptr<float>();
    } else if (layout.segment_rows == 1) {
      p.full[i] = grad->data_ptr();
    } else {
      p.reduced[i] = grad->data_ptr();
      p.reduced_segment_rows[i] = layout.segment_rows;
    }
  }
  return l;
}

// What the backward's kernels compute beyond the norm (kBackward*): the modulation, the gated
// pre-add, the weight and bias. The unmodulated norms' kernels take the weight whether or not it
// is there; gated_add has the gated pre-add alone.
int backward_features(const NormBackwardCall& c) {
  if (c.type == NormType::kNone) return kBackwardGated;
  if (c.scale == nullptr) return kBackwardAffine;
  const bool affine = c.weight != nullptr || c.bias != nullptr;
  return kBackwardMod | (c.gate != nullptr ? kBackwardGated : 0) | (affine ? kBackwardAffine : 0);
}

const NormBackwardVariant& find_variant(const NormBackwardCall& c, int features, bool whole_rows) {
  const NormBackwardVariant* variant =
      VariantRegistry<NormBackwardVariant>::find(std::make_tuple(c.type, features, whole_rows));
  TORCH_CHECK(variant != nullptr, c.op, ": unsupported norm/features combination");
  return *variant;
}

void check_served(const NormBackwardCall& c, const at::Tensor& x, cudaError_t err) {
  TORCH_CHECK(err != cudaErrorNotSupported, c.op, ": unsupported dtypes: x ", x.scalar_type(), ", weight ",
              c.weight != nullptr ? c.weight->scalar_type() : x.scalar_type(), ", grad_out ", c.dout->scalar_type());
  TORCH_CHECK(err == cudaSuccess, c.op, ": planning failed: ", cudaGetErrorString(err));
}

// The whole-row kernel of the call's (norm, features) where it takes the rows, else the chunked
// form of its norm (all features), which takes any layout. The variants are looked up before the
// meta return, so that an op's fake refuses a combination that has no kernel, as the kernel does.
void launch_norm_backward_call(const NormBackwardCall& c) {
  const at::Tensor& x = c.h != nullptr ? *c.h : *c.dout;
  const NormBackwardVariant& whole_rows = find_variant(c, backward_features(c), true);
  const NormBackwardVariant& chunked =
      find_variant(c, c.type == NormType::kNone ? kBackwardGated : kBackwardAllFeatures, false);
  if (validation_only(x)) return;
  const at::cuda::OptionalCUDAGuard device_guard(x.device());
  if (num_rows(x) == 0) {  // no rows: the reduced gradients are sums of nothing
    for (at::Tensor* g : c.grads)
      if (g != nullptr) g->zero_();
    return;
  }
  std::array<at::Tensor, kNumParamGrads> sum_after;
  NormBackwardLaunch l = backward_params(c, x, sum_after);
  const NormBackwardLaunch unplanned = l;
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  NormBackwardPlan plan;
  bool fits = false;
  check_served(c, x, whole_rows.plan(l, sm_count, &plan, &fits));
  const NormBackwardVariant* variant = &whole_rows;
  if (!fits) {
    l = unplanned;
    plan = NormBackwardPlan{};
    check_served(c, x, chunked.plan(l, sm_count, &plan, &fits));
    TORCH_CHECK(fits, c.op, ": no kernel for rows of ", c.dout->size(-1), " elements");
    variant = &chunked;
  }
  // Workspaces after the outputs (which the caller allocated first): freed after the launches,
  // the caching allocator reuses them only for later work on this stream.
  NormBackwardParams<void, void, void>& p = l.params;
  std::array<at::Tensor, kNumParamGrads> partials;
  for (int i = 0; i < kNumParamGrads; ++i) {
    if (p.reduced[i] == nullptr) continue;
    partials[i] = empty_tensor({plan.items, p.hidden}, x.options().dtype(at::kFloat));
    p.partials[i] = partials[i].data_ptr<float>();
  }
  at::Tensor chunk_stats;
  if (c.type != NormType::kNone && plan.chunked) {
    chunk_stats = empty_tensor({p.num_rows * p.chunks * ChunkStatFloats::kBackward}, x.options().dtype(at::kFloat));
    p.chunk_stats = chunk_stats.data_ptr<float>();
  }
  const cudaError_t err = variant->launch(l, plan, at::cuda::getCurrentCUDAStream());
  check_launch(c.op, err);
  const auto params = grad_params(c);
  for (int i = 0; i < kNumParamGrads; ++i)
    if (sum_after[i].defined()) c.grads[i]->copy_(sum_after[i].sum_to_size(params[i]->sizes()));
}

bool anything_asked(const NormBackwardCall& c) {
  bool any = c.dh != nullptr || c.dy != nullptr;
  for (const at::Tensor* g : c.grads) any = any || g != nullptr;
  return any;
}

// x_name: what the op calls x (the fused add's backward takes its residual_out).
std::tuple<at::Tensor, at::Tensor> rms_backward(const char* op, const at::Tensor& grad_out, const OptTensor& grad_h,
                                                const at::Tensor& x, const OptTensor& weight, double eps,
                                                std::array<bool, 2> mask, const char* x_name = "x") {
  check_row_input(op, x, x_name);
  check_norm_param(op, weight, "weight", x, x_name);
  check_eps(op, eps);
  // hf / diffusers with an fp32 weight output fp32; torch's rounding outputs x's dtype
  check_grad(op, grad_out, "grad_out", x, x.scalar_type(), weight ? weight->scalar_type() : x.scalar_type(), x_name);
  if (grad_h) check_grad(op, *grad_h, "grad_residual_out", x, x.scalar_type(), x.scalar_type(), x_name);
  at::Tensor dx = mask[0] ? empty_tensor(x.sizes(), x.options()) : not_asked(x);
  at::Tensor dw = grad_for(mask[1], ptr(weight), x);
  NormBackwardCall c{op, NormType::kRms, &grad_out, ptr(grad_h), &x, ptr(weight)};
  c.eps = eps;
  c.dh = mask[0] ? &dx : nullptr;
  c.grads[kGradWeight] = mask[1] && weight ? &dw : nullptr;
  if (anything_asked(c)) launch_norm_backward_call(c);
  return {dx, dw};
}

// The modulated norms' checks: x, the norm, its parameters, scale/shift broadcast to x. x_name: what
// the op calls x (the gated form's backward takes its h).
NormType check_modulated(const char* op, const at::Tensor& x, const at::Tensor& scale, const OptTensor& shift,
                         const OptTensor& weight, const OptTensor& bias, double eps, std::string_view norm,
                         const char* x_name = "x") {
  check_row_input(op, x, x_name);
  const NormType type = resolve_norm_type(op, norm);
  check_norm_param(op, weight, "weight", x, x_name);
  check_norm_param(op, bias, "bias", x, x_name);
  if (weight && bias)
    TORCH_CHECK_TYPE(weight->scalar_type() == bias->scalar_type(), op, ": weight and bias must have one dtype, got ",
                     weight->scalar_type(), " and ", bias->scalar_type());
  TORCH_CHECK_VALUE(type == NormType::kLayer || !bias, op, ": bias is only used with norm=\"layer\"");
  if (type == NormType::kRms && weight)
    TORCH_CHECK_TYPE(weight->scalar_type() == x.scalar_type(), op,
                     ": with norm=\"rms\" the weight must have x's dtype, got ", weight->scalar_type());
  check_broadcasts_to(op, scale, "scale", x, x_name);
  if (shift) check_broadcasts_to(op, *shift, "shift", x, x_name);
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
                      output_mask, "residual_out");
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
gated_add_norm_modulate_backward(const at::Tensor& grad_out, const OptTensor& grad_h, const at::Tensor& h,
                                 const at::Tensor& y, const OptTensor& gate, const at::Tensor& scale,
                                 const OptTensor& shift, const OptTensor& weight, const OptTensor& bias, double eps,
                                 std::string_view norm, std::array<bool, 7> output_mask) {
  constexpr const char* op = "gated_add_norm_modulate_backward";
  const NormType type = check_modulated(op, h, scale, shift, weight, bias, eps, norm, "h");
  check_grad(op, grad_out, "grad_out", h, h.scalar_type(), h.scalar_type(), "h");
  if (grad_h) check_grad(op, *grad_h, "grad_h", h, h.scalar_type(), h.scalar_type(), "h");
  check_same_as_x(op, y, "y", h, "h");
  if (gate) check_broadcasts_to(op, *gate, "gate", h, "h");
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
