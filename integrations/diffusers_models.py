"""Swap transformer-kernels into diffusers models with one call: ``report = inject(pipe_or_model)``.

Covered: LTX-Video (blocks, attention, FFN, norms) and Flux (AdaLayerNormZero modulation, attention,
FFN, norms); any model's RMSNorm, LayerNorm and GELU modules.

What is replaced is a table (``RULES``): each rule names the module class it matches (by class
name, so both ``diffusers.models.normalization.RMSNorm`` and ``torch.nn.RMSNorm`` are found), and
how it patches an instance. Rules for a containing module run first and claim the modules they
fuse (an LTX block claims its norm1/norm2), so nothing is patched twice.

Patching replaces the instance's ``forward`` (or, under an accelerate hook, the ``_old_forward``
the hook calls, so the hook survives). ``enable_model_cpu_offload`` hooks whole components, so
injecting before or after it works. Weights are read at call time, never cached, so offloading
that moves parameters keeps working.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable

import torch

from .loading import load_kernel

# ---- patched forwards (bound to the module they replace) ----


def _rms_norm_forward(tk: ModuleType) -> Callable:
    def forward(self, hidden_states):
        if isinstance(self, torch.nn.RMSNorm):
            eps = self.eps if self.eps is not None else torch.finfo(torch.float32).eps
            return tk.rms_norm(hidden_states, self.weight, eps, rounding="torch")
        out = tk.rms_norm(hidden_states, self.weight, self.eps, rounding="diffusers")
        return out if getattr(self, "bias", None) is None else out + self.bias

    return forward


def _layer_norm_forward(tk: ModuleType) -> Callable:
    def forward(self, input):
        return tk.layer_norm(input, self.weight, self.bias, self.eps)

    return forward


def _gelu_forward(tk: ModuleType) -> Callable:
    """diffusers' ``GELU`` (input projection, then GELU) or ``torch.nn.GELU``."""

    def forward(self, hidden_states):
        if hasattr(self, "proj"):
            hidden_states = self.proj(hidden_states)
        return tk.gelu(hidden_states, approximate=self.approximate)

    return forward


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


def _adaln_zero_forward(tk: ModuleType) -> Callable:
    """``AdaLayerNormZero`` (Flux, SD3 blocks): the LayerNorm and its modulation in one kernel."""

    def forward(self, x, timestep=None, class_labels=None, hidden_dtype=None, emb=None):
        if self.emb is not None:
            emb = self.emb(timestep, class_labels, hidden_dtype=hidden_dtype)
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
        x = tk.norm_modulate(x, scale_msa[:, None], shift_msa[:, None], norm="layer", weight=self.norm.weight,
                             bias=self.norm.bias, eps=self.norm.eps)
        return x, gate_msa, shift_mlp, scale_mlp, gate_mlp

    return forward


def _adaln_zero_single_forward(tk: ModuleType) -> Callable:
    """``AdaLayerNormZeroSingle`` (Flux single blocks)."""

    def forward(self, x, emb=None):
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa = emb.chunk(3, dim=1)
        x = tk.norm_modulate(x, scale_msa[:, None], shift_msa[:, None], norm="layer", weight=self.norm.weight,
                             bias=self.norm.bias, eps=self.norm.eps)
        return x, gate_msa

    return forward


