"""GroupNorm ops (Stable Diffusion UNets and VAEs): Python API and fake (meta) implementations.

``x`` is ``[N, C, *spatial]`` (``[N, C]``, NCHW, NCDHW, ...), CUDA float32/float16/bfloat16, dense in
its channel and spatial dimensions either channels-first (``x.contiguous()``) or channels-last
(``x.contiguous(memory_format=torch.channels_last)``, NHWC/NDHWC); the batch stride is free and
nothing is copied. The output keeps x's layout (``F.group_norm`` on CUDA returns a contiguous
tensor for a channels-last input; the values are the same). ``weight``/``bias``: ``[C]`` in x's
dtype.

Numerics follow ATen's CUDA kernel: fp32 statistics (biased variance), ``eps`` cast to x's dtype
before it is added, the group's mean and rstd rounded to x's dtype as ATen stores them (torch up to
2.12; later torch keeps them fp32 and so does a build against it), the same per-element formula,
one rounding to x's dtype; ``activation="silu"`` then applies ``F.silu`` to that rounded result.
The statistics themselves are summed in another order than ATen's Welford loop, so an fp32 output
differs from ``F.group_norm`` in the last bits, and a 16-bit one only where the two fp32 means (or
rstds) round to different 16-bit values: rarely, but then across the group.

Training: the functional forms have a backward (``group_norm_backward``: ATen's formulas in fp32, the
statistics and, with ``activation="silu"``, the norm's rounded output recomputed from x), which gives
the gradients of x, ``bias_nc``, ``weight`` and ``bias``. The ``out=`` forms have none: under grad
mode with an input that requires grad they raise rather than drop the gradient.
"""

from typing import Optional

import torch

from ._autograd import dispatch, refuse_grad, register_backward
from ._fake import register_fake
from ._ops import ops

ACTIVATIONS = ("none", "silu")


