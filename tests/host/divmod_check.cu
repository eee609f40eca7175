// Host-side check of common/divmod.cuh and RowIndexer's fast path (common/rows.cuh): FastDivmod
// against the / and % operators, and RowIndexer::offset through its 32-bit dividers against the
// same indexer's 64-bit division. Built and run by
// tests/common/test_divmod.py; needs no GPU. Prints "ok" or the first mismatch, exits non-zero on one.
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common/divmod.cuh"
#include "common/rows.cuh"

using transformer_kernels::FastDivmod;
using transformer_kernels::kFastDivmodLimit;
using transformer_kernels::kMaxRowDims;
using transformer_kernels::make_row_indexer;
using transformer_kernels::RowIndexer;

static bool check_divisor(uint32_t d, std::mt19937& rng) {
  const FastDivmod fast(d);
  const uint32_t top = kFastDivmodLimit - 1;
  std::vector<uint32_t> ns = {0, 1, 2, d - 1, d, d + 1, top, top - 1, top - d, top / d * d, top / d * d - 1};
  for (uint32_t n = 0; n < 2048; ++n) ns.push_back(n);
  for (uint32_t k = 1; k < 64; ++k) {  // around multiples of d spread over the range
    const uint64_t m = uint64_t{top} / d * k / 64 * d;
    for (int64_t delta = -1; delta <= 1; ++delta) ns.push_back(static_cast<uint32_t>(m + delta));
  }
  std::uniform_int_distribution<uint32_t> any(0, top);
  for (int k = 0; k < 2000; ++k) ns.push_back(any(rng));
  for (uint32_t n : ns) {
    if (n > top) continue;  // d - 1 at d = 0 is never formed; wraps from the deltas
    uint32_t q, r;
    fast.divmod(n, &q, &r);
    if (q != n / d || r != n % d) {
      std::printf("FastDivmod(%u): %u -> q %u r %u, expected q %u r %u\n", d, n, q, r, n / d, n % d);
      return false;
    }
  }
  return true;
}

static bool check_row_indexer(std::mt19937& rng) {
  std::uniform_int_distribution<int> dims(1, kMaxRowDims);
  std::uniform_int_distribution<int64_t> size(1, 300), stride(0, int64_t{1} << 34);
  int fast_layouts = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int ndim = dims(rng);
    int64_t sizes[kMaxRowDims], strides[kMaxRowDims];
    for (int d = 0; d < ndim; ++d) sizes[d] = size(rng), strides[d] = stride(rng);
    RowIndexer rows;
    if (!make_row_indexer(sizes, strides, ndim, &rows)) return false;
    int64_t count = 1;
    for (int d = 0; d < rows.ndim; ++d) count *= rows.sizes[d];
    if (rows.fast != (count < kFastDivmodLimit)) {
      std::printf("RowIndexer: fast %d for %lld rows\n", rows.fast, static_cast<long long>(count));
      return false;
    }
    if (!rows.fast || rows.ndim == 1) continue;
    ++fast_layouts;
    RowIndexer exact = rows;
    exact.fast = false;
    std::uniform_int_distribution<int64_t> row(0, count - 1);
    for (int k = 0; k < 16; ++k) {
      const int64_t r = k == 0 ? count - 1 : row(rng);
      if (rows.offset(r) != exact.offset(r)) {
        std::printf("RowIndexer ndim %d: row %lld -> %lld, expected %lld\n", rows.ndim, static_cast<long long>(r),
                    static_cast<long long>(rows.offset(r)), static_cast<long long>(exact.offset(r)));
        return false;
      }
    }
  }
  // Zero-size dimensions (empty tensors): the builder must not make a divider of 0 (which divides
  // by zero on the host: the GPU run of 11:00 crashed on it), nor take the fast path.
  const int64_t empty_sizes[3] = {2, 0, 7}, empty_strides[3] = {0, 7, 1};
  RowIndexer empty;
  if (!make_row_indexer(empty_sizes, empty_strides, 3, &empty) || empty.fast) {
    std::printf("RowIndexer of an empty layout: fast %d\n", empty.fast);
    return false;
  }
  if (fast_layouts < 1000) {
    std::printf("only %d layouts took the fast path\n", fast_layouts);
    return false;
  }
  return true;
}

int main() {
  std::mt19937 rng(1234);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int s = 12; s < 31; ++s)
    for (int64_t delta = -1; delta <= 1; ++delta) divisors.push_back(static_cast<uint32_t>((int64_t{1} << s) + delta));
  divisors.push_back(kFastDivmodLimit - 1);
  for (uint32_t h : {1792u, 2048u, 2368u, 3072u, 4096u, 10240u, 14336u}) divisors.push_back(h);  // rows of vectors
  std::uniform_int_distribution<uint32_t> any(1, kFastDivmodLimit - 1);
  for (int k = 0; k < 2000; ++k) divisors.push_back(any(rng));
  for (uint32_t d : divisors)
    if (!check_divisor(d, rng)) return 1;
  if (!check_row_indexer(rng)) return 1;
  std::printf("ok\n");
  return 0;
}
