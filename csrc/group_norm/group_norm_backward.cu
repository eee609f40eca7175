// Torch entry point of GroupNorm's backward (group_norm and add_group_norm, + SiLU): validate as the
// forward does, allocate the asked gradients and the workspace, and call the torch-free launcher in
// group_norm_backward.cuh on the current stream of x's device.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>
#include <tuple>
#include <vector>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/dispatch.h"
#include "group_norm/group_norm_backward.cuh"
#include "group_norm/group_norm_call.h"
#include "group_norm/ops.h"

namespace transformer_kernels {
namespace {

using namespace group_norm_binding;

constexpr const char* kOp = "group_norm_backward";

at::Tensor not_asked(const at::Tensor& x) { return empty_tensor({0}, x.options()); }

// grad_out: x's device, shape, dtype and layout (the kernels index both with x's strides but the batch's).
void check_grad_out(const GroupNormCall& c, const at::Tensor& grad_out) {
  const at::Tensor& x = *c.x;
  check_same_device(kOp, grad_out, "grad_out", x, "x");
  check_dtype(kOp, grad_out, "grad_out", x.scalar_type(), "the dtype of x");
  TORCH_CHECK_VALUE(grad_out.sizes() == x.sizes(), kOp, ": grad_out must have the shape of x ", x.sizes(), ", got ",
                    grad_out.sizes());
  const std::vector<int64_t> order =
      c.layout == GroupNormLayout::kChannelsFirst ? channels_first_order(x.dim()) : channels_last_order(x.dim());
  TORCH_CHECK_VALUE(dense_in_order(grad_out, order), kOp, ": grad_out must have x's memory format (",
                    c.layout == GroupNormLayout::kChannelsFirst ? "channels-first" : "channels-last",
                    ", any batch stride), got strides ", grad_out.strides(), " for x's ", x.strides());
}

template <typename T>
void run(const GroupNormCall& c, const at::Tensor& grad_out, at::Tensor& dx, at::Tensor& dbias_nc, at::Tensor& dw,
         at::Tensor& db) {
  const at::Tensor& x = *c.x;
  GroupNormBackwardParams<T> p;
  p.grad_out = reinterpret_cast<const T*>(grad_out.const_data_ptr());
  p.grad_out_batch_stride = batch_stride(grad_out);
  p.x = reinterpret_cast<const T*>(x.const_data_ptr());
  p.x_batch_stride = batch_stride(x);
  if (c.bias_nc != nullptr) {
    p.bias_nc = reinterpret_cast<const T*>(c.bias_nc->const_data_ptr());
    p.bias_nc_batch_stride = batch_stride(*c.bias_nc);
  }
  if (*c.weight) p.weight = reinterpret_cast<const T*>((*c.weight)->const_data_ptr());
  if (*c.bias) p.bias = reinterpret_cast<const T*>((*c.bias)->const_data_ptr());
  if (dx.numel() > 0) {
    p.grad_x = reinterpret_cast<T*>(dx.data_ptr());
    p.grad_x_batch_stride = batch_stride(dx);
  }
  if (dbias_nc.numel() > 0) {
    p.grad_bias_nc = reinterpret_cast<T*>(dbias_nc.data_ptr());
    p.grad_bias_nc_rows = dbias_nc.size(0);
  }
  if (dw.numel() > 0) p.grad_weight = reinterpret_cast<T*>(dw.data_ptr());
  if (db.numel() > 0) p.grad_bias = reinterpret_cast<T*>(db.data_ptr());
  p.batch = x.size(0);
  p.channels = static_cast<int>(x.size(1));
  p.groups = static_cast<int>(c.groups);
  p.spatial = spatial_size(x);
  p.eps = aten_eps<T>(c.eps);
  p.stats_in_x_dtype = kAtenStatsInXDtype;
  p.silu = c.silu;
  p.layout = c.layout;
  p.plan = group_norm_backward_plan(c.layout, p.batch, p.channels, p.spatial,
                                    at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  TORCH_CHECK_VALUE(x.numel() / GroupNormPolicy::kBackwardBlockThreads < kMaxInt32 &&
                        p.batch * p.plan.channel_tiles * p.plan.splits <= kMaxInt32,
                    kOp, ": x of shape ", x.sizes(), " needs more thread blocks than a grid holds");
  at::Tensor workspace = empty_tensor(
      {group_norm_backward_workspace_floats(p.batch, p.channels, p.groups, p.plan.splits)}, x.options().dtype(at::kFloat));
  p.workspace = workspace.data_ptr<float>();
  check_launch(kOp, GroupNormBackward(p, at::cuda::getCurrentCUDAStream()));
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> group_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const std::optional<at::Tensor>& bias_nc, int64_t num_groups,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
    std::string_view activation, std::array<bool, 4> output_mask) {
  const GroupNormCall c = make_call(kOp, x, bias_nc ? &*bias_nc : nullptr, num_groups, weight, bias, eps, activation);
  check_grad_out(c, grad_out);
  // The gradients asked for (and of an operand given), in their operand's shape (x's: its layout);
  // an empty [0] tensor otherwise. Rows of no elements give zero parameter gradients.
  at::Tensor dx = output_mask[0] ? empty_output(c) : not_asked(x);
  at::Tensor dbias_nc = output_mask[1] && bias_nc
                            ? empty_tensor({bias_nc->size(0), x.size(1)}, x.options()).view(bias_nc->sizes())
                            : not_asked(x);
  at::Tensor dw = output_mask[2] && weight ? empty_tensor({x.size(1)}, x.options()) : not_asked(x);
  at::Tensor db = output_mask[3] && bias ? empty_tensor({x.size(1)}, x.options()) : not_asked(x);
  if (validation_only(x)) return {dx, dbias_nc, dw, db};
  const at::cuda::OptionalCUDAGuard device_guard(x.device());
  if (x.numel() == 0) {  // no element: every gradient of a parameter is a sum of nothing
    for (at::Tensor* t : {&dbias_nc, &dw, &db}) t->zero_();
    return {dx, dbias_nc, dw, db};
  }
  dispatch_float_dtype(x.scalar_type(), "x", [&](auto tag) {
    run<typename decltype(tag)::type>(c, grad_out, dx, dbias_nc, dw, db);
  });
  return {dx, dbias_nc, dw, db};
}

// The entry point defined above is the one ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous.
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&group_norm_backward);

}  // namespace transformer_kernels
