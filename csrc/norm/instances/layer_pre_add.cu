// Kernel instantiations of the norm family: layer pre add.
#include "norm/norm_dispatch.cuh"

namespace transformer_kernels::norm_binding {
template void dispatch_dtypes<NormType::kLayer, PreAdd::kResidual, true>(const NormCall&);
template void dispatch_dtypes<NormType::kLayer, PreAdd::kGated, true>(const NormCall&);
}  // namespace transformer_kernels::norm_binding
