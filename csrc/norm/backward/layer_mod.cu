// Backward kernels of the norm family: the modulated LayerNorms (norm_modulate,
// gated_add_norm_modulate), with and without the gated pre-add and the weight and bias.
#include "norm/norm_backward_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormBackwardVariant<NormType::kLayer, kBackwardMod, true> kLayerMod;
const RegisterNormBackwardVariant<NormType::kLayer, kBackwardMod | kBackwardAffine, true> kLayerModAffine;
const RegisterNormBackwardVariant<NormType::kLayer, kBackwardMod | kBackwardGated, true> kLayerModGated;
const RegisterNormBackwardVariant<NormType::kLayer, kBackwardAllFeatures, true> kLayerAllFeatures;
}  // namespace
}  // namespace transformer_kernels
