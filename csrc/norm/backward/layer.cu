// Backward kernels of the norm family: layer_norm, and the chunked form of every
// LayerNorm backward (rows wider than a row group holds).
#include "norm/norm_backward_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormBackwardVariant<NormType::kLayer, kBackwardAffine, true> kLayerAffine;
const RegisterNormBackwardVariant<NormType::kLayer, kBackwardAllFeatures, false> kLayerAllFeaturesChunked;
}  // namespace
}  // namespace transformer_kernels
