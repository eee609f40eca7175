// RMSNorm of q and k followed by RoPE, q and k in one launch: the first steps of the attention of
// LTX-Video (norm across all heads, [B, S, H*d]), Flux (norm per head, [B, S, H, d]) and Qwen3
// (norm per head). Torch-free: the kernel, its launch heuristics and a host launcher.
//
// q, k are addressed as [B, S, G, L] (QkRows; G norm groups of width L: G = 1 for LTX, G = heads
// for Flux and Qwen3); weights [L]; cos, sin [B or 1, S, L]. Per row, in the eager code's rounding
// (fp32 math, no FMA contraction; round() rounds to T, the dtype of q and k):
//   kDiffusers (torch.nn.RMSNorm, then diffusers' apply_rotary_emb with fp32 tables):
//     n   = round(x * rsqrt(mean(x^2) + eps) * w)
//     out = round(n * cos + rotate(n) * sin)         rotate(n)[2i] = -n[2i+1], rotate(n)[2i+1] = n[2i]
//   kTransformers (Qwen3RMSNorm, then transformers' apply_rotary_pos_emb; weights and tables in T):
//     n   = round(w * round(x * rsqrt(mean(x^2) + eps)))
//     out = round(round(n * cos) + round(rotate_half(n) * sin))
//           rotate_half(n)[i] = -n[i + L/2], rotate_half(n)[i + L/2] = n[i]
// A row is held in registers between the reduction and the rotation (rows up to
// qk_norm_rope_max_width), so each input is read once. LTX's coordinate form (CosSinSource::kLtxCoords, G = 1)
// computes cos/sin from the token's coordinates instead of reading tables; one lane group then
// holds q's and k's row of a token and computes them once for both. Each row keeps the lanes and
// the sum order the table form gives it, so the two forms give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/kernel.cuh"
#include "common/math.cuh"
#include "common/reduce.cuh"
#include "common/schedule.cuh"
#include "common/vec.cuh"
#include "qk_norm_rope/qk_norm_rope_policy.cuh"
#include "rope/rope.cuh"

namespace transformer_kernels {

// Which library's eager code the kernel reproduces: its pairs, its table dtype and its roundings.
enum class QkNormRopeForm {
  kDiffusers,     // LTX-Video, Flux: interleaved pairs, fp32 tables, one rounding per step
  kTransformers,  // Qwen3: NeoX half rotation, tables in the model dtype, every op rounded
};

template <typename T, typename weight_t, typename table_t>
struct QkNormRopeParams {
  QkRows<T> qk;              // rows of width L: the norm groups of q, then of k
  const weight_t* q_weight;  // [L] contiguous
  const weight_t* k_weight;  // [L] contiguous
  const table_t* cos;        // [B or 1, S, L]; coordinate form: unused
  const table_t* sin;        // [B or 1, S, L]; coordinate form: unused
  int64_t table_b, table_s;  // strides of cos and sin (same layout), in elements; table_b 0 when shared
  LtxCoords coords;          // coordinate form only
  int width;                 // L, even
  float eps;
};

namespace qk_norm_rope_detail {

// Rows hold at most this many vectors (the whole row stays in registers).
template <typename Policy>
constexpr int max_row_vecs() {
  static_assert(Policy::kBlockCachedVecs <= Policy::kCachedVecs, "the widest rows take kCachedVecs per thread");
  return kMaxBlockThreads * Policy::kCachedVecs;
}

TK_HOST_DEVICE constexpr bool half_rotation(QkNormRopeForm form) { return form == QkNormRopeForm::kTransformers; }

// A lane rotates whole units without help from other lanes: one vector holding whole pairs
// (interleaved), or a vector and its partner half a row further on (half rotation). Lane l of a
// row's group holds units l, l + threads, ...: for the half rotation that is vectors u and
// u + L / (2 kVec), so every pair is found in-lane whatever the head size.
TK_HOST_DEVICE constexpr int vecs_per_unit(QkNormRopeForm form) { return half_rotation(form) ? 2 : 1; }

// The narrowest vector each form can use when pointers or strides rule out 16 bytes: one element
// for the half rotation (pairs are split across vectors anyway), one pair for interleaved pairs.
TK_HOST_DEVICE constexpr int min_vec(QkNormRopeForm form) { return half_rotation(form) ? 1 : 2; }

// The normalized values n of one vector (fp32, already rounded to T the way the form's norm module
// rounds), two roundings per conversion instruction.
template <QkNormRopeForm kForm, typename T, int kVec>
TK_DEVICE void normalize(float (&n)[kVec], float inv_rms, const float (&w)[kVec]) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) n[i] = __fmul_rn(n[i], inv_rms);
  if constexpr (half_rotation(kForm)) {  // weight * h.to(T)
    round_through<T>(n);
#pragma unroll
    for (int i = 0; i < kVec; ++i) n[i] = __fmul_rn(w[i], n[i]);
  } else {  // F.rms_norm: one rounding
#pragma unroll
    for (int i = 0; i < kVec; ++i) n[i] = __fmul_rn(n[i], w[i]);
  }
  round_through<T>(n);
}

