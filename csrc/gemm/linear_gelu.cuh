// out = gelu_tanh(x @ weight^T + bias) as one cuBLASLt matmul with the GELU(+bias) epilogue: the
// bias and the activation are applied to the fp32 accumulator, then rounded once. Torch-free: the
// caller passes the handle, the workspace and the stream (the binding takes torch's).
//
// cuBLASLt is column-major; a row-major [M, N] output is the column-major [N, M] matrix
// D = op(A) B with A = weight (row-major [N, K] = column-major [K, N], transposed) and B = x
// (row-major [M, K] = column-major [K, M]); the bias is one value per row of D, i.e. per output
// feature. This is how ATen's addmm calls cuBLASLt (gemm_and_bias with transpose_mat1).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gemm/cublaslt.cuh"

namespace transformer_kernels {

struct LinearGeluParams {
  const void* x;  // [M, K], rows x_ld elements apart, each row contiguous
  int64_t x_ld;
  const void* weight;  // [N, K], rows weight_ld elements apart, each row contiguous
  int64_t weight_ld;
  const void* bias;  // [N] contiguous, x's dtype; nullptr for none (the GELU epilogue alone)
  void* out;         // [M, N], rows out_ld elements apart, each row contiguous
  int64_t out_ld;
  int64_t m, n, k;  // M >= 1, N >= 1, K >= 1
  // Of x, weight, bias and out: kFloat16 or kBFloat16 only. In fp32 the epilogue's GELU is less
  // accurate than eager's (the binding sends fp32 to the separate path).
  FloatType dtype;
};

// Asks cuBLASLt's heuristic for an algorithm with the GELU epilogue for p and, when `launch`,
// queues it on `stream`. Returns CUBLAS_STATUS_NOT_SUPPORTED, having queued nothing, where no
// algorithm takes this dtype, layout or alignment with the epilogue on this GPU (the caller then
// computes the GEMM and the activation separately). Only host calls besides the launch: legal
// during CUDA-graph capture (the launch is captured; nothing is synchronized or allocated).
inline cublasStatus_t LinearGelu(cublasLtHandle_t handle, const LinearGeluParams& p, GemmWorkspace workspace,
                                  cudaStream_t stream, bool launch = true) {
  using namespace cublaslt;
  const cudaDataType_t type = data_type(p.dtype);
  cublasLtMatmulDesc_t raw_desc = nullptr;
  TK_CUBLAS_TRY(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const MatmulDesc desc(raw_desc);
  TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T));
  TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N));
  const cublasLtEpilogue_t epilogue = p.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue));
  if (p.bias != nullptr) TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias));

  // Column-major: A = weight as [K, N] (transposed to [N, K]), B = x as [K, M], D = out as [N, M].
  const LinearMatmul g{p.weight, type, p.weight_ld, p.x, type, p.x_ld, p.out, type, p.out_ld, p.m, p.n, p.k};
  return RunLinearMatmul(handle, raw_desc, g, workspace, stream, launch);
}


}  // namespace transformer_kernels
