// Torch entry points of rotary embeddings: validate, pick dtypes, call the torch-free launcher in
// rope.cuh on the current stream of q's device.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <limits>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/dispatch.h"
#include "rope/ops.h"
#include "rope/rope.cuh"
#include "rope/rope_binding.h"
#include "rope/rope_sources.h"

namespace transformer_kernels {
namespace {

using namespace rope_binding;

constexpr const char* kOp = "rope";
constexpr const char* kHfRopeOp = "apply_rotary_pos_emb";
constexpr const char* kLtxCoordsOp = "ltx_rope_from_coords";

RopeStyle resolve_style(std::string_view style) {
  if (style == "neox") return RopeStyle::kNeox;
  if (style == "interleaved") return RopeStyle::kInterleaved;
  TORCH_CHECK_VALUE(false, kOp, ": style must be \"neox\" or \"interleaved\", got \"", style, "\"");
}

// q, k: [B, S, H, d]; cos, sin: [B or 1, S, R], R even and <= d. `op` and `n`: the op's names (the
// backward's for its gradients).
void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                  bool fp32_math, const char* op = kOp, QkNames n = {}) {
  check_qk(op, q, k, n);
  check_tables(op, cos, sin, q, n.q);
  const at::ScalarType table_dtype = cos.scalar_type();
  for (const auto& [t, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    if (fp32_math) {
      TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat || t->scalar_type() == q.scalar_type(), op, ": ", name,
                       " must be float32 or ", n.q, "'s dtype, got ", t->scalar_type());
    } else {
      check_dtype(op, *t, name, q.scalar_type(),
                  "transformers builds cos/sin in the model dtype; pass fp32 tables with fp32 math");
    }
  }
  check_dtype(op, sin, "sin", table_dtype, "the dtype of cos");
  const int64_t rotary_dim = cos.size(2);
  TORCH_CHECK_VALUE(rotary_dim % 2 == 0 && rotary_dim <= q.size(3), op,
                    ": the rotary width (cos.shape[-1] = ", rotary_dim, ") must be even and at most head_dim = ",
                    q.size(3));
}

// Rope() or, for the backward ops, RopeBackward(): only the one asked for is compiled.
template <RopeStyle kStyle, bool kFp32Math, CosSinSource kSource, bool kInverse, typename T, typename table_t>
cudaError_t rotate(const RopeParams<T, table_t>& p, cudaStream_t stream) {
  if constexpr (kInverse) {
    return RopeBackward<kStyle, kFp32Math, kSource>(p, stream);
  } else {
    return Rope<kStyle, kFp32Math, kSource>(p, stream);
  }
}

// positions == nullptr: tables cos, sin [B or 1, S, R]. Otherwise the cached form: cos is the
// cos_sin_cache [max_position, R] (sin unused) and positions [B * S] picks each token's row.
// kInverse: the backward (rope.cuh), q and k holding the outputs' gradients.
template <RopeStyle kStyle, bool kFp32Math, bool kCache, bool kInverse = false>
void run(at::Tensor& q_out, at::Tensor& k_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
         const at::Tensor& sin, const at::Tensor* positions, bool copy_pass_through) {
  const at::cuda::OptionalCUDAGuard device_guard(launch_device(q));
  dispatch_float_dtype(q.scalar_type(), "q", [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto go = [&](auto table_tag) {
      using table_t = typename decltype(table_tag)::type;
      RopeParams<T, table_t> p;
      p.qk = qk_rows<T>(q_out, q, k_out, k);
      p.cos = static_cast<const table_t*>(cos.const_data_ptr());
      p.sin = static_cast<const table_t*>(sin.const_data_ptr());
      if constexpr (kCache) {
        p.positions = static_cast<const int64_t*>(positions->const_data_ptr());  // untyped: meta stand-ins have none
        p.max_position = cos.size(0);
        p.table_b = 0;
        p.table_s = cos.stride(0);
      } else {
        p.table_b = cos.size(0) == 1 ? 0 : cos.stride(0);
        p.table_s = cos.stride(1);
      }
      p.head_dim = static_cast<int>(q.size(3));
      p.rotary_dim = static_cast<int>(cos.size(-1));
      p.copy_pass_through = copy_pass_through;
      constexpr CosSinSource kSource = kCache ? CosSinSource::kCache : CosSinSource::kTables;
      if (validation_only(q)) return;
      const cudaError_t err = rotate<kStyle, kFp32Math, kSource, kInverse>(p, at::cuda::getCurrentCUDAStream());
      check_launch(kOp, err);
    };
    if (cos.scalar_type() == q.scalar_type()) {
      go(type_tag<T>{});
    } else if constexpr (kFp32Math && !std::is_same_v<T, float>) {
      go(type_tag<float>{});  // fp32 tables with half q/k (diffusers)
    } else {
      TORCH_CHECK_TYPE(false, kOp, ": unsupported table dtype ", cos.scalar_type(), " for q of dtype ", q.scalar_type());
    }
  });
}

void launch_rope_call(at::Tensor& q_out, at::Tensor& k_out, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& cos, const at::Tensor& sin, std::string_view style, bool fp32_math,
                      bool copy_pass_through, const at::Tensor* positions = nullptr) {
  const RopeStyle s = resolve_style(style);
  auto with = [&](auto style_tag, auto fp32_tag, auto cache_tag) {
    run<decltype(style_tag)::value, decltype(fp32_tag)::value, decltype(cache_tag)::value>(
        q_out, k_out, q, k, cos, sin, positions, copy_pass_through);
  };
  using Neox = std::integral_constant<RopeStyle, RopeStyle::kNeox>;
  using Interleaved = std::integral_constant<RopeStyle, RopeStyle::kInterleaved>;
  auto with_fp32 = [&](auto style_tag, auto cache_tag) {
    fp32_math ? with(style_tag, std::true_type{}, cache_tag) : with(style_tag, std::false_type{}, cache_tag);
  };
  auto with_style = [&](auto cache_tag) {
    s == RopeStyle::kNeox ? with_fp32(Neox{}, cache_tag) : with_fp32(Interleaved{}, cache_tag);
  };
  positions != nullptr ? with_style(std::true_type{}) : with_style(std::false_type{});
}

// The cached form's checks: positions [T] int64; q [T, Hq*d] or [T, Hq, d] and k likewise;
// cos_sin_cache [max_position, R], R even, R <= d, q's dtype or float32.
void check_cached(const at::Tensor& positions, const at::Tensor& q, const at::Tensor& k, int64_t head_size,
                  const at::Tensor& cache) {
  check_cuda(kOp, q, "query");
  check_float_dtype(kOp, q, "query");
  TORCH_CHECK_VALUE(head_size > 0, kOp, ": head_size must be positive, got ", head_size);
  for (const auto& [t, name] : {std::pair{&q, "query"}, std::pair{&k, "key"}}) {
    check_same_device(kOp, *t, name, q, "query");
    check_dtype(kOp, *t, name, q.scalar_type(), "the dtype of query");
    TORCH_CHECK_VALUE((t->dim() == 2 && t->size(1) % head_size == 0) || (t->dim() == 3 && t->size(2) == head_size),
                      kOp, ": ", name, " must be [num_tokens, num_heads * head_size] or [num_tokens, num_heads, "
                      "head_size] with head_size = ", head_size, ", got ", t->sizes());
    check_last_dim_contiguous(kOp, *t, name);
    check_writable_output(kOp, *t, name);
  }
  TORCH_CHECK_VALUE(k.size(0) == q.size(0), kOp, ": key must have query's num_tokens ", q.size(0), ", got ",
                    k.sizes());
  check_same_device(kOp, positions, "positions", q, "query");
  check_dtype(kOp, positions, "positions", at::kLong, "vLLM's token positions");
  TORCH_CHECK_VALUE(positions.numel() == q.size(0) && positions.is_contiguous(), kOp,
                    ": positions must be contiguous with one entry per token (", q.size(0), "), got shape ",
                    positions.sizes(), " and strides ", positions.strides());
  check_same_device(kOp, cache, "cos_sin_cache", q, "query");
  TORCH_CHECK_TYPE(cache.scalar_type() == q.scalar_type() || cache.scalar_type() == at::kFloat, kOp,
                   ": cos_sin_cache must have query's dtype or float32, got ", cache.scalar_type());
  TORCH_CHECK_VALUE(cache.dim() == 2 && cache.size(1) % 2 == 0 && cache.size(1) <= head_size, kOp,
                    ": cos_sin_cache must be [max_position, rotary_dim] with rotary_dim even and at most head_size = ",
                    head_size, ", got ", cache.sizes());
  check_last_dim_contiguous(kOp, cache, "cos_sin_cache");
  check_no_overlap(kOp, q, "query", k, "key");  // views of one fused projection pass
  for (const auto& [t, name] : {std::pair{&q, "query"}, std::pair{&k, "key"}}) {
    check_no_overlap(kOp, *t, name, cache, "cos_sin_cache");
    check_no_overlap(kOp, *t, name, positions, "positions");
  }
}

// [T, H*d] or [T, H, d] -> the kernel's [1, T, H, d] view.
at::Tensor tokens_as_bshd(const at::Tensor& t, int64_t head_size) {
  const at::Tensor heads = t.dim() == 2 ? t.unflatten(1, {t.size(1) / head_size, head_size}) : t;
  return heads.unsqueeze(0);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                        const at::Tensor& sin, std::string_view style, bool fp32_math) {
  check_inputs(q, k, cos, sin, fp32_math);
  resolve_style(style);
  at::Tensor q_out = empty_tensor(q.sizes(), q.options());
  at::Tensor k_out = empty_tensor(k.sizes(), k.options());
  launch_rope_call(q_out, k_out, q, k, cos, sin, style, fp32_math, /*copy_pass_through=*/true);
  return {q_out, k_out};
}

void rope_(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin, std::string_view style,
           bool fp32_math) {
  check_inputs(q, k, cos, sin, fp32_math);
  // Each pair is read and written by the same thread, so in place is safe; q and k must not
  // overlap each other (checked) nor the tables.
  check_writable_output(kOp, q, "q");
  check_writable_output(kOp, k, "k");
  check_no_overlap(kOp, q, "q", k, "k");  // views of one fused projection pass: their elements interleave
  for (const auto& [t, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    check_no_overlap(kOp, q, "q", *t, name);
    check_no_overlap(kOp, k, "k", *t, name);
  }
  launch_rope_call(q, k, q, k, cos, sin, style, fp32_math, /*copy_pass_through=*/false);
}

// transformers' layouts: unsqueeze_dim 1 is q [B, H, S, d] (viewed here as [B, S, H, d], no copy),
// 2 is q [B, S, H, d]. Done here rather than in Python: each Python-side view costs a few µs of a
// decode step's host time.
at::Tensor hf_as_bshd(const at::Tensor& t, const char* name, int64_t unsqueeze_dim) {
  TORCH_CHECK_VALUE(unsqueeze_dim == 1 || unsqueeze_dim == 2, kHfRopeOp,
                    ": unsqueeze_dim must be 1 ([B, H, S, d]) or 2 ([B, S, H, d]), got ", unsqueeze_dim);
  TORCH_CHECK_VALUE(t.dim() == 4, kHfRopeOp, ": ", name, " must be 4-D ([B, H, S, d] for unsqueeze_dim=1, "
                    "[B, S, H, d] for 2), got shape ", t.sizes());
  return unsqueeze_dim == 1 ? t.transpose(1, 2) : t;
}

std::tuple<at::Tensor, at::Tensor> hf_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                           const at::Tensor& sin, int64_t unsqueeze_dim) {
  const at::Tensor qb = hf_as_bshd(q, "q", unsqueeze_dim), kb = hf_as_bshd(k, "k", unsqueeze_dim);
  auto [q_out, k_out] = rope(qb, kb, cos, sin, "neox", /*fp32_math=*/false);
  if (unsqueeze_dim == 1) return {q_out.transpose(1, 2), k_out.transpose(1, 2)};
  return {q_out, k_out};
}

void hf_rope_(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin, int64_t unsqueeze_dim) {
  at::Tensor qb = hf_as_bshd(q, "q", unsqueeze_dim), kb = hf_as_bshd(k, "k", unsqueeze_dim);
  rope_(qb, kb, cos, sin, "neox", /*fp32_math=*/false);
}

void rope_cached_(const at::Tensor& positions, at::Tensor& query, at::Tensor& key, int64_t head_size,
                  const at::Tensor& cos_sin_cache, std::string_view style) {
  check_cached(positions, query, key, head_size, cos_sin_cache);
  resolve_style(style);
  at::Tensor q = tokens_as_bshd(query, head_size);
  at::Tensor k = tokens_as_bshd(key, head_size);
  check_heads_and_rows(kOp, q, k);
  // One rounding from fp32 with an fp32 cache; per op (vLLM's scalar_t arithmetic) in q's dtype.
  const bool fp32_math = cos_sin_cache.scalar_type() == at::kFloat && query.scalar_type() != at::kFloat;
  launch_rope_call(q, k, q, k, cos_sin_cache, cos_sin_cache, style, fp32_math, /*copy_pass_through=*/false, &positions);
}

namespace {
// The coordinate rotation of q, k [B, S, C] into new tensors, or its backward (kInverse: q and k
// holding the outputs' gradients).
template <bool kInverse>
std::tuple<at::Tensor, at::Tensor> run_ltx_rope_from_coords(const char* op, const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& grid, const at::Tensor& freqs) {
  at::Tensor q4, k4;  // [B, S, 1, C] views (not structured bindings: the lambda below captures them)
  std::tie(q4, k4) = check_ltx_coords(op, q, k, grid, freqs, kInverse ? kGradQkNames : QkNames{});
  at::Tensor q_out = empty_tensor(q.sizes(), q.options());
  at::Tensor k_out = empty_tensor(k.sizes(), k.options());
  at::Tensor q_out4 = q_out.unsqueeze(2), k_out4 = k_out.unsqueeze(2);
  const at::cuda::OptionalCUDAGuard device_guard(launch_device(q));
  dispatch_float_dtype(q.scalar_type(), "q", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RopeParams<T, float> p{};
    p.qk = qk_rows<T>(q_out4, q4, k_out4, k4);
    p.coords = ltx_coords(grid, freqs, q.size(2));
    p.head_dim = p.rotary_dim = static_cast<int>(q.size(2));
    p.copy_pass_through = false;  // every channel is rotated (the identity pairs with cos 1, sin 0)
    if (validation_only(q)) return;
    const cudaError_t err = rotate<RopeStyle::kInterleaved, /*kFp32Math=*/true, CosSinSource::kLtxCoords, kInverse>(
        p, at::cuda::getCurrentCUDAStream());
    check_launch(op, err);
  });
  return {q_out, k_out};
}
}  // namespace

