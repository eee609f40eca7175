// Torch entry point of the attention family (attention_8bit): validate q, k, v, allocate the output
// in q's layout and the 8-bit workspace, launch Attention8bit (attention_8bit.cuh) on the current
// stream of q's device.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>

#include "attention/attention_8bit.cuh"
#include "attention/ops.h"
#include "common/alloc.h"
#include "common/checks.h"
#include "common/dispatch.h"

namespace transformer_kernels {
namespace {

constexpr const char* kOp = "attention_8bit";
// FP8 tensor cores (mma.sync e4m3) appear with sm_89; sm_90's mma.sync lowers e4m3 to 16-bit
// products, so there (and on later GPUs, untested) p·v runs on 16-bit tensor cores with v as given.
constexpr int kMinCapability = 89;
constexpr int kNativeE4m3MmaSync = 89;

// q, k and v as the kernels read them: [B, H, S, D], fp16/bf16 like q, the last dimension contiguous
// and each row 16 bytes aligned (the kernels move 8 elements per instruction).
void check_operand(const at::Tensor& t, const char* name, const at::Tensor& q) {
  if (&t != &q) check_same_device(kOp, t, name, q, "q");
  TORCH_CHECK_VALUE(t.dim() == 4, kOp, ": ", name, " must be 4-D [B, H, S, D] (a [B, S, H, D] tensor's transpose(1, 2)), got ",
                    t.dim(), "-D of shape ", t.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, kOp, ": ", name,
                   " must be float16 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), kOp, ": ", name, " must have q's dtype ", q.scalar_type(),
                   ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.size(3) == 64 || t.size(3) == 128, kOp, ": ", name,
                    " must have head dim (size(3)) 64 or 128, got ", t.size(3));
  check_last_dim_contiguous(kOp, t, name);
  constexpr int64_t kVecElems = 8;
  const bool aligned = t.numel() == 0 || (reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0 &&
                                          t.stride(0) % kVecElems == 0 && t.stride(1) % kVecElems == 0 &&
                                          t.stride(2) % kVecElems == 0);
  TORCH_CHECK_VALUE(aligned, kOp, ": ", name,
                    " must start at a 16-byte aligned address with strides that are multiples of 8 elements, got strides ",
                    t.strides(), " (views of a projection's output are; a copy with .contiguous() is)");
}

// The GPU's compute capability as 10 * major + minor, refused below sm_89.
int checked_capability(const at::Tensor& q) {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.get_device());
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q.get_device());
  TORCH_CHECK_VALUE(major * 10 + minor >= kMinCapability, kOp,
                    ": needs compute capability 8.9 or later (FP8 tensor cores), got ", major, ".", minor);
  return major * 10 + minor;
}

// The output: q's shape, laid out as q is ([B, Sq, H, D] memory when q's heads are inner to its
// sequence, as diffusers' processors hold them; [B, H, Sq, D] otherwise).
at::Tensor empty_output(const at::Tensor& q) {
  if (q.stride(1) < q.stride(2)) {
    return empty_tensor({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options()).transpose(1, 2);
  }
  return empty_tensor(q.sizes(), q.options());
}

template <typename T>
HeadsView<T> heads_view(const at::Tensor& t) {
  return {static_cast<const T*>(t.const_data_ptr()), t.stride(0), t.stride(1), t.stride(2)};
}

}  // namespace

