// Non-causal attention with 8-bit products (SageAttention2's recipe), torch-free: q·kᵀ on INT8
// tensor cores, p·v on FP8 (e4m3) tensor cores, the online softmax in float32.
//
// Preparation kernels write the 8-bit operands into a workspace, then the attention kernel runs
// FlashAttention-2's loop over blocks of 64 keys (mma.sync, sm_89+):
//   1. column statistics: per (batch·head, chunk of rows) k's channel sums, maxima and minima, q's
//      and v's channel amax (partials, combined in a fixed order: deterministic);
//   2. channel scales: k's channel mean, and per channel a balance b = sqrt(amax(k - mean) / amax q)
//      that q is multiplied and k divided by (q·kᵀ unchanged: SmoothQuant's migration), so that an
//      outlier channel of either spends its range on both; v's channel scale amax/448 (e4m3);
//   3. q·b: per row, scale = amax/127, codes = rint(q·b/scale); the row's scale is stored times the
//      softmax scale and log2(e), so a score is one multiply from the integer product;
//   4. (k - mean)/b: softmax is invariant to the per-row constant q·mean, and the mean is what makes
//      keys with a common offset quantizable; per block of 64 keys scale = amax/127, INT8 codes;
//   5. v (e4m3 values only): per channel codes, written transposed (keys contiguous per channel,
//      the B operand of the FP8 product) and with each 32-key group permuted so that the fp32
//      accumulator of the scores, rounded to e4m3, is already the A operand of p·v.
// reference/attention.py (attention_8bit_emulation) is the float64 model of this arithmetic.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "attention/attention_policy.cuh"
#include "common/fp8.cuh"
#include "common/kernel.cuh"
#include "common/math.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace transformer_kernels {

constexpr float kInt8Max = 127.f;
// 1.5·2^23 and its bits: adding an integer n with |n| < 2^22 to the bits gives the float 1.5·2^23 + n.
constexpr float kFloatIntBias = 12582912.f;
constexpr int kFloatIntBiasBits = 0x4B400000;
constexpr float kLog2e = 1.4426950408889634f;

// Where one [B, H, S, D] operand lives: element (b, h, s, d) at b*batch + h*head + s*seq + d.
template <typename T>
struct HeadsView {
  const T* data;
  int64_t batch_stride, head_stride, seq_stride;
};

// The 8-bit operands and their scales (the workspace; bh = b*H + h).
struct Attention8bitOperands {
  int8_t* q_codes;       // [BH, q_rows, D], rows past Sq zero
  float* q_scale;        // [BH, q_rows]: amax/127 · scale · log2(e), 0 past Sq
  int8_t* k_codes;       // [BH, k_rows, D], rows past Sk zero
  float* k_scale;        // [BH, k_rows / kBlockKeys]
  uint8_t* v_codes;      // [BH, D, k_rows] e4m3, keys permuted within 32-key groups, zero past Sk
  float* v_scale;        // [BH, D]: amax/448
  float* partials;       // [kStatsCount, BH, stats_chunks, D]: the column statistics by chunk
  float* k_mean;         // [BH, D]
  float* balance;        // [BH, D]: q is multiplied and k divided by it
};

// The column statistics' partials, in this order in Attention8bitOperands::partials.
enum ColumnStat { kKeySum, kKeyMax, kKeyMin, kQueryAmax, kValueAmax, kStatsCount };

template <typename T>
struct Attention8bitParams {
  HeadsView<T> q, k, v;
  T* out;                             // [B, H, Sq, D] at out_batch_stride, out_head_stride, out_seq_stride
  int64_t out_batch_stride, out_head_stride, out_seq_stride;
  int heads, q_len, kv_len;           // H, Sq, Sk
  int q_rows, k_rows, stats_chunks;   // Sq and Sk rounded up to whole tiles; chunks of kStatsChunk rows
  float score_scale;                  // softmax scale · log2(e)
  Attention8bitOperands ops;
};

// What p·v multiplies: v's per-channel e4m3 codes on FP8 tensor cores (p in e4m3), or v as given
// on 16-bit tensor cores (p in v's dtype). mma.sync takes e4m3 natively on sm_89 only: on sm_90
// ptxas lowers it to conversions and 16-bit products (benchmarks/NOTES.md §8-bit attention).
enum class ValuePrecision { kE4m3, kInput };

