// Kernel instantiations of the norm family: rms gated.
#include "norm/norm_dispatch.cuh"

namespace transformer_kernels::norm_binding {
template void dispatch_dtypes<NormType::kRms, PreAdd::kGated, true>(const NormCall&);
}  // namespace transformer_kernels::norm_binding
