// The norm launchers, defined for the instantiation files in instances/: each (norm, pre-add,
// modulation, FP8 output) combination compiles in a torch-free unit (they build in parallel, and
// none parses torch's headers once per architecture) and registers itself (RegisterNormVariant), so
// that the binding (norm.cu) finds it by key.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "common/float_type.h"
#include "common/variants.h"
#include "norm/norm.cuh"

namespace transformer_kernels {

// The kernel for l's dtypes: weight x's or fp32; out x's, or fp32 for the unmodulated RMSNorm
// (HF/diffusers rounding with an fp32 weight); kFp8Out: e4m3 codes of values in x's dtype (l.out_type
// ignored). cudaErrorInvalidValue for any other combination.
template <NormType kNorm, PreAdd kPre, bool kMod, bool kFp8Out>
cudaError_t launch_norm(const NormLaunch& l, cudaStream_t stream) {
  return with_float_type(l.x_type, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr FloatType kX = float_type_of<T>(), kF32 = FloatType::kFloat32;
    if constexpr (kFp8Out) {
      if (l.weight_type == kX) return norm<kNorm, kPre, kMod>(retyped<T, T, uint8_t>(l.params), stream);
      if constexpr (kX != kF32) {
        if (l.weight_type == kF32) return norm<kNorm, kPre, kMod>(retyped<T, float, uint8_t>(l.params), stream);
      }
    } else if constexpr (kX == kF32) {
      if (l.weight_type == kF32 && l.out_type == kF32) return norm<kNorm, kPre, kMod>(retyped<T, T, T>(l.params), stream);
    } else {
      if (l.weight_type == kX && l.out_type == kX) return norm<kNorm, kPre, kMod>(retyped<T, T, T>(l.params), stream);
      if (l.weight_type == kF32 && l.out_type == kX)
        return norm<kNorm, kPre, kMod>(retyped<T, float, T>(l.params), stream);
      if constexpr (kNorm == NormType::kRms && !kMod) {
        if (l.weight_type == kF32 && l.out_type == kF32)
          return norm<kNorm, kPre, kMod>(retyped<T, float, float>(l.params), stream);
      }
    }
    return cudaErrorInvalidValue;
  });
}

// An instances/ unit's registration of launch_norm<kNorm, kPre, kMod, kFp8Out> (which it compiles).
template <NormType kNorm, PreAdd kPre, bool kMod, bool kFp8Out = false>
struct RegisterNormVariant : RegisterVariant<NormVariant> {
  RegisterNormVariant()
      : RegisterVariant<NormVariant>({{kNorm, kPre, kMod, kFp8Out}, &launch_norm<kNorm, kPre, kMod, kFp8Out>}) {}
};

}  // namespace transformer_kernels
