// Kernel instantiations of the norm family: rms gated.
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormVariant<NormType::kRms, PreAdd::kGated, true> kRmsGatedModulated;
}  // namespace
}  // namespace transformer_kernels