namespace attention_detail {

// 16-row tiles each warp of the attention block owns: the policy's for the head dim with 16-bit
// values; one with e4m3 values, whose per-block accumulators take a second tile's registers.
template <typename Policy, ValuePrecision kValues, int kHeadDim>
constexpr int row_tiles_per_warp() {
  return kValues == ValuePrecision::kE4m3 ? 1 : Policy::row_tiles_per_warp(kHeadDim);
}

// Query rows of one attention block.
template <typename Policy, ValuePrecision kValues, int kHeadDim>
constexpr int query_tile_rows() { return Policy::kWarps * 16 * row_tiles_per_warp<Policy, kValues, kHeadDim>(); }

// The rows q's workspace is padded to: a whole number of blocks for every form.
template <typename Policy>
constexpr int query_padding() { return Policy::kWarps * 16 * Policy::kMaxRowTilesPerWarp; }

// The rows of q and k the workspace holds: Sq and Sk rounded up to whole tiles (zero codes past them).
template <typename Policy>
TK_HOST_DEVICE int padded_q_rows(int q_len) {
  constexpr int kTile = query_padding<Policy>();
  return (q_len + kTile - 1) / kTile * kTile;
}
template <typename Policy>
TK_HOST_DEVICE int padded_k_rows(int kv_len) {
  return (kv_len + Policy::kBlockKeys - 1) / Policy::kBlockKeys * Policy::kBlockKeys;
}

// A NaN-keeping max of |x| (a row with a NaN gets a NaN scale, so its results are NaN as SDPA's).
TK_DEVICE float nan_abs_max(float a, float x) { return NanMaxOp{}(a, fabsf(x)); }

// The scale of an 8-bit block from its amax: amax/limit, 1 for an all-zero block (zero codes).
TK_DEVICE float block_scale(float amax, float limit) { return amax == 0.f ? 1.f : __fdiv_rn(amax, limit); }

TK_DEVICE int8_t int8_code(float x, float scale) {
  const float q = rintf(__fdiv_rn(x, scale));
  return static_cast<int8_t>(__float2int_rn(fminf(fmaxf(q, -kInt8Max), kInt8Max)));
}

// Position of key `key` (0..31) of a 32-key group in v's transposed rows. The scores' accumulator
// gives lane t of a quad keys {2t, 2t+1, 8+2t, 9+2t} (and 16 more) of a row, where the FP8 product's
// A operand takes k positions {4t..4t+3} (and 16 more): v's keys are stored at the positions the
// scores land on, so p needs no shuffle. Inverse of: position 16h + 4t + i <- key 16h + 8(i/2) + 2t + i%2.
TK_HOST_DEVICE int v_position(int key) {
  const int half = key / 16, rem = key % 16;
  return 16 * half + 4 * ((rem % 8) / 2) + 2 * (rem / 8) + rem % 2;
}

// The 16-byte chunk of a shared tile (rows of kChunksPerRow chunks) where chunk (row, chunk) is
// kept: XOR-swizzled within each 128-byte line, so the 8 rows an ldmatrix phase reads at one
// column fall in 8 different bank groups.
template <int kChunksPerRow>
TK_DEVICE int swizzled_chunk(int row, int chunk) {
  if constexpr (kChunksPerRow >= 8) {
    return row * kChunksPerRow + (chunk ^ (row & 7));
  } else {
    const int u = row * kChunksPerRow + chunk;  // several rows share a 128-byte line
    return (u & ~7) | ((u ^ (u >> 3)) & 7);
  }
}

TK_DEVICE uint32_t shared_address(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

TK_DEVICE void cp_async_16(void* shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(shared)), "l"(global));
}
// The same, or 16 zero bytes where `valid` is false (the source is then not read).
TK_DEVICE void cp_async_16_or_zero(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 16 : 0));
}
TK_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
TK_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

TK_DEVICE void ldmatrix_x4(uint32_t (&r)[4], const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(shared)));
}

TK_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(shared)));
}

