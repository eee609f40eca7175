// Row normalization over the last dimension, with the fusions diffusion and language
// transformers use around it: the parameters and the device code. Torch-free; the host launcher
// is norm.cuh.
//
//   h   = x                        (PreAdd::kNone)
//       | round(x + residual)      (PreAdd::kResidual: LLM decoder layers, vLLM fused_add_rms_norm)
//       | round(x + round(gate*y)) (PreAdd::kGated: DiT blocks, y the attention/MLP branch output)
//   n   = RMSNorm(h) with the replaced module's rounding, or LayerNorm(h) computed in fp32
//   out = n                        (no modulation)
//       | round(round(round(n) * round(1 + scale)) + shift)   (AdaLN modulation, eager rounding)
//   FP8 output (out_t uint8_t): out in x's dtype as above, then per-row e4m3 codes and the row's scale
//       (common/fp8.cuh), the same bits as quantize_fp8 of the 16-bit output: the next GEMM's input.
//
// Rounding steps reproduce the eager PyTorch code op by op (each bf16/fp16 op rounds its result);
// for float32 tensors they are no-ops. h is written to h_out when given (the new residual).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <tuple>
#include <type_traits>

#include "common/float_type.h"
#include "common/fp8.cuh"
#include "common/math.cuh"
#include "common/reduce.cuh"
#include "common/rows.cuh"
#include "common/schedule.cuh"
#include "common/vec.cuh"
#include "norm/norm_common.cuh"
#include "norm/norm_policy.cuh"

