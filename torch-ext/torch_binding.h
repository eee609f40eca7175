// Declarations of every op entry point registered in torch_binding.cpp. The definitions live
// in csrc/<family>/<family>.cu, one file per op family. Shapes: x [..., hidden]; weight and bias
// [hidden]; residual, y, out, h_out like x; scale, shift, gate broadcast to x's shape.
#pragma once

#include <torch/torch.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

namespace transformer_kernels {

using OptTensor = std::optional<torch::Tensor>;

// ---- norm family (csrc/norm/norm.cu) ----
torch::Tensor rms_norm(const torch::Tensor& x, const OptTensor& weight, double eps, std::string_view rounding);
void rms_norm_out(torch::Tensor& out, const torch::Tensor& x, const OptTensor& weight, double eps,
                  std::string_view rounding);

std::tuple<torch::Tensor, torch::Tensor> fused_add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                                            const OptTensor& weight, double eps,
                                                            std::string_view rounding);
void fused_add_rms_norm_out(torch::Tensor& out, torch::Tensor& residual_out, const torch::Tensor& x,
                            const torch::Tensor& residual, const OptTensor& weight, double eps,
                            std::string_view rounding);
void fused_add_rms_norm_inplace(torch::Tensor& x, torch::Tensor& residual, const OptTensor& weight, double eps,
                                std::string_view rounding);

torch::Tensor layer_norm(const torch::Tensor& x, const OptTensor& weight, const OptTensor& bias, double eps);
void layer_norm_out(torch::Tensor& out, const torch::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                    double eps);

torch::Tensor norm_modulate(const torch::Tensor& x, const torch::Tensor& scale, const OptTensor& shift,
                            const OptTensor& weight, const OptTensor& bias, double eps, std::string_view norm);
void norm_modulate_out(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& scale, const OptTensor& shift,
                       const OptTensor& weight, const OptTensor& bias, double eps, std::string_view norm);

std::tuple<torch::Tensor, torch::Tensor> gated_add_norm_modulate(const torch::Tensor& x, const torch::Tensor& y,
                                                                 const OptTensor& gate, const torch::Tensor& scale,
                                                                 const OptTensor& shift, const OptTensor& weight,
                                                                 const OptTensor& bias, double eps,
                                                                 std::string_view norm);
void gated_add_norm_modulate_out(torch::Tensor& h_out, torch::Tensor& out, const torch::Tensor& x,
                                 const torch::Tensor& y, const OptTensor& gate, const torch::Tensor& scale,
                                 const OptTensor& shift, const OptTensor& weight, const OptTensor& bias, double eps,
                                 std::string_view norm);

// ---- activation family (csrc/activation/activation.cu) ----
// act: "silu" | "gelu" | "gelu_tanh"
torch::Tensor activation(const torch::Tensor& x, std::string_view act);
void activation_out(torch::Tensor& out, const torch::Tensor& x, std::string_view act);
// x: [..., 2 * H] -> [..., H]; act_first: act(x[..., :H]) * x[..., H:], else x[..., :H] * act(x[..., H:])
torch::Tensor act_and_mul(const torch::Tensor& x, std::string_view act, bool act_first);
void act_and_mul_out(torch::Tensor& out, const torch::Tensor& x, std::string_view act, bool act_first);
// gate, up: [..., H] -> act(gate) * up
torch::Tensor act_mul(const torch::Tensor& gate, const torch::Tensor& up, std::string_view act);
void act_mul_out(torch::Tensor& out, const torch::Tensor& gate, const torch::Tensor& up, std::string_view act);
// x, y: [..., H]; gate broadcast to x -> x + gate * y
torch::Tensor gated_add(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& gate);
void gated_add_out(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& gate);

// ---- rotary embeddings (csrc/rope/rope.cu) ----
// q: [B, S, Hq, d], k: [B, S, Hk, d] (any strides, last dim contiguous); cos, sin: [B or 1, S, R]
// style "neox" | "interleaved"; fp32_math: one rounding from fp32 (diffusers) or per-op (transformers)
std::tuple<torch::Tensor, torch::Tensor> rope(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                                              const torch::Tensor& sin, std::string_view style, bool fp32_math);
void rope_(torch::Tensor& q, torch::Tensor& k, const torch::Tensor& cos, const torch::Tensor& sin,
           std::string_view style, bool fp32_math);
