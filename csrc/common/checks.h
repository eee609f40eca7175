// Argument validation shared by every op binding. Each check names the op and the argument,
// and says what was expected: ValueError for device/shape/layout problems, TypeError for dtypes.
#pragma once

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/rows.cuh"

namespace transformer_kernels {

// The fake impls (torch-ext/<package>/_fake.py) run an op's checks on meta stand-ins of its
// arguments by calling its CUDA kernel with them: every check runs, nothing launches (each launch
// returns first for meta tensors, which have no memory: validation_only).
inline bool validation_only(const at::Tensor& t) { return t.is_meta(); }

// What a launch's device guard selects: no device for meta stand-ins (nothing launches).
inline std::optional<c10::Device> launch_device(const at::Tensor& t) {
  return validation_only(t) ? std::nullopt : std::optional<c10::Device>(t.device());
}

inline void check_cuda(const char* op, const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.is_cuda() || validation_only(t), op, ": ", name, " must be a CUDA tensor, got a tensor on ",
                    t.device());
}

// Every tensor argument of an op is checked against its reference (x) with this one message; the fakes
// give it too, for what their meta stand-ins cannot show (_fake.py check_devices).
inline void check_device_matches(const char* op, const at::Tensor& t, const char* name, const at::Tensor& ref,
                                 const char* ref_name) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": ", name, " must be on the same device as ", ref_name,
                    " (", ref.device(), "), got ", t.device());
}

// The same, for the ops that run on CUDA only.
inline void check_same_device(const char* op, const at::Tensor& t, const char* name, const at::Tensor& ref,
                              const char* ref_name) {
  check_device_matches(op, t, name, ref, ref_name);
  check_cuda(op, t, name);
}

inline bool is_float_dtype(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::Float || dtype == c10::ScalarType::Half || dtype == c10::ScalarType::BFloat16;
}

inline void check_float_dtype(const char* op, const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(is_float_dtype(t.scalar_type()), op, ": ", name, " must be float32, float16 or bfloat16, got ",
                   t.scalar_type());
}

inline void check_dtype(const char* op, const at::Tensor& t, const char* name, c10::ScalarType expected,
                        const char* why) {
  TORCH_CHECK_TYPE(t.scalar_type() == expected, op, ": ", name, " must have dtype ", expected, " (", why, "), got ",
                   t.scalar_type());
}

inline void check_last_dim_contiguous(const char* op, const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.dim() >= 1, op, ": ", name, " must have at least one dimension, got a 0-d tensor");
  TORCH_CHECK_VALUE(t.size(-1) <= 1 || t.stride(-1) == 1, op, ": ", name,
                    " must be contiguous in its last dimension (stride 1), got stride ", t.stride(-1),
                    "; leading dimensions may have any stride");
}

inline void check_same_shape(const char* op, const at::Tensor& t, const char* name, const at::Tensor& ref,
                             const char* ref_name) {
  TORCH_CHECK_VALUE(t.sizes() == ref.sizes(), op, ": ", name, " must have the shape of ", ref_name, " ",
                    ref.sizes(), ", got ", t.sizes());
}

// Outputs must be writable element by element: no element shared by two indices (expanded
// views) and no memory shared with an input.
inline void check_writable_output(const char* op, const at::Tensor& out, const char* name) {
  TORCH_CHECK_VALUE(at::has_internal_overlap(out) != at::MemOverlap::Yes, op, ": ", name,
                    " must not have overlapping elements (an expanded or broadcast view), got strides ", out.strides());
}

namespace detail {
// Lowest and one-past-highest byte address the elements of a non-empty tensor occupy.
inline std::pair<uintptr_t, uintptr_t> byte_span(const at::Tensor& t) {
  int64_t lo = 0, hi = 0;  // element offsets from data_ptr
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t extent = (t.size(d) - 1) * t.stride(d);
    (extent < 0 ? lo : hi) += extent;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  const auto item = static_cast<int64_t>(t.element_size());
  return {base + lo * item, base + (hi + 1) * item};
}

// A tensor's elements as a lattice of equal contiguous runs: every address is
// base + (a multiple of `period`) + [0, run) bytes. The run is the product of the innermost
// dimensions that are dense; `period` is the gcd of the remaining strides (0 when there are none).
// False for negative strides.
struct RunLattice {
  uintptr_t base;
  int64_t run, period;
};
inline bool run_lattice(const at::Tensor& t, RunLattice* out) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims that vary
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 1) continue;
    if (t.stride(d) < 0) return false;
    dims.emplace_back(t.stride(d), t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t run = 1, period = 0;
  size_t d = 0;
  for (; d < dims.size() && dims[d].first == run; ++d) run *= dims[d].second;
  for (; d < dims.size(); ++d) period = std::gcd(period, dims[d].first);
  const auto item = static_cast<int64_t>(t.element_size());
  *out = {reinterpret_cast<uintptr_t>(t.const_data_ptr()), run * item, period * item};
  return true;
}

