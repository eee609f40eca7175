// Rotary position embeddings on q and k in one launch. Torch-free: the kernel, its launch
// heuristics and a host launcher.
//
// q, k are addressed as [B, S, H, d] (any strides, last dim contiguous); cos, sin as [B, S, R]
// (stride 0 over B when shared), R = rotary dims <= d, shared by all heads. Pairs:
//   kNeox:        (i, i + R/2)   out[i] = x[i] cos[i] - x[i+R/2] sin[i];  out[i+R/2] = x[i+R/2] cos + x[i] sin
//   kInterleaved: (2i, 2i + 1)   out[2i] = x[2i] cos - x[2i+1] sin;       out[2i+1] = x[2i+1] cos + x[2i] sin
// Cached form (vLLM's rotary_embedding): the table row of token t is cos_sin_cache[positions[t]],
// R/2 cosines then R/2 sines, one per pair (kCache). A position outside [0, max_position) makes
// that token's rotated channels NaN rather than read out of bounds.
// LTX coordinate form (kLtxCoords): no tables; each pair's cosine and sine are computed from the
// token's coordinates (LtxCoords below), q's and k's rows of a token sharing one computation.
// Channels >= R pass through. Rounding (no FMA: the eager code rounds each op):
//   fp32_math = false (transformers: cos/sin in x's dtype): round(round(x*cos) + round(rot*sin))
//   fp32_math = true  (diffusers LTX/Flux: fp32 tables):   round_once(x*cos + rot*sin) in fp32
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/kernel.cuh"
#include "common/math.cuh"
#include "common/schedule.cuh"
#include "common/vec.cuh"
#include "rope/qk_rows.cuh"
#include "rope/rope_policy.cuh"

namespace transformer_kernels {

enum class RopeStyle { kNeox, kInterleaved };

// Where a token's cosines and sines come from: full-width tables [B, S, R], one row of a
// cos_sin_cache per position (vLLM), or LTX-Video's token coordinates (computed in the kernel).
enum class CosSinSource { kTables, kCache, kLtxCoords };

// Bit-equality with torch's tables needs IEEE cosf/sinf and unfused products; fast math would
// turn sincosf into __sinf/__cosf.
#ifdef __USE_FAST_MATH__
#error "LtxCoords needs precise sincosf: do not build the rope family with --use_fast_math"
#endif

// LTX-Video's rotary angles (diffusers' LTXVideoRotaryPosEmbed), computed where they are used
// instead of read from its fp32 tables [B, S, C] (twice the bytes of a bf16 q). Row width C (all
// heads), F = C / 6. Pairs (2i, 2i + 1) share one angle: the first (C % 6) / 2 pairs are identity
// (cos 1, sin 0), pair (C % 6) / 2 + a, a < 3F, has
//   angle = freqs[a / 3] * (grid[b, s, a % 3] * 2 - 1)
// with torch's fp32 roundings (each op rounded, no FMA), then cosf/sinf as torch's cos/sin
// kernels compute them, so cos and sin equal diffusers' tables bit for bit.
struct LtxCoords {
  const float* grid = nullptr;     // [B or 1, S, 3] (frame, height, width), already scaled by diffusers
  int64_t grid_b = 0, grid_s = 0, grid_c = 0;  // grid's strides in elements; grid_b 0 when shared
  const float* freqs = nullptr;    // [F] contiguous: theta ** linspace(0, 1, F) * pi / 2
  int pad_pairs = 0;               // (C % 6) / 2 identity pairs at the front

  // grid * 2 - 1 of token (b, s), per axis: the factors the frequencies multiply.
  TK_DEVICE void token(int64_t b, int64_t s, float (&g)[3]) const {
    const float* row = grid + b * grid_b + s * grid_s;
#pragma unroll
    for (int axis = 0; axis < 3; ++axis) g[axis] = __fsub_rn(__fmul_rn(row[axis * grid_c], 2.f), 1.f);
  }

