// Output and workspace allocation for the bindings: at::empty(size, options), spelled exactly as
// <ATen/ops/empty.h> defines it (the same dispatcher call, so the same tensor), without that
// header's includes (ATen/Context.h and more), which add about 2 s to each arch's device pass of
// every binding translation unit (benchmarks/NOTES.md, "Build size and instantiations").
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_ops.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/core/TensorOptions.h>

#include <optional>

namespace transformer_kernels {

// A tensor of `size` with `options` (dtype, device, layout, memory format); values unset.
inline at::Tensor empty_tensor(at::IntArrayRef size, at::TensorOptions options) {
  return at::_ops::empty_memory_format::call(
      c10::fromIntArrayRefSlow(size), c10::optTypeMetaToScalarType(options.dtype_opt()), options.layout_opt(),
      options.device_opt(), options.pinned_memory_opt(),
      c10::impl::check_tensor_options_and_extract_memory_format(options, std::nullopt));
}

}  // namespace transformer_kernels
