"""Activation ops: Python API and fake (meta) implementations.

All compute in fp32 with ATen's formulas and round as the eager code does: ``activation(x)`` once, the
gated units ``activation(a) * b`` twice (the activation's result, then the product), like
``F.silu(gate) * up`` in transformers' MLPs and ``h * F.gelu(gate)`` in diffusers' GEGLU. Inputs:
CUDA float32/float16/bfloat16, last dimension contiguous, leading dimensions any strides.

Ops: ``act_mul`` is the function of that name. ``silu`` and ``gelu`` keep
``torch.nn.functional``'s names and call the ``activation`` op; ``silu_and_mul``,
``gelu_and_mul``, ``gelu_tanh_and_mul`` (vLLM's and kernels-community's names) and ``geglu``
(diffusers') call the ``act_and_mul`` op.

Training: the functional forms have a backward (``activation_backward``, ``act_and_mul_backward``,
``act_mul_backward``: the activation recomputed from the saved input, eager autograd's rounding),
so they work in eager and under ``torch.compile``. The ``out=`` forms are forward-only and refuse
inputs that require grad under grad mode.
"""

from typing import Optional

import torch

from ._autograd import dispatch, grad_rows, refuse_grad, register_backward
from ._fake import register_fake
from ._ops import ops

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def _gelu_name(approximate: str) -> str:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return "gelu" if approximate == "none" else "gelu_tanh"


def _activation(x: torch.Tensor, activation: str, out: Optional[torch.Tensor]) -> torch.Tensor:
    if out is None:
        return dispatch(_activation_op, x, activation)
    refuse_grad("activation", "out= form", x)
    _activation_out_op(out, x, activation)
    return out


