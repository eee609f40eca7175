// Division by a divisor fixed at launch: a multiply-high, an add and a shift in place of the
// division sequence (~20 instructions for 32 bits, a ~70-instruction call for 64). RowIndexer
// (common/rows.cuh) locates the rows of broadcast operands with it. Torch-free.
//
// The magic number is Granlund & Montgomery's (PLDI 1994), in the form PyTorch's IntDivider uses:
//   shift = ceil(log2(d)),  m = floor(2^32 * (2^shift - d) / d) + 1,
//   n / d = (umulhi(n, m) + n) >> shift,
// exact for 0 <= n < 2^31 and 1 <= d < 2^31 (the sum stays within 32 bits). tests/common/test_divmod.py
// checks it on the host against the / operator.
#pragma once

#include <cstdint>

#include "common/math.cuh"

namespace transformer_kernels {

// Numerators and divisors must stay below this for FastDivmod to be exact.
constexpr uint32_t kFastDivmodLimit = uint32_t{1} << 31;

struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 0;
  uint32_t shift = 0;

  FastDivmod() = default;

  // Host-side setup, once per launch; `d` in [1, kFastDivmodLimit).
  explicit FastDivmod(uint32_t d) : divisor(d) {
    while ((uint32_t{1} << shift) < d) ++shift;
    multiplier = static_cast<uint32_t>((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d) / d + 1);
  }

  // n / divisor for n < kFastDivmodLimit.
  TK_HOST_DEVICE uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t hi = __umulhi(n, multiplier);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{n} * multiplier) >> 32);
#endif
    return (hi + n) >> shift;
  }

  TK_HOST_DEVICE void divmod(uint32_t n, uint32_t* quotient, uint32_t* remainder) const {
    *quotient = div(n);
    *remainder = n - *quotient * divisor;
  }
};

}  // namespace transformer_kernels
