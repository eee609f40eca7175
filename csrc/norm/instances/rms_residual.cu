// Kernel instantiations of the norm family: rms residual.
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
template cudaError_t launch_norm<NormType::kRms, PreAdd::kResidual, false>(const NormLaunch&, cudaStream_t);
template cudaError_t launch_norm<NormType::kRms, PreAdd::kResidual, true>(const NormLaunch&, cudaStream_t);
}  // namespace transformer_kernels
