"""Normalization ops: Python API, fake (meta) implementations and autograd.

Every op computes in fp32 and reproduces the rounding of the eager code it replaces. Tensors:
x ``[..., hidden]`` CUDA float32/float16/bfloat16 with a contiguous last dimension (leading
dimensions may have any strides; nothing is copied); ``weight``/``bias`` ``[hidden]``, x's dtype or
float32; ``scale``/``shift``/``gate`` x's dtype, broadcastable to x (``[hidden]``, ``[B, 1, hidden]``,
``[B, S, hidden]``, strided views of a larger modulation tensor).

Determinism: a call gives the same bits every time. A row's bits do not depend on the other rows
of its batch, with two exceptions, both within the same float64 bounds: rows wider than 16384
elements on the 16-byte path are split across blocks (their statistic summed per 8192-element
chunk) when the batch has fewer than two rows per SM, so such a row's last bits can change with the
batch size around that threshold and with the GPU's SM count; and the 16-byte path, taken when the
vector (8 fp16/bf16 or 4 fp32 elements) divides the width and every operand's pointer and row
stride are 16-byte aligned, sums in another order than the element-by-element path that takes
every other row, so a row's bits depend on its tensor's alignment (a batch of one row has no row
stride: one row of a padded view takes the 16-byte path where more rows of it do not)
(tests/reliability/test_reliability_determinism.py).

Training: the functional forms have a backward (CUDA kernels; the backward recomputes the row
statistics of x, so the forward is the inference kernel), under eager and
``torch.compile``. The in-place form and the ``out=`` forms have none: with grad enabled and an
input that requires grad they raise instead of dropping the gradient. ``gated_add``'s autograd
(an activation-family op whose backward is the modulations' broadcast reduction) is registered
here too.

FP8 outputs (``*_fp8``): the same ops with their output (in x's dtype, as the op above gives it)
quantized per row in the same pass, as ``quantize_fp8`` quantizes it: the same codes and scales
bit for bit, without writing the 16-bit output. They feed ``linear_fp8``; inference only (no
backward: refused under grad like every op without one).
"""

from typing import Optional, Tuple

import torch

from ._autograd import dispatch, grad_or_zeros, grad_rows, refuse_grad
from ._fake import register_fake
from ._ops import add_op_namespace_prefix, ops
from .quant import fp8_rows_like

ROUNDINGS = ("hf", "diffusers", "torch")
NORMS = ("rms", "layer")


def rms_norm_out_dtype(x: torch.Tensor, weight: Optional[torch.Tensor], rounding: str) -> torch.dtype:
    """The output dtype of the module each rounding mode reproduces.

    ``hf`` and ``diffusers`` return the weight's dtype (fp32 for a bf16 input with an fp32 weight);
    ``torch`` returns the input's dtype. Without a weight every mode returns the input's dtype.
    """
    if rounding == "torch" or weight is None:
        return x.dtype
    return weight.dtype


