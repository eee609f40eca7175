"""Micro-benchmark cases of the rope family (csrc/rope/): apply_rotary_pos_emb, rotary_embedding,
ltx_rope, ltx_rope_from_coords, flux_rope, and their backward. `--ops rope` also times the fused q/k
norm + rotation (qk_norm_rope's ops) on the same tensors, against the rotation alone and the unfused
pair; the backward cases run under `--ops activation_rope_backward` (benchmarks/micro/cross_family.py)."""

from __future__ import annotations

from typing import Iterator

import torch

from benchmarks.harness import Case
from benchmarks.micro.common import backward_impls, liger_fn, nbytes, with_baselines
from benchmarks.micro.qk_norm_rope import hf_qk_norm_rope_case
from reference.rope import (
    diffusers_interleaved_rotary,
    diffusers_qk_norm_rope,
    hf_apply_rotary_pos_emb,
    vllm_rotary_embedding_native,
)


def hf_rope_case(tk, B: int, S: int, Hq: int, Hk: int, d: int, note: str) -> Case:
    """q, k as transformers' attention passes them: [B, H, S, d] views of one fused projection."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    qkv = torch.randn(B, S, (Hq + 2 * Hk) * d, **bf16)
    q = qkv[..., : Hq * d].view(B, S, Hq, d).transpose(1, 2)
    k = qkv[..., Hq * d: (Hq + Hk) * d].view(B, S, Hk, d).transpose(1, 2)
    angles = torch.rand(B, S, d // 2, device="cuda") * 100
    cos, sin = (torch.cat((f, f), -1).to(torch.bfloat16) for f in (angles.cos(), angles.sin()))
    impls = with_baselines(lambda: tk.apply_rotary_pos_emb(q, k, cos, sin), hf_apply_rotary_pos_emb, (q, k, cos, sin))
    liger = liger_fn("rope", "LigerRopeFunction")
    if liger is not None:  # in place on contiguous copies, as Liger's own wrapper requires
        qc, kc = q.contiguous(), k.contiguous()
        impls["liger"] = lambda: liger(qc, kc, cos, sin)
    return Case("apply_rotary_pos_emb", f"{B}x{S} q{Hq} k{Hk} d{d}", "bfloat16", 2 * nbytes(q, k) + nbytes(cos, sin),
                impls, latency=S <= 4, note=note)


def rope_cases(tk, quick: bool) -> Iterator[Case]:
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    yield hf_rope_case(tk, 1, 1, 32, 8, 128, "Llama-3.1-8B decode, 1 token")
    yield hf_rope_case(tk, 1, 4096, 32, 8, 128, "Llama-3.1-8B prefill 4096")
    yield hf_qk_norm_rope_case(tk, 1, 4096, 32, 8, 128, "Qwen3-8B prefill 4096 (eager: q_norm, k_norm, then "
                               "apply_rotary_pos_emb)")
    if quick:
        return
    yield hf_qk_norm_rope_case(tk, 1, 1, 32, 8, 128, "Qwen3-8B decode, 1 token")
    # The 4-64 MB range (the 1.2x bar): 1024-token prefills (21 MB).
    yield hf_rope_case(tk, 1, 1024, 32, 8, 128, "Llama-3.1-8B prefill 1024")
    yield hf_qk_norm_rope_case(tk, 1, 1024, 32, 8, 128, "Qwen3-8B prefill 1024")
    yield hf_rope_case(tk, 4, 4096, 32, 8, 128, "Llama-3.1-8B prefill 4x4096")
    # vLLM's form: positions into a cos/sin cache, in place on views of the fused QKV projection
    T, Hq, Hk, d = 16384, 32, 8, 128
    qkv = torch.randn(T, (Hq + 2 * Hk) * d, **bf16)
    q, k = qkv[:, : Hq * d], qkv[:, Hq * d: (Hq + Hk) * d]
    angles = torch.rand(8192, d // 2, device="cuda") * 100
    cache = torch.cat((angles.cos(), angles.sin()), -1).to(torch.bfloat16)
    positions = torch.randint(0, 8192, (T,), device="cuda")
    yield Case("rotary_embedding (vllm, in place)", f"{T} tokens q{Hq} k{Hk} d{d}", "bfloat16",
               2 * nbytes(q, k) + nbytes(positions) + T * d * 2,
               with_baselines(lambda: tk.rotary_embedding(positions, q, k, d, cache),
                              lambda p, q, k, c: vllm_rotary_embedding_native(p, q, k, d, c), (positions, q, k, cache),
                              eager_name="vllm native"),
               note="Llama-3.1-8B, 16384 batched tokens (vLLM forward_native as the eager code)")
    # LTX-Video 2B: q, k [B, S, 2048] with fp32 tables [B, S, 2048] (diffusers' apply_rotary_emb)
    q, k = torch.randn(2, 8064, 2048, **bf16), torch.randn(2, 8064, 2048, **bf16)
    angles = torch.rand(2, 8064, 1024, device="cuda") * 100
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    yield Case("ltx_rope", "2x8064x2048", "bfloat16", 2 * nbytes(q, k) + nbytes(cos, sin),
               with_baselines(lambda: tk.ltx_rope(q, k, cos, sin),
                              lambda q, k, c, s: (diffusers_interleaved_rotary(q, c, s),
                                                  diffusers_interleaved_rotary(k, c, s)), (q, k, cos, sin)),
               note="LTX-Video 2B, 49 frames 512x768, CFG batch 2 (fp32 tables are 2/3 of the bytes)")
    # LTX-Video 2B attention: q/k RMSNorm across heads + the rotation, fused, against the unfused pair
    wq, wk = (torch.rand(2048, device="cuda").to(torch.bfloat16) + 0.5 for _ in range(2))

    impls = with_baselines(lambda: tk.ltx_qk_norm_rope(q, k, wq, wk, 1e-6, cos, sin),
                           lambda q, k, c, s: diffusers_qk_norm_rope(q, k, wq, wk, 1e-6, c, s), (q, k, cos, sin))
    impls["ours unfused"] = lambda: tk.ltx_rope(tk.rms_norm(q, wq, 1e-6, rounding="torch"),
                                                tk.rms_norm(k, wk, 1e-6, rounding="torch"), cos, sin)
    yield Case("ltx_qk_norm_rope", "2x8064x2048", "bfloat16", 2 * nbytes(q, k) + nbytes(cos, sin), impls,
               note="LTX-Video 2B self-attention: norm_q, norm_k and apply_rotary_emb")
    yield from ltx_from_coords_cases(tk, q, k, wq, wk)
    # Flux: q, k [1, 4608, 24, 128], fp32 tables [4608, 128]
    q, k = torch.randn(1, 4608, 24, 128, **bf16), torch.randn(1, 4608, 24, 128, **bf16)
    angles = torch.rand(4608, 64, device="cuda") * 100
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    yield Case("flux_rope", "1x4608x24x128", "bfloat16", 2 * nbytes(q, k) + nbytes(cos, sin),
               with_baselines(lambda: tk.flux_rope(q, k, cos, sin),
                              lambda q, k, c, s: (diffusers_interleaved_rotary(q, c[None, :, None], s[None, :, None]),
                                                  diffusers_interleaved_rotary(k, c[None, :, None], s[None, :, None])),
                              (q, k, cos, sin)), note="Flux 1024x1024 (4096 image + 512 text tokens)")


def ltx_from_coords_cases(tk, q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor) -> Iterator[Case]:
    """LTX-Video 2B's rotation and fused q/k norm + rotation with cos/sin computed in the kernel from
    the coordinates LTXVideoRotaryPosEmbed builds its tables from (grid [2, 8064, 3], freqs [341]).
    Bytes: q, k in and out, grid and freqs. The baselines apply the module's own fp32 tables, as
    the model does: it builds them once per forward for all 28 blocks, so that is not timed."""
    try:
        from diffusers.models.transformers.transformer_ltx import LTXVideoRotaryPosEmbed
    except ImportError:
        return
    from transformer_kernels_integrations.diffusers_models import ltx_rope_coords

    rope = LTXVideoRotaryPosEmbed(2048, base_num_frames=20, base_height=2048, base_width=2048, patch_size=1,
                                  patch_size_t=1, theta=10000.0)
    # 21 latent frames of 16x24 = 8064 tokens, the scale the LTX pipeline passes at 25 fps
    args = (q, 21, 16, 24, (8 / 25, 32, 32))
    cos, sin = rope(*args)
    grid, freqs = ltx_rope_coords(rope, *args)
    impls = with_baselines(lambda: tk.ltx_rope_from_coords(q, k, grid, freqs),
                           lambda q, k, c, s: (diffusers_interleaved_rotary(q, c, s),
                                               diffusers_interleaved_rotary(k, c, s)), (q, k, cos, sin))
    impls["ours tables"] = lambda: tk.ltx_rope(q, k, cos, sin)
    yield Case("ltx_rope_from_coords", "2x8064x2048", "bfloat16", 2 * nbytes(q, k) + nbytes(grid, freqs), impls,
               note="cos/sin from grid and freqs in the kernel; baselines read the fp32 tables")
    impls = with_baselines(lambda: tk.ltx_qk_norm_rope_from_coords(q, k, wq, wk, 1e-6, grid, freqs),
                           lambda q, k, c, s: diffusers_qk_norm_rope(q, k, wq, wk, 1e-6, c, s), (q, k, cos, sin))
    impls["ours tables"] = lambda: tk.ltx_qk_norm_rope(q, k, wq, wk, 1e-6, cos, sin)
    yield Case("ltx_qk_norm_rope_from_coords", "2x8064x2048", "bfloat16",
               2 * nbytes(q, k) + nbytes(grid, freqs), impls,
               note="norm_q, norm_k and the rotation, cos/sin from grid and freqs; baselines read the fp32 tables")


def rope_backward_cases(tk) -> Iterator[Case]:
    """The rotations' backward: transformers' (with Liger's), LTX-Video's tables and coordinates, Flux's.
    Bytes: the output gradients and the tables read, the gradients written (2x q and k plus the tables).
    The second half of `--ops activation_rope_backward`, in full runs only (not --quick)."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    # transformers' rotation: q [B, H, S, d], k likewise, bf16 tables
    B, S, Hq, Hk, d = 1, 4096, 32, 8, 128
    q, k = torch.randn(B, Hq, S, d, **bf16), torch.randn(B, Hk, S, d, **bf16)
    angles = torch.rand(B, S, d // 2, device="cuda") * 100
    cos, sin = (torch.cat((f, f), -1).to(torch.bfloat16) for f in (angles.cos(), angles.sin()))
    liger = liger_fn("rope", "LigerRopeFunction")
    yield Case("rope (hf neox) backward", f"{B}x{S} q{Hq} k{Hk} d{d}", "bfloat16", 2 * nbytes(q, k) + nbytes(cos, sin),
               backward_impls(lambda q, k: tk.apply_rotary_pos_emb(q, k, cos, sin),
                              lambda q, k: hf_apply_rotary_pos_emb(q, k, cos, sin), (q, k),
                              liger=None if liger is None else (lambda q, k: liger(q.contiguous(), k.contiguous(), cos, sin)),
                              op=lambda: tk.ops.rope_backward(q.transpose(1, 2), k.transpose(1, 2), cos, sin, "neox", False)),
               note="Llama-3.1-8B prefill 4096")
    # LTX-Video 2B: tables [2, 8064, 2048] fp32, and the coordinate form
    q, k = torch.randn(2, 8064, 2048, **bf16), torch.randn(2, 8064, 2048, **bf16)
    angles = torch.rand(2, 8064, 1024, device="cuda") * 100
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    yield Case("rope (ltx interleaved) backward", "2x8064x2048", "bfloat16", 2 * nbytes(q, k) + nbytes(cos, sin),
               backward_impls(lambda q, k: tk.ltx_rope(q, k, cos, sin),
                              lambda q, k: (diffusers_interleaved_rotary(q, cos, sin),
                                            diffusers_interleaved_rotary(k, cos, sin)), (q, k),
                              op=lambda: tk.ops.rope_backward(q[:, :, None], k[:, :, None], cos, sin, "interleaved",
                                                              True)),
               note="LTX-Video 2B, 49 frames 512x768, CFG batch 2")
    grid = torch.rand(2, 8064, 3, device="cuda")
    freqs = torch.rand(2048 // 6, device="cuda") * 100
    yield Case("rope (ltx from coords) backward", "2x8064x2048", "bfloat16", 2 * nbytes(q, k) + nbytes(grid, freqs),
               backward_impls(lambda q, k: tk.ltx_rope_from_coords(q, k, grid, freqs),
                              lambda q, k: (diffusers_interleaved_rotary(q, cos, sin),
                                            diffusers_interleaved_rotary(k, cos, sin)), (q, k),
                              op=lambda: tk.ops.ltx_rope_from_coords_backward(q, k, grid, freqs)),
               note="cos/sin from grid and freqs in the kernel; the baselines read fp32 tables")
    q, k = torch.randn(1, 4608, 24, 128, **bf16), torch.randn(1, 4608, 24, 128, **bf16)
    angles = torch.rand(4608, 64, device="cuda") * 100
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    c4, s4 = cos[None, :, None], sin[None, :, None]
    yield Case("rope (flux interleaved) backward", "1x4608x24x128", "bfloat16", 2 * nbytes(q, k) + nbytes(cos, sin),
               backward_impls(lambda q, k: tk.flux_rope(q, k, cos, sin),
                              lambda q, k: (diffusers_interleaved_rotary(q, c4, s4),
                                            diffusers_interleaved_rotary(k, c4, s4)), (q, k),
                              op=lambda: tk.ops.rope_backward(q, k, cos[None], sin[None], "interleaved", True)),
               note="Flux 1024x1024 (4096 image + 512 text tokens)")


CASES = {"rope": rope_cases}
