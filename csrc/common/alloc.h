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
#include <vector>

namespace transformer_kernels {

// A tensor of `size` with `options` (dtype, device, layout, memory format); values unset.
inline at::Tensor empty_tensor(at::IntArrayRef size, at::TensorOptions options) {
  return at::_ops::empty_memory_format::call(
      c10::fromIntArrayRefSlow(size), c10::optTypeMetaToScalarType(options.dtype_opt()), options.layout_opt(),
      options.device_opt(), options.pinned_memory_opt(),
      c10::impl::check_tensor_options_and_extract_memory_format(options, std::nullopt));
}

// The shape of one scale per row of x ([..., 1]: x's shape with a last dimension of 1), as the FP8
// codes of x's rows carry them (quantize_fp8, the norms' FP8 outputs, linear_fp8's x_scale).
inline std::vector<int64_t> row_scale_sizes(const at::Tensor& x) {
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = 1;
  return sizes;
}

// Uninitialized float32 row scales of x's rows, on x's device: one per row, rows of no elements too.
inline at::Tensor empty_row_scales(const at::Tensor& x) {
  return empty_tensor(row_scale_sizes(x), x.options().dtype(c10::ScalarType::Float));
}

}  // namespace transformer_kernels