// transformers' apply_rotary_pos_emb: q [B, Hq, S, d] / k [B, Hk, S, d] (unsqueeze_dim 1) or
// [B, S, H, d] (2); cos, sin [B or 1, S, R] in q's dtype; NeoX halves, each op rounded to q's dtype
std::tuple<torch::Tensor, torch::Tensor> hf_rope(const torch::Tensor& q, const torch::Tensor& k,
                                                 const torch::Tensor& cos, const torch::Tensor& sin,
                                                 int64_t unsqueeze_dim);
void hf_rope_(torch::Tensor& q, torch::Tensor& k, const torch::Tensor& cos, const torch::Tensor& sin,
              int64_t unsqueeze_dim);
// RMSNorm then interleaved RoPE of q [B, S, Gq, L] and k [B, S, Gk, L]; weights [L] (q's dtype or
// float32); cos, sin float32 [B or 1, S, L]; returns new (q, k)
std::tuple<torch::Tensor, torch::Tensor> qk_norm_rope(const torch::Tensor& q, const torch::Tensor& k,
                                                      const torch::Tensor& q_weight, const torch::Tensor& k_weight,
                                                      double eps, const torch::Tensor& cos, const torch::Tensor& sin);
// Qwen3's q_norm/k_norm (Qwen3RMSNorm per head) then NeoX RoPE, rounded as transformers' eager
// code: q [B, S, Hq, d], k [B, S, Hk, d]; weights [d] and cos, sin [B or 1, S, d] in q's dtype;
// returns new contiguous (q, k), or writes q_out, k_out (q's and k's shapes, any leading strides).
std::tuple<torch::Tensor, torch::Tensor> hf_qk_norm_rope(const torch::Tensor& q, const torch::Tensor& k,
                                                         const torch::Tensor& q_weight, const torch::Tensor& k_weight,
                                                         double eps, const torch::Tensor& cos,
                                                         const torch::Tensor& sin);
void hf_qk_norm_rope_out(torch::Tensor& q_out, torch::Tensor& k_out, const torch::Tensor& q, const torch::Tensor& k,
                         const torch::Tensor& q_weight, const torch::Tensor& k_weight, double eps,
                         const torch::Tensor& cos, const torch::Tensor& sin);
// vLLM's rotary_embedding, in place: positions [T] int64; query [T, Hq*d] or [T, Hq, d], key likewise;
// cos_sin_cache [max_position, R] (R/2 cosines then R/2 sines per row), query's dtype or float32
void rope_cached_(const torch::Tensor& positions, torch::Tensor& query, torch::Tensor& key, int64_t head_size,
                  const torch::Tensor& cos_sin_cache, std::string_view style);
// LTX-Video's forms with cos/sin computed from coordinates: q, k [B, S, C] (C even); grid
// [B or 1, S, 3] float32 (any strides); freqs [C // 6] float32 contiguous; weights [C] (q's dtype
// or float32). Return new (q, k), bit-equal to rope(..., "interleaved", true) / qk_norm_rope with
// the fp32 tables LTXVideoRotaryPosEmbed builds from the same grid and freqs.
std::tuple<torch::Tensor, torch::Tensor> ltx_rope_from_coords(const torch::Tensor& q, const torch::Tensor& k,
                                                              const torch::Tensor& grid, const torch::Tensor& freqs);
std::tuple<torch::Tensor, torch::Tensor> ltx_qk_norm_rope_from_coords(const torch::Tensor& q, const torch::Tensor& k,
                                                                      const torch::Tensor& q_weight,
                                                                      const torch::Tensor& k_weight, double eps,
                                                                      const torch::Tensor& grid,
                                                                      const torch::Tensor& freqs);

