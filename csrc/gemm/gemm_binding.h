// What the gemm family's bindings share: a tensor's leading dimension as a matrix, and torch's
// cuBLASLt workspace.
#pragma once

#include <ATen/cuda/CUDAContext.h>

#include <optional>

#include "common/checks.h"
#include "gemm/cublaslt.cuh"

namespace transformer_kernels {

// The row stride of t seen as a matrix [rows, t.size(-1)]: its leading dimensions merge into one
// and its rows are contiguous. nullopt where they do not (the fallback takes any strides).
inline std::optional<int64_t> matrix_ld(const at::Tensor& t) {
  if (t.size(-1) > 1 && t.stride(-1) != 1) return std::nullopt;
  RowIndexer rows;
  if (!make_row_indexer(t.sizes().data(), t.strides().data(), static_cast<int>(t.dim()) - 1, &rows) ||
      rows.ndim != 1)
    return std::nullopt;
  // A single row (or one column) has no meaningful stride; cuBLASLt wants ld >= the row length.
  const int64_t ld = num_rows(t) <= 1 ? t.size(-1) : rows.strides[0];
  return ld >= t.size(-1) ? std::optional<int64_t>(ld) : std::nullopt;
}

// torch's cuBLASLt workspace (what at::linear's cuBLASLt calls use), for work on the current stream.
inline GemmWorkspace torch_workspace() {
  return {at::cuda::getCUDABlasLtWorkspace(), at::cuda::getCUDABlasLtWorkspaceSize()};
}

}  // namespace transformer_kernels
