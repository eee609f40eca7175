// The names a binding takes for the kernels' shared enums, resolved once, with one message format:
// "<op>: activation must be "silu", "gelu" or "gelu_tanh", got "relu"". Each op passes the values
// it accepts; a family's own enums (the norms' NormType) have their resolver in the family.
#pragma once

#include <c10/util/Exception.h>

#include <initializer_list>
#include <string>
#include <string_view>

#include "common/activation_math.cuh"

namespace transformer_kernels {

constexpr std::string_view activation_name(Activation act) {
  switch (act) {
    case Activation::kSilu: return "silu";
    case Activation::kGelu: return "gelu";
    case Activation::kGeluTanh: return "gelu_tanh";
    case Activation::kNone: break;
  }
  return "none";
}

// "a", "b" or "c"
inline std::string quoted_choices(std::initializer_list<Activation> accepted) {
  std::string text;
  size_t i = 0;
  for (Activation act : accepted) {
    if (i > 0) text += i + 1 == accepted.size() ? " or " : ", ";
    text += '"';
    text += activation_name(act);
    text += '"';
    ++i;
  }
  return text;
}

// The Activation named `name`, one of `accepted` (by default the three activations); a ValueError
// naming `op`, the argument and the accepted names otherwise.
inline Activation resolve_activation(
    const char* op, std::string_view name,
    std::initializer_list<Activation> accepted = {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh}) {
  for (Activation act : accepted)
    if (name == activation_name(act)) return act;
  TORCH_CHECK_VALUE(false, op, ": activation must be ", quoted_choices(accepted), ", got \"", name, "\"");
}

}  // namespace transformer_kernels