def silu(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x * sigmoid(x)``, as ``F.silu``. Op: ``activation``."""
    return _activation(x, "silu", out)


def gelu(x: torch.Tensor, approximate: str = "none", out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.gelu(x, approximate)``: exact (erf) for ``"none"``, the tanh form for ``"tanh"``.
    Op: ``activation``."""
    return _activation(x, _gelu_name(approximate), out)


def _act_and_mul(x: torch.Tensor, activation: str, act_first: bool, out: Optional[torch.Tensor]) -> torch.Tensor:
    if out is None:
        return dispatch(_act_and_mul_op, x, activation, act_first)
    refuse_grad("act_and_mul", "out= form", x)
    _act_and_mul_out_op(out, x, activation, act_first)
    return out


def silu_and_mul(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``silu(x[..., :H]) * x[..., H:]`` for ``x`` of shape ``[..., 2H]`` (vLLM / kernels-community).
    Op: ``act_and_mul``."""
    return _act_and_mul(x, "silu", True, out)


def gelu_and_mul(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``gelu(x[..., :H]) * x[..., H:]`` (exact GELU) for ``x`` of shape ``[..., 2H]``. Op: ``act_and_mul``."""
    return _act_and_mul(x, "gelu", True, out)


def gelu_tanh_and_mul(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``gelu_tanh(x[..., :H]) * x[..., H:]`` for ``x`` of shape ``[..., 2H]``. Op: ``act_and_mul``."""
    return _act_and_mul(x, "gelu_tanh", True, out)


def geglu(x: torch.Tensor, approximate: str = "none", out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """diffusers' ``GEGLU`` on its projection ``[..., 2H]``: ``h, gate = x.chunk(2, -1)``,
    ``h * gelu(gate)``; the gate is the second half (SDXL's transformer blocks). Op: ``act_and_mul``."""
    return _act_and_mul(x, _gelu_name(approximate), False, out)


def act_mul(gate: torch.Tensor, up: torch.Tensor, activation: str = "silu",
            out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``activation(gate) * up`` on two tensors, as transformers' ``LlamaMLP`` computes
    ``act_fn(gate_proj(x)) * up_proj(x)``. ``activation``: ``"silu"``, ``"gelu"`` or ``"gelu_tanh"``."""
    if out is None:
        return dispatch(_act_mul_op, gate, up, activation)
    refuse_grad("act_mul", "out= form", gate, up)
    _act_mul_out_op(out, gate, up, activation)
    return out


_activation_op = ops.activation.default
_activation_out_op = ops.activation_out.default
_act_and_mul_op = ops.act_and_mul.default
_act_and_mul_out_op = ops.act_and_mul_out.default
_act_mul_op = ops.act_mul.default
_act_mul_out_op = ops.act_mul_out.default


# ---- fake (meta) implementations ----

def _check_act(op: str, activation: str) -> None:
    torch._check(activation in ACTIVATIONS, lambda: f"{op}: activation must be one of {ACTIVATIONS}, got {activation!r}")


def _half_shape(x: torch.Tensor):
    torch._check(x.shape[-1] % 2 == 0, lambda: f"act_and_mul: x's last dimension must be even, got {x.shape[-1]}")
    return (*x.shape[:-1], x.shape[-1] // 2)


def _check_out(op: str, out: torch.Tensor, shape, dtype: torch.dtype) -> None:
    torch._check(tuple(out.shape) == tuple(shape), lambda: f"{op}: out must have shape {tuple(shape)}, got {tuple(out.shape)}")
    torch._check(out.dtype == dtype, lambda: f"{op}: out must have dtype {dtype}, got {out.dtype}")


@register_fake("activation")
def _(x, activation):
    _check_act("activation", activation)
    return x.new_empty(x.shape)


@register_fake("activation_out")
def _(out, x, activation):
    _check_act("activation", activation)
    _check_out("activation", out, x.shape, x.dtype)


@register_fake("act_and_mul")
def _(x, activation, act_first):
    _check_act("act_and_mul", activation)
    return x.new_empty(_half_shape(x))


@register_fake("act_and_mul_out")
def _(out, x, activation, act_first):
    _check_act("act_and_mul", activation)
    _check_out("act_and_mul", out, _half_shape(x), x.dtype)


@register_fake("act_mul")
def _(gate, up, activation):
    _check_act("act_mul", activation)
    return gate.new_empty(gate.shape)


@register_fake("act_mul_out")
def _(out, gate, up, activation):
    _check_act("act_mul", activation)
    _check_out("act_mul", out, gate.shape, gate.dtype)


@register_fake("activation_backward")
def _(grad, x, activation):
    _check_act("activation_backward", activation)
    return x.new_empty(x.shape)


@register_fake("act_and_mul_backward")
def _(grad, x, activation, act_first):
    _check_act("act_and_mul_backward", activation)
    torch._check(tuple(grad.shape) == tuple(_half_shape(x)),
                 lambda: f"act_and_mul_backward: grad must have the output's shape {_half_shape(x)}, got {tuple(grad.shape)}")
    return x.new_empty(x.shape)


@register_fake("act_mul_backward")
def _(grad, gate, up, activation):
    _check_act("act_mul_backward", activation)
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


# ---- autograd: each functional op's backward is its *_backward op (the out= forms and the backward
# ops refuse grad: _autograd.refuse_the_rest) ----

_activation_backward_op = ops.activation_backward.default
_act_and_mul_backward_op = ops.act_and_mul_backward.default
_act_mul_backward_op = ops.act_mul_backward.default


def _setup_activation(ctx, inputs, output):
    x, ctx.activation = inputs
    ctx.save_for_backward(x)


def _setup_act_and_mul(ctx, inputs, output):
    x, ctx.activation, ctx.act_first = inputs
    ctx.save_for_backward(x)


def _setup_act_mul(ctx, inputs, output):
    gate, up, ctx.activation = inputs
    ctx.save_for_backward(gate, up)


def _activation_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return _activation_backward_op(grad_rows(grad), x, ctx.activation), None


def _act_and_mul_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return _act_and_mul_backward_op(grad_rows(grad), x, ctx.activation, ctx.act_first), None, None


def _act_mul_backward(ctx, grad):
    gate, up = ctx.saved_tensors
    grad_gate, grad_up = _act_mul_backward_op(grad_rows(grad), gate, up, ctx.activation)
    return grad_gate, grad_up, None


register_backward("activation", _activation_backward, _setup_activation)
register_backward("act_and_mul", _act_and_mul_backward, _setup_act_and_mul)
register_backward("act_mul", _act_mul_backward, _setup_act_mul)
