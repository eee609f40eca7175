// Backward of the row norms and their fusions (rms_norm, fused_add_rms_norm, layer_norm,
// norm_modulate, gated_add_norm_modulate) and of gated_add. Torch-free: the kernels, their launch
// plan and host launchers.
//
// The forwards (norm.cuh), with their roundings taken as identities, as autograd of the eager code
// takes a cast:
//   h    = x | x + residual | x + gate * y                      (what is normalized)
//   xhat = (h - mean) * rstd,  rstd = rsqrt(var + eps)          (RMSNorm: mean 0, var = mean(h^2))
//   n    = xhat * w + b,  out = n * (1 + scale) + shift | n
// Backward of a row of N elements, from dout (the gradient of out) and dh_in (of the forward's h
// output, where it has one):
//   dn = dout * (1 + scale) | dout,   g = dn * w
//   dh = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dh_in   (mean(g) taken as 0 for RMSNorm)
//   dx = dh,  dy = dh * gate,  and over rows: dw = sum(dn * xhat), db = sum(dn),
//   dscale = sum(dout * n), dshift = sum(dout), dgate = sum(dh * y)
// gated_add (out = x + gate * y; NormType::kNone) is the last line alone with dh = dout.
// The statistics are recomputed from h: the backward reads h anyway, so they cost no traffic and
// the training forward is the inference kernel itself.
//
// Rows are handled by groups of threads, several groups per block; a block works through one
// item of consecutive rows (grad_reduce.cuh: RowItems) and keeps the parameter gradients' sums
// of its columns in registers, then writes one partial row per item; column_sums adds them up.
// Rows wider than a group can hold go in chunks of columns: a first kernel writes each chunk's
// statistics, the second combines a row's and finishes its chunk.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "common/float_type.h"
#include "common/kernel.cuh"
#include "common/math.cuh"
#include "common/reduce.cuh"
#include "common/rows.cuh"
#include "common/schedule.cuh"
#include "common/vec.cuh"
#include "common/grad_reduce.cuh"
#include "norm/norm_common.cuh"

namespace transformer_kernels {

// What a kernel may have to handle (a bit mask; whichever pointers are set at run time decide):
// the modulation (scale, shift), the gated pre-add's y and gate, the weight and bias. Each costs
// registers, so the whole-row kernels are compiled per combination the ops use.
enum NormBackwardFeature : int { kBackwardMod = 1, kBackwardGated = 2, kBackwardAffine = 4 };
constexpr int kBackwardAllFeatures = kBackwardMod | kBackwardGated | kBackwardAffine;

// Parameter gradients, in the order of NormBackwardParams' arrays.
enum ParamGrad : int { kGradWeight, kGradBias, kGradScale, kGradShift, kGradGate, kNumParamGrads };

// Row addressing of the whole-row kernels: row r starts at (r / segment) * stride. It covers rows
// of one stride (segment 1) and the broadcast parameters whose gradients reduce over segments
// ([hidden]: stride 0; [B, 1, hidden]: segment S), for row indices below kFastDivmodLimit, in one
// multiply-high: RowIndexer's general form costs these kernels ~30 registers (three or four of
// them live per row), so layouts it alone can address take the chunked kernels.
struct SegmentRows {
  FastDivmod segment;
  int64_t stride = 0;