// d += a·b on 16-bit tensor cores (m16n8k16, T = __half or __nv_bfloat16, float accumulators).
template <typename T>
TK_DEVICE void mma_16bit(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two values as one register of T (the first in the low half), rounded to nearest even.
template <typename T>
TK_DEVICE uint32_t pack_16bit(float a, float b) {
  typename detail::pair_type<T>::type pair;
  from_float_pair(a, b, pair.x, pair.y);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// d += a·b on INT8 tensor cores (m16n8k32, int32 accumulators).
TK_DEVICE void mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a·b on FP8 tensor cores (m16n8k32, e4m3 operands, float accumulators: sm_89+).
TK_DEVICE void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// 2^x on the special-function unit (ex2.approx: 2 ulp, subnormals flushed; -inf gives 0, NaN NaN).
TK_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Four values as e4m3 bytes, the first in the lowest byte (saturating; NaN stays NaN).
TK_DEVICE uint32_t pack_e4m3(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// ---- 1. column statistics -------------------------------------------------------------------

// Lanes that share one row of D channels, 8 channels (16 bytes) each.
template <int kHeadDim>
constexpr int lanes_per_row() { return kHeadDim / 8; }

// |x| where x is finite, else 0: the balance is formed from finite values only, so that a NaN or an
// infinity in one row of q leaves the other rows' results finite (as SDPA's).
TK_DEVICE float finite_abs(float x) { return isfinite(x) ? fabsf(x) : 0.f; }

// kValueAmax: v's channel amax too (for its e4m3 codes).
template <int kHeadDim, typename T, typename Policy, bool kWithValues>
TK_DEVICE void column_stats_body(const Attention8bitParams<T>& p) {
  constexpr int kLanes = lanes_per_row<kHeadDim>();
  constexpr int kRowsAtOnce = Policy::kPrepThreads / kLanes;
  constexpr int kStats = kWithValues ? 5 : 4;
  __shared__ float partial[kStats][kRowsAtOnce][kHeadDim];
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int lane = threadIdx.x % kLanes, row_in = threadIdx.x / kLanes;
  const T* q = p.q.data + b * p.q.batch_stride + h * p.q.head_stride + lane * 8;
  const T* k = p.k.data + b * p.k.batch_stride + h * p.k.head_stride + lane * 8;
  const T* v = p.v.data + b * p.v.batch_stride + h * p.v.head_stride + lane * 8;
  float acc[kStats][8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    acc[kKeySum][i] = 0.f, acc[kKeyMax][i] = -INFINITY, acc[kKeyMin][i] = INFINITY, acc[kQueryAmax][i] = 0.f;
    if constexpr (kWithValues) acc[kValueAmax][i] = 0.f;
  }
  const int first = blockIdx.x * Policy::kStatsChunk;
  for (int s = first + row_in; s < min(p.kv_len, first + Policy::kStatsChunk); s += kRowsAtOnce) {
    float x[8];
    vec_t<T, 8> kv;
    kv.load(k + s * p.k.seq_stride);
    kv.cast_to(x);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      acc[kKeySum][i] += x[i];
      acc[kKeyMax][i] = fmaxf(acc[kKeyMax][i], x[i]);
      acc[kKeyMin][i] = fminf(acc[kKeyMin][i], x[i]);
    }
    if constexpr (kWithValues) {
      vec_t<T, 8> vv;
      vv.load(v + s * p.v.seq_stride);
      vv.cast_to(x);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[kValueAmax][i] = nan_abs_max(acc[kValueAmax][i], x[i]);
    }
  }
  for (int s = first + row_in; s < min(p.q_len, first + Policy::kStatsChunk); s += kRowsAtOnce) {
    float x[8];
    vec_t<T, 8> qv;
    qv.load(q + s * p.q.seq_stride);
    qv.cast_to(x);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[kQueryAmax][i] = fmaxf(acc[kQueryAmax][i], finite_abs(x[i]));
  }
#pragma unroll
  for (int stat = 0; stat < kStats; ++stat) {
#pragma unroll
    for (int i = 0; i < 8; ++i) partial[stat][row_in][lane * 8 + i] = acc[stat][i];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < kHeadDim; c += blockDim.x) {
    float sum = 0.f, hi = -INFINITY, lo = INFINITY, q_amax = 0.f, v_amax = 0.f;
    for (int r = 0; r < kRowsAtOnce; ++r) {
      sum += partial[kKeySum][r][c];
      hi = fmaxf(hi, partial[kKeyMax][r][c]);
      lo = fminf(lo, partial[kKeyMin][r][c]);
      q_amax = fmaxf(q_amax, partial[kQueryAmax][r][c]);
      if constexpr (kWithValues) v_amax = NanMaxOp{}(v_amax, partial[kValueAmax][r][c]);
    }
    const int64_t plane = static_cast<int64_t>(gridDim.y) * p.stats_chunks * kHeadDim;
    float* out = p.ops.partials + (static_cast<int64_t>(bh) * p.stats_chunks + blockIdx.x) * kHeadDim + c;
    out[kKeySum * plane] = sum;
    out[kKeyMax * plane] = hi;
    out[kKeyMin * plane] = lo;
    out[kQueryAmax * plane] = q_amax;
    if constexpr (kWithValues) out[kValueAmax * plane] = v_amax;
  }
}

// Per (batch·head, channel): k's mean, the balance, v's scale; one thread a channel, the chunks'
// partials combined in chunk order.
template <int kHeadDim, typename T, typename Policy, bool kWithValues>
TK_DEVICE void channel_scales_body(const Attention8bitParams<T>& p) {
  const int bh = blockIdx.x, c = threadIdx.x;
  const int64_t plane = static_cast<int64_t>(gridDim.x) * p.stats_chunks * kHeadDim;
  const float* in = p.ops.partials + static_cast<int64_t>(bh) * p.stats_chunks * kHeadDim + c;
  float sum = 0.f, hi = -INFINITY, lo = INFINITY, q_amax = 0.f, v_amax = 0.f;
  for (int chunk = 0; chunk < p.stats_chunks; ++chunk) {
    const float* at = in + chunk * kHeadDim;
    sum += at[kKeySum * plane];
    hi = fmaxf(hi, at[kKeyMax * plane]);
    lo = fminf(lo, at[kKeyMin * plane]);
    q_amax = fmaxf(q_amax, at[kQueryAmax * plane]);
    if constexpr (kWithValues) v_amax = NanMaxOp{}(v_amax, at[kValueAmax * plane]);
  }
  const float mean = __fdiv_rn(sum, static_cast<float>(p.kv_len));
  const float k_amax = fmaxf(hi - mean, mean - lo);
  const float balance = sqrtf(__fdiv_rn(k_amax, q_amax));
  const int64_t at = static_cast<int64_t>(bh) * kHeadDim + c;
  p.ops.k_mean[at] = mean;
  p.ops.balance[at] = isfinite(balance) && balance > 0.f ? balance : 1.f;
  if constexpr (kWithValues) p.ops.v_scale[at] = block_scale(v_amax, kFp8E4m3Max);
}

// ---- 2. q -------------------------------------------------------------------------------------

template <int kHeadDim, typename T, typename Policy>
TK_DEVICE void quantize_q_body(const Attention8bitParams<T>& p) {
  constexpr int kLanes = lanes_per_row<kHeadDim>();
  constexpr int kRowsPerBlock = Policy::kPrepThreads / kLanes;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  const int lane = threadIdx.x % kLanes;
  const int bh = blockIdx.y;
  if (row >= p.q_rows) return;  // whole lane groups leave together
  const int s = static_cast<int>(row);
  const int b = bh / p.heads, h = bh % p.heads;
  float x[8] = {};
  if (s < p.q_len) {
    vec_t<T, 8> xv;
    xv.load(p.q.data + b * p.q.batch_stride + h * p.q.head_stride + s * p.q.seq_stride + lane * 8);
    xv.cast_to(x);
    vec_t<float, 8> balance;
    balance.load(p.ops.balance + static_cast<int64_t>(bh) * kHeadDim + lane * 8);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] *= balance[i];
  }
  float amax[1] = {0.f};
#pragma unroll
  for (int i = 0; i < 8; ++i) amax[0] = nan_abs_max(amax[0], x[i]);
  group_reduce<NanMaxOp, kLanes>(amax);
  const float scale = block_scale(amax[0], kInt8Max);
  vec_t<int8_t, 8> codes;
#pragma unroll
  for (int i = 0; i < 8; ++i) codes[i] = int8_code(x[i], scale);
  const int64_t at = static_cast<int64_t>(bh) * p.q_rows + s;
  codes.store(p.ops.q_codes + at * kHeadDim + lane * 8);
  if (lane == 0) p.ops.q_scale[at] = s < p.q_len ? scale * p.score_scale : 0.f;
}

// ---- 3. k and 4. v: one block of 64 keys of one head ------------------------------------------

// A block of kBlockKeys keys' channels [kLanes lanes of 8 channels per key], loaded as float: the
// keys each thread holds are row_in, row_in + kRowsAtOnce, ...; keys past Sk are zero.
template <int kHeadDim, typename T, typename Policy>
struct KeyBlock {
  static constexpr int kLanes = lanes_per_row<kHeadDim>();
  static constexpr int kRowsAtOnce = Policy::kPrepThreads / kLanes;
  static constexpr int kPasses = Policy::kBlockKeys / kRowsAtOnce;
  static_assert(Policy::kBlockKeys % kRowsAtOnce == 0, "a key block is whole passes of the block's threads");
  float x[kPasses][8];
  int lane, row_in;

  TK_DEVICE void load(const HeadsView<T>& view, int b, int h, int first_key, int kv_len) {
    lane = threadIdx.x % kLanes;
    row_in = threadIdx.x / kLanes;
    const T* base = view.data + b * view.batch_stride + h * view.head_stride + lane * 8;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int key = first_key + pass * kRowsAtOnce + row_in;
      if (key < kv_len) {
        vec_t<T, 8> v;
        v.load(base + key * view.seq_stride);
        v.cast_to(x[pass]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) x[pass][i] = 0.f;
      }
    }
  }
};

