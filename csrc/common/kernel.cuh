// The __global__ entry points of the op families: one around a kernel's device body, with or
// without a register cap. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include "common/math.cuh"
#include "common/reduce.cuh"

namespace transformer_kernels {

// ptxas chooses the registers.
constexpr int kNoRegisterCap = 0;

// The entry of a kernel whose work is the device function kBody (params by value, as kernels take them).
template <typename Params, void (*kBody)(const Params&)>
__global__ void kernel_entry(const Params p) {
  kBody(p);
}

// The same with at most kRegisterCap registers per thread (__maxnreg__), so that more warps fit per
// SM. A separate entry, launched only where the cap was measured to help (workshop/lab): the
// attribute on every kernel, even a cap of 255, changes ptxas's allocation for the others too.
template <int kRegisterCap, typename Params, void (*kBody)(const Params&)>
__global__ void __maxnreg__(kRegisterCap) capped_kernel_entry(const Params p) {
  kBody(p);
}

// The entry to launch for kBody (a cap knob set to 0, kNoRegisterCap, gives the uncapped one).
template <int kRegisterCap, typename Params, void (*kBody)(const Params&)>
constexpr auto kernel_entry_for() {
  if constexpr (kRegisterCap == kNoRegisterCap) {
    return &kernel_entry<Params, kBody>;
  } else {
    return &capped_kernel_entry<kRegisterCap, Params, kBody>;
  }
}

// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...), or nothing where the grid has no
// block: an empty grid is no work, and CUDA refuses it as an invalid argument. Every launch of the
// kernels goes through here (tests/package/test_layering.py checks that no other `<<<` exists).
template <typename Kernel, typename... Args>
void launch_kernel(Kernel kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                   const Args&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
}

}  // namespace transformer_kernels
