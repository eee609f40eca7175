"""FP8 (e4m3, ``torch.float8_e4m3fn``) quantization references: the rounding the quantizing kernels
implement (the standalone quantize and the norm/activation producers' FP8 outputs), in float64.

Per-row (per-token) dynamic scaling, as torchao's row-wise recipe and ``torch._scaled_mm`` take it:
``scale = max(amax, AMAX_FLOOR) / 448`` rounded once to fp32, ``q = e4m3(x / scale)`` with the
quotient rounded once to fp32 (IEEE division), then rounded to nearest even in e4m3 and saturated
at ±448 (the saturating cast, ``__NV_SATFINITE``; torchao clamps before its cast). The dequantized
row is ``q * scale``.

Non-finite rows: a row holding a NaN gets a NaN scale (and NaN values: x / NaN); a row holding
±inf and no NaN gets an infinite scale (values NaN where x is infinite, ±0 elsewhere). Either way the
row dequantizes to NaN, as a GEMM over the bf16 row would give NaN or inf across its output row. An
all-zero row gets the scale ``AMAX_FLOOR / 448`` and zero values (torchao's floor: a finite scale).
"""

import torch

E4M3_MAX = 448.0
# The smallest amax a row's scale is formed from (torchao's EPS, 1e-12, as the kernels hold it: rounded
# to fp32): all-zero rows get a finite scale.
AMAX_FLOOR = 9.999999960041972e-13


def e4m3_round(v: torch.Tensor) -> torch.Tensor:
    """``v`` (rounded to fp32 first) to e4m3: nearest even, saturating at ±448 (±inf too); NaN becomes
    the positive NaN code 0x7F, as the GPU's conversion of its canonical NaN gives (a CPU's inf / inf
    is a negative NaN). torch's own cast is the same below 464 in magnitude but gives NaN beyond,
    hence the clamp."""
    v32 = v.float()
    nan = torch.tensor(float("nan"), dtype=torch.float32)
    return torch.where(v32.isnan(), nan, v32.clamp(-E4M3_MAX, E4M3_MAX)).to(torch.float8_e4m3fn)


def e4m3_spacing(v: torch.Tensor) -> torch.Tensor:
    """The distance between neighbouring e4m3 values around |v| (float64): 2^(e - 3) for normals
    (|v| >= 2^-6), 2^-9 for subnormals; a bound of half of it is one rounding."""
    mag = v.double().abs().clamp(min=2.0**-6, max=E4M3_MAX)
    return torch.exp2(torch.floor(torch.log2(mag)) - 3)


def quantize_fp8_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: ``q`` of x's shape in ``torch.float8_e4m3fn``, ``scale`` fp32 of shape
    ``[..., 1]`` (one per row of the last dimension), with the rounding described above."""
    x32 = x.float()  # exact from fp16, bf16 and fp32
    if x32.shape[-1] == 0:  # rows of no elements: the floor's scale
        amax = x32.new_zeros((*x32.shape[:-1], 1))
    else:
        amax = x32.abs().amax(dim=-1, keepdim=True)  # NaN if the row holds one
    scale = (amax.double().clamp_min(AMAX_FLOOR) / E4M3_MAX).float()
    quotient = (x32.double() / scale.double()).float()  # one rounding: the fp32 division's result
    return e4m3_round(quotient), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale`` in float64."""
    return q.double() * scale.double()
