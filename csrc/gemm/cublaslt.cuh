// What the cuBLASLt GEMMs of the gemm family share: the workspace, the owners of cuBLASLt's opaque
// descriptors, attribute setters and the alignment a matrix allows. Torch-free.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace transformer_kernels {

struct GemmWorkspace {
  void* ptr;  // device memory the matmul may use, valid for work queued on the stream
  size_t bytes;
};

namespace cublaslt {

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
