"""The gemm family's eager CPU stand-ins (tests/eager_kernel.py gathers them): F.linear then GELU
(tanh), and the FP8 and decode linears on the dequantized operands in fp32 (the GEMMs' accumulator),
rounded once."""

import torch.nn.functional as F


def _decode_linear(x, weight, weight_scale, bias):
    """The decode linear layer in fp32 (its accumulator) on the dequantized weight, rounded once."""
    w = weight.float() if weight_scale is None else weight.float() * weight_scale.reshape(-1, 1)
    return F.linear(x.float(), w, None if bias is None else bias.float()).to(x.dtype)


def _linear_fp8(x, x_scale, weight, weight_scale, bias, out_dtype, activation):
    """The FP8 linear on the dequantized operands in fp32 (the GEMM's accumulator), rounded once."""
    out = F.linear(x.float() * x_scale, weight.float() * weight_scale.reshape(-1, 1),
                   None if bias is None else bias.float())
    return (F.gelu(out, approximate="tanh") if activation == "gelu_tanh" else out).to(out_dtype)


IMPLS = {
    "linear_gelu": lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"),
    "linear_gelu_fused": lambda x, w, b: False,  # (a host query: the eager pair is never fused)
    "linear_fp8": lambda x, xs, w, ws, b, dtype, act: _linear_fp8(x, xs, w, ws, b, dtype, act),
    "decode_linear": lambda x, w, ws, b: _decode_linear(x, w, ws, b),
}
