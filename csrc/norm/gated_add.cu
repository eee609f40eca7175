// Torch entry points of gated_add (x + gate * y: a DiT block's gated residual with no norm after
// it), a member of the norm family: its backward is the norm backward with no norm
// (norm_backward.cu, NormType::kNone). The forward is the elementwise kernel's gated-add form
// (common/elementwise.cuh, torch-free), launched here.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <tuple>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/dispatch.h"
#include "common/elementwise.cuh"
#include "norm/ops.h"

namespace transformer_kernels {
namespace {

constexpr const char* kOp = "gated_add";

// x, y [..., H] alike; gate broadcast to x's shape ([H], [B, 1, H], [B, S, H] or strided views).
void check_gated_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate) {
  check_row_input(kOp, x, "x");
  check_same_as_x(kOp, y, "y", x);
  check_broadcasts_to(kOp, gate, "gate", x);
}

void launch_gated_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate, at::Tensor& out) {
  if (validation_only(x)) return;
  const at::cuda::OptionalCUDAGuard device_guard(x.device());
  dispatch_float_dtype(x.scalar_type(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    ElementwiseParams<T> p;
    p.x = static_cast<const T*>(x.const_data_ptr());
    p.x_rows = row_indexer(kOp, x, "x");
    p.gated = static_cast<const T*>(y.const_data_ptr());
    p.gated_rows = row_indexer(kOp, y, "y");
    p.gate = static_cast<const T*>(gate.const_data_ptr());
    p.gate_rows = broadcast_row_indexer(kOp, gate, "gate", x);
    p.out = static_cast<T*>(out.data_ptr());
    p.out_rows = row_indexer(kOp, out, "out");
    p.num_rows = num_rows(x);
    p.cols = x.size(-1);
    const cudaError_t err =
        elementwise<Elementwise::kGatedAdd, Activation::kNone>(p, at::cuda::getCurrentCUDAStream());
    check_launch(kOp, err);
  });
}

}  // namespace

at::Tensor gated_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate) {
  check_gated_add(x, y, gate);
  at::Tensor out = empty_tensor(x.sizes(), x.options());
  launch_gated_add(x, y, gate, out);
  return out;
}

void gated_add_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate) {
  check_gated_add(x, y, gate);
  check_output(kOp, out, "out", x, x.sizes(), x.scalar_type(), {{&x, "x"}, {&y, "y"}, {&gate, "gate"}});
  launch_gated_add(x, y, gate, out);
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&gated_add, &gated_add_out);

}  // namespace transformer_kernels
