// Backward kernel instantiations of the norm family: the modulated RMSNorms (norm_modulate,
// gated_add_norm_modulate), with and without the gated pre-add and the weight.
#include "norm/norm_backward_dispatch.cuh"

namespace transformer_kernels::norm_backward_binding {
template void dispatch_norm_backward<NormType::kRms, kBackwardMod>(const NormBackwardCall&);
template void dispatch_norm_backward<NormType::kRms, kBackwardMod | kBackwardAffine>(const NormBackwardCall&);
template void dispatch_norm_backward<NormType::kRms, kBackwardMod | kBackwardGated>(const NormBackwardCall&);
template void dispatch_norm_backward<NormType::kRms, kBackwardAllFeatures>(const NormBackwardCall&);
}  // namespace transformer_kernels::norm_backward_binding