template <int kHeadDim, typename T, typename Policy>
TK_DEVICE void quantize_k_body(const Attention8bitParams<T>& p) {
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int first_key = blockIdx.x * Policy::kBlockKeys;
  KeyBlock<kHeadDim, T, Policy> blk;
  blk.load(p.k, b, h, first_key, p.kv_len);
  vec_t<float, 8> mean, balance;
  mean.load(p.ops.k_mean + static_cast<int64_t>(bh) * kHeadDim + blk.lane * 8);
  balance.load(p.ops.balance + static_cast<int64_t>(bh) * kHeadDim + blk.lane * 8);
  float amax[1] = {0.f};
#pragma unroll
  for (int pass = 0; pass < blk.kPasses; ++pass) {
    const bool live = first_key + pass * blk.kRowsAtOnce + blk.row_in < p.kv_len;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      blk.x[pass][i] = live ? __fdiv_rn(blk.x[pass][i] - mean[i], balance[i]) : 0.f;
      amax[0] = nan_abs_max(amax[0], blk.x[pass][i]);
    }
  }
  block_reduce<NanMaxOp, 1>(amax);
  const float scale = block_scale(amax[0], kInt8Max);
  int8_t* codes = p.ops.k_codes + (static_cast<int64_t>(bh) * p.k_rows + first_key) * kHeadDim + blk.lane * 8;
#pragma unroll
  for (int pass = 0; pass < blk.kPasses; ++pass) {
    vec_t<int8_t, 8> c;
#pragma unroll
    for (int i = 0; i < 8; ++i) c[i] = int8_code(blk.x[pass][i], scale);
    c.store(codes + (pass * blk.kRowsAtOnce + blk.row_in) * kHeadDim);
  }
  if (threadIdx.x == 0) p.ops.k_scale[static_cast<int64_t>(bh) * (p.k_rows / Policy::kBlockKeys) + blockIdx.x] = scale;
}

