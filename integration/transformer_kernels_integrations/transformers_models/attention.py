"""The Llama-family attention forward from the projections to ``o_proj``, as transformers' own
(cache update, the ``ALL_ATTENTION_FUNCTIONS`` interface, ``o_proj``), with q/k/v as one GEMM where
the projections are merged and, for Qwen3's per-head q/k norms, the norms and the rotation as one
kernel. Llama, Mistral and Qwen2 (``llama.py``) and Qwen3 (``qwen3.py``) patch their attention
with it.
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Callable

import torch

from . import kernel_devices

QKV = ("q_proj", "k_proj", "v_proj")

# The KV-cache argument of the attention forward, by transformers version: "cache" (5.x, whose
# Cache.update takes the attention kwargs), "past_key_values" or "past_key_value" (4.x, whose update
# takes a cache_kwargs dict with the RoPE tables and cache_position).
_CACHE_ARGS = ("cache", "past_key_values", "past_key_value")


def _cache_arg(forward: Callable) -> str | None:
    params = inspect.signature(forward).parameters
    return next((name for name in _CACHE_ARGS if name in params), None)


def _attention_interface(modeling: ModuleType, implementation: str) -> Callable:
    """The attention function the modeling module's own forward would pick."""
    functions = modeling.ALL_ATTENTION_FUNCTIONS
    if hasattr(functions, "get_interface"):  # transformers 5
        return functions.get_interface(implementation, modeling.eager_attention_forward)
    return modeling.eager_attention_forward if implementation == "eager" else functions[implementation]


def _kernel_unsupported(hidden_states: torch.Tensor) -> str | None:
    """Why the kernels cannot take these tensors (transformers' forward then runs), or None."""
    if hidden_states.device.type not in kernel_devices():
        return f"tensors on {hidden_states.device.type}"
    if torch.is_autocast_enabled(hidden_states.device.type):
        return "autocast is on"
    return None


def _qk_norm_unsupported(hidden_states, q_norm, k_norm, cos) -> str | None:
    """Why the fused q/k norm + RoPE kernel cannot take these tensors, or None."""
    why = _kernel_unsupported(hidden_states)
    if why is not None:
        return why
    # an fp32 norm weight makes eager's q fp32; the kernel keeps q's dtype
    dtype = hidden_states.dtype
    for what, t in (("q_norm weight", q_norm.weight), ("k_norm weight", k_norm.weight), ("cos", cos)):
        if t.dtype != dtype:
            return f"{what} is {t.dtype}, hidden_states {dtype}"
    return None


