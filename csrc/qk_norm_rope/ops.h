// The torch entry points of the fused q/k norm + RoPE family (csrc/qk_norm_rope: qk_norm_rope.cu,
// qk_norm_rope_backward.cu): the C++ signatures of its op schemas, registered in
// torch-ext/torch_binding.cpp. The family's .cu files include this header, so a definition that
// drifts from its declaration fails to compile.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

namespace transformer_kernels {

// RMSNorm then interleaved RoPE of q [B, S, Gq, L] and k [B, S, Gk, L]; weights [L] (q's dtype or
// float32); cos, sin float32 [B or 1, S, L]; returns new (q, k)
std::tuple<at::Tensor, at::Tensor> qk_norm_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                                                const at::Tensor& k_weight, double eps, const at::Tensor& cos,
                                                const at::Tensor& sin);
// Qwen3's q_norm/k_norm (Qwen3RMSNorm per head) then NeoX RoPE, rounded as transformers' eager
// code: q [B, S, Hq, d], k [B, S, Hk, d]; weights [d] and cos, sin [B or 1, S, d] in q's dtype;
// returns new contiguous (q, k), or writes q_out, k_out (q's and k's shapes, any leading strides).
std::tuple<at::Tensor, at::Tensor> hf_qk_norm_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                                                   const at::Tensor& k_weight, double eps, const at::Tensor& cos,
                                                   const at::Tensor& sin);
void hf_qk_norm_rope_out(at::Tensor& q_out, at::Tensor& k_out, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& q_weight, const at::Tensor& k_weight, double eps, const at::Tensor& cos,
                         const at::Tensor& sin);
std::tuple<at::Tensor, at::Tensor> ltx_qk_norm_rope_from_coords(const at::Tensor& q, const at::Tensor& k,
                                                                const at::Tensor& q_weight, const at::Tensor& k_weight,
                                                                double eps, const at::Tensor& grid,
                                                                const at::Tensor& freqs);
// The fused q/k norm + RoPE ops' backward. -> (grad_q, grad_k, grad_q_weight, grad_k_weight)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> qk_norm_rope_backward(
    const at::Tensor& grad_q_out, const at::Tensor& grad_k_out, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& q_weight, const at::Tensor& k_weight, double eps, const at::Tensor& cos, const at::Tensor& sin,
    std::array<bool, 4> output_mask);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> hf_qk_norm_rope_backward(
    const at::Tensor& grad_q_out, const at::Tensor& grad_k_out, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& q_weight, const at::Tensor& k_weight, double eps, const at::Tensor& cos, const at::Tensor& sin,
    std::array<bool, 4> output_mask);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> ltx_qk_norm_rope_from_coords_backward(
    const at::Tensor& grad_q_out, const at::Tensor& grad_k_out, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& q_weight, const at::Tensor& k_weight, double eps, const at::Tensor& grid, const at::Tensor& freqs,
    std::array<bool, 4> output_mask);

}  // namespace transformer_kernels
