// Backward kernel instantiations of the norm family: rms_norm, fused_add_rms_norm, and the
// chunked form of every RMSNorm backward (rows wider than a row group holds).
#include "norm/norm_backward_dispatch.cuh"

namespace transformer_kernels::norm_backward_binding {
template void dispatch_norm_backward<NormType::kRms, kBackwardAffine>(const NormBackwardCall&);
template void dispatch_norm_backward_chunked<NormType::kRms>(const NormBackwardCall&);
}  // namespace transformer_kernels::norm_backward_binding
