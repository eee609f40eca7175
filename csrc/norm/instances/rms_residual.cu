// Kernel instantiations of the norm family: rms residual.
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormVariant<NormType::kRms, PreAdd::kResidual, false> kRmsResidual;
const RegisterNormVariant<NormType::kRms, PreAdd::kResidual, true> kRmsResidualModulated;
}  // namespace
}  // namespace transformer_kernels
