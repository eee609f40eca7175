// Torch entry points of the fused q/k norm + RoPE forwards: validate, pick dtypes, call the
// torch-free launcher in qk_norm_rope.cuh on the current stream of q's device. Their backward:
// qk_norm_rope_backward.cu.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <tuple>
#include <utility>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/dispatch.h"
#include "qk_norm_rope/ops.h"
#include "qk_norm_rope/qk_norm_rope.cuh"
#include "rope/rope_binding.h"
#include "rope/rope_sources.h"

namespace transformer_kernels {
namespace {

using namespace rope_binding;

constexpr const char* kNormRopeOp = "qk_norm_rope";
constexpr const char* kHfNormRopeOp = "hf_qk_norm_rope";
constexpr const char* kLtxCoordsNormRopeOp = "ltx_qk_norm_rope_from_coords";

// q [B, S, Gq, L], k [B, S, Gk, L]; weights [L]; eps. Each form takes what its library builds:
// diffusers weights in q's dtype or fp32, transformers weights in the model dtype.
void check_qk_norm(const char* op, QkNormRopeForm form, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& q_weight, const at::Tensor& k_weight, double eps) {
  const bool transformers = form == QkNormRopeForm::kTransformers;
  check_qk(op, q, k);
  const int64_t width = q.size(3);
  TORCH_CHECK_VALUE(width % 2 == 0, op, ": the normalized width (q.shape[-1] = ", width,
                    ") must be even: RoPE rotates pairs");
  for (const auto& [w, name] : {std::pair{&q_weight, "q_weight"}, std::pair{&k_weight, "k_weight"}}) {
    check_same_device(op, *w, name, q, "q");
    if (transformers) {
      check_dtype(op, *w, name, q.scalar_type(),
                  "Qwen3RMSNorm multiplies in the weight's dtype: another dtype would change the output's");
    } else {
      TORCH_CHECK_TYPE(w->scalar_type() == q.scalar_type() || w->scalar_type() == at::kFloat, op, ": ", name,
                       " must have q's dtype or float32, got ", w->scalar_type());
    }
    TORCH_CHECK_VALUE(w->dim() == 1 && w->size(0) == width && w->is_contiguous(), op, ": ", name,
                      " must be a contiguous [", width, "], got shape ", w->sizes(), " and strides ", w->strides());
  }
  TORCH_CHECK_TYPE(q_weight.scalar_type() == k_weight.scalar_type(), op,
                   ": q_weight and k_weight must have the same dtype, got ", q_weight.scalar_type(), " and ",
                   k_weight.scalar_type());
  check_eps(op, eps);
}

// The norm's inputs as above; cos, sin [B or 1, S, L]: fp32 for diffusers, the model dtype for
// transformers.
void check_qk_norm_rope(const char* op, QkNormRopeForm form, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& q_weight, const at::Tensor& k_weight, double eps, const at::Tensor& cos,
                        const at::Tensor& sin) {
  check_qk_norm(op, form, q, k, q_weight, k_weight, eps);
  check_tables(op, cos, sin, q);
  const int64_t width = q.size(3);
  for (const auto& [t, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    if (form == QkNormRopeForm::kTransformers) {
      check_dtype(op, *t, name, q.scalar_type(), "transformers builds cos/sin in the model dtype");
    } else {
      check_dtype(op, *t, name, at::kFloat, "diffusers computes the rotary tables in float32");
    }
    TORCH_CHECK_VALUE(t->size(2) == width, op, ": ", name, " must cover the normalized width ", width,
                      " (q.shape[-1]), got ", t->sizes());
  }
}

// Outputs passed by the caller: q's and k's shapes and dtype, sharing memory with no input nor
// with each other.
void check_qk_outputs(const char* op, const at::Tensor& q_out, const at::Tensor& k_out, const at::Tensor& q,
                      const at::Tensor& k, const at::Tensor& q_weight, const at::Tensor& k_weight,
                      const at::Tensor& cos, const at::Tensor& sin) {
  for (const auto& [out, name, like] : {std::tuple{&q_out, "q_out", &q}, std::tuple{&k_out, "k_out", &k}})
    check_output(op, *out, name, q, like->sizes(), q.scalar_type(),
                 {{&q, "q"}, {&k, "k"}, {&q_weight, "q_weight"}, {&k_weight, "k_weight"}, {&cos, "cos"}, {&sin, "sin"}},
                 "q");
  check_no_overlap(op, k_out, "k_out", q_out, "q_out");
}

// kSource: tables (set_cos_sin = from_tables) or LTX's coordinates (set_cos_sin sets p.coords).
template <QkNormRopeForm kForm, CosSinSource kSource, typename SetCosSin>
void run_qk_norm_rope(const char* op, at::Tensor& q_out, at::Tensor& k_out, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& q_weight, const at::Tensor& k_weight, double eps, SetCosSin&& set_cos_sin) {
  const at::cuda::OptionalCUDAGuard device_guard(launch_device(q));
  dispatch_float_dtype(q.scalar_type(), "q", [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto go = [&](auto weight_tag, auto table_tag) {
      using W = typename decltype(weight_tag)::type;
      using Table = typename decltype(table_tag)::type;
      QkNormRopeParams<T, W, Table> p{};
      p.qk = qk_rows<T>(q_out, q, k_out, k);
      p.q_weight = static_cast<const W*>(q_weight.const_data_ptr());
      p.k_weight = static_cast<const W*>(k_weight.const_data_ptr());
      set_cos_sin(p);
      p.width = static_cast<int>(q.size(3));
      p.eps = static_cast<float>(eps);
      // Interleaved pairs need whole pairs even on the narrow path; the half rotation any alignment.
      const bool narrow_ok = qk_norm_rope_aligned<kForm, kSource, qk_norm_rope_detail::min_vec(kForm)>(p);
      TORCH_CHECK_VALUE(p.qk.num_rows() == 0 || narrow_ok, op, ": ",
                        kSource == CosSinSource::kTables ? "q, k, cos, sin and the weights" : "q, k and the weights",
                        " must start at even element offsets with even strides (whole pairs), got q strides ",
                        q.strides(), " and k strides ", k.strides());
      const bool vectorized = qk_norm_rope_aligned<kForm, kSource, vec_size<T>()>(p);
      const int64_t max_width = qk_norm_rope_max_width<kForm, T>(vectorized);
      TORCH_CHECK_VALUE(q.size(3) <= max_width, op, ": rows of more than ", max_width,
                        " elements are not supported here (the whole row is kept in registers; 16-byte aligned "
                        "rows allow more), got width ", q.size(3));
      if (validation_only(q)) return;
      const cudaError_t err =
          QkNormRope<kForm, kSource>(p, at::cuda::getCurrentCUDAStream());
      check_launch(op, err);
    };
    if constexpr (kForm == QkNormRopeForm::kTransformers) {
      go(tag, tag);  // weights and tables in the model dtype (checked)
    } else if (q_weight.scalar_type() == at::kFloat) {
      go(type_tag<float>{}, type_tag<float>{});
    } else {
      go(tag, type_tag<float>{});
    }
  });
}

// The functional table forms: new [B, S, H, d] outputs.
template <QkNormRopeForm kForm>
std::tuple<at::Tensor, at::Tensor> qk_norm_rope_from_tables(const char* op, const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& q_weight, const at::Tensor& k_weight,
                                                            double eps, const at::Tensor& cos, const at::Tensor& sin) {
  check_qk_norm_rope(op, kForm, q, k, q_weight, k_weight, eps, cos, sin);
  at::Tensor q_out = empty_tensor(q.sizes(), q.options());
  at::Tensor k_out = empty_tensor(k.sizes(), k.options());
  run_qk_norm_rope<kForm, CosSinSource::kTables>(op, q_out, k_out, q, k, q_weight, k_weight, eps,
                                                 from_tables(cos, sin));
  return {q_out, k_out};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> qk_norm_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                                                const at::Tensor& k_weight, double eps, const at::Tensor& cos,
                                                const at::Tensor& sin) {
  return qk_norm_rope_from_tables<QkNormRopeForm::kDiffusers>(kNormRopeOp, q, k, q_weight, k_weight, eps, cos, sin);
}

std::tuple<at::Tensor, at::Tensor> hf_qk_norm_rope(const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& q_weight, const at::Tensor& k_weight, double eps,
                                                   const at::Tensor& cos, const at::Tensor& sin) {
  return qk_norm_rope_from_tables<QkNormRopeForm::kTransformers>(kHfNormRopeOp, q, k, q_weight, k_weight, eps, cos,
                                                                 sin);
}

void hf_qk_norm_rope_out(at::Tensor& q_out, at::Tensor& k_out, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& q_weight, const at::Tensor& k_weight, double eps, const at::Tensor& cos,
                         const at::Tensor& sin) {
  check_qk_norm_rope(kHfNormRopeOp, QkNormRopeForm::kTransformers, q, k, q_weight, k_weight, eps, cos, sin);
  check_qk_outputs(kHfNormRopeOp, q_out, k_out, q, k, q_weight, k_weight, cos, sin);
  run_qk_norm_rope<QkNormRopeForm::kTransformers, CosSinSource::kTables>(kHfNormRopeOp, q_out, k_out, q, k, q_weight,
                                                                         k_weight, eps, from_tables(cos, sin));
}

std::tuple<at::Tensor, at::Tensor> ltx_qk_norm_rope_from_coords(const at::Tensor& q, const at::Tensor& k,
                                                                const at::Tensor& q_weight,
                                                                const at::Tensor& k_weight, double eps,
                                                                const at::Tensor& grid, const at::Tensor& freqs) {
  at::Tensor q4, k4;  // [B, S, 1, C] views
  std::tie(q4, k4) = check_ltx_coords(kLtxCoordsNormRopeOp, q, k, grid, freqs);
  check_qk_norm(kLtxCoordsNormRopeOp, QkNormRopeForm::kDiffusers, q4, k4, q_weight, k_weight, eps);
  at::Tensor q_out = empty_tensor(q.sizes(), q.options());
  at::Tensor k_out = empty_tensor(k.sizes(), k.options());
  at::Tensor q_out4 = q_out.unsqueeze(2), k_out4 = k_out.unsqueeze(2);
  const LtxCoords coords = ltx_coords(grid, freqs, q.size(2));
  run_qk_norm_rope<QkNormRopeForm::kDiffusers, CosSinSource::kLtxCoords>(
      kLtxCoordsNormRopeOp, q_out4, k_out4, q4, k4, q_weight, k_weight, eps, [&coords](auto& p) { p.coords = coords; });
  return {q_out, k_out};
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&qk_norm_rope, &hf_qk_norm_rope,
    &hf_qk_norm_rope_out, &ltx_qk_norm_rope_from_coords);

}  // namespace transformer_kernels
