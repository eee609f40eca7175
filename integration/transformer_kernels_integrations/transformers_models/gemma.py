"""Gemma, Gemma 2 and Gemma 3 (text): their RMSNorm (``rms_norm``) multiplies by ``1 + weight`` in fp32
and rounds once (``output * (1.0 + self.weight.float())`` on the fp32 normalization, then
``type_as(x)``): our ``rms_norm`` with the fp32 weight ``1 + weight`` and torch's rounding (one fp32
product, one rounding), the offset weight made in the forward so that autograd reaches ``weight``.
The same rule takes Gemma 3's per-head q/k norms (its attention keeps transformers' forward: the
merged attention does not reproduce them). The gated MLP (GELU-tanh) is Llama's rule with its
activation (``llama.py``); the sandwich-normed decoder layers and Gemma 2's soft-capped attention keep
transformers' forwards.
"""

from __future__ import annotations

import torch

from ..patching import Rule, named
from . import on_kernel_device

GEMMA_RMS_NORMS = ("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm")


def _patch_gemma_rms_norm(module: torch.nn.Module, inj) -> None:
    tk, original = inj.tk, type(module).forward

    def forward(self, x):
        if not on_kernel_device(x):
            inj.fallback("gemma_rms_norm", f"tensors on {x.device.type}")
            return original(self, x)
        return tk.rms_norm(x, 1.0 + self.weight.float(), self.eps, rounding="torch")

    inj.set_forward(module, forward)


def _gemma_rms_norm_skip(m) -> str | None:
    weight = getattr(m, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not hasattr(m, "eps"):
        return "not a Gemma RMSNorm with a 1-D weight and eps"
    return None


RULES: tuple[Rule, ...] = (
    Rule("gemma_rms_norm", ("rms_norm",), named(*GEMMA_RMS_NORMS), _patch_gemma_rms_norm, skip=_gemma_rms_norm_skip,
         ops=("rms_norm",), fallback="tensors off the GPU run transformers' Gemma RMSNorm forward"),
)