// kThreadsPerRow lanes per row (0: the whole block); kVec elements per vector (even for
// interleaved pairs, so that each vector holds whole pairs). A group holds kRows rows: one, or
// q's and k's row of a token when each has one norm group (LTX: the ops take [B, S, C]), each row
// with the lanes and units one row would have; the two share the token's cos/sin.
template <typename Policy, QkNormRopeForm kForm, CosSinSource kSource, typename T, typename weight_t,
          typename table_t, int kVec, int kThreadsPerRow, int kRowCachedVecs, int kRows>
TK_DEVICE void qk_norm_rope_body(const QkNormRopeParams<T, weight_t, table_t>& p) {
  static_assert(kSource == CosSinSource::kTables ||
                    (kSource == CosSinSource::kLtxCoords && kForm == QkNormRopeForm::kDiffusers),
                "tables, or LTX's coordinates with diffusers' form");
  static_assert(kRows == 1 || kRows == 2, "one row, or q's and k's of a token");
  constexpr bool kCoords = kSource == CosSinSource::kLtxCoords;
  constexpr int kUnitVecs = vecs_per_unit(kForm);
  constexpr int kCachedUnits = kRowCachedVecs / kUnitVecs;  // per row
  static_assert(kCachedUnits >= 1, "a thread holds at least one unit");
  constexpr bool kFp32Rotation = !half_rotation(kForm);  // diffusers: one rounding; transformers: per op
  // transformers' form with weight and tables in q's dtype: all of its roundings in packed T ops
  constexpr bool kPackedHalfRotation = half_rotation(kForm) && kSource == CosSinSource::kTables &&
                                       std::is_same_v<weight_t, T> && std::is_same_v<table_t, T>;
  using vec = vec_t<T, kVec>;
  const int64_t num_groups = p.qk.num_rows() / kRows;
  const RowGroup<kThreadsPerRow> group(num_groups);
  const int lane = group.lane, threads = group.threads;
  const unsigned lanes_with_rows = group.mask;
  if (group.row >= num_groups) return;

  int64_t b, s;
  const T* x[kRows];
  T* out[kRows];
  const weight_t* weight[kRows];
  if constexpr (kRows == 1) {
    p.qk.locate(group.row, b, s, x[0], out[0]);
    weight[0] = group.row % p.qk.heads() < p.qk.num_q_heads ? p.q_weight : p.k_weight;
  } else {
    p.qk.token_at(group.row, b, s);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      p.qk.head_at(b, s, r, x[r], out[r]);
      weight[r] = r < p.qk.num_q_heads ? p.q_weight : p.k_weight;
    }
  }
  const table_t* cos = nullptr;
  const table_t* sin = nullptr;
  float g[3];  // coordinate form: the token's grid * 2 - 1
  if constexpr (kCoords) {
    p.coords.token(b, s, g);
  } else {
    cos = p.cos + b * p.table_b + s * p.table_s;
    sin = p.sin + b * p.table_b + s * p.table_s;
  }
  const int num_units = p.width / (kVec * kUnitVecs);
  // First element of vector j of unit u: the unit's own vector, then its partner half a row on.
  auto at = [num_units](int u, int j) { return (u + j * num_units) * kVec; };

  vec cached[kRows][kCachedUnits][kUnitVecs];  // [row][unit slot][vector of the unit]
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    acc[r] = 0.f;
#pragma unroll
    for (int c = 0; c < kCachedUnits; ++c) {
      const int u = lane + c * threads;
      if (u < num_units) {
#pragma unroll
        for (int j = 0; j < kUnitVecs; ++j) {
          cached[r][c][j].load(x[r] + at(u, j));
#pragma unroll
          for (int i = 0; i < kVec; ++i) acc[r] += to_float(cached[r][c][j][i]) * to_float(cached[r][c][j][i]);
        }
      }
    }
  }
  row_reduce_sum<kThreadsPerRow>(acc, lanes_with_rows);
  float inv_rms[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    // mean as torch's reduction computes it: sum times 1/L
    inv_rms[r] = rsqrtf(__fmul_rn(acc[r], 1.f / static_cast<float>(p.width)) + p.eps);
  }

