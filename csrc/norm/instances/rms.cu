// Kernel instantiations of the norm family: rms.
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
template cudaError_t launch_norm<NormType::kRms, PreAdd::kNone, false>(const NormLaunch&, cudaStream_t);
template cudaError_t launch_norm<NormType::kRms, PreAdd::kNone, true>(const NormLaunch&, cudaStream_t);
}  // namespace transformer_kernels
