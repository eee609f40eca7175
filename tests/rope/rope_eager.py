"""The rope family's eager CPU stand-ins (tests/eager_kernel.py gathers them): the rotations as
transformers, diffusers and vLLM write them (reference/rope.py); the backward is the same rotation
with transposed sines. rope_rows is also the qk_norm_rope family's rotation."""

import torch

from reference.rope import hf_apply_rotary_pos_emb, ltx_tables_from_coords, rotate_half


def rope_rows(x, cos, sin, style, fp32_math):
    """x [B, S, H, d]; cos, sin [B or 1, S, R]: the first R channels rotated, the rest passed."""
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    r = c.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    if style == "neox":
        rot = rotate_half(xr)
    else:
        a, b = xr.unflatten(-1, (-1, 2)).unbind(-1)
        rot = torch.stack([-b, a], dim=-1).flatten(-2)
    out = (xr.float() * c + rot.float() * s).to(x.dtype) if fp32_math else xr * c + rot * s
    return torch.cat((out, xp), dim=-1)


def _cached(positions, query, key, head_size, cache, style):
    c, s = cache.index_select(0, positions).chunk(2, dim=-1)
    c, s = (torch.cat((t, t), -1) if style == "neox" else t.repeat_interleave(2, -1) for t in (c, s))
    fp32_math = cache.dtype == torch.float32 and query.dtype != torch.float32
    if not fp32_math:
        c, s = c.to(query.dtype), s.to(query.dtype)
    for x in (query, key):
        x4 = x.reshape(1, x.shape[0], -1, head_size) if x.shape[0] else x.reshape(1, 0, 1, head_size)
        x.copy_(rope_rows(x4, c[None], s[None], style, fp32_math).reshape(x.shape))


IMPLS = {
    "rope": lambda q, k, c, s, style, f: (rope_rows(q, c, s, style, f), rope_rows(k, c, s, style, f)),
    "hf_rope": lambda q, k, c, s, dim: hf_apply_rotary_pos_emb(q, k, c, s, dim),
    "ltx_rope_from_coords": lambda q, k, grid, freqs: tuple(t.squeeze(2) for t in IMPLS["rope"](
        q.unsqueeze(2), k.unsqueeze(2), *ltx_tables_from_coords(grid, freqs, q.shape[-1]), "interleaved", True)),
}

# in place with no functional form (rope_, hf_rope_ write their functional form's results)
IN_PLACE = {"rope_cached_": _cached}


def _transposed_sines(sin, style):
    """The backward rotation's sines (s1, s2) -> (-s2, -s1): rope.cuh's transpose_sines."""
    if style == "neox":
        s1, s2 = sin.chunk(2, dim=-1)
        return torch.cat((-s2, -s1), dim=-1)
    pairs = sin.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], -pairs[..., 0]), dim=-1).flatten(-2)


BACKWARD = {
    "rope_backward": lambda gq, gk, c, s, style, f: IMPLS["rope"](gq, gk, c, _transposed_sines(s, style), style, f),
    "ltx_rope_from_coords_backward": lambda gq, gk, grid, freqs: tuple(t.squeeze(2) for t in IMPLS["rope"](
        gq.unsqueeze(2), gk.unsqueeze(2), *(lambda c, s: (c, _transposed_sines(s, "interleaved")))(
            *ltx_tables_from_coords(grid, freqs, gq.shape[-1])), "interleaved", True)),
}
