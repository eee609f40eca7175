// What the norm bindings build for one launch: its tensors (NormCall), and the torch-free
// launchers they call, one per (norm, pre-add, modulation) combination, compiled in instances/
// (norm_instances.cuh).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "norm/norm.cuh"

namespace transformer_kernels {
namespace norm_binding {

using OptTensor = std::optional<at::Tensor>;

// Everything one kernel launch needs, as torch tensors: the op, the norm, x, the output and eps
// at construction, the rest by name (null where absent).
struct NormCall {
  const char* op;
  NormType type;
  const at::Tensor* x;
  at::Tensor* out;
  double eps;
  PreAdd pre = PreAdd::kNone;
  const at::Tensor* residual = nullptr;  // the residual (kResidual) or the branch output y (kGated)
  const at::Tensor* gate = nullptr;      // broadcast to x's shape
  const at::Tensor* weight = nullptr;
  const at::Tensor* bias = nullptr;
  const at::Tensor* scale = nullptr;  // broadcast to x's shape
  const at::Tensor* shift = nullptr;  // broadcast to x's shape
  at::Tensor* h_out = nullptr;
  bool round_normalized = false;

  NormCall(const char* op_, NormType type_, const at::Tensor& x_, at::Tensor& out_, double eps_)
      : op(op_), type(type_), x(&x_), out(&out_), eps(eps_) {}
};

}  // namespace norm_binding

// Launches the kernel for l's dtypes on `stream` (norm_instances.cuh); instantiated in instances/*.cu
// for the combinations the ops use.
template <NormType kNorm, PreAdd kPre, bool kMod>
cudaError_t launch_norm(const NormLaunch& l, cudaStream_t stream);

}  // namespace transformer_kernels
