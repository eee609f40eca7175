"""Rotary position embeddings: Python API and fake (meta) implementations.

One launch rotates q and k. The forms follow the libraries they replace. A function has its op's
name, except the model-specific forms of a shared op (``ltx_rope`` and ``flux_rope`` call
``rope``) and the functions that keep the name of the
library function they replace (``apply_rotary_pos_emb`` calls ``hf_rope``, ``rotary_embedding``
calls ``rope_cached_``); each of those names its op in its docstring.

- ``apply_rotary_pos_emb``: transformers' function of the same name and signature. q ``[B, Hq, S, d]``
  and k ``[B, Hk, S, d]`` (often strided views of a fused QKV projection), cos/sin ``[B, S, R]`` in
  the model dtype, half rotation (NeoX), each op rounded to the model dtype.
- ``ltx_rope``: diffusers' LTX-Video ``apply_rotary_emb`` on q and k ``[B, S, H*d]`` with fp32
  cos/sin ``[B, S, H*d]``: interleaved pairs over the whole hidden, fp32 math, one rounding.
- ``ltx_rope_from_coords``: the LTX-Video form with cos/sin computed in the kernel from the token
  coordinates and frequencies ``LTXVideoRotaryPosEmbed``
  builds its tables from (``integration/transformer_kernels_integrations/diffusers_models/ltx.py: ltx_rope_coords`` computes them from the
  module's arguments): the same bits, without reading the fp32 tables (twice the bytes of a bf16 q).
- ``rotary_embedding``: vLLM's op of the same name and signature, in place: token positions index a
  ``cos_sin_cache`` ``[max_position, R]`` (R/2 cosines then R/2 sines per row), q ``[T, Hq*d]``,
  k ``[T, Hk*d]``, R <= d.
- ``flux_rope``: diffusers' Flux ``apply_rotary_emb`` (``use_real_unbind_dim=-1``) on q and k
  ``[B, S, H, d]`` with fp32 cos/sin ``[S, d]``: interleaved pairs per head, fp32 math.

Training: ``apply_rotary_pos_emb``, ``ltx_rope``, ``flux_rope`` and ``ltx_rope_from_coords`` have a
backward (the rotation by -theta: the forward kernels with the sines transposed, in the forward's
rounding). The tables, the coordinates and the frequencies get no gradient: the models build them
without grad; one that requires grad raises. The in-place inference forms ``apply_rotary_pos_emb_``
and ``rotary_embedding`` stay forward-only: where a backward would be needed they raise. The fused
q/k norm + RoPE ops are the next family's (``qk_norm_rope.py``).
"""

from typing import Tuple

import torch

from ._autograd import check_no_grad, dispatch, grad_rows, refuse_grad, register_backward
from ._fake import register_fake
from ._ops import ops

STYLES = ("neox", "interleaved")


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``apply_rotary_pos_emb``: ``q * cos + rotate_half(q) * sin`` (and k).

    q ``[B, Hq, S, d]`` and k ``[B, Hk, S, d]`` for ``unsqueeze_dim=1`` (``[B, S, H, d]`` for 2), any
    strides with the last dimension contiguous; cos/sin ``[B, S, R]`` (``R <= d``; channels ``>= R``
    pass through). Returns new tensors in q and k's layout. The layout is handled in the op itself:
    views made here in Python would cost a decode step more host time than the kernel takes.
    Op: ``hf_rope``."""
    return dispatch(_hf_rope, q, k, cos, sin, unsqueeze_dim)


def apply_rotary_pos_emb_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """In-place ``apply_rotary_pos_emb``: q and k are overwritten and returned. Op: ``hf_rope_``. Inference
    only (no backward): under grad mode, inputs that require grad are refused; train with
    ``apply_rotary_pos_emb``."""
    refuse_grad("apply_rotary_pos_emb_", "in-place form", q, k, cos, sin)
    dispatch(_hf_rope_, q, k, cos, sin, unsqueeze_dim)
    return q, k


def ltx_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """LTX-Video's rotation of q and k ``[B, S, C]`` (before the head split) with fp32 cos/sin
    ``[B, S, C]``. Pairs never straddle heads, so the whole hidden is rotated as one row; the
    identity channels LTX prepends when ``C % 6 != 0`` are in the tables (cos 1, sin 0).
    Op: ``rope`` (interleaved pairs, fp32 math)."""
    q_out, k_out = dispatch(_rope, q.unsqueeze(2), k.unsqueeze(2), cos, sin, "interleaved", True)
    return q_out.squeeze(2), k_out.squeeze(2)


def flux_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Flux's rotation of q and k ``[B, S, H, d]`` with fp32 cos/sin ``[S, d]`` (shared by every head).
    Op: ``rope`` (interleaved pairs, fp32 math)."""
    return dispatch(_rope, q, k, cos.unsqueeze(0), sin.unsqueeze(0), "interleaved", True)


