// Kernel instantiations of the norm family: layer pre add.
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
template cudaError_t launch_norm<NormType::kLayer, PreAdd::kResidual, true>(const NormLaunch&, cudaStream_t);
template cudaError_t launch_norm<NormType::kLayer, PreAdd::kGated, true>(const NormLaunch&, cudaStream_t);
}  // namespace transformer_kernels