// ---- GEMM with a fused epilogue (csrc/gemm/linear_gelu.cu) ----
// x [..., K], weight [N, K], bias [N] or None, one float dtype -> gelu_tanh(x @ weight^T + bias) [..., N]
torch::Tensor linear_gelu(const torch::Tensor& x, const torch::Tensor& weight, const OptTensor& bias);
void linear_gelu_out(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& weight, const OptTensor& bias);
// Whether linear_gelu(x, weight, bias) runs as one cuBLASLt matmul with the GELU epilogue here
// (else it takes the separate GEMM and activation); a host query, for tests and benchmarks.
bool linear_gelu_fused(const torch::Tensor& x, const torch::Tensor& weight, const OptTensor& bias);
// ---- backward ops of the norm family, gated_add and the fused q/k norm + RoPE
// (csrc/norm/norm_backward.cu, csrc/rope/qk_norm_rope_backward.cu) ----
// Each takes the forward's inputs (or its saved h output), the gradients of its outputs, and
// output_mask: which gradients to compute; those not asked for (or of an absent parameter) come
// back as empty 1-D tensors. The row statistics are recomputed from x.
// -> (grad_x, grad_weight)
std::tuple<torch::Tensor, torch::Tensor> rms_norm_backward(const torch::Tensor& grad_out, const torch::Tensor& x,
                                                           const OptTensor& weight, double eps,
                                                           std::array<bool, 2> output_mask);
// -> (grad of x and of residual: one tensor, grad_weight); residual_out is the forward's h
std::tuple<torch::Tensor, torch::Tensor> fused_add_rms_norm_backward(const torch::Tensor& grad_out,
                                                                     const OptTensor& grad_residual_out,
                                                                     const torch::Tensor& residual_out,
                                                                     const OptTensor& weight, double eps,
                                                                     std::array<bool, 2> output_mask);
// -> (grad_x, grad_weight, grad_bias)
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> layer_norm_backward(const torch::Tensor& grad_out,
                                                                            const torch::Tensor& x,
                                                                            const OptTensor& weight,
                                                                            const OptTensor& bias, double eps,
                                                                            std::array<bool, 3> output_mask);
// -> (grad_x, grad_scale, grad_shift, grad_weight, grad_bias), parameter gradients in their shapes
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> norm_modulate_backward(
    const torch::Tensor& grad_out, const torch::Tensor& x, const torch::Tensor& scale, const OptTensor& shift,
    const OptTensor& weight, const OptTensor& bias, double eps, std::string_view norm,
    std::array<bool, 5> output_mask);
// h: the forward's h output. -> (grad_x, grad_y (empty without a gate: it is grad_x),
// grad_gate, grad_scale, grad_shift, grad_weight, grad_bias)
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor>
gated_add_norm_modulate_backward(const OptTensor& grad_h, const torch::Tensor& grad_out, const torch::Tensor& h,
                                 const torch::Tensor& y, const OptTensor& gate, const torch::Tensor& scale,
                                 const OptTensor& shift, const OptTensor& weight, const OptTensor& bias, double eps,
                                 std::string_view norm, std::array<bool, 7> output_mask);
// out = x + gate * y: grad_x is grad_out itself. -> (grad_y, grad_gate)
std::tuple<torch::Tensor, torch::Tensor> gated_add_backward(const torch::Tensor& grad_out, const torch::Tensor& y,
                                                            const torch::Tensor& gate,
                                                            std::array<bool, 2> output_mask);
// The fused q/k norm + RoPE ops' backward. -> (grad_q, grad_k, grad_q_weight, grad_k_weight)
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> qk_norm_rope_backward(
    const torch::Tensor& grad_q_out, const torch::Tensor& grad_k_out, const torch::Tensor& q, const torch::Tensor& k,
    const torch::Tensor& q_weight, const torch::Tensor& k_weight, double eps, const torch::Tensor& cos,
    const torch::Tensor& sin, std::array<bool, 4> output_mask);
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> hf_qk_norm_rope_backward(
    const torch::Tensor& grad_q_out, const torch::Tensor& grad_k_out, const torch::Tensor& q, const torch::Tensor& k,
    const torch::Tensor& q_weight, const torch::Tensor& k_weight, double eps, const torch::Tensor& cos,
    const torch::Tensor& sin, std::array<bool, 4> output_mask);
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> ltx_qk_norm_rope_from_coords_backward(
    const torch::Tensor& grad_q_out, const torch::Tensor& grad_k_out, const torch::Tensor& q, const torch::Tensor& k,
    const torch::Tensor& q_weight, const torch::Tensor& k_weight, double eps, const torch::Tensor& grid,
    const torch::Tensor& freqs, std::array<bool, 4> output_mask);