namespace transformer_kernels {

enum class PreAdd { kNone, kResidual, kGated };

template <typename T, typename weight_t, typename out_t>
struct NormParams {
  const T* x;  // [rows..., hidden]
  RowIndexer x_rows;
  const T* residual = nullptr;  // [rows..., hidden]: the residual (kResidual) or the branch output y (kGated)
  RowIndexer residual_rows;
  const T* gate = nullptr;  // [rows..., hidden], any broadcast (stride-0) rows: kGated only
  RowIndexer gate_rows;
  const weight_t* weight = nullptr;  // [hidden] contiguous, or none
  const weight_t* bias = nullptr;    // [hidden] contiguous, or none (LayerNorm)
  const T* scale = nullptr;          // [rows..., hidden] broadcast rows, or none (no modulation)
  RowIndexer scale_rows;
  const T* shift = nullptr;  // [rows..., hidden] broadcast rows, or none
  RowIndexer shift_rows;
  out_t* out;  // [rows..., hidden]
  RowIndexer out_rows;
  T* h_out = nullptr;  // [rows..., hidden] pre-norm sum, or none
  RowIndexer h_rows;
  int64_t num_rows;
  int64_t hidden;
  float eps;
  // RMSNorm: round h * inv_rms to T before the weight multiply (HF transformers, diffusers).
  bool round_normalized = false;
  // Split rows (norm_split_chunks > 1): each row's chunks of split_chunk_elems columns, and their
  // statistics [num_rows, split_chunks, ChunkStatFloats::kForward] (count, sum of squares or mean, M2).
  int split_chunks = 1;
  int split_chunk_elems = 0;
  float* split_stats = nullptr;
  // FP8 output (out_t uint8_t, `out` the e4m3 codes): [num_rows] contiguous, each row's scale.
  float* out_scale = nullptr;
};

static_assert(NormPolicy::kSplitChunkElems % 8 == 0, "chunks start on a vector of every dtype");

// A launch with the pointers' types erased and the types that give them back: what a binding fills
// for the launchers compiled in instances/ (norm_instances.cuh).
struct NormLaunch {
  FloatType x_type;       // T: x, residual, gate, scale, shift, h_out
  FloatType weight_type;  // weight and bias
  FloatType out_type;  // ignored with an FP8 output (its values are in x's dtype before quantization)
  NormParams<void, void, void> params;
};

// One compiled (norm, pre-add, modulation, FP8 output) combination: its launcher for a NormLaunch of any dtypes
// it serves (norm_instances.cuh). instances/*.cu register theirs; the binding finds them by key.
struct NormVariant {
  std::tuple<NormType, PreAdd, bool, bool> key;  // the norm, the pre-add, modulated, FP8 output
  cudaError_t (*launch)(const NormLaunch&, cudaStream_t);
};

// What a norm kernel computes: x's dtype T, the weight's and the output's (uint8_t: e4m3 codes of
// values in T, and their row scales), the norm, the pre-add and the modulation (kMod: AdaLN scale,
// optional shift); and the policy it is compiled with.
// Features an op does not use are compiled out (bias for RMSNorm, h_out without a pre-add, the
// modulation): each costs registers, and fewer registers keep more rows in flight per SM.
template <typename Policy, typename T, typename weight_t, typename out_t, NormType kNorm, PreAdd kPre, bool kMod>
struct NormOp {
  using policy = Policy;
  using x_type = T;
  using weight_type = weight_t;
  using out_type = out_t;
  static constexpr bool kFp8Out = std::is_same_v<out_t, uint8_t>;
  // The output's values before they are stored: quantized outputs are x's dtype first.
  using value_type = std::conditional_t<kFp8Out, T, out_t>;
  using Params = NormParams<T, weight_t, out_t>;
  static constexpr NormType kType = kNorm;
  static constexpr PreAdd kPreAdd = kPre;
  static constexpr bool kModulated = kMod;
  static constexpr bool kFused = kPre != PreAdd::kNone || kMod;
  static_assert(kNorm != NormType::kNone, "the forward normalizes (gated_add alone is the elementwise kernel)");
  // Vectors each thread keeps in registers: fused norms have their own count; unfused ones one
  // for row groups and one for a block per row.
  template <int kThreadsPerRow>
  static constexpr int cached_vecs() {
    return kFused ? Policy::kFusedCachedVecs : (kThreadsPerRow == 0 ? Policy::kBlockCachedVecs : Policy::kCachedVecs);
  }
};

namespace norm_detail {

// The row (or, split, the chunk of a row) a row group works on, and how it reads h, the pre-norm
// sum, from it. The passes over the row are its members (all inlined into norm_body):
//   load_and_sum   pass 1: h, kept in registers (`cached`) and stored to h_out, and its sum or sum
//                  of squares;
//   statistics     the row's mean and 1/std (LayerNorm: a second pass for the variance), or a
//                  split row's chunk statistics;
//   store          the last pass: normalize, affine, modulation, store.
// What changes across the passes (the cached vectors, the statistics) stays in norm_body's locals.
template <typename Op, int kVec, int kThreadsPerRow, RowPass kPass>
struct NormRow {
  using T = typename Op::x_type;
  using weight_t = typename Op::weight_type;
  using out_t = typename Op::out_type;
  using value_t = typename Op::value_type;
  using vec = vec_t<T, kVec>;
  static constexpr NormType kNorm = Op::kType;
  static constexpr PreAdd kPre = Op::kPreAdd;
  static constexpr bool kMod = Op::kModulated;
  static constexpr bool kFp8Out = Op::kFp8Out;
  static constexpr int kCachedVecs = Op::template cached_vecs<kThreadsPerRow>();
  static constexpr bool kSplit = kPass != RowPass::kWholeRow;
  static constexpr bool kFromStats = kPass == RowPass::kChunkFromStats;
  static_assert(!kSplit || kThreadsPerRow == 0, "a split row's chunk takes a whole block");
  static_assert(!kFp8Out || !kSplit, "a quantized row's scale needs the whole row in one row group");
  using Cached = vec[kCachedVecs];

  const typename Op::Params& p;
  int lane, threads;
  unsigned lanes_with_rows;  // what the shuffles of the row's reduction may name
  int64_t row;
  // A split row's block works on columns [col0, col0 + hidden) as if they were a row of their own.
  int64_t col0;
  const T* x;
  out_t* out;
  const T* res;
  const T* gate;
  T* h_out;
  // Column indices are 32-bit (the binding caps a row below 2^31 elements): 64-bit ones cost two
  // or three integer instructions per address, and these kernels issue more integer than float work.
  int hidden;
  int num_vecs;
  int tail_col;
  // The tail (< kVec <= 8 elements, one a lane): never on the launcher's paths (norm.cuh's vectorizable
  // takes whole vectors only; the scalar path has no tail), kept so that the kernels' code is unchanged.
  bool has_tail;

