// Host-side check of the norm launchers' path choice (norm/norm.cuh, norm/norm_backward.cuh): the
// 16-byte path is taken for rows the vector divides only, and whether a contiguous batch takes it
// depends on its width and dtype, not on how many rows it has (one row, whose tensor has no row
// stride, included). Built and run by tests/norm/test_norm_plan.py; needs no GPU (no kernel is launched
// or instantiated). Prints "ok" or the first violation, exits non-zero on one.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "norm/norm.cuh"
#include "norm/norm_backward.cuh"

namespace tk = transformer_kernels;

// A 16-byte-aligned address for the pointers (never dereferenced).
template <typename T>
T* fake_ptr(uintptr_t slot) {
  return reinterpret_cast<T*>(uintptr_t{1} << 20 | slot << 12);
}

// The indexer of a contiguous [rows, hidden] tensor, as the bindings build it.
tk::RowIndexer contiguous_rows(int64_t rows, int64_t hidden) {
  const int64_t sizes[1] = {rows}, strides[1] = {hidden};
  tk::RowIndexer r;
  tk::make_row_indexer(sizes, strides, 1, &r);
  return r;
}

// Forward: rms_norm / layer_norm / a modulated norm's operands, contiguous, aligned.
template <typename T>
bool forward_vectorized(int64_t rows, int64_t hidden, bool modulated) {
  tk::NormParams<T, T, T> p;
  p.x = fake_ptr<const T>(1), p.x_rows = contiguous_rows(rows, hidden);
  p.weight = fake_ptr<const T>(2);
  p.out = fake_ptr<T>(3), p.out_rows = contiguous_rows(rows, hidden);
  if (modulated) {
    const int64_t one[1] = {rows}, zero[1] = {0};  // a [hidden] scale broadcast to every row
    p.scale = fake_ptr<const T>(4);
    tk::make_row_indexer(one, zero, 1, &p.scale_rows);
  }
  p.num_rows = rows, p.hidden = hidden;
  return tk::norm_detail::vectorizable(p, tk::vec_size<T>());
}

// Backward: rms_norm_backward's operands (grad_out, x, dx), contiguous, aligned.
template <typename T>
bool backward_vectorized(int64_t rows, int64_t hidden) {
  tk::NormBackwardParams<T, T, T> p;
  p.dout = fake_ptr<const T>(1), p.dout_rows = contiguous_rows(rows, hidden);
  p.h = fake_ptr<const T>(2), p.h_rows = contiguous_rows(rows, hidden);
  p.dh = fake_ptr<T>(3);
  p.num_rows = rows, p.hidden = hidden;
  return tk::norm_backward_detail::vectorizable(p, tk::vec_size<T>());
}

template <typename T>
bool check(const char* dtype) {
  constexpr int kVec = tk::vec_size<T>();
  std::vector<int64_t> widths;
  for (int64_t h = 1; h <= 300; ++h) widths.push_back(h);
  for (int64_t h : {769, 2048, 4096, 5120, 8200, 16384, 24581, 24584, 65536, 70001}) widths.push_back(h);
  const int64_t batches[] = {1, 2, 3, 33, 1000};
  for (int64_t h : widths) {
    for (bool mod : {false, true}) {
      const bool first = forward_vectorized<T>(batches[0], h, mod);
      if (first != (h % kVec == 0)) {
        std::printf("%s forward%s: width %lld takes the %s path (vector of %d)\n", dtype, mod ? " modulated" : "",
                    static_cast<long long>(h), first ? "16-byte" : "scalar", kVec);
        return false;
      }
      for (int64_t rows : batches) {
        if (forward_vectorized<T>(rows, h, mod) != first) {
          std::printf("%s forward%s: width %lld: %lld rows take another path than 1 row\n", dtype, mod ? " modulated" : "",
                      static_cast<long long>(h), static_cast<long long>(rows));
          return false;
        }
      }
    }
    const bool bwd = backward_vectorized<T>(1, h);
    for (int64_t rows : batches) {
      if (backward_vectorized<T>(rows, h) != bwd || bwd != (h % kVec == 0)) {
        std::printf("%s backward: width %lld, %lld rows: unexpected path\n", dtype, static_cast<long long>(h),
                    static_cast<long long>(rows));
        return false;
      }
    }
  }
  return true;
}

int main() {
  if (!check<float>("float32") || !check<__half>("float16") || !check<__nv_bfloat16>("bfloat16")) return 1;
  std::printf("ok\n");
  return 0;
}
