// Kernel instantiations of the norm family: modulated rms with an FP8 output (norm_modulate_fp8,
// gated_add_norm_modulate_fp8 with norm="rms").
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormVariant<NormType::kRms, PreAdd::kNone, true, true> kRmsModulatedFp8;
const RegisterNormVariant<NormType::kRms, PreAdd::kResidual, true, true> kRmsResidualModulatedFp8;
const RegisterNormVariant<NormType::kRms, PreAdd::kGated, true, true> kRmsGatedModulatedFp8;
}  // namespace
}  // namespace transformer_kernels
