"""The gemm family's catalog entries (tests/op_catalog.py gathers them): linear_gelu (the cuBLASLt
epilogue, or at::linear + our gelu_tanh where it has none) with its out= form, the FP8 linear on
quantized operands, and the decode step's linear (bf16/fp16 or an e4m3 weight). linear_gelu's x is
[..., in_features] of the row cases (op_catalog.ROW_SHAPES); decode_linear takes DECODE_SHAPES."""

import torch

from op_catalog import rows

LINEAR_OUT_FEATURES = 96


# decode_linear: (rows, in_features, layout) per case; 16-byte rows and alignment are what it takes
DECODE_SHAPES = {
    "small": (1, 64, "contiguous"),
    "aligned": (4, 1024, "contiguous"),
    "wide": (8, 4096, "contiguous"),
    "strided": (3, 512, "strided"),
    "empty": (0, 64, "contiguous"),
    "empty_width": (2, 0, "contiguous"),
}
DECODE_OUT_FEATURES = 77


def entries():
    def linear(bias: bool, out: bool):
        def build(m, case):
            (B, S, K), lay = rows(m, case)
            x = m.tensor((B, S, K), lay, scale=1.0, offset=0.0)
            w = m.tensor((LINEAR_OUT_FEATURES, K), scale=0.05, offset=0.0)
            b = m.tensor((LINEAR_OUT_FEATURES,), scale=0.5, offset=0.0) if bias else None
            if not out:
                return (x, w, b), ()
            return (m.nan((B, S, LINEAR_OUT_FEATURES), lay), x, w, b), (0,)
        return build

    def fp8(bias: bool, activation: str):
        """linear_fp8 on quantize_fp8's codes of x and of the weight (reference/fp8.py, drawn on the
        CPU): out_dtype is the case's dtype, bfloat16 for float32 (FP8 GEMMs give 16-bit outputs)."""
        from reference.fp8 import quantize_fp8_rowwise

        def build(m, case):
            (B, S, K), _ = rows(m, case)
            out_dtype = torch.bfloat16 if m.dtype == torch.float32 else m.dtype
            x_codes, x_scale = quantize_fp8_rowwise(m.values((B, S, K), scale=1.0, offset=0.0))
            w_codes, w_scale = quantize_fp8_rowwise(m.values((LINEAR_OUT_FEATURES, K), scale=0.05, offset=0.0))
            b = m.place(m.values((LINEAR_OUT_FEATURES,), scale=0.5, offset=0.0), dtype=out_dtype) if bias else None
            return (m.place(x_codes, dtype=torch.float8_e4m3fn), m.place(x_scale, dtype=torch.float32),
                    m.place(w_codes, dtype=torch.float8_e4m3fn), m.place(w_scale.squeeze(-1), dtype=torch.float32),
                    b, out_dtype, activation), ()
        return build

    def decode(weight_fp8: bool, bias: bool):
        """decode_linear: a decode step's rows (at most 8) of the case's width; an odd number of output
        channels; the e4m3 weight as quantize_fp8's codes of each output channel."""
        from reference.fp8 import quantize_fp8_rowwise

        def build(m, case):
            rows, k, lay = DECODE_SHAPES[case]
            x = m.tensor((rows, 1, k), lay, scale=1.0, offset=0.0)
            w = m.values((DECODE_OUT_FEATURES, k), scale=0.05, offset=0.0)
            b = m.tensor((DECODE_OUT_FEATURES,), scale=0.5, offset=0.0) if bias else None
            if not weight_fp8:
                return (x, m.place(w), None, b), ()
            codes, scale = quantize_fp8_rowwise(w)
            return (x, m.place(codes, dtype=torch.float8_e4m3fn), m.place(scale.squeeze(-1), dtype=torch.float32),
                    b), ()
        return build

    return {
        "decode_linear": ("decode_linear", decode(False, True)),
        "decode_linear[fp8_weight,no_bias]": ("decode_linear", decode(True, False)),
        "linear_fp8": ("linear_fp8", fp8(True, "gelu_tanh")),
        "linear_fp8[no_bias]": ("linear_fp8", fp8(False, "none")),
        "linear_gelu": ("linear_gelu", linear(True, False)),
        "linear_gelu[no_bias]": ("linear_gelu", linear(False, False)),
        "linear_gelu_out": ("linear_gelu_out", linear(True, True)),
    }


# Entries that take fewer cases than their family: the FP8 GEMM wants rows of a multiple of 16 bytes,
# 16-byte aligned (no odd, unaligned, padded-stride or split widths), and with a bias rows of at least one
# element (in_features 0 with a bias is refused).
ENTRY_CASES = {"decode_linear": tuple(DECODE_SHAPES), "decode_linear[fp8_weight,no_bias]": tuple(DECODE_SHAPES),
               "linear_fp8": ("small", "aligned", "wide", "empty"),
               "linear_fp8[no_bias]": ("small", "aligned", "wide", "empty", "empty_width")}

# Ops that launch nothing (host queries): covered by the rest of their family.
QUERY_OPS = ("linear_gelu_fused",)
