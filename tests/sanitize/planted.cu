// sanitize.sh's self-check: an out-of-bounds write in a kernel of our namespace (`planted ours`) or in
// a kernel outside it, a library's stand-in (`planted library`); one per run, since the first leaves
// the context unusable. Under the script's kernel-name filter memcheck must report ours and not the
// library's; unfiltered, the library's, which summarize.py must not count as ours.
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

// Far past the end of the allocation: beyond memcheck's --padding (512 bytes) and any rounding up.
constexpr int kPastTheEnd = 4096;

namespace transformer_kernels {
__global__ void planted_out_of_bounds_write(float* out, int n) { out[n + kPastTheEnd] = 1.0f; }
}  // namespace transformer_kernels

__global__ void library_stand_in_out_of_bounds_write(float* out, int n) { out[n + kPastTheEnd] = 2.0f; }

int main(int argc, char** argv) {
  const bool ours = argc > 1 && std::strcmp(argv[1], "ours") == 0;
  const int n = 256;
  float* buf = nullptr;
  if (cudaMalloc(&buf, n * sizeof(float)) != cudaSuccess) return 2;
  if (ours) {
    transformer_kernels::planted_out_of_bounds_write<<<1, 1>>>(buf, n);
  } else {
    library_stand_in_out_of_bounds_write<<<1, 1>>>(buf, n);
  }
  std::printf("planted %s: %s\n", ours ? "ours" : "library", cudaGetErrorName(cudaDeviceSynchronize()));
  return 0;
}
