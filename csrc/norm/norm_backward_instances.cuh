// The norm backward's planners and launchers, defined for the instantiation files in backward/:
// each (norm, features) combination compiles in a torch-free unit (they build in parallel) and
// registers itself (RegisterNormBackwardVariant), so that the binding (norm_backward.cu) finds it
// by key.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "common/float_type.h"
#include "common/variants.h"
#include "norm/norm_backward.cuh"

namespace transformer_kernels {
namespace norm_backward_instances {

// Calls f(type_tag<T>, type_tag<W>, type_tag<G>) for the dtypes of l the kernel serves, and returns
// what f returns; cudaErrorNotSupported for others. Served: x's T with a weight in T, or in fp32
// (where the op allows it), and the output gradient in T or, for RMSNorm's fp32-weight rounding,
// fp32. The modulated RMSNorms take x's dtype only, but the chunked kernels (all features) serve
// every op of their norm, rms_norm's fp32 weight included.
template <NormType kNorm, int kFeatures, bool kWholeRows, typename F>
cudaError_t with_served_types(const NormBackwardLaunch& l, F&& f) {
  constexpr bool kMod = (kFeatures & kBackwardMod) != 0;
  constexpr bool kAffine = (kFeatures & kBackwardAffine) != 0;
  constexpr bool kF32Weight = kAffine && (!kWholeRows || !(kNorm == NormType::kRms && kMod));
  constexpr bool kF32Grad = kF32Weight && kNorm == NormType::kRms;
  const bool weight_f32 = l.weight_type == FloatType::kFloat32, grad_f32 = l.grad_type == FloatType::kFloat32;
  return with_float_type(l.x_type, [&](auto x) -> cudaError_t {
    using T = typename decltype(x)::type;
    constexpr type_tag<float> f32;
    if constexpr (std::is_same_v<T, float>) {
      return f(f32, f32, f32);
    } else {
      if (!weight_f32 && !grad_f32) return f(x, x, x);
      if constexpr (kF32Weight) {
        if (weight_f32 && !grad_f32) return f(x, f32, x);
        if constexpr (kF32Grad) {
          if (weight_f32) return f(x, f32, f32);
        }
      }
      return cudaErrorNotSupported;
    }
  });
}

template <NormType kNorm, int kFeatures, bool kWholeRows>
cudaError_t plan(NormBackwardLaunch& l, int sm_count, NormBackwardPlan* plan, bool* fits) {
  return with_served_types<kNorm, kFeatures, kWholeRows>(l, [&](auto t, auto w, auto g) {
    auto p = retyped<typename decltype(t)::type, typename decltype(w)::type, typename decltype(g)::type>(l.params);
    *fits = plan_norm_backward<kNorm, kFeatures, kWholeRows>(p, sm_count, plan);
    l.params = retyped<void, void, void>(p);
    return cudaSuccess;
  });
}

template <NormType kNorm, int kFeatures, bool kWholeRows>
cudaError_t launch(const NormBackwardLaunch& l, const NormBackwardPlan& plan, cudaStream_t stream) {
  return with_served_types<kNorm, kFeatures, kWholeRows>(l, [&](auto t, auto w, auto g) {
    const auto p = retyped<typename decltype(t)::type, typename decltype(w)::type, typename decltype(g)::type>(l.params);
    return norm_backward<kNorm, kFeatures, kWholeRows>(p, plan, stream);
  });
}

}  // namespace norm_backward_instances

// A backward/ unit's registration of the (kNorm, kFeatures, kWholeRows) planner and launcher (which it compiles).
template <NormType kNorm, int kFeatures, bool kWholeRows>
struct RegisterNormBackwardVariant : RegisterVariant<NormBackwardVariant> {
  RegisterNormBackwardVariant()
      : RegisterVariant<NormBackwardVariant>({{kNorm, kFeatures, kWholeRows},
                                              &norm_backward_instances::plan<kNorm, kFeatures, kWholeRows>,
                                              &norm_backward_instances::launch<kNorm, kFeatures, kWholeRows>}) {}
};

}  // namespace transformer_kernels
