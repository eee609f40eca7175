// Kernel instantiations of the norm family: layer.
#include "norm/norm_dispatch.cuh"

namespace transformer_kernels::norm_binding {
template void dispatch_dtypes<NormType::kLayer, PreAdd::kNone, false>(const NormCall&);
template void dispatch_dtypes<NormType::kLayer, PreAdd::kNone, true>(const NormCall&);
}  // namespace transformer_kernels::norm_binding
