"""Micro-benchmark cases of the norm family (csrc/norm/): rms_norm, fused_add_rms_norm, layer_norm,
the AdaLN modulations, gated_add, and their backward. `gated_add_case` is also timed by activation's
`--ops activation` (beside the LTX-Video GELU FFN), as it was before the cases were split by family."""

from __future__ import annotations

from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from benchmarks.harness import Case
from benchmarks.micro.common import DTYPE_NAMES, backward_impls, liger_fn, nbytes, with_baselines
from reference.activations import eager_gated_add
from reference.norms import (
    diffusers_norm_modulate,
    hf_fused_add_rms_norm,
    hf_rms_norm,
    ltx_gated_add_norm_modulate,
    torch_layer_norm,
)

# (rows, hidden, where the shape comes from)
RMS_NORM_SHAPES = [
    (1, 4096, "Llama-3.1-8B decode, 1 token"),
    (4, 4096, "Llama-3.1-8B decode, batch 4"),
    (2048, 4096, "Llama-3.1-8B prefill 2048"),
    (16384, 4096, "Llama-3.1-8B prefill 4x4096"),
    (8192, 3584, "Qwen2.5-7B prefill 8192"),
    (16128, 2048, "LTX-Video 2B q/k norm across heads, 2x8064 tokens"),
    (16128, 4096, "LTX-Video 13B q/k norm across heads, 2x8064 tokens"),
    (65536, 128, "Qwen3-8B per-head q norm, 2048 tokens x 32 heads"),
    (64, 262144, "a few rows of 256 K columns: split across blocks"),
]
RMS_NORM_QUICK = {(1, 4096), (16384, 4096), (65536, 128)}
EXTRA_DTYPES_SHAPE = (16384, 4096)  # fp16 and fp32 are timed on this shape too


def eager_llama_rms_norm(hidden: int, dtype: torch.dtype, eps: float) -> Callable:
    """transformers' own LlamaRMSNorm when installed, else its verbatim copy in reference/."""
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
    except ImportError:
        return lambda x, w: hf_rms_norm(x, w, eps)
    module = LlamaRMSNorm(hidden, eps=eps).to("cuda", dtype)
    return lambda x, w: module(x)


def rms_norm_case(tk, rows: int, hidden: int, dtype: torch.dtype, note: str) -> Case:
    eps = 1e-6
    x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
    w = (torch.rand(hidden, device="cuda") + 0.5).to(dtype)
    # Liger's "llama" casting mode is the HF rounding (normalize in fp32, cast, then weight).
    impls = with_baselines(lambda: tk.rms_norm(x, w, eps), eager_llama_rms_norm(hidden, dtype, eps), (x, w),
                           liger=liger_fn("rms_norm", "LigerRMSNormFunction"), liger_args=(x, w, eps, 0.0, "llama"))
    impls["native"] = lambda: F.rms_norm(x, (hidden,), w, eps)
    return Case("rms_norm", f"{rows}x{hidden}", DTYPE_NAMES[dtype], 2 * nbytes(x) + nbytes(w), impls,
                latency=rows <= 4, note=note)


def rms_norm_cases(tk, quick: bool) -> Iterator[Case]:
    configs = [(r, h, torch.bfloat16, note) for r, h, note in RMS_NORM_SHAPES if not quick or (r, h) in RMS_NORM_QUICK]
    configs += [(*EXTRA_DTYPES_SHAPE, dt, "dtype sweep") for dt in (torch.float16, torch.float32)]
    for rows, hidden, dtype, note in configs:
        yield rms_norm_case(tk, rows, hidden, dtype, note)


# (rows, hidden, where the shape comes from)
FUSED_ADD_SHAPES = [(4, 4096, "Llama-3.1-8B decode, batch 4"), (2048, 4096, "Llama-3.1-8B prefill 2048"),
                    (16384, 4096, "Llama-3.1-8B prefill 4x4096"), (8192, 3584, "Qwen2.5-7B prefill 8192")]