at::Tensor attention_8bit(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::optional<double> scale) {
  check_cuda(kOp, q, "q");
  check_operand(q, "q", q);
  check_operand(k, "k", q);
  check_operand(v, "v", q);
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), kOp, ": v must have k's shape ", k.sizes(), ", got ", v.sizes());
  TORCH_CHECK_VALUE(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3), kOp,
                    ": k must have q's batch, heads and head dim [", q.size(0), ", ", q.size(1), ", S, ", q.size(3),
                    "], got ", k.sizes());
  constexpr int64_t kMaxGridY = 65535;
  TORCH_CHECK_VALUE(q.size(0) * q.size(1) <= kMaxGridY, kOp, ": batch * heads must be at most ", kMaxGridY, ", got ",
                    q.size(0) * q.size(1));
  constexpr int64_t kMaxLen = std::numeric_limits<int>::max() / 2;
  TORCH_CHECK_VALUE(q.size(2) <= kMaxLen && k.size(2) <= kMaxLen, kOp, ": sequence lengths must be at most ", kMaxLen,
                    ", got q ", q.size(2), " and k ", k.size(2));
  const double softmax_scale = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  at::Tensor out = empty_output(q);
  if (validation_only(q)) return out;
  const at::cuda::OptionalCUDAGuard device_guard(q.device());
  const int capability = checked_capability(q);
  if (out.numel() == 0) return out;
  if (k.size(2) == 0) return out.zero_();  // no keys: SDPA's math gives zeros

  const int batch_heads = static_cast<int>(q.size(0) * q.size(1));
  const int head_dim = static_cast<int>(q.size(3));
  const auto shape = Attention8bitShape<>::of(static_cast<int>(q.size(2)), static_cast<int>(k.size(2)));
  const auto bytes = q.options().dtype(at::kByte);
  const auto floats = q.options().dtype(at::kFloat);
  at::Tensor q_codes = empty_tensor({batch_heads, shape.q_rows, head_dim}, bytes);
  at::Tensor q_scale = empty_tensor({batch_heads, shape.q_rows}, floats);
  at::Tensor k_codes = empty_tensor({batch_heads, shape.k_rows, head_dim}, bytes);
  at::Tensor k_scale = empty_tensor({batch_heads, shape.k_rows / AttentionPolicy::kBlockKeys}, floats);
  at::Tensor v_codes = empty_tensor({batch_heads, head_dim, shape.k_rows}, bytes);
  at::Tensor v_scale = empty_tensor({batch_heads, head_dim}, floats);
  at::Tensor partials = empty_tensor({kStatsCount, batch_heads, shape.stats_chunks, head_dim}, floats);
  at::Tensor k_mean = empty_tensor({batch_heads, head_dim}, floats);
  at::Tensor balance = empty_tensor({batch_heads, head_dim}, floats);

  cudaError_t err = cudaSuccess;
  dispatch_float_dtype(q.scalar_type(), "q", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, float>) {
      Attention8bitParams<T> p;
      p.q = heads_view<T>(q);
      p.k = heads_view<T>(k);
      p.v = heads_view<T>(v);
      p.out = static_cast<T*>(out.data_ptr());
      p.out_batch_stride = out.stride(0);
      p.out_head_stride = out.stride(1);
      p.out_seq_stride = out.stride(2);
      p.heads = static_cast<int>(q.size(1));
      p.q_len = static_cast<int>(q.size(2));
      p.kv_len = static_cast<int>(k.size(2));
      p.q_rows = shape.q_rows;
      p.k_rows = shape.k_rows;
      p.stats_chunks = shape.stats_chunks;
      p.score_scale = static_cast<float>(softmax_scale * kLog2e);
      p.ops = {static_cast<int8_t*>(q_codes.data_ptr()), q_scale.data_ptr<float>(),
               static_cast<int8_t*>(k_codes.data_ptr()), k_scale.data_ptr<float>(),
               static_cast<uint8_t*>(v_codes.data_ptr()), v_scale.data_ptr<float>(),
               partials.data_ptr<float>(), k_mean.data_ptr<float>(), balance.data_ptr<float>()};
      const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
      if (capability == kNativeE4m3MmaSync) {
        err = head_dim == 64 ? Attention8bit<64, T, ValuePrecision::kE4m3>(p, batch_heads, stream)
                             : Attention8bit<128, T, ValuePrecision::kE4m3>(p, batch_heads, stream);
      } else {
        err = head_dim == 64 ? Attention8bit<64, T, ValuePrecision::kInput>(p, batch_heads, stream)
                             : Attention8bit<128, T, ValuePrecision::kInput>(p, batch_heads, stream);
      }
    }
  });
  check_launch(kOp, err);
  return out;
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&attention_8bit);

}  // namespace transformer_kernels
