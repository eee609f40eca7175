// Kernel instantiations of the norm family: layer pre add.
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormVariant<NormType::kLayer, PreAdd::kResidual, true> kLayerResidualModulated;
const RegisterNormVariant<NormType::kLayer, PreAdd::kGated, true> kLayerGatedModulated;
}  // namespace
}  // namespace transformer_kernels
