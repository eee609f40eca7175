// Backward of the fused q/k RMSNorm + RoPE ops (qk_norm_rope.cuh: LTX-Video across heads, Flux and
// Qwen3 per head, LTX's coordinate form). Torch-free: the kernel, its plan and a host launcher.
//
// Forward per row of width L, roundings taken as identities: n = xhat * w, xhat = x * rstd,
// rstd = rsqrt(mean(x^2) + eps); out = rotate(n) with out1 = n1 c1 - n2 s1, out2 = n2 c2 + n1 s2 for
// each pair (n1, n2) (interleaved: elements 2i, 2i + 1; half rotation: i, i + L/2) and the tables'
// cos/sin at the two elements. Backward, from dout:
//   dn1 = dout1 c1 + dout2 s2,  dn2 = dout2 c2 - dout1 s1     (the transposed rotation: by -angle)
//   g = dn * w,  dx = rstd * (g - xhat * mean(g * xhat)),  dw = sum over rows of dn * xhat
// q's rows and k's rows are taken apart (each block works on one of them), so a block sums one
// weight's gradient; the statistics are recomputed from x (read anyway).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/divmod.cuh"
#include "common/kernel.cuh"
#include "common/math.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "common/grad_reduce.cuh"
#include "rope/rope.cuh"

namespace transformer_kernels {

template <typename T, typename weight_t, typename table_t>
struct QkNormRopeBackwardParams {
  QkRows<T> grads;   // .q, .k: gradients of the forward's outputs (read); .q_out, .k_out: dq, dk (written)
  QkRows<T> inputs;  // .q, .k: the forward's inputs (read); .q_out, .k_out unused
  const weight_t* q_weight;  // [L] contiguous
  const weight_t* k_weight;  // [L] contiguous
  const table_t* cos = nullptr;  // [B or 1, S, L]; coordinate form: unused
  const table_t* sin = nullptr;  // [B or 1, S, L]
  int64_t table_b = 0, table_s = 0;  // strides of cos and sin, in elements; table_b 0 when shared
  LtxCoords coords;                  // coordinate form only
  int width;                         // L, even
  float eps;
  float* q_partials = nullptr;  // [q_items, L]: q_weight's gradient partial sums, or none
  float* k_partials = nullptr;  // [k_items, L]
  // Set by the plan: q's rows (token * Hq + head) in items of rows_per_item, then k's.
  int row_threads = 1;
  int64_t rows_per_item = 1;
  int64_t q_items = 0;
  FastDivmod q_heads, k_heads;  // valid when grads.fast
};

namespace qk_norm_rope_backward_detail {

TK_HOST_DEVICE constexpr int unit_vecs(bool half_rotation) { return half_rotation ? 2 : 1; }

// Units (a vector, and its partner half a row on for the half rotation) each thread holds.
TK_HOST_DEVICE constexpr int units_per_thread(bool half_rotation, int vec) {
  return kBackwardElems / (vec * unit_vecs(half_rotation)) > 0 ? kBackwardElems / (vec * unit_vecs(half_rotation))
                                                               : 1;
}

template <bool kHalfRotation, CosSinSource kSource, typename T, typename weight_t, typename table_t, int kVec>
TK_DEVICE void qk_norm_rope_backward_body(const QkNormRopeBackwardParams<T, weight_t, table_t>& p) {
  constexpr bool kCoords = kSource == CosSinSource::kLtxCoords;
  static_assert(kSource == CosSinSource::kTables || (kCoords && !kHalfRotation), "tables, or LTX's coordinates");
  static_assert(kHalfRotation || kVec % 2 == 0, "interleaved pairs need whole pairs in a vector");
  constexpr int kUnitVecs = unit_vecs(kHalfRotation);
  constexpr int kUnits = units_per_thread(kHalfRotation, kVec);
  constexpr int kElems = kUnits * kUnitVecs * kVec;
  using vec = vec_t<T, kVec>;

  const int threads = p.row_threads;
  const int lane = threadIdx.x % threads;
  const int group = threadIdx.x / threads;
  const int groups = blockDim.x / threads;
  const bool is_k = blockIdx.x >= p.q_items;
  const int64_t item = is_k ? blockIdx.x - p.q_items : blockIdx.x;
  const int heads = is_k ? p.grads.num_k_heads : p.grads.num_q_heads;
  const int64_t part_rows = p.grads.batch * p.grads.seq * heads;
  const int64_t first = item * p.rows_per_item;
  const int64_t last = std::min(first + p.rows_per_item, part_rows);
  const weight_t* weight = is_k ? p.k_weight : p.q_weight;
  const int num_units = p.width / (kVec * kUnitVecs);
  // First element of vector j of unit u: the unit's own vector, then its partner half a row on.
  auto at = [num_units](int u, int j) { return (u + j * num_units) * kVec; };
  auto unit_of = [&](int c) { return lane + c * threads; };

  float w[kUnits][kUnitVecs][kVec], acc[kUnits][kUnitVecs][kVec] = {};
#pragma unroll
  for (int c = 0; c < kUnits; ++c) {
#pragma unroll
    for (int j = 0; j < kUnitVecs; ++j) {
      if (unit_of(c) < num_units) {
        vec_t<weight_t, kVec> wv;
        wv.load(weight + at(unit_of(c), j));
        wv.cast_to(w[c][j]);
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) w[c][j][i] = 0.f;
      }
    }
  }