def patch_attention(module: torch.nn.Module, inj, kind: str, qk_norm: bool, merge: bool) -> None:
    """The attention forward from the projections to o_proj, as transformers' own (cache update,
    the ``ALL_ATTENTION_FUNCTIONS`` interface, o_proj), with q/k/v as one GEMM where ``merge`` (the
    outputs strided views of it) and, for Qwen3 (``qk_norm``), q_norm/k_norm and the rotation as
    one kernel (``hf_qk_norm_rope``). Tensors the kernels do not take (CPU, mixed dtypes, autocast)
    run transformers' own forward, and calls that need gradients of merged weights the separate
    projections: fallbacks of `kind` (logged once, or raised under strict)."""
    tk = inj.tk
    modeling = sys.modules[type(module).__module__]
    original = type(module).forward
    cache_arg = _cache_arg(original)
    merged = inj.merge(module, "qkv", QKV, kind) if merge else None
    # Qwen2/Qwen3 keep the window per layer, Mistral reads its config's, Llama has none. Read once:
    # a hasattr on an nn.Module that lacks the attribute raises and catches, at every call.
    window = module.__dict__.get("sliding_window", getattr(module.config, "sliding_window", None))

    # Arguments after position_embeddings pass through by keyword, as the decoder layer gives them.
    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
        cos, sin = position_embeddings
        dtype = hidden_states.dtype
        device_type = hidden_states.device.type
        kernel_ok = device_type in kernel_devices() and not torch.is_autocast_enabled(device_type)
        fused_norm = qk_norm and kernel_ok and (self.q_norm.weight.dtype == dtype and self.k_norm.weight.dtype == dtype
                                                and cos.dtype == dtype)
        use_merged = merged is not None and kernel_ok and merged.use(hidden_states)  # use(): reports why not
        if not (fused_norm or use_merged):
            # transformers' own forward for other devices, autocast and mixed dtypes (an fp32 norm
            # weight makes eager's q fp32; the kernel keeps q's dtype)
            why = (_qk_norm_unsupported(hidden_states, self.q_norm, self.k_norm, cos) if qk_norm
                   else _kernel_unsupported(hidden_states))
            if why is not None:  # else gradients are wanted (merged, Llama-like): use() said so
                inj.fallback(kind, why)
            return original(self, hidden_states, position_embeddings, attention_mask, **kwargs)
        if qk_norm and not fused_norm:  # merged projections, then transformers' q/k norms and rotation
            inj.fallback(kind, _qk_norm_unsupported(hidden_states, self.q_norm, self.k_norm, cos),
                         instead="transformers' q/k norms and rotation")
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        if use_merged:
            query_states, key_states, value_states = merged.split(hidden_states)
        else:
            query_states, key_states, value_states = (self.q_proj(hidden_states), self.k_proj(hidden_states),
                                                      self.v_proj(hidden_states))
        query_states, key_states = query_states.view(hidden_shape), key_states.view(hidden_shape)
        if qk_norm and fused_norm:
            query_states, key_states = tk.hf_qk_norm_rope(query_states, key_states, self.q_norm.weight,
                                                          self.k_norm.weight, self.q_norm.variance_epsilon, cos, sin)
            query_states, key_states = query_states.transpose(1, 2), key_states.transpose(1, 2)
        else:
            if qk_norm:
                query_states, key_states = self.q_norm(query_states), self.k_norm(key_states)
            query_states, key_states = modeling.apply_rotary_pos_emb(
                query_states.transpose(1, 2), key_states.transpose(1, 2), cos, sin)
        value_states = value_states.view(hidden_shape).transpose(1, 2)

        cache = kwargs.pop(cache_arg, None)
        if cache_arg == "cache":
            if cache is not None:
                key_states, value_states = cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)
        else:  # 4.x: cache_position is the forward's own argument, not an attention kwarg
            cache_position = kwargs.pop("cache_position", None)
            if cache is not None:
                key_states, value_states = cache.update(key_states, value_states, self.layer_idx,
                                                        {"sin": sin, "cos": cos, "cache_position": cache_position})
        attention_interface = _attention_interface(modeling, self.config._attn_implementation)
        if window is not None:
            kwargs["sliding_window"] = window
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights

    inj.set_forward(module, forward)


def attention_skip(m) -> str | None:
    """Why the generic attention forward does not fit m (Llama, Mistral, Qwen2 and Qwen3 fit)."""
    needed = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "layer_idx", "scaling", "config")
    missing = [a for a in needed if not hasattr(m, a)]
    if missing:
        return f"not a transformers Llama-family attention (no {', '.join(missing)})"
    if getattr(m, "attn_logit_softcapping", None) is not None:
        return "its attention logits are soft-capped (Gemma 2): this forward does not cap them"
    if _cache_arg(type(m).forward) is None:
        return f"its forward takes none of the cache arguments this rule knows ({', '.join(_CACHE_ARGS)})"
    modeling = sys.modules.get(type(m).__module__)
    if not (hasattr(modeling, "eager_attention_forward") and hasattr(modeling, "ALL_ATTENTION_FUNCTIONS")
            and callable(getattr(modeling, "apply_rotary_pos_emb", None))):
        return "its modeling module has no eager_attention_forward, ALL_ATTENTION_FUNCTIONS or apply_rotary_pos_emb"
    return None
