// Torch entry point of linear_fp8: validate, then one cuBLASLt FP8 matmul (gemm/linear_fp8.cuh) with
// the row and channel scales, the bias and the optional tanh-GELU on torch's cuBLASLt handle,
// workspace and current stream. No fallback: where cuBLASLt has no FP8 algorithm (a GPU before
// sm_89), the op says so.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/choices.h"
#include "gemm/gemm_binding.h"
#include "gemm/linear_fp8.cuh"
#include "gemm/ops.h"

namespace transformer_kernels {
namespace {

using OptTensor = std::optional<at::Tensor>;
constexpr const char* kOp = "linear_fp8";
// FP8 operands' rows and leading dimensions are multiples of 16 bytes for cuBLASLt's FP8 kernels;
// the output's rows then are too.
constexpr int64_t kFp8Multiple = 16;

FloatType resolve_out_dtype(c10::ScalarType dtype) {
  if (dtype == at::kBFloat16) return FloatType::kBFloat16;
  if (dtype == at::kHalf) return FloatType::kFloat16;
  TORCH_CHECK_TYPE(false, kOp, ": out_dtype must be bfloat16 or float16, got ", dtype);
}

// x [..., K] e4m3 with x_scale [..., 1] float32 (quantize_fp8's pair); weight [N, K] e4m3 with
// weight_scale [N] (or [N, 1]) float32; bias [N] in out_dtype; K and N multiples of 16.
void check_inputs(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                  const at::Tensor& weight_scale, const OptTensor& bias, c10::ScalarType out_dtype) {
  check_cuda(kOp, x, "x");
  TORCH_CHECK_VALUE(x.dim() >= 1, kOp, ": x must have at least one dimension [..., in_features], got a 0-d tensor");
  check_dtype(kOp, x, "x", at::kFloat8_e4m3fn, "quantize_fp8's codes");
  check_last_dim_contiguous(kOp, x, "x");
  check_same_device(kOp, x_scale, "x_scale", x, "x");
  check_dtype(kOp, x_scale, "x_scale", at::kFloat, "float32");
  const std::vector<int64_t> scale_sizes = row_scale_sizes(x);
  TORCH_CHECK_VALUE(x_scale.sizes() == at::IntArrayRef(scale_sizes) && x_scale.is_contiguous(), kOp,
                    ": x_scale must be a contiguous [..., 1] tensor of x's rows, shape ", at::IntArrayRef(scale_sizes),
                    ", got shape ", x_scale.sizes(), " and strides ", x_scale.strides());
  check_same_device(kOp, weight, "weight", x, "x");
  check_dtype(kOp, weight, "weight", at::kFloat8_e4m3fn, "quantize_fp8's codes of each output channel");
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(1) == x.size(-1), kOp,
                    ": weight must be [out_features, in_features] with in_features = x.shape[-1] = ", x.size(-1),
                    ", got shape ", weight.sizes());
  const int64_t n = weight.size(0);
  check_same_device(kOp, weight_scale, "weight_scale", x, "x");
  check_dtype(kOp, weight_scale, "weight_scale", at::kFloat, "float32");
  TORCH_CHECK_VALUE(weight_scale.numel() == n && weight_scale.size(0) == n && weight_scale.is_contiguous() &&
                        (weight_scale.dim() == 1 || (weight_scale.dim() == 2 && weight_scale.size(1) == 1)),
                    kOp, ": weight_scale must be a contiguous [out_features] or [out_features, 1] tensor, out_features = ",
                    n, ", got shape ", weight_scale.sizes());
  if (bias) {
    check_same_device(kOp, *bias, "bias", x, "x");
    check_dtype(kOp, *bias, "bias", out_dtype, "out_dtype");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == n && bias->is_contiguous(), kOp,
                      ": bias must be a contiguous [out_features] = [", n, "], got shape ", bias->sizes());
  }
  TORCH_CHECK_VALUE(x.size(-1) % kFp8Multiple == 0, kOp, ": in_features (x.shape[-1]) must be a multiple of ",
                    kFp8Multiple, " for cuBLASLt's FP8 GEMMs, got ", x.size(-1));
  TORCH_CHECK_VALUE(n % kFp8Multiple == 0, kOp, ": out_features (weight.shape[0]) must be a multiple of ",
                    kFp8Multiple, " for cuBLASLt's FP8 GEMMs, got ", n);
  check_row_count(kOp, num_rows(x), "x");
}

}  // namespace

at::Tensor linear_fp8(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                      const at::Tensor& weight_scale, const OptTensor& bias, c10::ScalarType out_dtype,
                      std::string_view activation) {
  const FloatType out_type = resolve_out_dtype(out_dtype);
  const Activation act = resolve_activation(kOp, activation, {Activation::kNone, Activation::kGeluTanh});
  check_inputs(x, x_scale, weight, weight_scale, bias, out_dtype);
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = weight.size(0);
  at::Tensor out = empty_tensor(sizes, x.options().dtype(out_dtype));
  if (out.numel() == 0) return out;  // no tokens (or no output features): nothing to compute
  const auto x_ld = matrix_ld(x), w_ld = matrix_ld(weight);
  TORCH_CHECK_VALUE(x_ld && *x_ld % kFp8Multiple == 0, kOp, ": x's rows must be one stride apart, a multiple of ",
                    kFp8Multiple, " elements (sizes ", x.sizes(), ", strides ", x.strides(), ")");
  TORCH_CHECK_VALUE(w_ld && *w_ld % kFp8Multiple == 0, kOp, ": weight's rows must be a multiple of ", kFp8Multiple,
                    " elements apart (strides ", weight.strides(), ")");
  TORCH_CHECK_VALUE(x.size(-1) > 0 || !bias, kOp, ": in_features 0 with a bias is not supported");
  if (validation_only(x)) return out;
  const at::cuda::OptionalCUDAGuard device_guard(x.device());
  if (x.size(-1) == 0) return out.zero_();  // no products, no bias: zeros, as F.linear gives (gelu_tanh(0) = 0)
  LinearFp8Params p;
  p.x = x.const_data_ptr();
  p.x_ld = *x_ld;
  p.x_scale = x_scale.const_data_ptr<float>();
  p.weight = weight.const_data_ptr();
  p.weight_ld = *w_ld;
  p.weight_scale = weight_scale.const_data_ptr<float>();
  p.bias = bias ? bias->const_data_ptr() : nullptr;
  p.out = out.data_ptr();
  p.out_ld = weight.size(0);
  p.m = num_rows(x);
  p.n = weight.size(0);
  p.k = x.size(-1);
  p.out_dtype = out_type;
  p.activation = act;
  const cublasStatus_t status =
      LinearFp8(at::cuda::getCurrentCUDABlasLtHandle(), p, torch_workspace(), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status != CUBLAS_STATUS_NOT_SUPPORTED, kOp,
              ": cuBLASLt has no FP8 algorithm with row and channel scales for these operands on this GPU (FP8 needs "
              "compute capability 8.9 or later)");
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, kOp, ": cuBLASLt failed: ", cublasLtGetStatusString(status));
  return out;
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&linear_fp8);

}  // namespace transformer_kernels
