"""Micro-benchmark cases of the qk_norm_rope family (csrc/qk_norm_rope/): the fused q/k norm +
rotation. Its forward cases are timed under `--ops rope` (benchmarks/micro/rope.py), beside the
rotation alone; its backward under `--ops qk_norm_rope_backward`."""

from __future__ import annotations

from typing import Iterator

import torch

from benchmarks.harness import Case
from benchmarks.micro.common import backward_impls, nbytes, with_baselines
from reference.rope import diffusers_interleaved_rotary, diffusers_qk_norm_rope, hf_qk_norm_rope


def hf_qk_norm_rope_case(tk, B: int, S: int, Hq: int, Hk: int, d: int, note: str) -> Case:
    """Qwen3's attention from the projections to the rotated q and k: q, k [B, S, H, d] views of one
    fused projection, per-head q_norm/k_norm then apply_rotary_pos_emb with bf16 cos/sin [B, S, d]."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    eps = 1e-6
    qkv = torch.randn(B, S, (Hq + 2 * Hk) * d, **bf16)
    q = qkv[..., : Hq * d].unflatten(-1, (Hq, d))
    k = qkv[..., Hq * d: (Hq + Hk) * d].unflatten(-1, (Hk, d))
    wq, wk = ((torch.rand(d, device="cuda") + 0.5).to(torch.bfloat16) for _ in range(2))
    angles = torch.randint(0, 32768, (B, S, 1), device="cuda").float() * torch.rand(d // 2, device="cuda")
    cos, sin = (torch.cat((f, f), -1).to(torch.bfloat16) for f in (angles.cos(), angles.sin()))
    impls = with_baselines(lambda: tk.hf_qk_norm_rope(q, k, wq, wk, eps, cos, sin),
                           lambda q, k, c, s: hf_qk_norm_rope(q, k, wq, wk, eps, c, s), (q, k, cos, sin))
    # our two kernels one after the other: per-head rms_norm of q and of k, then the rotation of both
    impls["ours unfused"] = lambda: tk.apply_rotary_pos_emb(tk.rms_norm(q, wq, eps).transpose(1, 2),
                                                            tk.rms_norm(k, wk, eps).transpose(1, 2), cos, sin)
    return Case("hf_qk_norm_rope (qwen3)", f"{B}x{S} q{Hq} k{Hk} d{d}", "bfloat16",
                2 * nbytes(q, k) + nbytes(cos, sin, wq, wk), impls, latency=S <= 4, note=note)


def qk_norm_rope_backward_cases(tk, quick: bool) -> Iterator[Case]:
    """The fused q/k norm + RoPE backward: Flux (per head, [1, 4608, 24, 128], fp32 tables [S, d]),
    LTX-Video 2B (across heads, [2, 8064, 2048], fp32 tables and from coordinates), Qwen3-8B
    (per head, q 32 and k 8 heads of 128, bf16 tables). Bytes: q, k and their output gradients
    read, dq and dk written, the tables read."""
    eps, bf16 = 1e-6, dict(device="cuda", dtype=torch.bfloat16)
    q, k = torch.randn(1, 4608, 24, 128, **bf16), torch.randn(1, 4608, 24, 128, **bf16)
    w = (torch.rand(128, device="cuda") + 0.5).to(torch.bfloat16)
    angles = torch.rand(4608, 64, device="cuda") * 100
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    c4, s4 = cos[None, :, None], sin[None, :, None]

    def flux_eager(q, k, wq, wk):
        rms = lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)  # noqa: E731
        return diffusers_interleaved_rotary(rms(q, wq), c4, s4), diffusers_interleaved_rotary(rms(k, wk), c4, s4)

    yield Case("qk_norm_rope (flux) backward", "1x4608x24x128", "bfloat16", 3 * nbytes(q, k) + nbytes(cos, sin),
               backward_impls(lambda q, k, wq, wk: tk.qk_norm_rope(q, k, wq, wk, eps, cos, sin), flux_eager,
                              (q, k, w, w),
                              op=lambda: tk.ops.qk_norm_rope_backward(q, k, q, k, w, w, eps, cos[None], sin[None],
                                                                      [True] * 4)),
               note="Flux 1024x1024: norm_q, norm_k per head and apply_rotary_emb")
    if quick:
        return
    q, k = torch.randn(2, 8064, 2048, **bf16), torch.randn(2, 8064, 2048, **bf16)
    w = (torch.rand(2048, device="cuda") + 0.5).to(torch.bfloat16)
    angles = torch.rand(2, 8064, 1024, device="cuda") * 100
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    yield Case("qk_norm_rope (ltx) backward", "2x8064x2048", "bfloat16", 3 * nbytes(q, k) + nbytes(cos, sin),
               backward_impls(lambda q, k, wq, wk: tk.ltx_qk_norm_rope(q, k, wq, wk, eps, cos, sin),
                              lambda q, k, wq, wk: diffusers_qk_norm_rope(q, k, wq, wk, eps, cos, sin), (q, k, w, w),
                              op=lambda: tk.ops.qk_norm_rope_backward(q[:, :, None], k[:, :, None], q[:, :, None],
                                                                      k[:, :, None], w, w, eps, cos, sin, [True] * 4)),
               note="LTX-Video 2B self-attention, 49 frames 512x768, CFG batch 2")
    grid, freqs = torch.rand(2, 8064, 3, device="cuda"), torch.rand(2048 // 6, device="cuda") * 3
    yield Case("qk_norm_rope (ltx from coords) backward", "2x8064x2048", "bfloat16", 3 * nbytes(q, k),
               backward_impls(lambda q, k, wq, wk: tk.ltx_qk_norm_rope_from_coords(q, k, wq, wk, eps, grid, freqs),
                              lambda q, k, wq, wk: diffusers_qk_norm_rope(q, k, wq, wk, eps, cos, sin), (q, k, w, w),
                              op=lambda: tk.ops.ltx_qk_norm_rope_from_coords_backward(q, k, q, k, w, w, eps, grid,
                                                                                      freqs, [True] * 4)),
               note="cos/sin from grid and freqs in the kernel; the baselines read fp32 tables")
    B, S, Hq, Hk, d = 1, 4096, 32, 8, 128
    qkv = torch.randn(B, S, (Hq + 2 * Hk) * d, **bf16)
    q, k = qkv[..., : Hq * d].unflatten(-1, (Hq, d)), qkv[..., Hq * d: (Hq + Hk) * d].unflatten(-1, (Hk, d))
    wq = (torch.rand(d, device="cuda") + 0.5).to(torch.bfloat16)
    angles = torch.randint(0, 32768, (B, S, 1), device="cuda").float() * torch.rand(d // 2, device="cuda")
    hcos, hsin = (torch.cat((f, f), -1).to(torch.bfloat16) for f in (angles.cos(), angles.sin()))
    yield Case("qk_norm_rope (qwen3) backward", f"{B}x{S} q{Hq} k{Hk} d{d}", "bfloat16",
               3 * nbytes(q, k) + nbytes(hcos, hsin),
               backward_impls(lambda q, k, wq, wk: tk.hf_qk_norm_rope(q, k, wq, wk, eps, hcos, hsin),
                              lambda q, k, wq, wk: hf_qk_norm_rope(q, k, wq, wk, eps, hcos, hsin), (q, k, wq, wq),
                              op=lambda: tk.ops.hf_qk_norm_rope_backward(q, k, q, k, wq, wq, eps, hcos, hsin,
                                                                         [True] * 4)),
               note="Qwen3-8B prefill 4096: q_norm, k_norm, apply_rotary_pos_emb")


CASES = {"qk_norm_rope_backward": qk_norm_rope_backward_cases}