def _torch_rms_norm(tk: ModuleType, norm: torch.nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps
    return tk.rms_norm(x, norm.weight, eps, rounding="torch")


class FluxAttnProcessor:
    """``FluxAttnProcessor`` with our per-head q/k RMSNorms and Flux's rotary embedding of q and k in
    one launch. Same positional signature as the original."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, tk: ModuleType):
        self.tk = tk

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.transformers.transformer_flux import _get_qkv_projections

        query, key, value, encoder_query, encoder_key, encoder_value = _get_qkv_projections(
            attn, hidden_states, encoder_hidden_states)
        query = _torch_rms_norm(self.tk, attn.norm_q, query.unflatten(-1, (-1, attn.head_dim)))
        key = _torch_rms_norm(self.tk, attn.norm_k, key.unflatten(-1, (-1, attn.head_dim)))
        value = value.unflatten(-1, (-1, attn.head_dim))
        if attn.added_kv_proj_dim is not None:
            encoder_query = _torch_rms_norm(self.tk, attn.norm_added_q, encoder_query.unflatten(-1, (-1, attn.head_dim)))
            encoder_key = _torch_rms_norm(self.tk, attn.norm_added_k, encoder_key.unflatten(-1, (-1, attn.head_dim)))
            encoder_value = encoder_value.unflatten(-1, (-1, attn.head_dim))
            query = torch.cat([encoder_query, query], dim=1)
            key = torch.cat([encoder_key, key], dim=1)
            value = torch.cat([encoder_value, value], dim=1)
        if image_rotary_emb is not None:
            query, key = self.tk.flux_rotary_emb(query, key, *image_rotary_emb)

        hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask,
                                              backend=self._attention_backend, parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is not None:
            encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                [encoder_hidden_states.shape[1], hidden_states.shape[1] - encoder_hidden_states.shape[1]], dim=1)
            hidden_states = attn.to_out[1](attn.to_out[0](hidden_states.contiguous()))
            return hidden_states, attn.to_add_out(encoder_hidden_states.contiguous())
        return hidden_states


class LTXAttnProcessor:
    """``LTXVideoAttnProcessor`` with our q/k RMSNorm (``torch.nn.RMSNorm`` across heads) and the
    LTX rotary embedding of q and k in one launch. Same positional signature as the original."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, tk: ModuleType):
        self.tk = tk

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape)
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states

        query = attn.to_q(hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        query = self._qk_norm(attn.norm_q, query)
        key = self._qk_norm(attn.norm_k, key)
        if image_rotary_emb is not None:
            query, key = self.tk.ltx_rotary_emb(query, key, *image_rotary_emb)

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
        return _torch_rms_norm(self.tk, norm, x)


# ---- the table ----


@dataclass(frozen=True)
class Rule:
    kind: str                                  # what the report calls it
    class_names: tuple[str, ...]               # type(module).__name__ values it matches
    patch: Callable[[torch.nn.Module, ModuleType], None]
    claims: tuple[str, ...] = ()               # child attributes this rule fuses (not patched again)
    applies: Callable[[torch.nn.Module], str | None] = lambda m: None  # reason to skip, or None


def _set_forward(module: torch.nn.Module, make: Callable[[ModuleType], Callable], tk: ModuleType) -> None:
    bound = types.MethodType(make(tk), module)
    if hasattr(module, "_old_forward"):  # an accelerate hook wraps forward: replace what it calls
        module._old_forward = bound
    else:
        module.forward = bound


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


RULES: tuple[Rule, ...] = (
    Rule("ltx_block", ("LTXVideoTransformerBlock",), lambda m, tk: _set_forward(m, _ltx_block_forward, tk),
         claims=("norm1", "norm2")),
    Rule("ltx_attention", ("LTXAttention",), lambda m, tk: m.set_processor(LTXAttnProcessor(tk)),
         claims=("norm_q", "norm_k"), applies=_ltx_attention_skip),
    Rule("flux_attention", ("FluxAttention",), lambda m, tk: m.set_processor(FluxAttnProcessor(tk)),
         claims=("norm_q", "norm_k", "norm_added_q", "norm_added_k"), applies=_flux_attention_skip),
    Rule("adaln_zero", ("AdaLayerNormZero",), lambda m, tk: _set_forward(m, _adaln_zero_forward, tk),
         claims=("norm",), applies=_adaln_skip),
    Rule("adaln_zero_single", ("AdaLayerNormZeroSingle",),
         lambda m, tk: _set_forward(m, _adaln_zero_single_forward, tk), claims=("norm",), applies=_adaln_skip),
    Rule("gelu", ("GELU",), lambda m, tk: _set_forward(m, _gelu_forward, tk), applies=_gelu_skip),
    Rule("rms_norm", ("RMSNorm",), lambda m, tk: _set_forward(m, _rms_norm_forward, tk)),
    Rule("layer_norm", ("LayerNorm", "FP32LayerNorm"), lambda m, tk: _set_forward(m, _layer_norm_forward, tk),
         applies=lambda m: "FP32LayerNorm computes in fp32 on purpose" if type(m).__name__ == "FP32LayerNorm"
         else _layer_norm_skip(m)),
)


@dataclass
class InjectionReport:
    replaced: dict[str, int] = field(default_factory=dict)  # kind -> count
    left: dict[str, str] = field(default_factory=dict)      # module path -> why it was left alone

    def __str__(self) -> str:
        lines = ["replaced: " + (", ".join(f"{n} {k}" for k, n in sorted(self.replaced.items())) or "nothing")]
        lines += [f"left {path}: {why}" for path, why in sorted(self.left.items())]
        return "\n".join(lines)


def _models(pipe_or_model) -> list[tuple[str, torch.nn.Module]]:
    if isinstance(pipe_or_model, torch.nn.Module):
        return [("", pipe_or_model)]
    components = getattr(pipe_or_model, "components", None)
    if not isinstance(components, dict):
        raise TypeError(f"inject: expected a diffusers pipeline or a torch.nn.Module, got {type(pipe_or_model).__name__}")
    return [(name, m) for name, m in components.items() if isinstance(m, torch.nn.Module)]


def inject(pipe_or_model, tk: ModuleType | None = None) -> InjectionReport:
    """Patches every supported module of a pipeline's components (or of one model) in place.

    Returns what was replaced, by kind, and the matching modules left alone with the reason."""
    tk = tk or load_kernel()
    report = InjectionReport()
    by_class = {name: rule for rule in RULES for name in rule.class_names}
    for prefix, model in _models(pipe_or_model):
        claimed: set[int] = set()
        for path, module in model.named_modules(prefix=prefix):
            rule = by_class.get(type(module).__name__)
            if rule is None or id(module) in claimed:
                continue
            reason = rule.applies(module)
            if reason is not None:
                report.left[path or type(module).__name__] = reason
                continue
            rule.patch(module, tk)
            report.replaced[rule.kind] = report.replaced.get(rule.kind, 0) + 1
            claimed.update(id(getattr(module, child)) for child in rule.claims if hasattr(module, child))
    return report