  TK_DEVICE NormRow(const typename Op::Params& params, const RowGroup<kThreadsPerRow>& group, int64_t row_)
      : p(params), lane(group.lane), threads(group.threads), lanes_with_rows(group.mask), row(row_) {
    col0 = kSplit ? static_cast<int64_t>(blockIdx.x) * p.split_chunk_elems : 0;
    x = p.x + p.x_rows.offset(row) + col0;
    out = p.out + p.out_rows.offset(row) + col0;
    res = kPre != PreAdd::kNone ? p.residual + p.residual_rows.offset(row) + col0 : nullptr;
    gate = kPre == PreAdd::kGated ? p.gate + p.gate_rows.offset(row) + col0 : nullptr;
    h_out = kPre != PreAdd::kNone && p.h_out != nullptr ? p.h_out + p.h_rows.offset(row) + col0 : nullptr;
    hidden = kSplit ? static_cast<int>(p.hidden - col0 < p.split_chunk_elems ? p.hidden - col0 : p.split_chunk_elems)
                    : static_cast<int>(p.hidden);
    num_vecs = hidden / kVec;
    tail_col = num_vecs * kVec + lane;
    has_tail = tail_col < hidden;
  }

  // h of N elements from x, the residual (or y) and the gate, each op rounded to T as the eager
  // code rounds it (packed T arithmetic: the same bits, vec.cuh).
  template <typename V>
  static TK_DEVICE V pre_add(const V& xv, const V& rv, const V& gv) {
    if constexpr (kPre == PreAdd::kGated) return add_rn(xv, mul_rn(gv, rv));
    else return add_rn(xv, rv);
  }
  // h of the tail element.
  TK_DEVICE float h_scalar(int col) const {
    vec_t<T, 1> xv, rv, gv;
    xv[0] = x[col];
    if constexpr (kPre == PreAdd::kNone) return to_float(xv[0]);
    rv[0] = res[col];
    if constexpr (kPre == PreAdd::kGated) gv[0] = gate[col];
    return to_float(pre_add(xv, rv, gv)[0]);
  }
  // Loads vector v of h. Once pass 1 has stored h (h_out), later passes read it back from there:
  // x and residual may be the outputs of an in-place call and already overwritten.
  TK_DEVICE vec load_h(int v, bool stored) const {
    vec h;
    if (kPre == PreAdd::kNone || (stored && h_out != nullptr)) {
      h.load((kPre == PreAdd::kNone ? x : h_out) + v * kVec);
      return h;
    }
    vec xv, rv, gv;
    xv.load(x + v * kVec);
    rv.load(res + v * kVec);
    if constexpr (kPre == PreAdd::kGated) gv.load(gate + v * kVec);
    return pre_add(xv, rv, gv);
  }

  // Pass 1: h into `cached` (each thread's first kCachedVecs vectors) and tail_h, stored to h_out
  // when asked; returns the sum (or sum of squares) of the row's h, reduced over its threads. A
  // chunk normalized from its row's statistics reads h back as stored by the first kernel, and
  // sums nothing.
  TK_DEVICE float load_and_sum(Cached& cached, float& tail_h) const {
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      const int v = lane + k * threads;
      if (v < num_vecs) cached[k] = load_h(v, kFromStats);
    }
    tail_h = !has_tail ? 0.f : kFromStats && h_out != nullptr ? to_float(h_out[tail_col]) : h_scalar(tail_col);
    if (!kFromStats && h_out != nullptr) {
#pragma unroll
      for (int k = 0; k < kCachedVecs; ++k) {
        const int v = lane + k * threads;
        if (v < num_vecs) cached[k].store(h_out + v * kVec);
      }
      if (has_tail) h_out[tail_col] = from_float<T>(tail_h);
    }
    auto stat_term = [](float h) { return kNorm == NormType::kRms ? h * h : h; };
    float acc = has_tail ? stat_term(tail_h) : 0.f;
    if constexpr (!kFromStats) {
#pragma unroll
      for (int k = 0; k < kCachedVecs; ++k) {
        const int v = lane + k * threads;
        if (v < num_vecs) {
#pragma unroll
          for (int i = 0; i < kVec; ++i) acc += stat_term(to_float(cached[k][i]));
        }
      }
      for (int v = lane + kCachedVecs * threads; v < num_vecs; v += threads) {
        const vec h = load_h(v, false);
        if (h_out != nullptr) h.store(h_out + v * kVec);
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc += stat_term(to_float(h[i]));
      }
      acc = row_reduce_sum<kThreadsPerRow>(acc, lanes_with_rows);
    }
    return acc;
  }

