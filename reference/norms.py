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
