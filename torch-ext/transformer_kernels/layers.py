"""Layers for ``kernels.kernelize``: each replaces the ``forward`` of a model's module.

Following the Kernel Hub rules, a layer has no ``__init__`` and no members beyond ``forward`` and
the ``has_backward``/``can_torch_compile`` flags; ``forward`` reads the state of the module it is
bound to (``self.weight``, the eps attribute, ...). ``has_backward`` is true where the layer's ops
have a backward, so ``kernelize(model, mode=Mode.TRAINING)`` picks exactly those.
"""

import functools

import torch

from .activation import gelu, gelu_and_mul, gelu_tanh_and_mul, silu, silu_and_mul
from .group_norm import group_norm, is_supported_layout
from .norm import layer_norm, rms_norm
from .rope import apply_rotary_pos_emb


def _any_channel_stride(forward):
    """Lets a same-shape layer take an input whose last dimension is strided, as the module it
    replaces does: channels-first activations normalized through ``movedim(1, -1)`` (LTX-Video's
    VAE). The kernels read rows of unit stride (and say so for direct calls), so such an input is
    copied to row-major once, and the result is given back in the input's layout, as eager
    elementwise code keeps it: two extra passes, still fewer than eager's five or more."""

    @functools.wraps(forward)
    def wrapper(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() > 0 and x.size(-1) > 1 and x.stride(-1) != 1:
            return torch.empty_like(x).copy_(forward(self, x.contiguous()))
        return forward(self, x)

    return wrapper


class RMSNorm(torch.nn.Module):
    """RMSNorm for transformers' ``LlamaRMSNorm`` family, diffusers' ``RMSNorm`` and ``torch.nn.RMSNorm``
    (op ``rms_norm``).

    The host module's type picks the rounding, so the output matches the module being replaced:
    ``variance_epsilon`` (transformers) -> ``"hf"``; ``torch.nn.RMSNorm`` -> ``"torch"`` (its
    ``eps=None`` is the epsilon of the fp32 compute type, as ATen's ``rms_norm`` uses, not of
    the input dtype its docs name); otherwise diffusers (``eps``, optional ``weight`` and
    ``bias``) -> ``"diffusers"``.

    Shapes:
        - hidden_states: ``[..., hidden]``
        - output: ``[..., hidden]``
    """

    weight: torch.Tensor
    can_torch_compile: bool = True
    has_backward: bool = True  # rms_norm / layer_norm have a backward (norm.py)

    @_any_channel_stride
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = getattr(self, "weight", None)
        if hasattr(self, "variance_epsilon"):
            return rms_norm(hidden_states, weight, self.variance_epsilon, rounding="hf")
        if isinstance(self, torch.nn.RMSNorm):
            eps = self.eps if self.eps is not None else torch.finfo(torch.float32).eps
            return rms_norm(hidden_states, weight, eps, rounding="torch")
        out = rms_norm(hidden_states, weight, self.eps, rounding="diffusers")
        bias = getattr(self, "bias", None)
        return out if bias is None else out + bias


class LayerNorm(torch.nn.Module):
    """LayerNorm over the last dimension for ``torch.nn.LayerNorm`` (weight and bias optional; op ``layer_norm``).

    Shapes:
        - input: ``[..., hidden]``
        - output: ``[..., hidden]``
    """

    weight: torch.Tensor
    bias: torch.Tensor
    can_torch_compile: bool = True
    has_backward: bool = True  # rms_norm / layer_norm have a backward (norm.py)

    @_any_channel_stride
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm(input, self.weight, self.bias, self.eps)


class GroupNorm(torch.nn.Module):
    """GroupNorm for ``torch.nn.GroupNorm`` (diffusers' UNets and VAEs), affine or not.

    Channels-first and channels-last inputs are normalized in place of their layout, and the output
    keeps it. An input dense in neither layout is made contiguous first, as ``F.group_norm`` does
    itself; a weight of another dtype than the input (autocast, mixed-precision modules) takes the
    module's own ``F.group_norm``.

    Shapes:
        - input: ``[N, C, *spatial]``
        - output: ``[N, C, *spatial]``
    """

    weight: torch.Tensor
    bias: torch.Tensor
    can_torch_compile: bool = True
    has_backward: bool = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if (weight is not None and weight.dtype != input.dtype) or (bias is not None and bias.dtype != input.dtype):
            return torch.nn.functional.group_norm(input, self.num_groups, weight, bias, self.eps)
        if not is_supported_layout(input):
            input = input.contiguous()
        return group_norm(input, self.num_groups, weight, bias, self.eps)


# Activations, named as kernels-community's `activation` names them (transformers maps its "SiLU",
# "GeLU" and "GeluTanh" layer names to these). Shapes: [..., D] -> [..., D]; the *AndMul layers
# take the concatenated projection [..., 2H] -> [..., H].


class Silu(torch.nn.Module):
    """``F.silu(x)`` (transformers' ``SiLUActivation``): ``silu``, op ``activation``."""

    can_torch_compile: bool = True
    has_backward: bool = True

    @_any_channel_stride
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu(x)


class Gelu(torch.nn.Module):
    """``F.gelu(x)`` with erf: ``gelu``, op ``activation``."""

    can_torch_compile: bool = True
    has_backward: bool = True

    @_any_channel_stride
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu(x)


class GeluTanh(torch.nn.Module):
    """``F.gelu(x, approximate="tanh")`` (transformers' ``GELUTanh``): ``gelu``, op ``activation``."""

    can_torch_compile: bool = True
    has_backward: bool = True

    @_any_channel_stride
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu(x, approximate="tanh")


class SiluAndMul(torch.nn.Module):
    """``silu(x[..., :H]) * x[..., H:]``: ``silu_and_mul``, op ``act_and_mul``."""

    can_torch_compile: bool = True
    has_backward: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)


class GeluAndMul(torch.nn.Module):
    """``gelu(x[..., :H]) * x[..., H:]`` (erf): ``gelu_and_mul``, op ``act_and_mul``."""

    can_torch_compile: bool = True
    has_backward: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_and_mul(x)


class GeluTanhAndMul(torch.nn.Module):
    """``gelu_tanh(x[..., :H]) * x[..., H:]``: ``gelu_tanh_and_mul``, op ``act_and_mul``."""

    can_torch_compile: bool = True
    has_backward: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_tanh_and_mul(x)


class RotaryPosEmb(torch.nn.Module):
    """transformers' ``apply_rotary_pos_emb`` (hub function name ``"rotary_pos_emb"``): q and k rotated
    in one launch (``apply_rotary_pos_emb``, op ``hf_rope``); returns ``(q_embed, k_embed)``.

    Shapes:
        - q: ``[B, Hq, S, d]``, k: ``[B, Hk, S, d]`` (``unsqueeze_dim=1``)
        - cos, sin: ``[B, S, R]``, ``R <= d``
    """

    can_torch_compile: bool = True
    has_backward: bool = True

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1):
        return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)


__all__ = ["Gelu", "GeluAndMul", "GeluTanh", "GeluTanhAndMul", "GroupNorm", "LayerNorm", "RMSNorm", "RotaryPosEmb", "Silu",
           "SiluAndMul"]
