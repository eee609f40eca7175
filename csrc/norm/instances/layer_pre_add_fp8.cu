// Kernel instantiations of the norm family: layer after a pre-add with an FP8 output
// (gated_add_norm_modulate_fp8 with norm="layer").
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormVariant<NormType::kLayer, PreAdd::kResidual, true, true> kLayerResidualModulatedFp8;
const RegisterNormVariant<NormType::kLayer, PreAdd::kGated, true, true> kLayerGatedModulatedFp8;
}  // namespace
}  // namespace transformer_kernels
