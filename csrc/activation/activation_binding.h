// What the bindings that take an activation by name share (the activation family's forward and
// backward, the quantizing producers): its name resolved to the kernels' Activation.
#pragma once

#include <c10/util/Exception.h>

#include <string_view>

#include "activation/activation.cuh"

namespace transformer_kernels {

inline Activation resolve_activation(const char* op, std::string_view act) {
  if (act == "silu") return Activation::kSilu;
  if (act == "gelu") return Activation::kGelu;
  if (act == "gelu_tanh") return Activation::kGeluTanh;
  TORCH_CHECK_VALUE(false, op, ": activation must be \"silu\", \"gelu\" or \"gelu_tanh\", got \"", act, "\"");
}

}  // namespace transformer_kernels