def rms_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    rounding: str = "hf",
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Root-mean-square normalization over the last dimension.

    ``out = round(x / sqrt(mean(x**2, -1) + eps)) * weight``, computed in fp32 and rounded the way
    the module being replaced rounds:

    - ``"hf"`` (default): transformers' ``LlamaRMSNorm`` and its copies (Mistral, Qwen2/3):
      normalize in fp32, round to ``x.dtype``, multiply by ``weight`` in the weight's dtype.
    - ``"diffusers"``: diffusers' ``RMSNorm``: round to the weight's dtype before the multiply
      (no rounding with an fp32 weight, whose output is fp32).
    - ``"torch"``: ``torch.nn.RMSNorm`` / ``F.rms_norm``: multiply by the weight in fp32 and
      round once to ``x.dtype``.

    Norms over heads need no special form: ``[B, S, H*d]`` normalizes across all heads (LTX-Video's
    q/k norm), ``[B, S, H, d]`` or the ``[B, H, S, d]`` view transformers makes, per head (Qwen3, Flux).

    Parameters
    ----------
    x : torch.Tensor
        ``[..., hidden]``.
    weight : torch.Tensor, optional
        ``[hidden]``; ``None`` for no scale (LTX-Video's block norms).
    eps : float
        Added to the mean square before the reciprocal square root.
    out : torch.Tensor, optional
        Output, allocated when not given; its dtype must be ``rms_norm_out_dtype(x, weight,
        rounding)`` and it must not overlap an input.
    rounding : str
        ``"hf"``, ``"diffusers"`` or ``"torch"``.

    Returns
    -------
    torch.Tensor
        ``out``.
    """
    if out is None:  # allocated in C++: a Python-side torch.empty costs as much as the kernel launch
        return dispatch(_rms_norm, x, weight, eps, rounding)
    refuse_grad("rms_norm", "out= form", x, weight)
    _rms_norm_out(out, x, weight, eps, rounding)
    return out


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    rounding: str = "hf",
    out: Optional[torch.Tensor] = None,
    residual_out: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``residual_out = x + residual`` (rounded to x's dtype), then ``out = rms_norm(residual_out)``.

    The residual add and the next norm of a transformers decoder layer in one pass. Both inputs
    are left unchanged; see ``fused_add_rms_norm_`` for vLLM's in-place form.

    Returns
    -------
    (out, residual_out)
    """
    if out is None and residual_out is None:
        return dispatch(_fused_add_rms_norm, x, residual, weight, eps, rounding)
    if out is None:
        out = torch.empty(x.shape, dtype=rms_norm_out_dtype(x, weight, rounding), device=x.device)
    if residual_out is None:
        residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    refuse_grad("fused_add_rms_norm", "out= form", x, residual, weight)
    _fused_add_rms_norm_out(out, residual_out, x, residual, weight, eps, rounding)
    return out, residual_out


def fused_add_rms_norm_(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    rounding: str = "hf",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """In place, with vLLM's semantics: ``residual <- x + residual``, ``x <- rms_norm(residual)``.

    The output must have x's dtype (so an fp32 weight needs ``rounding="torch"``). Inference only:
    with grad enabled and an input that requires grad it raises (``fused_add_rms_norm`` has the
    backward).

    Returns
    -------
    (x, residual)
        The two inputs, overwritten.
    """
    refuse_grad("fused_add_rms_norm_", "in-place form", x, residual, weight)
    _fused_add_rms_norm_(x, residual, weight, eps, rounding)
    return x, residual


def layer_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """LayerNorm over the last dimension, as ``torch.nn.functional.layer_norm``.

    ``out = (x - mean) / sqrt(var + eps) * weight + bias`` with the biased variance, computed in fp32
    and rounded once to x's dtype.
    """
    if out is None:
        return dispatch(_layer_norm, x, weight, bias, eps)
    refuse_grad("layer_norm", "out= form", x, weight, bias)
    _layer_norm_out(out, x, weight, bias, eps)
    return out


def norm_modulate(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    norm: str = "rms",
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """AdaLN: ``norm(x) * (1 + scale) + shift``, as DiT blocks (LTX-Video, Flux, SD3) modulate.

    ``norm`` is ``"rms"`` (diffusers' ``RMSNorm``, weight optional) or ``"layer"`` (``nn.LayerNorm``,
    weight and bias optional). Each step rounds to x's dtype as the eager code does:
    ``round(round(round(norm(x)) * round(1 + scale)) + shift)``.
    """
    if out is None:
        return dispatch(_norm_modulate, x, scale, shift, weight, bias, eps, norm)
    refuse_grad("norm_modulate", "out= form", x, scale, shift, weight, bias)
    _norm_modulate_out(out, x, scale, shift, weight, bias, eps, norm)
    return out


def gated_add_norm_modulate(
    x: torch.Tensor,
    y: torch.Tensor,
    gate: Optional[torch.Tensor],
    scale: torch.Tensor,
    shift: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    norm: str = "rms",
    out: Optional[torch.Tensor] = None,
    h_out: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """A DiT block's residual add and the next modulated norm in one pass.

    ``h = x + gate * y`` (a gated residual, ``hidden_states + attn_output * gate_msa``), or
    ``h = x + y`` with ``gate=None`` (LTX-Video's cross-attention residual before ``norm2``), then
    ``out = norm(h) * (1 + scale) + shift``, each step rounded as the eager code does.

    Returns
    -------
    (out, h)
        The modulated norm of the new residual stream, and that stream: the normalized output
        first and the residual stream last, as every residual op of the package returns them.
    """
    if out is None and h_out is None:
        return dispatch(_gated_add_norm_modulate, x, y, gate, scale, shift, weight, bias, eps, norm)
    if h_out is None:
        h_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    refuse_grad("gated_add_norm_modulate", "out= form", x, y, gate, scale, shift, weight, bias)
    _gated_add_norm_modulate_out(out, h_out, x, y, gate, scale, shift, weight, bias, eps, norm)
    return out, h_out


def gated_add(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x + gate * y`` (a DiT block's gated residual with no norm after it); ``gate`` broadcasts
    to ``x`` (``[D]``, ``[B, 1, D]``, ``[B, S, D]``, or strided views). Its backward is the norm
    backward with no norm (``gated_add_backward``)."""
    if out is None:
        return dispatch(_gated_add, x, y, gate)
    refuse_grad("gated_add", "out= form", x, y, gate)
    _gated_add_out(out, x, y, gate)
    return out


def rms_norm_fp8(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6, rounding: str = "hf"
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``quantize_fp8(rms_norm(x, weight, eps, rounding=rounding).to(x.dtype))`` in one pass: the
    e4m3 codes ``[..., hidden]`` and the row scales ``[..., 1]`` (float32) of the norm's output in
    x's dtype (an fp32 weight's "hf"/"diffusers" output is rounded to x's dtype first). A decoder
    layer's first norm feeding its FP8 q/k/v projection."""
    return dispatch(_rms_norm_fp8, x, weight, eps, rounding)


def fused_add_rms_norm_fp8(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    rounding: str = "hf",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``fused_add_rms_norm`` with its output quantized per row: ``residual_out = x + residual``,
    then ``rms_norm_fp8(residual_out)``.

    Returns
    -------
    (codes, scale, residual_out)
    """
    return dispatch(_fused_add_rms_norm_fp8, x, residual, weight, eps, rounding)


def layer_norm_fp8(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, eps: float = 1e-5
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``quantize_fp8(layer_norm(x, weight, bias, eps))`` in one pass: ``(codes, scale)``."""
    return dispatch(_layer_norm_fp8, x, weight, bias, eps)


def norm_modulate_fp8(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    norm: str = "rms",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``quantize_fp8(norm_modulate(x, scale, shift, weight, bias, eps, norm))`` in one pass:
    ``(codes, codes_scale)``, the FP8 input of a DiT block's q/k/v or feed-forward projection.
    ``scale`` is the modulation's, not the quantization's (which is returned)."""
    return dispatch(_norm_modulate_fp8, x, scale, shift, weight, bias, eps, norm)


def gated_add_norm_modulate_fp8(
    x: torch.Tensor,
    y: torch.Tensor,
    gate: Optional[torch.Tensor],
    scale: torch.Tensor,
    shift: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    norm: str = "rms",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``gated_add_norm_modulate`` with its modulated output quantized per row.

    Returns
    -------
    (codes, codes_scale, h)
        The FP8 codes and row scales of ``norm(h) * (1 + scale) + shift``, and the new residual
        stream ``h`` (x's dtype) last.
    """
    return dispatch(_gated_add_norm_modulate_fp8, x, y, gate, scale, shift, weight, bias, eps, norm)


# Resolved overloads skip the packet's per-call overload lookup (decode calls are host-bound).
_rms_norm = ops.rms_norm.default
_rms_norm_out = ops.rms_norm_out.default
_fused_add_rms_norm = ops.fused_add_rms_norm.default
_fused_add_rms_norm_out = ops.fused_add_rms_norm_out.default
_fused_add_rms_norm_ = ops.fused_add_rms_norm_.default
_layer_norm = ops.layer_norm.default
_layer_norm_out = ops.layer_norm_out.default
_norm_modulate = ops.norm_modulate.default
_norm_modulate_out = ops.norm_modulate_out.default
_gated_add_norm_modulate = ops.gated_add_norm_modulate.default
_gated_add = ops.gated_add.default
_gated_add_out = ops.gated_add_out.default
_gated_add_norm_modulate_out = ops.gated_add_norm_modulate_out.default
_rms_norm_fp8 = ops.rms_norm_fp8.default
_fused_add_rms_norm_fp8 = ops.fused_add_rms_norm_fp8.default
_layer_norm_fp8 = ops.layer_norm_fp8.default
_norm_modulate_fp8 = ops.norm_modulate_fp8.default
_gated_add_norm_modulate_fp8 = ops.gated_add_norm_modulate_fp8.default


# ---- fake (meta) implementations: shapes and dtypes for torch.compile ----

def _check_choice(op: str, name: str, value: str, choices: Tuple[str, ...]) -> None:
    torch._check(value in choices, lambda: f"{op}: {name} must be one of {choices}, got {value!r}")


def _check_out(op: str, name: str, out: torch.Tensor, x: torch.Tensor, dtype: torch.dtype) -> None:
    torch._check(out.shape == x.shape, lambda: f"{op}: {name} must have the shape of x {tuple(x.shape)}, got {tuple(out.shape)}")
    torch._check(out.dtype == dtype, lambda: f"{op}: {name} must have dtype {dtype}, got {out.dtype}")


def _new(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=dtype)


@register_fake("rms_norm")
def _(x, weight, eps, rounding):
    _check_choice("rms_norm", "rounding", rounding, ROUNDINGS)
    return _new(x, rms_norm_out_dtype(x, weight, rounding))


@register_fake("rms_norm_out")
def _(out, x, weight, eps, rounding):
    _check_choice("rms_norm", "rounding", rounding, ROUNDINGS)
    _check_out("rms_norm", "out", out, x, rms_norm_out_dtype(x, weight, rounding))


@register_fake("fused_add_rms_norm")
def _(x, residual, weight, eps, rounding):
    _check_choice("fused_add_rms_norm", "rounding", rounding, ROUNDINGS)
    return _new(x, rms_norm_out_dtype(x, weight, rounding)), _new(x, x.dtype)


@register_fake("fused_add_rms_norm_out")
def _(out, residual_out, x, residual, weight, eps, rounding):
    _check_choice("fused_add_rms_norm", "rounding", rounding, ROUNDINGS)
    _check_out("fused_add_rms_norm", "out", out, x, rms_norm_out_dtype(x, weight, rounding))
    _check_out("fused_add_rms_norm", "residual_out", residual_out, x, x.dtype)


@register_fake("fused_add_rms_norm_")
def _(x, residual, weight, eps, rounding):
    _check_choice("fused_add_rms_norm_", "rounding", rounding, ROUNDINGS)


@register_fake("layer_norm")
def _(x, weight, bias, eps):
    return _new(x, x.dtype)


@register_fake("layer_norm_out")
def _(out, x, weight, bias, eps):
    _check_out("layer_norm", "out", out, x, x.dtype)


@register_fake("norm_modulate")
def _(x, scale, shift, weight, bias, eps, norm):
    _check_choice("norm_modulate", "norm", norm, NORMS)
    return _new(x, x.dtype)


@register_fake("norm_modulate_out")
def _(out, x, scale, shift, weight, bias, eps, norm):
    _check_choice("norm_modulate", "norm", norm, NORMS)
    _check_out("norm_modulate", "out", out, x, x.dtype)


@register_fake("gated_add")
def _(x, y, gate):
    return _new(x, x.dtype)


@register_fake("gated_add_out")
def _(out, x, y, gate):
    _check_out("gated_add", "out", out, x, x.dtype)


@register_fake("gated_add_norm_modulate")
def _(x, y, gate, scale, shift, weight, bias, eps, norm):
    _check_choice("gated_add_norm_modulate", "norm", norm, NORMS)
    return _new(x, x.dtype), _new(x, x.dtype)


@register_fake("gated_add_norm_modulate_out")
def _(out, h_out, x, y, gate, scale, shift, weight, bias, eps, norm):
    _check_choice("gated_add_norm_modulate", "norm", norm, NORMS)
    _check_out("gated_add_norm_modulate", "out", out, x, x.dtype)
    _check_out("gated_add_norm_modulate", "h_out", h_out, x, x.dtype)


@register_fake("rms_norm_fp8")
def _(x, weight, eps, rounding):
    _check_choice("rms_norm_fp8", "rounding", rounding, ROUNDINGS)
    return fp8_rows_like(x)


@register_fake("fused_add_rms_norm_fp8")
def _(x, residual, weight, eps, rounding):
    _check_choice("fused_add_rms_norm_fp8", "rounding", rounding, ROUNDINGS)
    return (*fp8_rows_like(x), _new(x, x.dtype))


@register_fake("layer_norm_fp8")
def _(x, weight, bias, eps):
    return fp8_rows_like(x)


@register_fake("norm_modulate_fp8")
def _(x, scale, shift, weight, bias, eps, norm):
    _check_choice("norm_modulate_fp8", "norm", norm, NORMS)
    return fp8_rows_like(x)


@register_fake("gated_add_norm_modulate_fp8")
def _(x, y, gate, scale, shift, weight, bias, eps, norm):
    _check_choice("gated_add_norm_modulate_fp8", "norm", norm, NORMS)
    return (*fp8_rows_like(x), _new(x, x.dtype))


# ---- training: the backward ops (fake implementations) and the autograd of the functional forms ----

_rms_norm_backward = ops.rms_norm_backward.default
_fused_add_rms_norm_backward = ops.fused_add_rms_norm_backward.default
_layer_norm_backward = ops.layer_norm_backward.default
_norm_modulate_backward = ops.norm_modulate_backward.default
_gated_add_norm_modulate_backward = ops.gated_add_norm_modulate_backward.default
_gated_add_backward = ops.gated_add_backward.default


def _not_asked(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((0,))


def _grad_like(asked: bool, t: Optional[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """A backward op's gradient of t (t's shape and dtype, contiguous), or the empty placeholder."""
    return t.new_empty(t.shape) if asked and t is not None else _not_asked(x)


@register_fake("rms_norm_backward")
def _(grad_out, x, weight, eps, output_mask):
    return _grad_like(output_mask[0], x, x), _grad_like(output_mask[1], weight, x)


@register_fake("fused_add_rms_norm_backward")
def _(grad_out, grad_residual_out, residual_out, weight, eps, output_mask):
    return _grad_like(output_mask[0], residual_out, residual_out), _grad_like(output_mask[1], weight, residual_out)


@register_fake("layer_norm_backward")
def _(grad_out, x, weight, bias, eps, output_mask):
    return (_grad_like(output_mask[0], x, x), _grad_like(output_mask[1], weight, x),
            _grad_like(output_mask[2], bias, x))


@register_fake("norm_modulate_backward")
def _(grad_out, x, scale, shift, weight, bias, eps, norm, output_mask):
    _check_choice("norm_modulate_backward", "norm", norm, NORMS)
    return tuple(_grad_like(asked, t, x) for asked, t in zip(output_mask, (x, scale, shift, weight, bias)))


@register_fake("gated_add_norm_modulate_backward")
def _(grad_out, grad_h, h, y, gate, scale, shift, weight, bias, eps, norm, output_mask):
    _check_choice("gated_add_norm_modulate_backward", "norm", norm, NORMS)
    # Without a gate y's gradient is x's: x's is computed for either, y's slot stays empty.
    dx = _grad_like(output_mask[0] or (output_mask[1] and gate is None), h, h)
    dy = _grad_like(output_mask[1] and gate is not None, h, h)
    rest = (_grad_like(asked, t, h) for asked, t in zip(output_mask[2:], (gate, scale, shift, weight, bias)))
    return (dx, dy, *rest)


@register_fake("gated_add_backward")
def _(grad_out, y, gate, output_mask):
    return _grad_like(output_mask[0], grad_out, grad_out), _grad_like(output_mask[1], gate, grad_out)


def _rms_norm_setup(ctx, inputs, output):
    x, weight, eps, _ = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_norm_bwd(ctx, grad):
    x, weight = ctx.saved_tensors
    need_x, need_w = ctx.needs_input_grad[:2]
    if grad is None:
        return None, None, None, None
    dx, dw = _rms_norm_backward(grad_rows(grad), x, weight, ctx.eps, [need_x, need_w])
    return dx if need_x else None, dw if need_w else None, None, None


def _fused_add_rms_norm_setup(ctx, inputs, output):
    _, _, weight, eps, _ = inputs
    ctx.save_for_backward(output[1], weight)  # h = x + residual: the normalized input, an output
    ctx.eps, ctx.out_dtype = eps, output[0].dtype


def _fused_add_rms_norm_bwd(ctx, grad_out, grad_h):
    h, weight = ctx.saved_tensors
    need_x, need_res, need_w = ctx.needs_input_grad[:3]
    grad_out = grad_or_zeros(grad_out, h, ctx.out_dtype)
    dh, dw = _fused_add_rms_norm_backward(grad_rows(grad_out), grad_rows(grad_h), h, weight, ctx.eps,
                                          [need_x or need_res, need_w])
    return dh if need_x else None, dh if need_res else None, dw if need_w else None, None, None


def _layer_norm_setup(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.eps = eps


def _layer_norm_bwd(ctx, grad):
    x, weight, bias = ctx.saved_tensors
    mask = list(ctx.needs_input_grad[:3])
    if grad is None:
        return None, None, None, None
    grads = _layer_norm_backward(grad_rows(grad), x, weight, bias, ctx.eps, mask)
    return (*(g if asked else None for g, asked in zip(grads, mask)), None)


def _norm_modulate_setup(ctx, inputs, output):
    x, scale, shift, weight, bias, eps, norm = inputs
    ctx.save_for_backward(x, scale, shift, weight, bias)
    ctx.eps, ctx.norm = eps, norm


def _norm_modulate_bwd(ctx, grad):
    x, scale, shift, weight, bias = ctx.saved_tensors
    mask = list(ctx.needs_input_grad[:5])
    if grad is None:
        return (None,) * 7
    grads = _norm_modulate_backward(grad_rows(grad), x, scale, shift, weight, bias, ctx.eps, ctx.norm, mask)
    return (*(g if asked else None for g, asked in zip(grads, mask)), None, None)


def _gated_add_norm_modulate_setup(ctx, inputs, output):
    _, y, gate, scale, shift, weight, bias, eps, norm = inputs
    ctx.save_for_backward(output[1], y, gate, scale, shift, weight, bias)  # output[1]: h, the normalized input
    ctx.eps, ctx.norm = eps, norm


def _gated_add_norm_modulate_bwd(ctx, grad_out, grad_h):
    h, y, gate, scale, shift, weight, bias = ctx.saved_tensors
    mask = list(ctx.needs_input_grad[:7])
    grad_out = grad_or_zeros(grad_out, h, h.dtype)
    dx, dy, *rest = _gated_add_norm_modulate_backward(grad_rows(grad_out), grad_rows(grad_h), h, y, gate, scale,
                                                      shift, weight, bias, ctx.eps, ctx.norm, mask)
    if gate is None:  # h = x + y: y's gradient is x's
        dy = dx
    return (*(g if asked else None for g, asked in zip((dx, dy, *rest), mask)), None, None)


def _gated_add_setup(ctx, inputs, output):
    _, y, gate = inputs
    ctx.save_for_backward(y, gate)


def _gated_add_bwd(ctx, grad):
    y, gate = ctx.saved_tensors
    need_x, need_y, need_gate = ctx.needs_input_grad[:3]
    if grad is None:
        return None, None, None
    dy = dgate = None
    if need_y or need_gate:
        dy, dgate = _gated_add_backward(grad_rows(grad), y, gate, [need_y, need_gate])
    return grad if need_x else None, dy if need_y else None, dgate if need_gate else None


torch.library.register_autograd(add_op_namespace_prefix("rms_norm"), _rms_norm_bwd, setup_context=_rms_norm_setup)
torch.library.register_autograd(add_op_namespace_prefix("fused_add_rms_norm"), _fused_add_rms_norm_bwd,
                                setup_context=_fused_add_rms_norm_setup)
torch.library.register_autograd(add_op_namespace_prefix("layer_norm"), _layer_norm_bwd,
                                setup_context=_layer_norm_setup)
torch.library.register_autograd(add_op_namespace_prefix("norm_modulate"), _norm_modulate_bwd,
                                setup_context=_norm_modulate_setup)
torch.library.register_autograd(add_op_namespace_prefix("gated_add_norm_modulate"), _gated_add_norm_modulate_bwd,
                                setup_context=_gated_add_norm_modulate_setup)
torch.library.register_autograd(add_op_namespace_prefix("gated_add"), _gated_add_bwd, setup_context=_gated_add_setup)
