// Kernel instantiations of the norm family: layer with an FP8 output (layer_norm_fp8, norm_modulate_fp8).
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormVariant<NormType::kLayer, PreAdd::kNone, false, true> kLayerFp8;
const RegisterNormVariant<NormType::kLayer, PreAdd::kNone, true, true> kLayerModulatedFp8;
}  // namespace
}  // namespace transformer_kernels
