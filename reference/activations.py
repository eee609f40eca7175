"""Activation references: float64 math and the eager code of the modules our kernels replace."""

import math

import torch
import torch.nn.functional as F


def activation_float64(x: torch.Tensor, act: str) -> torch.Tensor:
    x = x.double()
    if act == "silu":
        return x / (1 + torch.exp(-x))
    if act == "gelu":
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))))


FP32_UNIT_ROUNDOFF = 2.0**-24


def activation_error_magnitude(x: torch.Tensor, act: str, out_roundoff: float) -> torch.Tensor:
    """What the rounding errors of act(x) (fp32 math, rounded to an output dtype of unit roundoff
    `out_roundoff`) scale with, as a magnitude for a bound of a few output roundings: |act(x)|, a
    floor of 1e-3, and for GELU the fp32 cancellation of 1 + erf (or 1 + tanh) at negative x, an
    absolute error of about ulp_fp32(1) |x| / 2, expressed in output roundings (so that in 16-bit
    outputs it stays an fp32-sized allowance and cannot hide a wrong value where |act(x)| is small)."""
    mag = activation_float64(x, act).abs() + 1e-3
    if act == "silu":
        return mag
    return mag + 0.5 * x.double().abs() * (FP32_UNIT_ROUNDOFF / out_roundoff)


def eager_activation(x: torch.Tensor, act: str) -> torch.Tensor:
    """``F.silu`` / ``F.gelu`` (transformers' ``SiLUActivation``, ``GELUTanh``; diffusers' ``GELU``)."""
    if act == "silu":
        return F.silu(x)
    return F.gelu(x, approximate="none" if act == "gelu" else "tanh")


def eager_act_mul(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """transformers' ``LlamaMLP``: ``act_fn(gate_proj(x)) * up_proj(x)`` (before down_proj)."""
    return eager_activation(gate, act) * up


def eager_act_and_mul(x: torch.Tensor, act: str, act_first: bool = True) -> torch.Tensor:
    """vLLM's ``silu_and_mul`` family (act on the first half), or diffusers' ``GEGLU``
    (``hidden_states, gate = proj.chunk(2, -1)``; ``hidden_states * gelu(gate)``)."""
    first, second = x.chunk(2, dim=-1)
    return eager_act_mul(first, second, act) if act_first else first * eager_activation(second, act)


def eager_gated_add(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """A DiT block's ``hidden_states + ff_output * gate_mlp``."""
    return x + y * gate
