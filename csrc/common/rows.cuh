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

  // Element offset of the start of row `row` (row-major over the leading dimensions).
  TK_HOST_DEVICE int64_t offset(int64_t row) const {
    if (ndim == 1) return row * strides[0];
    int64_t off = 0;
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

// RowIndexer's addressing for row indices below kFastDivmodLimit with the divisions precomputed,
// for kernels that locate a row per vector rather than per row (flat elementwise): there a 64-bit
// division per dimension would cost more instructions than the access it addresses.
struct FastRowIndexer {
  int ndim = 1;                       // as RowIndexer
  int64_t strides[kMaxRowDims] = {};  // [ndim], in elements
  FastDivmod sizes[kMaxRowDims] = {};  // [ndim]; sizes[0] is never divided by (row < the row count)

  TK_HOST_DEVICE int64_t offset(uint32_t row) const {
    if (ndim == 1) return static_cast<int64_t>(row) * strides[0];
    int64_t off = 0;
#pragma unroll
    for (int d = kMaxRowDims - 1; d >= 1; --d) {
      if (d < ndim) {
        uint32_t quotient, remainder;
        sizes[d].divmod(row, &quotient, &remainder);
        off += static_cast<int64_t>(remainder) * strides[d];
        row = quotient;
      }
    }
    return off + static_cast<int64_t>(row) * strides[0];
  }
};

// Host-side, once per launch; valid when the row count (so every size) is below kFastDivmodLimit.
inline FastRowIndexer make_fast_row_indexer(const RowIndexer& rows) {
  FastRowIndexer fast;
  fast.ndim = rows.ndim;
  for (int d = 0; d < rows.ndim; ++d) {
    fast.strides[d] = rows.strides[d];
    if (d > 0) fast.sizes[d] = FastDivmod(static_cast<uint32_t>(rows.sizes[d]));
  }
  return fast;
}

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
  *out = r;
  return true;
}

}  // namespace transformer_kernels
