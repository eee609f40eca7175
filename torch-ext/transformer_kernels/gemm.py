"""GEMMs with a fused epilogue: Python API, fake (meta) implementations and autograd.

``linear_gelu(x, weight, bias)`` is ``F.gelu(F.linear(x, weight, bias), approximate="tanh")`` (the
input projection of the FFNs of LTX-Video, Flux and SD3: diffusers' ``GELU(approximate="tanh")``)
as one cuBLASLt matmul whose epilogue adds the bias and applies the GELU to the fp32 accumulator,
so the ``[tokens, 4 * hidden]`` pre-activation is never written and read back (float16/bfloat16;
float32 takes F.linear and our gelu_tanh kernel). The result is rounded once where eager rounds
twice (the linear's output, then the GELU's): not bit-equal to eager, and closer to the exact value.
"""

import math
from typing import Optional

import torch

from ._autograd import dispatch
from ._fake import register_fake
from ._ops import add_op_namespace_prefix, ops


def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``gelu_tanh(x @ weight.T + bias)`` in one cuBLASLt matmul with the GELU-bias epilogue.

    For float16/bfloat16, cuBLASLt computes the bias and the tanh-form GELU on the fp32 accumulator
    and rounds once to x's dtype. float32, and where cuBLASLt has no epilogue algorithm for the
    layout or alignment on this GPU (``linear_gelu_fused`` says which), take the separate path:
    ``F.linear`` (which follows ``torch.backends.cuda.matmul.allow_tf32``), then our ``gelu_tanh``
    kernel, rounding as eager does (in float32 cuBLASLt's epilogue GELU is less accurate than eager's).
    Gradients flow to x, weight and bias (the backward recomputes the pre-activation).

    Parameters
    ----------
    x : torch.Tensor
        ``[..., in_features]``, CUDA float32/float16/bfloat16; the epilogue takes rows with a
        contiguous last dimension whose leading dimensions merge into one stride (other views take
        the separate path, without a copy of x).
    weight : torch.Tensor
        ``[out_features, in_features]`` (``nn.Linear.weight``), x's dtype.
    bias : torch.Tensor, optional
        ``[out_features]``, x's dtype.
    out : torch.Tensor, optional
        ``[..., out_features]`` in x's dtype, last dimension contiguous, no overlap with an input;
        allocated when not given.

    Returns
    -------
    torch.Tensor
        ``out``.
    """
    if out is None:
        return _linear_gelu(x, weight, bias)
    _linear_gelu_out(out, x, weight, bias)
    return out


def linear_gelu_fused(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> bool:
    """True when ``linear_gelu(x, weight, bias)`` runs as one cuBLASLt matmul with the GELU epilogue
    on this GPU (asks cuBLASLt's heuristic; launches nothing); False where it takes ``F.linear``
    and the separate activation kernel (always for float32). A host-side query for tests and benchmarks."""
    return _linear_gelu_fused(x, weight, bias)


def linear_fp8(x: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               bias: Optional[torch.Tensor] = None, out_dtype: torch.dtype = torch.bfloat16,
               activation: str = "none") -> torch.Tensor:
    """The FP8 linear layer: ``act((x * x_scale) @ (weight * weight_scale).T + bias)`` as one cuBLASLt
    FP8 (e4m3) matmul. The scales multiply the fp32 accumulator (cuBLASLt's outer-vector scaling:
    one per row of x, one per output channel), then the bias and the optional tanh-GELU are applied
    (its epilogue) and the result is rounded once to ``out_dtype``. Needs a GPU with FP8 tensor
    cores (compute capability 8.9 or later); no gradient.

    Parameters
    ----------
    x, x_scale : torch.Tensor
        ``[..., in_features]`` ``torch.float8_e4m3fn`` and its ``[..., 1]`` float32 scales, as
        ``quantize_fp8(x)`` returns them; rows one stride apart.
    weight, weight_scale : torch.Tensor
        ``[out_features, in_features]`` ``torch.float8_e4m3fn`` and ``[out_features]`` (or
        ``[out_features, 1]``) float32 scales: ``quantize_fp8(linear.weight)`` quantizes each output
        channel (each row of the weight). in_features and out_features multiples of 16.
    bias : torch.Tensor, optional
        ``[out_features]`` in ``out_dtype``.
    out_dtype : torch.dtype
        ``torch.bfloat16`` or ``torch.float16``.
    activation : str
        ``"none"`` or ``"gelu_tanh"``.
    """
    return dispatch(_linear_fp8, x, x_scale, weight, weight_scale, bias, out_dtype, activation)


def decode_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: Optional[torch.Tensor] = None,
                  bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The linear layer of a decode step: ``x @ (weight * weight_scale).T + bias`` for at most 8 rows
    (tokens), streaming the weight once (a GEMM tiled for large M reads it below the memory's rate).
    Accumulates in fp32 and rounds once to x's dtype; no gradient.

    Parameters
    ----------
    x : torch.Tensor
        ``[..., in_features]``, at most 8 rows, float32/float16/bfloat16; rows one stride apart, 16-byte
        aligned.
    weight : torch.Tensor
        ``[out_features, in_features]`` contiguous, x's dtype, or ``torch.float8_e4m3fn`` codes
        (weight-only FP8: ``quantize_fp8(linear.weight)``) with their ``weight_scale``.
    weight_scale : torch.Tensor, optional
        ``[out_features]`` (or ``[out_features, 1]``) float32, for an e4m3 weight only. A scale
        follows the tensor it scales, as in ``linear_fp8``.
    bias : torch.Tensor, optional
        ``[out_features]`` in x's dtype.

    in_features must be a multiple of 16 bytes' elements (8 for 16-bit x, 4 for float32, 16 with an
    e4m3 weight).
    """
    return dispatch(_decode_linear, x, weight, weight_scale, bias)


_linear_gelu = ops.linear_gelu.default
_linear_gelu_out = ops.linear_gelu_out.default
_linear_gelu_fused = ops.linear_gelu_fused.default
_linear_fp8 = ops.linear_fp8.default
_decode_linear = ops.decode_linear.default


# ---- fake (meta) implementations ----

def _check_shapes(x, weight, bias):
    torch._check(x.dim() >= 1, lambda: "linear_gelu: x must have at least one dimension")
    torch._check(weight.dim() == 2 and weight.shape[1] == x.shape[-1],
                 lambda: f"linear_gelu: weight must be [out_features, {x.shape[-1]}], got {tuple(weight.shape)}")
    torch._check(weight.dtype == x.dtype, lambda: f"linear_gelu: weight must have x's dtype {x.dtype}")
    if bias is not None:
        torch._check(bias.shape == (weight.shape[0],),
                     lambda: f"linear_gelu: bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")
        torch._check(bias.dtype == x.dtype, lambda: f"linear_gelu: bias must have x's dtype {x.dtype}")
    return (*x.shape[:-1], weight.shape[0])


@register_fake("linear_gelu")
def _(x, weight, bias):
    return x.new_empty(_check_shapes(x, weight, bias))


@register_fake("linear_gelu_out")
def _(out, x, weight, bias):
    shape = _check_shapes(x, weight, bias)
    torch._check(tuple(out.shape) == tuple(shape),
                 lambda: f"linear_gelu: out must have the shape {tuple(shape)}, got {tuple(out.shape)}")
    torch._check(out.dtype == x.dtype, lambda: f"linear_gelu: out must have dtype {x.dtype}, got {out.dtype}")


@register_fake("linear_fp8")
def _(x, x_scale, weight, weight_scale, bias, out_dtype, activation):
    torch._check(x.dim() >= 1, lambda: "linear_fp8: x must have at least one dimension")
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=out_dtype)


