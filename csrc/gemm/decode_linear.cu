// Torch entry point of decode_linear: validate, allocate, launch DecodeLinear (gemm/decode_linear.cuh)
// on the current stream of x's device.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>
#include <tuple>
#include <vector>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/dispatch.h"
#include "gemm/decode_linear.cuh"
#include "gemm/gemm_binding.h"
#include "gemm/ops.h"

namespace transformer_kernels {
namespace {

using OptTensor = std::optional<at::Tensor>;
constexpr const char* kOp = "decode_linear";

// x [..., K] float with at most kDecodeMaxRows rows one stride apart; weight [N, K] contiguous, x's
// dtype or float8_e4m3fn (then weight_scale [N] or [N, 1] float32, contiguous); bias [N] in x's dtype.
void check_inputs(const at::Tensor& x, const at::Tensor& weight, const OptTensor& weight_scale, const OptTensor& bias) {
  check_row_input(kOp, x, "x");
  const int64_t rows = matrix_rows(x);
  TORCH_CHECK_VALUE(rows <= kDecodeMaxRows, kOp, ": x must have at most ", kDecodeMaxRows,
                    " rows (the tokens of a decode step), got ", rows, " (shape ", x.sizes(),
                    "); more rows are a GEMM's work (F.linear)");
  check_same_device(kOp, weight, "weight", x, "x");
  const bool fp8 = weight.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK_TYPE(fp8 || weight.scalar_type() == x.scalar_type(), kOp,
                   ": weight must have x's dtype (", x.scalar_type(), ") or float8_e4m3fn, got ", weight.scalar_type());
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(1) == x.size(-1) && weight.is_contiguous(), kOp,
                    ": weight must be a contiguous [out_features, in_features] with in_features = x.shape[-1] = ",
                    x.size(-1), ", got shape ", weight.sizes(), " and strides ", weight.strides());
  const int64_t n = weight.size(0);
  TORCH_CHECK_VALUE(fp8 == weight_scale.has_value(), kOp,
                    fp8 ? ": a float8_e4m3fn weight needs its weight_scale (one float32 per output channel)"
                        : ": weight_scale is only for a float8_e4m3fn weight");
  if (weight_scale) {
    check_same_device(kOp, *weight_scale, "weight_scale", x, "x");
    check_dtype(kOp, *weight_scale, "weight_scale", at::kFloat, "float32");
    TORCH_CHECK_VALUE(weight_scale->numel() == n && weight_scale->size(0) == n && weight_scale->is_contiguous() &&
                          (weight_scale->dim() == 1 || (weight_scale->dim() == 2 && weight_scale->size(1) == 1)),
                      kOp, ": weight_scale must be a contiguous [out_features] or [out_features, 1] tensor, "
                      "out_features = ", n, ", got shape ", weight_scale->sizes());
  }
  if (bias) {
    check_same_device(kOp, *bias, "bias", x, "x");
    check_dtype(kOp, *bias, "bias", x.scalar_type(), "x's dtype");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == n && bias->is_contiguous(), kOp,
                      ": bias must be a contiguous [out_features] = [", n, "], got shape ", bias->sizes());
  }
  const int64_t multiple = fp8 ? kVecBytes : kVecBytes / static_cast<int64_t>(x.element_size());
  TORCH_CHECK_VALUE(x.size(-1) % multiple == 0, kOp, ": in_features (x.shape[-1]) must be a multiple of ", multiple,
                    " (16-byte loads of the weight's rows), got ", x.size(-1));
}

}  // namespace

at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& weight, const OptTensor& weight_scale,
                         const OptTensor& bias) {
  check_inputs(x, weight, weight_scale, bias);
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = weight.size(0);
  at::Tensor out = empty_tensor(sizes, x.options());
  if (out.numel() == 0) return out;
  const auto x_ld = matrix_ld(x);
  const int64_t row_multiple = kVecBytes / static_cast<int64_t>(x.element_size());
  // Rows of no elements (in_features 0) are never read: their stride and alignment do not matter.
  TORCH_CHECK_VALUE(x.size(-1) == 0 || (x_ld && (matrix_rows(x) <= 1 || *x_ld % row_multiple == 0)), kOp,
                    ": x's rows must be one stride apart, a multiple of ", row_multiple, " elements (sizes ",
                    x.sizes(), ", strides ", x.strides(), ")");
  if (validation_only(x)) return out;
  TORCH_CHECK_VALUE(x.size(-1) == 0 || (reinterpret_cast<uintptr_t>(x.const_data_ptr()) % kVecBytes == 0 &&
                                         reinterpret_cast<uintptr_t>(weight.const_data_ptr()) % kVecBytes == 0),
                    kOp, ": x and weight must start on a 16-byte boundary (views one element into a tensor do not)");
  const at::cuda::OptionalCUDAGuard device_guard(x.device());
  const bool fp8 = weight.scalar_type() == at::kFloat8_e4m3fn;
  dispatch_float_dtype(x.scalar_type(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto run = [&](auto weight_tag) {
      using W = typename decltype(weight_tag)::type;
      DecodeLinearParams<T, W> p;
      p.x = static_cast<const T*>(x.const_data_ptr());
      p.x_row_stride = x_ld.value_or(0);
      p.weight = static_cast<const W*>(weight.const_data_ptr());
      if (weight_scale) p.weight_scale = weight_scale->const_data_ptr<float>();
      if (bias) p.bias = static_cast<const T*>(bias->const_data_ptr());
      p.out = static_cast<T*>(out.data_ptr());
      p.rows = static_cast<int>(matrix_rows(x));  // in_features 0 too: each row's output is the bias
      p.n = weight.size(0);
      p.k = x.size(-1);
      check_launch(kOp, DecodeLinear(p, at::cuda::getCurrentCUDAStream()));
    };
    if (fp8) run(type_tag<uint8_t>{});
    else run(type_tag<T>{});
  });
  return out;
}

// The entry point defined above is the one ops.h declares (a drifted signature would not compile).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&decode_linear);

}  // namespace transformer_kernels