template <int kHeadDim, typename T, typename Policy>
TK_DEVICE void quantize_v_body(const Attention8bitParams<T>& p) {
  constexpr int kKeys = Policy::kBlockKeys;
  __shared__ __align__(16) uint8_t tile[kHeadDim][kKeys];  // [channel][position]
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int first_key = blockIdx.x * kKeys;
  KeyBlock<kHeadDim, T, Policy> blk;
  blk.load(p.v, b, h, first_key, p.kv_len);
  vec_t<float, 8> scale;
  scale.load(p.ops.v_scale + static_cast<int64_t>(bh) * kHeadDim + blk.lane * 8);
#pragma unroll
  for (int pass = 0; pass < blk.kPasses; ++pass) {
    const int key = pass * blk.kRowsAtOnce + blk.row_in;
    const int position = key / 32 * 32 + v_position(key % 32);
#pragma unroll
    for (int i = 0; i < 8; ++i) tile[blk.lane * 8 + i][position] = fp8_code(blk.x[pass][i], scale[i]);
  }
  __syncthreads();
  constexpr int kChunksPerRow = kKeys / 16;
  uint8_t* out = p.ops.v_codes + static_cast<int64_t>(bh) * kHeadDim * p.k_rows + first_key;
  for (int i = threadIdx.x; i < kHeadDim * kChunksPerRow; i += blockDim.x) {
    const int c = i / kChunksPerRow, chunk = i % kChunksPerRow;
    *reinterpret_cast<uint4*>(out + static_cast<int64_t>(c) * p.k_rows + chunk * 16) =
        *reinterpret_cast<const uint4*>(&tile[c][chunk * 16]);
  }
}

// ---- 5. attention -----------------------------------------------------------------------------

// Bytes of one stage of v's tile: [D, 64 keys] e4m3 codes or [64 keys, D] values of T.
template <int kHeadDim, typename T, typename Policy, ValuePrecision kValues>
constexpr int value_tile_bytes() {
  return kValues == ValuePrecision::kE4m3 ? kHeadDim * Policy::kBlockKeys
                                          : Policy::kBlockKeys * kHeadDim * static_cast<int>(sizeof(T));
}

// Copies a [kRows, kRowBytes] tile of 8-bit codes (rows `row_stride` bytes apart) into swizzled
// shared memory with cp.async, the block's threads sharing the 16-byte chunks.
template <int kRows, int kRowBytes, int kThreads>
TK_DEVICE void copy_tile_async(uint8_t* shared, const uint8_t* global, int64_t row_stride) {
  constexpr int kChunksPerRow = kRowBytes / 16;
  static_assert(kRows * kChunksPerRow % kThreads == 0, "whole rounds of the block's threads");
#pragma unroll
  for (int round = 0; round < kRows * kChunksPerRow / kThreads; ++round) {
    const int i = round * kThreads + static_cast<int>(threadIdx.x);
    const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
    cp_async_16(shared + swizzled_chunk<kChunksPerRow>(row, chunk) * 16, global + row * row_stride + chunk * 16);
  }
}

// Copies kRows rows of kRowBytes (16-bit values of the input, rows `row_stride` elements apart)
// into swizzled shared memory; rows from `valid_rows` on are zero-filled (never read).
template <int kRows, int kRowBytes, int kThreads, typename T>
TK_DEVICE void copy_rows_async(uint8_t* shared, const T* global, int64_t row_stride, int valid_rows) {
  constexpr int kChunksPerRow = kRowBytes / 16;
  constexpr int kChunkElems = 16 / static_cast<int>(sizeof(T));
  static_assert(kRows * kChunksPerRow % kThreads == 0, "whole rounds of the block's threads");
#pragma unroll
  for (int round = 0; round < kRows * kChunksPerRow / kThreads; ++round) {
    const int i = round * kThreads + static_cast<int>(threadIdx.x);
    const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
    const bool valid = row < valid_rows;
    cp_async_16_or_zero(shared + swizzled_chunk<kChunksPerRow>(row, chunk) * 16,
                        global + (valid ? row * row_stride + chunk * kChunkElems : 0), valid);
  }
}

