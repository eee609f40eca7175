"""RoPE references: the eager code of transformers and diffusers, and float64 math."""

import torch

from .norms import hf_rms_norm, rms_norm_float64


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' ``rotate_half``."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' ``apply_rotary_pos_emb`` (Llama, Mistral, Qwen2/3), with partial rotary as
    the models that have it split q into rotated and passed-through channels."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    r = cos.shape[-1]

    def apply(x):
        x_rot, x_pass = x[..., :r], x[..., r:]
        return torch.cat(((x_rot * cos) + (rotate_half(x_rot) * sin), x_pass), dim=-1)

    return apply(q), apply(k)


def hf_qk_norm_rope(q, k, q_weight, k_weight, eps, cos, sin):
    """transformers' Qwen3 attention from the projections to the rotated q and k: ``q_norm``/``k_norm``
    (``Qwen3RMSNorm`` per head) on q ``[B, S, Hq, d]`` and k ``[B, S, Hk, d]``, the transpose, then
    ``apply_rotary_pos_emb``; returned as ``[B, S, H, d]`` (the layout before the transpose)."""
    q_heads = hf_rms_norm(q, q_weight, eps).transpose(1, 2)
    k_heads = hf_rms_norm(k, k_weight, eps).transpose(1, 2)
    q_out, k_out = hf_apply_rotary_pos_emb(q_heads, k_heads, cos, sin)
    return q_out.transpose(1, 2), k_out.transpose(1, 2)


def hf_qk_norm_rope_float64(x, weight, eps, cos, sin):
    """The same for one of q, k ``[B, S, H, d]`` in float64; cos/sin ``[B or 1, S, d]``."""
    return rotary_float64(rms_norm_float64(x, weight, eps), cos.unsqueeze(2), sin.unsqueeze(2), "neox")


def diffusers_interleaved_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' interleaved form (LTX-Video ``apply_rotary_emb``, Flux ``use_real_unbind_dim=-1``):
    fp32 math, one cast back."""
    x_real, x_imag = x.unflatten(-1, (-1, 2)).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(-2)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def diffusers_qk_norm_rope(q, k, q_weight, k_weight, eps, cos, sin):
    """LTX-Video's and Flux's attention before the head split: ``norm_q``/``norm_k``
    (``torch.nn.RMSNorm``), then diffusers' interleaved ``apply_rotary_emb`` on each."""
    def one(x, w):
        return diffusers_interleaved_rotary(torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps), cos, sin)

    return one(q, q_weight), one(k, k_weight)


def rotary_float64(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """The rotation in float64; x [..., d], cos/sin broadcast to [..., R]."""
    x64, c, s = x.double(), cos.double(), sin.double()
    r = c.shape[-1]
    xr, xp = x64[..., :r], x64[..., r:]
    if style == "neox":
        rot = rotate_half(xr)
    else:
        a, b = xr.unflatten(-1, (-1, 2)).unbind(-1)
        rot = torch.stack([-b, a], dim=-1).flatten(-2)
    return torch.cat((xr * c + rot * s, xp), dim=-1)


def vllm_rotary_embedding_native(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    """vLLM's ``RotaryEmbedding.forward_native`` (out of place): gather each token's cache row, split
    it into R/2 cosines and sines, rotate the first R channels of every head in the cache's dtype."""
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    r = cos.shape[-1] * 2

    def apply(x):
        x = x.view(x.shape[0], -1, head_size)
        x_rot, x_pass = x[..., :r], x[..., r:]
        c, s = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
        if is_neox:
            x1, x2 = x_rot.chunk(2, dim=-1)
            rotated = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
        else:
            x1, x2 = x_rot[..., ::2], x_rot[..., 1::2]
            rotated = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
        return torch.cat((rotated, x_pass), dim=-1).flatten(-2)

    return apply(query), apply(key)


def ltx_angles_from_coords(grid: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """The angles [B, S, 3F] diffusers' ``LTXVideoRotaryPosEmbed.forward`` computes from its grid
    [B, S, 3] and freqs [F], in its fp32 ops and order (angle index 3f + axis)."""
    angles = freqs * (grid.unsqueeze(-1) * 2 - 1)
    return angles.transpose(-1, -2).flatten(2)


def ltx_angles_by_index(grid: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """The same angles written as the kernels compute them: angle j = freqs[j // 3] * (grid[j % 3] * 2 - 1)."""
    j = torch.arange(3 * freqs.shape[0], device=grid.device)
    return freqs[j // 3] * (grid[..., j % 3] * 2 - 1)


def ltx_tables_from_angles(angles: torch.Tensor, dim: int, cos_sin=(torch.cos, torch.sin)):
    """cos/sin tables [B, S, dim] from the angles: each angle's pair repeated, dim - 6F identity
    channels (cos 1, sin 0) in front, as ``LTXVideoRotaryPosEmbed`` lays them out."""
    cos, sin = (f(angles).repeat_interleave(2, dim=-1) for f in cos_sin)
    pad = dim - cos.shape[-1]
    if pad:
        cos = torch.cat([cos.new_ones(*cos.shape[:-1], pad), cos], dim=-1)
        sin = torch.cat([sin.new_zeros(*sin.shape[:-1], pad), sin], dim=-1)
    return cos, sin


def ltx_tables_from_coords(grid: torch.Tensor, freqs: torch.Tensor, dim: int):
    """diffusers' fp32 tables from (grid, freqs): what the ``*_from_coords`` ops reproduce."""
    return ltx_tables_from_angles(ltx_angles_from_coords(grid, freqs), dim)


def ltx_tables_float64(grid: torch.Tensor, freqs: torch.Tensor, dim: int):
    """The same tables with cos/sin in float64 of the fp32 angles (the angles' fp32 roundings are
    part of the definition; only cos/sin are exact)."""
    angles = ltx_angles_from_coords(grid, freqs).double()
    return ltx_tables_from_angles(angles, dim)
