"""Stable Diffusion UNets (SD 1.5, SDXL) and their VAE (``AutoencoderKL``): the rules ``inject`` adds.

- ``resnet_block`` (``ResnetBlock2D``, UNet and VAE): ``norm1`` + SiLU in one kernel, and the time
  embedding add ``h + temb[:, :, None, None]`` fused with ``norm2`` + SiLU (``add_group_norm``; the
  sum is used only through the norm). Up/downsampling, the convolutions, dropout and the shortcut
  stay diffusers' modules.
- ``norm_out_silu`` (``UNet2DConditionModel``, the VAE's ``Encoder`` and ``Decoder``): ``conv_norm_out``
  followed by ``conv_act`` (SiLU) in one kernel: the norm computes both and ``conv_act`` passes its
  input through (it is used nowhere else in those forwards). The decoder's is the largest feature map
  of the pipeline.
- ``geglu`` (``BasicTransformerBlock``'s ``FeedForward``): diffusers' ``GEGLU``, ``h * gelu(gate)`` with
  the gate in the second half, erf GELU, through our ``geglu`` after the module's projection.
- ``group_norm``: every other ``torch.nn.GroupNorm`` (``Transformer2DModel``'s input norm, the VAE
  mid-block attention's ``group_norm``) through the Hub layer ``GroupNorm``.
The ``BasicTransformerBlock`` LayerNorms are ``torch.nn.LayerNorm``: the general ``layer_norm`` rule
takes them.

Switches (``inject`` keywords, named in each rule): ``group_norm`` (``resnet_block``,
``norm_out_silu``, ``group_norm``) and ``geglu``. Each patched forward runs F.group_norm (the
module's own math) where our kernel would not take the input: parameters of another dtype than the
activations (autocast, a norm kept in fp32), or a time embedding that is not one value per (sample,
channel) in the activations' dtype; that is a fallback (logged once and counted in the report, or
``KernelFallbackError`` under ``strict=True``). In training (``for_training``) these rules need their
ops (``Rule.ops``) to have a backward.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch
import torch.nn.functional as F

from ..patching import Rule, forward_from, layer_forward, named


def _params_match(norm: torch.nn.GroupNorm, x: torch.Tensor) -> bool:
    return all(p is None or p.dtype == x.dtype for p in (norm.weight, norm.bias))


def _channel_bias(add: torch.Tensor, x: torch.Tensor) -> bool:
    """`add` is one value per (sample, channel) of x, in x's dtype: [N or 1, C, 1, ...]."""
    return (add.dtype == x.dtype and add.dim() == x.dim() and add.shape[0] in (1, x.shape[0])
            and add.shape[1] == x.shape[1] and all(s == 1 for s in add.shape[2:]))


def _dense(x: torch.Tensor) -> bool:
    """Channels-first or channels-last as the kernel reads it (else F.group_norm's own copy applies)."""
    if x.is_contiguous():
        return True
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    return fmt is not None and x.is_contiguous(memory_format=fmt)


def _unsupported(norm: torch.nn.GroupNorm, x: torch.Tensor, add: torch.Tensor | None) -> str | None:
    """Why norm_silu's kernel does not take these operands, or None."""
    if not _params_match(norm, x):
        return f"norm parameters of another dtype than the input ({x.dtype})"
    if add is not None and not _channel_bias(add, x):
        return "a time embedding that is not one value per (sample, channel) in the input's dtype"
    return None


def norm_silu(inj, kind: str, norm: torch.nn.GroupNorm, x: torch.Tensor, add: torch.Tensor | None = None):
    """``silu(norm(x + add))`` (``add`` None or the block's ``temb[:, :, None, None]``) in one kernel;
    operands it does not take run F.group_norm + F.silu, a fallback of `kind`."""
    tk = inj.tk
    why = _unsupported(norm, x, add)
    if why is not None:
        inj.fallback(kind, why, instead="F.group_norm + F.silu")
        h = x if add is None else x + add
        return F.silu(F.group_norm(h, norm.num_groups, norm.weight, norm.bias, norm.eps))
    if not _dense(x):
        x = x.contiguous()
    if add is None:
        return tk.group_norm(x, norm.num_groups, norm.weight, norm.bias, norm.eps, activation="silu")
    return tk.add_group_norm(x, add, norm.num_groups, norm.weight, norm.bias, norm.eps, activation="silu")