  TK_DEVICE int64_t offset(int64_t row) const {
    return static_cast<int64_t>(segment.div(static_cast<uint32_t>(row))) * stride;
  }
};

// The SegmentRows form of `rows`, when it has one.
inline bool make_segment_rows(const RowIndexer& rows, int64_t num_rows, SegmentRows* out) {
  if (num_rows >= static_cast<int64_t>(kFastDivmodLimit)) return false;
  if (rows.ndim == 1) {
    *out = {FastDivmod(1), rows.strides[0]};
    return true;
  }
  if (rows.ndim == 2 && rows.strides[1] == 0 && rows.sizes[1] < static_cast<int64_t>(kFastDivmodLimit)) {
    *out = {FastDivmod(static_cast<uint32_t>(rows.sizes[1])), rows.strides[0]};
    return true;
  }
  return false;
}

template <typename T, typename weight_t, typename grad_t>
struct NormBackwardParams {
  const grad_t* dout;  // [rows..., hidden]: gradient of out (out's dtype)
  RowIndexer dout_rows;
  const T* dh_in = nullptr;  // [rows..., hidden]: gradient of the forward's h output, or none
  RowIndexer dh_in_rows;
  const T* h = nullptr;  // [rows..., hidden]: what was normalized (x, or the pre-add's h); kNone: unused
  RowIndexer h_rows;
  const weight_t* weight = nullptr;  // [hidden] contiguous, or none
  const weight_t* bias = nullptr;    // [hidden] contiguous, or none (LayerNorm)
  const T* scale = nullptr;          // [rows..., hidden] broadcast rows, or none (no modulation)
  RowIndexer scale_rows;
  const T* y = nullptr;  // [rows..., hidden]: the gated pre-add's branch output, or none
  RowIndexer y_rows;
  const T* gate = nullptr;  // [rows..., hidden] broadcast rows, or none (h = x + y)
  RowIndexer gate_rows;
  T* dh = nullptr;  // [rows, hidden] contiguous: gradient of h (x's, the residual's), or none
  T* dy = nullptr;  // [rows, hidden] contiguous: dh * gate, or none
  // A parameter's gradient is reduced (partials [items, hidden] summed by column_sums into
  // reduced [rows / reduced_segment_rows, hidden], weight_t for weight and bias, T otherwise),
  // written row by row (full [rows, hidden]: scale, shift, gate without broadcast; full_f32
  // [rows, hidden]: the rows of any other broadcast, which the caller sums in fp32 and rounds
  // once), or not wanted.
  float* partials[kNumParamGrads] = {};
  void* reduced[kNumParamGrads] = {};
  int64_t reduced_segment_rows[kNumParamGrads] = {};
  T* full[kNumParamGrads] = {};
  float* full_f32[kNumParamGrads] = {};
  int64_t num_rows;
  int64_t hidden;
  float eps;
  // Set by the plan (plan_norm_backward).
  RowItems items;
  int row_threads = 1;
  int chunks = 1;
  int chunk_elems = 0;
  float* chunk_stats = nullptr;  // [rows, chunks, ChunkStatFloats::kBackward] when chunks > 1 (kRms, kLayer)
  // The inputs' rows as SegmentRows (set by set_segment_rows; the whole-row kernels need them).
  bool segment_rows = false;
  SegmentRows dout_seg, dh_in_seg, h_seg, scale_seg, y_seg, gate_seg;
};

// Sets p.segment_rows and the inputs' SegmentRows where every input has that form.
template <typename T, typename W, typename G>
void set_segment_rows(NormBackwardParams<T, W, G>& p) {
  const int64_t n = p.num_rows;
  p.segment_rows = make_segment_rows(p.dout_rows, n, &p.dout_seg) &&
                   (p.dh_in == nullptr || make_segment_rows(p.dh_in_rows, n, &p.dh_in_seg)) &&
                   (p.h == nullptr || make_segment_rows(p.h_rows, n, &p.h_seg)) &&
                   (p.scale == nullptr || make_segment_rows(p.scale_rows, n, &p.scale_seg)) &&
                   (p.y == nullptr || make_segment_rows(p.y_rows, n, &p.y_seg)) &&
                   (p.gate == nullptr || make_segment_rows(p.gate_rows, n, &p.gate_seg));
}

namespace norm_backward_detail {

// The most dynamic shared memory a norm backward block uses: its largest block, kBackwardElems each.
constexpr size_t kPartialBytesBound =
    static_cast<size_t>(kBackwardMaxThreads) * partial_slot_stride(kBackwardElems) * sizeof(float);

template <typename T, typename weight_t, typename grad_t, NormType kNorm, int kFeatures, int kVec,
          RowPass kPass>
TK_DEVICE void norm_backward_body(const NormBackwardParams<T, weight_t, grad_t>& p) {
  constexpr int kVecs = kBackwardElems / kVec;  // vectors per thread
  constexpr bool kStats = kNorm != NormType::kNone;
  constexpr bool kLayer = kNorm == NormType::kLayer;
  constexpr bool kMod = (kFeatures & kBackwardMod) != 0;
  constexpr bool kGated = (kFeatures & kBackwardGated) != 0;
  constexpr bool kAffine = kStats && (kFeatures & kBackwardAffine) != 0;
  static_assert(kBackwardElems % kVec == 0, "a thread holds whole vectors");
  static_assert(kStats || kPass != RowPass::kChunkStats, "gated_add has no statistics");
  using vec = vec_t<T, kVec>;

  const int threads = p.row_threads;
  const int lane = threadIdx.x % threads;
  const int group = threadIdx.x / threads;
  const int groups = blockDim.x / threads;
  const int64_t item = blockIdx.x / p.chunks;
  const int chunk = static_cast<int>(blockIdx.x % p.chunks);
  const int64_t col0 = static_cast<int64_t>(chunk) * p.chunk_elems;
  // Column indices are 32-bit within a chunk (the binding caps a row below 2^31 elements).
  const int width = static_cast<int>(p.hidden - col0 < p.chunk_elems ? p.hidden - col0 : p.chunk_elems);
  const int num_vecs = width / kVec;
  int64_t first, last;
  p.items.rows_of(item, first, last);
  auto vec_of = [&](int k) { return lane + k * threads; };  // this thread's k-th vector of the chunk
  // Row starts: SegmentRows in the whole-row kernels, RowIndexer in the chunked ones.
  constexpr bool kSeg = kPass == RowPass::kWholeRow;
  auto at_row = [](const SegmentRows& seg, const RowIndexer& rows, int64_t row) {
    if constexpr (kSeg) return seg.offset(row); else return rows.offset(row);
  };

  // The weight (and, modulated, the bias that n needs) of this thread's columns, once.
  float w[kVecs][kVec], b[kVecs][kVec];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) w[k][i] = 1.f, b[k][i] = 0.f;
    if (vec_of(k) >= num_vecs) continue;
    const int64_t c = col0 + vec_of(k) * kVec;
    if constexpr (kAffine) {
      vec_t<weight_t, kVec> v;
      if (p.weight != nullptr) v.load(p.weight + c), v.cast_to(w[k]);
      if (kLayer && kMod && p.bias != nullptr) v.load(p.bias + c), v.cast_to(b[k]);
    }
  }
  const bool want_w = kAffine && p.partials[kGradWeight] != nullptr;
  const bool want_b = kAffine && kLayer && p.partials[kGradBias] != nullptr;
  // Running sums of the reduced gradients over the item's rows, for this thread's columns.
  float acc_w[kVecs][kVec] = {}, acc_b[kVecs][kVec] = {}, acc_scale[kVecs][kVec] = {}, acc_shift[kVecs][kVec] = {},
        acc_gate[kVecs][kVec] = {};

