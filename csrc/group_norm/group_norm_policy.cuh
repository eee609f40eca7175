// The values the GroupNorm kernels are compiled and launched with (CUB-style tuning policy), each
// with its reason. What was measured, and what is assumed until the GPU lab tries alternatives:
// benchmarks/NOTES.md §"Tuning values assumed, not measured".
#pragma once

namespace transformer_kernels {

struct GroupNormPolicy {
  // Vectors a thread keeps in registers between the statistics and the normalization (whole groups)
  // or across a chunk (split groups: a chunk is exactly threads * kCachedVecs vectors, read once).
  static constexpr int kCachedVecs = 4;
  // Threads of a whole-group block (a block per group).
  static constexpr int kMaxThreads = 1024;
  // Threads of a split chunk's block: 256 * 4 vectors = 16 KB per block.
  static constexpr int kSplitThreads = 256;
  // Whole groups only when there are enough of them to fill the GPU: at least this many per SM.
  static constexpr int kWholeGroupsPerSm = 2;
  // Split channels-first groups of more chunks than a warp's lanes are combined once per group by a
  // finalize kernel, not by every normalizing block (a serial merge chain per lane in each prologue).
  static constexpr int kInlineCombineParts = 32;
  // Vectors a thread loads before using any, in the streaming passes (loads in flight per thread).
  static constexpr int kUnroll = 4;
  // Channels-last blocks: about kRowThreads threads, at most kMaxRowLanes rows at once (the
  // per-channel sums over row lanes are serial in shared memory).
  static constexpr int kRowThreads = 512;
  static constexpr int kMaxRowLanes = 32;
  // Channels-last rows: at most this many vectors across a row (one thread each), so that kernel 1's
  // shared memory ((2 * row lanes + 1) * C floats, row lanes * C <= kRowThreads * vec) stays within the
  // 48 KB a block gets without opting in.
  static constexpr int kMaxColThreads = kRowThreads;
  // Channels-last kernel 1 combines a group's channels in one thread up to this many channels per
  // group (SD's 10-40), else in a warp (shuffle reductions cost more than a few serial adds).
  static constexpr int kSerialGroupChannels = 64;
  // Register cap of the streaming kernels: 64 lets 4 blocks of 256 threads (channels-first) or 2 of
  // 512 (channels-last normalize) share an SM; ptxas's own choice for bf16 (66-80) fits 3 or 1 (sm_90,
  // ptxas -v: no spills at 64 but 6 bytes in the bf16 whole-group kernel).
  static constexpr int kRegisterCap = 64;
  // Channels-last kernel 1 keeps two fp32 sums per channel of its vector and 4 row vectors in flight:
  // ptxas wants 94 (bf16, sm_90) and spills 138 bytes at 64. It gets what a block of kRowThreads may
  // use (1 block of 512 threads per SM, 32 KB of loads in flight: enough to cover HBM latency).
  static constexpr int kStatsRegisterCap = 65536 / kRowThreads;
  // Threads of the finalize kernel: 8 warps, one (n, g) each.
  static constexpr int kFinalizeThreads = 256;
  // The backward (NOTES.md §GroupNorm backward; assumed, not compared with alternatives): threads of
  // its blocks; tiles of the channel sums for at least this many blocks an SM, each thread with at
  // least this many positions of its channel (else fewer tiles).
  static constexpr int kBackwardBlockThreads = 256;
  static constexpr int kBackwardBlocksPerSm = 4;
  static constexpr int kBackwardMinRowsPerThread = 8;
  // Positions of its channel a backward thread loads before using any (loads in flight per thread).
  static constexpr int kBackwardUnroll = 4;
};

}  // namespace transformer_kernels