LAYER_NORM_SHAPES = [(8192, 4096, "baseline shape"), (16128, 2048, "LTX-Video 2B norm_out, 2x8064 tokens"),
                     (8192, 3072, "Flux double block, 2x4096 tokens")]
# (batch, tokens, hidden, where the shape comes from)
MODULATE_SHAPES = [(2, 8064, 2048, "LTX-Video 2B, 49 frames 512x768, CFG batch 2"),
                   (2, 7392, 4096, "LTX-Video 13B, 161 frames 512x704, CFG batch 2"),
                   (1, 4608, 3072, "Flux 1024x1024 (4096 image + 512 text tokens)")]


def fused_add_rms_norm_cases(tk, quick: bool) -> Iterator[Case]:
    eps = 1e-6
    liger = liger_fn("fused_add_rms_norm", "LigerFusedAddRMSNormFunction")
    for rows, hidden, note in FUSED_ADD_SHAPES[1:3] if quick else FUSED_ADD_SHAPES:
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        r = torch.randn_like(x)
        w = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16)
        impls = with_baselines(lambda: tk.fused_add_rms_norm(x, r, w, eps),
                               lambda x, r, w: hf_fused_add_rms_norm(x, r, w, eps), (x, r, w),
                               liger=liger, liger_args=(x, r, w, eps))
        yield Case("fused_add_rms_norm", f"{rows}x{hidden}", "bfloat16", 4 * nbytes(x) + nbytes(w), impls,
                   latency=rows <= 4, note=note)


def layer_norm_cases(tk, quick: bool) -> Iterator[Case]:
    eps = 1e-6
    liger = liger_fn("layer_norm", "LigerLayerNormFunction")
    for rows, hidden, note in LAYER_NORM_SHAPES[:1] if quick else LAYER_NORM_SHAPES:
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        w = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16)
        b = (torch.rand(hidden, device="cuda") - 0.5).to(torch.bfloat16)
        impls = with_baselines(lambda: tk.layer_norm(x, w, b, eps), lambda x, w, b: torch_layer_norm(x, w, b, eps),
                               (x, w, b), eager_name="native", liger=liger, liger_args=(x, w, b, eps))
        yield Case("layer_norm", f"{rows}x{hidden}", "bfloat16", 2 * nbytes(x) + nbytes(w, b), impls, note=note)


def modulate_cases(tk, quick: bool) -> Iterator[Case]:
    eps = 1e-6
    for B, S, D, note in MODULATE_SHAPES[:1] if quick else MODULATE_SHAPES:
        norm = "layer" if "Flux" in note else "rms"
        x = torch.randn(B, S, D, device="cuda", dtype=torch.bfloat16)
        y = torch.randn_like(x)
        scale, shift, gate = (torch.randn(B, 1, D, device="cuda", dtype=torch.bfloat16) * 0.3 for _ in range(3))
        yield Case(f"norm_modulate ({norm})", f"{B}x{S}x{D}", "bfloat16", 2 * nbytes(x) + nbytes(scale, shift),
                   with_baselines(lambda: tk.norm_modulate(x, scale, shift, norm=norm, eps=eps),
                                  lambda x, s, sh: diffusers_norm_modulate(x, s, sh, norm, eps=eps),
                                  (x, scale, shift)), note=note)
        yield Case(f"gated_add_norm_modulate ({norm})", f"{B}x{S}x{D}", "bfloat16",
                   4 * nbytes(x) + nbytes(scale, shift, gate),
                   with_baselines(lambda: tk.gated_add_norm_modulate(x, y, gate, scale, shift, norm=norm, eps=eps),
                                  lambda x, y, g, s, sh: ltx_gated_add_norm_modulate(x, y, g, s, sh, norm, eps=eps),
                                  (x, y, gate, scale, shift)), note=note)


