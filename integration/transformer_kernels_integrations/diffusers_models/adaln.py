"""The adaptive LayerNorms of the DiTs (``AdaLayerNormZero`` and ``AdaLayerNormZeroSingle`` of Flux
and SD3, ``SD35AdaLayerNormZeroX``, ``AdaLayerNormContinuous``): the LayerNorm and its modulation in
one kernel (``norm_modulate``); claims the norm.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch

from ..patching import Rule, forward_from, named


def _modulated_layer_norm(tk: ModuleType, norm: torch.nn.LayerNorm, x, scale, shift):
    """``norm(x) * (1 + scale[:, None]) + shift[:, None]`` in one kernel (the AdaLN modules' core)."""
    return tk.norm_modulate(x, scale[:, None], shift[:, None], norm="layer", weight=norm.weight, bias=norm.bias,
                            eps=norm.eps)


def _adaln_zero_forward(tk: ModuleType) -> Callable:
    """``AdaLayerNormZero`` (Flux, SD3 blocks): the LayerNorm and its modulation in one kernel."""

    def forward(self, x, timestep=None, class_labels=None, hidden_dtype=None, emb=None):
        if self.emb is not None:
            emb = self.emb(timestep, class_labels, hidden_dtype=hidden_dtype)
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
        x = _modulated_layer_norm(tk, self.norm, x, scale_msa, shift_msa)
        return x, gate_msa, shift_mlp, scale_mlp, gate_mlp

    return forward


def _adaln_zero_single_forward(tk: ModuleType) -> Callable:
    """``AdaLayerNormZeroSingle`` (Flux single blocks)."""

    def forward(self, x, emb=None):
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa = emb.chunk(3, dim=1)
        return _modulated_layer_norm(tk, self.norm, x, scale_msa, shift_msa), gate_msa

    return forward


def _sd35_adaln_zero_x_forward(tk: ModuleType) -> Callable:
    """``SD35AdaLayerNormZeroX`` (SD3.5's dual-attention blocks): one LayerNorm, two modulations of
    it. Each is one kernel, so x is read and normalized twice (a kernel with two modulated outputs
    would read it once); both normalize x the same way, so the outputs equal the eager ones."""

    def forward(self, hidden_states, emb=None):
        emb = self.linear(self.silu(emb))
        (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp, shift_msa2, scale_msa2,
         gate_msa2) = emb.chunk(9, dim=1)
        out = _modulated_layer_norm(tk, self.norm, hidden_states, scale_msa, shift_msa)
        out2 = _modulated_layer_norm(tk, self.norm, hidden_states, scale_msa2, shift_msa2)
        return out, gate_msa, shift_mlp, scale_mlp, gate_mlp, out2, gate_msa2

    return forward


def _adaln_continuous_forward(tk: ModuleType) -> Callable:
    """``AdaLayerNormContinuous`` (the final norm of SD3, Flux and others): LayerNorm and its
    modulation in one kernel."""

    def forward(self, x, conditioning_embedding):
        emb = self.linear(self.silu(conditioning_embedding).to(x.dtype))
        scale, shift = torch.chunk(emb, 2, dim=1)
        return _modulated_layer_norm(tk, self.norm, x, scale, shift)

    return forward


def _adaln_skip(m: torch.nn.Module) -> str | None:
    return None if type(getattr(m, "norm", None)) is torch.nn.LayerNorm else "its norm is not a plain LayerNorm"


_ADALN = ("layer_norm", "norm_modulate")  # the switches: a LayerNorm and its modulation in one kernel
_OPS = ("norm_modulate",)

RULES: tuple[Rule, ...] = (
    Rule("adaln_zero", _ADALN, named("AdaLayerNormZero"), forward_from(_adaln_zero_forward), claims=("norm",),
         skip=_adaln_skip, ops=_OPS),
    Rule("adaln_zero_single", _ADALN, named("AdaLayerNormZeroSingle"), forward_from(_adaln_zero_single_forward),
         claims=("norm",), skip=_adaln_skip, ops=_OPS),
    Rule("sd35_adaln_zero_x", _ADALN, named("SD35AdaLayerNormZeroX"), forward_from(_sd35_adaln_zero_x_forward),
         claims=("norm",), skip=_adaln_skip, ops=_OPS),
    Rule("adaln_continuous", _ADALN, named("AdaLayerNormContinuous"), forward_from(_adaln_continuous_forward),
         claims=("norm",), skip=_adaln_skip, ops=_OPS),
)