  // Every group takes the same number of steps; a group past the item's rows (all its threads
  // share one row) only joins its own barriers.
  const int64_t steps = first < last ? (last - first + groups - 1) / groups : 0;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t row = first + step * groups + group;
    const bool active = row < last;
    const int64_t r = active ? row : first;  // a valid row for address arithmetic
    const grad_t* dout = p.dout + at_row(p.dout_seg, p.dout_rows, r) + col0;
    const T* h = kStats ? p.h + at_row(p.h_seg, p.h_rows, r) + col0 : nullptr;
    const T* scale = kMod && p.scale != nullptr ? p.scale + at_row(p.scale_seg, p.scale_rows, r) + col0 : nullptr;

    // The row's inputs stay as loaded (T: half the registers of fp32) and are widened where used.
    vec h_raw[kVecs], scale_raw[kVecs];
    vec_t<grad_t, kVec> go_raw[kVecs];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      h_raw[k] = scale_raw[k] = filled<T, kVec>(from_float<T>(0.f));
      go_raw[k] = filled<grad_t, kVec>(from_float<grad_t>(0.f));
      if (!active || vec_of(k) >= num_vecs) continue;
      const int c = vec_of(k) * kVec;
      go_raw[k].load(dout + c);
      if constexpr (kStats) h_raw[k].load(h + c);
      if (scale != nullptr) scale_raw[k].load(scale + c);
    }
    auto hv = [&](int k, int i) { return to_float(h_raw[k][i]); };
    auto go = [&](int k, int i) { return to_float(go_raw[k][i]); };
    // dn, the gradient of the norm's output: dout * (1 + scale) (scale 0 where there is none)
    auto dn = [&](int k, int i) { return kMod ? go(k, i) * (1.f + to_float(scale_raw[k][i])) : go(k, i); };
    // g = dn * w, rounded once (no FMA contraction): the same value in mean(g) and in dh, whose
    // difference is then exact (0 for a row of one element, as LayerNorm's true gradient is).
    auto gw = [&](int k, int i) { return __fmul_rn(dn(k, i), w[k][i]); };

    // The row's statistics: rstd, mean (LayerNorm), mean(g) (LayerNorm) and c = mean(g * xhat).
    float mean = 0.f, rstd = 1.f, mean_g = 0.f, c_gx = 0.f;
    if constexpr (kStats) {
      const float inv_n = 1.f / static_cast<float>(kPass == RowPass::kChunkStats ? width : p.hidden);
      float* row_stats = kPass != RowPass::kWholeRow
                             ? p.chunk_stats + r * p.chunks * ChunkStatFloats::kBackward
                             : nullptr;
      if constexpr (kPass == RowPass::kChunkFromStats) {
        // Combined in chunk order (the same bits in every block of the row); LayerNorm's (count,
        // mean, M2) by Chan et al.'s pairwise update, its g sums moved to the row's mean.
        float s_hh = 0.f, s_gx = 0.f, count = 0.f, m2 = 0.f, s_g = 0.f;
        for (int ch = 0; ch < p.chunks; ++ch) {
          const float* s = row_stats + ch * ChunkStatFloats::kBackward;
          if constexpr (kLayer) {
            const float n = count + s[0], delta = s[1] - mean;
            mean += delta * (s[0] / n);
            // No cross term into an empty accumulator: delta^2 may overflow (a row of 1e20s), and inf * 0
            // would make the row NaN where its variance is merely inf (rstd 0, as one block gives).
            m2 += s[2] + (count > 0.f ? delta * delta * (count * s[0] / n) : 0.f);
            count = n;
          } else {
            s_hh += s[0];
            s_gx += s[1];
          }
        }
        if constexpr (kLayer) {
          for (int ch = 0; ch < p.chunks; ++ch) {
            const float* s = row_stats + ch * ChunkStatFloats::kBackward;
            s_g += s[3];
            s_gx += s[4] + (s[1] - mean) * s[3];
          }
          rstd = rsqrtf(m2 * inv_n + p.eps);
          mean_g = s_g * inv_n;
        } else {
          rstd = rsqrtf(s_hh * inv_n + p.eps);
        }
        c_gx = s_gx * rstd * inv_n;
      } else {
        float* chunk_stats = kPass == RowPass::kChunkStats ? row_stats + chunk * ChunkStatFloats::kBackward : nullptr;
        if constexpr (!kLayer) {
          float s[2] = {0.f, 0.f};  // sum h^2, sum g h
#pragma unroll
          for (int k = 0; k < kVecs; ++k) {
#pragma unroll
            for (int i = 0; i < kVec; ++i) {
              s[0] += hv(k, i) * hv(k, i);
              s[1] += gw(k, i) * hv(k, i);
            }
          }
          row_group_sum(s, threads);
          if constexpr (kPass == RowPass::kChunkStats) {
            if (active && lane == 0) chunk_stats[0] = s[0], chunk_stats[1] = s[1];
            continue;
          }
          rstd = rsqrtf(s[0] * inv_n + p.eps);
          c_gx = s[1] * rstd * inv_n;
        } else {
          // Two passes over the held values, as the forward: the mean, then the sums around it.
          float s1[1] = {0.f};
#pragma unroll
          for (int k = 0; k < kVecs; ++k) {
#pragma unroll
            for (int i = 0; i < kVec; ++i) s1[0] += hv(k, i);
          }
          row_group_sum(s1, threads);
          mean = s1[0] * inv_n;
          float s[3] = {0.f, 0.f, 0.f};  // M2, sum g, sum g (h - mean)
#pragma unroll
          for (int k = 0; k < kVecs; ++k) {
            if (vec_of(k) >= num_vecs) continue;  // idle slots hold h = 0, not the mean
#pragma unroll
            for (int i = 0; i < kVec; ++i) {
              const float d = hv(k, i) - mean, g = gw(k, i);
              s[0] += d * d;
              s[1] += g;
              s[2] += g * d;
            }
          }
          row_group_sum(s, threads);
          if constexpr (kPass == RowPass::kChunkStats) {
            if (active && lane == 0) {
              chunk_stats[0] = static_cast<float>(width);
              chunk_stats[1] = mean, chunk_stats[2] = s[0], chunk_stats[3] = s[1], chunk_stats[4] = s[2];
            }
            continue;
          }
          rstd = rsqrtf(s[0] * inv_n + p.eps);
          mean_g = s[1] * inv_n;
          c_gx = s[2] * rstd * inv_n;
        }
      }
    }
    if (!active) continue;

    const int64_t out_row = row * p.hidden + col0;  // the contiguous outputs
    const T* dh_in = p.dh_in != nullptr ? p.dh_in + at_row(p.dh_in_seg, p.dh_in_rows, row) + col0 : nullptr;
    const T* y = kGated && p.y != nullptr ? p.y + at_row(p.y_seg, p.y_rows, row) + col0 : nullptr;
    const T* gate = kGated && p.gate != nullptr ? p.gate + at_row(p.gate_seg, p.gate_rows, row) + col0 : nullptr;
    auto store = [](T* dst, const float (&v)[kVec]) {
      vec o;
      o.cast_from(v);
      o.store(dst);
    };
    auto wants_full = [&](int which) { return p.full[which] != nullptr || p.full_f32[which] != nullptr; };
    // Column c of this row of a row-by-row gradient, in T or (full_f32) in fp32.
    auto store_full = [&](int which, int c, const float (&v)[kVec]) {
      if (p.full[which] != nullptr) {
        store(p.full[which] + out_row + c, v);
      } else {
        vec_t<float, kVec> o;
#pragma unroll
        for (int i = 0; i < kVec; ++i) o[i] = v[i];
        o.store(p.full_f32[which] + out_row + c);
      }
    };
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (vec_of(k) >= num_vecs) continue;
      const int c = vec_of(k) * kVec;
      float dh[kVec], ds[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if constexpr (kStats) {
          const float xhat = (hv(k, i) - mean) * rstd, d = dn(k, i);
          dh[i] = rstd * (gw(k, i) - mean_g - xhat * c_gx);
          if (want_w) acc_w[k][i] += d * xhat;
          if (want_b) acc_b[k][i] += d;
          ds[i] = go(k, i) * (xhat * w[k][i] + b[k][i]);
        } else {
          dh[i] = go(k, i);
        }
      }
      if constexpr (kMod) {
        if (wants_full(kGradScale)) {
          store_full(kGradScale, c, ds);
        } else if (p.partials[kGradScale] != nullptr) {
#pragma unroll
          for (int i = 0; i < kVec; ++i) acc_scale[k][i] += ds[i];
        }
        if (wants_full(kGradShift)) {
          float g[kVec];
#pragma unroll
          for (int i = 0; i < kVec; ++i) g[i] = go(k, i);
          store_full(kGradShift, c, g);
        } else if (p.partials[kGradShift] != nullptr) {
#pragma unroll
          for (int i = 0; i < kVec; ++i) acc_shift[k][i] += go(k, i);
        }
      }
      if (dh_in != nullptr) {
        vec v;
        v.load(dh_in + c);
        float e[kVec];
        v.cast_to(e);
#pragma unroll
        for (int i = 0; i < kVec; ++i) dh[i] += e[i];
      }
      if (p.dh != nullptr) store(p.dh + out_row + c, dh);
      if constexpr (kGated) {
        if (gate != nullptr) {
          if (p.dy != nullptr) {
            vec gv;
            gv.load(gate + c);
            float gt[kVec], d[kVec];
            gv.cast_to(gt);
#pragma unroll
            for (int i = 0; i < kVec; ++i) d[i] = dh[i] * gt[i];
            store(p.dy + out_row + c, d);
          }
          if (wants_full(kGradGate) || p.partials[kGradGate] != nullptr) {
            vec yv;
            yv.load(y + c);
            float yf[kVec], d[kVec];
            yv.cast_to(yf);
#pragma unroll
            for (int i = 0; i < kVec; ++i) d[i] = dh[i] * yf[i];
            if (wants_full(kGradGate)) {
              store_full(kGradGate, c, d);
            } else {
#pragma unroll
              for (int i = 0; i < kVec; ++i) acc_gate[k][i] += d[i];
            }
          }
        }
      }
    }
  }
  if constexpr (kPass == RowPass::kChunkStats) return;

  // The item's partial sums, one workspace row per gradient (uniform branches: barriers inside).
  auto slot_of = [threads](int col, int& slot_lane, int& e) {
    const int v = col / kVec;
    slot_lane = v % threads;
    e = v / threads * kVec + col % kVec;
  };
  auto flush = [&](int which, const float (&acc)[kVecs][kVec]) {
    if (p.partials[which] == nullptr) return;
    float flat[kBackwardElems];
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) flat[k * kVec + i] = acc[k][i];
    }
    store_block_partials(flat, p.partials[which] + item * p.hidden + col0, width, threads, slot_of);
  };
  if constexpr (kAffine) flush(kGradWeight, acc_w);
  if constexpr (kAffine && kLayer) flush(kGradBias, acc_b);
  if constexpr (kMod) {
    flush(kGradScale, acc_scale);
    flush(kGradShift, acc_shift);
  }
  if constexpr (kGated) flush(kGradGate, acc_gate);
}