def _activation_name(activation: Optional[str]) -> str:
    return "none" if activation is None else activation


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    activation: Optional[str] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``F.group_norm(x, num_groups, weight, bias, eps)``, optionally followed by ``F.silu``.

    Parameters
    ----------
    x : torch.Tensor
        ``[N, C, *spatial]``, channels-first or channels-last (see the module docstring).
    num_groups : int
        Groups the C channels are split into (C must be divisible by it).
    weight, bias : torch.Tensor, optional
        ``[C]``, x's dtype.
    eps : float
        Added to the variance (after a cast to x's dtype, as ATen does).
    activation : str, optional
        ``None`` (or ``"none"``) or ``"silu"``: ``F.silu(F.group_norm(...))`` in one pass, as
        diffusers' ``ResnetBlock2D`` and VAE blocks apply them.
    out : torch.Tensor, optional
        Output with x's shape, dtype and layout (any batch stride), not overlapping an input.

    Returns
    -------
    torch.Tensor
        ``out``, in x's layout.
    """
    if out is None:
        return dispatch(_group_norm, x, num_groups, weight, bias, eps, _activation_name(activation))
    refuse_grad("group_norm", "out= form", x, weight, bias)
    dispatch(_group_norm_out, out, x, num_groups, weight, bias, eps, _activation_name(activation))
    return out


def add_group_norm(
    x: torch.Tensor,
    bias_nc: torch.Tensor,
    num_groups: int,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    activation: Optional[str] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``group_norm(x + bias_nc[:, :, None, ...], ...)`` in one pass: the time-embedding add of
    diffusers' ``ResnetBlock2D`` fused into its second norm (and SiLU).

    ``bias_nc`` is ``[N or 1, C]`` or ``[N or 1, C, 1, ...]`` in x's dtype with unit channel
    stride. The sum is rounded to x's dtype before the statistics, as the eager add rounds it, and
    is not returned (the block uses it only through the norm).
    """
    if out is None:
        return dispatch(_add_group_norm, x, bias_nc, num_groups, weight, bias, eps, _activation_name(activation))
    refuse_grad("add_group_norm", "out= form", x, bias_nc, weight, bias)
    dispatch(_add_group_norm_out, out, x, bias_nc, num_groups, weight, bias, eps, _activation_name(activation))
    return out


_group_norm = ops.group_norm.default
_group_norm_out = ops.group_norm_out.default
_add_group_norm = ops.add_group_norm.default
_add_group_norm_out = ops.add_group_norm_out.default
_group_norm_backward = ops.group_norm_backward.default


# ---- fake (meta) implementations: shapes, dtypes and strides for torch.compile ----


def _dense_in_order(t: torch.Tensor, order) -> bool:
    if t.numel() == 0:  # no elements: dense in any order, whatever the strides (as the binding decides)
        return True
    expected = 1
    for d in order:
        if t.shape[d] != 1 and t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


def _channels_first_order(dim: int):
    return range(dim - 1, 0, -1)


def _channels_last_order(dim: int):
    return [1, *range(dim - 1, 1, -1)]


def is_supported_layout(x: torch.Tensor) -> bool:
    """True when the kernels take x as it is: dense channels-first or channels-last (any batch stride)."""
    return x.dim() >= 2 and (_dense_in_order(x, _channels_first_order(x.dim()))
                             or _dense_in_order(x, _channels_last_order(x.dim())))


def _is_channels_last(x: torch.Tensor) -> bool:
    """The layout the kernels take x in (and give the output): channels-first when x is dense that
    way (also when it is dense both ways), channels-last otherwise."""
    return not _dense_in_order(x, _channels_first_order(x.dim())) and _dense_in_order(x, _channels_last_order(x.dim()))


def _check(op: str, x: torch.Tensor, num_groups: int, activation: str) -> None:
    torch._check(activation in ACTIVATIONS, lambda: f"{op}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    torch._check(x.dim() >= 2, lambda: f"{op}: x must be [N, C, *spatial], got shape {tuple(x.shape)}")
    torch._check(num_groups > 0 and x.shape[1] % num_groups == 0,
                 lambda: f"{op}: x's channel count ({x.shape[1]}) must be divisible by num_groups ({num_groups})")


def _empty_like_layout(x: torch.Tensor) -> torch.Tensor:
    if _is_channels_last(x):
        return x.new_empty((x.shape[0], *x.shape[2:], x.shape[1])).movedim(-1, 1)
    return x.new_empty(x.shape)


def _check_out(op: str, out: torch.Tensor, x: torch.Tensor) -> None:
    torch._check(out.shape == x.shape, lambda: f"{op}: out must have the shape of x {tuple(x.shape)}, got {tuple(out.shape)}")
    torch._check(out.dtype == x.dtype, lambda: f"{op}: out must have dtype {x.dtype}, got {out.dtype}")


@register_fake("group_norm")
def _(x, num_groups, weight, bias, eps, activation):
    _check("group_norm", x, num_groups, activation)
    return _empty_like_layout(x)


@register_fake("group_norm_out")
def _(out, x, num_groups, weight, bias, eps, activation):
    _check("group_norm", x, num_groups, activation)
    _check_out("group_norm", out, x)


@register_fake("add_group_norm")
def _(x, bias_nc, num_groups, weight, bias, eps, activation):
    _check("add_group_norm", x, num_groups, activation)
    return _empty_like_layout(x)


@register_fake("add_group_norm_out")
def _(out, x, bias_nc, num_groups, weight, bias, eps, activation):
    _check("add_group_norm", x, num_groups, activation)
    _check_out("add_group_norm", out, x)


@register_fake("group_norm_backward")
def _(grad_out, x, bias_nc, num_groups, weight, bias, eps, activation, output_mask):
    _check("group_norm_backward", x, num_groups, activation)
    torch._check(grad_out.shape == x.shape,
                 lambda: f"group_norm_backward: grad_out must have the shape of x {tuple(x.shape)}, got {tuple(grad_out.shape)}")
    none = x.new_empty((0,))
    return (_empty_like_layout(x) if output_mask[0] else none,
            x.new_empty(bias_nc.shape) if output_mask[1] and bias_nc is not None else none,
            x.new_empty((x.shape[1],)) if output_mask[2] and weight is not None else none,
            x.new_empty((x.shape[1],)) if output_mask[3] and bias is not None else none)


# ---- autograd: both functional forms' backward is group_norm_backward ----


def _in_layout_of(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The incoming gradient in x's layout, which the backward op reads it in: autograd may hand a
    channels-first gradient for a channels-last x (a copy then, as aten's own backward makes one).
    Channels innermost for any rank ([N, C, L] too, which torch's memory formats do not name)."""
    if _is_channels_last(x):
        if _dense_in_order(grad, _channels_last_order(grad.dim())):
            return grad
        return grad.movedim(1, -1).contiguous().movedim(-1, 1)
    return grad if _dense_in_order(grad, _channels_first_order(grad.dim())) else grad.contiguous()


def _setup_group_norm(ctx, inputs, output):
    x, ctx.num_groups, weight, bias, ctx.eps, ctx.activation = inputs
    ctx.save_for_backward(x, weight, bias)


def _group_norm_bwd(ctx, grad):
    x, weight, bias = ctx.saved_tensors
    need_x, _, need_w, need_b = ctx.needs_input_grad[:4]
    if grad is None:
        return (None,) * 6
    dx, _, dw, db = _group_norm_backward(_in_layout_of(grad, x), x, None, ctx.num_groups, weight, bias, ctx.eps,
                                         ctx.activation, [need_x, False, need_w, need_b])
    return dx if need_x else None, None, dw if need_w else None, db if need_b else None, None, None


def _setup_add_group_norm(ctx, inputs, output):
    x, bias_nc, ctx.num_groups, weight, bias, ctx.eps, ctx.activation = inputs
    ctx.save_for_backward(x, bias_nc, weight, bias)


def _add_group_norm_bwd(ctx, grad):
    x, bias_nc, weight, bias = ctx.saved_tensors
    need_x, need_bias_nc, _, need_w, need_b = ctx.needs_input_grad[:5]
    if grad is None:
        return (None,) * 7
    dx, dbias_nc, dw, db = _group_norm_backward(_in_layout_of(grad, x), x, bias_nc, ctx.num_groups, weight, bias,
                                                ctx.eps, ctx.activation, [need_x, need_bias_nc, need_w, need_b])
    return (dx if need_x else None, dbias_nc if need_bias_nc else None, None, dw if need_w else None,
            db if need_b else None, None, None)


register_backward("group_norm", _group_norm_bwd, _setup_group_norm)
register_backward("add_group_norm", _add_group_norm_bwd, _setup_add_group_norm)