  const int64_t steps = first < last ? (last - first + groups - 1) / groups : 0;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t row = first + step * groups + group;
    const bool active = row < last;
    const int64_t r = active ? row : first;
    // The row's token and head (q's heads first in QkRows).
    int64_t token, head;
    if (p.grads.fast) {
      uint32_t quotient, remainder;
      (is_k ? p.k_heads : p.q_heads).divmod(static_cast<uint32_t>(r), &quotient, &remainder);
      token = quotient, head = remainder;
    } else {
      token = r / heads, head = r % heads;
    }
    int64_t b, s;
    p.grads.token_at(token, b, s);
    const int qk_head = static_cast<int>(is_k ? p.grads.num_q_heads + head : head);
    const T *dout, *x;
    T *dx, *unused;
    p.grads.head_at(b, s, qk_head, dout, dx);
    p.inputs.head_at(b, s, qk_head, x, unused);
    const table_t* cos = kCoords ? nullptr : p.cos + b * p.table_b + s * p.table_s;
    const table_t* sin = kCoords ? nullptr : p.sin + b * p.table_b + s * p.table_s;
    float g3[3];  // coordinate form: the token's grid * 2 - 1
    if constexpr (kCoords) p.coords.token(b, s, g3);

    float h[kUnits][kUnitVecs][kVec], dn[kUnits][kUnitVecs][kVec];
    float sums[2] = {0.f, 0.f};  // sum x^2, sum g x
#pragma unroll
    for (int c = 0; c < kUnits; ++c) {
      const int u = unit_of(c);
#pragma unroll
      for (int j = 0; j < kUnitVecs; ++j) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) h[c][j][i] = dn[c][j][i] = 0.f;
      }
      if (!active || u >= num_units) continue;
      float dy[kUnitVecs][kVec], cs[kUnitVecs][kVec], sn[kUnitVecs][kVec];
#pragma unroll
      for (int j = 0; j < kUnitVecs; ++j) {
        vec v;
        v.load(x + at(u, j));
        v.cast_to(h[c][j]);
        v.load(dout + at(u, j));
        v.cast_to(dy[j]);
        if constexpr (!kCoords) {
          vec_t<table_t, kVec> tv;
          tv.load(cos + at(u, j));
          tv.cast_to(cs[j]);
          tv.load(sin + at(u, j));
          tv.cast_to(sn[j]);
        }
      }
      if constexpr (kCoords) {  // one angle per pair
        float pc[kVec / 2], ps[kVec / 2];
        p.coords.cos_sin(g3, at(u, 0) / 2, pc, ps);
#pragma unroll
        for (int i = 0; i < kVec / 2; ++i) {
          cs[0][2 * i] = cs[0][2 * i + 1] = pc[i];
          sn[0][2 * i] = sn[0][2 * i + 1] = ps[i];
        }
      }
      if constexpr (kHalfRotation) {  // element i of the first half pairs with element i of the second
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          dn[c][0][i] = dy[0][i] * cs[0][i] + dy[1][i] * sn[1][i];
          dn[c][1][i] = dy[1][i] * cs[1][i] - dy[0][i] * sn[0][i];
        }
      } else {  // pairs (2i, 2i + 1) within the vector
#pragma unroll
        for (int i = 0; i < kVec; i += 2) {
          dn[c][0][i] = dy[0][i] * cs[0][i] + dy[0][i + 1] * sn[0][i + 1];
          dn[c][0][i + 1] = dy[0][i + 1] * cs[0][i + 1] - dy[0][i] * sn[0][i];
        }
      }