template <typename T, typename weight_t, typename grad_t, NormType kNorm, int kFeatures, int kVec,
          RowPass kPass>
constexpr auto norm_backward_kernel() {
  return kernel_entry_for<kNoRegisterCap, NormBackwardParams<T, weight_t, grad_t>,
                          norm_backward_body<T, weight_t, grad_t, kNorm, kFeatures, kVec, kPass>>();
}

template <typename T, typename W, typename G>
bool vectorizable(const NormBackwardParams<T, W, G>& p, int vec) {
  auto ok = [&](const void* ptr, int elem_bytes, const RowIndexer* rows) {
    if (ptr == nullptr) return true;
    const int bytes = vec * elem_bytes;
    return reinterpret_cast<uintptr_t>(ptr) % (bytes < kVecBytes ? bytes : kVecBytes) == 0 &&
           (rows == nullptr || rows->rows_aligned_to(vec));
  };
  bool full_ok = true;
  for (int i = 0; i < kNumParamGrads; ++i)
    full_ok = full_ok && ok(p.full[i], sizeof(T), nullptr) && ok(p.full_f32[i], sizeof(float), nullptr);
  return p.hidden % vec == 0 && ok(p.dout, sizeof(G), &p.dout_rows) && ok(p.dh_in, sizeof(T), &p.dh_in_rows) &&
         ok(p.h, sizeof(T), &p.h_rows) && ok(p.weight, sizeof(W), nullptr) && ok(p.bias, sizeof(W), nullptr) &&
         ok(p.scale, sizeof(T), &p.scale_rows) &&
         ok(p.y, sizeof(T), &p.y_rows) && ok(p.gate, sizeof(T), &p.gate_rows) && ok(p.dh, sizeof(T), nullptr) &&
         ok(p.dy, sizeof(T), nullptr) && full_ok;
}