// ---- training (csrc/activation/activation_backward.cu, csrc/rope/rope.cu, csrc/loss/) ----
// grad: the forward output's gradient; returns the inputs' gradients ([..., 2H] for act_and_mul).
torch::Tensor activation_backward(const torch::Tensor& grad, const torch::Tensor& x, std::string_view act);
torch::Tensor act_and_mul_backward(const torch::Tensor& grad, const torch::Tensor& x, std::string_view act,
                                   bool act_first);
std::tuple<torch::Tensor, torch::Tensor> act_mul_backward(const torch::Tensor& grad, const torch::Tensor& gate,
                                                          const torch::Tensor& up, std::string_view act);
// grad_q [B, S, Hq, d], grad_k [B, S, Hk, d] (rope's layout); cos, sin as rope's -> (grad of q, grad of k)
std::tuple<torch::Tensor, torch::Tensor> rope_backward(const torch::Tensor& grad_q, const torch::Tensor& grad_k,
                                                       const torch::Tensor& cos, const torch::Tensor& sin,
                                                       std::string_view style, bool fp32_math);
// grad_q, grad_k [B, S, C]; grid, freqs as ltx_rope_from_coords'
std::tuple<torch::Tensor, torch::Tensor> ltx_rope_from_coords_backward(const torch::Tensor& grad_q,
                                                                       const torch::Tensor& grad_k,
                                                                       const torch::Tensor& grid,
                                                                       const torch::Tensor& freqs);
// hidden [N, H], weight [V, H], target [N] int64, bias [V]; -> (loss: [] or [N] fp32, grad_hidden [N, H],
// grad_weight [V, H], grad_bias [V]; ungiven gradients are empty [0] tensors)
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> fused_linear_cross_entropy(
    const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& target, const OptTensor& bias,
    int64_t ignore_index, std::string_view reduction, double label_smoothing, std::optional<double> softcap,
    std::array<bool, 3> compute_grads, int64_t chunk_rows);
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> fused_linear_cross_entropy_backward(
    const torch::Tensor& grad_loss, const torch::Tensor& hidden, const torch::Tensor& weight,
    const torch::Tensor& target, const OptTensor& bias, int64_t ignore_index, std::string_view reduction,
    double label_smoothing, std::optional<double> softcap, std::array<bool, 3> compute_grads, int64_t chunk_rows);

// ---- GroupNorm (csrc/group_norm/group_norm.cu) ----
// x: [N, C, *spatial], channels-first (NCHW, NCDHW) or channels-last (NHWC, NDHWC), any batch stride;
// weight, bias: [C] in x's dtype; activation "none" | "silu". The output keeps x's layout.
torch::Tensor group_norm(const torch::Tensor& x, int64_t num_groups, const OptTensor& weight, const OptTensor& bias,
                         double eps, std::string_view activation);
void group_norm_out(torch::Tensor& out, const torch::Tensor& x, int64_t num_groups, const OptTensor& weight,
                    const OptTensor& bias, double eps, std::string_view activation);
// The same of h = x + bias_nc ([N or 1, C] or [N or 1, C, 1, ...], x's dtype): ResnetBlock2D's time embedding.
torch::Tensor add_group_norm(const torch::Tensor& x, const torch::Tensor& bias_nc, int64_t num_groups,
                             const OptTensor& weight, const OptTensor& bias, double eps, std::string_view activation);
void add_group_norm_out(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& bias_nc, int64_t num_groups,
                        const OptTensor& weight, const OptTensor& bias, double eps, std::string_view activation);

}  // namespace transformer_kernels
