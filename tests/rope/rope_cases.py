"""The rope family's cases: its catalog entries (tests/op_catalog.py gathers them), the q/k operands
and cos/sin tables they are built from (the qk_norm_rope family's entries take them too), and the
LTX-Video coordinates and tables of the GPU tests.

Catalog cases: B, S, Hq, Hk, d and the layout of q and k (ROPE_SHAPES): separate tensors, or views
of one fused QKV projection ("strided")."""

import math

import pytest
import torch

from op_catalog import MAX_POSITION, Maker
from reference.rope import ltx_angles_from_coords

# B, S, Hq, Hk, d and the layout of q and k.
ROPE_SHAPES = {
    "small": ((1, 3, 2, 1, 64), "contiguous"),
    "aligned": ((2, 7, 4, 2, 128), "contiguous"),
    "wide": ((1, 2, 2, 1, 1024), "contiguous"),
    "odd": ((1, 5, 5, 3, 18), "contiguous"),
    "unaligned": ((2, 3, 3, 1, 64), "offset"),
    "strided": ((2, 5, 4, 2, 64), "fused"),
    "empty": ((2, 0, 4, 2, 64), "contiguous"),
}
CASES = tuple(ROPE_SHAPES)


def qk(m: Maker, case: str, pairs: bool = False):
    """q [B, S, Hq, d] and k [B, S, Hk, d] in the case's layout: separate tensors, each `shift`
    elements off (2 for the forms that need whole pairs), or views of one fused QKV projection."""
    (B, S, Hq, Hk, d), lay = ROPE_SHAPES[case]
    if lay == "fused":
        qkv = m.tensor((B, S, (Hq + 2 * Hk) * d))
        return qkv[..., : Hq * d].unflatten(-1, (Hq, d)), qkv[..., Hq * d: (Hq + Hk) * d].unflatten(-1, (Hk, d))
    shift = 2 if pairs else 1
    return m.tensor((B, S, Hq, d), lay, shift=shift), m.tensor((B, S, Hk, d), lay, shift=shift)


def _angles(m: Maker, shape):
    return m.uniform(shape, -math.pi * 64, math.pi * 64)


