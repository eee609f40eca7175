#!/usr/bin/env python3
"""Micro-benchmarks: every op on real model shapes and dtypes against its baselines.

    python benchmarks/bench_micro.py --out benchmarks/results [--ops rms_norm] [--quick]

Writes micro-<gpu>-<date>.json and .md (see benchmarks/harness.py for the method).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from benchmarks import harness  # noqa: E402
from benchmarks.harness import Case, Report, copy_gbps, environment, result_stem  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402
from reference.activations import eager_act_and_mul, eager_act_mul, eager_activation, eager_gated_add  # noqa: E402
from reference.rope import (  # noqa: E402
    diffusers_interleaved_rotary,
    diffusers_qk_norm_rope,
    hf_apply_rotary_pos_emb,
    hf_qk_norm_rope,
    vllm_rotary_embedding_native,
)
from reference.group_norm import eager_group_norm  # noqa: E402
from reference.norms import (  # noqa: E402
    diffusers_norm_modulate,
    hf_fused_add_rms_norm,
    hf_rms_norm,
    ltx_gated_add_norm_modulate,
    torch_layer_norm,
)

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}

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


def compiled(fn: Callable) -> Callable:
    """torch.compile of the eager code, specialized to the case's shapes (dynamic=False)."""
    return torch.compile(fn, dynamic=False)


def with_baselines(ours: Callable, eager: Callable, args: tuple, eager_name: str = "eager",
                   liger: Callable | None = None, liger_args: tuple = ()) -> dict[str, Callable]:
    """The implementations one case times: ours, the eager code, its torch.compile, and Liger."""
    compiled_eager = compiled(eager)
    impls = {"ours": ours, eager_name: lambda: eager(*args), "compile": lambda: compiled_eager(*args)}
    if liger is not None:
        impls["liger"] = lambda: liger(*liger_args)
    return impls


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def liger_fn(module: str, name: str) -> Callable | None:
    try:
        return getattr(__import__(f"liger_kernel.ops.{module}", fromlist=[name]), name).apply
    except (ImportError, AttributeError):
        return None


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


