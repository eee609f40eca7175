// Torch entry points of the fused linear cross-entropy: hidden [N, H] @ weight [V, H]^T -> the
// cross-entropy with target [N], chunk by chunk over the tokens so that the [N, V] logits never
// exist. Per chunk: the logits GEMM (torch: cuBLAS on CUDA), the in-place loss/gradient kernel of
// cross_entropy.cuh, then the GEMMs of the hidden's and the weight's gradients from that chunk's
// logit gradients. On CPU the kernel's math runs as ATen ops instead (a reference stand-in, so
// the chunk loop itself runs and is tested without a GPU; float64 is accepted there).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <string_view>
#include <tuple>

#include "common/alloc.h"
#include "common/checks.h"
#include "common/dispatch.h"
#include "loss/cross_entropy.cuh"
#include "loss/ops.h"

namespace transformer_kernels {
namespace {

constexpr const char* kOp = "fused_linear_cross_entropy";
constexpr const char* kBackwardOp = "fused_linear_cross_entropy_backward";

enum class Reduction { kMean, kSum, kNone };

Reduction resolve_reduction(const char* op, std::string_view reduction) {
  if (reduction == "mean") return Reduction::kMean;
  if (reduction == "sum") return Reduction::kSum;
  if (reduction == "none") return Reduction::kNone;
  TORCH_CHECK_VALUE(false, op, ": reduction must be \"mean\", \"sum\" or \"none\", got \"", reduction, "\"");
}

struct Options {
  int64_t ignore_index;
  Reduction reduction;
  double label_smoothing;
  double softcap;  // 0: none
};

Options check_args(const char* op, const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                   const std::optional<at::Tensor>& bias, int64_t ignore_index, std::string_view reduction,
                   double label_smoothing, std::optional<double> softcap, int64_t chunk_rows) {
  TORCH_CHECK_VALUE(hidden.is_cuda() || hidden.is_cpu() || validation_only(hidden), op,
                    ": hidden must be a CUDA tensor (or a CPU one: the reference path), got a tensor on ",
                    hidden.device());
  const bool cpu = hidden.is_cpu();
  TORCH_CHECK_TYPE(is_float_dtype(hidden.scalar_type()) || (cpu && hidden.scalar_type() == at::kDouble), op,
                   ": hidden must be float32, float16 or bfloat16 (float64 on CPU), got ", hidden.scalar_type());
  TORCH_CHECK_VALUE(hidden.dim() == 2, op, ": hidden must be 2-D [N, H] (flatten the tokens first), got shape ",
                    hidden.sizes());
  check_device_matches(op, weight, "weight", hidden, "hidden");  // CUDA, or the CPU reference path
  check_dtype(op, weight, "weight", hidden.scalar_type(), "the dtype of hidden: the GEMMs take one dtype");
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(1) == hidden.size(1) && weight.size(0) >= 1, op,
                    ": weight must be [V, H] (lm_head.weight) with hidden's H = ", hidden.size(1),
                    " and V >= 1, got ", weight.sizes());
  TORCH_CHECK_VALUE(weight.size(0) <= std::numeric_limits<int32_t>::max(), op,
                    ": vocabularies above 2^31 - 1 are not supported, got ", weight.size(0));
  check_device_matches(op, target, "target", hidden, "hidden");  // CUDA, or the CPU reference path
  check_dtype(op, target, "target", at::kLong, "class indices");
  TORCH_CHECK_VALUE(target.dim() == 1 && target.size(0) == hidden.size(0), op,
                    ": target must be [N] with hidden's N = ", hidden.size(0), ", got ", target.sizes());
  if (bias.has_value()) {
    check_device_matches(op, *bias, "bias", hidden, "hidden");
    check_dtype(op, *bias, "bias", hidden.scalar_type(), "the dtype of hidden");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == weight.size(0), op, ": bias must be [V] with V = ",
                      weight.size(0), ", got ", bias->sizes());
  }
  TORCH_CHECK_VALUE(std::isfinite(label_smoothing) && label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
                    ": label_smoothing must be in [0, 1], got ", label_smoothing);
  TORCH_CHECK_VALUE(!softcap.has_value() || (std::isfinite(*softcap) && *softcap > 0.0), op,
                    ": softcap must be a finite number > 0 (or None), got ", softcap.value_or(0.0));
  TORCH_CHECK_VALUE(chunk_rows >= 0, op, ": chunk_rows must be >= 0 (0: chosen from the shapes), got ", chunk_rows);
  return {ignore_index, resolve_reduction(op, reduction), label_smoothing, softcap.value_or(0.0)};
}