@register_fake("decode_linear")
def _(x, weight, weight_scale, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@register_fake("linear_gelu_fused")
def _(x, weight, bias):
    _check_shapes(x, weight, bias)
    raise RuntimeError("linear_gelu_fused asks cuBLASLt on the GPU whether its epilogue takes these operands: a "
                       "host-side query with no answer while tracing; call it outside torch.compile, on real tensors")


# ---- autograd: the epilogue keeps no pre-activation, so the backward recomputes it ----

def _setup_context(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, *((bias,) if bias is not None else ()))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def _gelu_tanh_backward(grad: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """grad * d/dx gelu_tanh(x) at x = pre, in fp32 as ATen's gelu_backward computes it."""
    x = pre.float()
    t = torch.tanh(_SQRT_2_OVER_PI * (x + _GELU_CUBIC * x * x * x))
    slope = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_CUBIC * x * x)
    return (grad.float() * slope).to(pre.dtype)


def _backward(ctx, grad):
    x, weight, *maybe_bias = ctx.saved_tensors
    bias = maybe_bias[0] if ctx.has_bias else None
    pre = torch.nn.functional.linear(x, weight, bias)
    grad_pre = _gelu_tanh_backward(grad, pre)
    grad_x = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_x = grad_pre @ weight
    flat = grad_pre.reshape(-1, grad_pre.shape[-1])
    if ctx.needs_input_grad[1]:
        grad_weight = flat.t() @ x.reshape(-1, x.shape[-1])
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = flat.sum(0)
    return grad_x, grad_weight, grad_bias


torch.library.register_autograd(add_op_namespace_prefix("linear_gelu"), _backward, setup_context=_setup_context)