  // mean and inv_std from pass 1's `acc`. Returns false where the kernel's work ends here: a
  // chunk whose statistics it wrote (kChunkStats).
  TK_DEVICE bool statistics(float acc, const Cached& cached, float tail_h, float& mean, float& inv_std) const {
    // A chunk's statistics are over its own columns; the row's over all of them.
    const float inv_n = 1.f / static_cast<float>(kPass == RowPass::kChunkStats ? hidden : p.hidden);
    float* chunk_stats = kSplit ? p.split_stats + (row * p.split_chunks + blockIdx.x) * ChunkStatFloats::kForward : nullptr;
    auto write_chunk_stats = [&](float sum_or_mean, float m2) {
      if (threadIdx.x == 0) {
        chunk_stats[0] = static_cast<float>(hidden);
        chunk_stats[1] = sum_or_mean;
        chunk_stats[2] = m2;
      }
    };
    if constexpr (kFromStats) {
      // The row's statistics from its chunks', combined in chunk order (the same bits in every
      // block): sums of squares added; LayerNorm's (count, mean, M2) by Chan et al.'s pairwise update.
      const float* row_stats = p.split_stats + row * p.split_chunks * ChunkStatFloats::kForward;
      float count = 0.f, total = 0.f, m2 = 0.f;
      for (int c = 0; c < p.split_chunks; ++c) {
        const float* s = row_stats + c * ChunkStatFloats::kForward;
        if constexpr (kNorm == NormType::kRms) {
          total += s[1];
        } else {
          const float n = count + s[0], delta = s[1] - mean;
          mean += delta * (s[0] / n);
          // No cross term into an empty accumulator: delta^2 may overflow (a row of 1e20s), and inf * 0
          // would make the row NaN where its variance is merely inf (rstd 0, as one block gives).
          m2 += s[2] + (count > 0.f ? delta * delta * (count * s[0] / n) : 0.f);
          count = n;
        }
      }
      inv_std = rsqrtf((kNorm == NormType::kRms ? total : m2) * inv_n + p.eps);
    } else if constexpr (kNorm == NormType::kRms) {
      if constexpr (kPass == RowPass::kChunkStats) {
        write_chunk_stats(acc, 0.f);
        return false;
      }
      inv_std = rsqrtf(acc * inv_n + p.eps);
    } else {
      // Pass 2 (LayerNorm): variance around the mean from the cached values, two-pass for accuracy.
      mean = acc * inv_n;
      float m2 = 0.f;
      if (has_tail) m2 = (tail_h - mean) * (tail_h - mean);
#pragma unroll
      for (int k = 0; k < kCachedVecs; ++k) {
        const int v = lane + k * threads;
        if (v < num_vecs) {
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            const float d = to_float(cached[k][i]) - mean;
            m2 += d * d;
          }
        }
      }
      for (int v = lane + kCachedVecs * threads; v < num_vecs; v += threads) {
        const vec h = load_h(v, true);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float d = to_float(h[i]) - mean;
          m2 += d * d;
        }
      }
      // Its own shared array: no barrier between the two reductions (a block has one row).
      m2 = row_reduce_sum<kThreadsPerRow, /*kBuffer=*/1>(m2, lanes_with_rows);
      if constexpr (kPass == RowPass::kChunkStats) {
        write_chunk_stats(mean, m2);
        return false;
      }
      inv_std = rsqrtf(m2 * inv_n + p.eps);
    }
    return true;
  }

  // The last pass: normalize, affine, modulation and store every vector (the cached ones, then
  // the rest read again) and the tail element. An FP8 output keeps the cached vectors' values in
  // `cached`, reduces the row's amax, then stores their codes (store_codes).
  TK_DEVICE void store(Cached& cached, float tail_h, float mean, float inv_std) const {
    const T* scale = kMod ? p.scale + p.scale_rows.offset(row) + col0 : nullptr;
    const T* shift = kMod && p.shift != nullptr ? p.shift + p.shift_rows.offset(row) + col0 : nullptr;
    // y: h on entry, the norm's output n (with its affine) on return, in fp32, for N values (a
    // vector, or the one-element tail). Each op rounds as the eager code does (no FMA across a
    // rounding).
    auto normalize = [&](auto& y, const auto& w, const auto& b) {
      constexpr int N = sizeof(y) / sizeof(y[0]);
#pragma unroll
      for (int i = 0; i < N; ++i) y[i] = (y[i] - mean) * inv_std;
      if constexpr (kNorm == NormType::kRms) {
        if (p.round_normalized) round_through<T>(y);
#pragma unroll
        for (int i = 0; i < N; ++i) y[i] *= w[i];
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) y[i] = y[i] * w[i] + b[i];
      }
    };
    // The output of N values: n rounded to out_t, or (kMod) round(round(n) * round(1 + scale)) +
    // shift rounded again, from the raw scale/shift vectors in packed T arithmetic (the same bits as
    // the eager fp32 ops each cast to T, vec.cuh; kMod outputs are T).
    auto finish = [&](const auto& y, const auto& s, const auto& sh) {
      constexpr int N = sizeof(y) / sizeof(y[0]);
      vec_t<value_t, N> o;
      o.cast_from(y);
      if constexpr (kMod) {
        static_assert(std::is_same_v<value_t, T>, "modulated norms output x's dtype");
        o = mul_rn(o, add_rn(filled<T, N>(from_float<T>(1.f)), s));
        if (shift != nullptr) o = add_rn(o, sh);
      }
      return o;
    };
    // One vector's per-column parameters (weight, bias, scale, shift) as loaded; the members an op
    // does not use are never loaded and compile away.
    struct ColumnParams {
      vec_t<weight_t, kVec> w, b;
      vec s, sh;
    };
    auto load_params = [&](int v) {
      ColumnParams c;
      if (p.weight != nullptr) c.w.load(p.weight + col0 + v * kVec);
      if (kNorm == NormType::kLayer && p.bias != nullptr) c.b.load(p.bias + col0 + v * kVec);
      if constexpr (kMod) {
        c.s.load(scale + v * kVec);
        if (shift != nullptr) c.sh.load(shift + v * kVec);
      }
      return c;
    };
    // HF / diffusers RMSNorm with the weight in x's 16-bit dtype: `weight * round(h * inv_rms)` is a
    // product of two T values rounded to T, one packed multiply (mul_rn: the same bits) instead of
    // converting both to fp32 and back (NOTES.md §norm).
    constexpr bool kPackedWeight = kNorm == NormType::kRms && !kMod && sizeof(T) == 2 &&
                                   std::is_same_v<weight_t, T> && std::is_same_v<value_t, T>;
    const bool packed_weight = kPackedWeight && p.round_normalized && p.weight != nullptr;
    // The output values of a vector of h, handed to `sink` (its store; the FP8 output's amax and codes).
    auto emit = [&](const vec& h, const ColumnParams& c, auto&& sink) {
      if constexpr (kPackedWeight) {
        if (packed_weight) {
          float y[kVec];
          h.cast_to(y);
#pragma unroll
          for (int i = 0; i < kVec; ++i) y[i] *= inv_std;
          vec normalized;
          normalized.cast_from(y);
          sink(mul_rn(normalized, c.w));
          return;
        }
      }
      float w[kVec], b[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) w[i] = 1.f, b[i] = 0.f;
      if (p.weight != nullptr) c.w.cast_to(w);
      if (kNorm == NormType::kLayer && p.bias != nullptr) c.b.cast_to(b);
      float y[kVec];
      h.cast_to(y);
      normalize(y, w, b);
      sink(finish(y, c.s, c.sh));
    };
    // The tail element's output value.
    auto tail_value = [&]() {
      const int c = tail_col;
      float y[1] = {tail_h};
      const float w[1] = {p.weight ? to_float(p.weight[col0 + c]) : 1.f};
      const float b[1] = {kNorm == NormType::kLayer && p.bias ? to_float(p.bias[col0 + c]) : 0.f};
      vec_t<T, 1> s, sh;
      if constexpr (kMod) {
        s[0] = scale[c];
        if (shift != nullptr) sh[0] = shift[c];
      }
      normalize(y, w, b);
      return finish(y, s, sh)[0];
    };
    if constexpr (kFp8Out) {
      store_codes(cached, emit, tail_value, load_params);
    } else {
      auto store_vec = [&](const vec& h, const ColumnParams& c, int v) {
        emit(h, c, [&](const auto& o) { o.store(out + v * kVec); });
      };
#pragma unroll
      for (int k = 0; k < kCachedVecs; ++k) {
        const int v = lane + k * threads;
        if (v < num_vecs) store_vec(cached[k], load_params(v), v);
      }
      for (int v = lane + kCachedVecs * threads; v < num_vecs; v += threads)
        store_vec(load_h(v, true), load_params(v), v);
      if (has_tail) out[tail_col] = tail_value();
    }
  }

  // store's FP8 output: the values of the row (the cached vectors' kept in `cached`, the rest
  // computed again after the reduction), its amax over the row's threads, its scale, their codes.
  template <typename Emit, typename TailValue, typename LoadParams>
  TK_DEVICE void store_codes(Cached& cached, const Emit& emit, const TailValue& tail_value,
                             const LoadParams& load_params) const {
    auto fold_amax = [](float amax, const vec& o) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) amax = NanMaxOp{}(amax, fabsf(to_float(o[i])));
      return amax;
    };
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      const int v = lane + k * threads;
      if (v < num_vecs) {
        emit(cached[k], load_params(v), [&](const vec& o) { cached[k] = o; });
        amax = fold_amax(amax, cached[k]);
      }
    }
    for (int v = lane + kCachedVecs * threads; v < num_vecs; v += threads)
      emit(load_h(v, true), load_params(v), [&](const vec& o) { amax = fold_amax(amax, o); });
    const float tail = has_tail ? to_float(tail_value()) : 0.f;
    amax = NanMaxOp{}(amax, fabsf(tail));
    // Its own shared array (NanMaxOp's): no barrier after the statistics' reductions.
    amax = row_reduce<NanMaxOp, kThreadsPerRow>(amax, lanes_with_rows);
    const float scale = fp8_row_scale(amax);
    if (lane == 0) p.out_scale[row] = scale;
    auto store_vec_codes = [&](const vec& o, int v) {
      vec_t<uint8_t, kVec> codes;
#pragma unroll
      for (int i = 0; i < kVec; ++i) codes[i] = fp8_code(to_float(o[i]), scale);
      codes.store(out + v * kVec);
    };
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      const int v = lane + k * threads;
      if (v < num_vecs) store_vec_codes(cached[k], v);
    }
    for (int v = lane + kCachedVecs * threads; v < num_vecs; v += threads)
      emit(load_h(v, true), load_params(v), [&](const vec& o) { store_vec_codes(o, v); });
    if (has_tail) out[tail_col] = fp8_code(tail, scale);
  }
};

// The kernel body: kThreadsPerRow lanes a row (0: a block per row, or per chunk of a split row).
template <typename Op, int kVec, int kThreadsPerRow, RowPass kPass>
TK_DEVICE void norm_body(const typename Op::Params& p) {
  using Row = NormRow<Op, kVec, kThreadsPerRow, kPass>;
  const RowGroup<kThreadsPerRow> group(p.num_rows);
  const int64_t row = Row::kSplit ? static_cast<int64_t>(blockIdx.y) : group.row;
  // Whole row groups leave together (a block in block mode); shuffles then name only the lanes
  // of groups that have a row.
  if (row >= p.num_rows) return;
  const Row r(p, group, row);
  typename Row::Cached cached;
  float tail_h;
  const float acc = r.load_and_sum(cached, tail_h);
  float mean = 0.f, inv_std;
  if (r.statistics(acc, cached, tail_h, mean, inv_std)) r.store(cached, tail_h, mean, inv_std);
}

}  // namespace norm_detail
}  // namespace transformer_kernels
