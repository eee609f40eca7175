"""Normalization ops: Python API and fake (meta) implementations."""

from typing import Optional

import torch

from ._ops import add_op_namespace_prefix, ops

ROUNDINGS = ("hf", "diffusers", "torch")


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
    out: Optional[torch.Tensor] = None,
    rounding: str = "hf",
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

    Parameters
    ----------
    x : torch.Tensor
        ``[..., hidden]`` CUDA tensor, float32, float16 or bfloat16. The last dimension must be
        contiguous; the leading dimensions may have any strides (no copy is made).
    weight : torch.Tensor, optional
        ``[hidden]``, contiguous, with ``x``'s dtype or float32. ``None`` for no scale (LTX-Video's
        block norms).
    eps : float
        Added to the mean square before the reciprocal square root.
    out : torch.Tensor, optional
        ``[..., hidden]`` output; allocated when not given. Its dtype must be the one the rounding
        mode produces (see ``rms_norm_out_dtype``) and it must not overlap ``x`` or ``weight``.
    rounding : str
        ``"hf"``, ``"diffusers"`` or ``"torch"``.

    Returns
    -------
    torch.Tensor
        ``out``.
    """
    if out is None:  # allocated in C++: a Python-side torch.empty costs as much as the kernel launch
        return _rms_norm(x, weight, eps, rounding)
    _rms_norm_out(out, x, weight, eps, rounding)
    return out


# Resolved overloads skip the packet's per-call overload lookup (decode calls are host-bound).
_rms_norm = ops.rms_norm.default
_rms_norm_out = ops.rms_norm_out.default


def _check_rounding(rounding: str) -> None:
    torch._check(rounding in ROUNDINGS, lambda: f"rms_norm: rounding must be one of {ROUNDINGS}, got {rounding!r}")


@torch.library.register_fake(add_op_namespace_prefix("rms_norm"))
def _rms_norm_fake(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, rounding: str) -> torch.Tensor:
    _check_rounding(rounding)
    return x.new_empty(x.shape, dtype=rms_norm_out_dtype(x, weight, rounding))


@torch.library.register_fake(add_op_namespace_prefix("rms_norm_out"))
def _rms_norm_out_fake(out: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], eps: float,
                       rounding: str) -> None:
    _check_rounding(rounding)
    torch._check(out.shape == x.shape,
                 lambda: f"rms_norm: out must have the shape of x {tuple(x.shape)}, got {tuple(out.shape)}")
    expected = rms_norm_out_dtype(x, weight, rounding)
    torch._check(out.dtype == expected, lambda: f"rms_norm: out must have dtype {expected}, got {out.dtype}")
