"""Swap transformer-kernels into diffusers models with one call: ``report = inject(pipe_or_model)``.

Covered: LTX-Video (blocks, attention, FFN, norms) and Flux (AdaLayerNormZero modulation, attention,
FFN, norms); Stable Diffusion 1.5/XL UNets and their VAE (ResNet blocks, GroupNorm + SiLU, GEGLU:
``diffusers_sd.py``); any model's RMSNorm, LayerNorm, GroupNorm and GELU modules.

What is replaced is a table (``RULES``): each rule names the switches it needs, the module class
it matches (by class name, so both ``diffusers.models.normalization.RMSNorm`` and
``torch.nn.RMSNorm`` are found), and how it patches an instance. Rules for a containing module run
first and claim the modules they fuse (an LTX block claims its norm1/norm2), so nothing is patched
twice. Switches (``inject(pipe, rms_norm=..., layer_norm=..., rope=..., qk_norm_rope=..., gelu=...,
norm_modulate=..., merge_projections=..., linear_gelu=..., group_norm=..., geglu=...)``, all on by
default) turn op kinds off; ``uninject`` undoes everything.

How modules are patched (and how hooks survive) is in ``patching.py``. ``enable_model_cpu_offload``
hooks whole components, so injecting before or after it works. Tensors off the GPU run diffusers'
own forwards and processors (``KERNEL_DEVICES``; a logged fallback counted in the report,
``KernelFallbackError`` under ``strict=True``): a model on the CPU never reaches a kernel.

``merge_projections`` (``ltx_merged_projections``, ``flux_merged_projections``: rules that add to a
module, ``also=True``) makes the LTX self-attention's q/k/v, its cross-attention's k/v, and Flux's
q/k/v and added q/k/v one GEMM each over one concatenated weight that the original parameters
become views of (``merging.py``; no memory growth), used where no gradient is wanted (else the
separate projections: a logged fallback); ``uninject`` gives each parameter, the same object,
storage of its own again with its current values. ``linear_gelu`` (with ``gelu``) runs a
``GELU(approximate="tanh")`` module's input projection and activation as one cuBLASLt GEMM with the
GELU epilogue (the FFNs of LTX-Video, Flux and SD3). The epilogue rounds once where eager rounds
twice, so with it the output is close to, not bit-equal with, eager's.

Training (``inject(model)`` on a model in training mode, or ``training=True``, e.g. LoRA fine-tuning):
a rule is applied only when the ops it needs (``RULE_OPS``) have a backward; the attention
processors run the q/k norms with our kernels where those have a backward and with the modules'
own norms otherwise, and the rotations with ours. The merged projections stay (the separate
projections run under grad, a logged fallback), except under ``strict=True``, where they are skipped.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import ModuleType
from typing import Callable, NamedTuple

import torch

from . import merging
from .diffusers_sd import SD_RULE_OPS, SD_RULES
from .loading import load_kernel
from .patching import (InjectionReport, Rule, apply_rules, check_switches, for_training, forward_from, layer_forward,
                       named, switches_of, uninject_models)

QKV = ("to_q", "to_k", "to_v")
KV = ("to_k", "to_v")
ADDED_QKV = ("add_q_proj", "add_k_proj", "add_v_proj")

# ---- patched forwards (bound to the module they replace) ----


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
    fallback)."""
    tk = inj.tk

    def forward(self, hidden_states):
        proj = self.proj
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


def _merged(attn, key: str, x: torch.Tensor):
    """The merged projection ``key`` of attn where it can run for x (no gradient wanted), or None
    (a merge that cannot run reports it: ``MergedLinear.use``)."""
    merged = merging.merged_of(attn, key)
    return merged if merged is not None and merged.use(x) else None