def _resnet_block_forward(inj) -> Callable:
    """``ResnetBlock2D.forward`` (SiLU, no "scale_shift" modulation) with both norms fused with their
    SiLU and the time embedding add ("default") fused into ``norm2``; other modes (the VAE's "group")
    take no embedding."""
    kind = "resnet_block"

    def forward(self, input_tensor, temb, *args, **kwargs):
        hidden_states = norm_silu(inj, kind, self.norm1, input_tensor)
        if self.upsample is not None:
            # as diffusers: upsample_nearest_nhwc fails with large batch sizes
            if hidden_states.shape[0] >= 64:
                input_tensor = input_tensor.contiguous()
                hidden_states = hidden_states.contiguous()
            input_tensor = self.upsample(input_tensor)
            hidden_states = self.upsample(hidden_states)
        elif self.downsample is not None:
            input_tensor = self.downsample(input_tensor)
            hidden_states = self.downsample(hidden_states)
        hidden_states = self.conv1(hidden_states)
        if self.time_emb_proj is not None:
            if not self.skip_time_act:
                temb = self.nonlinearity(temb)
            temb = self.time_emb_proj(temb)[:, :, None, None]
        add = temb if self.time_embedding_norm == "default" else None
        hidden_states = norm_silu(inj, kind, self.norm2, hidden_states, add)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.conv2(hidden_states)
        if self.conv_shortcut is not None:
            if self.training:
                input_tensor = input_tensor.contiguous()
            input_tensor = self.conv_shortcut(input_tensor)
        return (input_tensor + hidden_states) / self.output_scale_factor

    return forward


def _pass_through(self, x):
    return x


def _norm_out_silu_patch(model: torch.nn.Module, inj) -> None:
    """conv_norm_out's forward also applies the SiLU that follows it; conv_act passes through."""
    inj.set_forward(model.conv_norm_out, lambda self, x: norm_silu(inj, "norm_out_silu", self, x))
    inj.set_forward(model.conv_act, _pass_through)


def _geglu_forward(tk: ModuleType) -> Callable:
    """diffusers' ``GEGLU``: its projection, then ``h * gelu(gate)`` in one kernel."""

    def forward(self, hidden_states, *args, **kwargs):
        return tk.geglu(self.proj(hidden_states))

    return forward


def _is_group_norm(m) -> bool:
    return type(m) is torch.nn.GroupNorm


def _resnet_block_skip(m: torch.nn.Module) -> str | None:
    if not (_is_group_norm(getattr(m, "norm1", None)) and _is_group_norm(getattr(m, "norm2", None))):
        return "its norms are not torch.nn.GroupNorm"
    if type(getattr(m, "nonlinearity", None)) is not torch.nn.SiLU:
        return f"its nonlinearity is {type(getattr(m, 'nonlinearity', None)).__name__}, not SiLU"
    if getattr(m, "time_embedding_norm", "scale_shift") == "scale_shift":
        return "time_embedding_norm 'scale_shift' modulates the norm's output"
    return None


# The classes whose forward ends with conv_norm_out -> conv_act -> conv_out.
_NORM_OUT_MODULES = {"UNet2DConditionModel": "diffusers.models.unets.unet_2d_condition",
                     "Encoder": "diffusers.models.autoencoders.vae", "Decoder": "diffusers.models.autoencoders.vae"}


def _norm_out_silu_skip(m: torch.nn.Module) -> str | None:
    if _NORM_OUT_MODULES.get(type(m).__name__) != type(m).__module__:
        return f"not diffusers' {type(m).__name__}"
    if not _is_group_norm(getattr(m, "conv_norm_out", None)):
        return "conv_norm_out is not torch.nn.GroupNorm"
    if type(getattr(m, "conv_act", None)) is not torch.nn.SiLU:
        return "conv_act is not SiLU"
    return None


def _geglu_skip(m: torch.nn.Module) -> str | None:
    if not type(m).__module__.startswith("diffusers.") or not isinstance(getattr(m, "proj", None), torch.nn.Linear):
        return "not diffusers' GEGLU"
    return None


_GROUP_NORM_FALLBACK = ("norm parameters of another dtype than the activations (autocast, a norm kept in fp32), or "
                        "a time embedding not one value per (sample, channel): F.group_norm + F.silu")

RULES: tuple[Rule, ...] = (
    Rule("resnet_block", ("group_norm",), named("ResnetBlock2D"),
         lambda m, inj: inj.set_forward(m, _resnet_block_forward(inj)), claims=("norm1", "norm2"),
         skip=_resnet_block_skip, fallback=_GROUP_NORM_FALLBACK, ops=("group_norm", "add_group_norm")),
    Rule("norm_out_silu", ("group_norm",), named(*_NORM_OUT_MODULES), _norm_out_silu_patch,
         claims=("conv_norm_out", "conv_act"), skip=_norm_out_silu_skip, fallback=_GROUP_NORM_FALLBACK,
         ops=("group_norm",)),
    Rule("geglu", ("geglu",), named("GEGLU"), forward_from(_geglu_forward), skip=_geglu_skip, ops=("act_and_mul",)),
    Rule("group_norm", ("group_norm",), named("GroupNorm"), layer_forward("GroupNorm"),
         skip=lambda m: None if _is_group_norm(m) else "not torch.nn.GroupNorm", ops=("group_norm",)),
)