// Tokens per chunk, from the memory the chunk's logits may take (Liger-Kernel's rule): about the
// hidden's own size, n * V ~ N * H, so n = N / ceil(V / H) rounded up to a power of two; at most N.
// `requested` > 0 overrides it (tests, benchmarks).
int64_t chunk_rows_for(int64_t n, int64_t h, int64_t v, int64_t requested) {
  if (n == 0) return 1;
  if (requested > 0) return std::min(requested, n);
  const int64_t growth = std::max<int64_t>(1, (v + std::max<int64_t>(h, 1) - 1) / std::max<int64_t>(h, 1));
  const int64_t wanted = (n + growth - 1) / growth;
  int64_t rows = 1;
  while (rows < wanted) rows *= 2;
  return std::min(rows, n);
}

// The chunk's loss per row and, when `scale` is given, its logits overwritten by their gradient
// (cross_entropy.cuh's math). logits [n, V] (unit column stride), target [n], loss [n] fp32,
// scale [1] or [n] fp32.
void cross_entropy_chunk(at::Tensor& logits, const at::Tensor& target, at::Tensor& loss, const at::Tensor* scale,
                         const Options& o) {
  const int64_t n = logits.size(0), vocab = logits.size(1);
  if (logits.is_cuda()) {
    dispatch_float_dtype(logits.scalar_type(), "hidden", [&](auto tag) {
      using T = typename decltype(tag)::type;
      CrossEntropyParams<T> p;
      p.logits = static_cast<T*>(logits.data_ptr());
      p.logits_stride = logits.stride(0);
      p.target = target.const_data_ptr<int64_t>();
      p.target_stride = target.stride(0);
      p.loss = loss.data_ptr<float>();
      p.grad_scale = scale != nullptr ? scale->const_data_ptr<float>() : nullptr;
      p.grad_scale_stride = scale != nullptr && scale->numel() > 1 ? 1 : 0;
      p.rows = n;
      p.vocab = static_cast<int>(vocab);
      p.ignore_index = o.ignore_index;
      p.label_smoothing = static_cast<float>(o.label_smoothing);
      p.softcap = static_cast<float>(o.softcap);
      const cudaError_t err = cross_entropy_rows(p, at::cuda::getCurrentCUDAStream());
      check_launch(kOp, err);
    });
    return;
  }
  // CPU reference stand-in: the same formulas as ATen ops, in fp32 (float64 for float64 inputs).
  const at::ScalarType acc = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const double eps = o.label_smoothing;
  const at::Tensor l = logits.to(acc);
  at::Tensor tanh_l, z = l;
  if (o.softcap > 0) {
    tanh_l = at::tanh(l / o.softcap);
    z = tanh_l * o.softcap;
  }
  const at::Tensor lse = at::logsumexp(z, {1}, /*keepdim=*/true);
  const at::Tensor ignored = (target == o.ignore_index).unsqueeze(1);
  const at::Tensor valid = at::logical_and(at::logical_not(ignored), ((target >= 0) & (target < vocab)).unsqueeze(1));
  const at::Tensor index = at::where(valid, target.unsqueeze(1), at::zeros_like(target.unsqueeze(1)));
  const at::Tensor nan = at::full({}, std::numeric_limits<double>::quiet_NaN(), z.options());
  const at::Tensor zero = at::zeros({}, z.options());
  at::Tensor row_loss = (1 - eps) * (lse - z.gather(1, index)) + eps * (lse - z.mean({1}, /*keepdim=*/true));
  row_loss = at::where(ignored, zero, at::where(valid, row_loss, nan));
  loss.copy_(row_loss.squeeze(1));
  if (scale == nullptr) return;
  at::Tensor g = at::exp(z - lse) - eps / static_cast<double>(vocab);
  g.scatter_add_(1, index, at::full({n, 1}, -(1 - eps), z.options()));
  if (o.softcap > 0) g = g * (1 - tanh_l * tanh_l);
  g = g * scale->to(acc).view({scale->numel() > 1 ? n : 1, 1});
  logits.copy_(at::where(ignored, zero, at::where(valid, g, nan)));
}

