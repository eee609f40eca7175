// Torch entry points of the quantization family (quantize_fp8, act_mul_fp8): validate, allocate the
// codes and the scales, launch QuantizeFp8 (quantize_fp8.cuh) on the current stream of x's device.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <string_view>
#include <tuple>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/choices.h"
#include "common/dispatch.h"
#include "quant/ops.h"
#include "quant/quantize_fp8.cuh"

namespace transformer_kernels {
namespace {


// The codes [..., K] and scales [..., 1] of x's rows (or, with `up`, of act(x) * up's), validated,
// allocated and launched on the current stream of x's device.
std::tuple<at::Tensor, at::Tensor> quantize_rows(const char* op, const at::Tensor& x, const at::Tensor* up,
                                                 Activation act, const char* x_name) {
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": ", x_name, " must have at least one dimension (its rows' elements), got a scalar");
  check_row_input(op, x, x_name);
  if (up != nullptr) check_same_as_x(op, *up, "up", x, x_name);
  at::Tensor codes = empty_tensor(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = empty_row_scales(x);
  if (validation_only(x)) return {codes, scale};
  const at::cuda::OptionalCUDAGuard device_guard(x.device());
  // Every row gets a scale, rows of no elements too (the floor's): one per element of `scale`.
  const int64_t rows = scale.numel();
  check_row_count(op, rows, x_name);
  dispatch_float_dtype(x.scalar_type(), x_name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    QuantizeFp8Params<T> p;
    p.x = static_cast<const T*>(x.const_data_ptr());
    p.x_rows = row_indexer(op, x, x_name);
    if (up != nullptr) {
      p.up = static_cast<const T*>(up->const_data_ptr());
      p.up_rows = row_indexer(op, *up, "up");
    }
    p.out = static_cast<uint8_t*>(codes.data_ptr());
    p.out_rows = row_indexer(op, codes, "codes");
    p.scale = scale.data_ptr<float>();
    p.num_rows = rows;
    p.hidden = x.size(-1);
    const auto stream = at::cuda::getCurrentCUDAStream();
    cudaError_t err = cudaErrorInvalidValue;
    switch (act) {
      case Activation::kSilu: err = QuantizeFp8<Activation::kSilu>(p, stream); break;
      case Activation::kGelu: err = QuantizeFp8<Activation::kGelu>(p, stream); break;
      case Activation::kGeluTanh: err = QuantizeFp8<Activation::kGeluTanh>(p, stream); break;
      case Activation::kNone: err = QuantizeFp8<Activation::kNone>(p, stream); break;
    }
    check_launch(op, err);
  });
  return {codes, scale};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> quantize_fp8(const at::Tensor& x) {
  return quantize_rows("quantize_fp8", x, nullptr, Activation::kNone, "x");
}

std::tuple<at::Tensor, at::Tensor> act_mul_fp8(const at::Tensor& gate, const at::Tensor& up, std::string_view act) {
  constexpr const char* op = "act_mul_fp8";
  return quantize_rows(op, gate, &up, resolve_activation(op, act), "gate");
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&quantize_fp8, &act_mul_fp8);

}  // namespace transformer_kernels