#pragma unroll
      for (int j = 0; j < kUnitVecs; ++j) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          sums[0] += h[c][j][i] * h[c][j][i];
          sums[1] += dn[c][j][i] * w[c][j][i] * h[c][j][i];
        }
      }
    }
    row_group_sum(sums, threads);
    if (!active) continue;
    const float inv_n = 1.f / static_cast<float>(p.width);
    const float rstd = rsqrtf(sums[0] * inv_n + p.eps);
    const float c_gx = sums[1] * rstd * inv_n;
#pragma unroll
    for (int c = 0; c < kUnits; ++c) {
      const int u = unit_of(c);
      if (u >= num_units) continue;
#pragma unroll
      for (int j = 0; j < kUnitVecs; ++j) {
        float d[kVec];
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float xhat = h[c][j][i] * rstd;
          d[i] = rstd * (dn[c][j][i] * w[c][j][i] - xhat * c_gx);
          acc[c][j][i] += dn[c][j][i] * xhat;
        }
        vec o;
        o.cast_from(d);
        o.store(dx + at(u, j));
      }
    }
  }

  float* partials = is_k ? p.k_partials : p.q_partials;
  if (partials == nullptr) return;  // uniform over the block
  float flat[kElems];
#pragma unroll
  for (int c = 0; c < kUnits; ++c) {
#pragma unroll
    for (int j = 0; j < kUnitVecs; ++j) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) flat[(c * kUnitVecs + j) * kVec + i] = acc[c][j][i];
    }
  }
  // Column col is element i of vector j of unit u: u = lane + c * threads.
  auto slot_of = [threads, num_units](int col, int& slot_lane, int& e) {
    const int v = col / kVec, j = v / num_units, u = v % num_units;
    slot_lane = u % threads;
    e = ((u / threads) * kUnitVecs + j) * kVec + col % kVec;
  };
  store_block_partials(flat, partials + item * p.width, p.width, threads, slot_of);
}

template <bool kHalfRotation, CosSinSource kSource, typename T, typename weight_t, typename table_t, int kVec>
constexpr auto qk_norm_rope_backward_kernel() {
  return kernel_entry_for<kNoRegisterCap, QkNormRopeBackwardParams<T, weight_t, table_t>,
                          qk_norm_rope_backward_body<kHalfRotation, kSource, T, weight_t, table_t, kVec>>();
}

}  // namespace qk_norm_rope_backward_detail

// The narrowest vector each pair layout can use: one element for the half rotation, one pair for
// interleaved pairs.
TK_HOST_DEVICE constexpr int qk_backward_min_vec(bool half_rotation) { return half_rotation ? 1 : 2; }

// True when every pointer and stride allows vectors of kElems elements and the row splits into
// whole units of them.
template <bool kHalfRotation, CosSinSource kSource, int kElems, typename T, typename weight_t, typename table_t>
bool qk_norm_rope_backward_aligned(const QkNormRopeBackwardParams<T, weight_t, table_t>& p) {
  const bool tables_ok = kSource == CosSinSource::kLtxCoords ||
                         (is_vec_aligned<table_t, kElems>(p.cos) && is_vec_aligned<table_t, kElems>(p.sin) &&
                          p.table_b % kElems == 0 && p.table_s % kElems == 0);
  return p.width % (kElems * qk_norm_rope_backward_detail::unit_vecs(kHalfRotation)) == 0 &&
         p.grads.template aligned<kElems>() && p.inputs.template aligned<kElems>() &&
         is_vec_aligned<weight_t, kElems>(p.q_weight) && is_vec_aligned<weight_t, kElems>(p.k_weight) && tables_ok;
}

struct QkNormRopeBackwardPlan {
  bool vectorized = false;
  int block_threads = 0;
  size_t shared_bytes = 0;
  int64_t q_items = 0, k_items = 0;
};

