// Kernel instantiations of the norm family: rms residual.
#include "norm/norm_dispatch.cuh"

namespace transformer_kernels::norm_binding {
template void dispatch_dtypes<NormType::kRms, PreAdd::kResidual, false>(const NormCall&);
template void dispatch_dtypes<NormType::kRms, PreAdd::kResidual, true>(const NormCall&);
}  // namespace transformer_kernels::norm_binding
