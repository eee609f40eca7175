"""The norm family's eager CPU stand-ins (tests/eager_kernel.py gathers them): the eager code each op
reproduces, from reference/norms.py; the FP8 outputs are the op's output in x's dtype, then
quantize_fp8; the backward ops are autograd of that code in float32 (each gradient cast to its
input's dtype), what the kernels compute up to rounding."""

import torch.nn.functional as F

from eager_kernel import fp8_outputs, vjp
from reference.activations import eager_gated_add
from reference.norms import RMS_NORM_EAGER, diffusers_norm_modulate, ltx_gated_add_norm_modulate


def _gated_fp8(out, h):
    return (*fp8_outputs(out), h)


IMPLS = {
    "rms_norm": lambda x, w, eps, r: RMS_NORM_EAGER[r](x, w, eps),
    "layer_norm": lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps),
    "fused_add_rms_norm": lambda x, res, w, eps, r: (RMS_NORM_EAGER[r](x + res, w, eps), x + res),
    "norm_modulate": lambda x, sc, sh, w, b, eps, n: diffusers_norm_modulate(x, sc, sh, n, w, b, eps),
    "gated_add_norm_modulate": lambda x, y, g, sc, sh, w, b, eps, n: ltx_gated_add_norm_modulate(x, y, g, sc, sh, n, w,
                                                                                                 b, eps),
    "gated_add": lambda x, y, g: eager_gated_add(x, y, g),
    # the norms' FP8 outputs: the op's output in x's dtype, then quantize_fp8
    "rms_norm_fp8": lambda x, w, eps, r: fp8_outputs(RMS_NORM_EAGER[r](x, w, eps).to(x.dtype)),
    "fused_add_rms_norm_fp8": lambda x, res, w, eps, r: (*fp8_outputs(RMS_NORM_EAGER[r](x + res, w, eps).to(x.dtype)),
                                                         x + res),
    "layer_norm_fp8": lambda x, w, b, eps: fp8_outputs(F.layer_norm(x, (x.shape[-1],), w, b, eps)),
    "norm_modulate_fp8": lambda x, sc, sh, w, b, eps, n: fp8_outputs(diffusers_norm_modulate(x, sc, sh, n, w, b, eps)),
    "gated_add_norm_modulate_fp8": lambda x, y, g, sc, sh, w, b, eps, n: _gated_fp8(
        *ltx_gated_add_norm_modulate(x, y, g, sc, sh, n, w, b, eps)),
}


def _norm_modulate_eager(norm, eps):
    return lambda x, sc, sh, w, b: diffusers_norm_modulate(x, sc, sh, norm, w, b, eps)


def _gated_add_norm_modulate_backward(grad_out, grad_h, h, y, gate, scale, shift, w, b, eps, norm, mask):
    # h = x + gate * y (x + y without a gate): x from h, so that the same code differentiates
    x = h.float() - (y.float() if gate is None else gate.float() * y.float())
    forward = (lambda x_, y_, g_, sc, sh, w_, b_:
               ltx_gated_add_norm_modulate(x_, y_, g_, sc, sh, norm, w_, b_, eps))
    want_dx = mask[0] or (mask[1] and gate is None)
    wanted = [want_dx, mask[1] and gate is not None, *mask[2:]]
    dx, dy, *rest = vjp(forward, (x, y, gate, scale, shift, w, b), (grad_out, grad_h), wanted, h)
    return (dx.to(h.dtype) if want_dx else dx, dy, *rest)


BACKWARD = {
    "rms_norm_backward": lambda g, x, w, eps, mask: vjp(lambda x_, w_: F.rms_norm(x_, (x_.shape[-1],), w_, eps),
                                                        (x, w), (g,), mask, x),
    "fused_add_rms_norm_backward": lambda g, g_h, h, w, eps, mask: (lambda dh, dw: (
        dh if not mask[0] or g_h is None else (dh.float() + g_h.float()).to(h.dtype), dw))(
        *vjp(lambda h_, w_: F.rms_norm(h_, (h_.shape[-1],), w_, eps), (h, w), (g,), mask, h)),
    "layer_norm_backward": lambda g, x, w, b, eps, mask: vjp(
        lambda x_, w_, b_: F.layer_norm(x_, (x_.shape[-1],), w_, b_, eps), (x, w, b), (g,), mask, x),
    "norm_modulate_backward": lambda g, x, sc, sh, w, b, eps, norm, mask: vjp(
        _norm_modulate_eager(norm, eps), (x, sc, sh, w, b), (g,), mask, x),
    "gated_add_norm_modulate_backward": _gated_add_norm_modulate_backward,
    "gated_add_backward": lambda g, y, gate, mask: vjp(lambda y_, g_: g_ * y_, (y, gate), (g,), mask, g),
}
