"""The fused q/k norm + RoPE family: Python API, fake (meta) implementations and autograd.

The attention's q/k RMSNorms and the rotation of ``rope.py`` in one pass, q and k in one launch:

- ``ltx_qk_norm_rope`` / ``qk_norm_rope``: the attention's q/k ``torch.nn.RMSNorm`` and diffusers'
  interleaved rotation: across all heads for LTX-Video, per head for Flux (op ``qk_norm_rope``).
- ``ltx_qk_norm_rope_from_coords``: the LTX-Video form with cos/sin computed in the kernel from the
  token coordinates and frequencies ``LTXVideoRotaryPosEmbed`` builds its tables from (as
  ``rope.ltx_rope_from_coords`` computes them).
- ``hf_qk_norm_rope``: transformers' Qwen3 attention from the projections to the rotated q and k:
  ``q_norm``/``k_norm`` (``Qwen3RMSNorm`` per head) and ``apply_rotary_pos_emb`` in one pass, with
  transformers' rounding (each op rounded to the model dtype).

Training: each has a backward (q, k and the two norm weights: the inverse rotation, then the
RMSNorm backward per row, statistics recomputed from q and k). The tables, the coordinates and the
frequencies get no gradient: the models build them without grad; one that requires grad raises.
``hf_qk_norm_rope(out=...)`` stays forward-only: where a backward would be needed it raises.
"""

from typing import Optional, Tuple

import torch

from ._autograd import dispatch, grad_or_zeros, grad_rows, refuse_grad
from ._fake import register_fake
from ._ops import add_op_namespace_prefix, ops


def ltx_qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                     cos: torch.Tensor, sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """LTX-Video's ``attn.norm_q(q)``, ``attn.norm_k(k)`` (``torch.nn.RMSNorm`` over all heads) and
    ``apply_rotary_emb`` in one pass. q, k ``[B, S, C]``; weights ``[C]``; fp32 cos/sin ``[B, S, C]``.
    Returns new tensors. Op: ``qk_norm_rope`` (the whole hidden as one head)."""
    q_out, k_out = dispatch(_qk_norm_rope, q.unsqueeze(2), k.unsqueeze(2), q_weight, k_weight, eps, cos, sin)
    return q_out.squeeze(2), k_out.squeeze(2)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 cos: torch.Tensor, sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Flux's per-head ``norm_q``/``norm_k`` (``torch.nn.RMSNorm`` over d) and ``apply_rotary_emb`` in
    one pass. q, k ``[B, S, H, d]``; weights ``[d]``; fp32 cos/sin ``[S, d]``. Returns new tensors."""
    return dispatch(_qk_norm_rope, q, k, q_weight, k_weight, eps, cos.unsqueeze(0), sin.unsqueeze(0))


def hf_qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                    cos: torch.Tensor, sin: torch.Tensor,
                    out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """transformers' Qwen3 attention (also Qwen3-MoE) from the projections to the rotated q and k:
    ``q_norm(q)``, ``k_norm(k)`` (``Qwen3RMSNorm`` over each head) then ``apply_rotary_pos_emb``, q
    and k in one launch. The eager code's roundings are kept (``round`` rounds to q's dtype)::

        n   = round(weight * round(x * rsqrt(mean(x**2) + eps)))
        out = round(round(n * cos) + round(rotate_half(n) * sin))

    so the result equals eager bit for bit except where the fp32 sum of squares, added in another
    order, lands on the other side of a rounding.

    Parameters
    ----------
    q, k : torch.Tensor
        ``[B, S, Hq, d]`` and ``[B, S, Hk, d]``: the projections' ``view(*input_shape, -1, head_dim)``,
        before the transpose (any leading strides: views of one fused QKV projection are fine).
    q_weight, k_weight : torch.Tensor
        ``[d]``, q's dtype (the norms' weights).
    eps : float
        The norms' ``variance_epsilon``.
    cos, sin : torch.Tensor
        ``[B or 1, S, d]`` in q's dtype: the model's ``position_embeddings`` (NeoX layout, cos[..., i]
        == cos[..., i + d/2]); leading dimensions may have any strides.
    out : tuple of torch.Tensor, optional
        ``(q_out, k_out)`` of q's and k's shapes and dtype (leading strides free; no overlap with an
        input); new contiguous tensors are allocated when not given.

    Returns
    -------
    tuple of torch.Tensor
        ``(q_out, k_out)`` as ``[B, S, H, d]``; ``.transpose(1, 2)`` gives the ``[B, H, S, d]`` the
        attention takes, as in eager.
    """
    if out is None:
        return dispatch(_hf_qk_norm_rope, q, k, q_weight, k_weight, eps, cos, sin)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"hf_qk_norm_rope: out must be a (q_out, k_out) pair of tensors, got {type(out).__name__}")
    refuse_grad("hf_qk_norm_rope", "out= form", q, k, q_weight, k_weight, cos, sin)
    _hf_qk_norm_rope_out(out[0], out[1], q, k, q_weight, k_weight, eps, cos, sin)
    return out[0], out[1]


def ltx_qk_norm_rope_from_coords(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                                 eps: float, grid: torch.Tensor, freqs: torch.Tensor
                                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``ltx_qk_norm_rope`` (``norm_q``, ``norm_k`` and LTX's rotation in one pass) with cos/sin computed
    in the kernel from ``grid`` and ``freqs`` as ``ltx_rope_from_coords`` computes them: the
    same bits as ``ltx_qk_norm_rope`` with ``LTXVideoRotaryPosEmbed``'s tables.

    Parameters
    ----------
    q, k : torch.Tensor
        ``[B, S, C]`` (C even; any leading strides).
    q_weight, k_weight : torch.Tensor
        ``[C]``, q's dtype or float32 (both the same): the ``torch.nn.RMSNorm`` weights.
    eps : float
        The norms' eps (``torch.finfo(torch.float32).eps`` where the module's is None).
    grid, freqs : torch.Tensor
        As for ``ltx_rope_from_coords``.

    Returns
    -------
    tuple of torch.Tensor
        New contiguous ``(q_out, k_out)``.
    """
    return dispatch(_ltx_qk_norm_rope_from_coords, q, k, q_weight, k_weight, eps, grid, freqs)


