"""Swap transformer-kernels into transformers' Llama-family models: ``report = inject(model)``.

Table-driven like the diffusers integration (``RULES``, matched by class-name suffix so Llama,
Mistral, Qwen2 and Qwen3 share one table):

- ``*DecoderLayer``: the attention residual add and ``post_attention_layernorm`` fused
  (``fused_add_rms_norm``); claims that norm.
- ``*MLP`` with ``gate_proj``/``up_proj``/``down_proj`` and a SiLU ``act_fn``: ``act_mul`` between
  the projections (one kernel for ``act_fn(gate) * up``).
- ``*RMSNorm`` with ``variance_epsilon``: ``rms_norm`` with transformers' rounding (the remaining
  input norms, Qwen3's per-head q/k norms, the final norm).

RoPE goes through transformers' own hook: ``apply_rotary_pos_emb`` is a hub-replaceable function,
so ``kernelize`` with ``kernel_mapping()`` swaps in our ``RotaryPosEmb`` (and RMSNorm, SiLU).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from types import ModuleType
from typing import Callable

import torch

from .diffusers_models import InjectionReport
from .loading import REPO_ID, load_kernel

# transformers' hub layer names -> our layers, for kernels.use_kernel_mapping + kernelize (the Hub
# path). revision="v1" names the branch version=1 resolves to, which also works offline with
# LOCAL_KERNELS (kernels 0.17 resolves version= on the Hub even then).
HUB_LAYERS = {"RMSNorm": "RMSNorm", "rotary_pos_emb": "RotaryPosEmb", "SiLU": "Silu", "GeluTanh": "GeluTanh"}


def kernel_mapping(device: str = "cuda") -> dict:
    """The mapping for ``kernels.use_kernel_mapping``: every transformers hub layer we implement."""
    from kernels import LayerRepository

    return {name: {device: LayerRepository(REPO_ID, layer_name=layer, revision="v1")}
            for name, layer in HUB_LAYERS.items()}


def _decoder_layer_forward(tk: ModuleType) -> Callable:
    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids, cache=cache, use_cache=use_cache,
                                          position_embeddings=position_embeddings, **kwargs)
        norm = self.post_attention_layernorm
        hidden_states, residual = tk.fused_add_rms_norm(hidden_states, residual, norm.weight, norm.variance_epsilon)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states

    return forward


def _mlp_forward(tk: ModuleType) -> Callable:
    def forward(self, x):
        return self.down_proj(tk.act_mul(self.gate_proj(x), self.up_proj(x), "silu"))

    return forward


def _rms_norm_forward(tk: ModuleType) -> Callable:
    def forward(self, hidden_states):
        return tk.rms_norm(hidden_states, self.weight, self.variance_epsilon, rounding="hf")

    return forward


@dataclass(frozen=True)
class Rule:
    kind: str
    suffix: str                                  # type(module).__name__ ends with it
    make_forward: Callable[[ModuleType], Callable]
    claims: tuple[str, ...] = ()
    applies: Callable[[torch.nn.Module], str | None] = lambda m: None


def _decoder_skip(m) -> str | None:
    needed = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")
    if not all(hasattr(m, a) for a in needed):
        return "not a pre-norm decoder layer (input_layernorm, self_attn, post_attention_layernorm, mlp)"
    return None if hasattr(m.post_attention_layernorm, "variance_epsilon") else "post-attention norm is not an RMSNorm"


def _mlp_skip(m) -> str | None:
    if not all(hasattr(m, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return "not a gated MLP (gate_proj, up_proj, down_proj, act_fn)"
    act = m.act_fn
    is_silu = isinstance(act, torch.nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")
    return None if is_silu else f"activation {type(act).__name__} is not SiLU"


RULES: tuple[Rule, ...] = (
    Rule("decoder_layer", "DecoderLayer", _decoder_layer_forward, claims=("post_attention_layernorm",),
         applies=_decoder_skip),
    Rule("mlp", "MLP", _mlp_forward, applies=_mlp_skip),
    Rule("rms_norm", "RMSNorm", _rms_norm_forward,
         applies=lambda m: None if hasattr(m, "variance_epsilon") else "no variance_epsilon (not a transformers RMSNorm)"),
)


def _set_forward(module: torch.nn.Module, make: Callable[[ModuleType], Callable], tk: ModuleType) -> None:
    bound = types.MethodType(make(tk), module)
    if hasattr(module, "_old_forward"):  # accelerate hook (device_map="auto", offloading): keep it
        module._old_forward = bound
    else:
        module.forward = bound


def inject(model: torch.nn.Module, tk: ModuleType | None = None) -> InjectionReport:
    """Patches a transformers model in place; returns what was replaced and what was left, with why."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"inject: expected a transformers model (torch.nn.Module), got {type(model).__name__}")
    tk = tk or load_kernel()
    report = InjectionReport()
    claimed: set[int] = set()
    for path, module in model.named_modules():
        name = type(module).__name__
        rule = next((r for r in RULES if name.endswith(r.suffix)), None)
        if rule is None or id(module) in claimed:
            continue
        reason = rule.applies(module)
        if reason is not None:
            report.left[path or name] = reason
            continue
        _set_forward(module, rule.make_forward, tk)
        report.replaced[rule.kind] = report.replaced.get(rule.kind, 0) + 1
        claimed.update(id(getattr(module, child)) for child in rule.claims if hasattr(module, child))
    return report