template <int kHeadDim, typename T, typename Policy, ValuePrecision kValues>
TK_DEVICE void attention_body(const Attention8bitParams<T>& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  constexpr bool kE4m3 = kValues == ValuePrecision::kE4m3;
  constexpr int kThreads = Policy::kWarps * kWarpSize;
  constexpr int kTiles = row_tiles_per_warp<Policy, kValues, kHeadDim>();  // m16 tiles of a warp
  constexpr int kRows = query_tile_rows<Policy, kValues, kHeadDim>();
  constexpr int kKeys = Policy::kBlockKeys;
  constexpr int kKeyTiles = kKeys / 8;          // n8 tiles of the scores
  constexpr int kChannelTiles = kHeadDim / 8;   // n8 tiles of the output
  constexpr int kQkSteps = kHeadDim / 32;       // k32 steps of q·kᵀ
  constexpr int kQBytes = kRows * kHeadDim, kKBytes = kKeys * kHeadDim;
  constexpr int kVBytes = value_tile_bytes<kHeadDim, T, Policy, kValues>();
  static_assert(kKeys == 64, "the p·v A operand packs the scores of 4 key tiles per k32 step");
  extern __shared__ __align__(128) uint8_t shared[];
  uint8_t* s_q = shared;
  uint8_t* s_k = s_q + kQBytes;       // 2 stages
  uint8_t* s_v = s_k + 2 * kKBytes;   // 2 stages

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int group = lane / 4, quad_lane = lane % 4;
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int row0 = blockIdx.x * kRows;
  const int num_key_blocks = p.k_rows / kKeys;

  const uint8_t* q_codes = reinterpret_cast<const uint8_t*>(p.ops.q_codes) + (static_cast<int64_t>(bh) * p.q_rows + row0) * kHeadDim;
  const uint8_t* k_codes = reinterpret_cast<const uint8_t*>(p.ops.k_codes) + static_cast<int64_t>(bh) * p.k_rows * kHeadDim;
  const uint8_t* v_codes = p.ops.v_codes + static_cast<int64_t>(bh) * kHeadDim * p.k_rows;
  const T* v_values = p.v.data + b * p.v.batch_stride + h * p.v.head_stride;
  const float* k_scale = p.ops.k_scale + static_cast<int64_t>(bh) * num_key_blocks;

  auto load_keys = [&](int block, int stage) {
    copy_tile_async<kKeys, kHeadDim, kThreads>(s_k + stage * kKBytes, k_codes + static_cast<int64_t>(block) * kKBytes,
                                               kHeadDim);
    if constexpr (kE4m3) {
      copy_tile_async<kHeadDim, kKeys, kThreads>(s_v + stage * kVBytes, v_codes + block * kKeys, p.k_rows);
    } else {
      const int first = block * kKeys;
      copy_rows_async<kKeys, kHeadDim * 2, kThreads>(s_v + stage * kVBytes, v_values + first * p.v.seq_stride,
                                                     p.v.seq_stride, p.kv_len - first);
    }
  };
  copy_tile_async<kRows, kHeadDim, kThreads>(s_q, q_codes, kHeadDim);
  load_keys(0, 0);
  cp_async_commit();

  // This lane's rows: in each of the warp's m16 tiles, group and group + 8 ([tile][r] below), with
  // their scale, running max and sum.
  const int warp_row0 = warp * 16 * kTiles;
  const float* q_scale = p.ops.q_scale + static_cast<int64_t>(bh) * p.q_rows + row0 + warp_row0 + group;
  float row_scale[kTiles][2], row_max[kTiles][2], row_sum[kTiles][2];
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_scale[t][r] = q_scale[16 * t + 8 * r];
      row_max[t][r] = -INFINITY;
      row_sum[t][r] = 0.f;
    }
  }
  float acc[kTiles][kChannelTiles][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int n = 0; n < kChannelTiles; ++n) acc[t][n][0] = acc[t][n][1] = acc[t][n][2] = acc[t][n][3] = 0.f;
  }

  for (int block = 0; block < num_key_blocks; ++block) {
    const int stage = block & 1;
    if (block + 1 < num_key_blocks) {
      load_keys(block + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint8_t* k_tile = s_k + stage * kKBytes;
    const uint8_t* v_tile = s_v + stage * kVBytes;

    // Scores: int32 q·kᵀ for the warp's rows and the block's 64 keys; each k fragment serves every
    // tile of the warp (q's fragments come from shared memory each block, as FlashAttention-2's).
    int score_int[kTiles][kKeyTiles][4];
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) score_int[t][j][0] = score_int[t][j][1] = score_int[t][j][2] = score_int[t][j][3] = 0;
    }
#pragma unroll
    for (int kk = 0; kk < kQkSteps; ++kk) {
      uint32_t q_frag[kTiles][4];
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        const int row = warp_row0 + 16 * t + lane % 8 + 8 * ((lane / 8) % 2);
        ldmatrix_x4(q_frag[t], s_q + swizzled_chunk<kHeadDim / 16>(row, 2 * kk + lane / 16) * 16);
      }
#pragma unroll
      for (int jp = 0; jp < kKeyTiles / 2; ++jp) {
        uint32_t bfrag[4];
        const int key = 16 * jp + lane % 8 + 8 * (lane / 16);
        ldmatrix_x4(bfrag, k_tile + swizzled_chunk<kHeadDim / 16>(key, 2 * kk + (lane / 8) % 2) * 16);
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          mma_s8(score_int[t][2 * jp], q_frag[t], bfrag[0], bfrag[1]);
          mma_s8(score_int[t][2 * jp + 1], q_frag[t], bfrag[2], bfrag[3]);
        }
      }
    }

    // Online softmax in the log2 domain (the scales carry log2(e)). An int32 product n (|n| <=
    // 127²·128 < 2^22) is the float 1.5·2^23 + n minus 1.5·2^23: an integer add and the scaling
    // FFMA instead of I2F, whose throughput is the special-function unit's, already busy with exp2.
    const float block_k_scale = k_scale[block];
    const int first_key = block * kKeys;
    const bool partial_block = first_key + kKeys > p.kv_len;
    float s[kTiles][kKeyTiles][4];
    float alpha[kTiles][2];
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      float score_mult[2], score_offset[2], block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        score_mult[r] = row_scale[t][r] * block_k_scale;
        score_offset[r] = -kFloatIntBias * score_mult[r];
      }
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[t][j][e] = fmaf(__int_as_float(kFloatIntBiasBits + score_int[t][j][e]), score_mult[e / 2], score_offset[e / 2]);
          if (partial_block && first_key + 8 * j + 2 * quad_lane + (e & 1) >= p.kv_len) s[t][j][e] = -INFINITY;
          block_max[e / 2] = fmaxf(block_max[e / 2], s[t][j][e]);
        }
      }
      float shift[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(kFullMask, block_max[r], 1));
        block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(kFullMask, block_max[r], 2));
        const float new_max = fmaxf(row_max[t][r], block_max[r]);
        shift[r] = new_max == -INFINITY ? 0.f : new_max;  // a row of no finite score yet
        alpha[t][r] = fast_exp2(row_max[t][r] - shift[r]);
        row_max[t][r] = new_max;
        row_sum[t][r] *= alpha[t][r];
      }
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[t][j][e] = fast_exp2(s[t][j][e] - shift[e / 2]);
          row_sum[t][e / 2] += s[t][j][e];
        }
      }
    }

    if constexpr (kE4m3) {
      // p·v on FP8 tensor cores: p·448 in e4m3 (v's codes carry 1/448 of their scale), summed per
      // block in fresh accumulators and added to the running output in fp32 (FP8 accumulation is
      // narrower than fp32 across many steps). The channels go in passes of at most 8 n8 tiles, so
      // that the block's accumulators need no more registers than 8 tiles.
      static_assert(kTiles == 1, "one m16 tile per warp with e4m3 values");
      constexpr int kPvSteps = kKeys / 32;
      uint32_t pfrag[kPvSteps][4];
#pragma unroll
      for (int kk = 0; kk < kPvSteps; ++kk) {
        const int j = 4 * kk;
        constexpr float m = kFp8E4m3Max;
        const auto& ps = s[0];
        pfrag[kk][0] = pack_e4m3(ps[j][0] * m, ps[j][1] * m, ps[j + 1][0] * m, ps[j + 1][1] * m);
        pfrag[kk][1] = pack_e4m3(ps[j][2] * m, ps[j][3] * m, ps[j + 1][2] * m, ps[j + 1][3] * m);
        pfrag[kk][2] = pack_e4m3(ps[j + 2][0] * m, ps[j + 2][1] * m, ps[j + 3][0] * m, ps[j + 3][1] * m);
        pfrag[kk][3] = pack_e4m3(ps[j + 2][2] * m, ps[j + 2][3] * m, ps[j + 3][2] * m, ps[j + 3][3] * m);
      }
      constexpr int kPassTiles = kChannelTiles < 8 ? kChannelTiles : 8;
#pragma unroll
      for (int pass = 0; pass < kChannelTiles / kPassTiles; ++pass) {
        float block_acc[kPassTiles][4];
#pragma unroll
        for (int n = 0; n < kPassTiles; ++n) block_acc[n][0] = block_acc[n][1] = block_acc[n][2] = block_acc[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < kPvSteps; ++kk) {
#pragma unroll
          for (int np = 0; np < kPassTiles / 2; ++np) {
            uint32_t bfrag[4];
            const int channel = pass * kPassTiles * 8 + 16 * np + lane % 8 + 8 * (lane / 16);
            ldmatrix_x4(bfrag, v_tile + swizzled_chunk<kKeys / 16>(channel, 2 * kk + (lane / 8) % 2) * 16);
            mma_e4m3(block_acc[2 * np], pfrag[kk], bfrag[0], bfrag[1]);
            mma_e4m3(block_acc[2 * np + 1], pfrag[kk], bfrag[2], bfrag[3]);
          }
        }
#pragma unroll
        for (int n = 0; n < kPassTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float& o = acc[0][pass * kPassTiles + n][e];
            o = fmaf(o, alpha[0][e / 2], block_acc[n][e]);
          }
        }
      }
    } else {
      // p·v on 16-bit tensor cores: p rounded to v's dtype, v as given (FlashAttention-2's form:
      // the scores' accumulator is the A operand as it stands, fp32 accumulation throughout); each
      // v fragment serves every tile of the warp.
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
#pragma unroll
        for (int n = 0; n < kChannelTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[t][n][e] *= alpha[t][e / 2];
        }
      }
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        uint32_t pfrag[kTiles][4];
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          const auto& ps = s[t];
          pfrag[t][0] = pack_16bit<T>(ps[2 * kk][0], ps[2 * kk][1]);
          pfrag[t][1] = pack_16bit<T>(ps[2 * kk][2], ps[2 * kk][3]);
          pfrag[t][2] = pack_16bit<T>(ps[2 * kk + 1][0], ps[2 * kk + 1][1]);
          pfrag[t][3] = pack_16bit<T>(ps[2 * kk + 1][2], ps[2 * kk + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < kChannelTiles / 2; ++np) {
          uint32_t bfrag[4];
          const int key = 16 * kk + lane % 8 + 8 * ((lane / 8) % 2);
          ldmatrix_x4_trans(bfrag, v_tile + swizzled_chunk<kHeadDim * 2 / 16>(key, 2 * np + lane / 16) * 16);
#pragma unroll
          for (int t = 0; t < kTiles; ++t) {
            mma_16bit<T>(acc[t][2 * np], pfrag[t], bfrag[0], bfrag[1]);
            mma_16bit<T>(acc[t][2 * np + 1], pfrag[t], bfrag[2], bfrag[3]);
          }
        }
      }
    }
    __syncthreads();  // the next iteration's copy overwrites this stage
  }

  // out = acc / sum (· v_scale / 448 for e4m3 values), rows past Sq not written.
  const float value_unit = kE4m3 ? kFp8E4m3Max : 1.f;
  const float* v_scale = p.ops.v_scale + static_cast<int64_t>(bh) * kHeadDim;
  T* out = p.out + b * p.out_batch_stride + h * p.out_head_stride;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    float inv_sum[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[t][r] += __shfl_xor_sync(kFullMask, row_sum[t][r], 1);
      row_sum[t][r] += __shfl_xor_sync(kFullMask, row_sum[t][r], 2);
      inv_sum[r] = 1.f / (row_sum[t][r] * value_unit);
    }
