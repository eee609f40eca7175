"""FP8 quantization of GEMM inputs: Python API and fake (meta) implementations.

``quantize_fp8(x)`` is per-row (per-token) dynamic e4m3 quantization, the activation side of
torchao's row-wise FP8 recipe and of ``torch._scaled_mm``'s row-wise scaling: for each row of the
last dimension, ``scale = max(amax, 1e-12) / 448`` (fp32) and ``codes = e4m3(x / scale)``, the
quotient rounded once in fp32, then to nearest even and saturated at ±448 (torch's own cast gives
NaN past ±464; torchao clamps first, as here). ``codes.float() * scale`` gives x back within half an
e4m3 spacing of each value. A row holding a NaN gets a NaN scale and a row holding an infinity an
infinite one, so either dequantizes to NaN, as a bf16 GEMM over that row would give NaN or inf; an
all-zero row gets a finite scale and zero codes. For GEMM inputs that no producer of ours emits in
FP8 (the producers quantize in the same pass as their norm or activation).
"""

import torch

from ._autograd import dispatch
from ._fake import register_fake
from ._ops import ops


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row dynamic FP8 (e4m3) quantization: ``x ≈ codes.float() * scale``.

    Parameters
    ----------
    x : torch.Tensor
        ``[..., K]``, CUDA float32/float16/bfloat16, last dimension contiguous (any strides before it).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``codes``: ``[..., K]`` ``torch.float8_e4m3fn``, contiguous; ``scale``: ``[..., 1]`` float32,
        one per row. No gradient: under grad mode an input that requires grad is refused.
    """
    return dispatch(_quantize_fp8, x)


def act_mul_fp8(gate: torch.Tensor, up: torch.Tensor, activation: str = "silu") -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_fp8(act_mul(gate, up, activation))`` in one pass, bit for bit: the gated unit (``activation`` in
    fp32 rounded to the dtype, the product rounded once, as ``act_mul`` and the eager code compute it)
    quantized per row without writing it in 16 bits: the FP8 input of a gated MLP's down projection
    (transformers' ``LlamaMLP``: ``activation="silu"``). ``gate`` and ``up`` may be views of one merged
    projection's output. Returns ``(codes, scale)`` as ``quantize_fp8`` does; no gradient."""
    return dispatch(_act_mul_fp8, gate, up, activation)


_quantize_fp8 = ops.quantize_fp8.default
_act_mul_fp8 = ops.act_mul_fp8.default


def fp8_rows_like(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty codes and row scales of x's rows, as the quantizing ops return them (their fakes)."""
    return x.new_empty(x.shape, dtype=torch.float8_e4m3fn), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


@register_fake("quantize_fp8")
def _(x):
    torch._check(x.dim() >= 1, lambda: "quantize_fp8: x must have at least one dimension")
    return fp8_rows_like(x)


@register_fake("act_mul_fp8")
def _(gate, up, activation):
    torch._check(gate.dim() >= 1, lambda: "act_mul_fp8: gate must have at least one dimension")
    return fp8_rows_like(gate)