// True when the two tensors provably share no byte: views that interleave in one buffer (q, k
// and v of a fused projection) pass, although their address ranges overlap.
inline bool lattices_disjoint(const at::Tensor& a, const at::Tensor& b) {
  RunLattice la, lb;
  if (!run_lattice(a, &la) || !run_lattice(b, &lb)) return false;
  const int64_t period = std::gcd(la.period, lb.period);
  if (period == 0) return false;  // two single runs: the address ranges decide
  // b's runs start at (b - a) mod period past one of a's; a run [0, a.run) and one at
  // [delta, delta + b.run) within one period (and the next) must not meet.
  const int64_t delta = ((static_cast<int64_t>(lb.base - la.base) % period) + period) % period;
  return delta >= la.run && delta + lb.run <= period;
}
}  // namespace detail

inline void check_no_overlap(const char* op, const at::Tensor& out, const char* out_name, const at::Tensor& in,
                             const char* in_name) {
  if (!in.defined() || out.numel() == 0 || in.numel() == 0) return;
  if (validation_only(out) || validation_only(in)) return;  // stand-ins have no addresses: run time only
  at::MemOverlapStatus status = at::get_overlap_status(out, in);
  if (status == at::MemOverlapStatus::TooHard) {  // strided views: interleaved runs, else the address ranges
    const auto a = detail::byte_span(out);
    const auto b = detail::byte_span(in);
    const bool disjoint = !(a.first < b.second && b.first < a.second) || detail::lattices_disjoint(out, in);
    status = disjoint ? at::MemOverlapStatus::No : at::MemOverlapStatus::Partial;
  }
  TORCH_CHECK_VALUE(status == at::MemOverlapStatus::No, op, ": ", out_name, " must not share memory with ", in_name);
}

inline void check_eps(const char* op, double eps) {
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0.0, op, ": eps must be a finite number >= 0, got ", eps);
}

// Row addressing for the leading dimensions of `t` (all but the last).
inline RowIndexer row_indexer(const char* op, const at::Tensor& t, const char* name) {
  RowIndexer rows;
  const bool ok = make_row_indexer(t.sizes().data(), t.strides().data(), static_cast<int>(t.dim()) - 1, &rows);
  TORCH_CHECK_VALUE(ok, op, ": ", name, " has more than ", kMaxRowDims,
                    " leading dimensions that cannot be merged into one (sizes ", t.sizes(), ", strides ",
                    t.strides(), "); pass a view with fewer strided dimensions");
  return rows;
}

// A tensor of x's dtype that broadcasts to x's shape with a full, contiguous last dimension
// ([hidden], [B, 1, hidden], [B, S, hidden], or strided views of a larger tensor). `x_name`: what
// the op calls x.
inline void check_broadcasts_to(const char* op, const at::Tensor& t, const char* name, const at::Tensor& x,
                                const char* x_name = "x") {
  check_same_device(op, t, name, x, x_name);
  if (t.scalar_type() != x.scalar_type())  // the reason is built only for the message
    check_dtype(op, t, name, x.scalar_type(), ("the dtype of " + std::string(x_name)).c_str());
  TORCH_CHECK_VALUE(t.dim() >= 1 && t.dim() <= x.dim() && t.size(-1) == x.size(-1), op, ": ", name,
                    " must broadcast to ", x_name, "'s shape ", x.sizes(), " with its last dimension equal to ",
                    x_name, ".shape[-1], got ", t.sizes());
  for (int64_t d = 1; d <= t.dim(); ++d)
    TORCH_CHECK_VALUE(t.size(-d) == 1 || t.size(-d) == x.size(-d), op, ": ", name, " of shape ", t.sizes(),
                      " does not broadcast to ", x_name, "'s shape ", x.sizes());
  check_last_dim_contiguous(op, t, name);
}

// A second operand like x: same device, dtype and shape, contiguous last dimension. `x_name`: what
// the op calls x.
inline void check_same_as_x(const char* op, const at::Tensor& t, const char* name, const at::Tensor& x,
                            const char* x_name = "x") {
  check_same_device(op, t, name, x, x_name);
  if (t.scalar_type() != x.scalar_type())  // the reason is built only for the message
    check_dtype(op, t, name, x.scalar_type(), ("the dtype of " + std::string(x_name)).c_str());
  check_same_shape(op, t, name, x, x_name);
  check_last_dim_contiguous(op, t, name);
}

// An output the caller passed: on x's device, of `sizes` and `dtype`, contiguous in its last
// dimension, writable element by element, and sharing memory with none of `inputs` (null entries
// are skipped, so optional inputs can be listed as they are). `x_name`: what the op calls x.
inline void check_output(const char* op, const at::Tensor& out, const char* name, const at::Tensor& x,
                         at::IntArrayRef sizes, c10::ScalarType dtype,
                         std::initializer_list<std::pair<const at::Tensor*, const char*>> inputs,
                         const char* x_name = "x") {
  check_same_device(op, out, name, x, x_name);
  TORCH_CHECK_VALUE(out.sizes() == sizes, op, ": ", name, " must have the shape ", sizes, ", got ", out.sizes());
  check_dtype(op, out, name, dtype, "the dtype this op produces");
  check_last_dim_contiguous(op, out, name);
  check_writable_output(op, out, name);
  for (const auto& [in, in_name] : inputs)
    if (in != nullptr) check_no_overlap(op, out, name, *in, in_name);
}

