// Backward kernel instantiations of the norm family: the modulated LayerNorms (norm_modulate,
// gated_add_norm_modulate), with and without the gated pre-add and the weight and bias.
#include "norm/norm_backward_dispatch.cuh"

namespace transformer_kernels::norm_backward_binding {
template void dispatch_norm_backward<NormType::kLayer, kBackwardMod>(const NormBackwardCall&);
template void dispatch_norm_backward<NormType::kLayer, kBackwardMod | kBackwardAffine>(const NormBackwardCall&);
template void dispatch_norm_backward<NormType::kLayer, kBackwardMod | kBackwardGated>(const NormBackwardCall&);
template void dispatch_norm_backward<NormType::kLayer, kBackwardAllFeatures>(const NormBackwardCall&);
}  // namespace transformer_kernels::norm_backward_binding
