"""The qk_norm_rope family's eager CPU stand-ins (tests/eager_kernel.py gathers them): diffusers' and
transformers' q/k RMSNorm then RoPE (the rotation is the rope family's, the composition its kernels
declare); the backward ops are autograd of that code in float32 (each gradient cast to its input's
dtype), what the kernels compute up to rounding."""

import torch.nn.functional as F

from eager_kernel import vjp
from families import family_module
from reference.rope import diffusers_qk_norm_rope, hf_qk_norm_rope, ltx_tables_from_coords

rope_rows = family_module("rope", "eager").rope_rows


def _qk_norm(x, w, eps):  # torch.nn.RMSNorm, as diffusers' attention norms
    return F.rms_norm(x, (x.shape[-1],), w, eps)


IMPLS = {
    "qk_norm_rope": lambda q, k, qw, kw, eps, c, s: (rope_rows(_qk_norm(q, qw, eps), c, s, "interleaved", True),
                                                    rope_rows(_qk_norm(k, kw, eps), c, s, "interleaved", True)),
    "hf_qk_norm_rope": lambda q, k, qw, kw, eps, c, s: hf_qk_norm_rope(q, k, qw, kw, eps, c, s),
    "ltx_qk_norm_rope_from_coords": lambda q, k, qw, kw, eps, grid, freqs: diffusers_qk_norm_rope(
        q, k, qw, kw, eps, *ltx_tables_from_coords(grid, freqs, q.shape[-1])),
}


def _qk_backward(forward):
    def impl(grad_q, grad_k, q, k, qw, kw, eps, a, b, mask):
        return vjp(lambda q_, k_, qw_, kw_: forward(q_, k_, qw_, kw_, eps, a.float(), b.float()), (q, k, qw, kw),
                   (grad_q, grad_k), mask, q)

    return impl


BACKWARD = {
    "qk_norm_rope_backward": _qk_backward(IMPLS["qk_norm_rope"]),
    "hf_qk_norm_rope_backward": _qk_backward(IMPLS["hf_qk_norm_rope"]),
    "ltx_qk_norm_rope_from_coords_backward": _qk_backward(
        lambda q, k, qw, kw, eps, grid, freqs: IMPLS["ltx_qk_norm_rope_from_coords"](q, k, qw, kw, eps, grid, freqs)),
}