def _ltx_block_forward(tk: ModuleType) -> Callable:
    """``LTXVideoTransformerBlock.forward`` with the modulations and residuals fused:
    norm1 + AdaLN in one kernel, the gated attention residual, the cross-attention residual fused
    with norm2 + AdaLN, and the gated FFN residual."""

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                encoder_attention_mask=None):
        batch_size = hidden_states.size(0)
        num_ada_params = self.scale_shift_table.shape[0]
        ada_values = self.scale_shift_table[None, None].to(temb.device) + temb.reshape(
            batch_size, temb.size(1), num_ada_params, -1)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = ada_values.unbind(dim=2)

        norm_hidden_states = tk.norm_modulate(hidden_states, scale_msa, shift_msa, norm="rms",
                                              weight=self.norm1.weight, eps=self.norm1.eps)
        attn_hidden_states = self.attn1(hidden_states=norm_hidden_states, encoder_hidden_states=None,
                                        image_rotary_emb=image_rotary_emb)
        hidden_states = tk.gated_add(hidden_states, attn_hidden_states, gate_msa)
        attn_hidden_states = self.attn2(hidden_states, encoder_hidden_states=encoder_hidden_states,
                                        image_rotary_emb=None, attention_mask=encoder_attention_mask)
        hidden_states, norm_hidden_states = tk.gated_add_norm_modulate(
            hidden_states, attn_hidden_states, None, scale_mlp, shift_mlp, norm="rms",
            weight=self.norm2.weight, eps=self.norm2.eps)
        ff_output = self.ff(norm_hidden_states)
        return tk.gated_add(hidden_states, ff_output, gate_mlp)

    return forward


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


