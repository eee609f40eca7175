// Op schemas and their CUDA implementations. The namespace (TORCH_EXTENSION_NAME) carries a
// per-build id and is only known at build time; Python reaches the ops through `_ops.ops`.
#include <torch/library.h>

#include "registration.h"
#include "torch_binding.h"

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // Every op is registered for CPU too, with the same entry point: CPU tensors then fail with a
  // clear "must be a CUDA tensor" instead of the dispatcher's "no kernel for CPU".
  const auto cuda_and_cpu = {torch::kCUDA, torch::kCPU};

  // RMSNorm over the last dim; rounding "hf" | "diffusers" | "torch" picks the module to match.
  ops.def("rms_norm(Tensor x, Tensor? weight, float eps, str rounding) -> Tensor");
  ops.def("rms_norm_out(Tensor! out, Tensor x, Tensor? weight, float eps, str rounding) -> ()");
  for (const auto key : cuda_and_cpu) {
    ops.impl("rms_norm", key, &transformer_kernels::rms_norm);
    ops.impl("rms_norm_out", key, &transformer_kernels::rms_norm_out);
  }
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
