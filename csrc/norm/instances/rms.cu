// Kernel instantiations of the norm family: rms.
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormVariant<NormType::kRms, PreAdd::kNone, false> kRms;
const RegisterNormVariant<NormType::kRms, PreAdd::kNone, true> kRmsModulated;
}  // namespace
}  // namespace transformer_kernels