  // Cosine and sine of pairs pair0 .. pair0 + kPairs - 1 of a token whose factors are g.
  template <int kPairs>
  TK_DEVICE void cos_sin(const float (&g)[3], int pair0, float (&c)[kPairs], float (&s)[kPairs]) const {
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      const int a = pair0 + i - pad_pairs;  // angle index; negative on the identity pairs
      if (a < 0) {
        c[i] = 1.f, s[i] = 0.f;
        continue;
      }
      const unsigned f = static_cast<unsigned>(a) / 3u;
      const unsigned axis = static_cast<unsigned>(a) - 3u * f;
      const float angle = __fmul_rn(__ldg(freqs + f), axis == 0 ? g[0] : (axis == 1 ? g[1] : g[2]));
      // sincosf is sinf's and cosf's range reduction and polynomials run once (same bits; PTX of
      // CUDA 13.0 checked): torch computes the tables with cosf and sinf.
      sincosf(angle, &s[i], &c[i]);
    }
  }
};

// Rows that share one computation of cos/sin: LTX's coordinate form takes q's and k's row of a
// token together (Policy::kLtxCoordsRows); the table forms one row (the fused q/k norm + RoPE
// kernel; Rope() below groups the heads of the table forms itself).
template <typename Policy>
TK_HOST_DEVICE constexpr int rows_per_group(CosSinSource source) {
  static_assert(Policy::kLtxCoordsRows == 1 || Policy::kLtxCoordsRows == 2, "kLtxCoordsRows must be 1 or 2");
  return source == CosSinSource::kLtxCoords ? Policy::kLtxCoordsRows : 1;
}

// Vector steps of a row one thread takes at a time, all loads first (Policy::kLtxCoordsSteps for
// the coordinate form, whose loads are few and whose sines are long; one otherwise).
template <typename Policy>
TK_HOST_DEVICE constexpr int steps_per_thread(CosSinSource source) {
  return source == CosSinSource::kLtxCoords ? Policy::kLtxCoordsSteps : 1;
}

// Heads per group for `heads` heads a token (q's and k's together) in Rope()'s table form: the
// largest power of two up to Policy::kMaxHeadsPerGroup that divides them, so that a group never
// spans two tokens. The token's cos/sin are loaded once for all of the group's heads.
template <typename Policy>
inline int rope_group_rows(int heads) {
  constexpr int kMax = Policy::kMaxHeadsPerGroup;
  static_assert(kMax == 1 || kMax == 2 || kMax == 4 || kMax == 8, "kMaxHeadsPerGroup must be 1, 2, 4 or 8");
  int rows = kMax;
  while (rows > 1 && heads % rows != 0) rows /= 2;
  return rows;
}

template <typename T, typename table_t>
struct RopeParams {
  QkRows<T> qk;
  const table_t* cos;  // [B, S, R]; cached form: cos_sin_cache [max_position, R]
  const table_t* sin;  // [B, S, R]; cached form: unused (the sines follow the cosines in each row)
  int64_t table_b, table_s;  // strides of cos and sin (same layout), in elements
  const int64_t* positions = nullptr;  // [B * S], cached form only
  int64_t max_position = 0;            // rows of cos_sin_cache, cached form only
  LtxCoords coords;                    // coordinate form only (cos, sin unused)
  int head_dim;
  int rotary_dim;
  bool copy_pass_through;  // out-of-place: copy channels >= rotary_dim
  int log2_threads_per_row;
};

