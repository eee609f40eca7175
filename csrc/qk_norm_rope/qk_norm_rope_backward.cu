// Torch entry points of the fused q/k norm + RoPE backward ops: validate, allocate the gradients,
// pick dtypes, call the torch-free launcher in qk_norm_rope_backward.cuh on the current stream of
// q's device. Weight gradients not asked for in output_mask come back as empty 1-D tensors of q's
// dtype; dq and dk are always computed.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>
#include <tuple>
#include <type_traits>
#include <utility>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/dispatch.h"
#include "qk_norm_rope/ops.h"
#include "qk_norm_rope/qk_norm_rope_backward.cuh"
#include "rope/rope_binding.h"
#include "rope/rope_sources.h"

namespace transformer_kernels {
namespace {

using QkGrads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// t as the kernels' [B, S, H, d] (LTX's [B, S, C] as [B, S, 1, C]).
at::Tensor as_heads(const at::Tensor& t) { return t.dim() == 3 ? t.unsqueeze(2) : t; }

// q [B, S, Hq, L] (or [B, S, C] with `three_d`), k likewise with q's B, S, L; the output
// gradients of their shapes and dtype; weights [L] contiguous, of `weight_dtype` (or q's dtype or
// float32 when it is undefined); all on q's device, last dimensions contiguous.
void check_qk_backward(const char* op, bool three_d, const at::Tensor& grad_q, const at::Tensor& grad_k,
                       const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                       const at::Tensor& k_weight, double eps, bool weight_in_q_dtype) {
  check_cuda(op, q, "q");
  check_float_dtype(op, q, "q");
  const int64_t dims = three_d ? 3 : 4;
  TORCH_CHECK_VALUE(q.dim() == dims, op, ": q must be ", three_d ? "3-D [B, S, C]" : "4-D [B, S, H, d]",
                    ", got shape ", q.sizes());
  check_same_device(op, k, "k", q, "q");
  check_dtype(op, k, "k", q.scalar_type(), "the dtype of q");
  TORCH_CHECK_VALUE(k.dim() == dims && k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(-1) == q.size(-1),
                    op, ": k must have q's B, S and last dimension ", q.sizes(), ", got ", k.sizes());
  if (three_d) check_same_shape(op, k, "k", q, "q");
  const int64_t width = q.size(-1);
  TORCH_CHECK_VALUE(width % 2 == 0, op, ": the normalized width (q.shape[-1] = ", width, ") must be even");
  for (const auto& [t, name, like] : {std::tuple{&grad_q, "grad_q_out", &q}, std::tuple{&grad_k, "grad_k_out", &k},
                                      std::tuple{&q, "q", &q}, std::tuple{&k, "k", &k}}) {
    check_same_device(op, *t, name, q, "q");
    check_dtype(op, *t, name, q.scalar_type(), "the dtype of q");
    check_same_shape(op, *t, name, *like, like == &q ? "q" : "k");
    check_last_dim_contiguous(op, *t, name);
  }
  for (const auto& [w, name] : {std::pair{&q_weight, "q_weight"}, std::pair{&k_weight, "k_weight"}}) {
    check_same_device(op, *w, name, q, "q");
    if (weight_in_q_dtype) {
      check_dtype(op, *w, name, q.scalar_type(), "Qwen3RMSNorm multiplies in the model dtype");
    } else {
      TORCH_CHECK_TYPE(w->scalar_type() == q.scalar_type() || w->scalar_type() == at::kFloat, op, ": ", name,
                       " must have q's dtype or float32, got ", w->scalar_type());
    }
    TORCH_CHECK_VALUE(w->dim() == 1 && w->size(0) == width && w->is_contiguous(), op, ": ", name,
                      " must be a contiguous [", width, "], got shape ", w->sizes());
  }
  TORCH_CHECK_TYPE(q_weight.scalar_type() == k_weight.scalar_type(), op,
                   ": q_weight and k_weight must have the same dtype, got ", q_weight.scalar_type(), " and ",
                   k_weight.scalar_type());
  check_eps(op, eps);
}

// cos, sin [B or 1, S, L] of `dtype`, same shape and strides, last dimension contiguous.
void check_backward_tables(const char* op, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& q,
                           c10::ScalarType dtype, const char* why) {
  for (const auto& [t, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    check_same_device(op, *t, name, q, "q");
    check_dtype(op, *t, name, dtype, why);
    TORCH_CHECK_VALUE(t->dim() == 3 && (t->size(0) == 1 || t->size(0) == q.size(0)) && t->size(1) == q.size(1) &&
                          t->size(2) == q.size(-1),
                      op, ": ", name, " must be [B or 1, S, ", q.size(-1), "] for q of shape ", q.sizes(), ", got ",
                      t->sizes());
    check_last_dim_contiguous(op, *t, name);
  }
  TORCH_CHECK_VALUE(cos.strides() == sin.strides(), op, ": cos and sin must have the same strides, got ",
                    cos.strides(), " and ", sin.strides());
}

template <typename T>
QkRows<T> backward_rows(T* q_out, const at::Tensor& q_out_t, const at::Tensor& q, T* k_out, const at::Tensor& k_out_t,
                        const at::Tensor& k) {
  using rope_binding::head_strides;
  return QkRows<T>{q_out, head_strides(q_out_t), static_cast<const T*>(q.const_data_ptr()), head_strides(q),
                   k_out, head_strides(k_out_t), static_cast<const T*>(k.const_data_ptr()), head_strides(k),
                   q.size(0), q.size(1), static_cast<int>(q.size(2)), static_cast<int>(k.size(2))}
      .with_fast_divisors();
}

// Runs the backward on [B, S, H, d] views; set_cos_sin fills the tables or the coordinates.
template <bool kHalfRotation, CosSinSource kSource, typename SetCosSin>
QkGrads run_qk_backward(const char* op, const at::Tensor& grad_q, const at::Tensor& grad_k, const at::Tensor& q,
                        const at::Tensor& k, const at::Tensor& q_weight, const at::Tensor& k_weight, double eps,
                        std::array<bool, 4> mask, SetCosSin&& set_cos_sin) {
  const at::cuda::OptionalCUDAGuard device_guard(launch_device(q));
  // Gradients in the caller's shapes (LTX's 3-D), contiguous; the kernels see [B, S, H, d] views.
  at::Tensor dq = empty_tensor(q.sizes(), q.options()), dk = empty_tensor(k.sizes(), k.options());
  at::Tensor dqw = mask[2] ? empty_tensor(q_weight.sizes(), q_weight.options()) : empty_tensor({0}, q.options());
  at::Tensor dkw = mask[3] ? empty_tensor(k_weight.sizes(), k_weight.options()) : empty_tensor({0}, q.options());
  const at::Tensor gq = as_heads(grad_q), gk = as_heads(grad_k), q4 = as_heads(q), k4 = as_heads(k);
  at::Tensor dq4 = as_heads(dq), dk4 = as_heads(dk);
  if (q.numel() == 0 && k.numel() == 0) {
    if (mask[2]) dqw.zero_();
    if (mask[3]) dkw.zero_();
    return {mask[0] ? dq : empty_tensor({0}, q.options()), mask[1] ? dk : empty_tensor({0}, q.options()), dqw, dkw};
  }
  dispatch_float_dtype(q.scalar_type(), "q", [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto go = [&](auto weight_tag, auto table_tag) {
      using W = typename decltype(weight_tag)::type;
      using Table = typename decltype(table_tag)::type;
      QkNormRopeBackwardParams<T, W, Table> p{};
      p.grads = backward_rows<T>(static_cast<T*>(dq4.data_ptr()), dq4, gq, static_cast<T*>(dk4.data_ptr()), dk4, gk);
      p.inputs = backward_rows<T>(static_cast<T*>(dq4.data_ptr()), dq4, q4, static_cast<T*>(dk4.data_ptr()), dk4, k4);
      p.q_weight = static_cast<const W*>(q_weight.const_data_ptr());
      p.k_weight = static_cast<const W*>(k_weight.const_data_ptr());
      set_cos_sin(p);
      p.width = static_cast<int>(q.size(-1));
      p.eps = static_cast<float>(eps);
      // Interleaved pairs need whole pairs even on the narrow path; the half rotation any alignment.
      TORCH_CHECK_VALUE((qk_norm_rope_backward_aligned<kHalfRotation, kSource, qk_backward_min_vec(kHalfRotation)>(p)),
                        op, ": q, k, their gradients", kSource == CosSinSource::kTables ? ", cos, sin" : "",
                        " and the weights must start at even element offsets with even strides (whole pairs)");
      if (validation_only(q)) return;
      QkNormRopeBackwardPlan plan;
      const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
      const bool fits = plan_qk_norm_rope_backward<kHalfRotation, kSource>(p, sm_count, &plan);
      TORCH_CHECK_VALUE(fits, op, ": rows of ", p.width, " elements are too wide for the backward kernel (a row "
                        "is held in the registers of one block of at most ", kBackwardMaxThreads, " threads, ",
                        kBackwardElems, " elements each for 16-byte aligned rows)");
      at::Tensor q_partials, k_partials;  // after the outputs
      if (mask[2]) {
        q_partials = empty_tensor({plan.q_items, p.width}, q.options().dtype(at::kFloat));
        p.q_partials = q_partials.data_ptr<float>();
      }
      if (mask[3]) {
        k_partials = empty_tensor({plan.k_items, p.width}, q.options().dtype(at::kFloat));
        p.k_partials = k_partials.data_ptr<float>();
      }
      const cudaError_t err = QkNormRopeBackward<kHalfRotation, kSource>(
          p, plan, mask[2] ? static_cast<W*>(dqw.data_ptr()) : nullptr,
          mask[3] ? static_cast<W*>(dkw.data_ptr()) : nullptr, at::cuda::getCurrentCUDAStream());
      check_launch(op, err);
    };
    if constexpr (kHalfRotation) {
      go(tag, tag);  // transformers: weights and tables in the model dtype (checked)
    } else if (q_weight.scalar_type() == at::kFloat) {
      go(type_tag<float>{}, type_tag<float>{});
    } else {
      go(tag, type_tag<float>{});
    }
  });
  return {mask[0] ? dq : empty_tensor({0}, q.options()), mask[1] ? dk : empty_tensor({0}, q.options()), dqw, dkw};
}

}  // namespace

QkGrads qk_norm_rope_backward(const at::Tensor& grad_q_out, const at::Tensor& grad_k_out, const at::Tensor& q,
                              const at::Tensor& k, const at::Tensor& q_weight, const at::Tensor& k_weight, double eps,
                              const at::Tensor& cos, const at::Tensor& sin, std::array<bool, 4> output_mask) {
  constexpr const char* op = "qk_norm_rope_backward";
  check_qk_backward(op, false, grad_q_out, grad_k_out, q, k, q_weight, k_weight, eps, false);
  check_backward_tables(op, cos, sin, q, at::kFloat, "diffusers computes the rotary tables in float32");
  return run_qk_backward<false, CosSinSource::kTables>(op, grad_q_out, grad_k_out, q, k, q_weight, k_weight, eps,
                                                       output_mask, from_tables(cos, sin));
}

QkGrads hf_qk_norm_rope_backward(const at::Tensor& grad_q_out, const at::Tensor& grad_k_out, const at::Tensor& q,
                                 const at::Tensor& k, const at::Tensor& q_weight, const at::Tensor& k_weight,
                                 double eps, const at::Tensor& cos, const at::Tensor& sin,
                                 std::array<bool, 4> output_mask) {
  constexpr const char* op = "hf_qk_norm_rope_backward";
  check_qk_backward(op, false, grad_q_out, grad_k_out, q, k, q_weight, k_weight, eps, true);
  check_backward_tables(op, cos, sin, q, q.scalar_type(), "transformers builds cos/sin in the model dtype");
  return run_qk_backward<true, CosSinSource::kTables>(op, grad_q_out, grad_k_out, q, k, q_weight, k_weight, eps,
                                                      output_mask, from_tables(cos, sin));
}

QkGrads ltx_qk_norm_rope_from_coords_backward(const at::Tensor& grad_q_out, const at::Tensor& grad_k_out,
                                              const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                                              const at::Tensor& k_weight, double eps, const at::Tensor& grid,
                                              const at::Tensor& freqs, std::array<bool, 4> output_mask) {
  constexpr const char* op = "ltx_qk_norm_rope_from_coords_backward";
  check_qk_backward(op, true, grad_q_out, grad_k_out, q, k, q_weight, k_weight, eps, false);
  rope_binding::check_coords(op, grid, freqs, q);
  const LtxCoords coords = ltx_coords(grid, freqs, q.size(-1));
  return run_qk_backward<false, CosSinSource::kLtxCoords>(op, grad_q_out, grad_k_out, q, k, q_weight, k_weight, eps,
                                                          output_mask, [&coords](auto& p) { p.coords = coords; });
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&qk_norm_rope_backward,
    &hf_qk_norm_rope_backward, &ltx_qk_norm_rope_from_coords_backward);

}  // namespace transformer_kernels