#pragma unroll
  for (int c = 0; c < kCachedUnits; ++c) {
    const int u = lane + c * threads;
    if (u >= num_units) continue;
    if constexpr (kPackedHalfRotation) {
      // transformers' rounding from the raw vectors in packed T arithmetic (vec.cuh: the same bits):
      // n = round(w * round(x * inv_rms)); out = round(round(n * cos) + round(rotate_half(n) * sin))
      vec cv[2], sv[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) cv[j].load(cos + at(u, j)), sv[j].load(sin + at(u, j));
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        vec nv[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float n[kVec];
          cached[r][c][j].cast_to(n);
#pragma unroll
          for (int i = 0; i < kVec; ++i) n[i] = __fmul_rn(n[i], inv_rms[r]);
          vec rounded, wv;
          rounded.cast_from(n);
          wv.load(weight[r] + at(u, j));
          nv[j] = mul_rn(wv, rounded);
        }
        rope_detail::rotated_first_rn(nv[0], nv[1], cv[0], sv[0]).store(out[r] + at(u, 0));
        rope_detail::rotated_second_rn(nv[0], nv[1], cv[1], sv[1]).store(out[r] + at(u, 1));
      }
    } else {
      float cs[kUnitVecs][kVec], sn[kUnitVecs][kVec];  // [vector of the unit][element]
      if constexpr (kCoords) {  // interleaved pairs: one angle per pair, unit = one vector
        float pc[kVec / 2], ps[kVec / 2];
        p.coords.cos_sin(g, at(u, 0) / 2, pc, ps);
#pragma unroll
        for (int i = 0; i < kVec / 2; ++i) {
          cs[0][2 * i] = cs[0][2 * i + 1] = pc[i];
          sn[0][2 * i] = sn[0][2 * i + 1] = ps[i];
        }
      } else {
#pragma unroll
        for (int j = 0; j < kUnitVecs; ++j) {
          vec_t<table_t, kVec> cv, sv;
          cv.load(cos + at(u, j));
          sv.load(sin + at(u, j));
          cv.cast_to(cs[j]);
          sv.cast_to(sn[j]);
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float n[kUnitVecs][kVec];  // [vector of the unit][element]
#pragma unroll
        for (int j = 0; j < kUnitVecs; ++j) {
          float w[kVec];
          vec_t<weight_t, kVec> wv;
          wv.load(weight[r] + at(u, j));
          wv.cast_to(w);
          cached[r][c][j].cast_to(n[j]);
          normalize<kForm, T>(n[j], inv_rms[r], w);
        }
        vec o[kUnitVecs];
        if constexpr (half_rotation(kForm)) {  // element i of the first half pairs with element i of the second
          rope_detail::rotate_pairs<T, kFp32Rotation>(n[0], n[1], cs[0], cs[1], sn[0], sn[1], o[0].data, o[1].data);
        } else {  // pairs (i, i + 1) within the vector
          constexpr int kPairs = kVec / 2;
          float x1[kPairs], x2[kPairs], c1[kPairs], c2[kPairs], s1[kPairs], s2[kPairs];
#pragma unroll
          for (int i = 0; i < kPairs; ++i) {
            x1[i] = n[0][2 * i], x2[i] = n[0][2 * i + 1];
            c1[i] = cs[0][2 * i], c2[i] = cs[0][2 * i + 1];
            s1[i] = sn[0][2 * i], s2[i] = sn[0][2 * i + 1];
          }
          T y1[kPairs], y2[kPairs];
          rope_detail::rotate_pairs<T, kFp32Rotation>(x1, x2, c1, c2, s1, s2, y1, y2);
#pragma unroll
          for (int i = 0; i < kPairs; ++i) o[0][2 * i] = y1[i], o[0][2 * i + 1] = y2[i];
        }
#pragma unroll
        for (int j = 0; j < kUnitVecs; ++j) o[j].store(out[r] + at(u, j));
      }
    }
  }
}

template <typename Policy, QkNormRopeForm kForm, CosSinSource kSource, typename T, typename weight_t,
          typename table_t, int kVec, int kThreadsPerRow, int kRowCachedVecs, int kRows>
constexpr auto qk_norm_rope_kernel() {
  return kernel_entry_for<kNoRegisterCap, QkNormRopeParams<T, weight_t, table_t>,
                          qk_norm_rope_body<Policy, kForm, kSource, T, weight_t, table_t, kVec, kThreadsPerRow,
                                            kRowCachedVecs, kRows>>();
}

