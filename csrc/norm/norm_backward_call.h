// What the norm backward bindings hand to the kernel dispatch: one backward's tensors. The dispatch
// for each (norm, features) combination is compiled in its own file under backward/ (they build in
// parallel); norm_backward.cu validates, allocates the outputs and calls dispatch_norm_backward.
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

// Picks the kernel for the dtypes (x's T; weight T or fp32; dout T, or fp32 for RMSNorm's fp32
// output) and launches it on the current stream: whole rows where a row group holds them, column
// chunks (dispatch_norm_backward_chunked) otherwise. Rows and hidden > 0.
template <NormType kNorm, int kFeatures>
void dispatch_norm_backward(const NormBackwardCall& c);

template <NormType kNorm>
void dispatch_norm_backward_chunked(const NormBackwardCall& c);

}  // namespace norm_backward_binding
}  // namespace transformer_kernels