def neox_tables(m: Maker, B, S, R, dtype):
    """cos/sin [B, S, R] as transformers builds them (each angle twice: NeoX halves)."""
    a = _angles(m, (B, S, R // 2))
    a = torch.cat((a, a), dim=-1)
    return a.cos().to(m.device, dtype), a.sin().to(m.device, dtype)


def interleaved_tables(m: Maker, B, S, R):
    """fp32 cos/sin [B, S, R] as diffusers builds them (each angle for a pair of channels)."""
    a = _angles(m, (B, S, R // 2)).repeat_interleave(2, dim=-1)
    return a.cos().to(m.device), a.sin().to(m.device)


def ltx_coords(m: Maker, B, S, C):
    """grid [B, S, 3] in [0, 1) and freqs [C // 6], float32, as LTX-Video's rotary module makes them."""
    grid = m.uniform((B, S, 3), 0.0, 1.0).to(m.device)
    freqs = (m.uniform((C // 6,), 1.0, 100.0) * (math.pi / 2)).to(m.device)
    return grid, freqs


def ltx_qk3(m: Maker, case: str, pairs: bool):
    """LTX-Video's q and k [B, S, C] (C = Hq * d, the norm across all heads) in the case's layout."""
    (B, S, Hq, Hk, d), lay = ROPE_SHAPES[case]
    C = Hq * d
    if lay == "fused":
        qkv = m.tensor((B, S, 3 * C))
        return qkv[..., :C], qkv[..., C: 2 * C], (B, S, C)
    shift = 2 if pairs else 1
    return m.tensor((B, S, C), lay, shift=shift), m.tensor((B, S, C), lay, shift=shift), (B, S, C)


def entries():
    def rope(style: str, fp32: bool, in_place: bool, partial: bool):
        def build(m, case):
            (B, S, Hq, Hk, d), _ = ROPE_SHAPES[case]
            q, k = qk(m, case)
            R = (d // 4) * 2 if partial else d
            if style == "neox":
                cos, sin = neox_tables(m, B, S, R, torch.float32 if fp32 else m.dtype)
            else:
                cos, sin = interleaved_tables(m, 1, S, R)  # shared by the batch (Flux)
            return (q, k, cos, sin, style, fp32), ((0, 1) if in_place else ())
        return build

    def cached(style: str, fp32_cache: bool):
        def build(m, case):
            (B, S, Hq, Hk, d), _ = ROPE_SHAPES[case]
            q, k = qk(m, case)
            query, key = q.flatten(0, 1).flatten(1, 2), k.flatten(0, 1)  # [T, Hq*d] and [T, Hk, d]
            R = d
            a = _angles(m, (MAX_POSITION, R // 2))
            cache = torch.cat((a.cos(), a.sin()), dim=-1).to(m.device, torch.float32 if fp32_cache else m.dtype)
            positions = torch.randint(0, MAX_POSITION, (B * S,), generator=m.gen).to(m.device)
            return (positions, query, key, d, cache, style), (1, 2)
        return build

    def hf(in_place: bool):
        def build(m, case):
            (B, S, Hq, Hk, d), _ = ROPE_SHAPES[case]
            q, k = qk(m, case)
            cos, sin = neox_tables(m, B, S, d, m.dtype)
            return (q.transpose(1, 2), k.transpose(1, 2), cos, sin, 1), ((0, 1) if in_place else ())
        return build

    def ltx(m, case):
        q, k, (B, S, C) = ltx_qk3(m, case, pairs=False)
        grid, freqs = ltx_coords(m, B, S, C)
        return (q, k, grid, freqs), ()

    return {
        "rope[neox]": ("rope", rope("neox", False, False, False)),
        "rope[neox,partial]": ("rope", rope("neox", False, False, True)),
        "rope[interleaved,fp32]": ("rope", rope("interleaved", True, False, False)),
        "rope_[neox]": ("rope_", rope("neox", False, True, False)),
        "rope_[interleaved,fp32]": ("rope_", rope("interleaved", True, True, False)),
        "rope_cached_[neox]": ("rope_cached_", cached("neox", False)),
        "rope_cached_[interleaved,fp32_cache]": ("rope_cached_", cached("interleaved", True)),
        "hf_rope": ("hf_rope", hf(False)),
        "hf_rope_": ("hf_rope_", hf(True)),
        "ltx_rope_from_coords": ("ltx_rope_from_coords", ltx),
        # backward: q's and k's gradients in q's and k's place (the same layouts)
        "rope_backward[neox]": ("rope_backward", rope("neox", False, False, True)),
        "rope_backward[interleaved,fp32]": ("rope_backward", rope("interleaved", True, False, False)),
        "ltx_rope_from_coords_backward": ("ltx_rope_from_coords_backward", ltx),
    }


# ---- the GPU tests' inputs ----

def hf_cos_sin(B, S, rotary_dim, dtype, theta=500000.0):
    """As transformers' LlamaRotaryEmbedding builds them, at random non-monotonic positions."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device="cuda").float() / rotary_dim))
    positions = torch.randint(0, 8192, (B, S), device="cuda").float()
    freqs = positions[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def ltx_cos_sin(B, S, C):
    """fp32 tables like LTXVideoRotaryPosEmbed: pairs repeated, identity channels prepended when
    C % 6 != 0."""
    freqs = torch.rand(B, S, C // 6 * 3, device="cuda") * 2 * math.pi
    cos, sin = freqs.cos().repeat_interleave(2, dim=-1), freqs.sin().repeat_interleave(2, dim=-1)
    pad = C - cos.shape[-1]
    if pad:
        cos = torch.cat([torch.ones(B, S, pad, device="cuda"), cos], dim=-1)
        sin = torch.cat([torch.zeros(B, S, pad, device="cuda"), sin], dim=-1)
    return cos, sin


# LTX-Video's rotary coordinates, and the tables diffusers builds from them (the rope and
# qk_norm_rope tests and the rotation backward tests)
LTX_COORD_SOURCES = ["scaled_grid", "video_coords", "large_angles"]


def ltx_coords_and_tables(B, F, H, W, C, source):
    """(grid, freqs) from integrations' ltx_rope_coords, and the fp32 cos/sin tables diffusers' own
    LTXVideoRotaryPosEmbed (LTX-Video 2B's settings) builds from the same arguments on the GPU.
    Sources: latent sizes with the interpolation scale (LTX 0.9.0), pixel coordinates [B, 3, S]
    (0.9.5+), and coordinates 40x past the video's extent, so that |angle| > 105615 takes cosf's
    slow (Payne-Hanek) reduction."""
    pytest.importorskip("diffusers")
    from diffusers.models.transformers.transformer_ltx import LTXVideoRotaryPosEmbed

    from transformer_kernels_integrations.diffusers_models import ltx_rope_coords

    rope = LTXVideoRotaryPosEmbed(C, base_num_frames=20, base_height=2048, base_width=2048, patch_size=1,
                                  patch_size_t=1, theta=10000.0)
    hidden_states = torch.empty(B, F * H * W, C, device="cuda")
    if source == "scaled_grid":
        kwargs = dict(num_frames=F, height=H, width=W, rope_interpolation_scale=(8 / 25, 32, 32))
    else:
        extent = torch.tensor([49.0, 512.0, 768.0], device="cuda")[:, None] * (40 if source == "large_angles" else 1)
        kwargs = dict(video_coords=torch.rand(B, 3, F * H * W, device="cuda") * extent)
    cos, sin = rope(hidden_states, **kwargs)
    grid, freqs = ltx_rope_coords(rope, hidden_states, **kwargs)
    if source == "large_angles" and C >= 12:  # below 12 channels the one frequency is pi / 2
        assert (ltx_angles_from_coords(grid, freqs).abs() > 105615).any()
    return grid, freqs, cos, sin