namespace rope_detail {

// Rotates kPairs pairs (x1[i], x2[i]) into y1, y2: y1 = x1*c1 - x2*s1, y2 = x2*c2 + x1*s2, in fp32
// with one rounding (kFp32Math), or as transformers' model-dtype code rounds each product and the
// sum. Roundings go two per conversion instruction (y1 and y2 interleaved in one array).
template <typename T, bool kFp32Math, int kPairs>
TK_DEVICE void rotate_pairs(const float (&x1)[kPairs], const float (&x2)[kPairs], const float (&c1)[kPairs],
                            const float (&c2)[kPairs], const float (&s1)[kPairs], const float (&s2)[kPairs],
                            T (&y1)[kPairs], T (&y2)[kPairs]) {
  float cos_terms[2 * kPairs], sin_terms[2 * kPairs];
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    cos_terms[2 * i] = __fmul_rn(x1[i], c1[i]), sin_terms[2 * i] = __fmul_rn(-x2[i], s1[i]);
    cos_terms[2 * i + 1] = __fmul_rn(x2[i], c2[i]), sin_terms[2 * i + 1] = __fmul_rn(x1[i], s2[i]);
  }
  if constexpr (!kFp32Math) {
    round_through<T>(cos_terms);
    round_through<T>(sin_terms);
  }
  float y[2 * kPairs];
#pragma unroll
  for (int i = 0; i < 2 * kPairs; ++i) y[i] = __fadd_rn(cos_terms[i], sin_terms[i]);
  T rounded[2 * kPairs];
  from_floats(y, rounded);
#pragma unroll
  for (int i = 0; i < kPairs; ++i) y1[i] = rounded[2 * i], y2[i] = rounded[2 * i + 1];
}

// The same rotation in transformers' rounding on raw T vectors, each product and the sum in packed T
// arithmetic (the same bits as rotate_pairs<T, false>, vec.cuh): the first halves' results
// y1 = x1 c1 - x2 s1 and the second halves' y2 = x2 c2 + x1 s2 (x1, x2 the pairs' two elements; the
// tables at the same places). Two functions, so that callers store y1 before computing y2.
template <typename T, int N>
TK_DEVICE vec_t<T, N> rotated_first_rn(const vec_t<T, N>& x1, const vec_t<T, N>& x2, const vec_t<T, N>& c1,
                                       const vec_t<T, N>& s1) {
  return add_rn(mul_rn(x1, c1), mul_rn(negated(x2), s1));
}
template <typename T, int N>
TK_DEVICE vec_t<T, N> rotated_second_rn(const vec_t<T, N>& x1, const vec_t<T, N>& x2, const vec_t<T, N>& c2,
                                        const vec_t<T, N>& s2) {
  return add_rn(mul_rn(x2, c2), mul_rn(x1, s2));
}

// The two elements of pairs j0 .. j0 + kPairs - 1 of a row of E (x, or a full-width cos/sin
// table): 16-byte vectors when kPairs > 1 (NeoX: one from each half; interleaved: one holding
// both elements of each pair), element by element otherwise (any alignment).
template <RopeStyle kStyle, int kPairs, typename E>
TK_DEVICE void load_pairs(const E* row, int j0, int num_pairs, float (&v1)[kPairs], float (&v2)[kPairs]) {
  if constexpr (kPairs == 1) {
    v1[0] = to_float(row[kStyle == RopeStyle::kNeox ? j0 : 2 * j0]);
    v2[0] = to_float(row[kStyle == RopeStyle::kNeox ? j0 + num_pairs : 2 * j0 + 1]);
  } else if constexpr (kStyle == RopeStyle::kNeox) {
    vec_t<E, kPairs> a, b;
    a.load(row + j0);
    b.load(row + j0 + num_pairs);
    a.cast_to(v1);
    b.cast_to(v2);
  } else {
    vec_t<E, 2 * kPairs> v;
    v.load(row + 2 * j0);
#pragma unroll
    for (int i = 0; i < kPairs; ++i) v1[i] = to_float(v[2 * i]), v2[i] = to_float(v[2 * i + 1]);
  }
}

