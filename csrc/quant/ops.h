// The torch entry points of the quantization family (csrc/quant/): the C++ signatures of its op
// schemas, registered in torch-ext/torch_binding.cpp. The family's .cu files include this header,
// so a definition that drifts from its declaration fails to compile.
#pragma once

#include <ATen/core/Tensor.h>

#include <string_view>
#include <tuple>

namespace transformer_kernels {

// x [..., K] float32/float16/bfloat16 -> (codes [..., K] float8_e4m3fn, scale [..., 1] float32):
// per-row dynamic quantization, x ~ codes * scale (csrc/quant/quantize_fp8.cuh).
std::tuple<at::Tensor, at::Tensor> quantize_fp8(const at::Tensor& x);
// gate, up [..., H], one float dtype, act "silu" | "gelu" | "gelu_tanh" -> quantize_fp8(act_mul(gate, up, act)),
// bit for bit, in one pass: the FP8 input of a gated MLP's down projection.
std::tuple<at::Tensor, at::Tensor> act_mul_fp8(const at::Tensor& gate, const at::Tensor& up, std::string_view activation);

}  // namespace transformer_kernels