// Launches kKernel with a block of `threads` per group, or, where its registers do not allow that
// many threads, reports cudaErrorLaunchOutOfResources without a launch: the whole row stays in
// registers, so a block has the threads the row needs or none (the caller may take another form).
template <auto kKernel, typename Params>
cudaError_t block_per_group(const Params& p, dim3 grid, int threads, cudaStream_t stream) {
  if (threads > max_block_threads<kKernel>(kMaxBlockThreads)) return cudaErrorLaunchOutOfResources;
  launch_kernel(kKernel, grid, threads, 0, stream, p);
  return cudaGetLastError();
}

// How a row is scheduled: in a row group of `lanes` lanes (each holding Policy::kCachedVecs), the
// narrowest of Policy::RowGroups that holds it, so that no lane of a short row (one head) idles;
// else (lanes 0) a block of `threads` per row, each holding Policy::kBlockCachedVecs where the row
// fits (few_vecs), kCachedVecs beyond. The choice depends on the row alone, so every form
// splits a row the same way. Row groups are compiled for the 16-byte path only: misaligned views
// take a block per row (NOTES.md §Build size and instantiations).
struct QkNormRopeSchedule {
  int lanes;
  bool few_vecs;
  int threads;
};

template <typename Policy, QkNormRopeForm kForm, int kVec>
QkNormRopeSchedule qk_norm_rope_schedule(int width, bool row_groups) {
  constexpr int kCachedUnits = Policy::kCachedVecs / vecs_per_unit(kForm);
  constexpr int kBlockUnits = std::max(1, Policy::kBlockCachedVecs / vecs_per_unit(kForm));
  const int num_units = width / (kVec * vecs_per_unit(kForm));
  QkNormRopeSchedule s;
  s.lanes = row_groups ? row_group_lanes(typename Policy::RowGroups{}, num_units, kCachedUnits) : 0;
  s.few_vecs = warps_covering(num_units, kBlockUnits) <= kMaxBlockThreads;
  // at most kMaxBlockThreads with kCachedUnits: the binding checks the width (qk_norm_rope_max_width)
  s.threads = warps_covering(num_units, s.few_vecs ? kBlockUnits : kCachedUnits);
  return s;
}

// Vectors a thread of the block-per-row kernel of few vectors holds: Policy::kBlockCachedVecs in
// whole units.
template <typename Policy, QkNormRopeForm kForm>
constexpr int block_few_vecs() {
  return std::max(1, Policy::kBlockCachedVecs / vecs_per_unit(kForm)) * vecs_per_unit(kForm);
}

// Launches the kernels of one vector width for groups of kRows rows, as qk_norm_rope_schedule says.
template <typename Policy, QkNormRopeForm kForm, CosSinSource kSource, typename T, typename weight_t,
          typename table_t, int kVec, int kRows>
cudaError_t LaunchQkNormRope(const QkNormRopeParams<T, weight_t, table_t>& p, cudaStream_t stream) {
  constexpr bool kRowGroups = kVec == vec_size<T>();
  const QkNormRopeSchedule s = qk_norm_rope_schedule<Policy, kForm, kVec>(p.width, kRowGroups);
  const int64_t groups = p.qk.num_rows() / kRows;
  return with_row_group_lanes(typename Policy::RowGroups{}, s.lanes, [&](auto lanes_tag) {
    constexpr int kLanes = decltype(lanes_tag)::value;
    if constexpr (kRowGroups && kLanes > 0) {
      launch_kernel(
          qk_norm_rope_kernel<Policy, kForm, kSource, T, weight_t, table_t, kVec, kLanes, Policy::kCachedVecs, kRows>(),
          grid_for(groups, Policy::kGroupBlockThreads / kLanes), Policy::kGroupBlockThreads, 0, stream, p);
      return cudaGetLastError();
    } else {
      constexpr auto kFewVecs = qk_norm_rope_kernel<Policy, kForm, kSource, T, weight_t, table_t, kVec, 0,
                                                    block_few_vecs<Policy, kForm>(), kRows>();
      constexpr auto kAllVecs =
          qk_norm_rope_kernel<Policy, kForm, kSource, T, weight_t, table_t, kVec, 0, Policy::kCachedVecs, kRows>();
      return s.few_vecs ? block_per_group<kFewVecs>(p, grid_for(groups, 1), s.threads, stream)
                        : block_per_group<kAllVecs>(p, grid_for(groups, 1), s.threads, stream);
    }
  });
}

