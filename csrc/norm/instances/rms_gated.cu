// Kernel instantiations of the norm family: rms gated.
#include "norm/norm_instances.cuh"

namespace transformer_kernels {
template cudaError_t launch_norm<NormType::kRms, PreAdd::kGated, true>(const NormLaunch&, cudaStream_t);
}  // namespace transformer_kernels
