// What the cuBLASLt GEMMs of the gemm family share: the workspace, the owners of cuBLASLt's opaque
// descriptors, attribute setters and the alignment a matrix allows. Torch-free.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/float_type.h"

namespace transformer_kernels {

struct GemmWorkspace {
  void* ptr;  // device memory the matmul may use, valid for work queued on the stream
  size_t bytes;
};

namespace cublaslt {

// cuBLASLt's name of a 16-bit storage type (the GEMMs' activations and outputs; float32 otherwise).
inline cudaDataType_t data_type(FloatType t) {
  switch (t) {
    case FloatType::kFloat16: return CUDA_R_16F;
    case FloatType::kBFloat16: return CUDA_R_16BF;
    case FloatType::kFloat32: break;
  }
  return CUDA_R_32F;
}

constexpr uint32_t kMaxAlignmentBytes = 256;  // the largest alignment cuBLASLt's preference takes

// The alignment cuBLASLt may assume for a matrix: its base address and its leading dimension.
inline uint32_t alignment(const void* ptr, int64_t ld_bytes) {
  const auto address = reinterpret_cast<uintptr_t>(ptr) | static_cast<uintptr_t>(ld_bytes);
  uint32_t a = kMaxAlignmentBytes;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// Owners of cuBLASLt's opaque descriptors.
struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* d) const { cublasLtMatrixLayoutDestroy(d); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* d) const { cublasLtMatmulPreferenceDestroy(d); }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, DescDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, DescDeleter>;

template <typename Attr, typename V>
cublasStatus_t set(cublasLtMatmulDesc_t d, Attr attr, const V& value) {
  return cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value));
}
template <typename V>
cublasStatus_t set_pref(cublasLtMatmulPreference_t d, cublasLtMatmulPreferenceAttributes_t attr, const V& value) {
  return cublasLtMatmulPreferenceSetAttribute(d, attr, &value, sizeof(value));
}

}  // namespace cublaslt
}  // namespace transformer_kernels

// Returns the status of a failed cuBLASLt call from the enclosing function.
#define TK_CUBLAS_TRY(call)                                     \
  do {                                                          \
    const cublasStatus_t tk_status_ = (call);                   \
    if (tk_status_ != CUBLAS_STATUS_SUCCESS) return tk_status_; \
  } while (0)

namespace transformer_kernels {

// One row-major linear layer as cuBLASLt sees it (column-major): D [N, M] = op(A) B with A = the
// weight (row-major [N, K], transposed), B = x (row-major [M, K]); C is D (beta 0). Leading
// dimensions in elements of each operand's type.
struct LinearMatmul {
  const void* weight;
  cudaDataType_t weight_type;
  int64_t weight_ld;
  const void* x;
  cudaDataType_t x_type;
  int64_t x_ld;
  void* out;
  cudaDataType_t out_type;
  int64_t out_ld;
  int64_t m, n, k;
};

// Asks cuBLASLt's heuristic for an algorithm for `desc` (its epilogue and scales set by the caller)
// on operands of g's layouts and alignments within `workspace`; when `launch`, queues it on `stream`.
// CUBLAS_STATUS_NOT_SUPPORTED, having queued nothing, where none is found.
inline cublasStatus_t RunLinearMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const LinearMatmul& g,
                                      GemmWorkspace workspace, cudaStream_t stream, bool launch) {
  using namespace cublaslt;
  auto bytes = [](cudaDataType_t t) -> int64_t {
    return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2 ? 1 : t == CUDA_R_32F ? 4 : 2;
  };
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  TK_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&a, g.weight_type, g.k, g.n, g.weight_ld));
  const Layout a_owner(a);
  TK_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&b, g.x_type, g.k, g.m, g.x_ld));
  const Layout b_owner(b);
  TK_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&d, g.out_type, g.n, g.m, g.out_ld));
  const Layout d_owner(d);

  cublasLtMatmulPreference_t raw_pref = nullptr;
  TK_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&raw_pref));
  const Preference pref(raw_pref);
  const uint32_t out_alignment = alignment(g.out, g.out_ld * bytes(g.out_type));
  TK_CUBLAS_TRY(set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace.bytes));
  TK_CUBLAS_TRY(set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                         alignment(g.weight, g.weight_ld * bytes(g.weight_type))));
  TK_CUBLAS_TRY(set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(g.x, g.x_ld * bytes(g.x_type))));
  TK_CUBLAS_TRY(set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, out_alignment));
  TK_CUBLAS_TRY(set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, out_alignment));

  cublasLtMatmulHeuristicResult_t heuristic = {};
  int found = 0;
  TK_CUBLAS_TRY(cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, raw_pref, 1, &heuristic, &found));
  if (found == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!launch) return CUBLAS_STATUS_SUCCESS;
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(handle, desc, &alpha, g.weight, a, g.x, b, &beta, g.out, d, g.out, d, &heuristic.algo,
                        workspace.ptr, workspace.bytes, stream);
}

}  // namespace transformer_kernels
