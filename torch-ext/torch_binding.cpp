// Op schemas and their CUDA implementations. The namespace (TORCH_EXTENSION_NAME) carries a
// per-build id and is only known at build time; Python reaches the ops through `_ops.ops`.
#include <torch/library.h>

#include "registration.h"
#include "torch_binding.h"

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // RMSNorm over the last dim; rounding "hf" | "diffusers" | "torch" picks the module to match.
  ops.def("rms_norm(Tensor! out, Tensor x, Tensor? weight, float eps, str rounding) -> ()");
  ops.impl("rms_norm", torch::kCUDA, &transformer_kernels::rms_norm);
  // CPU tensors reach the same entry point so they fail with a clear "must be a CUDA tensor".
  ops.impl("rms_norm", torch::kCPU, &transformer_kernels::rms_norm);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
