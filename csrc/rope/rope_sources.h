// The cos/sin sources of the RoPE bindings (forward and backward), filled from their tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <type_traits>

#include "rope/rope.cuh"

namespace transformer_kernels {

// Sets a kernel's params (any with cos, sin, table_b, table_s) from full-width tables
// cos, sin [B or 1, S, L]; the table dtype is the params' own.
inline auto from_tables(const at::Tensor& cos, const at::Tensor& sin) {
  return [&cos, &sin](auto& p) {
    using Table = std::remove_const_t<std::remove_pointer_t<decltype(p.cos)>>;
    p.cos = static_cast<const Table*>(cos.const_data_ptr());
    p.sin = static_cast<const Table*>(sin.const_data_ptr());
    p.table_b = cos.size(0) == 1 ? 0 : cos.stride(0);
    p.table_s = cos.stride(1);
  };
}

// LTX's coordinates for rows of width C: grid [B or 1, S, 3] (any strides), freqs [C / 6].
inline LtxCoords ltx_coords(const at::Tensor& grid, const at::Tensor& freqs, int64_t width) {
  LtxCoords c;
  c.grid = static_cast<const float*>(grid.const_data_ptr());  // untyped: meta stand-ins have none
  c.grid_b = grid.size(0) == 1 ? 0 : grid.stride(0);
  c.grid_s = grid.stride(1);
  c.grid_c = grid.stride(2);
  c.freqs = static_cast<const float*>(freqs.const_data_ptr());  // never read when C < 6 (no angles)
  c.pad_pairs = static_cast<int>(width % 6 / 2);
  return c;
}

}  // namespace transformer_kernels