// Stores what load_pairs loads.
template <RopeStyle kStyle, int kPairs, typename T>
TK_DEVICE void store_pairs(T* row, int j0, int num_pairs, const T (&y1)[kPairs], const T (&y2)[kPairs]) {
  if constexpr (kPairs == 1) {
    row[kStyle == RopeStyle::kNeox ? j0 : 2 * j0] = y1[0];
    row[kStyle == RopeStyle::kNeox ? j0 + num_pairs : 2 * j0 + 1] = y2[0];
  } else if constexpr (kStyle == RopeStyle::kNeox) {
    vec_t<T, kPairs> a, b;
#pragma unroll
    for (int i = 0; i < kPairs; ++i) a[i] = y1[i], b[i] = y2[i];
    a.store(row + j0);
    b.store(row + (j0 + num_pairs));  // an int offset: a 64-bit one stays live through the math (+8 registers)
  } else {
    vec_t<T, 2 * kPairs> o;
#pragma unroll
    for (int i = 0; i < kPairs; ++i) o[2 * i] = y1[i], o[2 * i + 1] = y2[i];
    o.store(row + 2 * j0);
  }
}

// The backward of a rotation is its transpose: y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2 has
// dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1, the same rotation of dy with the sines
// (s1, s2) -> (-s2, -s1) (kInverse): exact for any tables, a sign flip where s1 == s2.
template <int kPairs>
TK_DEVICE void transpose_sines(float (&s1)[kPairs], float (&s2)[kPairs]) {
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const float first = s1[i];
    s1[i] = -s2[i], s2[i] = -first;
  }
}
template <typename T, int N>
TK_DEVICE void transpose_sines(vec_t<T, N>& s1, vec_t<T, N>& s2) {
  const vec_t<T, N> first = s1;
  s1 = negated(s2), s2 = negated(first);
}

// One thread handles kPairs pairs per step of each of its group's kRows rows: kRows consecutive
// heads of one token (q's heads, then k's), which share the token's cos/sin. In the coordinate
// form the group is q's and k's row of a token (the ops take [B, S, C]: one head each).
// kInverse: the backward (transpose_sines), x holding the outputs' gradients.
template <typename Policy, typename T, typename table_t, RopeStyle kStyle, bool kFp32Math, int kPairs,
          CosSinSource kSource, int kRows, bool kInverse>
