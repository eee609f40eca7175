// The torch entry points of the attention family (csrc/attention: attention_8bit.cu): the C++
// signatures of its op schemas, registered in torch-ext/torch_binding.cpp. The family's .cu files
// include this header, so a definition that drifts from its declaration fails to compile.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace transformer_kernels {

// Non-causal softmax(q kᵀ · scale) v with 8-bit products (SageAttention2's recipe): q·kᵀ in INT8
// (q per row, k per 64-key block after subtracting k's per-channel mean over the keys), p·v in FP8
// e4m3 (v per channel), softmax in float32. q [B, H, Sq, D], k and v [B, H, Sk, D], float16 or
// bfloat16, D 64 or 128, the last dimension contiguous and the others of any stride (a [B, S, H, D]
// tensor's transpose(1, 2) is taken without a copy); scale defaults to 1/sqrt(D). Returns q's shape
// and dtype, laid out as q is ([B, Sq, H, D] memory when q's heads are inner to its sequence).
at::Tensor attention_8bit(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          std::optional<double> scale);

}  // namespace transformer_kernels
