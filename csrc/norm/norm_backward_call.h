// What the norm backward bindings build for one backward: its tensors (NormBackwardCall).
// norm_backward.cu validates, allocates the outputs, fills a NormBackwardLaunch from the call and
// hands it to the planner and launcher of its (norm, features) combination, compiled in backward/
// and found in the VariantRegistry<NormBackwardVariant> (norm_backward_instances.cuh).
#pragma once

#include <ATen/core/Tensor.h>

#include "norm/norm_backward.cuh"

namespace transformer_kernels {
namespace norm_backward_binding {

// Everything one backward needs, as torch tensors; nullptr for what is absent or not wanted.
struct NormBackwardCall {
  const char* op;
  NormType type;
  const at::Tensor* dout;             // gradient of out, x's shape
  const at::Tensor* dh_in = nullptr;  // gradient of the forward's h output, x's shape
  const at::Tensor* h = nullptr;      // what was normalized (kNone: nullptr, dout gives the shape)
  const at::Tensor* weight = nullptr;
  const at::Tensor* bias = nullptr;
  const at::Tensor* scale = nullptr;  // broadcast to x's shape
  const at::Tensor* shift = nullptr;  // broadcast to x's shape
  const at::Tensor* y = nullptr;      // the gated pre-add's branch output
  const at::Tensor* gate = nullptr;   // broadcast to x's shape
  double eps = 0.0;
  // Outputs, allocated by the caller (contiguous): dh and dy of x's shape, each parameter's
  // gradient of the parameter's shape, in ParamGrad order.
  at::Tensor* dh = nullptr;
  at::Tensor* dy = nullptr;
  at::Tensor* grads[kNumParamGrads] = {};
};

}  // namespace norm_backward_binding
}  // namespace transformer_kernels
