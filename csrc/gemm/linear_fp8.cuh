// out = act((x_codes * x_scale) @ (weight_codes * weight_scale)^T + bias): the FP8 (e4m3) GEMM of a
// linear layer as one cuBLASLt matmul. x is quantized per row (quantize_fp8: one scale per token),
// the weight per output channel (one scale per row of weight); cuBLASLt applies both as outer-vector
// scales to the fp32 accumulator, then the bias and the optional tanh-GELU (its epilogue), and rounds
// once to the output dtype. Torch-free: the caller passes the handle, the workspace and the stream.
//
// The layout is linear_gelu.cuh's: column-major D [N, M] = op(A) B with A = weight (row-major [N, K],
// transposed: FP8 requires "TN"), B = x (row-major [M, K]); A's outer-vector scale has N values (the
// weight's), B's M (x's).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/activation_math.cuh"
#include "gemm/cublaslt.cuh"

namespace transformer_kernels {

struct LinearFp8Params {
  const void* x;  // [M, K] e4m3, rows x_ld bytes apart, each row contiguous
  int64_t x_ld;
  const float* x_scale;  // [M] contiguous: each row's scale
  const void* weight;    // [N, K] e4m3, rows weight_ld bytes apart, each row contiguous
  int64_t weight_ld;
  const float* weight_scale;  // [N] contiguous: each output channel's scale
  const void* bias;           // [N] contiguous, the output dtype; nullptr for none
  void* out;                  // [M, N], rows out_ld elements apart, each row contiguous
  int64_t out_ld;
  int64_t m, n, k;  // M >= 1, N >= 1, K >= 1 (K and the leading dimensions multiples of 16)
  FloatType out_dtype;    // kFloat16 or kBFloat16
  Activation activation;  // the epilogue's: kNone or kGeluTanh
};

// Asks cuBLASLt's heuristic for an FP8 algorithm with outer-vector scales for p and, when `launch`,
// queues it on `stream`. CUBLAS_STATUS_NOT_SUPPORTED, having queued nothing, where none takes it on
// this GPU (FP8 needs sm_89 or later, outer-vector scaling a recent cuBLASLt). Only host calls besides
// the launch: legal during CUDA-graph capture.
inline cublasStatus_t LinearFp8(cublasLtHandle_t handle, const LinearFp8Params& p, GemmWorkspace workspace,
                                cudaStream_t stream, bool launch = true) {
  using namespace cublaslt;
  const cudaDataType_t out_type = data_type(p.out_dtype);
  cublasLtMatmulDesc_t raw_desc = nullptr;
  TK_CUBLAS_TRY(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const MatmulDesc desc(raw_desc);
  TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T));
  TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N));
  const cublasLtMatmulMatrixScale_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, outer));
  TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, outer));
  TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.weight_scale));
  TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.x_scale));
  const bool gelu = p.activation == Activation::kGeluTanh;
  const cublasLtEpilogue_t epilogue = p.bias != nullptr ? (gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                                        : (gelu ? CUBLASLT_EPILOGUE_GELU : CUBLASLT_EPILOGUE_DEFAULT);
  TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue));
  if (p.bias != nullptr) {
    TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias));
    TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, out_type));
  }

  const LinearMatmul g{p.weight, CUDA_R_8F_E4M3, p.weight_ld, p.x, CUDA_R_8F_E4M3, p.x_ld, p.out, out_type, p.out_ld,
                       p.m, p.n, p.k};
  return RunLinearMatmul(handle, raw_desc, g, workspace, stream, launch);
}

}  // namespace transformer_kernels
