// The one vectorized-access type of the project: N elements of T moved with the widest
// aligned global-memory instructions (16 bytes per instruction when N * sizeof(T) >= 16).
// Torch-free.
#pragma once

#include <cstdint>

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

// True when `ptr` may be used with vec_t<T, N>::load/store.
template <typename T, int N>
TK_HOST_DEVICE bool is_vec_aligned(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % vec_t<T, N>::kChunkBytes == 0;
}

}  // namespace transformer_kernels