def gated_add_case(tk, batch: int, tokens: int, note: str) -> Case:
    """LTX-Video 2B's gated residual hidden_states + ff_output * gate_mlp, gate [batch, 1, 2048]."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x, y = torch.randn(batch, tokens, 2048, **bf16), torch.randn(batch, tokens, 2048, **bf16)
    gate = torch.randn(batch, 1, 2048, **bf16) * 0.3
    return Case("gated_add", f"{batch}x{tokens}x2048", "bfloat16", 3 * nbytes(x) + nbytes(gate),
                with_baselines(lambda: tk.gated_add(x, y, gate), eager_gated_add, (x, y, gate)),
                note=f"LTX-Video 2B residual, {note}")


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

# ([N, C, H, W], groups, where the shape comes from): SDXL's UNet at 1024x1024 (128x128 latents,
# batch 2 for guidance) and its VAE decoder (1024x1024 output, one image).
GROUP_NORM_SHAPES = [
    ((2, 320, 128, 128), 32, "SDXL UNet 128x128 level (resnets' norm1/norm2)"),
    ((2, 640, 64, 64), 32, "SDXL UNet 64x64 level"),
    ((2, 1280, 32, 32), 32, "SDXL UNet 32x32 level"),
    ((1, 512, 256, 256), 32, "VAE decoder up block 1"),
    ((1, 256, 512, 512), 32, "VAE decoder up block 2"),
    ((1, 128, 1024, 1024), 32, "VAE decoder last up block and conv_norm_out"),
]
GROUP_NORM_QUICK = {(2, 320, 128, 128), (1, 128, 1024, 1024)}
APEX_NOTE = "Apex (NVIDIA's NHWC GroupNorm) is not installed here: no Apex column"


def group_norm_case(tk, shape, groups: int, dtype: torch.dtype, layout: str, activation: str | None,
                    time_add: bool, note: str) -> Case:
    """GroupNorm (+ SiLU) of x [N, C, H, W] in `layout`; with `time_add`, ResnetBlock2D's norm2 of
    x + temb[:, :, None, None]. Baselines: F.group_norm (+ F.silu) and its torch.compile."""
    eps = 1e-5
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(shape, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    w = (torch.rand(shape[1], device="cuda") + 0.5).to(dtype)
    b = (torch.rand(shape[1], device="cuda") - 0.5).to(dtype)
    temb = torch.randn(shape[0], shape[1], device="cuda", dtype=dtype) if time_add else None
    if time_add:
        ours = lambda: tk.add_group_norm(x, temb, groups, w, b, eps, activation)  # noqa: E731
        eager = lambda x, t, w, b: eager_group_norm(x, groups, w, b, eps, activation, bias_nc=t)  # noqa: E731
        args = (x, temb, w, b)
    else:
        ours = lambda: tk.group_norm(x, groups, w, b, eps, activation)  # noqa: E731
        eager = lambda x, w, b: eager_group_norm(x, groups, w, b, eps, activation)  # noqa: E731
        args = (x, w, b)
    op = ("add_group_norm" if time_add else "group_norm") + (f" + {activation}" if activation else "")
    n, c, h, wd = shape
    return Case(f"{op} ({layout.replace('_', '-')})", f"{n}x{c}x{h}x{wd} G{groups}", DTYPE_NAMES[dtype],
                2 * nbytes(x) + nbytes(w, b, temb), with_baselines(ours, eager, args), note=f"{note}; {APEX_NOTE}")


def group_norm_cases(tk, quick: bool, vae: bool = False) -> Iterator[Case]:
    """The UNet's shapes (vae=False) or the VAE decoder's, in both memory formats, + SiLU (the
    UNet's also with the time add of norm2)."""
    for shape, groups, note in GROUP_NORM_SHAPES:
        if (shape[0] == 1) != vae or (quick and shape not in GROUP_NORM_QUICK):
            continue
        for layout in ("channels_first", "channels_last"):
            yield group_norm_case(tk, shape, groups, torch.bfloat16, layout, "silu", False, note)
            if not vae:  # the UNet's resnets: norm2 takes the time embedding
                yield group_norm_case(tk, shape, groups, torch.bfloat16, layout, "silu", True, note)
    if not vae:  # without the activation: Transformer2DModel's input norm
        yield group_norm_case(tk, (2, 640, 64, 64), 32, torch.bfloat16, "channels_first", None, False,
                              "Transformer2DModel input norm (no activation)")
    elif not quick:  # SDXL's VAE decodes upcast to fp32 (force_upcast), SD 1.5's in fp16
        for dtype in (torch.float32, torch.float16):
            for layout in ("channels_first", "channels_last"):
                yield group_norm_case(tk, (1, 128, 1024, 1024), 32, dtype, layout, "silu", False,
                                      "VAE decoder last up block, " + DTYPE_NAMES[dtype])


def group_norm_vae_cases(tk, quick: bool) -> Iterator[Case]:
    return group_norm_cases(tk, quick, vae=True)


# ---- backward ----
# Each case times the backward pass alone: the forward runs once, then autograd.grad (retain_graph)
# replays the backward of ours (through the autograd registration), of the eager code, of its
# torch.compile and of Liger; "ours (op)" calls our backward op directly. Bytes: what a backward
# must move at least (the saved input and the output gradient read, the input gradient written,
# parameters and their gradients).

def backward_of(forward: Callable, inputs: tuple, grad_like: Callable | None = None) -> Callable:
    """The backward of forward(*inputs) as a replayable call: the forward runs here once; the
    output gradients are fresh random tensors of the outputs' shapes and dtypes."""
    leaves = [t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
              for t in inputs]
    outs = forward(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = [torch.randn_like(o) for o in outs]
    wrt = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    return lambda: torch.autograd.grad(outs, wrt, grads, retain_graph=True)


def backward_impls(ours: Callable, eager: Callable, inputs: tuple, eager_name: str = "eager",
                   liger: Callable | None = None, op: Callable | None = None) -> dict[str, Callable]:
    impls = {"ours": backward_of(ours, inputs), eager_name: backward_of(eager, inputs),
             "compile": backward_of(compiled(eager), inputs)}
    if liger is not None:
        impls["liger"] = backward_of(liger, inputs)
    if op is not None:
        impls["ours (op)"] = op
    return impls


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


def activation_rope_backward_cases(tk, quick: bool) -> Iterator[Case]:
    """Llama-3.2-1B's and Llama-3.1-8B's SwiGLU (16 K tokens x 8192, 4096 x 14336), the fused gate_up
    projection (silu_and_mul), GEGLU (tanh, Liger's form; SDXL's erf), LTX-Video 2B's GELU-tanh FFN, and
    the rotations (transformers' with Liger's, LTX-Video's tables and coordinates, Flux's). Bytes: the
    output gradient and the saved inputs read, the inputs' gradients written (5x one operand for the
    gated units, 3x for an activation, 2x q and k plus the tables for a rotation)."""
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


# Shapes nobody tunes to (issue 35, item 5): token counts from 1 to a few thousand that are not powers
# of two, widths that are not multiples of 64 (two not of 8). Drawn once (random.Random(20261202)) and
# kept, so that runs compare.
UNTUNED_SHAPES = [(1, 1598), (83, 7906), (111, 4659), (418, 2450), (3990, 1598), (4590, 7906)]


def untuned_cases(tk, quick: bool) -> Iterator[Case]:
    """rms_norm, fused_add_rms_norm, silu_and_mul and gelu (tanh) at UNTUNED_SHAPES, bf16, against the
    same baselines as their tuned cases (one-token rows are host-bound: timed per call)."""
    eps = 1e-6
    liger_add = liger_fn("fused_add_rms_norm", "LigerFusedAddRMSNormFunction")
    for rows, hidden in UNTUNED_SHAPES[:2] if quick else UNTUNED_SHAPES:
        note = "untuned shape"
        latency = rows <= 4
        yield rms_norm_case(tk, rows, hidden, torch.bfloat16, note)
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        r = torch.randn_like(x)
        w = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16)
        yield Case("fused_add_rms_norm", f"{rows}x{hidden}", "bfloat16", 4 * nbytes(x) + nbytes(w),
                   with_baselines(lambda: tk.fused_add_rms_norm(x, r, w, eps),
                                  lambda x, r, w: hf_fused_add_rms_norm(x, r, w, eps), (x, r, w),
                                  liger=liger_add, liger_args=(x, r, w, eps)), latency=latency, note=note)
        p = torch.randn(rows, 2 * hidden, device="cuda", dtype=torch.bfloat16)
        yield Case("silu_and_mul", f"{rows}x(2x{hidden})", "bfloat16", nbytes(p) * 3 // 2,
                   with_baselines(lambda: tk.silu_and_mul(p), lambda p: eager_act_and_mul(p, "silu", act_first=True),
                                  (p,)), latency=latency, note=note)
        yield Case("gelu (tanh)", f"{rows}x{hidden}", "bfloat16", 2 * nbytes(x),
                   with_baselines(lambda: tk.gelu(x, "tanh"), lambda h: eager_activation(h, "gelu_tanh"), (x,),
                                  eager_name="native"), latency=latency, note=note)


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
                   {"ours": lambda: tk.decode_linear(x, wq, None, ws), "F.linear bf16": lambda: F.linear(x, w)},
                   note=f"{where}; weight-only FP8")


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


