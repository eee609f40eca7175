"""RMSNorm references: float64 math and the eager code of transformers, diffusers and torch."""

from typing import Optional

import torch
import torch.nn.functional as F


def rms_norm_float64(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, all in float64."""
    x64 = x.double()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.double()


def hf_rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """transformers ``LlamaRMSNorm.forward`` (also Mistral, Qwen2, Qwen3)."""
    input_dtype = x.dtype
    hidden_states = x.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    if weight is None:
        return hidden_states.to(input_dtype)
    return weight * hidden_states.to(input_dtype)


def diffusers_rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """diffusers ``RMSNorm.forward`` (models/normalization.py, CUDA path, no bias)."""
    input_dtype = x.dtype
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    hidden_states = x * torch.rsqrt(variance + eps)
    if weight is not None:
        if weight.dtype in (torch.float16, torch.bfloat16):
            hidden_states = hidden_states.to(weight.dtype)
        return hidden_states * weight
    return hidden_states.to(input_dtype)


def torch_rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """``torch.nn.RMSNorm`` / ``F.rms_norm``."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


# rounding mode of transformer_kernels.rms_norm -> the eager code it reproduces
RMS_NORM_EAGER = {"hf": hf_rms_norm, "diffusers": diffusers_rms_norm, "torch": torch_rms_norm}


def float64_norm(x: torch.Tensor, norm: str, weight=None, bias=None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm or LayerNorm (biased variance) with optional affine, all in float64."""
    x64 = x.double()
    if norm == "rms":
        y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    else:
        mean = x64.mean(-1, keepdim=True)
        y = (x64 - mean) * torch.rsqrt((x64 - mean).pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def torch_layer_norm(x, weight=None, bias=None, eps: float = 1e-5) -> torch.Tensor:
    """``torch.nn.LayerNorm`` / ``F.layer_norm`` (diffusers' ``LayerNorm`` is the same class)."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def hf_fused_add_rms_norm(x, residual, weight, eps, rounding: str = "hf"):
    """A transformers decoder layer's ``hidden_states = residual + hidden_states`` then the next norm."""
    h = residual + x
    return RMS_NORM_EAGER[rounding](h, weight, eps), h


def diffusers_norm_modulate(x, scale, shift=None, norm: str = "rms", weight=None, bias=None, eps: float = 1e-6):
    """The AdaLN of diffusers' DiT blocks: ``norm(x) * (1 + scale) + shift`` in x's dtype.

    LTX-Video: ``RMSNorm(elementwise_affine=False)``; Flux/SD3 ``AdaLayerNormZero``: ``LayerNorm``
    without affine."""
    n = diffusers_rms_norm(x, weight, eps) if norm == "rms" else torch_layer_norm(x, weight, bias, eps)
    n = n * (1 + scale)
    return n if shift is None else n + shift


def ltx_gated_add_norm_modulate(x, y, gate, scale, shift=None, norm: str = "rms", weight=None, bias=None,
                                eps: float = 1e-6):
    """LTX-Video's ``hidden_states = hidden_states + attn_hidden_states * gate_msa`` (or the ungated
    ``hidden_states + attn_hidden_states`` of its cross-attention, ``gate=None``), then the next AdaLN:
    ``(out, h)``, the order of ``gated_add_norm_modulate`` (the residual stream last)."""
    h = x + y if gate is None else x + y * gate
    return diffusers_norm_modulate(h, scale, shift, norm, weight, bias, eps), h
