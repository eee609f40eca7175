"""Swap transformer-kernels into transformers' Llama-family models: ``report = inject(model)``.

Table-driven like the diffusers integration (``RULES``, matched by class-name suffix so Llama,
Mistral, Qwen2 and Qwen3 share one table):

- ``*DecoderLayer``: the attention residual add and ``post_attention_layernorm`` fused
  (``fused_add_rms_norm``); claims that norm.
- ``*MLP`` with ``gate_proj``/``up_proj``/``down_proj`` and a SiLU ``act_fn``: ``act_mul`` between
  the projections (one kernel for ``act_fn(gate) * up``).
- ``*RMSNorm`` with ``variance_epsilon``: the Hub ``RMSNorm`` layer's forward (transformers'
  rounding) for the remaining input norms, Qwen3's per-head q/k norms and the final norm.

RoPE goes through transformers' own hook: ``apply_rotary_pos_emb`` is a hub-replaceable function,
so ``kernelize`` with ``kernel_mapping()`` swaps in our ``RotaryPosEmb`` (and RMSNorm, SiLU).
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch

from .loading import REPO_ID, load_kernel
from .patching import InjectionReport, Rule, apply_rules, forward_from, layer_forward, suffixed

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
    Rule("decoder_layer", suffixed("DecoderLayer"), forward_from(_decoder_layer_forward),
         claims=("post_attention_layernorm",), skip=_decoder_skip),
    Rule("mlp", suffixed("MLP"), forward_from(_mlp_forward), skip=_mlp_skip),
    Rule("rms_norm", suffixed("RMSNorm"), layer_forward("RMSNorm"),
         skip=lambda m: None if hasattr(m, "variance_epsilon") else "no variance_epsilon (not a transformers RMSNorm)"),
)


def inject(model: torch.nn.Module, tk: ModuleType | None = None) -> InjectionReport:
    """Patches a transformers model in place; returns what was replaced and what was left, with why."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"inject: expected a transformers model (torch.nn.Module), got {type(model).__name__}")
    return apply_rules([("", model)], RULES, tk or load_kernel())
