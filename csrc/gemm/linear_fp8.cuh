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

#include "gemm/cublaslt.cuh"

namespace transformer_kernels {

enum class Fp8OutDtype { kFloat16, kBFloat16 };
enum class Fp8Activation { kNone, kGeluTanh };

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
  Fp8OutDtype out_dtype;
  Fp8Activation activation;
};

// Asks cuBLASLt's heuristic for an FP8 algorithm with outer-vector scales for p and, when `launch`,
// queues it on `stream`. CUBLAS_STATUS_NOT_SUPPORTED, having queued nothing, where none takes it on
// this GPU (FP8 needs sm_89 or later, outer-vector scaling a recent cuBLASLt). Only host calls besides
// the launch: legal during CUDA-graph capture.
inline cublasStatus_t LinearFp8(cublasLtHandle_t handle, const LinearFp8Params& p, GemmWorkspace workspace,
                                cudaStream_t stream, bool launch = true) {
  using namespace cublaslt;
  const cudaDataType_t out_type = p.out_dtype == Fp8OutDtype::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
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
  const bool gelu = p.activation == Fp8Activation::kGeluTanh;
  const cublasLtEpilogue_t epilogue = p.bias != nullptr ? (gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                                        : (gelu ? CUBLASLT_EPILOGUE_GELU : CUBLASLT_EPILOGUE_DEFAULT);
  TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue));
  if (p.bias != nullptr) {
    TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias));
    TK_CUBLAS_TRY(set(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, out_type));
  }

  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  TK_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, p.k, p.n, p.weight_ld));
  const Layout a_owner(a);
  TK_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, p.k, p.m, p.x_ld));
  const Layout b_owner(b);
  TK_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&d, out_type, p.n, p.m, p.out_ld));
  const Layout d_owner(d);

  cublasLtMatmulPreference_t raw_pref = nullptr;
  TK_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&raw_pref));
  const Preference pref(raw_pref);
  constexpr int64_t kOutBytes = 2;  // both output dtypes
  TK_CUBLAS_TRY(set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace.bytes));
  TK_CUBLAS_TRY(set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(p.weight, p.weight_ld)));
  TK_CUBLAS_TRY(set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(p.x, p.x_ld)));
  TK_CUBLAS_TRY(set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(p.out, p.out_ld * kOutBytes)));
  TK_CUBLAS_TRY(set_pref(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(p.out, p.out_ld * kOutBytes)));

  cublasLtMatmulHeuristicResult_t heuristic = {};
  int found = 0;
  TK_CUBLAS_TRY(cublasLtMatmulAlgoGetHeuristic(handle, raw_desc, a, b, d, d, raw_pref, 1, &heuristic, &found));
  if (found == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!launch) return CUBLAS_STATUS_SUCCESS;
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(handle, raw_desc, &alpha, p.weight, a, p.x, b, &beta, p.out, d, p.out, d, &heuristic.algo,
                        workspace.ptr, workspace.bytes, stream);
}

}  // namespace transformer_kernels
