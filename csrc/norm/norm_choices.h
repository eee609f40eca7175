// The norm family's names resolved to its kernels' enum, for the forward and the backward bindings
// alike (the shared enums' resolvers: common/choices.h).
#pragma once

#include <c10/util/Exception.h>

#include <string_view>

#include "norm/norm_common.cuh"

namespace transformer_kernels {

inline NormType resolve_norm_type(const char* op, std::string_view norm) {
  if (norm == "rms") return NormType::kRms;
  if (norm == "layer") return NormType::kLayer;
  TORCH_CHECK_VALUE(false, op, ": norm must be \"rms\" or \"layer\", got \"", norm, "\"");
}

}  // namespace transformer_kernels
