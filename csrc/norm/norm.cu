// Torch entry points of the normalization family: validate, allocate, and hand the launch to the
// launcher of its fused variant (compiled in instances/, on the current stream of x's device).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>
#include <string_view>
#include <tuple>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/dispatch.h"
#include "common/fp8.cuh"
#include "norm/norm_call.h"
#include "norm/norm_choices.h"
#include "norm/ops.h"

namespace transformer_kernels {
namespace {

using norm_binding::NormCall;
using norm_binding::OptTensor;

// Output dtype and pre-weight rounding of RMSNorm for each module's rounding.
struct RmsRounding {
  bool round_normalized;
  c10::ScalarType out_dtype;
};

RmsRounding resolve_rms_rounding(const char* op, std::string_view rounding, const at::Tensor& x,
                                 const OptTensor& weight) {
  const c10::ScalarType weight_dtype = weight ? weight->scalar_type() : x.scalar_type();
  if (rounding == "hf") return {true, weight_dtype};
  if (rounding == "diffusers") return {weight_dtype == x.scalar_type(), weight_dtype};
  if (rounding == "torch") return {false, x.scalar_type()};
  TORCH_CHECK_VALUE(false, op, ": rounding must be \"hf\", \"diffusers\" or \"torch\", got \"", rounding, "\"");
}

void check_same_param_dtype(const char* op, const OptTensor& weight, const OptTensor& bias) {
  if (weight && bias)
    TORCH_CHECK_TYPE(weight->scalar_type() == bias->scalar_type(), op, ": weight and bias must have one dtype, got ",
                     weight->scalar_type(), " and ", bias->scalar_type());
}

// The tensor of an optional argument, or null.
const at::Tensor* ptr(const OptTensor& t) { return t ? &*t : nullptr; }

// An output the caller passed: x's shape, `dtype`, and no memory shared with any of the call's inputs.
void check_output(const NormCall& c, const at::Tensor& out, const char* name, c10::ScalarType dtype) {
  transformer_kernels::check_output(
      c.op, out, name, *c.x, c.x->sizes(), dtype,
      {{c.x, "x"}, {c.residual, c.pre == PreAdd::kGated ? "y" : "residual"}, {c.gate, "gate"},
       {c.weight, "weight"}, {c.bias, "bias"}, {c.scale, "scale"}, {c.shift, "shift"}});
}

// The launch's parameters, pointers type-erased (the launchers in instances/ give them types).
NormLaunch launch_params(const NormCall& c) {
  const at::Tensor& x = *c.x;
  NormLaunch l;
  l.x_type = float_type(x.scalar_type(), "x");
  const at::Tensor* param = c.weight ? c.weight : c.bias;  // weight and bias share one dtype (checked)
  l.weight_type = param ? float_type(param->scalar_type(), "weight") : l.x_type;
  l.out_type = c.out_scale ? l.x_type : float_type(c.out->scalar_type(), "out");
  NormParams<void, void, void>& p = l.params;
  p.x = x.const_data_ptr();
  p.x_rows = row_indexer(c.op, x, "x");
  if (c.residual) {
    p.residual = c.residual->const_data_ptr();
    p.residual_rows = row_indexer(c.op, *c.residual, c.pre == PreAdd::kGated ? "y" : "residual");
  }
  if (c.gate) {
    p.gate = c.gate->const_data_ptr();
    p.gate_rows = broadcast_row_indexer(c.op, *c.gate, "gate", x);
  }
  if (c.weight) p.weight = c.weight->const_data_ptr();
  if (c.bias) p.bias = c.bias->const_data_ptr();
  if (c.scale) {
    p.scale = c.scale->const_data_ptr();
    p.scale_rows = broadcast_row_indexer(c.op, *c.scale, "scale", x);
  }
  if (c.shift) {
    p.shift = c.shift->const_data_ptr();
    p.shift_rows = broadcast_row_indexer(c.op, *c.shift, "shift", x);
  }
  p.out = c.out->data_ptr();
  p.out_rows = row_indexer(c.op, *c.out, "out");
  if (c.h_out) {
    p.h_out = c.h_out->data_ptr();
    p.h_rows = row_indexer(c.op, *c.h_out, "h_out");
  }
  p.num_rows = num_rows(x);
  p.hidden = x.size(-1);
  p.eps = static_cast<float>(c.eps);
  p.round_normalized = c.round_normalized;
  if (c.out_scale) p.out_scale = c.out_scale->data_ptr<float>();
  return l;
}

// The dtypes dispatch_dtypes instantiates: the output (and h_out) in x's dtype, or float32 from an
// unmodulated RMSNorm with a float32 weight, or e4m3 codes with float32 row scales (an FP8 output);
// weight and bias in one dtype. The ops' checks ensure this; checked again here so that a new caller
// gets an error, not a skipped or misread launch.
void check_instantiated_dtypes(const NormCall& c) {
  const c10::ScalarType x_dtype = c.x->scalar_type(), out_dtype = c.out->scalar_type();
  const at::Tensor* weight = c.weight;
  const at::Tensor* bias = c.bias;
  const bool fp32_weight = (weight && weight->scalar_type() == at::kFloat) || (bias && bias->scalar_type() == at::kFloat);
  const bool fp32_out_ok = c.type == NormType::kRms && c.scale == nullptr && fp32_weight;
  if (c.out_scale) {
    TORCH_CHECK(out_dtype == at::kFloat8_e4m3fn && c.out_scale->scalar_type() == at::kFloat &&
                    c.out_scale->is_contiguous() && c.out_scale->sizes() == at::IntArrayRef(row_scale_sizes(*c.x)),
                c.op, ": an FP8 output is float8_e4m3fn codes with a contiguous float32 scale per row");
  } else {
    TORCH_CHECK(out_dtype == x_dtype || (out_dtype == at::kFloat && fp32_out_ok), c.op,
                ": no kernel for x of dtype ", x_dtype, " with out of dtype ", out_dtype);
  }
  TORCH_CHECK(c.h_out == nullptr || c.h_out->scalar_type() == x_dtype, c.op, ": no kernel for x of dtype ", x_dtype,
              " with h_out of dtype ", c.h_out->scalar_type());
  TORCH_CHECK(!weight || !bias || weight->scalar_type() == bias->scalar_type(), c.op,
              ": no kernel for a weight and a bias of different dtypes");
}

// Launches c with its variant's launcher. A few very wide rows are split across blocks, with a
// workspace for their chunks' statistics (freed after the launches: the caching allocator reuses it
// only for later work on this stream). The modulated norms do not split rows (norm.cuh), nor do FP8
// outputs (a row's scale is over the whole row). Rows of no elements get the FP8 floor's scale, as
// quantize_fp8 gives them (the kernel has no element to launch for).
void run(const NormCall& c, const NormVariant& variant) {
  NormLaunch l = launch_params(c);
  NormParams<void, void, void>& p = l.params;
  const bool modulated = std::get<2>(variant.key), fp8_out = std::get<3>(variant.key);
  if (fp8_out && p.hidden == 0) c.out_scale->fill_(kFp8AmaxFloor / kFp8E4m3Max);
  at::Tensor split_stats;
  if (!modulated && !fp8_out)
    p.split_chunks = norm_split_chunks(p.num_rows, p.hidden, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  if (p.split_chunks > 1) {
    split_stats = empty_tensor({p.num_rows * p.split_chunks * ChunkStatFloats::kForward}, c.x->options().dtype(at::kFloat));
    p.split_stats = split_stats.data_ptr<float>();
    p.split_chunk_elems = NormPolicy::kSplitChunkElems;
  }
  const cudaError_t err = variant.launch(l, at::cuda::getCurrentCUDAStream());
  check_launch(c.op, err);
}

// The combination's compiled variant (instances/) is looked up before the meta return, so that an
// op's fake refuses a combination that has no kernel, as the kernel does.
void launch_norm_call(const NormCall& c) {
  check_instantiated_dtypes(c);
  const NormVariant* variant = VariantRegistry<NormVariant>::find(
      std::make_tuple(c.type, c.pre, c.scale != nullptr, c.out_scale != nullptr));
  TORCH_CHECK(variant != nullptr, c.op, ": unsupported norm/pre-add/modulation/FP8 output combination");
  if (validation_only(*c.x)) return;
  const at::cuda::OptionalCUDAGuard device_guard(c.x->device());
  run(c, *variant);
}

at::Tensor empty_like_rows(const at::Tensor& x, c10::ScalarType dtype) {
  return empty_tensor(x.sizes(), x.options().dtype(dtype));
}

// ---- each op's launch ----

NormCall rms_norm_call(const char* op, const at::Tensor& x, const OptTensor& weight, double eps,
                       const RmsRounding& r, at::Tensor& out) {
  NormCall c(op, NormType::kRms, x, out, eps);
  c.weight = ptr(weight);
  c.round_normalized = r.round_normalized;
  return c;
}

// h = x + residual into h_out (the new residual), out = RMSNorm(h).
NormCall fused_add_rms_norm_call(const char* op, const at::Tensor& x, const at::Tensor& residual,
                                 const OptTensor& weight, double eps, const RmsRounding& r, at::Tensor& out,
                                 at::Tensor& h_out) {
  NormCall c(op, NormType::kRms, x, out, eps);
  c.pre = PreAdd::kResidual;
  c.residual = &residual;
  c.weight = ptr(weight);
  c.h_out = &h_out;
  c.round_normalized = r.round_normalized;
  return c;
}

NormCall layer_norm_call(const char* op, const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                         double eps, at::Tensor& out) {
  NormCall c(op, NormType::kLayer, x, out, eps);
  c.weight = ptr(weight);
  c.bias = ptr(bias);
  return c;
}

// norm(x) * (1 + scale) + shift; the norm's output is rounded to x's dtype first.
NormCall modulated_call(const char* op, NormType type, const at::Tensor& x, const at::Tensor& scale,
                        const OptTensor& shift, const OptTensor& weight, const OptTensor& bias, double eps,
                        at::Tensor& out) {
  NormCall c(op, type, x, out, eps);
  c.weight = ptr(weight);
  c.bias = ptr(bias);
  c.scale = &scale;
  c.shift = ptr(shift);
  c.round_normalized = true;
  return c;
}

// h = x + gate * y (or x + y) into h_out, then the modulated norm of h.
NormCall gated_call(const char* op, NormType type, const at::Tensor& x, const at::Tensor& y, const OptTensor& gate,
                    const at::Tensor& scale, const OptTensor& shift, const OptTensor& weight, const OptTensor& bias,
                    double eps, at::Tensor& out, at::Tensor& h_out) {
  NormCall c = modulated_call(op, type, x, scale, shift, weight, bias, eps, out);
  c.pre = gate ? PreAdd::kGated : PreAdd::kResidual;
  c.residual = &y;
  c.gate = ptr(gate);
  c.h_out = &h_out;
  return c;
}

// ---- rms_norm ----

RmsRounding check_rms_norm(const char* op, const at::Tensor& x, const OptTensor& weight, double eps,
                           std::string_view rounding) {
  check_row_input(op, x, "x");
  check_norm_param(op, weight, "weight", x);
  check_eps(op, eps);
  return resolve_rms_rounding(op, rounding, x, weight);
}

// ---- modulated norms: the norm's own output must be in x's dtype before the modulation ----

NormType check_modulated(const char* op, const at::Tensor& x, const at::Tensor& scale, const OptTensor& shift,
                         const OptTensor& weight, const OptTensor& bias, double eps, std::string_view norm) {
  check_row_input(op, x, "x");
  const NormType type = resolve_norm_type(op, norm);
  check_norm_param(op, weight, "weight", x);
  check_norm_param(op, bias, "bias", x);
  check_same_param_dtype(op, weight, bias);
  TORCH_CHECK_VALUE(type == NormType::kLayer || !bias, op, ": bias is only used with norm=\"layer\"");
  if (type == NormType::kRms && weight)
    TORCH_CHECK_TYPE(weight->scalar_type() == x.scalar_type(), op,
                     ": with norm=\"rms\" the weight must have x's dtype (the modulation follows diffusers' RMSNorm,"
                     " whose output takes an fp32 weight's dtype), got ", weight->scalar_type());
  check_broadcasts_to(op, scale, "scale", x);
  if (shift) check_broadcasts_to(op, *shift, "shift", x);
  check_eps(op, eps);
  return type;
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const OptTensor& weight, double eps, std::string_view rounding) {
  const RmsRounding r = check_rms_norm("rms_norm", x, weight, eps, rounding);
  at::Tensor out = empty_like_rows(x, r.out_dtype);
  launch_norm_call(rms_norm_call("rms_norm", x, weight, eps, r, out));
  return out;
}

void rms_norm_out(at::Tensor& out, const at::Tensor& x, const OptTensor& weight, double eps,
                  std::string_view rounding) {
  const RmsRounding r = check_rms_norm("rms_norm", x, weight, eps, rounding);
  const NormCall c = rms_norm_call("rms_norm", x, weight, eps, r, out);
  check_output(c, out, "out", r.out_dtype);
  launch_norm_call(c);
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                      const OptTensor& weight, double eps, std::string_view rounding) {
  constexpr const char* op = "fused_add_rms_norm";
  const RmsRounding r = check_rms_norm(op, x, weight, eps, rounding);
  check_same_as_x(op, residual, "residual", x);
  at::Tensor out = empty_like_rows(x, r.out_dtype);
  at::Tensor h = empty_like_rows(x, x.scalar_type());
  launch_norm_call(fused_add_rms_norm_call(op, x, residual, weight, eps, r, out, h));
  return {out, h};
}

void fused_add_rms_norm_out(at::Tensor& out, at::Tensor& residual_out, const at::Tensor& x,
                            const at::Tensor& residual, const OptTensor& weight, double eps,
                            std::string_view rounding) {
  constexpr const char* op = "fused_add_rms_norm";
  const RmsRounding r = check_rms_norm(op, x, weight, eps, rounding);
  check_same_as_x(op, residual, "residual", x);
  const NormCall c = fused_add_rms_norm_call(op, x, residual, weight, eps, r, out, residual_out);
  check_output(c, out, "out", r.out_dtype);
  check_output(c, residual_out, "residual_out", x.scalar_type());
  check_no_overlap(op, out, "out", residual_out, "residual_out");
  launch_norm_call(c);
}

void fused_add_rms_norm_inplace(at::Tensor& x, at::Tensor& residual, const OptTensor& weight, double eps,
                                std::string_view rounding) {
  constexpr const char* op = "fused_add_rms_norm_";
  const RmsRounding r = check_rms_norm(op, x, weight, eps, rounding);
  check_same_as_x(op, residual, "residual", x);
  TORCH_CHECK_TYPE(r.out_dtype == x.scalar_type(), op,
                   ": in place, the output overwrites x, so it must have x's dtype; with this weight and rounding it "
                   "would be ", r.out_dtype);
  // Each element is read and written by the same thread, so exact aliasing is safe; partial
  // overlap, or x and residual sharing memory, is not.
  check_writable_output(op, x, "x");
  check_writable_output(op, residual, "residual");
  check_no_overlap(op, x, "x", residual, "residual");
  if (weight) check_no_overlap(op, x, "x", *weight, "weight");
  if (weight) check_no_overlap(op, residual, "residual", *weight, "weight");
  launch_norm_call(fused_add_rms_norm_call(op, x, residual, weight, eps, r, x, residual));
}

// ---- layer_norm ----

namespace {
void check_layer_norm(const char* op, const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                      double eps) {
  check_row_input(op, x, "x");
  check_norm_param(op, weight, "weight", x);
  check_norm_param(op, bias, "bias", x);
  check_same_param_dtype(op, weight, bias);
  check_eps(op, eps);
}
}  // namespace

at::Tensor layer_norm(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias, double eps) {
  check_layer_norm("layer_norm", x, weight, bias, eps);
  at::Tensor out = empty_like_rows(x, x.scalar_type());
  launch_norm_call(layer_norm_call("layer_norm", x, weight, bias, eps, out));
  return out;
}

void layer_norm_out(at::Tensor& out, const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                    double eps) {
  check_layer_norm("layer_norm", x, weight, bias, eps);
  const NormCall c = layer_norm_call("layer_norm", x, weight, bias, eps, out);
  check_output(c, out, "out", x.scalar_type());
  launch_norm_call(c);
}

// ---- AdaLN: norm(x) * (1 + scale) + shift ----

at::Tensor norm_modulate(const at::Tensor& x, const at::Tensor& scale, const OptTensor& shift,
                         const OptTensor& weight, const OptTensor& bias, double eps, std::string_view norm) {
  constexpr const char* op = "norm_modulate";
  const NormType type = check_modulated(op, x, scale, shift, weight, bias, eps, norm);
  at::Tensor out = empty_like_rows(x, x.scalar_type());
  launch_norm_call(modulated_call(op, type, x, scale, shift, weight, bias, eps, out));
  return out;
}

void norm_modulate_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& scale, const OptTensor& shift,
                       const OptTensor& weight, const OptTensor& bias, double eps, std::string_view norm) {
  constexpr const char* op = "norm_modulate";
  const NormType type = check_modulated(op, x, scale, shift, weight, bias, eps, norm);
  const NormCall c = modulated_call(op, type, x, scale, shift, weight, bias, eps, out);
  check_output(c, out, "out", x.scalar_type());
  launch_norm_call(c);
}

// ---- (gated) residual + AdaLN: h = x + gate * y (or x + y); out = norm(h) * (1 + scale) + shift ----

namespace {
void check_gated(const char* op, const at::Tensor& x, const at::Tensor& y, const OptTensor& gate) {
  check_same_as_x(op, y, "y", x);
  if (gate) check_broadcasts_to(op, *gate, "gate", x);
}
}  // namespace

std::tuple<at::Tensor, at::Tensor> gated_add_norm_modulate(const at::Tensor& x, const at::Tensor& y,
                                                           const OptTensor& gate, const at::Tensor& scale,
                                                           const OptTensor& shift, const OptTensor& weight,
                                                           const OptTensor& bias, double eps, std::string_view norm) {
  constexpr const char* op = "gated_add_norm_modulate";
  const NormType type = check_modulated(op, x, scale, shift, weight, bias, eps, norm);
  check_gated(op, x, y, gate);
  at::Tensor h = empty_like_rows(x, x.scalar_type());
  at::Tensor out = empty_like_rows(x, x.scalar_type());
  launch_norm_call(gated_call(op, type, x, y, gate, scale, shift, weight, bias, eps, out, h));
  return {out, h};
}

void gated_add_norm_modulate_out(at::Tensor& out, at::Tensor& h_out, const at::Tensor& x, const at::Tensor& y,
                                 const OptTensor& gate, const at::Tensor& scale, const OptTensor& shift,
                                 const OptTensor& weight, const OptTensor& bias, double eps, std::string_view norm) {
  constexpr const char* op = "gated_add_norm_modulate";
  const NormType type = check_modulated(op, x, scale, shift, weight, bias, eps, norm);
  check_gated(op, x, y, gate);
  const NormCall c = gated_call(op, type, x, y, gate, scale, shift, weight, bias, eps, out, h_out);
  check_output(c, out, "out", x.scalar_type());
  check_output(c, h_out, "h_out", x.scalar_type());
  check_no_overlap(op, out, "out", h_out, "h_out");
  launch_norm_call(c);
}

// ---- FP8 outputs: the op's output in x's dtype, quantized per row (quantize_fp8's codes and scales) ----

namespace {
using Fp8Rows = std::tuple<at::Tensor, at::Tensor>;

// The codes [..., H] and row scales [..., 1] of x's rows.
Fp8Rows empty_fp8_rows(const at::Tensor& x) {
  return {empty_like_rows(x, at::kFloat8_e4m3fn), empty_row_scales(x)};
}

// c (its `out` the codes of `rows`) with the row scales of `rows`, launched.
void launch_fp8(NormCall c, Fp8Rows& rows) {
  c.out_scale = &std::get<1>(rows);
  launch_norm_call(c);
}
}  // namespace

std::tuple<at::Tensor, at::Tensor> rms_norm_fp8(const at::Tensor& x, const OptTensor& weight, double eps,
                                                std::string_view rounding) {
  constexpr const char* op = "rms_norm_fp8";
  const RmsRounding r = check_rms_norm(op, x, weight, eps, rounding);
  Fp8Rows rows = empty_fp8_rows(x);
  launch_fp8(rms_norm_call(op, x, weight, eps, r, std::get<0>(rows)), rows);
  return rows;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_fp8(const at::Tensor& x, const at::Tensor& residual,
                                                                      const OptTensor& weight, double eps,
                                                                      std::string_view rounding) {
  constexpr const char* op = "fused_add_rms_norm_fp8";
  const RmsRounding r = check_rms_norm(op, x, weight, eps, rounding);
  check_same_as_x(op, residual, "residual", x);
  Fp8Rows rows = empty_fp8_rows(x);
  at::Tensor h = empty_like_rows(x, x.scalar_type());
  launch_fp8(fused_add_rms_norm_call(op, x, residual, weight, eps, r, std::get<0>(rows), h), rows);
  return {std::get<0>(rows), std::get<1>(rows), h};
}

std::tuple<at::Tensor, at::Tensor> layer_norm_fp8(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                                                  double eps) {
  constexpr const char* op = "layer_norm_fp8";
  check_layer_norm(op, x, weight, bias, eps);
  Fp8Rows rows = empty_fp8_rows(x);
  launch_fp8(layer_norm_call(op, x, weight, bias, eps, std::get<0>(rows)), rows);
  return rows;
}

std::tuple<at::Tensor, at::Tensor> norm_modulate_fp8(const at::Tensor& x, const at::Tensor& scale,
                                                     const OptTensor& shift, const OptTensor& weight,
                                                     const OptTensor& bias, double eps, std::string_view norm) {
  constexpr const char* op = "norm_modulate_fp8";
  const NormType type = check_modulated(op, x, scale, shift, weight, bias, eps, norm);
  Fp8Rows rows = empty_fp8_rows(x);
  launch_fp8(modulated_call(op, type, x, scale, shift, weight, bias, eps, std::get<0>(rows)), rows);
  return rows;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_add_norm_modulate_fp8(
    const at::Tensor& x, const at::Tensor& y, const OptTensor& gate, const at::Tensor& scale, const OptTensor& shift,
    const OptTensor& weight, const OptTensor& bias, double eps, std::string_view norm) {
  constexpr const char* op = "gated_add_norm_modulate_fp8";
  const NormType type = check_modulated(op, x, scale, shift, weight, bias, eps, norm);
  check_gated(op, x, y, gate);
  Fp8Rows rows = empty_fp8_rows(x);
  at::Tensor h = empty_like_rows(x, x.scalar_type());
  launch_fp8(gated_call(op, type, x, y, gate, scale, shift, weight, bias, eps, std::get<0>(rows), h), rows);
  return {std::get<0>(rows), std::get<1>(rows), h};
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&rms_norm, &rms_norm_out, &fused_add_rms_norm,
    &fused_add_rms_norm_out, &fused_add_rms_norm_inplace, &layer_norm, &layer_norm_out, &norm_modulate,
    &norm_modulate_out, &gated_add_norm_modulate, &gated_add_norm_modulate_out, &rms_norm_fp8,
    &fused_add_rms_norm_fp8, &layer_norm_fp8, &norm_modulate_fp8, &gated_add_norm_modulate_fp8);

}  // namespace transformer_kernels
