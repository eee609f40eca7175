"""GroupNorm references: float64 math and the eager code of diffusers' ResNet blocks."""

from typing import Optional

import torch
import torch.nn.functional as F


def channel_view(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-channel [C] (or per-sample-channel [N, C]) tensor viewed to broadcast over x [N, C, *spatial]."""
    return t.reshape(*t.shape[:2] if t.dim() > 1 else (1, t.shape[0]), *([1] * (x.dim() - 2)))


def add_time_embedding(x: torch.Tensor, bias_nc: Optional[torch.Tensor]) -> torch.Tensor:
    """ResnetBlock2D's ``hidden_states + temb[:, :, None, None]`` in x's dtype (None: x itself)."""
    return x if bias_nc is None else x + channel_view(bias_nc, x)


def group_norm_float64(x, num_groups, weight=None, bias=None, eps=1e-5, bias_nc=None) -> torch.Tensor:
    """GroupNorm (biased variance) of h = round(x + bias_nc), in float64, eps as given."""
    h = add_time_embedding(x, bias_nc).double()
    n, c = h.shape[:2]
    g = h.reshape(n, num_groups, -1)
    mean = g.mean(-1, keepdim=True)
    var = (g - mean).pow(2).mean(-1, keepdim=True)
    y = ((g - mean) / torch.sqrt(var + eps)).reshape(h.shape)
    if weight is not None:
        y = y * channel_view(weight.double(), h)
    if bias is not None:
        y = y + channel_view(bias.double(), h)
    return y


def eager_group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, activation=None, bias_nc=None):
    """The eager code the op replaces: ``F.group_norm`` (then ``F.silu``), after the time-embedding add."""
    y = F.group_norm(add_time_embedding(x, bias_nc), num_groups, weight, bias, eps)
    return F.silu(y) if activation == "silu" else y