// 16 bytes, in elements of `t`: the logits rows start at this multiple so the kernel takes vectors.
int64_t padded_width(int64_t v, const at::Tensor& t) {
  const int64_t per_vec = std::max<int64_t>(1, kVecBytes / static_cast<int64_t>(t.element_size()));
  return (v + per_vec - 1) / per_vec * per_vec;
}

struct Grads {
  at::Tensor hidden, weight, bias;  // undefined where not asked
};

// The chunk loop. scale nullptr: the loss only. Otherwise the gradients `want` asks for (hidden,
// weight, bias), each chunk's logit gradients scaled by `scale` ([1] or [N] fp32). Returns the
// loss of each row [N] fp32.
at::Tensor run_chunks(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                      const std::optional<at::Tensor>& bias, const Options& o, const at::Tensor* scale,
                      std::array<bool, 3> want, int64_t requested_rows, Grads* grads) {
  const int64_t n = hidden.size(0), h = hidden.size(1), v = weight.size(0);
  const int64_t rows = chunk_rows_for(n, h, v, requested_rows);
  at::Tensor loss = empty_tensor({n}, hidden.options().dtype(hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat));
  at::Tensor buffer = empty_tensor({std::min(rows, std::max<int64_t>(n, 1)), padded_width(v, hidden)}, hidden.options());
  // The padding columns past V are never written, but cuBLAS reads whole 16-byte vectors of a row
  // (compute-sanitizer's initcheck on the H200): zeros there, so that nothing left in the allocator's
  // memory (NaN, say) can reach a product.
  if (buffer.size(1) > v) buffer.narrow(1, v, buffer.size(1) - v).zero_();
  const bool with_bias = bias.has_value();
  const at::ScalarType acc = hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (scale != nullptr) {
    if (want[0]) grads->hidden = empty_tensor({n, h}, hidden.options());
    if (want[1]) grads->weight = empty_tensor({v, h}, weight.options());
    if (want[2] && with_bias) grads->bias = at::zeros({v}, bias->options().dtype(acc));
  }
  const at::Tensor weight_t = weight.t();
  for (int64_t start = 0; start < n; start += rows) {
    const int64_t m = std::min(rows, n - start);
    const at::Tensor x = hidden.narrow(0, start, m);
    at::Tensor logits = buffer.narrow(0, 0, m).narrow(1, 0, v);
    if (with_bias) {
      at::addmm_out(logits, *bias, x, weight_t);
    } else {
      at::mm_out(logits, x, weight_t);
    }
    at::Tensor chunk_loss = loss.narrow(0, start, m);
    const at::Tensor chunk_scale = scale != nullptr && scale->numel() > 1 ? scale->narrow(0, start, m) : at::Tensor();
    cross_entropy_chunk(logits, target.narrow(0, start, m), chunk_loss,
                        scale == nullptr ? nullptr : (chunk_scale.defined() ? &chunk_scale : scale), o);
    if (scale == nullptr) continue;
    if (want[0]) {
      at::Tensor dx = grads->hidden.narrow(0, start, m);
      at::mm_out(dx, logits, weight);
    }
    if (want[1]) {
      if (start == 0) {
        at::mm_out(grads->weight, logits.t(), x);
      } else {
        grads->weight.addmm_(logits.t(), x);
      }
    }
    if (grads->bias.defined()) grads->bias.add_(at::sum(logits, {0}, /*keepdim=*/false, acc));
  }
  if (scale != nullptr) {
    if (want[1] && n == 0) grads->weight.zero_();  // no chunk wrote it
    if (grads->bias.defined()) grads->bias = grads->bias.to(bias->scalar_type());
  }
  return loss;
}

// dloss / dloss_r: 1 / count for "mean" (count: rows not ignored, on the device: no host sync), 1
// for "sum", times `grad` (a scalar, or [N] for "none") when given.
at::Tensor grad_scale(const at::Tensor& target, const Options& o, const at::Tensor& acc_like,
                      const std::optional<at::Tensor>& grad) {
  const at::ScalarType acc = acc_like.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto options = target.options().dtype(acc);
  at::Tensor scale = grad.has_value() ? grad->to(acc).reshape({-1}) : at::ones({1}, options);
  if (o.reduction == Reduction::kMean) scale = scale / (target != o.ignore_index).sum().to(acc);
  return scale.contiguous();
}

