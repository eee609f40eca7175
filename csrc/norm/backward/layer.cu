// Backward kernel instantiations of the norm family: layer_norm, and the chunked form of every
// LayerNorm backward (rows wider than a row group holds).
#include "norm/norm_backward_dispatch.cuh"

namespace transformer_kernels::norm_backward_binding {
template void dispatch_norm_backward<NormType::kLayer, kBackwardAffine>(const NormBackwardCall&);
template void dispatch_norm_backward_chunked<NormType::kLayer>(const NormBackwardCall&);
}  // namespace transformer_kernels::norm_backward_binding