// Row addressing of a tensor broadcast to x's shape (stride 0 along broadcast dimensions).
inline RowIndexer broadcast_row_indexer(const char* op, const at::Tensor& t, const char* name, const at::Tensor& x) {
  return row_indexer(op, t.dim() == x.dim() && t.sizes() == x.sizes() ? t : t.expand(x.sizes()), name);
}

// The rows a row kernel works on: none where the rows have no elements.
inline int64_t num_rows(const at::Tensor& t) {
  return t.size(-1) == 0 ? 0 : t.numel() / t.size(-1);
}

// The rows of t seen as a matrix [rows, t.size(-1)], rows of no elements included: where each row
// has an output however short it is (a linear layer's, the bias, for in_features 0).
inline int64_t matrix_rows(const at::Tensor& t) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return rows;
}

// One thread block per row at most: the grid's x dimension bounds the row count.
inline void check_row_count(const char* op, int64_t rows, const char* name) {
  constexpr int64_t kMaxGridX = std::numeric_limits<int32_t>::max();
  TORCH_CHECK_VALUE(rows <= kMaxGridX, op, ": ", name, " has ", rows, " rows; at most ", kMaxGridX,
                    " are supported");
}

// Kernels index within a row in 32 bits (64-bit column arithmetic costs two or three integer
// instructions per address in kernels that already issue more integer than float work).
inline void check_row_length(const char* op, const at::Tensor& t, const char* name) {
  constexpr int64_t kMaxRowLength = std::numeric_limits<int32_t>::max();
  TORCH_CHECK_VALUE(t.size(-1) <= kMaxRowLength, op, ": ", name, "'s last dimension must be at most ", kMaxRowLength,
                    ", got ", t.size(-1));
}

// The input of a row kernel (norms, activations): a float CUDA tensor whose rows have unit stride,
// no more rows than the grid holds, and rows indexable in 32 bits.
inline void check_row_input(const char* op, const at::Tensor& t, const char* name) {
  check_cuda(op, t, name);
  check_float_dtype(op, t, name);
  check_last_dim_contiguous(op, t, name);
  check_row_count(op, num_rows(t), name);
  check_row_length(op, t, name);
}

// A norm's per-feature parameter (forward and backward): [hidden], contiguous, x's dtype or
// float32 (norm weights are often kept in fp32, e.g. under diffusers' layerwise casting).
inline void check_norm_param(const char* op, const std::optional<at::Tensor>& t, const char* name, const at::Tensor& x,
                             const char* x_name = "x") {
  if (!t) return;
  check_same_device(op, *t, name, x, x_name);
  TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == x.size(-1), op, ": ", name, " must be 1-D with ", x_name,
                    ".shape[-1] = ", x.size(-1), " elements, got shape ", t->sizes());
  TORCH_CHECK_VALUE(t->size(0) <= 1 || t->stride(0) == 1, op, ": ", name, " must be contiguous, got stride ",
                    t->stride(0));
  TORCH_CHECK_TYPE(t->scalar_type() == x.scalar_type() || t->scalar_type() == at::kFloat, op, ": ", name,
                   " must have the dtype of ", x_name, " (", x.scalar_type(), ") or float32, got ", t->scalar_type());
}

// The archs the unit was compiled for (nvcc's __CUDA_ARCH_LIST__, e.g. 750,800,860,900,1000,1200: every
// unit of the extension is compiled with the same list). Variadic: with several archs the list is several
// macro arguments.
#define TK_STRINGIFY_(...) #__VA_ARGS__
#define TK_STRINGIFY(...) TK_STRINGIFY_(__VA_ARGS__)
#ifdef __CUDA_ARCH_LIST__
inline constexpr const char* kBuildArchs = TK_STRINGIFY(__CUDA_ARCH_LIST__);
#else
inline constexpr const char* kBuildArchs = "(not known to this unit)";
#endif

// A kernel launch's error as the op's error. A GPU the build has no code for ("no kernel image is
// available") is told apart: the message names its compute capability and the archs the build has.
inline void check_launch(const char* op, cudaError_t err) {
  if (err == cudaSuccess) return;
  if (err == cudaErrorNoKernelImageForDevice) {
    int device = 0, major = 0, minor = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    TORCH_CHECK(false, op, ": this build has no code for the GPU in use (compute capability ", major, ".", minor,
                "): it was compiled for the archs ", kBuildArchs,
                "; build for this GPU (tools/build_kernel.py --archs native) or use a build that includes it");
  }
  TORCH_CHECK(false, op, ": kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace transformer_kernels