// The segment length of the items: the shortest of the reduced gradients' (all of them divide
// the others: each is the product of x's trailing leading dimensions from the parameter's first
// broadcast one), or all rows.
template <typename T, typename W, typename G>
int64_t items_segment_rows(const NormBackwardParams<T, W, G>& p) {
  int64_t rows = p.num_rows;
  for (int i = 0; i < kNumParamGrads; ++i)
    if (p.partials[i] != nullptr || p.reduced[i] != nullptr) rows = std::min(rows, p.reduced_segment_rows[i]);
  return std::max<int64_t>(1, rows);
}

}  // namespace norm_backward_detail

// How a launch covers the rows: vector width, block size, the kernels (whole rows, or chunked:
// RowIndexer addressing and, for the norms, a statistics pass first) and the items.
struct NormBackwardPlan {
  bool vectorized = false;
  bool chunked = false;
  int block_threads = 0;
  size_t shared_bytes = 0;
  int64_t items = 0;
};

// Plans the launch of the (kNorm, kFeatures) kernels for p: sets p.row_threads, chunks,
// chunk_elems and items. kWholeRows: the whole-row kernel, false (nothing planned) when the rows
// lack the SegmentRows form (set_segment_rows) or 16-byte vectors, or need more threads than its
// registers allow; then plan the chunked form (with kBackwardAllFeatures for the norms), which
// takes any layout. The whole-row kernels exist for 16-byte vectors only: model widths are
// multiples of 8, and the element-by-element forms of every variant would double the binary.
// sm_count: the device's. The caller then allocates p.partials (plan.items rows each) and
// p.chunk_stats.
template <NormType kNorm, int kFeatures, bool kWholeRows, typename T, typename W, typename G>
bool plan_norm_backward(NormBackwardParams<T, W, G>& p, int sm_count, NormBackwardPlan* plan) {
  using namespace norm_backward_detail;
  constexpr int kVec = vec_size<T>();
  constexpr RowPass kMainPass = kWholeRows ? RowPass::kWholeRow : RowPass::kChunkFromStats;
  constexpr auto kVecKernel = norm_backward_kernel<T, W, G, kNorm, kFeatures, kVec, kMainPass>();
  plan->vectorized = vectorizable(p, kVec);
  plan->chunked = !kWholeRows;
  if (kWholeRows && !(p.segment_rows && plan->vectorized)) return false;
  const int vec = plan->vectorized ? kVec : 1;
  const int vecs_per_thread = kBackwardElems / vec;
  auto max_threads = [&] {
    if constexpr (kWholeRows) {
      return max_block_threads<kVecKernel>(kBackwardBlockThreads);
    } else {
      constexpr auto kScalarKernel = norm_backward_kernel<T, W, G, kNorm, kFeatures, 1, kMainPass>();
      return plan->vectorized ? max_block_threads<kVecKernel>(kBackwardBlockThreads)
                              : max_block_threads<kScalarKernel>(kBackwardBlockThreads);
    }
  };
  auto target_blocks = [&] {
    if constexpr (kWholeRows) {
      return backward_target_blocks<kVecKernel>(plan->block_threads, plan->shared_bytes, sm_count);
    } else {
      constexpr auto kScalarKernel = norm_backward_kernel<T, W, G, kNorm, kFeatures, 1, kMainPass>();
      return plan->vectorized ? backward_target_blocks<kVecKernel>(plan->block_threads, plan->shared_bytes, sm_count)
                              : backward_target_blocks<kScalarKernel>(plan->block_threads, plan->shared_bytes,
                                                                      sm_count);
    }
  };
  auto in_chunks_of = [&](int64_t elems) {
    p.chunk_elems = static_cast<int>(elems);
    p.chunks = static_cast<int>((p.hidden + elems - 1) / elems);
    p.row_threads = backward_row_threads(elems / vec, vecs_per_thread);
  };
  in_chunks_of(p.hidden);
  if (p.row_threads > max_threads()) {
    // Statistics need the whole row in one group: the norms take the chunked kernels; gated_add
    // has none, so its rows simply go in chunks of columns.
    if (kWholeRows && kNorm != NormType::kNone) return false;
    in_chunks_of(kBackwardChunkElems);
  }
  plan->block_threads = backward_block_threads(p.row_threads);
  plan->shared_bytes = backward_shared_bytes(plan->block_threads, kBackwardElems);
  static_assert(kPartialBytesBound <= kBackwardMaxSharedBytes, "the partial sums fit without opting in");
  p.items = backward_items(p.num_rows, items_segment_rows(p), std::max<int64_t>(1, target_blocks() / p.chunks),
                           plan->block_threads / p.row_threads);
  plan->items = p.items.count(p.num_rows);
  return true;
}