def gated_add_case(tk, batch: int, tokens: int, note: str) -> Case:
    """LTX-Video 2B's gated residual hidden_states + ff_output * gate_mlp, gate [batch, 1, 2048]."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x, y = torch.randn(batch, tokens, 2048, **bf16), torch.randn(batch, tokens, 2048, **bf16)
    gate = torch.randn(batch, 1, 2048, **bf16) * 0.3
    return Case("gated_add", f"{batch}x{tokens}x2048", "bfloat16", 3 * nbytes(x) + nbytes(gate),
                with_baselines(lambda: tk.gated_add(x, y, gate), eager_gated_add, (x, y, gate)),
                note=f"LTX-Video 2B residual, {note}")


# ---- backward (benchmarks/micro/common.py says what a backward case times) ----

def rms_norm_backward_case(tk, rows: int, hidden: int, note: str) -> Case:
    eps, bf16 = 1e-6, dict(device="cuda", dtype=torch.bfloat16)
    x, dy = torch.randn(rows, hidden, **bf16), torch.randn(rows, hidden, **bf16)
    w = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16)
    liger = liger_fn("rms_norm", "LigerRMSNormFunction")
    impls = backward_impls(lambda x, w: tk.rms_norm(x, w, eps), eager_llama_rms_norm_fn(eps), (x, w),
                           liger=None if liger is None else lambda x, w: liger(x, w, eps, 0.0, "llama", False),
                           op=lambda: tk.ops.rms_norm_backward(dy, x, w, eps, [True, True]))
    return Case("rms_norm backward", f"{rows}x{hidden}", "bfloat16", 3 * nbytes(x) + 2 * nbytes(w), impls, note=note)


def eager_llama_rms_norm_fn(eps: float) -> Callable:
    """transformers' LlamaRMSNorm forward as a function of (x, weight), so the weight gets a gradient."""
    return lambda x, w: hf_rms_norm(x, w, eps)


def fused_add_rms_norm_backward_case(tk, rows: int, hidden: int, note: str) -> Case:
    eps, bf16 = 1e-6, dict(device="cuda", dtype=torch.bfloat16)
    x, r, dy = (torch.randn(rows, hidden, **bf16) for _ in range(3))
    w = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16)
    liger = liger_fn("fused_add_rms_norm", "LigerFusedAddRMSNormFunction")
    impls = backward_impls(lambda x, r, w: tk.fused_add_rms_norm(x, r, w, eps),
                           lambda x, r, w: hf_fused_add_rms_norm(x, r, w, eps), (x, r, w),
                           liger=None if liger is None else lambda x, r, w: liger(x, r, w, eps, 0.0, "llama", False),
                           op=lambda: tk.ops.fused_add_rms_norm_backward(dy, dy, x, w, eps, [True, True]))
    return Case("fused_add_rms_norm backward", f"{rows}x{hidden}", "bfloat16", 4 * nbytes(x) + 2 * nbytes(w), impls,
                note=note)


def layer_norm_backward_case(tk, rows: int, hidden: int, note: str) -> Case:
    eps, bf16 = 1e-6, dict(device="cuda", dtype=torch.bfloat16)
    x, dy = torch.randn(rows, hidden, **bf16), torch.randn(rows, hidden, **bf16)
    w = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16)
    b = (torch.rand(hidden, device="cuda") - 0.5).to(torch.bfloat16)
    liger = liger_fn("layer_norm", "LigerLayerNormFunction")
    impls = backward_impls(lambda x, w, b: tk.layer_norm(x, w, b, eps), lambda x, w, b: torch_layer_norm(x, w, b, eps),
                           (x, w, b), eager_name="native",
                           liger=None if liger is None else lambda x, w, b: liger(x, w, b, eps),
                           op=lambda: tk.ops.layer_norm_backward(dy, x, w, b, eps, [True, True, True]))
    return Case("layer_norm backward", f"{rows}x{hidden}", "bfloat16", 3 * nbytes(x) + 4 * nbytes(w), impls,
                note=note)


