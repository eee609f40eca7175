// Declarations of every op entry point registered in torch_binding.cpp. The definitions live
// in csrc/<family>/<op>.cu, one file per op family.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string_view>

namespace transformer_kernels {

// returns out: [..., hidden] (contiguous)  x: [..., hidden]  weight: [hidden] or None
torch::Tensor rms_norm(const torch::Tensor& x, const std::optional<torch::Tensor>& weight, double eps,
                       std::string_view rounding);
// out: [..., hidden]  x: [..., hidden]  weight: [hidden] or None
void rms_norm_out(torch::Tensor& out, const torch::Tensor& x, const std::optional<torch::Tensor>& weight, double eps,
                  std::string_view rounding);

}  // namespace transformer_kernels
