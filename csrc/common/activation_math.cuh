// The activations as the kernels compute them, in fp32 with ATen's CUDA formulas (F.silu, F.gelu
// bit for bit after the rounding to the storage type). Shared math: the elementwise engine, the
// activations' backward, GroupNorm + SiLU, the quantizing gated unit. Torch-free.
#pragma once

#include "common/math.cuh"

namespace transformer_kernels {

// kNone: no activation (the gated add; a GEMM epilogue without one).
enum class Activation { kSilu, kGelu, kGeluTanh, kNone };

// silu(x) = x / (1 + exp(-x))
template <Activation kAct>
TK_DEVICE float activate(float x) {
  static_assert(kAct != Activation::kNone, "no activation to apply");
  if constexpr (kAct == Activation::kSilu) {
    return x / (1.f + expf(-x));
  } else if constexpr (kAct == Activation::kGelu) {
    // gelu(x) = x * 0.5 * (1 + erf(x / sqrt(2)))
    constexpr float kAlpha = 0.70710678118654752440f;  // M_SQRT1_2
    return x * 0.5f * (1.f + erff(x * kAlpha));
  } else {
    // gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
    constexpr float kBeta = 0.79788456080286535588f;  // M_SQRT2 * M_2_SQRTPI * 0.5
    constexpr float kKappa = 0.044715f;
    const float x_cube = x * x * x;
    const float inner = kBeta * (x + kKappa * x_cube);
    return 0.5f * x * (1.f + tanhf(inner));
  }
}

}  // namespace transformer_kernels
