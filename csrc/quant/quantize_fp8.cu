// Torch entry point of quantize_fp8: validate, allocate the codes and the scales, launch
// QuantizeFp8 (quantize_fp8.cuh) on the current stream of x's device.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <tuple>
#include <vector>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/dispatch.h"
#include "quant/ops.h"
#include "quant/quantize_fp8.cuh"

namespace transformer_kernels {
namespace {

constexpr const char* kOp = "quantize_fp8";

}  // namespace

std::tuple<at::Tensor, at::Tensor> quantize_fp8(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.dim() >= 1, kOp, ": x must have at least one dimension (its rows' elements), got a scalar");
  check_row_input(kOp, x, "x");
  std::vector<int64_t> scale_sizes(x.sizes().begin(), x.sizes().end());
  scale_sizes.back() = 1;
  at::Tensor codes = empty_tensor(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = empty_tensor(scale_sizes, x.options().dtype(at::kFloat));
  if (validation_only(x)) return {codes, scale};
  const at::cuda::OptionalCUDAGuard device_guard(x.device());
  // Every row gets a scale, rows of no elements too (the floor's): one per element of `scale`.
  const int64_t rows = scale.numel();
  check_row_count(kOp, rows, "x");
  dispatch_float_dtype(x.scalar_type(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    QuantizeFp8Params<T> p;
    p.x = static_cast<const T*>(x.const_data_ptr());
    p.x_rows = row_indexer(kOp, x, "x");
    p.out = static_cast<uint8_t*>(codes.data_ptr());
    p.out_rows = row_indexer(kOp, codes, "codes");
    p.scale = scale.data_ptr<float>();
    p.num_rows = rows;
    p.hidden = x.size(-1);
    const cudaError_t err = QuantizeFp8(p, at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, kOp, ": kernel launch failed: ", cudaGetErrorString(err));
  });
  return {codes, scale};
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&quantize_fp8);

}  // namespace transformer_kernels
