// Torch entry point of RMSNorm: validates the arguments, picks the dtypes and calls the
// torch-free launcher in rms_norm.cuh on the current stream of x's device.
#include <ATen/ops/empty.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>
#include <string_view>

#include "common/checks.h"
#include "common/dispatch.h"
#include "norm/rms_norm.cuh"

namespace transformer_kernels {
namespace {

constexpr const char* kOp = "rms_norm";

// The rounding of the module being replaced (see the Python docstring of rms_norm).
struct RmsNormRounding {
  bool round_normalized;       // round x * inv_rms to x.dtype before the weight multiply
  c10::ScalarType out_dtype;
};

RmsNormRounding resolve_rounding(std::string_view rounding, const at::Tensor& x,
                                 const std::optional<at::Tensor>& weight) {
  const c10::ScalarType weight_dtype = weight ? weight->scalar_type() : x.scalar_type();
  if (rounding == "hf") return {true, weight_dtype};
  if (rounding == "diffusers") return {weight_dtype == x.scalar_type(), weight_dtype};
  if (rounding == "torch") return {false, x.scalar_type()};
  TORCH_CHECK_VALUE(false, kOp, ": rounding must be \"hf\", \"diffusers\" or \"torch\", got \"", rounding, "\"");
}

template <typename in_t, typename weight_t, typename out_t>
void run(at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
         bool round_normalized) {
  RmsNormParams<in_t, weight_t, out_t> p;
  p.out = reinterpret_cast<out_t*>(out.data_ptr());
  p.x = reinterpret_cast<const in_t*>(x.const_data_ptr());
  p.weight = weight ? reinterpret_cast<const weight_t*>(weight->const_data_ptr()) : nullptr;
  p.x_rows = row_indexer(kOp, x, "x");
  p.out_rows = row_indexer(kOp, out, "out");
  p.num_rows = num_rows(x);
  p.hidden = x.size(-1);
  p.eps = static_cast<float>(eps);
  p.round_normalized = round_normalized;
  const cudaError_t err = rms_norm(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, kOp, ": kernel launch failed: ", cudaGetErrorString(err));
}

// Validates x, weight, eps and rounding; returns what the rounding asks of the kernel.
RmsNormRounding check_inputs(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                             std::string_view rounding) {
  check_cuda(kOp, x, "x");
  check_float_dtype(kOp, x, "x");
  check_last_dim_contiguous(kOp, x, "x");
  if (weight) {
    check_same_device(kOp, *weight, "weight", x, "x");
    TORCH_CHECK_VALUE(weight->dim() == 1 && weight->size(0) == x.size(-1), kOp,
                      ": weight must be 1-D with x.shape[-1] = ", x.size(-1), " elements, got shape ", weight->sizes());
    TORCH_CHECK_VALUE(weight->size(0) <= 1 || weight->stride(0) == 1, kOp, ": weight must be contiguous, got stride ",
                      weight->stride(0));
    TORCH_CHECK_TYPE(weight->scalar_type() == x.scalar_type() || weight->scalar_type() == at::kFloat, kOp,
                     ": weight must have the dtype of x (", x.scalar_type(), ") or float32, got ",
                     weight->scalar_type());
  }
  check_eps(kOp, eps);
  check_row_count(kOp, num_rows(x), "x");
  return resolve_rounding(rounding, x, weight);
}

void check_out(const at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
               const RmsNormRounding& r) {
  check_same_device(kOp, out, "out", x, "x");
  check_same_shape(kOp, out, "out", x, "x");
  check_dtype(kOp, out, "out", r.out_dtype, "the output dtype of the chosen rounding");
  check_last_dim_contiguous(kOp, out, "out");
  check_writable_output(kOp, out, "out");
  check_no_overlap(kOp, out, "out", x, "x");
  if (weight) check_no_overlap(kOp, out, "out", *weight, "weight");
}

void launch(at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
            const RmsNormRounding& r) {
  const at::cuda::OptionalCUDAGuard device_guard(x.device());
  const bool weight_f32 = weight && weight->scalar_type() == at::kFloat;
  const bool out_f32 = out.scalar_type() == at::kFloat;
  dispatch_float_dtype(x.scalar_type(), "x", [&](auto tag) {
    using in_t = typename decltype(tag)::type;
    if constexpr (std::is_same_v<in_t, float>) {
      run<float, float, float>(out, x, weight, eps, r.round_normalized);
    } else if (!weight_f32) {
      run<in_t, in_t, in_t>(out, x, weight, eps, r.round_normalized);
    } else if (out_f32) {
      run<in_t, float, float>(out, x, weight, eps, r.round_normalized);
    } else {
      run<in_t, float, in_t>(out, x, weight, eps, r.round_normalized);
    }
  });
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                    std::string_view rounding) {
  const RmsNormRounding r = check_inputs(x, weight, eps, rounding);
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(r.out_dtype));
  launch(out, x, weight, eps, r);
  return out;
}

void rms_norm_out(at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                  std::string_view rounding) {
  const RmsNormRounding r = check_inputs(x, weight, eps, rounding);
  check_out(out, x, weight, r);
  launch(out, x, weight, eps, r);
}

}  // namespace transformer_kernels