#pragma unroll
    for (int n = 0; n < kChannelTiles; ++n) {
      const int c = 8 * n + 2 * quad_lane;
      const float vs0 = kE4m3 ? v_scale[c] : 1.f, vs1 = kE4m3 ? v_scale[c + 1] : 1.f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + warp_row0 + 16 * t + 8 * r + group;
        if (row < p.q_len) {
          typename detail::pair_type<T>::type pair;
          from_float_pair(acc[t][n][2 * r] * inv_sum[r] * vs0, acc[t][n][2 * r + 1] * inv_sum[r] * vs1, pair.x, pair.y);
          *reinterpret_cast<decltype(pair)*>(out + static_cast<int64_t>(row) * p.out_seq_stride + c) = pair;
        }
      }
    }
  }
#endif
}

}  // namespace attention_detail

// Bytes of dynamic shared memory the attention kernel takes: q's tile, two stages of k and of v.
template <int kHeadDim, typename T, ValuePrecision kValues, typename Policy = AttentionPolicy>
constexpr int attention_shared_bytes() {
  return attention_detail::query_tile_rows<Policy, kValues, kHeadDim>() * kHeadDim + 2 * Policy::kBlockKeys * kHeadDim +
         2 * attention_detail::value_tile_bytes<kHeadDim, T, Policy, kValues>();
}

