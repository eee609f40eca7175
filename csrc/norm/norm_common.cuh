// What the norm forward (norm_kernel.cuh) and backward (norm_backward.cuh) kernels share: which
// norm, how a row is passed over, and the statistics a chunk of a split row leaves for its row.
// Torch-free.
#pragma once

namespace transformer_kernels {

// kNone: no norm, only the pre-add (gated_add's backward; its forward is the elementwise kernel).
enum class NormType { kRms, kLayer, kNone };

// Whole rows (one row group per row), or rows split into column chunks (a few very wide rows would
// otherwise leave most SMs idle, or a row is wider than a row group holds): the first kernel writes
// each chunk's statistics, the second combines a row's statistics and finishes its chunk.
enum class RowPass { kWholeRow, kChunkStats, kChunkFromStats };

// The floats of one chunk's statistics.
struct ChunkStatFloats {
  // count, sum of squares (RMSNorm) or mean (LayerNorm), M2
  static constexpr int kForward = 3;
  // RMSNorm: sum h^2, sum g h; LayerNorm: count, mean, M2, sum g, sum g (h - mean)
  static constexpr int kBackward = 5;
};

}  // namespace transformer_kernels