def _torch_rms_norm(tk: ModuleType, norm: torch.nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """A q/k ``torch.nn.RMSNorm`` through the Hub layer's forward (torch rounding, its eps=None)."""
    return tk.layers.RMSNorm.forward(norm, x)


class _KernelProcessor:
    """Base of our attention processors. ``Injection.set_processor`` gives it the processor it
    replaces and the devices our kernels take: hidden states elsewhere run the replaced one (a
    logged fallback; ``KernelFallbackError`` under ``strict=True``)."""

    replaced = None
    kernel_devices: Callable[[], tuple[str, ...]] = None
    off_device: Callable[[torch.device], None] = None

    def _replaced_for(self, hidden_states: torch.Tensor):
        """The replaced processor where `hidden_states` is off the kernel devices, else None."""
        if self.replaced is None or hidden_states.device.type in self.kernel_devices():
            return None
        self.off_device(hidden_states.device)
        return self.replaced


class FluxAttnProcessor(_KernelProcessor):
    """``FluxAttnProcessor`` with our per-head q/k RMSNorms and Flux's rotary embedding of q and k in
    one launch. Same positional signature as the original."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, tk: ModuleType, ours: Callable[[str], bool] = lambda op: True):
        self.tk = tk
        self.ours = ours  # which ops to run (training: those with a backward); the others run eager

    def _qk_norm(self, norm: torch.nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
        return _torch_rms_norm(self.tk, norm, x) if self.ours("rms_norm") else norm(x)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.transformers.transformer_flux import _get_qkv_projections

        replaced = self._replaced_for(hidden_states)
        if replaced is not None:
            return replaced(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)

        qkv = _merged(attn, "qkv", hidden_states)
        added = _merged(attn, "added_qkv", encoder_hidden_states) if encoder_hidden_states is not None else None
        if qkv is not None and (added is not None or encoder_hidden_states is None or attn.added_kv_proj_dim is None):
            query, key, value = qkv.split(hidden_states)  # strided views of one GEMM's output
            encoder_query = encoder_key = encoder_value = None
            if added is not None:
                encoder_query, encoder_key, encoder_value = added.split(encoder_hidden_states)
        else:
            query, key, value, encoder_query, encoder_key, encoder_value = _get_qkv_projections(
                attn, hidden_states, encoder_hidden_states)
        query = self._qk_norm(attn.norm_q, query.unflatten(-1, (-1, attn.head_dim)))
        key = self._qk_norm(attn.norm_k, key.unflatten(-1, (-1, attn.head_dim)))
        value = value.unflatten(-1, (-1, attn.head_dim))
        if attn.added_kv_proj_dim is not None:
            encoder_query = self._qk_norm(attn.norm_added_q, encoder_query.unflatten(-1, (-1, attn.head_dim)))
            encoder_key = self._qk_norm(attn.norm_added_k, encoder_key.unflatten(-1, (-1, attn.head_dim)))
            encoder_value = encoder_value.unflatten(-1, (-1, attn.head_dim))
            query = torch.cat([encoder_query, query], dim=1)
            key = torch.cat([encoder_key, key], dim=1)
            value = torch.cat([encoder_value, value], dim=1)
        if image_rotary_emb is not None:
            query, key = self.tk.flux_rope(query, key, *image_rotary_emb)

        hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask,
                                              backend=self._attention_backend, parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is not None:
            encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                [encoder_hidden_states.shape[1], hidden_states.shape[1] - encoder_hidden_states.shape[1]], dim=1)
            hidden_states = attn.to_out[1](attn.to_out[0](hidden_states.contiguous()))
            return hidden_states, attn.to_add_out(encoder_hidden_states.contiguous())
        return hidden_states


def _fused_qk_norm_eps(norm_q: torch.nn.RMSNorm, norm_k: torch.nn.RMSNorm) -> float | None:
    """The eps the fused q/k norm + RoPE kernel uses, or None when the two norms cannot share one
    launch (no weight, or different eps). ``eps=None`` is ATen's fp32 epsilon, as in F.rms_norm."""
    if norm_q.weight is None or norm_k.weight is None or norm_q.eps != norm_k.eps:
        return None
    return norm_q.eps if norm_q.eps is not None else torch.finfo(torch.float32).eps


class LTXAttnProcessor(_KernelProcessor):
    """``LTXVideoAttnProcessor`` with our q/k RMSNorm (``torch.nn.RMSNorm`` across heads) and the
    LTX rotary embedding: in self-attention one launch for both norms and the rotation of q and k,
    otherwise the norms, then the rotation. Same positional signature as the original.

    ``fuse=False``: the norms and the rotation as separate kernels; ``qk_norm=False``: the norm
    modules' own forwards, then our rotation (the ``rms_norm`` or ``qk_norm_rope`` switch off)."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, tk: ModuleType, fuse: bool = True, qk_norm: bool = True,
                 ours: Callable[[str], bool] = lambda op: True):
        self.tk, self.fuse, self.qk_norm = tk, fuse and qk_norm, qk_norm
        self.ours = ours  # which ops to run (training: those with a backward); the others run eager

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        replaced = self._replaced_for(hidden_states)
        if replaced is not None:
            return replaced(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape)
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])

        self_attention = encoder_hidden_states is None
        qkv = _merged(attn, "qkv", hidden_states) if self_attention else None
        kv = _merged(attn, "kv", encoder_hidden_states) if not self_attention else None
        if self_attention:
            encoder_hidden_states = hidden_states
        if qkv is not None:  # one GEMM; q, k, v are strided views of its output
            query, key, value = qkv.split(hidden_states)
        else:
            query = attn.to_q(hidden_states)
            key, value = kv.split(encoder_hidden_states) if kv is not None else (
                attn.to_k(encoder_hidden_states), attn.to_v(encoder_hidden_states))
        eps = _fused_qk_norm_eps(attn.norm_q, attn.norm_k)
        # image_rotary_emb: the rope module's (cos, sin) tables, or its coordinates (LTXRopeCoords)
        # where inject patched the rope module (the kernel then computes cos/sin itself)
        from_coords = isinstance(image_rotary_emb, LTXRopeCoords)
        fused_op = "ltx_qk_norm_rope_from_coords" if from_coords else "qk_norm_rope"
        if (self.fuse and image_rotary_emb is not None and eps is not None and query.shape[1] == key.shape[1]
                and self.ours(fused_op)):
            # self-attention: both norms and the rotation in one launch
            fused = self.tk.ltx_qk_norm_rope_from_coords if from_coords else self.tk.ltx_qk_norm_rope
            query, key = fused(query, key, attn.norm_q.weight, attn.norm_k.weight, eps, *image_rotary_emb)
        else:
            query = self._qk_norm(attn.norm_q, query)
            key = self._qk_norm(attn.norm_k, key)
            if image_rotary_emb is not None:
                rotate = self.tk.ltx_rope_from_coords if from_coords else self.tk.ltx_rope
                query, key = rotate(query, key, *image_rotary_emb)

        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0,
                                              is_causal=False, backend=self._attention_backend,
                                              parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        hidden_states = attn.to_out[0](hidden_states)
        return attn.to_out[1](hidden_states)

    def _qk_norm(self, norm: torch.nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
        return _torch_rms_norm(self.tk, norm, x) if self.qk_norm and self.ours("rms_norm") else norm(x)


class LTXRopeCoords(NamedTuple):
    """What ``LTXVideoRotaryPosEmbed`` builds its fp32 cos/sin tables from, for the kernels'
    ``ltx_*_from_coords`` ops: ``grid`` ``[B, S, 3]`` float32 (frame, height, width per token, a
    strided view) and ``freqs`` ``[dim // 6]`` float32."""

    grid: torch.Tensor
    freqs: torch.Tensor


def ltx_rope_coords(rope: torch.nn.Module, hidden_states: torch.Tensor, num_frames: int | None = None,
                    height: int | None = None, width: int | None = None, rope_interpolation_scale=None,
                    video_coords: torch.Tensor | None = None) -> LTXRopeCoords:
    """``LTXVideoRotaryPosEmbed.forward`` up to (not including) its angles: the same arguments, and
    the same float32 ops on the same device (the grid through the module's own
    ``_prepare_video_coords``), so the kernels' cos/sin equal the module's tables bit for bit
    (tests/test_rope.py checks that on the GPU). ``inject`` makes it the rope module's forward when
    every attention of the model takes our processor (``_ltx_rope_coords_patch``)."""
    if video_coords is None:
        grid = rope._prepare_video_coords(hidden_states.size(0), num_frames, height, width,
                                          rope_interpolation_scale=rope_interpolation_scale,
                                          device=hidden_states.device)
    else:
        grid = torch.stack([video_coords[:, 0] / rope.base_num_frames, video_coords[:, 1] / rope.base_height,
                            video_coords[:, 2] / rope.base_width], dim=-1)
    freqs = rope.theta ** torch.linspace(math.log(1.0, rope.theta), math.log(rope.theta, rope.theta), rope.dim // 6,
                                         device=hidden_states.device, dtype=torch.float32)
    return LTXRopeCoords(grid, freqs * math.pi / 2.0)


# ---- the table ----


def _ltx_attention_skip(m: torch.nn.Module) -> str | None:
    if not isinstance(getattr(m, "norm_q", None), torch.nn.RMSNorm):
        return "q/k norm is not torch.nn.RMSNorm (not the LTX-Video 0.9 attention)"
    return None


def _gelu_skip(m: torch.nn.Module) -> str | None:
    return None if getattr(m, "approximate", None) in ("none", "tanh") else "unknown GELU approximation"


def _flux_attention_skip(m: torch.nn.Module) -> str | None:
    if type(getattr(m, "processor", None)).__name__ != "FluxAttnProcessor":
        return f"processor {type(getattr(m, 'processor', None)).__name__} is not the default FluxAttnProcessor"
    if not isinstance(getattr(m, "norm_q", None), torch.nn.RMSNorm):
        return "q/k norm is not torch.nn.RMSNorm"
    return None


def _adaln_skip(m: torch.nn.Module) -> str | None:
    return None if type(getattr(m, "norm", None)) is torch.nn.LayerNorm else "its norm is not a plain LayerNorm"


def _layer_norm_skip(m: torch.nn.Module) -> str | None:
    return None if len(m.normalized_shape) == 1 else "normalizes more than the last dimension"


def _ltx_rope_skip(model: torch.nn.Module) -> str | None:
    if type(getattr(model, "rope", None)).__name__ != "LTXVideoRotaryPosEmbed":
        return "its rope module is not LTXVideoRotaryPosEmbed"
    if getattr(model, "_parallel_config", None) is not None:  # its plan splits the rope's two [B, S, C] tables
        return "context parallelism splits the rope tables along the sequence"
    # The coordinates reach every attention of the model: each must take our processor, which
    # tells coordinates from tables (diffusers' processors take only tables).
    attentions = [m for m in model.modules() if type(m).__name__ == "LTXAttention"]
    reasons = {why for why in map(_ltx_attention_skip, attentions) if why is not None}
    return f"its attention keeps diffusers' processor ({'; '.join(sorted(reasons))})" if reasons else None


def _ltx_rope_coords_patch(model: torch.nn.Module, inj) -> None:
    """The rope module returns the coordinates its tables come from (``ltx_rope_coords``), not
    the fp32 tables: the attention kernels compute cos/sin from them, reading 2 x 4 bytes per
    channel less per token for each of q and k, and the tables are never built."""
    inj.set_forward(model.rope, ltx_rope_coords)


def _ltx_merged_projections_skip(block: torch.nn.Module) -> str | None:
    """Why neither attention of an LTX block merges: its self-attention (attn1) merges q/k/v, its
    cross-attention (attn2) k/v (they read the caption; q reads the video tokens), each where it
    takes our processor and its projections can merge."""
    reasons = []
    for name, names in (("attn1", QKV), ("attn2", KV)):
        attn = getattr(block, name, None)
        why = (f"no {name}" if attn is None else _ltx_attention_skip(attn) or merging.mergeable(attn, names))
        if why is None:
            return None
        reasons.append(f"{name}: {why}")
    return "; ".join(reasons)


def _merge_ltx_block(block: torch.nn.Module, inj) -> None:
    for name, key, names in (("attn1", "qkv", QKV), ("attn2", "kv", KV)):
        attn = getattr(block, name, None)
        if attn is not None and _ltx_attention_skip(attn) is None and merging.mergeable(attn, names) is None:
            inj.merge(attn, key, names, "ltx_merged_projections")


def _merge_flux_attention(attn: torch.nn.Module, inj) -> None:
    inj.merge(attn, "qkv", QKV, "flux_merged_projections")
    if getattr(attn, "added_kv_proj_dim", None) is not None and merging.mergeable(attn, ADDED_QKV) is None:
        inj.merge(attn, "added_qkv", ADDED_QKV, "flux_merged_projections")


def _processor(cls: type, **options) -> Callable[[torch.nn.Module, object], None]:
    """A patch that gives the attention module ``cls(tk, **options)``, told which ops to run
    (``Injection.ours``: in training, those with a backward)."""
    return lambda module, inj: inj.set_processor(module, cls(inj.tk, ours=inj.ours, **options))


_ADALN = ("layer_norm", "norm_modulate")  # a LayerNorm and its modulation in one kernel
_MERGED_FALLBACK = "where gradients are wanted, the separate projections"

RULES: tuple[Rule, ...] = (
    Rule("ltx_rope_coords", ("rope",), named("LTXVideoTransformer3DModel"), _ltx_rope_coords_patch,
         skip=_ltx_rope_skip),
    # also=True: merges the projections its attentions' processor (any LTX attention rule below; all
    # need rope) reads, and leaves the block to ltx_block
    Rule("ltx_merged_projections", ("merge_projections", "rope"), named("LTXVideoTransformerBlock"),
         _merge_ltx_block, skip=_ltx_merged_projections_skip, fallback=_MERGED_FALLBACK, also=True),
    Rule("ltx_block", ("rms_norm", "norm_modulate"), named("LTXVideoTransformerBlock"),
         forward_from(_ltx_block_forward), claims=("norm1", "norm2")),
    Rule("ltx_attention", ("rms_norm", "rope", "qk_norm_rope"), named("LTXAttention"),
         _processor(LTXAttnProcessor), claims=("norm_q", "norm_k"), skip=_ltx_attention_skip),
    Rule("ltx_attention_unfused", ("rms_norm", "rope"), named("LTXAttention"),
         _processor(LTXAttnProcessor, fuse=False), claims=("norm_q", "norm_k"),
         skip=_ltx_attention_skip),
    Rule("ltx_attention_rope", ("rope",), named("LTXAttention"),
         _processor(LTXAttnProcessor, qk_norm=False), skip=_ltx_attention_skip),
    # also=True: q/k/v (and the added q/k/v) as one GEMM each, read by the flux_attention processor
    Rule("flux_merged_projections", ("merge_projections", "rms_norm", "rope"), named("FluxAttention"),
         _merge_flux_attention, skip=lambda m: _flux_attention_skip(m) or merging.mergeable(m, QKV),
         fallback=_MERGED_FALLBACK, also=True),
    Rule("flux_attention", ("rms_norm", "rope"), named("FluxAttention"), _processor(FluxAttnProcessor),
         claims=("norm_q", "norm_k", "norm_added_q", "norm_added_k"), skip=_flux_attention_skip),
    Rule("adaln_zero", _ADALN, named("AdaLayerNormZero"), forward_from(_adaln_zero_forward), claims=("norm",),
         skip=_adaln_skip),
    Rule("adaln_zero_single", _ADALN, named("AdaLayerNormZeroSingle"), forward_from(_adaln_zero_single_forward),
         claims=("norm",), skip=_adaln_skip),
    Rule("sd35_adaln_zero_x", _ADALN, named("SD35AdaLayerNormZeroX"), forward_from(_sd35_adaln_zero_x_forward),
         claims=("norm",), skip=_adaln_skip),
    Rule("adaln_continuous", _ADALN, named("AdaLayerNormContinuous"), forward_from(_adaln_continuous_forward),
         claims=("norm",), skip=_adaln_skip),
    # Stable Diffusion's UNet and VAE (diffusers_sd.py): switches group_norm and geglu
    *SD_RULES,
    Rule("linear_gelu", ("gelu", "linear_gelu"), named("GELU"), _patch_linear_gelu, skip=_linear_gelu_skip,
         fallback="an input of another dtype than the projection's weight, or autocast: the projection, then "
                  "the gelu kernel"),
    Rule("gelu", ("gelu",), named("GELU"), forward_from(_gelu_forward), skip=_gelu_skip),
    Rule("rms_norm", ("rms_norm",), named("RMSNorm"), layer_forward("RMSNorm")),
    Rule("layer_norm", ("layer_norm",), named("LayerNorm", "FP32LayerNorm"), layer_forward("LayerNorm"),
         skip=lambda m: "FP32LayerNorm computes in fp32 on purpose" if type(m).__name__ == "FP32LayerNorm"
         else _layer_norm_skip(m)),
)

# Tensors off these devices run diffusers' own code (Rule.kernel_devices): a model on the CPU never
# reaches a kernel. The merges need no guard: their GEMM runs anywhere.
KERNEL_DEVICES = ("cuda",)
_OFF_GPU = "tensors off the GPU: diffusers' own code"


def _kernel_devices() -> tuple[str, ...]:
    return KERNEL_DEVICES


RULES = tuple(rule if rule.kind.endswith("_merged_projections") else
              replace(rule, kernel_devices=_kernel_devices,
                      fallback=f"{rule.fallback}; {_OFF_GPU}" if rule.fallback else _OFF_GPU)
              for rule in RULES)

SWITCHES = switches_of(RULES)

# The ops each rule needs under grad (the C++ ops' names): in training a rule is applied only when
# all have a backward. The attention processors' q/k norms are not listed: without a backward they
# run the modules' own norms.
RULE_OPS: dict[str, tuple[str, ...]] = {
    "ltx_rope_coords": ("ltx_rope_from_coords",),
    "ltx_merged_projections": (),  # no op of ours: the separate projections run under grad
    "ltx_block": ("norm_modulate", "gated_add", "gated_add_norm_modulate"),
    "ltx_attention": ("rope", "ltx_rope_from_coords"),
    "ltx_attention_unfused": ("rope", "ltx_rope_from_coords"),
    "ltx_attention_rope": ("rope", "ltx_rope_from_coords"),
    "flux_merged_projections": (),
    "flux_attention": ("rope",),
    "adaln_zero": ("norm_modulate",),
    "adaln_zero_single": ("norm_modulate",),
    "sd35_adaln_zero_x": ("norm_modulate",),
    "adaln_continuous": ("norm_modulate",),
    "linear_gelu": ("linear_gelu",),
    "gelu": ("activation",),
    "rms_norm": ("rms_norm",),
    "layer_norm": ("layer_norm",),
    **SD_RULE_OPS,
}


def components(pipe_or_model) -> list[tuple[str, torch.nn.Module]]:
    """(name, model) of a pipeline's torch components, or ("", model) for one model."""
    if isinstance(pipe_or_model, torch.nn.Module):
        return [("", pipe_or_model)]
    found = getattr(pipe_or_model, "components", None)
    if not isinstance(found, dict):
        raise TypeError(f"inject: expected a diffusers pipeline or a torch.nn.Module, got {type(pipe_or_model).__name__}")
    return [(name, m) for name, m in found.items() if isinstance(m, torch.nn.Module)]


def rules_for(tk: ModuleType, training: bool, strict: bool = False) -> tuple[Rule, ...]:
    """The table ``inject`` applies: ``RULES``, or in training ``for_training``'s gating of them."""
    return for_training(RULES, RULE_OPS, tk, strict=strict) if training else RULES


def inject(pipe_or_model, tk: ModuleType | None = None, *, strict: bool = False, training: bool | None = None,
           **switches: bool) -> InjectionReport:
    """Patches every supported module of a pipeline's components (or of one model) in place.

    Returns what was replaced, by kind, the matching modules skipped with the reason, and which
    patched paths can fall back at run time. Switches (keywords, all on by default; ``False`` leaves
    that op kind to diffusers): {switches}. ``strict=True``: a run-time fallback raises.
    ``training`` (default: whether any of the models is in training mode): only the rules whose ops
    have a backward (see the module docstring). Undo with ``uninject``."""
    on = check_switches(switches, SWITCHES, "inject")
    models = components(pipe_or_model)
    tk = tk or load_kernel()
    if training is None:
        training = any(m.training for _, m in models)
    rules = rules_for(tk, training, strict)
    return apply_rules([(name, m, rules) for name, m in models], tk, switches=on, strict=strict, training=training)


inject.__doc__ = inject.__doc__.format(switches=", ".join(f"``{s}``" for s in SWITCHES))


def uninject(pipe_or_model) -> int:
    """Restores every forward and processor ``inject`` patched; returns how many changes were undone."""
    return uninject_models([m for _, m in components(pipe_or_model)])
