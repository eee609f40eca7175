// sanitize.sh's self-check: one out-of-bounds write in a kernel of our namespace and one in a kernel
// outside it (a library's stand-in). Under the script's kernel-name filter memcheck must report the
// first alone, and summarize.py must count it as ours; unfiltered, both, one of them ours.
#include <cstdio>
#include <cuda_runtime.h>

// Far past the end of the allocation: beyond memcheck's --padding (512 bytes) and any rounding up.
constexpr int kPastTheEnd = 4096;

namespace transformer_kernels {
__global__ void planted_out_of_bounds_write(float* out, int n) { out[n + kPastTheEnd] = 1.0f; }
}  // namespace transformer_kernels

__global__ void library_stand_in_out_of_bounds_write(float* out, int n) { out[n + kPastTheEnd] = 2.0f; }

int main() {
  const int n = 256;
  float* buf = nullptr;
  if (cudaMalloc(&buf, n * sizeof(float)) != cudaSuccess) return 2;
  transformer_kernels::planted_out_of_bounds_write<<<1, 1>>>(buf, n);
  cudaError_t first = cudaDeviceSynchronize();
  library_stand_in_out_of_bounds_write<<<1, 1>>>(buf, n);
  cudaError_t second = cudaDeviceSynchronize();
  std::printf("planted: %s, %s\n", cudaGetErrorName(first), cudaGetErrorName(second));
  return 0;
}
