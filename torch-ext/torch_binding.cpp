// Op schemas and their CUDA implementations. The namespace (TORCH_EXTENSION_NAME) carries a
// per-build id and is only known at build time; Python reaches the ops through `_ops.ops`.
// Every op has a functional form (allocates its outputs) and an out= form (`Tensor!` outputs first).
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceType.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "activation/ops.h"
#include "attention/ops.h"
#include "gemm/ops.h"
#include "group_norm/ops.h"
#include "loss/ops.h"
#include "norm/ops.h"
#include "qk_norm_rope/ops.h"
#include "quant/ops.h"
#include "registration.h"
#include "rope/ops.h"

namespace tk = transformer_kernels;

namespace {

// In-place and out= forms bump the version counter of every tensor they write, as aten's in-place
// ops do, so that autograd refuses a backward that would read a saved tensor one of them modified
// (instead of computing a gradient from the modified values). A boxed ADInplaceOrView kernel reads
// the written arguments from the schema's mutation annotations (torch's own fallback,
// autogradNotImplementedInplaceOrViewFallback, bumps mutable returns only; ours return nothing).
void bump_written_arguments(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_arguments = schema.arguments().size();
  const size_t first = stack->size() - num_arguments;
  std::vector<at::Tensor> written;  // the redispatch consumes the stack's arguments
  for (size_t i = 0; i < num_arguments; ++i) {
    const c10::IValue& argument = (*stack)[first + i];
    if (schema.is_mutable({c10::SchemaArgType::input, i}) && argument.isTensor()) {
      written.push_back(argument.toTensor());
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : written) torch::autograd::impl::bump_version(t);
}

// bump_written_arguments for each op of this namespace with a written argument.
void bump_versions_of_written_tensors(torch::Library& ops) {
  const std::string ns = STRINGIFY(TORCH_EXTENSION_NAME);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    const auto op_ns = name.getNamespace();
    if (!op_ns || *op_ns != ns) continue;
    const auto handle = dispatcher.findSchema(name);
    if (!handle || !handle->schema().is_mutable()) continue;
    const std::string op = name.name.substr(ns.size() + 2);  // "ns::op" -> "op"
    ops.impl(op.c_str(), torch::dispatch(c10::DispatchKey::ADInplaceOrView,
                                         torch::CppFunction::makeFromBoxedFunction<&bump_written_arguments>()));
  }
}

// Every op is registered for CPU too, with the same entry point: CPU tensors then fail with a
// clear "must be a CUDA tensor" instead of the dispatcher's "no kernel for CPU" (the cross-entropy
// also runs there, a reference path).
constexpr c10::DeviceType kKeys[] = {c10::kCUDA, c10::kCPU};

// One function per family (csrc/<family>/ops.h): its schemas, forward, out= and backward together,
// then its implementations.

// The norms, their FP8 outputs, gated_add, and their backward (csrc/norm).
void define_norm(torch::Library& ops) {
  // RMSNorm over the last dim; rounding "hf" | "diffusers" | "torch" picks the module to match.
  ops.def("rms_norm(Tensor x, Tensor? weight, float eps, str rounding) -> Tensor");
  ops.def("rms_norm_out(Tensor! out, Tensor x, Tensor? weight, float eps, str rounding) -> ()");
  // residual_out = x + residual; out = rms_norm(residual_out) (LLM decoder layers).
  ops.def("fused_add_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps, str rounding)"
          " -> (Tensor, Tensor)");
  ops.def("fused_add_rms_norm_out(Tensor! out, Tensor! residual_out, Tensor x, Tensor residual, Tensor? weight,"
          " float eps, str rounding) -> ()");
  // vLLM's in-place form: residual <- x + residual, x <- rms_norm(residual).
  ops.def("fused_add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor? weight, float eps, str rounding) -> ()");
  // LayerNorm over the last dim, computed in fp32 and rounded once (torch.nn.LayerNorm).
  ops.def("layer_norm(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor");
  ops.def("layer_norm_out(Tensor! out, Tensor x, Tensor? weight, Tensor? bias, float eps) -> ()");
  // AdaLN: norm(x) * (1 + scale) + shift, norm "rms" | "layer", with the eager rounding.
  ops.def("norm_modulate(Tensor x, Tensor scale, Tensor? shift, Tensor? weight, Tensor? bias, float eps, str norm)"
          " -> Tensor");
  ops.def("norm_modulate_out(Tensor! out, Tensor x, Tensor scale, Tensor? shift, Tensor? weight, Tensor? bias,"
          " float eps, str norm) -> ()");
  // DiT block: h = x + gate * y (x + y without a gate); out = norm(h) * (1 + scale) + shift; -> (out, h):
  // like fused_add_rms_norm, the normalized output first and the residual stream last.
  ops.def("gated_add_norm_modulate(Tensor x, Tensor y, Tensor? gate, Tensor scale, Tensor? shift, Tensor? weight,"
          " Tensor? bias, float eps, str norm) -> (Tensor, Tensor)");
  ops.def("gated_add_norm_modulate_out(Tensor! out, Tensor! h_out, Tensor x, Tensor y, Tensor? gate, Tensor scale,"
          " Tensor? shift, Tensor? weight, Tensor? bias, float eps, str norm) -> ()");
  // The same norms with an FP8 output: the output in x's dtype quantized per row as quantize_fp8 does
  // (codes float8_e4m3fn, scale [..., 1] float32) in the same pass: the next FP8 GEMM's input.
  ops.def("rms_norm_fp8(Tensor x, Tensor? weight, float eps, str rounding) -> (Tensor, Tensor)");
  ops.def("fused_add_rms_norm_fp8(Tensor x, Tensor residual, Tensor? weight, float eps, str rounding)"
          " -> (Tensor, Tensor, Tensor)");
  ops.def("layer_norm_fp8(Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor)");
  ops.def("norm_modulate_fp8(Tensor x, Tensor scale, Tensor? shift, Tensor? weight, Tensor? bias, float eps, str norm)"
          " -> (Tensor, Tensor)");
  ops.def("gated_add_norm_modulate_fp8(Tensor x, Tensor y, Tensor? gate, Tensor scale, Tensor? shift, Tensor? weight,"
          " Tensor? bias, float eps, str norm) -> (Tensor, Tensor, Tensor)");
  // DiT gated residual without a following norm: x + gate * y, gate broadcast.
  ops.def("gated_add(Tensor x, Tensor y, Tensor gate) -> Tensor");
  ops.def("gated_add_out(Tensor! out, Tensor x, Tensor y, Tensor gate) -> ()");
  // Backward: the forward's inputs (or its saved h), the output gradients and output_mask; the
  // gradients not asked for come back empty.
  ops.def("rms_norm_backward(Tensor grad_out, Tensor x, Tensor? weight, float eps, bool[2] output_mask)"
          " -> (Tensor, Tensor)");
  ops.def("fused_add_rms_norm_backward(Tensor grad_out, Tensor? grad_residual_out, Tensor residual_out,"
          " Tensor? weight, float eps, bool[2] output_mask) -> (Tensor, Tensor)");
  ops.def("layer_norm_backward(Tensor grad_out, Tensor x, Tensor? weight, Tensor? bias, float eps,"
          " bool[3] output_mask) -> (Tensor, Tensor, Tensor)");
  ops.def("norm_modulate_backward(Tensor grad_out, Tensor x, Tensor scale, Tensor? shift, Tensor? weight,"
          " Tensor? bias, float eps, str norm, bool[5] output_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  ops.def("gated_add_norm_modulate_backward(Tensor grad_out, Tensor? grad_h, Tensor h, Tensor y, Tensor? gate,"
          " Tensor scale, Tensor? shift, Tensor? weight, Tensor? bias, float eps, str norm, bool[7] output_mask)"
          " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  ops.def("gated_add_backward(Tensor grad_out, Tensor y, Tensor gate, bool[2] output_mask) -> (Tensor, Tensor)");
  for (const auto key : kKeys) {
    ops.impl("rms_norm", key, &tk::rms_norm);
    ops.impl("rms_norm_out", key, &tk::rms_norm_out);
    ops.impl("fused_add_rms_norm", key, &tk::fused_add_rms_norm);
    ops.impl("fused_add_rms_norm_out", key, &tk::fused_add_rms_norm_out);
    ops.impl("fused_add_rms_norm_", key, &tk::fused_add_rms_norm_inplace);
    ops.impl("layer_norm", key, &tk::layer_norm);
    ops.impl("layer_norm_out", key, &tk::layer_norm_out);
    ops.impl("norm_modulate", key, &tk::norm_modulate);
    ops.impl("norm_modulate_out", key, &tk::norm_modulate_out);
    ops.impl("gated_add_norm_modulate", key, &tk::gated_add_norm_modulate);
    ops.impl("gated_add_norm_modulate_out", key, &tk::gated_add_norm_modulate_out);
    ops.impl("rms_norm_fp8", key, &tk::rms_norm_fp8);
    ops.impl("fused_add_rms_norm_fp8", key, &tk::fused_add_rms_norm_fp8);
    ops.impl("layer_norm_fp8", key, &tk::layer_norm_fp8);
    ops.impl("norm_modulate_fp8", key, &tk::norm_modulate_fp8);
    ops.impl("gated_add_norm_modulate_fp8", key, &tk::gated_add_norm_modulate_fp8);
    ops.impl("gated_add", key, &tk::gated_add);
    ops.impl("gated_add_out", key, &tk::gated_add_out);
    ops.impl("rms_norm_backward", key, &tk::rms_norm_backward);
    ops.impl("fused_add_rms_norm_backward", key, &tk::fused_add_rms_norm_backward);
    ops.impl("layer_norm_backward", key, &tk::layer_norm_backward);
    ops.impl("norm_modulate_backward", key, &tk::norm_modulate_backward);
    ops.impl("gated_add_norm_modulate_backward", key, &tk::gated_add_norm_modulate_backward);
    ops.impl("gated_add_backward", key, &tk::gated_add_backward);
  }
}

// Activations and gated units, and their backward (csrc/activation).
void define_activation(torch::Library& ops) {
  // act(x), act "silu" | "gelu" | "gelu_tanh", as F.silu / F.gelu compute it.
  ops.def("activation(Tensor x, str activation) -> Tensor");
  ops.def("activation_out(Tensor! out, Tensor x, str activation) -> ()");
  // Gated linear unit on a concatenated projection [..., 2H] -> [..., H]: act(first) * second
  // (vLLM's silu_and_mul) or first * act(second) (diffusers' GEGLU order), rounding as eager.
  ops.def("act_and_mul(Tensor x, str activation, bool act_first) -> Tensor");
  ops.def("act_and_mul_out(Tensor! out, Tensor x, str activation, bool act_first) -> ()");
  // The same on two tensors: act(gate) * up (transformers' LlamaMLP).
  ops.def("act_mul(Tensor gate, Tensor up, str activation) -> Tensor");
  ops.def("act_mul_out(Tensor! out, Tensor gate, Tensor up, str activation) -> ()");
  // The gradients of act(x), act_and_mul(x) and act_mul(gate, up) given the output's gradient `grad`
  // (the activation recomputed from the saved input; eager autograd's rounding).
  ops.def("activation_backward(Tensor grad, Tensor x, str activation) -> Tensor");
  ops.def("act_and_mul_backward(Tensor grad, Tensor x, str activation, bool act_first) -> Tensor");
  ops.def("act_mul_backward(Tensor grad, Tensor gate, Tensor up, str activation) -> (Tensor, Tensor)");
  for (const auto key : kKeys) {
    ops.impl("activation", key, &tk::activation);
    ops.impl("activation_out", key, &tk::activation_out);
    ops.impl("act_and_mul", key, &tk::act_and_mul);
    ops.impl("act_and_mul_out", key, &tk::act_and_mul_out);
    ops.impl("act_mul", key, &tk::act_mul);
    ops.impl("act_mul_out", key, &tk::act_mul_out);
    ops.impl("activation_backward", key, &tk::activation_backward);
    ops.impl("act_and_mul_backward", key, &tk::act_and_mul_backward);
    ops.impl("act_mul_backward", key, &tk::act_mul_backward);
  }
}

// Rotary embeddings and their backward (csrc/rope).
void define_rope(torch::Library& ops) {
  // Rotary embeddings on q [B, S, Hq, d] and k [B, S, Hk, d] in one launch, out of place or in place.
  ops.def("rope(Tensor q, Tensor k, Tensor cos, Tensor sin, str style, bool fp32_math) -> (Tensor, Tensor)");
  ops.def("rope_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, str style, bool fp32_math) -> ()");
  // transformers' apply_rotary_pos_emb in its own layout (unsqueeze_dim 1: q [B, Hq, S, d]), out of
  // place or in place: `rope` with style "neox", per-op rounding, and the layout handled here.
  ops.def("hf_rope(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim) -> (Tensor, Tensor)");
  ops.def("hf_rope_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, int unsqueeze_dim) -> ()");
  // vLLM's form, in place: query [T, Hq*d], key [T, Hk*d], positions [T] into cos_sin_cache [P, R].
  ops.def("rope_cached_(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, Tensor cos_sin_cache, "
          "str style) -> ()");
  // LTX-Video's rotation (and its q/k norm + rotation) with cos/sin computed in the kernel from the
  // token coordinates grid [B or 1, S, 3] and freqs [C // 6] (fp32, as LTXVideoRotaryPosEmbed
  // computes them): the same bits as `rope` / `qk_norm_rope` with its fp32 tables. q, k [B, S, C].
  ops.def("ltx_rope_from_coords(Tensor q, Tensor k, Tensor grid, Tensor freqs) -> (Tensor, Tensor)");
  // The gradients of q and k of `rope` / `ltx_rope_from_coords`: the rotation by -theta (the forward
  // kernels with the sines transposed). The tables, grid and freqs get none.
  ops.def("rope_backward(Tensor grad_q, Tensor grad_k, Tensor cos, Tensor sin, str style, bool fp32_math) "
          "-> (Tensor, Tensor)");
  ops.def("ltx_rope_from_coords_backward(Tensor grad_q, Tensor grad_k, Tensor grid, Tensor freqs) -> (Tensor, Tensor)");
  for (const auto key : kKeys) {
    ops.impl("rope", key, &tk::rope);
    ops.impl("rope_", key, &tk::rope_);
    ops.impl("hf_rope", key, &tk::hf_rope);
    ops.impl("hf_rope_", key, &tk::hf_rope_);
    ops.impl("rope_cached_", key, &tk::rope_cached_);
    ops.impl("ltx_rope_from_coords", key, &tk::ltx_rope_from_coords);
    ops.impl("rope_backward", key, &tk::rope_backward);
    ops.impl("ltx_rope_from_coords_backward", key, &tk::ltx_rope_from_coords_backward);
  }
}

// Q/k norm + RoPE in one pass, and its backward (csrc/qk_norm_rope).
void define_qk_norm_rope(torch::Library& ops) {
  // RMSNorm (torch.nn.RMSNorm's rounding) of q [B, S, Gq, L] and k [B, S, Gk, L] over L, then
  // interleaved RoPE with fp32 tables: LTX-Video (G = 1, L = all heads) and Flux (per head).
  ops.def("qk_norm_rope(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps, Tensor cos, Tensor sin) "
          "-> (Tensor, Tensor)");
  // Qwen3's per-head q_norm/k_norm (Qwen3RMSNorm) then NeoX RoPE with model-dtype tables, rounded
  // as transformers' eager code: q [B, S, Hq, d], k [B, S, Hk, d] -> new [B, S, H, d] (or into q_out, k_out).
  ops.def("hf_qk_norm_rope(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps, Tensor cos, Tensor sin) "
          "-> (Tensor, Tensor)");
  ops.def("hf_qk_norm_rope_out(Tensor! q_out, Tensor! k_out, Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, "
          "float eps, Tensor cos, Tensor sin) -> ()");
  ops.def("ltx_qk_norm_rope_from_coords(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps, "
          "Tensor grid, Tensor freqs) -> (Tensor, Tensor)");
  ops.def("qk_norm_rope_backward(Tensor grad_q_out, Tensor grad_k_out, Tensor q, Tensor k, Tensor q_weight,"
          " Tensor k_weight, float eps, Tensor cos, Tensor sin, bool[4] output_mask)"
          " -> (Tensor, Tensor, Tensor, Tensor)");
  ops.def("hf_qk_norm_rope_backward(Tensor grad_q_out, Tensor grad_k_out, Tensor q, Tensor k, Tensor q_weight,"
          " Tensor k_weight, float eps, Tensor cos, Tensor sin, bool[4] output_mask)"
          " -> (Tensor, Tensor, Tensor, Tensor)");
  ops.def("ltx_qk_norm_rope_from_coords_backward(Tensor grad_q_out, Tensor grad_k_out, Tensor q, Tensor k,"
          " Tensor q_weight, Tensor k_weight, float eps, Tensor grid, Tensor freqs, bool[4] output_mask)"
          " -> (Tensor, Tensor, Tensor, Tensor)");
  for (const auto key : kKeys) {
    ops.impl("qk_norm_rope", key, &tk::qk_norm_rope);
    ops.impl("hf_qk_norm_rope", key, &tk::hf_qk_norm_rope);
    ops.impl("hf_qk_norm_rope_out", key, &tk::hf_qk_norm_rope_out);
    ops.impl("ltx_qk_norm_rope_from_coords", key, &tk::ltx_qk_norm_rope_from_coords);
    ops.impl("qk_norm_rope_backward", key, &tk::qk_norm_rope_backward);
    ops.impl("hf_qk_norm_rope_backward", key, &tk::hf_qk_norm_rope_backward);
    ops.impl("ltx_qk_norm_rope_from_coords_backward", key, &tk::ltx_qk_norm_rope_from_coords_backward);
  }
}

// GEMMs with fused epilogues (csrc/gemm).
void define_gemm(torch::Library& ops) {
  // gelu_tanh(x @ weight^T + bias) as one cuBLASLt matmul with the GELU epilogue (the activation on
  // the fp32 accumulator, one rounding); F.linear + our gelu kernel where cuBLASLt has no such algorithm.
  ops.def("linear_gelu(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  ops.def("linear_gelu_out(Tensor! out, Tensor x, Tensor weight, Tensor? bias) -> ()");
  // Whether linear_gelu takes the epilogue for these arguments on this GPU (a host query).
  ops.def("linear_gelu_fused(Tensor x, Tensor weight, Tensor? bias) -> bool");
  // The FP8 linear: act((x * x_scale) @ (weight * weight_scale)^T + bias) as one cuBLASLt FP8 matmul, x and
  // weight float8_e4m3fn with per-row and per-output-channel float32 scales (quantize_fp8's), act "none" | "gelu_tanh".
  ops.def("linear_fp8(Tensor x, Tensor x_scale, Tensor weight, Tensor weight_scale, Tensor? bias, ScalarType out_dtype, "
          "str activation) -> Tensor");
  // The linear layer of decode steps (at most 8 rows): x @ (weight * weight_scale)^T + bias, the weight in x's
  // dtype or float8_e4m3fn with a float32 scale per output channel (weight-only FP8), streamed once.
  ops.def("decode_linear(Tensor x, Tensor weight, Tensor? weight_scale, Tensor? bias) -> Tensor");
  for (const auto key : kKeys) {
    ops.impl("linear_gelu", key, &tk::linear_gelu);
    ops.impl("linear_gelu_out", key, &tk::linear_gelu_out);
    ops.impl("linear_gelu_fused", key, &tk::linear_gelu_fused);
    ops.impl("linear_fp8", key, &tk::linear_fp8);
    ops.impl("decode_linear", key, &tk::decode_linear);
  }
}

// GroupNorm (+ SiLU) (csrc/group_norm).
void define_group_norm(torch::Library& ops) {
  // GroupNorm of x [N, C, *spatial] (channels-first or channels-last, kept), as F.group_norm computes it
  // on CUDA, with activation "none" | "silu" applied to the rounded result; add_group_norm normalizes
  // x + bias_nc (bias_nc [N or 1, C(, 1, ...)]: ResnetBlock2D's time embedding) and returns only the norm.
  ops.def("group_norm(Tensor x, int num_groups, Tensor? weight, Tensor? bias, float eps, str activation) -> Tensor");
  ops.def("group_norm_out(Tensor! out, Tensor x, int num_groups, Tensor? weight, Tensor? bias, float eps, "
          "str activation) -> ()");
  ops.def("add_group_norm(Tensor x, Tensor bias_nc, int num_groups, Tensor? weight, Tensor? bias, float eps, "
          "str activation) -> Tensor");
  ops.def("add_group_norm_out(Tensor! out, Tensor x, Tensor bias_nc, int num_groups, Tensor? weight, Tensor? bias, "
          "float eps, str activation) -> ()");
  // The backward of both (bias_nc None for group_norm): the forward's inputs, grad_out in x's shape and
  // layout; -> (grad_x, grad_bias_nc, grad_weight, grad_bias), those output_mask asks for (else empty).
  ops.def("group_norm_backward(Tensor grad_out, Tensor x, Tensor? bias_nc, int num_groups, Tensor? weight, "
          "Tensor? bias, float eps, str activation, bool[4] output_mask) -> (Tensor, Tensor, Tensor, Tensor)");
  for (const auto key : kKeys) {
    ops.impl("group_norm", key, &tk::group_norm);
    ops.impl("group_norm_out", key, &tk::group_norm_out);
    ops.impl("add_group_norm", key, &tk::add_group_norm);
    ops.impl("add_group_norm_out", key, &tk::add_group_norm_out);
    ops.impl("group_norm_backward", key, &tk::group_norm_backward);
  }
}

// The fused linear cross-entropy and its backward (csrc/loss).
void define_loss(torch::Library& ops) {
  // cross_entropy(hidden [N, H] @ weight [V, H]^T (+ bias), target [N]) chunk by chunk over the tokens,
  // never holding [N, V] logits; reduction "mean" | "sum" | "none"; soft-capping cap * tanh(z / cap).
  // -> (loss, grad_hidden, grad_weight, grad_bias): the gradients compute_grads asks for (dloss = 1),
  // computed in the same pass (empty [0] tensors otherwise; never with reduction "none").
  ops.def("fused_linear_cross_entropy(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, int ignore_index, "
          "str reduction, float label_smoothing, float? softcap, bool[3] compute_grads, int chunk_rows) "
          "-> (Tensor, Tensor, Tensor, Tensor)");
  // The same gradients for an incoming grad_loss (a scalar, or [N] for "none"), the logits recomputed.
  ops.def("fused_linear_cross_entropy_backward(Tensor grad_loss, Tensor hidden, Tensor weight, Tensor target, "
          "Tensor? bias, int ignore_index, str reduction, float label_smoothing, float? softcap, bool[3] compute_grads, "
          "int chunk_rows) -> (Tensor, Tensor, Tensor)");
  for (const auto key : kKeys) {
    ops.impl("fused_linear_cross_entropy", key, &tk::fused_linear_cross_entropy);
    ops.impl("fused_linear_cross_entropy_backward", key, &tk::fused_linear_cross_entropy_backward);
  }
}

// Per-row FP8 quantization (csrc/quant).
void define_quant(torch::Library& ops) {
  // Per-row dynamic FP8 (e4m3) quantization: x ~ codes * scale, scale [..., 1] float32 (amax / 448).
  ops.def("quantize_fp8(Tensor x) -> (Tensor, Tensor)");
  // quantize_fp8(act_mul(gate, up, act)) in one pass: a gated MLP's down-projection input in FP8.
  ops.def("act_mul_fp8(Tensor gate, Tensor up, str activation) -> (Tensor, Tensor)");
  for (const auto key : kKeys) {
    ops.impl("quantize_fp8", key, &tk::quantize_fp8);
    ops.impl("act_mul_fp8", key, &tk::act_mul_fp8);
  }
}

// Attention with 8-bit products (csrc/attention).
void define_attention(torch::Library& ops) {
  // Non-causal softmax(q kᵀ · scale) v: q·kᵀ in INT8 after smoothing k, p·v in FP8, softmax in fp32.
  ops.def("attention_8bit(Tensor q, Tensor k, Tensor v, float? scale=None) -> Tensor");
  for (const auto key : kKeys) {
    ops.impl("attention_8bit", key, &tk::attention_8bit);
  }
}
}  // namespace

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  define_norm(ops);
  define_activation(ops);
  define_rope(ops);
  define_qk_norm_rope(ops);
  define_gemm(ops);
  define_group_norm(ops);
  define_loss(ops);
  define_quant(ops);
  define_attention(ops);
  bump_versions_of_written_tensors(ops);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