def modulate_backward_cases(tk, B: int, S: int, D: int, note: str) -> Iterator[Case]:
    """AdaLN backward with [B, 1, D] scale/shift/gate (views of one modulation tensor, as DiT blocks
    unbind it): dx, dscale, dshift (and dy, dgate for the gated residual)."""
    eps, bf16 = 1e-6, dict(device="cuda", dtype=torch.bfloat16)
    norm = "layer" if "Flux" in note else "rms"
    x, y, dy = (torch.randn(B, S, D, **bf16) for _ in range(3))
    mod = torch.randn(B, 6, D, **bf16) * 0.3
    scale, shift, gate = mod[:, 0:1], mod[:, 1:2], mod[:, 2:3]
    small = nbytes(scale, shift)
    yield Case(f"norm_modulate ({norm}) backward", f"{B}x{S}x{D}", "bfloat16", 3 * nbytes(x) + 2 * small,
               backward_impls(lambda x, s, sh: tk.norm_modulate(x, s, sh, norm=norm, eps=eps),
                              lambda x, s, sh: diffusers_norm_modulate(x, s, sh, norm, eps=eps), (x, scale, shift),
                              op=lambda: tk.ops.norm_modulate_backward(dy, x, scale, shift, None, None, eps, norm,
                                                                       [True, True, True, False, False])), note=note)
    yield Case(f"gated_add_norm_modulate ({norm}) backward", f"{B}x{S}x{D}", "bfloat16",
               6 * nbytes(x) + 3 * small,
               backward_impls(lambda x, y, g, s, sh: tk.gated_add_norm_modulate(x, y, g, s, sh, norm=norm, eps=eps),
                              lambda x, y, g, s, sh: ltx_gated_add_norm_modulate(x, y, g, s, sh, norm, eps=eps),
                              (x, y, gate, scale, shift),
                              op=lambda: tk.ops.gated_add_norm_modulate_backward(
                                  dy, dy, x, y, gate, scale, shift, None, None, eps, norm, [True] * 5 + [False] * 2)),
               note=note)


def gated_add_backward_case(tk, B: int, S: int, D: int, note: str) -> Case:
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x, y, dy = (torch.randn(B, S, D, **bf16) for _ in range(3))
    gate = torch.randn(B, 1, D, **bf16) * 0.3
    return Case("gated_add backward", f"{B}x{S}x{D}", "bfloat16", 3 * nbytes(x) + 2 * nbytes(gate),
                backward_impls(tk.gated_add, eager_gated_add, (x, y, gate),
                               op=lambda: tk.ops.gated_add_backward(dy, y, gate, [True, True])), note=note)


def norm_backward_cases(tk, quick: bool) -> Iterator[Case]:
    """Llama-3.1-8B's norms (16384 tokens x 4096), LTX-Video 2B's and Flux's modulations and gated
    residual, the layer norms of the forward's shapes."""
    yield rms_norm_backward_case(tk, 16384, 4096, "Llama-3.1-8B, 4x4096 tokens")
    yield from modulate_backward_cases(tk, *MODULATE_SHAPES[0])
    if quick:
        return
    yield rms_norm_backward_case(tk, 2048, 4096, "Llama-3.1-8B, 2048 tokens")
    yield rms_norm_backward_case(tk, 8192, 3584, "Qwen2.5-7B, 8192 tokens")
    yield rms_norm_backward_case(tk, 65536, 128, "Qwen3-8B per-head norm, 2048 tokens x 32 heads")
    yield rms_norm_backward_case(tk, 64, 262144, "a few rows of 256 K columns (chunked kernels)")
    yield fused_add_rms_norm_backward_case(tk, 16384, 4096, "Llama-3.1-8B, 4x4096 tokens")
    for rows, hidden, note in LAYER_NORM_SHAPES:
        yield layer_norm_backward_case(tk, rows, hidden, note)
    for shape in MODULATE_SHAPES[1:]:
        yield from modulate_backward_cases(tk, *shape)
    yield gated_add_backward_case(tk, 2, 8064, 2048, "LTX-Video 2B residual, 49 frames 512x768, CFG batch 2")


CASES = {"rms_norm": rms_norm_cases, "fused_add_rms_norm": fused_add_rms_norm_cases,
         "layer_norm": layer_norm_cases, "modulate": modulate_cases, "norm_backward": norm_backward_cases}