// The workspace's tile-rounded sizes for the binding to allocate.
template <typename Policy = AttentionPolicy>
struct Attention8bitShape {
  int q_rows, k_rows, stats_chunks;
  static Attention8bitShape of(int q_len, int kv_len) {
    const int rows = q_len > kv_len ? q_len : kv_len;
    return {attention_detail::padded_q_rows<Policy>(q_len), attention_detail::padded_k_rows<Policy>(kv_len),
            (rows + Policy::kStatsChunk - 1) / Policy::kStatsChunk};
  }
};

// Runs the kernels (four with kInput values: v needs no codes) on `stream` for batch·heads = `batch_heads` (> 0) and Sq, Sk > 0. Returns the
// first launch or attribute error; never synchronizes.
template <int kHeadDim, typename T, ValuePrecision kValues, typename Policy = AttentionPolicy>
cudaError_t Attention8bit(const Attention8bitParams<T>& p, int batch_heads, cudaStream_t stream) {
  using namespace attention_detail;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims 64 and 128");
  using Params = Attention8bitParams<T>;
  const dim3 threads(Policy::kPrepThreads);
  constexpr int kRowsPerPrepBlock = Policy::kPrepThreads / lanes_per_row<kHeadDim>();
  constexpr bool kE4m3 = kValues == ValuePrecision::kE4m3;
  launch_kernel(kernel_entry<Params, column_stats_body<kHeadDim, T, Policy, kE4m3>>, dim3(p.stats_chunks, batch_heads),
                threads, 0, stream, p);
  launch_kernel(kernel_entry<Params, channel_scales_body<kHeadDim, T, Policy, kE4m3>>, dim3(batch_heads),
                dim3(kHeadDim), 0, stream, p);
  launch_kernel(kernel_entry<Params, quantize_q_body<kHeadDim, T, Policy>>,
                dim3((p.q_rows + kRowsPerPrepBlock - 1) / kRowsPerPrepBlock, batch_heads), threads, 0, stream, p);
  launch_kernel(kernel_entry<Params, quantize_k_body<kHeadDim, T, Policy>>,
                dim3(p.k_rows / Policy::kBlockKeys, batch_heads), threads, 0, stream, p);
  if constexpr (kE4m3) {
    launch_kernel(kernel_entry<Params, quantize_v_body<kHeadDim, T, Policy>>,
                  dim3(p.k_rows / Policy::kBlockKeys, batch_heads), threads, 0, stream, p);
  }
  constexpr int kShared = attention_shared_bytes<kHeadDim, T, kValues, Policy>();
  const auto attention = kernel_entry<Params, attention_body<kHeadDim, T, Policy, kValues>>;
  if (kShared > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(attention, cudaFuncAttributeMaxDynamicSharedMemorySize, kShared);
    if (err != cudaSuccess) return err;
  }
  launch_kernel(attention, dim3(p.q_rows / query_tile_rows<Policy, kValues, kHeadDim>(), batch_heads), dim3(Policy::kWarps * kWarpSize),
                kShared, stream, p);
  return cudaGetLastError();
}

}  // namespace transformer_kernels
