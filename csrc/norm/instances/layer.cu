// Kernel instantiations of the norm family: layer.
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
template cudaError_t launch_norm<NormType::kLayer, PreAdd::kNone, false>(const NormLaunch&, cudaStream_t);
template cudaError_t launch_norm<NormType::kLayer, PreAdd::kNone, true>(const NormLaunch&, cudaStream_t);
}  // namespace transformer_kernels
