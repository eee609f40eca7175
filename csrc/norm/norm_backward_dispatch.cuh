// Definitions of norm_backward_binding::dispatch_norm_backward and its chunked form, included only
// by the instantiation files in backward/, so that each (norm, features) combination compiles in
// its own unit.
#pragma once

#include <ATen/cuda/CUDAContext.h>

#include <array>
#include <type_traits>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/dispatch.h"
#include "norm/norm_backward_call.h"

namespace transformer_kernels {
namespace norm_backward_binding {

// How the gradient of a parameter broadcast to x is formed: row by row (segment_rows 1: the
// parameter has a row per row of x), reduced over segments of segment_rows consecutive rows (its
// leading dimensions are x's up to one, size 1 from there on: [hidden], [B, 1, hidden], [B, F, 1,
// hidden]), or, for any other broadcast ([1, S, hidden]), row by row into a temporary of x's shape
// that torch then sums to the parameter's shape (sum_after: in fp32, rounded once).
struct GradLayout {
  int64_t segment_rows;
  bool sum_after;
};

inline GradLayout grad_layout(const at::Tensor& param, const at::Tensor& x) {
  const int64_t lead = x.dim() - 1;
  const int64_t offset = lead - (param.dim() - 1);  // the parameter's leading dims, right-aligned
  auto param_size = [&](int64_t d) { return d < offset ? int64_t{1} : param.size(d - offset); };
  int64_t first_broadcast = lead;
  for (int64_t d = 0; d < lead && first_broadcast == lead; ++d)
    if (param_size(d) == 1 && x.size(d) > 1) first_broadcast = d;
  int64_t segment_rows = 1;
  for (int64_t d = first_broadcast; d < lead; ++d) {
    if (x.size(d) > 1 && param_size(d) != 1) return {1, true};
    segment_rows *= x.size(d);
  }
  return {segment_rows, false};
}

template <typename P>
const P* data(const at::Tensor* t) {
  return t != nullptr ? reinterpret_cast<const P*>(t->const_data_ptr()) : nullptr;
}

// Launches the (kNorm, kFeatures) kernels for dtypes T, W, G. False, without a launch, when
// kWholeRows and the whole-row kernel cannot take these rows (plan_norm_backward).
template <NormType kNorm, int kFeatures, bool kWholeRows, typename T, typename W, typename G>
bool run(const NormBackwardCall& c) {
  const at::Tensor& x = c.h != nullptr ? *c.h : *c.dout;
  NormBackwardParams<T, W, G> p;
  p.dout = data<G>(c.dout);
  p.dout_rows = row_indexer(c.op, *c.dout, "grad_out");
  if (c.dh_in != nullptr) {
    p.dh_in = data<T>(c.dh_in);
    p.dh_in_rows = row_indexer(c.op, *c.dh_in, "grad_h");
  }
  if (c.h != nullptr) {
    p.h = data<T>(c.h);
    p.h_rows = row_indexer(c.op, *c.h, "x");
  }
  p.weight = data<W>(c.weight);
  p.bias = data<W>(c.bias);
  if (c.scale != nullptr) {
    p.scale = data<T>(c.scale);
    p.scale_rows = broadcast_row_indexer(c.op, *c.scale, "scale", x);
  }
  if (c.y != nullptr) {
    p.y = data<T>(c.y);
    p.y_rows = row_indexer(c.op, *c.y, "y");
  }
  if (c.gate != nullptr) {
    p.gate = data<T>(c.gate);
    p.gate_rows = broadcast_row_indexer(c.op, *c.gate, "gate", x);
  }
  if (c.dh != nullptr) p.dh = reinterpret_cast<T*>(c.dh->data_ptr());
  if (c.dy != nullptr) p.dy = reinterpret_cast<T*>(c.dy->data_ptr());
  p.num_rows = num_rows(x);
  p.hidden = x.size(-1);
  p.eps = static_cast<float>(c.eps);
  set_segment_rows(p);

  const at::Tensor* params[kNumParamGrads] = {c.weight, c.bias, c.scale, c.shift, c.gate};
  std::array<at::Tensor, kNumParamGrads> sum_after;  // row-by-row temporaries torch sums afterwards
  for (int i = 0; i < kNumParamGrads; ++i) {
    at::Tensor* grad = c.grads[i];
    if (grad == nullptr) continue;
    if (i == kGradWeight || i == kGradBias) {
      p.reduced[i] = grad->data_ptr();
      p.reduced_segment_rows[i] = p.num_rows;
      continue;
    }
    const GradLayout layout = grad_layout(*params[i], x);
    if (layout.sum_after) {  // fp32 rows: rows rounded to T before the sum would add a rounding each
      sum_after[i] = empty_tensor(x.sizes(), x.options().dtype(at::kFloat));
      p.full_f32[i] = sum_after[i].data_ptr<float>();
    } else if (layout.segment_rows == 1) {
      p.full[i] = reinterpret_cast<T*>(grad->data_ptr());
    } else {
      p.reduced[i] = grad->data_ptr();
      p.reduced_segment_rows[i] = layout.segment_rows;
    }
  }

  NormBackwardPlan plan;
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  if (!plan_norm_backward<kNorm, kFeatures, kWholeRows>(p, sm_count, &plan)) return false;
  // Workspaces after the outputs (which the caller allocated first): freed after the launches,
  // the caching allocator reuses them only for later work on this stream.
  std::array<at::Tensor, kNumParamGrads> partials;
  for (int i = 0; i < kNumParamGrads; ++i) {
    if (p.reduced[i] == nullptr) continue;
    partials[i] = empty_tensor({plan.items, p.hidden}, x.options().dtype(at::kFloat));
    p.partials[i] = partials[i].data_ptr<float>();
  }
  at::Tensor chunk_stats;
  if (kNorm != NormType::kNone && plan.chunked) {
    chunk_stats = empty_tensor({p.num_rows * p.chunks * ChunkStatFloats::kBackward}, x.options().dtype(at::kFloat));
    p.chunk_stats = chunk_stats.data_ptr<float>();
  }
  const cudaError_t err = norm_backward<kNorm, kFeatures, kWholeRows>(p, plan, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, c.op, ": kernel launch failed: ", cudaGetErrorString(err));
  for (int i = 0; i < kNumParamGrads; ++i)
    if (sum_after[i].defined()) c.grads[i]->copy_(sum_after[i].sum_to_size(params[i]->sizes()));
  return true;
}

// The dtype combinations each kernel serves: x's T with a weight in T, or in fp32 (where the op
// allows it), and the output gradient in T or, for RMSNorm's fp32-weight rounding, fp32. The
// modulated RMSNorms take x's dtype only, but the chunked kernels (all features) serve every op of
// their norm, rms_norm's fp32 weight included.
template <NormType kNorm, int kFeatures, bool kWholeRows>
bool dispatch_dtypes(const NormBackwardCall& c) {
  constexpr bool kMod = (kFeatures & kBackwardMod) != 0;
  constexpr bool kAffine = (kFeatures & kBackwardAffine) != 0;
  constexpr bool kF32Weight = kAffine && (!kWholeRows || !(kNorm == NormType::kRms && kMod));
  constexpr bool kF32Grad = kF32Weight && kNorm == NormType::kRms;
  const at::Tensor& x = c.h != nullptr ? *c.h : *c.dout;
  const bool weight_f32 = (c.weight != nullptr && c.weight->scalar_type() == at::kFloat) ||
                          (c.bias != nullptr && c.bias->scalar_type() == at::kFloat);
  const bool grad_f32 = c.dout->scalar_type() == at::kFloat;
  bool fits = false, served = false;
  dispatch_float_dtype(x.scalar_type(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>) {
      served = true, fits = run<kNorm, kFeatures, kWholeRows, float, float, float>(c);
    } else {
      if (!weight_f32 && !grad_f32) {
        served = true, fits = run<kNorm, kFeatures, kWholeRows, T, T, T>(c);
      } else if constexpr (kF32Weight) {
        if (weight_f32 && !grad_f32) {
          served = true, fits = run<kNorm, kFeatures, kWholeRows, T, float, T>(c);
        } else if constexpr (kF32Grad) {
          if (weight_f32) served = true, fits = run<kNorm, kFeatures, kWholeRows, T, float, float>(c);
        }
      }
    }
  });
  TORCH_CHECK(served, c.op, ": unsupported dtypes: x ", x.scalar_type(), ", weight ",
              c.weight != nullptr ? c.weight->scalar_type() : x.scalar_type(), ", grad_out ", c.dout->scalar_type());
  return fits;
}

template <NormType kNorm, int kFeatures>
void dispatch_norm_backward(const NormBackwardCall& c) {
  if (!dispatch_dtypes<kNorm, kFeatures, /*kWholeRows=*/true>(c)) dispatch_norm_backward_chunked<kNorm>(c);
}

template <NormType kNorm>
void dispatch_norm_backward_chunked(const NormBackwardCall& c) {
  constexpr int kFeatures = kNorm == NormType::kNone ? kBackwardGated : kBackwardAllFeatures;
  const bool launched = dispatch_dtypes<kNorm, kFeatures, /*kWholeRows=*/false>(c);
  TORCH_CHECK(launched, c.op, ": no kernel for rows of ", c.dout->size(-1), " elements");
}

// Compiled once, in backward/rms.cu and backward/layer.cu.
extern template void dispatch_norm_backward_chunked<NormType::kRms>(const NormBackwardCall&);
extern template void dispatch_norm_backward_chunked<NormType::kLayer>(const NormBackwardCall&);

}  // namespace norm_backward_binding
}  // namespace transformer_kernels
