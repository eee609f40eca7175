// Kernel instantiations of the norm family: layer.
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormVariant<NormType::kLayer, PreAdd::kNone, false> kLayer;
const RegisterNormVariant<NormType::kLayer, PreAdd::kNone, true> kLayerModulated;
}  // namespace
}  // namespace transformer_kernels