TK_DEVICE void rotate_rows(const RopeParams<T, table_t>& p) {
  constexpr bool kCache = kSource == CosSinSource::kCache;
  constexpr bool kCoords = kSource == CosSinSource::kLtxCoords;
  static_assert(!kCoords || (kStyle == RopeStyle::kInterleaved && kFp32Math), "LTX rotates interleaved pairs in fp32");
  const PowerOfTwoRows slot(p.log2_threads_per_row);
  const int threads = slot.threads, lane = slot.lane;
  const int64_t group = slot.row;
  if (group >= p.qk.num_rows() / kRows) return;
  int64_t b, s;
  const T* x[kRows];
  T* out[kRows];
  if constexpr (kRows == 1) {
    p.qk.locate(group, b, s, x[0], out[0]);
  } else {
    int head0 = 0;
    if constexpr (kCoords) {
      p.qk.token_at(group, b, s);  // one head each for q and k: the group is the token
    } else {
      p.qk.token_and_head(group * kRows, b, s, head0);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) p.qk.head_at(b, s, head0 + r, x[r], out[r]);
  }
  const int num_pairs = p.rotary_dim / 2;
  const table_t* cos = nullptr;
  const table_t* sin = nullptr;
  bool position_ok = true;
  float g[3];  // coordinate form: the token's grid * 2 - 1
  if constexpr (kCoords) {
    p.coords.token(b, s, g);
  } else if constexpr (kCache) {
    const int64_t pos = p.positions[b * p.qk.seq + s];
    position_ok = pos >= 0 && pos < p.max_position;
    cos = p.cos + (position_ok ? pos : 0) * p.table_s;
    sin = cos + num_pairs;
  } else {
    cos = p.cos + b * p.table_b + s * p.table_s;
    sin = p.sin + b * p.table_b + s * p.table_s;
  }

  // Cache and coordinate forms: one cosine and one sine per pair, shared by its two elements.
  auto share_pairs = [&](float (&c1)[kPairs], float (&c2)[kPairs], float (&s1)[kPairs], float (&s2)[kPairs]) {
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      if (!position_ok) c1[i] = s1[i] = __int_as_float(0x7fc00000);  // NaN: the position has no row
      c2[i] = c1[i], s2[i] = s1[i];
    }
  };
  // transformers' form with tables in the model dtype, NeoX pairs: rotated_*_rn on the raw vectors.
  constexpr bool kPackedNeox = !kFp32Math && kSource == CosSinSource::kTables && kStyle == RopeStyle::kNeox &&
                               kPairs > 1 && std::is_same_v<table_t, T>;
  constexpr int kSteps = steps_per_thread<Policy>(kSource);
  for (int j_first = lane * kPairs; j_first < num_pairs; j_first += threads * kPairs * kSteps) {
    if constexpr (kPackedNeox) {
      const int j0 = j_first;
      using pairs = vec_t<T, kPairs>;
      pairs x1[kRows], x2[kRows], c1, c2, s1, s2;
#pragma unroll
      for (int r = 0; r < kRows; ++r) x1[r].load(x[r] + j0), x2[r].load(x[r] + (j0 + num_pairs));
      c1.load(cos + j0), c2.load(cos + (j0 + num_pairs)), s1.load(sin + j0), s2.load(sin + (j0 + num_pairs));
      if constexpr (kInverse) transpose_sines(s1, s2);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        rotated_first_rn(x1[r], x2[r], c1, s1).store(out[r] + j0);
        rotated_second_rn(x1[r], x2[r], c2, s2).store(out[r] + (j0 + num_pairs));
      }
    } else {
      // Every step's x is loaded before any math or store: kSteps * kRows loads in flight.
      auto step_j0 = [&](int u) { return j_first + u * threads * kPairs; };
      auto has_step = [&](int u) { return u == 0 || step_j0(u) < num_pairs; };
      float c1[kSteps][kPairs], c2[kSteps][kPairs], s1[kSteps][kPairs], s2[kSteps][kPairs];
      if constexpr (kCache) {  // the cache row before x (40 registers, not 48)
#pragma unroll
        for (int u = 0; u < kSteps; ++u) {
          if (!has_step(u)) continue;
          const int j0 = step_j0(u);
          if constexpr (kPairs == 1) {
            c1[u][0] = to_float(cos[j0]), s1[u][0] = to_float(sin[j0]);
          } else {
            vec_t<table_t, kPairs> cv, sv;
            cv.load(cos + j0);
            sv.load(sin + j0);
            cv.cast_to(c1[u]);
            sv.cast_to(s1[u]);
          }
          share_pairs(c1[u], c2[u], s1[u], s2[u]);
          if constexpr (kInverse) transpose_sines(s1[u], s2[u]);
        }
      }
      float x1[kSteps][kRows][kPairs], x2[kSteps][kRows][kPairs];
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
        if (!has_step(u)) continue;
#pragma unroll
        for (int r = 0; r < kRows; ++r) load_pairs<kStyle, kPairs>(x[r], step_j0(u), num_pairs, x1[u][r], x2[u][r]);
      }
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
        if (!has_step(u)) continue;
        const int j0 = step_j0(u);
        if constexpr (kCoords) {  // after x's loads: the math hides their latency
          p.coords.cos_sin(g, j0, c1[u], s1[u]);
          share_pairs(c1[u], c2[u], s1[u], s2[u]);
          if constexpr (kInverse) transpose_sines(s1[u], s2[u]);
        } else if constexpr (!kCache) {
          load_pairs<kStyle, kPairs>(cos, j0, num_pairs, c1[u], c2[u]);
          load_pairs<kStyle, kPairs>(sin, j0, num_pairs, s1[u], s2[u]);
          if constexpr (kInverse) transpose_sines(s1[u], s2[u]);
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          T y1[kPairs], y2[kPairs];
          rotate_pairs<T, kFp32Math>(x1[u][r], x2[u][r], c1[u], c2[u], s1[u], s2[u], y1, y2);
          store_pairs<kStyle, kPairs>(out[r], j0, num_pairs, y1, y2);
        }
      }
    }
  }
  if (p.copy_pass_through) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      for (int c = p.rotary_dim + lane; c < p.head_dim; c += threads) out[r][c] = x[r][c];
  }
}

