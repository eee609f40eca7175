// The one vectorized-access type of the project: N elements of T moved with the widest
// aligned global-memory instructions (16 bytes per instruction when N * sizeof(T) >= 16).
// Torch-free.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/math.cuh"

namespace transformer_kernels {

// Bytes moved by one vector instruction; every kernel sizes its vectors from this.
constexpr int kVecBytes = 16;

// Elements of T in one 16-byte vector (8 for half/bfloat16, 4 for float).
template <typename T>
constexpr int vec_size() { return kVecBytes / static_cast<int>(sizeof(T)); }

namespace detail {
// Unsigned type of the same size as a chunk of `kBytes` bytes (kBytes <= 16).
template <int kBytes> struct chunk_type;
template <> struct chunk_type<1> { using type = uint8_t; };
template <> struct chunk_type<2> { using type = uint16_t; };
template <> struct chunk_type<4> { using type = uint32_t; };
template <> struct chunk_type<8> { using type = uint2; };
template <> struct chunk_type<16> { using type = uint4; };

constexpr int min_int(int a, int b) { return a < b ? a : b; }
}  // namespace detail

// `vec_t<T, N>` holds N values of T in registers. `load`/`store` need the pointer aligned to
// min(16, N * sizeof(T)) bytes; larger vectors (8 floats = 32 bytes) are split into 16-byte
// instructions. `cast_load`/`cast_store` convert to/from fp32 in the same pass.
template <typename T, int N>
struct vec_t {
  static constexpr int kBytes = N * static_cast<int>(sizeof(T));
  static constexpr int kChunkBytes = detail::min_int(kBytes, kVecBytes);
  static constexpr int kChunks = kBytes / kChunkBytes;
  static_assert(kBytes % kChunkBytes == 0, "vector must be a whole number of chunks");
  using chunk_t = typename detail::chunk_type<kChunkBytes>::type;

  alignas(kChunkBytes) T data[N];

  TK_DEVICE T& operator[](int i) { return data[i]; }
  TK_DEVICE const T& operator[](int i) const { return data[i]; }

  TK_DEVICE void load(const T* ptr) {
    const chunk_t* src = reinterpret_cast<const chunk_t*>(ptr);
    chunk_t* dst = reinterpret_cast<chunk_t*>(data);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) dst[c] = src[c];
  }

  TK_DEVICE void store(T* ptr) const {
    const chunk_t* src = reinterpret_cast<const chunk_t*>(data);
    chunk_t* dst = reinterpret_cast<chunk_t*>(ptr);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) dst[c] = src[c];
  }

  TK_DEVICE void cast_to(float (&out)[N]) const {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(data[i]);
  }

  TK_DEVICE void cast_from(const float (&in)[N]) { from_floats(in, data); }
};

// a * b and a + b element by element, each result rounded once to T: two lanes per instruction
// for 16-bit T (mul.rn / add.rn on bf16x2 and f16x2, fma-based before sm_90), fp32 ops for float.
// They equal eager PyTorch's `(a.float() op b.float()).to(T)`: an fp32 result rounded again to T is
// the correctly rounded T result whenever fp32's 24 bits are at least 2p + 1 for T's p bits
// (Figueroa, "When is double rounding innocuous?", 1995): bf16 p = 8, fp16 p = 11. Kernels that
// follow the eager code op by op use them in place of convert, fp32 op, round, convert back.
namespace detail {
template <typename T> struct pair_type;
template <> struct pair_type<__nv_bfloat16> { using type = __nv_bfloat162; };
template <> struct pair_type<__half> { using type = __half2; };

template <typename T>
TK_DEVICE T mul_rn(T a, T b) {
  if constexpr (std::is_same_v<T, float>) return __fmul_rn(a, b); else return __hmul_rn(a, b);
}
template <typename T>
TK_DEVICE T add_rn(T a, T b) {
  if constexpr (std::is_same_v<T, float>) return __fadd_rn(a, b); else return __hadd_rn(a, b);
}

template <bool kMul, typename T, int N>
TK_DEVICE vec_t<T, N> elementwise_rn(const vec_t<T, N>& a, const vec_t<T, N>& b) {
  vec_t<T, N> out;
  if constexpr (!std::is_same_v<T, float> && N % 2 == 0) {
    using T2 = typename pair_type<T>::type;
    const T2* a2 = reinterpret_cast<const T2*>(a.data);
    const T2* b2 = reinterpret_cast<const T2*>(b.data);
    T2* o2 = reinterpret_cast<T2*>(out.data);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) o2[i] = kMul ? __hmul2_rn(a2[i], b2[i]) : __hadd2_rn(a2[i], b2[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = kMul ? mul_rn(a[i], b[i]) : add_rn(a[i], b[i]);
  }
  return out;
}
}  // namespace detail

template <typename T, int N>
TK_DEVICE vec_t<T, N> mul_rn(const vec_t<T, N>& a, const vec_t<T, N>& b) { return detail::elementwise_rn<true>(a, b); }

template <typename T, int N>
TK_DEVICE vec_t<T, N> add_rn(const vec_t<T, N>& a, const vec_t<T, N>& b) { return detail::elementwise_rn<false>(a, b); }

// -v element by element (a sign flip: exact, as eager's negation).
template <typename T, int N>
TK_DEVICE vec_t<T, N> negated(const vec_t<T, N>& v) {
  vec_t<T, N> out;
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = -v[i];
  return out;
}

// A vector of N copies of v.
template <typename T, int N>
TK_DEVICE vec_t<T, N> filled(T v) {
  vec_t<T, N> out;
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = v;
  return out;
}

// True when `ptr` may be used with vec_t<T, N>::load/store.
template <typename T, int N>
TK_HOST_DEVICE bool is_vec_aligned(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % vec_t<T, N>::kChunkBytes == 0;
}

}  // namespace transformer_kernels