std::tuple<at::Tensor, at::Tensor> ltx_rope_from_coords(const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& grid, const at::Tensor& freqs) {
  return run_ltx_rope_from_coords<false>(kLtxCoordsOp, q, k, grid, freqs);
}

// ---- backward of the out-of-place rotations (the rotation's transpose: rope.cuh's kInverse) ----
// The same checks, layouts and rounding as the forwards, with grad_q, grad_k (the outputs'
// gradients) in place of q, k. Channels >= R pass their gradient through. The tables, grid and
// freqs get no gradient (the Python glue refuses them requiring grad).

namespace {
void launch_backward(at::Tensor& grad_q_in, at::Tensor& grad_k_in, const at::Tensor& grad_q, const at::Tensor& grad_k,
                     const at::Tensor& cos, const at::Tensor& sin, std::string_view style, bool fp32_math) {
  const RopeStyle s = resolve_style(style);
  auto with = [&](auto style_tag, auto fp32_tag) {
    run<decltype(style_tag)::value, decltype(fp32_tag)::value, /*kCache=*/false, /*kInverse=*/true>(
        grad_q_in, grad_k_in, grad_q, grad_k, cos, sin, nullptr, /*copy_pass_through=*/true);
  };
  using Neox = std::integral_constant<RopeStyle, RopeStyle::kNeox>;
  using Interleaved = std::integral_constant<RopeStyle, RopeStyle::kInterleaved>;
  auto with_fp32 = [&](auto style_tag) {
    fp32_math ? with(style_tag, std::true_type{}) : with(style_tag, std::false_type{});
  };
  s == RopeStyle::kNeox ? with_fp32(Neox{}) : with_fp32(Interleaved{});
}
}  // namespace