_qk_norm_rope = ops.qk_norm_rope.default
_hf_qk_norm_rope = ops.hf_qk_norm_rope.default
_hf_qk_norm_rope_out = ops.hf_qk_norm_rope_out.default
_ltx_qk_norm_rope_from_coords = ops.ltx_qk_norm_rope_from_coords.default

# ---- fake (meta) implementations ----

@register_fake("qk_norm_rope")
def _(q, k, q_weight, k_weight, eps, cos, sin):
    return q.new_empty(q.shape), k.new_empty(k.shape)


@register_fake("hf_qk_norm_rope")
def _(q, k, q_weight, k_weight, eps, cos, sin):
    return q.new_empty(q.shape), k.new_empty(k.shape)


@register_fake("hf_qk_norm_rope_out")
def _(q_out, k_out, q, k, q_weight, k_weight, eps, cos, sin):
    for out, name, x in ((q_out, "q_out", q), (k_out, "k_out", k)):  # the checks the C++ op makes first
        torch._check(out.shape == x.shape,
                     lambda: f"hf_qk_norm_rope: {name} must have the shape {tuple(x.shape)}, got {tuple(out.shape)}")
        torch._check(out.dtype == q.dtype,
                     lambda: f"hf_qk_norm_rope: {name} must have dtype {q.dtype}, got {out.dtype}")


@register_fake("ltx_qk_norm_rope_from_coords")
def _(q, k, q_weight, k_weight, eps, grid, freqs):
    return q.new_empty(q.shape), k.new_empty(k.shape)


# ---- training: the fused q/k norm + RoPE backward ops (fake implementations) and autograd ----

_qk_norm_rope_backward = ops.qk_norm_rope_backward.default
_hf_qk_norm_rope_backward = ops.hf_qk_norm_rope_backward.default
_ltx_qk_norm_rope_from_coords_backward = ops.ltx_qk_norm_rope_from_coords_backward.default


def _qk_backward_fake(grad_q_out, grad_k_out, q, k, q_weight, k_weight, eps, cos_or_grid, sin_or_freqs, output_mask):
    def grad(asked, t):
        return t.new_empty(t.shape) if asked else q.new_empty((0,))

    return grad(output_mask[0], q), grad(output_mask[1], k), grad(output_mask[2], q_weight), grad(output_mask[3], k_weight)


for _name in ("qk_norm_rope_backward", "hf_qk_norm_rope_backward", "ltx_qk_norm_rope_from_coords_backward"):
    register_fake(_name)(_qk_backward_fake)


def _qk_norm_rope_setup(op: str, what: Tuple[str, str]):
    """setup_context of a fused q/k norm + RoPE op: saves the inputs; refuses a gradient for the
    tables (or coordinates), which the backward does not compute."""

    def setup(ctx, inputs, output):
        q, k, q_weight, k_weight, eps, a, b = inputs
        if ctx.needs_input_grad[5] or ctx.needs_input_grad[6]:
            raise RuntimeError(f"{op}: no gradient for {what[0]} and {what[1]} (the models build them without "
                               f"grad); detach them, or use the eager code")
        ctx.save_for_backward(q, k, q_weight, k_weight, a, b)
        ctx.eps = eps

    return setup


def _qk_norm_rope_bwd(backward_op):
    def backward(ctx, grad_q, grad_k):
        q, k, q_weight, k_weight, a, b = ctx.saved_tensors
        mask = list(ctx.needs_input_grad[:4])
        grad_q, grad_k = grad_or_zeros(grad_q, q, q.dtype), grad_or_zeros(grad_k, k, k.dtype)
        grads = backward_op(grad_rows(grad_q), grad_rows(grad_k), q, k, q_weight, k_weight, ctx.eps, a, b, mask)
        return (*(g if asked else None for g, asked in zip(grads, mask)), None, None, None)

    return backward


torch.library.register_autograd(add_op_namespace_prefix("qk_norm_rope"), _qk_norm_rope_bwd(_qk_norm_rope_backward),
                                setup_context=_qk_norm_rope_setup("qk_norm_rope", ("cos", "sin")))
torch.library.register_autograd(add_op_namespace_prefix("hf_qk_norm_rope"),
                                _qk_norm_rope_bwd(_hf_qk_norm_rope_backward),
                                setup_context=_qk_norm_rope_setup("hf_qk_norm_rope", ("cos", "sin")))
torch.library.register_autograd(add_op_namespace_prefix("ltx_qk_norm_rope_from_coords"),
                                _qk_norm_rope_bwd(_ltx_qk_norm_rope_from_coords_backward),
                                setup_context=_qk_norm_rope_setup("ltx_qk_norm_rope_from_coords", ("grid", "freqs")))