// Launches the planned kernels (kWholeRows: as plan_norm_backward<..., kWholeRows> planned them),
// then the column sums of the reduced gradients. p as planned, with its workspaces. Rows and
// hidden > 0.
template <NormType kNorm, int kFeatures, bool kWholeRows, typename T, typename W, typename G>
cudaError_t norm_backward(const NormBackwardParams<T, W, G>& p, const NormBackwardPlan& plan, cudaStream_t stream) {
  using namespace norm_backward_detail;
  constexpr int kVec = vec_size<T>();
  if (plan.chunked == kWholeRows) return cudaErrorInvalidValue;  // planned for the other form
  const dim3 grid(static_cast<unsigned>(plan.items * p.chunks));
  auto go = [&](auto kernel) { launch_kernel(kernel, grid, plan.block_threads, plan.shared_bytes, stream, p); };
  if constexpr (kWholeRows) {
    go(norm_backward_kernel<T, W, G, kNorm, kFeatures, kVec, RowPass::kWholeRow>());
  } else {
    if constexpr (kNorm != NormType::kNone) {
      plan.vectorized ? go(norm_backward_kernel<T, W, G, kNorm, kFeatures, kVec, RowPass::kChunkStats>())
                      : go(norm_backward_kernel<T, W, G, kNorm, kFeatures, 1, RowPass::kChunkStats>());
    }
    plan.vectorized ? go(norm_backward_kernel<T, W, G, kNorm, kFeatures, kVec, RowPass::kChunkFromStats>())
                    : go(norm_backward_kernel<T, W, G, kNorm, kFeatures, 1, RowPass::kChunkFromStats>());
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  // Column sums: weight and bias in the weight's dtype, the modulation's and the gate's in T.
  ColumnSumParams<W> weights;
  ColumnSumParams<T> others;
  weights.hidden = others.hidden = p.hidden;
  for (int i = 0; i < kNumParamGrads; ++i) {
    if (p.partials[i] == nullptr) continue;
    const int64_t segment = p.reduced_segment_rows[i];
    const int64_t per_row = segment / p.items.segment_rows * p.items.splits;
    if (i == kGradWeight || i == kGradBias) {
      weights.sums[weights.num_sums++] = {p.partials[i], static_cast<W*>(p.reduced[i]), per_row, p.num_rows / segment};
    } else {
      others.sums[others.num_sums++] = {p.partials[i], static_cast<T*>(p.reduced[i]), per_row, p.num_rows / segment};
    }
  }
  err = column_sums(weights, stream);
  return err != cudaSuccess ? err : column_sums(others, stream);
}

// A backward with the pointers' types erased and the types that give them back: what the binding
// fills for the planners and launchers compiled in backward/ (norm_backward_instances.cuh).
struct NormBackwardLaunch {
  FloatType x_type;       // T: h, dh_in, scale, y, gate, dh, dy and the full-row gradients
  FloatType weight_type;  // weight and bias (x's where there are none)
  FloatType grad_type;    // dout
  NormBackwardParams<void, void, void> params;
};

// One compiled (norm, features, whole rows or chunked) combination, for a NormBackwardLaunch of
// any dtypes it serves (others: cudaErrorNotSupported). backward/*.cu register theirs; the binding
// finds them by key.
struct NormBackwardVariant {
  std::tuple<NormType, int, bool> key;  // the norm, its features (kBackward*), whole rows
  // plan_norm_backward into l.params and *plan; *fits false: the whole-row kernel cannot take the rows.
  cudaError_t (*plan)(NormBackwardLaunch& l, int sm_count, NormBackwardPlan* plan, bool* fits);
  // norm_backward as planned, l's workspaces allocated.
  cudaError_t (*launch)(const NormBackwardLaunch& l, const NormBackwardPlan& plan, cudaStream_t stream);
};

}  // namespace transformer_kernels
