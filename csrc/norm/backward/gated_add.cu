// Backward kernel instantiations: gated_add (x + gate * y, no norm), whose gate gradient is the
// modulations' broadcast reduction.
#include "norm/norm_backward_dispatch.cuh"

namespace transformer_kernels::norm_backward_binding {
template void dispatch_norm_backward<NormType::kNone, kBackwardGated>(const NormBackwardCall&);
}  // namespace transformer_kernels::norm_backward_binding
