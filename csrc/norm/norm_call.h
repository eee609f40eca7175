// What the norm bindings build for one launch: its tensors (NormCall). The torch-free launchers they
// call, one per (norm, pre-add, modulation, FP8 output) combination, are compiled in instances/ and found in the
// VariantRegistry<NormVariant> (norm_instances.cuh).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "common/variants.h"
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
  // An FP8 output: `out` holds e4m3 codes of the values in x's dtype, this each row's scale [..., 1].
  at::Tensor* out_scale = nullptr;
  bool round_normalized = false;

  NormCall(const char* op_, NormType type_, const at::Tensor& x_, at::Tensor& out_, double eps_)
      : op(op_), type(type_), x(&x_), out(&out_), eps(eps_) {}
};

}  // namespace norm_binding

}  // namespace transformer_kernels
