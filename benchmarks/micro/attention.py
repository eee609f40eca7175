"""Micro-benchmark cases of the attention family (csrc/attention/): attention_8bit (INT8 q·kᵀ, 8-bit or
16-bit p·v, per the GPU) against torch's SDPA with each of its fused backends forced (flash, cuDNN,
memory-efficient) and against ``sageattention`` (SageAttention 1.0.6: INT8 q·kᵀ, fp16 p·v, Triton)
where it is installed, at the self-attention shapes of LTX-Video, Flux and the SDXL UNet.

Compute-bound: each case gives its FLOPs (4·B·H·Sq·Sk·D, the two products) and the harness reports
TFLOP/s; each implementation's output is also compared once with float64 attention on the first two
heads of the first sample (cosine, relative L2: ``errors``). Inputs are diffusers' ``[B, S, H, D]``
bf16 tensors transposed to ``[B, H, S, D]`` (no copy), as the processors pass them.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from benchmarks.harness import Case
from benchmarks.micro.common import nbytes

# (model, B, H, S, D, where): CFG batch 2 where the pipeline runs one
SHAPES = [
    ("LTX-Video 2B", 2, 32, 2688, 64, "self-attention, 49 frames 512x768"),
    ("LTX-Video 2B", 2, 32, 8064, 64, "self-attention, 161 frames 512x768"),
    ("Flux.1", 1, 24, 4608, 128, "joint attention, 1024x1024 (4096 image + 512 text tokens)"),
    ("SDXL UNet", 2, 10, 4096, 64, "self-attention at 64x64 latents (1024x1024), 640 channels"),
    ("SDXL UNet", 2, 20, 1024, 64, "self-attention at 32x32 latents (1024x1024), 1280 channels"),
]
REFERENCE_HEADS = 2  # heads of the first sample compared with float64


def sdpa_with(backend) -> Callable:
    """F.scaled_dot_product_attention with one backend forced (it raises where that backend refuses)."""
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v):
        with sdpa_kernel([backend]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    return run


def sageattention_fn() -> Callable | None:
    try:
        from sageattention import sageattn
    except ImportError:
        return None
    return lambda q, k, v: sageattn(q, k, v, tensor_layout="HND", is_causal=False)


def implementations(tk) -> dict[str, Callable]:
    """name -> fn(q, k, v) for [B, H, S, D] views: ours, each SDPA backend, sageattention if installed."""
    from torch.nn.attention import SDPBackend

    impls = {"ours": lambda q, k, v: tk.attention_8bit(q, k, v),
             "sdpa flash": sdpa_with(SDPBackend.FLASH_ATTENTION),
             "sdpa cudnn": sdpa_with(SDPBackend.CUDNN_ATTENTION),
             "sdpa efficient": sdpa_with(SDPBackend.EFFICIENT_ATTENTION)}
    sage = sageattention_fn()
    if sage is not None:
        impls["sageattention"] = sage
    return impls


def errors_against_float64(impls: dict[str, Callable], q, k, v) -> dict[str, dict[str, float]]:
    """Each implementation's cosine and relative L2 to float64 attention on REFERENCE_HEADS heads of
    sample 0 (one head at a time: Sk² float64 scores); an implementation that refuses the case is left out."""
    from reference.attention import attention_reference, cosine_and_rel_l2

    heads = slice(0, REFERENCE_HEADS)
    ref = torch.cat([attention_reference(q[:1, h:h + 1], k[:1, h:h + 1], v[:1, h:h + 1])
                     for h in range(REFERENCE_HEADS)], dim=1)
    found = {}
    for name, fn in impls.items():
        try:
            out = fn(q, k, v)[:1, heads]
        except Exception:  # noqa: BLE001 (the harness reports why when it times it)
            continue
        cos, rel = cosine_and_rel_l2(out, ref)
        found[name] = {"cosine": cos.item(), "rel_l2": rel.item()}
        del out
    return found


def attention_8bit_cases(tk, quick: bool) -> Iterator[Case]:
    impls = implementations(tk)
    for model, B, H, S, D, where in SHAPES[:1] if quick else SHAPES:
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
        flops = 4 * B * H * S * S * D
        errors = errors_against_float64(impls, q, k, v)
        torch.cuda.empty_cache()
        yield Case("attention_8bit", f"{B}x{S} h{H} d{D}", "bfloat16", nbytes(q, k, v) + nbytes(q),
                   {name: (lambda fn=fn: fn(q, k, v)) for name, fn in impls.items()},
                   note=f"{model}, {where}; {flops / 1e12:.2f} TFLOP; [B, S, H, D] transposed",
                   flops=flops, errors=errors)


CASES = {"attention_8bit": attention_8bit_cases}
