"""Any diffusers model's GELU modules (with ``linear_gelu``: a tanh GELU's input projection and the
activation as one cuBLASLt GEMM with the GELU epilogue, the FFNs of LTX-Video, Flux and SD3; it
rounds once where eager rounds twice, so the output is close to, not bit-equal with, eager's),
RMSNorms and LayerNorms: the rules tried last, on what the model-specific rules left.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch

from .. import fp8
from ..patching import Rule, forward_from, layer_forward, named


def _gelu_forward(tk: ModuleType) -> Callable:
    """diffusers' ``GELU`` (input projection, then GELU) or ``torch.nn.GELU``."""

    def forward(self, hidden_states):
        if hasattr(self, "proj"):
            hidden_states = self.proj(hidden_states)
        return tk.gelu(hidden_states, approximate=self.approximate)

    return forward


def _patch_linear_gelu(module: torch.nn.Module, inj) -> None:
    """diffusers' ``GELU(approximate="tanh")`` with its input projection: one cuBLASLt GEMM whose
    epilogue adds the bias and applies the GELU (``linear_gelu``); an input the op does not take
    (another dtype than the weight, autocast) runs the projection, then our gelu kernel (a logged
    fallback). Under ``inject(fp8=True)`` the projection is an FP8 GEMM with the same epilogue."""
    tk = inj.tk

    def forward(self, hidden_states):
        proj = self.proj
        fp8_weight = fp8.usable_of(proj, hidden_states, inj)
        if fp8_weight is not None:
            return fp8.linear(tk, fp8_weight, hidden_states, proj.bias, "gelu_tanh")
        if isinstance(hidden_states, fp8.QuantizedRows):  # of a key its GEMM does not take (usable_of said so)
            hidden_states = hidden_states.dequantized()
        if hidden_states.dtype != proj.weight.dtype or torch.is_autocast_enabled(hidden_states.device.type):
            why = ("autocast is on" if torch.is_autocast_enabled(hidden_states.device.type)
                   else f"input {hidden_states.dtype}, weight {proj.weight.dtype}")
            inj.fallback("linear_gelu", why, instead="the projection, then the gelu kernel")
            return tk.gelu(proj(hidden_states), approximate=self.approximate)
        return tk.linear_gelu(hidden_states, proj.weight, proj.bias)

    inj.set_forward(module, forward)


def _linear_gelu_skip(m: torch.nn.Module) -> str | None:
    if getattr(m, "approximate", None) != "tanh":
        return "exact GELU: cuBLASLt's epilogue is the tanh form"
    if type(getattr(m, "proj", None)) is not torch.nn.Linear:
        return "no plain nn.Linear input projection"
    return None


def _gelu_skip(m: torch.nn.Module) -> str | None:
    return None if getattr(m, "approximate", None) in ("none", "tanh") else "unknown GELU approximation"


def _layer_norm_skip(m: torch.nn.Module) -> str | None:
    return None if len(m.normalized_shape) == 1 else "normalizes more than the last dimension"


RULES: tuple[Rule, ...] = (
    Rule("linear_gelu", ("gelu", "linear_gelu"), named("GELU"), _patch_linear_gelu, skip=_linear_gelu_skip,
         ops=("linear_gelu",),
         fallback="an input of another dtype than the projection's weight, or autocast: the projection, then "
                  "the gelu kernel"),
    Rule("gelu", ("gelu",), named("GELU"), forward_from(_gelu_forward), skip=_gelu_skip, ops=("activation",)),
    Rule("rms_norm", ("rms_norm",), named("RMSNorm"), layer_forward("RMSNorm"), ops=("rms_norm",)),
    Rule("layer_norm", ("layer_norm",), named("LayerNorm", "FP32LayerNorm"), layer_forward("LayerNorm"),
         skip=lambda m: "FP32LayerNorm computes in fp32 on purpose" if type(m).__name__ == "FP32LayerNorm"
         else _layer_norm_skip(m), ops=("layer_norm",)),
)
