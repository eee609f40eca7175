// Backward kernels: gated_add (x + gate * y, no norm), whose gate gradient is the
// modulations' broadcast reduction.
#include "norm/norm_backward_instances.cuh"

namespace transformer_kernels {
namespace {
const RegisterNormBackwardVariant<NormType::kNone, kBackwardGated, true> kNoneGated;
const RegisterNormBackwardVariant<NormType::kNone, kBackwardGated, false> kNoneGatedChunked;
}  // namespace
}  // namespace transformer_kernels