OPS = {"rms_norm": rms_norm_cases, "activation": activation_cases, "fused_add_rms_norm": fused_add_rms_norm_cases,
       "layer_norm": layer_norm_cases, "modulate": modulate_cases, "rope": rope_cases,
       "linear_gelu": linear_gelu_cases, "norm_backward": norm_backward_cases,
       "qk_norm_rope_backward": qk_norm_rope_backward_cases,
       "activation_rope_backward": activation_rope_backward_cases, "group_norm": group_norm_cases,
       "group_norm_vae": group_norm_vae_cases, "quantize_fp8": quantize_fp8_cases,
       "linear_fp8": linear_fp8_cases, "decode_linear": decode_linear_cases, "untuned": untuned_cases}



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--ops", nargs="*", default=sorted(OPS), choices=sorted(OPS))
    parser.add_argument("--quick", action="store_true", help="a few shapes per op")
    parser.add_argument("--flush", choices=harness.FLUSH_MODES, default="write",
                        help="how L2 is flushed before each timed rep: 'write' zeroes a 256 MB buffer as "
                             "triton's do_bench does (the benchmark of record), 'read' sums one and leaves "
                             "L2 clean (shows what the memset's dirty lines cost each kernel)")
    args = parser.parse_args()
    harness.L2_FLUSH = args.flush
    if not torch.cuda.is_available():
        raise SystemExit("the micro-benchmarks need an NVIDIA GPU (torch.cuda.is_available() is False)")

    use_local_build()
    tk = load_kernel()
    # Every case compiles its own specialized graph; the default limit would silently fall back to
    # eager after 8 shapes of one function.
    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.accumulated_recompile_limit = 4096
    report = Report(environment(), copy_gbps())
    print(f"{report.env['gpu']}: device-to-device copy {report.copy_gbps:.0f} GB/s")
    stem = result_stem("micro", report.env, "-read-flush" if args.flush == "read" else "")
    for op in args.ops:
        for case in tqdm(OPS[op](tk, args.quick), desc=op):
            report.run(case)
            torch.cuda.empty_cache()
        js, md = report.save(args.out, stem)  # after each op: a run cut short keeps what it measured
    print(md.read_text())
    print(f"wrote {js} and {md}")


if __name__ == "__main__":
    main()
