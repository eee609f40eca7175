"""Micro-benchmark cases of the quant family (csrc/quant/): quantize_fp8, row-wise dynamic e4m3."""

from __future__ import annotations

from typing import Iterator

import torch

from benchmarks.harness import Case
from benchmarks.micro.common import nbytes, with_baselines


def eager_quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise dynamic FP8 as torchao's recipe computes it in eager PyTorch (its compile is what
    torchao + torch.compile runs before each FP8 GEMM)."""
    scale = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / 448.0
    return (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale


def quantize_fp8_cases(tk, quick: bool) -> Iterator[Case]:
    """quantize_fp8 on the GEMM inputs of an LTX-Video 2B step (CFG batch 2: 5376 tokens; the FFN
    down projection's input is 4x wider) and a Llama-3.1-8B prefill of 2048 tokens."""
    shapes = [(5376, 2048, "LTX-Video 2B attention/FFN-up input"), (5376, 8192, "LTX-Video 2B FFN-down input"),
              (2048, 4096, "Llama-3.1-8B prefill")]
    for rows, k, note in shapes[:1] if quick else shapes:
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) * 3
        moved = nbytes(x) + x.numel() + rows * 4  # bf16 in, e4m3 codes and fp32 scales out
        yield Case("quantize_fp8", f"{rows}x{k}", "bfloat16", moved,
                   with_baselines(lambda: tk.quantize_fp8(x), eager_quantize_fp8, (x,)), note=note)


CASES = {"quantize_fp8": quantize_fp8_cases}
