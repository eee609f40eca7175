"""Micro-benchmark cases of the activation family (csrc/activation/): act_mul, silu_and_mul, geglu,
gelu, and their backward. `--ops activation` also times norm's gated residual (`gated_add_case`),
LTX-Video 2B's other elementwise op beside its GELU FFN; the backward cases run under
`--ops activation_rope_backward` (benchmarks/micro/cross_family.py)."""

from __future__ import annotations

from typing import Iterator

import torch

from benchmarks.harness import Case
from benchmarks.micro.common import backward_impls, liger_fn, nbytes, with_baselines
from benchmarks.micro.norm import gated_add_case
from reference.activations import eager_act_and_mul, eager_act_mul, eager_activation


def swiglu_cases(tk, tokens: int, note: str) -> Iterator[Case]:
    """Llama-3.1-8B's SwiGLU on `tokens` rows: the fused gate_up projection (silu_and_mul), and
    transformers' two projections (act_mul), which Liger also implements."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(tokens, 2 * 14336, **bf16)
    yield Case("silu_and_mul", f"{tokens}x(2x14336)", "bfloat16", nbytes(x) * 3 // 2,
               with_baselines(lambda: tk.silu_and_mul(x), lambda x: eager_act_and_mul(x, "silu"), (x,)),
               note=f"Llama-3.1-8B MLP, fused gate_up projection, {note}")
    g, u = torch.randn(tokens, 14336, **bf16), torch.randn(tokens, 14336, **bf16)
    yield Case("act_mul (silu)", f"{tokens}x14336 x2", "bfloat16", 3 * nbytes(g),
               with_baselines(lambda: tk.act_mul(g, u, "silu"), lambda g, u: eager_act_mul(g, u, "silu"), (g, u),
                              liger=liger_fn("swiglu", "LigerSiLUMulFunction"), liger_args=(g, u)),
               note=f"Llama-3.1-8B MLP as transformers computes it: silu(gate_proj(x)) * up_proj(x), {note}")


def gelu_tanh_case(tk, rows: int, note: str) -> Case:
    """LTX-Video 2B's FFN activation (GELU, tanh approximation) on [rows, 8192]."""
    h = torch.randn(rows, 8192, device="cuda", dtype=torch.bfloat16)
    return Case("gelu (tanh)", f"{rows}x8192", "bfloat16", 2 * nbytes(h),
                with_baselines(lambda: tk.gelu(h, "tanh"), lambda h: eager_activation(h, "gelu_tanh"), (h,),
                               eager_name="native"), note=f"LTX-Video 2B FFN, {note}")


