// Definition of norm_binding::dispatch_dtypes, included only by the instantiation files in
// instances/ so that each (norm, pre-add, modulation) combination compiles in its own unit.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>

#include <type_traits>

#include "common/checks.h"
#include "common/dispatch.h"
#include "norm/norm_call.h"

namespace transformer_kernels {
namespace norm_binding {

template <NormType kNorm, PreAdd kPre, bool kMod, typename T, typename W, typename O>
void run(const NormCall& c) {
  const at::Tensor& x = *c.x;
  NormParams<T, W, O> p;
  p.x = reinterpret_cast<const T*>(x.const_data_ptr());
  p.x_rows = row_indexer(c.op, x, "x");
  if (c.residual) {
    p.residual = reinterpret_cast<const T*>(c.residual->const_data_ptr());
    p.residual_rows = row_indexer(c.op, *c.residual, kPre == PreAdd::kGated ? "y" : "residual");
  }
  if (c.gate) {
    p.gate = reinterpret_cast<const T*>(c.gate->const_data_ptr());
    p.gate_rows = broadcast_row_indexer(c.op, *c.gate, "gate", x);
  }
  if (*c.weight) p.weight = reinterpret_cast<const W*>((*c.weight)->const_data_ptr());
  if (*c.bias) p.bias = reinterpret_cast<const W*>((*c.bias)->const_data_ptr());
  if (c.scale) {
    p.scale = reinterpret_cast<const T*>(c.scale->const_data_ptr());
    p.scale_rows = broadcast_row_indexer(c.op, *c.scale, "scale", x);
  }
  if (c.shift && *c.shift) {
    p.shift = reinterpret_cast<const T*>((*c.shift)->const_data_ptr());
    p.shift_rows = broadcast_row_indexer(c.op, **c.shift, "shift", x);
  }
  p.out = reinterpret_cast<O*>(c.out->data_ptr());
  p.out_rows = row_indexer(c.op, *c.out, "out");
  if (c.h_out) {
    p.h_out = reinterpret_cast<T*>(c.h_out->data_ptr());
    p.h_rows = row_indexer(c.op, *c.h_out, "h_out");
  }
  p.num_rows = num_rows(x);
  p.hidden = x.size(-1);
  p.eps = static_cast<float>(c.eps);
  p.round_normalized = c.round_normalized;
  // A few very wide rows are split across blocks, with a workspace for their chunks' statistics
  // (freed after the launches: the caching allocator reuses it only for later work on this stream).
  at::Tensor split_stats;
  p.split_chunks = norm_split_chunks(p.num_rows, p.hidden, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  if (p.split_chunks > 1) {
    split_stats = at::empty({p.num_rows * p.split_chunks * kChunkStatFloats}, x.options().dtype(at::kFloat));
    p.split_stats = split_stats.data_ptr<float>();
    p.split_chunk_elems = kSplitChunkElems;
  }
  const cudaError_t err = norm<kNorm, kPre, kMod>(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, c.op, ": kernel launch failed: ", cudaGetErrorString(err));
}

template <NormType kNorm, PreAdd kPre, bool kMod>
void dispatch_dtypes(const NormCall& c) {
  const bool weight_f32 = (*c.weight && (*c.weight)->scalar_type() == at::kFloat) ||
                          (*c.bias && (*c.bias)->scalar_type() == at::kFloat);
  const bool out_f32 = c.out->scalar_type() == at::kFloat;
  dispatch_float_dtype(c.x->scalar_type(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>) {
      run<kNorm, kPre, kMod, float, float, float>(c);
    } else {
      if (!weight_f32) {
        run<kNorm, kPre, kMod, T, T, T>(c);
      } else if (!out_f32) {
        run<kNorm, kPre, kMod, T, float, T>(c);
      } else if constexpr (kNorm == NormType::kRms && !kMod) {  // HF/diffusers rounding, fp32 weight
        run<kNorm, kPre, kMod, T, float, float>(c);
      } else {  // never a silently skipped launch (norm.cu's launch checks the combinations first)
        TORCH_CHECK(false, c.op, ": no kernel for x of dtype ", c.x->scalar_type(), " with a float32 weight and output");
      }
    }
  });
}

}  // namespace norm_binding
}  // namespace transformer_kernels
