// Torch entry points of GroupNorm: validate, plan, allocate the output and the statistics
// workspace, and call the torch-free launcher in group_norm.cuh on the current stream of x's device.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <tuple>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/dispatch.h"
#include "group_norm/group_norm.cuh"
#include "group_norm/group_norm_call.h"
#include "group_norm/ops.h"

namespace transformer_kernels {
namespace {

using namespace group_norm_binding;

void check_out(const GroupNormCall& c, const at::Tensor& out) {
  const at::Tensor& x = *c.x;
  check_same_device(c.op, out, "out", x, "x");
  TORCH_CHECK_VALUE(out.sizes() == x.sizes(), c.op, ": out must have the shape of x ", x.sizes(), ", got ", out.sizes());
  check_dtype(c.op, out, "out", x.scalar_type(), "the dtype of x");
  const std::vector<int64_t> order =
      c.layout == GroupNormLayout::kChannelsFirst ? channels_first_order(x.dim()) : channels_last_order(x.dim());
  TORCH_CHECK_VALUE(dense_in_order(out, order), c.op, ": out must have x's memory format (",
                    c.layout == GroupNormLayout::kChannelsFirst ? "channels-first" : "channels-last",
                    ", any batch stride), got strides ", out.strides(), " for x's ", x.strides());
  check_writable_output(c.op, out, "out");
  check_no_overlap(c.op, out, "out", x, "x");
  if (c.bias_nc != nullptr) check_no_overlap(c.op, out, "out", *c.bias_nc, "bias_nc");
  if (*c.weight) check_no_overlap(c.op, out, "out", **c.weight, "weight");
  if (*c.bias) check_no_overlap(c.op, out, "out", **c.bias, "bias");
}

template <typename T>
void run(const GroupNormCall& c, at::Tensor& out) {
  const at::Tensor& x = *c.x;
  GroupNormParams<T> p;
  p.x = reinterpret_cast<const T*>(x.const_data_ptr());
  p.x_batch_stride = batch_stride(x);
  if (c.bias_nc != nullptr) {
    p.bias_nc = reinterpret_cast<const T*>(c.bias_nc->const_data_ptr());
    p.bias_nc_batch_stride = batch_stride(*c.bias_nc);
  }
  if (*c.weight) p.weight = reinterpret_cast<const T*>((*c.weight)->const_data_ptr());
  if (*c.bias) p.bias = reinterpret_cast<const T*>((*c.bias)->const_data_ptr());
  p.out = reinterpret_cast<T*>(out.data_ptr());
  p.out_batch_stride = batch_stride(out);
  p.batch = x.size(0);
  p.channels = static_cast<int>(x.size(1));
  p.groups = static_cast<int>(c.groups);
  p.spatial = spatial_size(x);
  p.eps = aten_eps<T>(c.eps);
  p.stats_in_x_dtype = kAtenStatsInXDtype;
  p.silu = c.silu;
  p.plan = group_norm_plan(p, c.layout, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  TORCH_CHECK_VALUE(group_norm_plan_supported(p.plan), c.op, ": channels-last x with ", p.channels,
                    " channels needs at most ", kGroupNormMaxRowThreads, " vectors across a row (16-byte vectors "
                    "when C is a multiple of ", vec_size<T>(), " and x and out are 16-byte aligned, else single "
                    "elements); pass x.contiguous()");
  const int64_t blocks = c.layout == GroupNormLayout::kChannelsFirst ? p.batch * p.groups * p.plan.parts
                                                                      : p.batch * p.plan.parts;
  TORCH_CHECK_VALUE(blocks <= kMaxInt32 && p.batch * p.groups <= kMaxInt32 / kWarpSize, c.op, ": x of shape ",
                    x.sizes(), " needs more thread blocks than a grid holds");
  // The statistics' workspace, freed after the launches: the caching allocator reuses it only for
  // later work on this stream.
  at::Tensor workspace;
  const int64_t floats = group_norm_workspace_floats(p.plan, p.batch, p.groups);
  if (floats > 0) {
    workspace = empty_tensor({floats}, x.options().dtype(at::kFloat));
    p.workspace = workspace.data_ptr<float>();
  }
  const cudaError_t err = GroupNorm(p, at::cuda::getCurrentCUDAStream());
  check_launch(c.op, err);
}

void launch_group_norm_call(const GroupNormCall& c, at::Tensor& out) {
  if (c.x->numel() == 0 || validation_only(*c.x)) return;
  const at::cuda::OptionalCUDAGuard device_guard(c.x->device());
  dispatch_float_dtype(c.x->scalar_type(), "x", [&](auto tag) { run<typename decltype(tag)::type>(c, out); });
}

}  // namespace

at::Tensor group_norm(const at::Tensor& x, int64_t num_groups, const OptTensor& weight, const OptTensor& bias,
                      double eps, std::string_view activation) {
  const GroupNormCall c = make_call("group_norm", x, nullptr, num_groups, weight, bias, eps, activation);
  at::Tensor out = empty_output(c);
  launch_group_norm_call(c, out);
  return out;
}

void group_norm_out(at::Tensor& out, const at::Tensor& x, int64_t num_groups, const OptTensor& weight,
                    const OptTensor& bias, double eps, std::string_view activation) {
  const GroupNormCall c = make_call("group_norm", x, nullptr, num_groups, weight, bias, eps, activation);
  check_out(c, out);
  launch_group_norm_call(c, out);
}

at::Tensor add_group_norm(const at::Tensor& x, const at::Tensor& bias_nc, int64_t num_groups, const OptTensor& weight,
                          const OptTensor& bias, double eps, std::string_view activation) {
  const GroupNormCall c = make_call("add_group_norm", x, &bias_nc, num_groups, weight, bias, eps, activation);
  at::Tensor out = empty_output(c);
  launch_group_norm_call(c, out);
  return out;
}

void add_group_norm_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& bias_nc, int64_t num_groups,
                        const OptTensor& weight, const OptTensor& bias, double eps, std::string_view activation) {
  const GroupNormCall c = make_call("add_group_norm", x, &bias_nc, num_groups, weight, bias, eps, activation);
  check_out(c, out);
  launch_group_norm_call(c, out);
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&group_norm, &group_norm_out, &add_group_norm,
    &add_group_norm_out);

}  // namespace transformer_kernels
