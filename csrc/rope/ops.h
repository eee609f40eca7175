// The torch entry points of the RoPE family (csrc/rope/rope.cu): the C++ signatures of its op
// schemas, registered in torch-ext/torch_binding.cpp. The family's .cu files include this header,
// so a definition that drifts from its declaration fails to compile.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

namespace transformer_kernels {

// q: [B, S, Hq, d], k: [B, S, Hk, d] (any strides, last dim contiguous); cos, sin: [B or 1, S, R]
// style "neox" | "interleaved"; fp32_math: one rounding from fp32 (diffusers) or per-op (transformers)
std::tuple<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                        const at::Tensor& sin, std::string_view style, bool fp32_math);
void rope_(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin, std::string_view style,
           bool fp32_math);
// transformers' apply_rotary_pos_emb: q [B, Hq, S, d] / k [B, Hk, S, d] (unsqueeze_dim 1) or
// [B, S, H, d] (2); cos, sin [B or 1, S, R] in q's dtype; NeoX halves, each op rounded to q's dtype
std::tuple<at::Tensor, at::Tensor> hf_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                           const at::Tensor& sin, int64_t unsqueeze_dim);
void hf_rope_(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin, int64_t unsqueeze_dim);
// vLLM's rotary_embedding, in place: positions [T] int64; query [T, Hq*d] or [T, Hq, d], key likewise;
// cos_sin_cache [max_position, R] (R/2 cosines then R/2 sines per row), query's dtype or float32
void rope_cached_(const at::Tensor& positions, at::Tensor& query, at::Tensor& key, int64_t head_size,
                  const at::Tensor& cos_sin_cache, std::string_view style);
// LTX-Video's forms with cos/sin computed from coordinates: q, k [B, S, C] (C even); grid
// [B or 1, S, 3] float32 (any strides); freqs [C // 6] float32 contiguous; weights [C] (q's dtype
// or float32). Return new (q, k), bit-equal to rope(..., "interleaved", true) / qk_norm_rope with
// the fp32 tables LTXVideoRotaryPosEmbed builds from the same grid and freqs.
std::tuple<at::Tensor, at::Tensor> ltx_rope_from_coords(const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& grid, const at::Tensor& freqs);
// grad_q [B, S, Hq, d], grad_k [B, S, Hk, d] (rope's layout); cos, sin as rope's -> (grad of q, grad of k)
std::tuple<at::Tensor, at::Tensor> rope_backward(const at::Tensor& grad_q, const at::Tensor& grad_k,
                                                 const at::Tensor& cos, const at::Tensor& sin, std::string_view style,
                                                 bool fp32_math);
// grad_q, grad_k [B, S, C]; grid, freqs as ltx_rope_from_coords'
std::tuple<at::Tensor, at::Tensor> ltx_rope_from_coords_backward(const at::Tensor& grad_q, const at::Tensor& grad_k,
                                                                 const at::Tensor& grid, const at::Tensor& freqs);

}  // namespace transformer_kernels
