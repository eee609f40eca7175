"""Micro-benchmark cases of the gemm family (csrc/gemm/): linear_gelu, linear_fp8 and decode_linear.
Compute-bound except decode_linear: compare the times; GB/s says how far from the memory bound."""

from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F

from benchmarks.harness import Case
from benchmarks.micro.common import DTYPE_NAMES, nbytes, with_baselines

# (tokens, in_features, out_features, where the shape comes from): the FFN input projections
LINEAR_GELU_SHAPES = [
    (5376, 2048, 8192, "LTX-Video 2B FFN proj, 49 frames 512x768 with CFG (2x2688 tokens)"),
    (16128, 2048, 8192, "LTX-Video 2B FFN proj, 161 frames (2x8064 tokens)"),
    (4608, 3072, 12288, "Flux FFN proj, 1024x1024 (4096 image + 512 text tokens)"),
    (8424, 1536, 6144, "SD3-medium FFN proj, 1024x1024 with CFG (2x4212 tokens)"),
    (64, 2048, 8192, "LTX-Video 2B FFN proj, a few tokens (launch-bound)"),
]
LINEAR_GELU_QUICK = {(5376, 2048, 8192), (64, 2048, 8192)}


def linear_gelu_cases(tk, quick: bool) -> Iterator[Case]:
    """gelu_tanh(x @ W^T + b): ours (one cuBLASLt GEMM with the GELU-bias epilogue) against F.linear
    + F.gelu eager and compiled, torch's own epilogue (torch._addmm_activation, 2-D only) and
    F.linear + our separate gelu kernel. Compute-bound: compare the times (the ratio column);
    bytes count x, W, b and the output once, so GB/s says how far from the memory bound each is."""
    for tokens, k, n, where in LINEAR_GELU_SHAPES:
        if quick and (tokens, k, n) not in LINEAR_GELU_QUICK:
            continue
        for dtype in (torch.bfloat16,) + ((torch.float16,) if (tokens, k, n) == LINEAR_GELU_SHAPES[0][:3] else ()):
            x = torch.randn(tokens, k, device="cuda", dtype=dtype)
            w = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
            b = torch.randn(n, device="cuda", dtype=dtype)
            impls = with_baselines(lambda: tk.linear_gelu(x, w, b),
                                   lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"), (x, w, b))
            impls["torch _addmm_activation"] = lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)
            impls["F.linear + ours gelu"] = lambda: tk.gelu(F.linear(x, w, b), "tanh")
            fused = "epilogue" if tk.linear_gelu_fused(x, w, b) else "separate path (no epilogue algorithm)"
            tflop = 2 * tokens * k * n / 1e12
            moved = nbytes(x, w, b) + tokens * n * x.element_size()
            yield Case("linear_gelu", f"{tokens}x{k}->{n}", DTYPE_NAMES[dtype], moved, impls, latency=tokens <= 64,
                       note=f"{where}; ours: {fused}; {tflop:.2f} TFLOP")


# (tokens, in_features, out_features, where): an LTX-Video 2B step's GEMMs (CFG batch 2: 5376 tokens) and a
# Llama-3.1-8B prefill of 2048 tokens.
LINEAR_FP8_SHAPES = [(5376, 2048, 8192, "LTX-Video 2B FFN up"), (5376, 8192, 2048, "LTX-Video 2B FFN down"),
                     (5376, 2048, 2048, "LTX-Video 2B attention projection"), (2048, 4096, 14336, "Llama-3.1-8B MLP up")]


def linear_fp8_cases(tk, quick: bool) -> Iterator[Case]:
    """The FP8 GEMM on quantized operands (codes and row/channel scales made once, outside the timing):
    ours (cuBLASLt, outer-vector scales) against F.linear in bf16 and torch._scaled_mm row-wise on the
    same codes and scales (what torchao's row-wise FP8 runs). Compute-bound: compare the times."""
    for tokens, k, n, where in LINEAR_FP8_SHAPES[:1] if quick else LINEAR_FP8_SHAPES:
        x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        xq, xs = tk.quantize_fp8(x)
        wq, ws = tk.quantize_fp8(w)
        impls = {"ours": lambda: tk.linear_fp8(xq, xs, wq, ws, None, torch.bfloat16, "none"),
                 "F.linear bf16": lambda: F.linear(x, w),
                 "torch _scaled_mm row-wise": lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(),
                                                                      out_dtype=torch.bfloat16)}
        moved = xq.numel() + wq.numel() + tokens * n * 2
        yield Case("linear_fp8", f"{tokens}x{k}->{n}", "float8_e4m3fn", moved, impls,
                   note=f"{where}; {2 * tokens * k * n / 1e12:.2f} TFLOP")


# (rows, in_features, out_features, where): Llama-3.1-8B's decode projections (q/k/v and gate/up merged)
DECODE_LINEAR_SHAPES = [(1, 4096, 6144, "Llama-3.1-8B q/k/v"), (1, 4096, 4096, "Llama-3.1-8B o_proj"),
                        (1, 4096, 28672, "Llama-3.1-8B gate/up"), (1, 14336, 4096, "Llama-3.1-8B down_proj"),
                        (8, 4096, 28672, "Llama-3.1-8B gate/up, batch 8"), (1, 4096, 1024, "Llama-3.1-8B k_proj alone")]


def decode_linear_cases(tk, quick: bool) -> Iterator[Case]:
    """The decode linear layer against F.linear (cuBLAS at M = rows) on the same bf16 weight, and with
    the weight-only e4m3 weight (half the bytes) against F.linear on the bf16 one; bytes moved are the
    weight's and x's and the output's, so % of a copy is the weight streamed at the copy rate."""
    for rows, k, n, where in DECODE_LINEAR_SHAPES[:1] if quick else DECODE_LINEAR_SHAPES:
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        wq, ws = tk.quantize_fp8(w)
        ws = ws.squeeze(-1)
        moved = nbytes(w) + nbytes(x) + rows * n * 2
        yield Case("decode_linear", f"{rows}x{k}->{n}", "bfloat16", moved,
                   {"ours": lambda: tk.decode_linear(x, w), "F.linear": lambda: F.linear(x, w)}, note=where)
        moved8 = wq.numel() + n * 4 + nbytes(x) + rows * n * 2
        yield Case("decode_linear", f"{rows}x{k}->{n} fp8 weight", "float8_e4m3fn", moved8,
                   {"ours": lambda: tk.decode_linear(x, wq, ws), "F.linear bf16": lambda: F.linear(x, w)},
                   note=f"{where}; weight-only FP8")


CASES = {"linear_gelu": linear_gelu_cases, "linear_fp8": linear_fp8_cases,
         "decode_linear": decode_linear_cases}