def activation_cases(tk, quick: bool) -> Iterator[Case]:
    """Llama-3.1-8B's MLP (one decode token, 512 and 4096 tokens x 14336), LTX-Video 2B's GELU-tanh
    FFN and gated residual (a short clip and 2x8064 tokens), SDXL's GEGLU (16384 x 2x10240). The
    512-token and short-clip shapes are the issues' 4-64 MB range (the 1.2x bars)."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    g1, u1 = torch.randn(1, 14336, **bf16), torch.randn(1, 14336, **bf16)
    yield Case("act_mul (silu)", "1x14336 x2", "bfloat16", 3 * nbytes(g1),
               with_baselines(lambda: tk.act_mul(g1, u1, "silu"), lambda g, u: eager_act_mul(g, u, "silu"), (g1, u1)),
               latency=True, note="Llama-3.1-8B decode, 1 token (host-bound: timed per call from Python)")
    yield from swiglu_cases(tk, 4096, "4096-token prefill")
    if quick:
        return
    yield from swiglu_cases(tk, 512, "512-token prefill (44 MB)")
    yield gelu_tanh_case(tk, 1536, "25 frames 512x768, one sample (50 MB)")
    yield gated_add_case(tk, 1, 1536, "25 frames 512x768, one sample (19 MB)")
    yield gelu_tanh_case(tk, 16128, "2x8064 tokens")
    p = torch.randn(16384, 2 * 10240, **bf16)
    yield Case("geglu", "16384x(2x10240)", "bfloat16", nbytes(p) * 3 // 2,
               with_baselines(lambda: tk.geglu(p), lambda p: eager_act_and_mul(p, "gelu", act_first=False), (p,)),
               note="SDXL transformer block GEGLU (diffusers order, erf GELU)")
    yield gated_add_case(tk, 2, 8064, "49 frames 512x768, CFG batch 2")


def activation_backward_cases(tk, quick: bool) -> Iterator[Case]:
    """Llama-3.2-1B's and Llama-3.1-8B's SwiGLU (16 K tokens x 8192, 4096 x 14336), the fused gate_up
    projection (silu_and_mul), GEGLU (tanh, Liger's form; SDXL's erf), LTX-Video 2B's GELU-tanh FFN. Bytes:
    the output gradient and the saved inputs read, the inputs' gradients written (5x one operand for the
    gated units, 3x for an activation). The first half of `--ops activation_rope_backward`."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    for tokens, inter, note in [(16384, 8192, "Llama-3.2-1B MLP, 8x2048 tokens"),
                                (4096, 14336, "Llama-3.1-8B MLP, 4096 tokens")][: 1 if quick else 2]:
        g, u = torch.randn(tokens, inter, **bf16), torch.randn(tokens, inter, **bf16)
        yield Case("act_mul (silu) backward", f"{tokens}x{inter} x2", "bfloat16", 5 * nbytes(g),
                   backward_impls(lambda g, u: tk.act_mul(g, u, "silu"), lambda g, u: eager_act_mul(g, u, "silu"),
                                  (g, u), liger=liger_fn("swiglu", "LigerSiLUMulFunction"),
                                  op=lambda: tk.ops.act_mul_backward(g, g, u, "silu")), note=note)
        yield Case("act_mul (gelu_tanh) backward", f"{tokens}x{inter} x2", "bfloat16", 5 * nbytes(g),
                   backward_impls(lambda g, u: tk.act_mul(g, u, "gelu_tanh"),
                                  lambda g, u: eager_act_mul(g, u, "gelu_tanh"), (g, u),
                                  liger=liger_fn("geglu", "LigerGELUMulFunction"),
                                  op=lambda: tk.ops.act_mul_backward(g, g, u, "gelu_tanh")),
                   note=f"GEGLU (tanh GELU, Liger's form) on the {note} shape")
    if quick:
        return
    x = torch.randn(4096, 2 * 14336, **bf16)
    yield Case("silu_and_mul backward", "4096x(2x14336)", "bfloat16", nbytes(x) * 5 // 2,
               backward_impls(lambda x: tk.silu_and_mul(x), lambda x: eager_act_and_mul(x, "silu"), (x,),
                              op=lambda: tk.ops.act_and_mul_backward(x[:, :14336], x, "silu", True)),
               note="Llama-3.1-8B MLP, fused gate_up projection")
    p = torch.randn(16384, 2 * 10240, **bf16)
    yield Case("geglu backward", "16384x(2x10240)", "bfloat16", nbytes(p) * 5 // 2,
               backward_impls(lambda p: tk.geglu(p), lambda p: eager_act_and_mul(p, "gelu", act_first=False), (p,),
                              op=lambda: tk.ops.act_and_mul_backward(p[:, :10240], p, "gelu", False)),
               note="SDXL transformer block GEGLU (diffusers order, erf GELU)")
    h = torch.randn(16128, 8192, **bf16)
    yield Case("gelu (tanh) backward", "16128x8192", "bfloat16", 3 * nbytes(h),
               backward_impls(lambda h: tk.gelu(h, "tanh"), lambda h: eager_activation(h, "gelu_tanh"), (h,),
                              op=lambda: tk.ops.activation_backward(h, h, "gelu_tanh")),
               note="LTX-Video 2B FFN, 2x8064 tokens")


CASES = {"activation": activation_cases}