// The kernels' bodies: the rotation and its backward, each under a name of its own (profiles tell
// them apart; the forward kernels keep their names).
template <typename Policy, typename T, typename table_t, RopeStyle kStyle, bool kFp32Math, int kPairs,
          CosSinSource kSource, int kRows>
TK_DEVICE void rope_body(const RopeParams<T, table_t>& p) {
  rotate_rows<Policy, T, table_t, kStyle, kFp32Math, kPairs, kSource, kRows, /*kInverse=*/false>(p);
}
template <typename Policy, typename T, typename table_t, RopeStyle kStyle, bool kFp32Math, int kPairs,
          CosSinSource kSource, int kRows>
TK_DEVICE void rope_backward_body(const RopeParams<T, table_t>& p) {
  rotate_rows<Policy, T, table_t, kStyle, kFp32Math, kPairs, kSource, kRows, /*kInverse=*/true>(p);
}

// The coordinate form runs under Policy::kLtxCoordsRegisterCap; the table forms keep ptxas's choice.
template <typename Policy, typename T, typename table_t, RopeStyle kStyle, bool kFp32Math, int kPairs,
          CosSinSource kSource, int kRows, bool kInverse>
constexpr auto rope_kernel() {
  constexpr int kCap = kSource == CosSinSource::kLtxCoords ? Policy::kLtxCoordsRegisterCap : kNoRegisterCap;
  if constexpr (kInverse) {
    return kernel_entry_for<kCap, RopeParams<T, table_t>,
                            rope_backward_body<Policy, T, table_t, kStyle, kFp32Math, kPairs, kSource, kRows>>();
  } else {
    return kernel_entry_for<kCap, RopeParams<T, table_t>,
                            rope_body<Policy, T, table_t, kStyle, kFp32Math, kPairs, kSource, kRows>>();
  }
}

// Launches the vector kernel with kRows heads per group for `rows` (a power of two <= kRows).
template <typename Policy, typename T, typename table_t, RopeStyle kStyle, bool kFp32Math, int kPairs,
          CosSinSource kSource, int kRows, bool kInverse>
void launch_group_rows(int rows, dim3 grid, const RopeParams<T, table_t>& p, cudaStream_t stream) {
  if constexpr (kRows > 1) {
    if (rows < kRows)
      return launch_group_rows<Policy, T, table_t, kStyle, kFp32Math, kPairs, kSource, kRows / 2, kInverse>(rows, grid,
                                                                                                             p, stream);
  }
  launch_kernel(rope_kernel<Policy, T, table_t, kStyle, kFp32Math, kPairs, kSource, kRows, kInverse>(),
                grid, Policy::kBlockThreads, 0, stream, p);
}

// Host launcher. Vector steps (16 bytes of x per load) when pointers, strides and the rotary
// width allow, one pair per step otherwise. Coordinate form: p.coords set, q and k one head each.
// kInverse: the backward (rope_backward below), q and k holding the outputs' gradients.
template <RopeStyle kStyle, bool kFp32Math, CosSinSource kSource, typename Policy, bool kInverse, typename T,
          typename table_t>