std::tuple<at::Tensor, at::Tensor> rope_backward(const at::Tensor& grad_q, const at::Tensor& grad_k,
                                                 const at::Tensor& cos, const at::Tensor& sin, std::string_view style,
                                                 bool fp32_math) {
  check_inputs(grad_q, grad_k, cos, sin, fp32_math, "rope_backward", kGradQkNames);
  resolve_style(style);
  at::Tensor grad_q_in = empty_tensor(grad_q.sizes(), grad_q.options());
  at::Tensor grad_k_in = empty_tensor(grad_k.sizes(), grad_k.options());
  launch_backward(grad_q_in, grad_k_in, grad_q, grad_k, cos, sin, style, fp32_math);
  return {grad_q_in, grad_k_in};
}

std::tuple<at::Tensor, at::Tensor> ltx_rope_from_coords_backward(const at::Tensor& grad_q, const at::Tensor& grad_k,
                                                                 const at::Tensor& grid, const at::Tensor& freqs) {
  return run_ltx_rope_from_coords<true>("ltx_rope_from_coords_backward", grad_q, grad_k, grid, freqs);
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&rope, &rope_, &hf_rope, &hf_rope_, &rope_cached_,
    &ltx_rope_from_coords, &rope_backward, &ltx_rope_from_coords_backward);

}  // namespace transformer_kernels
