#!/usr/bin/env python3
"""Runs each memory-bound kernel once on a benchmark shape, for Nsight Compute to read its counters
(DRAM and L2 traffic, L1 hit rate, occupancy): where a kernel short of the copy bandwidth loses.

    ncu --metrics <list> --csv python workshop/ncu_probe.py      (workshop/gpu_ncu.sh does this)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402


def main() -> None:
    use_local_build()
    tk = load_kernel()
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(16384, 4096, **bf16)
    w = torch.rand(4096, **bf16) + 0.5
    torch.empty_like(x).copy_(x)  # the reference: a device-to-device copy of the same bytes
    tk.rms_norm(x, w, 1e-6)
    try:  # the baseline that beats our rms_norm (93 % against 88 % of copy): the same counters for it
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama")
    except ImportError:
        pass
    tk.fused_add_rms_norm(x, torch.randn_like(x), w, 1e-6)
    m = torch.randn(2, 7392, 4096, **bf16)
    scale, shift, gate = (torch.randn(2, 1, 4096, **bf16) * 0.3 for _ in range(3))
    tk.norm_modulate(m, scale, shift, norm="rms", eps=1e-6)
    tk.norm_modulate(m, scale, shift, norm="rms", weight=w, eps=1e-6)
    tk.gated_add_norm_modulate(m, torch.randn_like(m), gate, scale, shift, norm="rms", eps=1e-6)
    tk.layer_norm(x[:8192], w, w, 1e-6)
    tk.silu_and_mul(torch.randn(4096, 2 * 14336, **bf16))
    tk.gated_add(torch.randn(2, 8064, 2048, **bf16), torch.randn(2, 8064, 2048, **bf16), scale[..., :2048])
    q, k = torch.randn(2, 8064, 2048, **bf16), torch.randn(2, 8064, 2048, **bf16)
    cos, sin = torch.rand(2, 8064, 2048, device="cuda"), torch.rand(2, 8064, 2048, device="cuda")
    tk.ltx_qk_norm_rope(q, k, w[:2048], w[:2048], 1e-6, cos, sin)
    grid, freqs = torch.rand(2, 8064, 3, device="cuda"), torch.rand(2048 // 6, device="cuda") * 15708
    tk.ltx_qk_norm_rope_from_coords(q, k, w[:2048], w[:2048], 1e-6, grid, freqs)
    tk.ltx_rope_from_coords(q, k, grid, freqs)
    qkv = torch.randn(4, 4096, 48 * 128, **bf16).view(4, 4096, 48, 128).transpose(1, 2)
    hcos, hsin = torch.rand(4, 4096, 128, **bf16), torch.rand(4, 4096, 128, **bf16)
    tk.apply_rotary_pos_emb(qkv[:, :32], qkv[:, 32:40], hcos, hsin)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