cudaError_t launch_rope(RopeParams<T, table_t> p, cudaStream_t stream) {
  constexpr bool kTables = kSource != CosSinSource::kLtxCoords;
  if (p.qk.num_rows() == 0 || p.head_dim == 0) return cudaSuccess;
  // Pairs per vector step: 16 bytes of x per load (NeoX loads both halves, interleaved one vector
  // holding both elements of each pair).
  constexpr int kVecPairs = kStyle == RopeStyle::kNeox ? vec_size<T>() : vec_size<T>() / 2;
  constexpr int kVecElems = kStyle == RopeStyle::kNeox ? kVecPairs : 2 * kVecPairs;
  const int num_pairs = p.rotary_dim / 2;
  const bool tables_aligned = !kTables || (is_vec_aligned<table_t, kVecElems>(p.cos) &&
                                           is_vec_aligned<table_t, kVecElems>(p.sin) &&
                                           p.table_b % kVecElems == 0 && p.table_s % kVecElems == 0 &&
                                           // the sines' offset keeps alignment
                                           (kSource != CosSinSource::kCache || num_pairs % kVecElems == 0));
  const bool vectorizable = num_pairs % kVecPairs == 0 && p.qk.template aligned<kVecElems>() && tables_aligned;
  const int pairs_per_step = vectorizable ? kVecPairs : 1;
  // Rows per thread group: the coordinate form's q and k; the table form's heads sharing cos/sin
  // on the vector path (the scalar path, for misaligned views, and the cache form keep one).
  constexpr int kCoordsRows = rows_per_group<Policy>(CosSinSource::kLtxCoords);
  constexpr bool kGroupHeads = kSource == CosSinSource::kTables;
  const int group_rows = !kTables ? kCoordsRows : (kGroupHeads && vectorizable ? rope_group_rows<Policy>(p.qk.heads()) : 1);
  const int64_t groups = p.qk.num_rows() / group_rows;
  // Threads per row: a power of two covering the row's steps (at least one), at most a block.
  constexpr int kThreadSteps = steps_per_thread<Policy>(kSource);
  const int64_t steps = ceil_div(num_pairs, pairs_per_step * kThreadSteps);
  p.log2_threads_per_row = log2_threads_per_row(steps, Policy::kBlockThreads);
  const dim3 grid = grid_for(groups, Policy::kBlockThreads >> p.log2_threads_per_row);
  constexpr int kHeadsRows = kGroupHeads ? Policy::kMaxHeadsPerGroup : 1;  // the largest group compiled
  if (!vectorizable) {
    launch_kernel(rope_detail::rope_kernel<Policy, T, table_t, kStyle, kFp32Math, 1, kSource,
                                           !kTables ? kCoordsRows : 1, kInverse>(),
                  grid, Policy::kBlockThreads, 0, stream, p);
  } else if constexpr (!kTables) {
    launch_kernel(
        rope_detail::rope_kernel<Policy, T, table_t, kStyle, kFp32Math, kVecPairs, kSource, kCoordsRows, kInverse>(),
        grid, Policy::kBlockThreads, 0, stream, p);
  } else {
    rope_detail::launch_group_rows<Policy, T, table_t, kStyle, kFp32Math, kVecPairs, kSource, kHeadsRows, kInverse>(
        group_rows, grid, p, stream);
  }
  return cudaGetLastError();
}

}  // namespace rope_detail

// The rotation of q and k (RopeParams: q, k [B, S, H, d] in, q_out, k_out [B, S, H, d] out).
template <RopeStyle kStyle, bool kFp32Math, CosSinSource kSource, typename Policy = RopePolicy, typename T,
          typename table_t>
cudaError_t Rope(RopeParams<T, table_t> p, cudaStream_t stream) {
  return rope_detail::launch_rope<kStyle, kFp32Math, kSource, Policy, /*kInverse=*/false>(p, stream);
}

// Its backward: the rotation by -theta (transpose_sines) of the outputs' gradients, read where
// Rope() reads q, k and written where it writes q_out, k_out; the same checks and layouts.
template <RopeStyle kStyle, bool kFp32Math, CosSinSource kSource, typename Policy = RopePolicy, typename T,
          typename table_t>
cudaError_t RopeBackward(RopeParams<T, table_t> p, cudaStream_t stream) {
  return rope_detail::launch_rope<kStyle, kFp32Math, kSource, Policy, /*kInverse=*/true>(p, stream);
}

}  // namespace transformer_kernels
