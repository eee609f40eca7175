// Backward kernels of the norm family: the modulated RMSNorms (norm_modulate,
// gated_add_norm_modulate), with and without the gated pre-add and the weight.
#include "norm/norm_backward_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormBackwardVariant<NormType::kRms, kBackwardMod, true> kRmsMod;
const RegisterNormBackwardVariant<NormType::kRms, kBackwardMod | kBackwardAffine, true> kRmsModAffine;
const RegisterNormBackwardVariant<NormType::kRms, kBackwardMod | kBackwardGated, true> kRmsModGated;
const RegisterNormBackwardVariant<NormType::kRms, kBackwardAllFeatures, true> kRmsAllFeatures;
}  // namespace
}  // namespace transformer_kernels
