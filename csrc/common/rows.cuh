// Addressing of the rows of a tensor whose last dimension is contiguous and whose leading
// dimensions have arbitrary strides (views, slices, transposes), without copying. Torch-free.
#pragma once

#include <cstdint>

#include "common/divmod.cuh"
#include "common/math.cuh"

namespace transformer_kernels {

// Leading dimensions a row index can be split into after merging the mergeable ones.
constexpr int kMaxRowDims = 4;

struct RowIndexer {
  int ndim = 1;                    // leading dimensions, 1..kMaxRowDims
  int64_t sizes[kMaxRowDims] = {};    // [ndim]
  int64_t strides[kMaxRowDims] = {};  // [ndim], in elements
  // sizes[1..ndim) as 32-bit dividers, valid when `fast`: every row index (so every size) is below
  // kFastDivmodLimit. A 64-bit division is a ~70-instruction call; rows of a broadcast operand
  // (AdaLN scale/shift [B, 1, D], a per-sample gate) need two per dimension, and in a kernel that
  // spends ~20 instructions per element that was as much issue time as the arithmetic.
  FastDivmod divisors[kMaxRowDims] = {};
  bool fast = false;

  // Element offset of the start of row `row` (row-major over the leading dimensions).
  TK_HOST_DEVICE int64_t offset(int64_t row) const {
    if (ndim == 1) return row * strides[0];
    int64_t off = 0;
    if (fast) {
      uint32_t r = static_cast<uint32_t>(row);
#pragma unroll
      for (int d = kMaxRowDims - 1; d >= 1; --d) {
        if (d < ndim) {
          uint32_t quotient, remainder;
          divisors[d].divmod(r, &quotient, &remainder);
          off += static_cast<int64_t>(remainder) * strides[d];
          r = quotient;
        }
      }
      return off + static_cast<int64_t>(r) * strides[0];
    }
#pragma unroll
    for (int d = kMaxRowDims - 1; d >= 0; --d) {
      if (d < ndim) {
        off += (row % sizes[d]) * strides[d];
        row /= sizes[d];
      }
    }
    return off;
  }

  // True when every row starts at a multiple of `elements` from the base pointer.
  TK_HOST_DEVICE bool rows_aligned_to(int64_t elements) const {
    for (int d = 0; d < ndim; ++d)
      if (sizes[d] > 1 && strides[d] % elements != 0) return false;
    return true;
  }
};

// Builds the indexer for the leading `ndim` dimensions given by `sizes`/`strides`, merging
// neighbours that are laid out as one (stride[i] == stride[i+1] * size[i+1]) and dropping
// dimensions of size 1. Returns false when more than kMaxRowDims dimensions remain.
inline bool make_row_indexer(const int64_t* sizes, const int64_t* strides, int ndim, RowIndexer* out) {
  RowIndexer r;
  r.ndim = 0;
  for (int d = 0; d < ndim; ++d) {
    if (sizes[d] == 1) continue;
    if (r.ndim > 0 && r.strides[r.ndim - 1] == strides[d] * sizes[d]) {
      r.sizes[r.ndim - 1] *= sizes[d];
      r.strides[r.ndim - 1] = strides[d];
      continue;
    }
    if (r.ndim == kMaxRowDims) return false;
    r.sizes[r.ndim] = sizes[d];
    r.strides[r.ndim] = strides[d];
    ++r.ndim;
  }
  if (r.ndim == 0) {  // a single row (or none)
    r.ndim = 1;
    r.sizes[0] = 1;
    r.strides[0] = 0;
  }
  int64_t rows = 1;
  for (int d = 0; d < r.ndim; ++d) rows *= r.sizes[d];
  // No rows (a zero-size dimension): nothing is ever located, and a divider of 0 would divide by 0.
  r.fast = rows > 0 && rows < static_cast<int64_t>(kFastDivmodLimit);
  if (r.fast)
    for (int d = 1; d < r.ndim; ++d) r.divisors[d] = FastDivmod(static_cast<uint32_t>(r.sizes[d]));
  *out = r;
  return true;
}

}  // namespace transformer_kernels
