// What the GroupNorm bindings share (forward: group_norm.cu; backward: group_norm_backward.cu): one
// call's operands validated the same way, the layout read from x's strides, eps as ATen adds it.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

// The torch version this is built against (TORCH_VERSION_MAJOR/MINOR), for kAtenStatsInXDtype.
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#endif

#include "common/alloc.h"
#include "common/checks.h"
#include "common/choices.h"
#include "group_norm/group_norm.cuh"

namespace transformer_kernels {
namespace group_norm_binding {

using OptTensor = std::optional<at::Tensor>;

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// Whether the F.group_norm of the torch this is built against rounds a group's mean and rstd to x's
// dtype before normalizing (GroupNormParams::stats_in_x_dtype). torch 2.11's libtorch_cuda has
// RowwiseMomentsCUDAKernel<T>(N, T eps, const T* X, T* mean, T* rstd); 2.14's also writes fp32
// mean_acc/rstd_acc and normalizes with those (pytorch/pytorch#183946, May 2026). By the kernel's
// signature in each PyPI wheel's libtorch_cuda.so: 2.12.1 has 2.11's, 2.13.0 has 2.14's.
#if defined(TORCH_VERSION_MAJOR) && defined(TORCH_VERSION_MINOR)
constexpr bool kAtenStatsInXDtype = TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR <= 12);
#else
constexpr bool kAtenStatsInXDtype = true;  // a torch older than its headeronly/version.h
#endif

// One call's operands, validated.
struct GroupNormCall {
  const char* op;
  const at::Tensor* x;
  const at::Tensor* bias_nc;  // [N or 1, C(, 1...)] or null
  const OptTensor* weight;
  const OptTensor* bias;
  int64_t groups;
  double eps;
  bool silu;
  GroupNormLayout layout;
};

inline bool resolve_silu(const char* op, std::string_view activation) {
  return resolve_activation(op, activation, {Activation::kNone, Activation::kSilu}) == Activation::kSilu;
}

// True when t is dense in its dimensions 1.. taken innermost first in `order` (sizes of 1 ignored;
// a tensor of no elements is dense in any order: its strides address nothing).
inline bool dense_in_order(const at::Tensor& t, const std::vector<int64_t>& order) {
  if (t.numel() == 0) return true;
  int64_t expected = 1;
  for (const int64_t d : order) {
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

inline std::vector<int64_t> channels_first_order(int64_t dim) {
  std::vector<int64_t> order;
  for (int64_t d = dim - 1; d >= 1; --d) order.push_back(d);
  return order;
}

inline std::vector<int64_t> channels_last_order(int64_t dim) {
  std::vector<int64_t> order{1};
  for (int64_t d = dim - 1; d >= 2; --d) order.push_back(d);
  return order;
}

// Channels-first when t is dense that way (also the choice when it is dense both ways: S == 1, C == 1,
// no elements).
inline std::optional<GroupNormLayout> layout_of(const at::Tensor& t) {
  if (dense_in_order(t, channels_first_order(t.dim()))) return GroupNormLayout::kChannelsFirst;
  if (dense_in_order(t, channels_last_order(t.dim()))) return GroupNormLayout::kChannelsLast;
  return std::nullopt;
}

inline int64_t spatial_size(const at::Tensor& x) {
  int64_t s = 1;
  for (int64_t d = 2; d < x.dim(); ++d) s *= x.size(d);
  return s;
}

inline GroupNormLayout check_x(const char* op, const at::Tensor& x, int64_t groups) {
  check_cuda(op, x, "x");
  check_float_dtype(op, x, "x");
  TORCH_CHECK_VALUE(x.dim() >= 2, op, ": x must be [N, C, *spatial] (at least 2 dimensions), got shape ", x.sizes());
  TORCH_CHECK_VALUE(groups > 0, op, ": num_groups must be positive, got ", groups);
  const int64_t C = x.size(1);
  TORCH_CHECK_VALUE(C % groups == 0, op, ": x's channel count (x.shape[1] = ", C, ") must be divisible by num_groups (",
                    groups, ")");
  const std::optional<GroupNormLayout> layout = layout_of(x);
  TORCH_CHECK_VALUE(layout.has_value(), op,
                    ": x must be dense in its channel and spatial dimensions, channels-first (NCHW, NCDHW: "
                    "x.contiguous()) or channels-last (NHWC, NDHWC: x.contiguous(memory_format=torch.channels_last)); "
                    "the batch stride is free. Got shape ", x.sizes(), " and strides ", x.strides());
  const int64_t S = spatial_size(x);
  TORCH_CHECK_VALUE(C <= kMaxInt32 && S <= kMaxInt32 && (C / groups) * S <= kMaxInt32, op,
                    ": a group of x (C / num_groups * prod(spatial) = ", (C / groups) * S,
                    " elements) and its spatial size must stay below 2^31");
  return *layout;
}

// A per-channel parameter: [C], contiguous, x's dtype (as F.group_norm's CUDA kernel reads it).
inline void check_param(const char* op, const OptTensor& t, const char* name, const at::Tensor& x) {
  if (!t) return;
  check_same_device(op, *t, name, x, "x");
  check_dtype(op, *t, name, x.scalar_type(), "the dtype of x");
  TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == x.size(1), op, ": ", name, " must be 1-D with x.shape[1] = ",
                    x.size(1), " elements, got shape ", t->sizes());
  TORCH_CHECK_VALUE(t->size(0) <= 1 || t->stride(0) == 1, op, ": ", name, " must be contiguous, got stride ",
                    t->stride(0));
}

// The added per-(sample, channel) bias: [N or 1, C] or that with trailing 1s ([N, C, 1, 1], the
// time embedding as ResnetBlock2D broadcasts it), x's dtype, channels of unit stride.
inline void check_bias_nc(const char* op, const at::Tensor& t, const at::Tensor& x) {
  check_same_device(op, t, "bias_nc", x, "x");
  check_dtype(op, t, "bias_nc", x.scalar_type(), "the dtype of x");
  bool shape_ok = t.dim() >= 2 && t.dim() <= x.dim() && (t.size(0) == 1 || t.size(0) == x.size(0)) &&
                  t.size(1) == x.size(1);
  for (int64_t d = 2; shape_ok && d < t.dim(); ++d) shape_ok = t.size(d) == 1;
  TORCH_CHECK_VALUE(shape_ok, op, ": bias_nc must be [N or 1, C] or [N or 1, C, 1, ...] for x of shape ", x.sizes(),
                    ", got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.size(1) <= 1 || t.stride(1) == 1, op, ": bias_nc must have unit stride along channels, got ",
                    "strides ", t.strides());
}

inline GroupNormCall make_call(const char* op, const at::Tensor& x, const at::Tensor* bias_nc, int64_t groups,
                        const OptTensor& weight, const OptTensor& bias, double eps, std::string_view activation) {
  const GroupNormLayout layout = check_x(op, x, groups);
  check_param(op, weight, "weight", x);
  check_param(op, bias, "bias", x);
  check_eps(op, eps);
  if (bias_nc != nullptr) check_bias_nc(op, *bias_nc, x);
  return {op, &x, bias_nc, &weight, &bias, groups, eps, resolve_silu(op, activation), layout};
}

// The output in x's layout (channels-last outputs keep x's memory format, as the next conv wants).
inline at::Tensor empty_output(const GroupNormCall& c) {
  const at::Tensor& x = *c.x;
  if (c.layout == GroupNormLayout::kChannelsFirst) return empty_tensor(x.sizes(), x.options());
  std::vector<int64_t> sizes{x.size(0)}, perm{0, x.dim() - 1};
  for (int64_t d = 2; d < x.dim(); ++d) sizes.push_back(x.size(d));
  sizes.push_back(x.size(1));
  for (int64_t d = 1; d < x.dim() - 1; ++d) perm.push_back(d);
  return empty_tensor(sizes, x.options()).permute(perm);
}

// eps as ATen's CUDA kernel adds it: cast to x's dtype first (static_cast<scalar_t>(eps)).
template <typename T>
float aten_eps(double eps) {
  if constexpr (std::is_same_v<T, __half>) return static_cast<float>(static_cast<at::Half>(eps));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return static_cast<float>(static_cast<at::BFloat16>(eps));
  else return static_cast<float>(eps);
}

inline int64_t batch_stride(const at::Tensor& t) { return t.size(0) == 1 ? 0 : t.stride(0); }

}  // namespace group_norm_binding
}  // namespace transformer_kernels