// q's and k's row of a token in one block (diffusers' table form, 16-byte path, one norm group
// each: LTX), its cos/sin loaded once for both, where the row takes a block of few vectors a
// thread (LTX's rows). cudaErrorLaunchOutOfResources where that does not apply, or where the
// kernel's registers do not allow the threads the row needs: the caller then takes one row a group
// (the same lanes and bits for each row).
template <typename Policy, QkNormRopeForm kForm, typename T, typename weight_t, typename table_t>
cudaError_t launch_shared_tables(const QkNormRopeParams<T, weight_t, table_t>& p, cudaStream_t stream) {
  constexpr int kVec = vec_size<T>();
  const QkNormRopeSchedule s = qk_norm_rope_schedule<Policy, kForm, kVec>(p.width, /*row_groups=*/true);
  if (s.lanes != 0 || !s.few_vecs) return cudaErrorLaunchOutOfResources;
  constexpr auto kKernel = qk_norm_rope_kernel<Policy, kForm, CosSinSource::kTables, T, weight_t, table_t, kVec, 0,
                                               block_few_vecs<Policy, kForm>(), 2>();
  return block_per_group<kKernel>(p, grid_for(p.qk.num_rows() / 2, 1), s.threads, stream);
}

}  // namespace qk_norm_rope_detail

// Rows hold at most this many elements of T (the whole row stays in registers): with 16-byte
// vectors, or with the form's narrowest vectors when pointers or strides do not allow 16 bytes.
template <QkNormRopeForm kForm, typename T, typename Policy = QkNormRopePolicy>
constexpr int64_t qk_norm_rope_max_width(bool vectorized) {
  return static_cast<int64_t>(qk_norm_rope_detail::max_row_vecs<Policy>()) *
         (vectorized ? vec_size<T>() : qk_norm_rope_detail::min_vec(kForm));
}

// True when every pointer and stride allows vectors of kElems elements and the row splits into
// whole units of them.
template <QkNormRopeForm kForm, CosSinSource kSource, int kElems, typename T, typename weight_t, typename table_t>
bool qk_norm_rope_aligned(const QkNormRopeParams<T, weight_t, table_t>& p) {
  const bool tables_ok = kSource == CosSinSource::kLtxCoords ||
                         (is_vec_aligned<table_t, kElems>(p.cos) && is_vec_aligned<table_t, kElems>(p.sin) &&
                          p.table_b % kElems == 0 && p.table_s % kElems == 0);
  return p.width % (kElems * qk_norm_rope_detail::vecs_per_unit(kForm)) == 0 && p.qk.template aligned<kElems>() &&
         is_vec_aligned<weight_t, kElems>(p.q_weight) && is_vec_aligned<weight_t, kElems>(p.k_weight) && tables_ok;
}

// Host launcher: 16-byte vectors when every pointer and stride allows it, else the form's
// narrowest vectors. The caller checks width (even, <= qk_norm_rope_max_width) and the narrow
// path's alignment (qk_norm_rope_aligned<kForm, kSource, min_vec>: whole pairs for interleaved
// pairs). Coordinate form: p.coords set, q and k one norm group each.
template <QkNormRopeForm kForm, CosSinSource kSource, typename Policy = QkNormRopePolicy, typename T,
          typename weight_t, typename table_t>
cudaError_t QkNormRope(const QkNormRopeParams<T, weight_t, table_t>& p, cudaStream_t stream) {
  if (p.qk.num_rows() == 0 || p.width == 0) return cudaSuccess;
  constexpr int kVec = vec_size<T>();
  constexpr int kMinVec = qk_norm_rope_detail::min_vec(kForm);
  using qk_norm_rope_detail::LaunchQkNormRope;
  // q's and k's row of a token in one group when each has one norm group: the coordinate form
  // computes the token's sines once (always); diffusers' table form loads its cos/sin rows once
  // (launch_shared_tables).
  constexpr int kCoordsRows = rows_per_group<Policy>(kSource);
  constexpr bool kCanShareTables =
      Policy::kShareTables && kSource == CosSinSource::kTables && kForm == QkNormRopeForm::kDiffusers;
  const bool vectorized = qk_norm_rope_aligned<kForm, kSource, kVec>(p);
  if constexpr (kCanShareTables) {
    if (vectorized && p.qk.num_q_heads == 1 && p.qk.num_k_heads == 1) {
      const cudaError_t err = qk_norm_rope_detail::launch_shared_tables<Policy, kForm>(p, stream);
      if (err != cudaErrorLaunchOutOfResources) return err;
    }
  }
  return vectorized ? LaunchQkNormRope<Policy, kForm, kSource, T, weight_t, table_t, kVec, kCoordsRows>(p, stream)
                    : LaunchQkNormRope<Policy, kForm, kSource, T, weight_t, table_t, kMinVec, kCoordsRows>(p, stream);
}

}  // namespace transformer_kernels