at::Tensor reduce(const at::Tensor& loss, const at::Tensor& target, const Options& o) {
  if (o.reduction == Reduction::kNone) return loss;
  const at::Tensor total = loss.sum();
  if (o.reduction == Reduction::kSum) return total;
  return total / (target != o.ignore_index).sum().to(loss.scalar_type());  // 0 / 0 = NaN when all are ignored, as PyTorch
}

at::Tensor empty_like_none(const at::Tensor& t) { return empty_tensor({0}, t.options()); }

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_linear_cross_entropy(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
    int64_t ignore_index, std::string_view reduction, double label_smoothing, std::optional<double> softcap,
    std::array<bool, 3> compute_grads, int64_t chunk_rows) {
  const Options o =
      check_args(kOp, hidden, weight, target, bias, ignore_index, reduction, label_smoothing, softcap, chunk_rows);
  const bool any_grad = compute_grads[0] || compute_grads[1] || (compute_grads[2] && bias.has_value());
  TORCH_CHECK_VALUE(!any_grad || o.reduction != Reduction::kNone, kOp,
                    ": with reduction=\"none\" the gradients depend on each row's incoming gradient: they are "
                    "computed in the backward (", kBackwardOp, "), so compute_grads must be all false");
  if (validation_only(hidden)) return {empty_like_none(hidden), empty_like_none(hidden), empty_like_none(weight),
                                       empty_like_none(hidden)};
  const at::cuda::OptionalCUDAGuard device_guard(hidden.is_cuda() ? std::optional<c10::Device>(hidden.device())
                                                                   : std::nullopt);
  Grads grads;
  at::Tensor scale;
  if (any_grad) scale = grad_scale(target, o, hidden, std::nullopt);
  const at::Tensor loss = run_chunks(hidden, weight, target, bias, o, any_grad ? &scale : nullptr, compute_grads,
                                     chunk_rows, &grads);
  return {reduce(loss, target, o), grads.hidden.defined() ? grads.hidden : empty_like_none(hidden),
          grads.weight.defined() ? grads.weight : empty_like_none(weight),
          grads.bias.defined() ? grads.bias : empty_like_none(hidden)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_linear_cross_entropy_backward(
    const at::Tensor& grad_loss, const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, int64_t ignore_index, std::string_view reduction, double label_smoothing,
    std::optional<double> softcap, std::array<bool, 3> compute_grads, int64_t chunk_rows) {
  const Options o = check_args(kBackwardOp, hidden, weight, target, bias, ignore_index, reduction, label_smoothing,
                               softcap, chunk_rows);
  check_device_matches(kBackwardOp, grad_loss, "grad_loss", hidden, "hidden");
  TORCH_CHECK_TYPE(at::isFloatingType(grad_loss.scalar_type()), kBackwardOp,
                   ": grad_loss must be a floating-point tensor (the loss's gradient; read as float32), got ",
                   grad_loss.scalar_type());
  const bool per_row = o.reduction == Reduction::kNone;
  TORCH_CHECK_VALUE(per_row ? (grad_loss.dim() == 1 && grad_loss.size(0) == hidden.size(0)) : grad_loss.numel() == 1,
                    kBackwardOp, ": grad_loss must be ", per_row ? "[N] (reduction \"none\")" : "a scalar",
                    " like the loss, got shape ", grad_loss.sizes());
  if (validation_only(hidden)) return {empty_like_none(hidden), empty_like_none(weight), empty_like_none(hidden)};
  const at::cuda::OptionalCUDAGuard device_guard(hidden.is_cuda() ? std::optional<c10::Device>(hidden.device())
                                                                   : std::nullopt);
  Grads grads;
  const at::Tensor scale = grad_scale(target, o, hidden, grad_loss);
  run_chunks(hidden, weight, target, bias, o, &scale, compute_grads, chunk_rows, &grads);
  return {grads.hidden.defined() ? grads.hidden : empty_like_none(hidden),
          grads.weight.defined() ? grads.weight : empty_like_none(weight),
          grads.bias.defined() ? grads.bias : empty_like_none(hidden)};
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&fused_linear_cross_entropy,
    &fused_linear_cross_entropy_backward);

}  // namespace transformer_kernels
