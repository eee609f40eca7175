// The RoPE family's binding helpers, shared with the fused q/k norm + RoPE family
// (csrc/qk_norm_rope): q and k as the kernels address them, and the checks of q, k, the cos/sin
// tables and LTX's coordinates. Binding layer (ATen types); the kernels are in rope.cuh.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <utility>

#include "common/checks.h"
#include "rope/qk_rows.cuh"

namespace transformer_kernels::rope_binding {

inline HeadStrides head_strides(const at::Tensor& t) { return {/*b=*/t.stride(0), /*s=*/t.stride(1), /*h=*/t.stride(2)}; }

// q, k and their outputs, [B, S, H, d] views, as the kernels address them.
template <typename T>
inline QkRows<T> qk_rows(at::Tensor& q_out, const at::Tensor& q, at::Tensor& k_out, const at::Tensor& k) {
  QkRows<T> r;
  r.q_out = static_cast<T*>(q_out.data_ptr());
  r.q_out_strides = head_strides(q_out);
  r.q = static_cast<const T*>(q.const_data_ptr());
  r.q_strides = head_strides(q);
  r.k_out = static_cast<T*>(k_out.data_ptr());
  r.k_out_strides = head_strides(k_out);
  r.k = static_cast<const T*>(k.const_data_ptr());
  r.k_strides = head_strides(k);
  r.batch = q.size(0);
  r.seq = q.size(1);
  r.num_q_heads = static_cast<int>(q.size(2));
  r.num_k_heads = static_cast<int>(k.size(2));
  return r.with_fast_divisors();
}

// q [B, S, Hq, d], k [B, S, Hk, d]: the kernels count heads in 32 bits (QkRows) and take at most
// one block per row of d (B * S * (Hq + Hk) rows) in the grid's x dimension.
inline void check_heads_and_rows(const char* op, const at::Tensor& q, const at::Tensor& k) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  TORCH_CHECK_VALUE(q.size(2) <= kMax - k.size(2), op, ": q and k have ", q.size(2), " + ", k.size(2),
                    " heads; at most ", kMax, " in all are supported");
  const int64_t heads = q.size(2) + k.size(2), tokens = q.size(0) * q.size(1);
  if (heads == 0 || q.size(3) == 0) return;  // nothing is launched
  TORCH_CHECK_VALUE(tokens <= kMax / heads, op, ": q and k have ", tokens, " tokens of ", heads,
                    " heads (rows of head_dim); at most ", kMax, " rows are supported");
}

// What an op calls its q and k in its messages: the backward ops take the outputs' gradients in
// their place.
struct QkNames {
  const char* q = "q";
  const char* k = "k";
};
inline constexpr QkNames kGradQkNames{"grad_q", "grad_k"};

// q [B, S, Hq, d] and k [B, S, Hk, d]: CUDA, float, same device and dtype, last dim contiguous.
inline void check_qk(const char* op, const at::Tensor& q, const at::Tensor& k, QkNames n = {}) {
  check_cuda(op, q, n.q);
  check_float_dtype(op, q, n.q);
  TORCH_CHECK_VALUE(q.dim() == 4, op, ": ", n.q, " must be 4-D [B, S, H, d], got shape ", q.sizes());
  check_last_dim_contiguous(op, q, n.q);
  check_same_device(op, k, n.k, q, n.q);
  check_dtype(op, k, n.k, q.scalar_type(), "the dtype of q");
  TORCH_CHECK_VALUE(k.dim() == 4 && k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3), op,
                    ": ", n.k, " must be [B, S, H_k, d] with ", n.q, "'s B, S and d ", q.sizes(), ", got ", k.sizes());
  check_last_dim_contiguous(op, k, n.k);
  check_heads_and_rows(op, q, k);
}

// cos, sin [B or 1, S, width] for q [B, S, H, d]: same device, shape and strides, last dim
// contiguous (their dtype and width are the caller's to check). q_name: what the op calls q.
inline void check_tables(const char* op, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& q,
                         const char* q_name = "q") {
  for (const auto& [t, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    check_same_device(op, *t, name, q, q_name);
    TORCH_CHECK_VALUE(t->dim() == 3 && (t->size(0) == 1 || t->size(0) == q.size(0)) && t->size(1) == q.size(1), op,
                      ": ", name, " must be [B or 1, S, rotary_dim] with ", q_name, "'s B = ", q.size(0),
                      " and S = ", q.size(1), ", got ", t->sizes());
    check_last_dim_contiguous(op, *t, name);
  }
  check_same_shape(op, sin, "sin", cos, "cos");
  TORCH_CHECK_VALUE(cos.stride(0) == sin.stride(0) && cos.stride(1) == sin.stride(1), op,
                    ": cos and sin must have the same strides, got ", cos.strides(), " and ", sin.strides());
}

// Rotary coordinates for q [B, S, C] or [B, S, 1, C]: grid [B or 1, S, 3] float32 (any strides),
// freqs [C // 6] float32 contiguous.
inline void check_coords(const char* op, const at::Tensor& grid, const at::Tensor& freqs, const at::Tensor& q,
                         const char* q_name = "q") {
  check_same_device(op, grid, "grid", q, q_name);
  check_dtype(op, grid, "grid", at::kFloat, "diffusers computes the rotary coordinates in float32");
  TORCH_CHECK_VALUE(grid.dim() == 3 && (grid.size(0) == 1 || grid.size(0) == q.size(0)) && grid.size(1) == q.size(1) &&
                        grid.size(2) == 3,
                    op, ": grid must be [B or 1, S, 3] (frame, height, width) with ", q_name, "'s B = ", q.size(0),
                    " and S = ", q.size(1), ", got ", grid.sizes());
  const int64_t width = q.size(-1);
  check_same_device(op, freqs, "freqs", q, q_name);
  check_dtype(op, freqs, "freqs", at::kFloat, "diffusers computes the rotary frequencies in float32");
  TORCH_CHECK_VALUE(freqs.dim() == 1 && freqs.size(0) == width / 6 && freqs.is_contiguous(), op,
                    ": freqs must be a contiguous [C // 6] = [", width / 6, "] (C = ", q_name, ".shape[-1] = ", width,
                    "), got shape ", freqs.sizes(), " and strides ", freqs.strides());
}

// LTX's q, k [B, S, C] (before the head split) with coordinates grid [B or 1, S, 3] float32 (any
// strides) and freqs [C // 6] float32 contiguous; C even. Returns q, k as the kernels' [B, S, 1, C].
inline std::pair<at::Tensor, at::Tensor> check_ltx_coords(const char* op, const at::Tensor& q, const at::Tensor& k,
                                                          const at::Tensor& grid, const at::Tensor& freqs,
                                                          QkNames n = {}) {
  check_cuda(op, q, n.q);
  check_float_dtype(op, q, n.q);
  TORCH_CHECK_VALUE(q.dim() == 3, op, ": ", n.q,
                    " must be 3-D [B, S, C] (LTX's projection before the head split), got shape ", q.sizes());
  check_same_device(op, k, n.k, q, n.q);
  check_same_shape(op, k, n.k, q, n.q);
  at::Tensor q4 = q.unsqueeze(2), k4 = k.unsqueeze(2);
  check_qk(op, q4, k4, n);
  const int64_t width = q.size(2);
  TORCH_CHECK_VALUE(width % 2 == 0, op, ": the rotated width (", n.q, ".shape[-1] = ", width,
                    ") must be even: RoPE rotates pairs");
  check_coords(op, grid, freqs, q, n.q);
  return {q4, k4};
}

}  // namespace transformer_kernels::rope_binding
