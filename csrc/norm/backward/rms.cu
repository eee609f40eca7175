// Backward kernels of the norm family: rms_norm, fused_add_rms_norm, and the
// chunked form of every RMSNorm backward (rows wider than a row group holds).
#include "norm/norm_backward_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormBackwardVariant<NormType::kRms, kBackwardAffine, true> kRmsAffine;
const RegisterNormBackwardVariant<NormType::kRms, kBackwardAllFeatures, false> kRmsAllFeaturesChunked;
}  // namespace
}  // namespace transformer_kernels
