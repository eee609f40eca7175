"""Backward references of the norm family and the fused q/k norm + RoPE, in float64.

Two kinds, as the rest of reference/: the float64 forwards whose torch autograd is the ground
truth of every backward (``*_float64``), and the closed forms the CUDA kernels compute
(``*_backward_float64``), checked against that autograd on CPU (tests/norm/test_norm_backward.py):
the recomputed statistics, the transposed rotation, the broadcast reductions.
"""

from typing import Optional

import torch

from .norms import float64_norm, rms_norm_float64
from .rope import rotary_float64


def norm_modulate_float64(x, scale, shift=None, norm: str = "rms", weight=None, bias=None, eps: float = 1e-6):
    """``norm(x) * (1 + scale) + shift`` in float64 (norm_modulate without its roundings)."""
    out = float64_norm(x, norm, weight, bias, eps) * (1 + scale.double())
    return out if shift is None else out + shift.double()


def gated_add_norm_modulate_float64(x, y, gate, scale, shift=None, norm: str = "rms", weight=None, bias=None,
                                    eps: float = 1e-6, h=None):
    """``h = x + gate * y`` (``x + y`` without a gate), then ``norm_modulate_float64(h)``, in float64.

    ``h``: the forward's rounded h, where the backward is to be evaluated (as the kernels do: they
    recompute the statistics from the h the forward wrote). Its value is used while the gradient
    still flows to x, y and gate as through the sum (rounding taken as the identity)."""
    h64 = x.double() + (y.double() if gate is None else gate.double() * y.double())
    if h is not None:
        h64 = h.double() + (h64 - h64.detach())
    return norm_modulate_float64(h64, scale, shift, norm, weight, bias, eps), h64  # the op's order: (out, h)


def qk_norm_rope_float64(x, weight, eps, cos, sin, style: str):
    """One of q, k: RMSNorm over the last dim, then the rotation (``"interleaved"``: LTX, Flux;
    ``"neox"``: Qwen3), in float64. x ``[..., L]``; cos, sin broadcast to it."""
    return rotary_float64(rms_norm_float64(x, weight, eps), cos, sin, style)


# ---- the closed forms the kernels compute ----

def _stats(h64, norm: str, eps: float):
    if norm == "rms":
        mean = torch.zeros_like(h64[..., :1])
        var = h64.pow(2).mean(-1, keepdim=True)
    else:
        mean = h64.mean(-1, keepdim=True)
        var = (h64 - mean).pow(2).mean(-1, keepdim=True)
    return mean, torch.rsqrt(var + eps)


def norm_input_grad_float64(dn, h, norm: str, weight=None, eps: float = 1e-6):
    """The gradient of the normalized input from the gradient dn of the norm's output n = xhat * w + b:
    ``rstd * (g - mean(g) - xhat * mean(g * xhat))``, g = dn * w (mean(g) dropped for RMSNorm);
    also returns xhat (for the parameter gradients)."""
    h64, dn64 = h.double(), dn.double()
    mean, rstd = _stats(h64, norm, eps)
    xhat = (h64 - mean) * rstd
    g = dn64 if weight is None else dn64 * weight.double()
    mean_g = 0 if norm == "rms" else g.mean(-1, keepdim=True)
    return rstd * (g - mean_g - xhat * (g * xhat).mean(-1, keepdim=True)), xhat


def _over_rows(t):
    return t.reshape(-1, t.shape[-1]).sum(0)


def norm_backward_float64(dout, h, norm: str, weight=None, bias=None, eps: float = 1e-6, scale=None, shift=None):
    """rms_norm / layer_norm / norm_modulate backward: (dh, dweight, dbias, dscale, dshift); the
    parameter gradients in their own shapes (broadcast ones summed over the broadcast dims)."""
    d64 = dout.double()
    dn = d64 if scale is None else d64 * (1 + scale.double())
    dh, xhat = norm_input_grad_float64(dn, h, norm, weight, eps)
    dweight = None if weight is None else _over_rows(dn * xhat)
    dbias = None if bias is None else _over_rows(dn)
    dscale = dshift = None
    if scale is not None:
        n = xhat * (1 if weight is None else weight.double()) + (0 if bias is None else bias.double())
        dscale = (d64 * n).sum_to_size(scale.shape)
        dshift = None if shift is None else d64.sum_to_size(shift.shape)
    return dh, dweight, dbias, dscale, dshift


def gated_add_backward_float64(dh, y, gate: Optional[torch.Tensor]):
    """``h = x + gate * y`` backward from dh: (dx, dy, dgate)."""
    dh64 = dh.double()
    if gate is None:
        return dh64, dh64, None
    return dh64, dh64 * gate.double(), (dh64 * y.double()).sum_to_size(gate.shape)


def rotate_back_float64(dout, cos, sin, style: str):
    """The transposed rotation: for each pair, dn1 = d1 c1 + d2 s2 and dn2 = d2 c2 - d1 s1 (c, s
    the tables at the pair's two elements; the rotation by -angle when they agree)."""
    d, c, s = dout.double(), cos.double().expand_as(dout), sin.double().expand_as(dout)
    if style == "neox":
        half = d.shape[-1] // 2
        d1, d2 = d[..., :half], d[..., half:]
        c1, c2, s1, s2 = c[..., :half], c[..., half:], s[..., :half], s[..., half:]
        return torch.cat((d1 * c1 + d2 * s2, d2 * c2 - d1 * s1), -1)
    d1, d2 = d[..., 0::2], d[..., 1::2]
    c1, c2, s1, s2 = c[..., 0::2], c[..., 1::2], s[..., 0::2], s[..., 1::2]
    return torch.stack((d1 * c1 + d2 * s2, d2 * c2 - d1 * s1), -1).flatten(-2)


def qk_norm_rope_backward_float64(dout, x, weight, eps, cos, sin, style: str):
    """One of q, k: (dx, dweight) of ``qk_norm_rope_float64``."""
    dn = rotate_back_float64(dout, cos, sin, style)
    dx, xhat = norm_input_grad_float64(dn, x, "rms", weight, eps)
    return dx, _over_rows(dn * xhat)
