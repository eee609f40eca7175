// Kernel instantiations of the norm family: rms with an FP8 output (rms_norm_fp8, fused_add_rms_norm_fp8).
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormVariant<NormType::kRms, PreAdd::kNone, false, true> kRmsFp8;
const RegisterNormVariant<NormType::kRms, PreAdd::kResidual, false, true> kRmsResidualFp8;
}  // namespace
}  // namespace transformer_kernels
