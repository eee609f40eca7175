// Kernel instantiations of the norm family: rms.
#include "norm/norm_dispatch.cuh"

namespace transformer_kernels::norm_binding {
template void dispatch_dtypes<NormType::kRms, PreAdd::kNone, false>(const NormCall&);
template void dispatch_dtypes<NormType::kRms, PreAdd::kNone, true>(const NormCall&);
}  // namespace transformer_kernels::norm_binding