// Plans the launch (sets p.row_threads, rows_per_item, q_items and the head dividers). False when a
// row needs more threads (or their partial sums more shared memory) than a block can have;
// the caller checks the narrow path's alignment (qk_norm_rope_backward_aligned with
// qk_backward_min_vec) first. The caller then allocates q/k_partials (q_items / k_items rows).
template <bool kHalfRotation, CosSinSource kSource, typename T, typename weight_t, typename table_t>
bool plan_qk_norm_rope_backward(QkNormRopeBackwardParams<T, weight_t, table_t>& p, int sm_count,
                                QkNormRopeBackwardPlan* plan) {
  using namespace qk_norm_rope_backward_detail;
  constexpr int kVec = vec_size<T>();
  constexpr int kMinVec = qk_backward_min_vec(kHalfRotation);
  constexpr auto kVecKernel = qk_norm_rope_backward_kernel<kHalfRotation, kSource, T, weight_t, table_t, kVec>();
  constexpr auto kMinKernel = qk_norm_rope_backward_kernel<kHalfRotation, kSource, T, weight_t, table_t, kMinVec>();
  plan->vectorized = qk_norm_rope_backward_aligned<kHalfRotation, kSource, kVec>(p);
  const int vec = plan->vectorized ? kVec : kMinVec;
  const int units = units_per_thread(kHalfRotation, vec);
  const int elems = units * unit_vecs(kHalfRotation) * vec;
  p.row_threads = backward_row_threads(p.width / (vec * unit_vecs(kHalfRotation)), units);
  const int max_threads = plan->vectorized ? max_block_threads<kVecKernel>(kBackwardBlockThreads)
                                           : max_block_threads<kMinKernel>(kBackwardBlockThreads);
  if (p.row_threads > max_threads) return false;
  plan->block_threads = backward_block_threads(p.row_threads);
  plan->shared_bytes = backward_shared_bytes(plan->block_threads, elems);
  if (plan->shared_bytes > kBackwardMaxSharedBytes) return false;
  const int64_t target =
      plan->vectorized ? backward_target_blocks<kVecKernel>(plan->block_threads, plan->shared_bytes, sm_count)
                       : backward_target_blocks<kMinKernel>(plan->block_threads, plan->shared_bytes, sm_count);
  const int64_t tokens = p.grads.batch * p.grads.seq;
  const int64_t q_rows = tokens * p.grads.num_q_heads, k_rows = tokens * p.grads.num_k_heads;
  const int64_t groups = plan->block_threads / p.row_threads;
  p.rows_per_item = std::max<int64_t>(groups, (q_rows + k_rows + target - 1) / std::max<int64_t>(1, target));
  plan->q_items = p.q_items = (q_rows + p.rows_per_item - 1) / p.rows_per_item;
  plan->k_items = (k_rows + p.rows_per_item - 1) / p.rows_per_item;
  if (p.grads.fast) {
    p.q_heads = FastDivmod(static_cast<uint32_t>(std::max(1, p.grads.num_q_heads)));
    p.k_heads = FastDivmod(static_cast<uint32_t>(std::max(1, p.grads.num_k_heads)));
  }
  return true;
}

// Launches the planned kernel, then the column sums of the weights' gradients into dq_weight and
// dk_weight ([L] each, weight_t; nullptr where not wanted, as the partials).
template <bool kHalfRotation, CosSinSource kSource, typename T, typename weight_t, typename table_t>
cudaError_t QkNormRopeBackward(const QkNormRopeBackwardParams<T, weight_t, table_t>& p,
                                  const QkNormRopeBackwardPlan& plan, weight_t* dq_weight, weight_t* dk_weight,
                                  cudaStream_t stream) {
  using namespace qk_norm_rope_backward_detail;
  constexpr int kVec = vec_size<T>();
  constexpr int kMinVec = qk_backward_min_vec(kHalfRotation);
  const int64_t blocks = plan.q_items + plan.k_items;
  if (blocks > 0) {
    const dim3 grid(static_cast<unsigned>(blocks));
    if (plan.vectorized) {
      launch_kernel(qk_norm_rope_backward_kernel<kHalfRotation, kSource, T, weight_t, table_t, kVec>(),
                    grid, plan.block_threads, plan.shared_bytes, stream, p);
    } else {
      launch_kernel(qk_norm_rope_backward_kernel<kHalfRotation, kSource, T, weight_t, table_t, kMinVec>(),
                    grid, plan.block_threads, plan.shared_bytes, stream, p);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  ColumnSumParams<weight_t> sums;
  sums.hidden = p.width;
  if (p.q_partials != nullptr) sums.sums[sums.num_sums++] = {p.q_partials, dq_weight, plan.q_items, 1};
  if (p.k_partials != nullptr) sums.sums[sums.num_sums++] = {p.k_partials, dk_weight, plan.k_items, 1};
  return column_sums(sums, stream);
}

}  // namespace transformer_kernels
