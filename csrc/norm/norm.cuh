// Row normalization with the fusions around it (the formulas: norm_kernel.cuh): the launch
// heuristics and the host launcher. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/kernel.cuh"
#include "common/schedule.cuh"
#include "common/vec.cuh"
#include "norm/norm_kernel.cuh"
#include "norm/norm_policy.cuh"

namespace transformer_kernels {

// Chunks of Policy::kSplitChunkElems columns a row of `hidden` splits into.
template <typename Policy = NormPolicy>
constexpr int norm_chunks(int64_t hidden) {
  return static_cast<int>(ceil_div(hidden, Policy::kSplitChunkElems));
}

// Chunks per row (1: rows are not split). The caller allocates split_stats for them.
template <typename Policy = NormPolicy>
inline int norm_split_chunks(int64_t num_rows, int64_t hidden, int sm_count) {
  return split_row_chunks(num_rows, hidden, sm_count, Policy::kSplitMinHidden, Policy::kSplitChunkElems);
}

namespace norm_detail {

// The entry of norm_body: the modulated RMSNorms run under Policy::kModulatedRmsRegisterCap, the
// others keep ptxas's choice.
template <typename Op, int kVec, int kThreadsPerRow, RowPass kPass = RowPass::kWholeRow>
constexpr auto norm_kernel() {
  constexpr int kCap =
      Op::kType == NormType::kRms && Op::kModulated ? Op::policy::kModulatedRmsRegisterCap : kNoRegisterCap;
  return kernel_entry_for<kCap, typename Op::Params, norm_body<Op, kVec, kThreadsPerRow, kPass>>();
}

// Block per row (or per chunk): enough threads that each keeps at most its cached vectors of `vecs`,
// in whole warps, within what kKernel's registers allow (wider rows re-read their remainder).
template <typename Op, auto kKernel>
int block_threads(int64_t vecs) {
  const int limit = max_block_threads<kKernel>(Op::policy::kGroupBlockThreads);
  const int wanted = std::min({kMaxBlockThreads, limit, warps_covering(vecs, Op::template cached_vecs<0>())});
  return std::max(kWarpSize, wanted);  // a whole warp even for a row of no vectors (a launch of 0 threads fails)
}

// Row groups (Policy::RowGroups) for rows that fit them, a block per row beyond;
// split rows (p.split_chunks > 1; not with an FP8 output, whose row scale needs the whole row): two
// launches over (chunk, row), the statistics first. These are
// compiled for the 16-byte path of the unmodulated norms; the modulated norms (DiT blocks: rows of
// 1536 and more in every supported model) and the scalar path (misaligned views) take a block per
// whole row at every width (NOTES.md §Build size and instantiations).
template <typename Op, int kVec>
cudaError_t LaunchNorm(const typename Op::Params& p, cudaStream_t stream) {
  using Policy = typename Op::policy;
  constexpr bool kEverySchedule = kVec > 1 && !Op::kModulated;
  const int64_t num_vecs = p.hidden / kVec;
  if constexpr (kEverySchedule && !Op::kFp8Out) {
    if (p.split_chunks > 1) {
      constexpr auto kStats = norm_kernel<Op, kVec, 0, RowPass::kChunkStats>();
      constexpr auto kFromStats = norm_kernel<Op, kVec, 0, RowPass::kChunkFromStats>();
      const int64_t chunk_vecs = p.split_chunk_elems / kVec;
      const dim3 grid(static_cast<unsigned>(p.split_chunks), static_cast<unsigned>(p.num_rows));
      launch_kernel(kStats, grid, block_threads<Op, kStats>(chunk_vecs), 0, stream, p);
      launch_kernel(kFromStats, grid, block_threads<Op, kFromStats>(chunk_vecs), 0, stream, p);
      return cudaGetLastError();
    }
  }
  using Groups = typename Policy::RowGroups;
  const int lanes = kEverySchedule ? row_group_lanes(Groups{}, num_vecs, Op::template cached_vecs<kWarpSize>()) : 0;
  with_row_group_lanes(Groups{}, lanes, [&](auto lanes_tag) {
    constexpr int kLanes = kEverySchedule ? decltype(lanes_tag)::value : 0;
    constexpr auto kKernel = norm_kernel<Op, kVec, kLanes>();
    if constexpr (kLanes == 0) {
      launch_kernel(kKernel, grid_for(p.num_rows, 1), block_threads<Op, kKernel>(num_vecs), 0, stream, p);
    } else {
      launch_kernel(kKernel, grid_for(p.num_rows, Policy::kGroupBlockThreads / kLanes), Policy::kGroupBlockThreads, 0,
                    stream, p);
    }
  });
  return cudaGetLastError();
}

// The 16-byte path takes whole vectors only: the width a multiple of the vector, every pointer and
// row stride aligned. A tail after the vectors (NormRow::has_tail) is never launched: with one, a
// row's bits depended on its batch (a single row has no stride to misalign), 4-lane row groups
// dropped tail elements past the 4th, and a modulated row shorter than a vector got 0 threads.
template <typename T, typename W, typename O>
bool vectorizable(const NormParams<T, W, O>& p, int vec) {
  auto ok = [&](const void* ptr, int bytes_per_vec, const RowIndexer* rows) {
    if (ptr == nullptr) return true;
    const int align = bytes_per_vec < kVecBytes ? bytes_per_vec : kVecBytes;
    return reinterpret_cast<uintptr_t>(ptr) % align == 0 && (rows == nullptr || rows->rows_aligned_to(vec));
  };
  return p.hidden % vec == 0 && ok(p.x, vec * sizeof(T), &p.x_rows) &&
         ok(p.residual, vec * sizeof(T), &p.residual_rows) && ok(p.gate, vec * sizeof(T), &p.gate_rows) &&
         ok(p.weight, vec * sizeof(W), nullptr) && ok(p.bias, vec * sizeof(W), nullptr) &&
         ok(p.scale, vec * sizeof(T), &p.scale_rows) && ok(p.shift, vec * sizeof(T), &p.shift_rows) &&
         ok(p.out, vec * sizeof(O), &p.out_rows) && ok(p.h_out, vec * sizeof(T), &p.h_rows);
}

}  // namespace norm_detail

// Host launcher: 16-byte vectors when the width and every pointer and row stride allow it
// (vectorizable), scalar otherwise.
// kMod requires p.scale (p.shift optional); without kMod scale and shift are ignored. p.split_chunks
// > 1 (from norm_split_chunks) needs p.split_stats and lets the 16-byte path of the unmodulated
// norms split rows (two launches). out_t uint8_t (an FP8 output: e4m3 codes) needs p.out_scale and
// whole rows (split_chunks 1).
template <NormType kNorm, PreAdd kPre, bool kMod, typename Policy = NormPolicy, typename T, typename weight_t,
          typename out_t>
cudaError_t norm(const NormParams<T, weight_t, out_t>& p, cudaStream_t stream) {
  if (p.num_rows == 0 || p.hidden == 0) return cudaSuccess;
  if (p.split_chunks > 1 && (p.split_stats == nullptr || p.split_chunk_elems != Policy::kSplitChunkElems ||
                             norm_chunks<Policy>(p.hidden) != p.split_chunks))
    return cudaErrorInvalidValue;
  using Op = NormOp<Policy, T, weight_t, out_t, kNorm, kPre, kMod>;
  if (Op::kFp8Out && (p.out_scale == nullptr || p.split_chunks > 1)) return cudaErrorInvalidValue;
  constexpr int kVec = vec_size<T>();
  return norm_detail::vectorizable(p, kVec) ? norm_detail::LaunchNorm<Op, kVec>(p, stream)
                                            : norm_detail::LaunchNorm<Op, 1>(p, stream);
}

}  // namespace transformer_kernels