def ltx_rope_from_coords(q: torch.Tensor, k: torch.Tensor, grid: torch.Tensor, freqs: torch.Tensor
                         ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``ltx_rope`` with cos/sin computed in the kernel instead of read from tables.

    For channel pair ``p`` (channels ``2p, 2p + 1``) of ``C = q.shape[-1]``, with ``P = (C % 6) // 2``
    identity pairs at the front (cos 1, sin 0) and ``a = p - P``::

        angle = freqs[a // 3] * (grid[b, s, a % 3] * 2 - 1)      # each op rounded in float32
        out   = round(x * cos(angle) + rotate(x) * sin(angle))   # fp32, one rounding to q's dtype

    which is ``LTXVideoRotaryPosEmbed``'s table entry for the same grid and freqs, so the result
    equals ``ltx_rope`` with that module's tables bit for bit.

    Parameters
    ----------
    q, k : torch.Tensor
        ``[B, S, C]`` (C even; any leading strides, e.g. views of a fused projection).
    grid : torch.Tensor
        ``[B or 1, S, 3]`` float32, any strides: each token's (frame, height, width) coordinate as
        the module scales it (before its ``* 2 - 1``).
    freqs : torch.Tensor
        ``[C // 6]`` float32, contiguous: the module's frequencies times pi / 2.

    Returns
    -------
    tuple of torch.Tensor
        New contiguous ``(q_out, k_out)``.
    """
    return dispatch(_ltx_rope_from_coords, q, k, grid, freqs)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, head_size: int,
                     cos_sin_cache: torch.Tensor, is_neox: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``rotary_embedding``, in place on query and key.

    positions ``[T]`` int64 (any order); query ``[T, Hq*head_size]`` or ``[T, Hq, head_size]``, key
    likewise (views of a fused QKV projection are fine); cos_sin_cache ``[max_position, R]`` with
    R/2 cosines then R/2 sines per row, in query's dtype (each op rounded, as vLLM computes) or
    float32 (one rounding). ``is_neox``: half rotation; else GPT-J's interleaved pairs. Channels
    ``>= R`` are left alone. A position outside ``[0, max_position)`` makes that token's rotated
    channels NaN. Returns ``(query, key)``. Op: ``rope_cached_``. Inference only (no backward): under
    grad mode, inputs that require grad are refused."""
    refuse_grad("rotary_embedding", "in-place form", query, key, cos_sin_cache)
    dispatch(_rope_cached_, positions, query, key, head_size, cos_sin_cache, "neox" if is_neox else "interleaved")
    return query, key


_rope = ops.rope.default
_rope_ = ops.rope_.default
_rope_cached_ = ops.rope_cached_.default
_hf_rope = ops.hf_rope.default
_hf_rope_ = ops.hf_rope_.default
_ltx_rope_from_coords = ops.ltx_rope_from_coords.default


@register_fake("rope")
def _(q, k, cos, sin, style, fp32_math):
    torch._check(style in STYLES, lambda: f"rope: style must be one of {STYLES}, got {style!r}")
    return q.new_empty(q.shape), k.new_empty(k.shape)


@register_fake("rope_")
def _(q, k, cos, sin, style, fp32_math):
    torch._check(style in STYLES, lambda: f"rope: style must be one of {STYLES}, got {style!r}")


def _check_unsqueeze_dim(q, k, unsqueeze_dim):
    torch._check(unsqueeze_dim in (1, 2),
                 lambda: f"apply_rotary_pos_emb: unsqueeze_dim must be 1 ([B, H, S, d]) or 2 ([B, S, H, d]), got {unsqueeze_dim}")
    torch._check(q.dim() == 4 and k.dim() == 4, lambda: "apply_rotary_pos_emb: q and k must be 4-D")


@register_fake("hf_rope")
def _(q, k, cos, sin, unsqueeze_dim):
    _check_unsqueeze_dim(q, k, unsqueeze_dim)

    def like(t):  # a new [B, S, H, d] tensor, seen in t's layout as the op returns it
        if unsqueeze_dim == 2:
            return t.new_empty(t.shape)
        return t.new_empty((t.shape[0], t.shape[2], t.shape[1], t.shape[3])).transpose(1, 2)

    return like(q), like(k)


@register_fake("hf_rope_")
def _(q, k, cos, sin, unsqueeze_dim):
    _check_unsqueeze_dim(q, k, unsqueeze_dim)


@register_fake("rope_cached_")
def _(positions, query, key, head_size, cos_sin_cache, style):
    torch._check(style in STYLES, lambda: f"rope: style must be one of {STYLES}, got {style!r}")
    return None


@register_fake("ltx_rope_from_coords")
def _(q, k, grid, freqs):
    return q.new_empty(q.shape), k.new_empty(k.shape)


@register_fake("rope_backward")
def _(grad_q, grad_k, cos, sin, style, fp32_math):
    torch._check(style in STYLES, lambda: f"rope: style must be one of {STYLES}, got {style!r}")
    return grad_q.new_empty(grad_q.shape), grad_k.new_empty(grad_k.shape)


@register_fake("ltx_rope_from_coords_backward")
def _(grad_q, grad_k, grid, freqs):
    return grad_q.new_empty(grad_q.shape), grad_k.new_empty(grad_k.shape)


# ---- autograd: the out-of-place rotations' backward is the rotation by -theta (the in-place forms and
# the backward ops refuse grad: _autograd.refuse_the_rest) ----

_rope_backward = ops.rope_backward.default
_ltx_rope_from_coords_backward = ops.ltx_rope_from_coords_backward.default


def _setup_rope(ctx, inputs, output):
    q, k, cos, sin, ctx.style, ctx.fp32_math = inputs
    check_no_grad("rope", cos=cos, sin=sin)
    ctx.save_for_backward(cos, sin)


def _rope_backward_fn(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    dq, dk = _rope_backward(grad_rows(grad_q), grad_rows(grad_k), cos, sin, ctx.style, ctx.fp32_math)
    return dq, dk, None, None, None, None


def _setup_hf_rope(ctx, inputs, output):
    q, k, cos, sin, ctx.unsqueeze_dim = inputs
    check_no_grad("apply_rotary_pos_emb", cos=cos, sin=sin)
    ctx.save_for_backward(cos, sin)


def _hf_rope_backward_fn(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    # The kernels' [B, S, H, d] view of transformers' [B, H, S, d] (unsqueeze_dim 1), and back.
    as_bshd = (lambda t: t.transpose(1, 2)) if ctx.unsqueeze_dim == 1 else (lambda t: t)
    dq, dk = _rope_backward(as_bshd(grad_rows(grad_q)), as_bshd(grad_rows(grad_k)), cos, sin,
                            "neox", False)
    return as_bshd(dq), as_bshd(dk), None, None, None


def _setup_ltx_rope_from_coords(ctx, inputs, output):
    q, k, grid, freqs = inputs
    check_no_grad("ltx_rope_from_coords", grid=grid, freqs=freqs)
    ctx.save_for_backward(grid, freqs)


def _ltx_rope_from_coords_backward_fn(ctx, grad_q, grad_k):
    grid, freqs = ctx.saved_tensors
    dq, dk = _ltx_rope_from_coords_backward(grad_rows(grad_q), grad_rows(grad_k), grid, freqs)
    return dq, dk, None, None


register_backward("rope", _rope_backward_fn, _setup_rope)
register_backward("hf_rope", _hf_rope_backward_fn, _setup_hf_rope)
register_backward("ltx_rope_from_coords", _ltx_rope_from_coords_backward_fn, _setup_ltx_rope_from_coords)
