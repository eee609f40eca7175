"""Swap transformer-kernels into transformers' Llama-family models: ``report = inject(model)``.

Table-driven like the diffusers integration (``RULES``, matched by class-name suffix so Llama,
Mistral, Qwen2 and Qwen3 share one table). Each rule names the switches it needs
(``inject(model, rms_norm=..., rope=..., swiglu=..., fused_add_rms_norm=..., qk_norm_rope=...)``,
all on by default):

- ``*DecoderLayer`` (``rms_norm`` + ``fused_add_rms_norm``): the attention residual add and
  ``post_attention_layernorm`` fused (``fused_add_rms_norm``); claims that norm.
- ``*MLP`` with ``gate_proj``/``up_proj``/``down_proj`` and a SiLU ``act_fn`` (``swiglu``): ``act_mul``
  between the projections (one kernel for ``act_fn(gate) * up``).
- ``*RMSNorm`` with ``variance_epsilon`` (``rms_norm``): the Hub ``RMSNorm`` layer's forward
  (transformers' rounding) for the remaining input norms and the final norm.
- ``Qwen3Attention``/``Qwen3MoeAttention`` with per-head ``q_norm``/``k_norm`` (``rms_norm`` + ``rope``
  + ``qk_norm_rope``): the attention forward runs the two norms and the rotation as one kernel
  (``hf_qk_norm_rope``, transformers' rounding) and goes on as transformers' does (cache update, the
  ``ALL_ATTENTION_FUNCTIONS`` interface, o_proj); claims q_norm and k_norm. Tensors the kernel does
  not take (CPU, mixed dtypes, autocast) run transformers' own forward (a logged fallback). A module
  this rule skips falls to the next.
- ``*Attention`` (``rope``): the modeling module's ``apply_rotary_pos_emb`` becomes ours (q and k in
  one launch). The attention forward looks that function up by global name, so the swap applies to
  every model of that modeling module in the process (as Liger's patching does) until the last
  injected model is uninjected; CPU tensors still take transformers' function (a logged fallback).

The Hub paths are separate: ``kernelize`` with ``kernel_mapping()``, or transformers'
``from_pretrained(..., use_kernels=True, kernel_config=kernel_config())``, swap in our ``RMSNorm``,
``Silu`` and ``RotaryPosEmb`` layers.
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Callable

import torch

from .loading import REPO_ID, REVISION, load_kernel
from .patching import (InjectionReport, Rule, apply_rules, check_switches, forward_from, layer_forward, named,
                       suffixed, switches_of, uninject_models)

# Devices whose tensors go to the kernels; elsewhere (CPU) transformers' own code runs. Tests widen
# it to run reference stand-ins for the kernels through the patched forwards on CPU.
KERNEL_DEVICES = ("cuda",)

# Attention classes whose forward is Qwen3's (q_norm/k_norm per head before the transpose, then
# apply_rotary_pos_emb): checked against the installed transformers' source.
QWEN3_ATTENTIONS = ("Qwen3Attention", "Qwen3MoeAttention")

# transformers' hub layer names -> our layers, for kernels.use_kernel_mapping + kernelize (the Hub
# path). revision="v1" names the branch version=1 resolves to: LayerRepository resolves version= on
# the Hub even when LOCAL_KERNELS names a local build (plain get_kernel does not), so the branch
# works offline too. trust_remote_code=True: transformer-kernels is not a trusted Kernel Hub
# publisher, and kernels refuses such a repository otherwise (see loading.py).
HUB_LAYERS = {"RMSNorm": "RMSNorm", "rotary_pos_emb": "RotaryPosEmb", "SiLU": "Silu", "GeluTanh": "GeluTanh"}

# The hub layers a Llama-family model (Llama, Mistral, Qwen2, Qwen3) registers, for kernel_config().
LLAMA_HUB_LAYERS = ("SiLU", "rotary_pos_emb", "RMSNorm")


def kernel_mapping(device: str = "cuda") -> dict:
    """The mapping for ``kernels.use_kernel_mapping``: every transformers hub layer we implement."""
    from kernels import LayerRepository

    return {name: {device: LayerRepository(REPO_ID, layer_name=layer, revision=REVISION, trust_remote_code=True)}
            for name, layer in HUB_LAYERS.items()}


def kernel_config(layers: tuple[str, ...] = LLAMA_HUB_LAYERS, device: str = "cuda"):
    """transformers' ``KernelConfig`` mapping the model's hub layers to ours, for
    ``from_pretrained(..., use_kernels=True, kernel_config=kernel_config())``.

    `layers` must be hub layer names the model registers (transformers rejects the others); the
    default is the Llama family's. ``RMSNorm`` goes last: transformers 5.2x re-adds the last entry
    under the name of our layer class, which only matches for ``RMSNorm``."""
    from transformers import KernelConfig

    unknown = [name for name in layers if name not in HUB_LAYERS]
    if unknown:
        raise ValueError(f"kernel_config: no layer of ours for {unknown}; we have {sorted(HUB_LAYERS)}")
    ordered = sorted(layers, key=lambda name: name == "RMSNorm")
    return KernelConfig({name: {device: (f"{REPO_ID}:{HUB_LAYERS[name]}", {"revision": REVISION, "trust_remote_code": True})}
                         for name in ordered})


def _decoder_layer_forward(tk: ModuleType) -> Callable:
    # Everything but hidden_states passes through to the attention by keyword, so the forward fits
    # every transformers version (the cache argument was renamed from past_key_values to cache).
    def forward(self, hidden_states, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
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


def _on_kernel_device(t: torch.Tensor) -> bool:
    return t.device.type in KERNEL_DEVICES


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


def _qwen3_unsupported(hidden_states, q_norm, k_norm, cos) -> str | None:
    """Why the fused kernel cannot take these tensors (transformers' forward then runs), or None."""
    dtype = hidden_states.dtype
    if not _on_kernel_device(hidden_states):
        return f"tensors on {hidden_states.device.type}"
    if torch.is_autocast_enabled(hidden_states.device.type):
        return "autocast is on"
    # an fp32 norm weight makes eager's q fp32; the kernel keeps q's dtype
    for what, t in (("q_norm weight", q_norm.weight), ("k_norm weight", k_norm.weight), ("cos", cos)):
        if t.dtype != dtype:
            return f"{what} is {t.dtype}, hidden_states {dtype}"
    return None


def _patch_qwen3_attention(module: torch.nn.Module, inj) -> None:
    tk = inj.tk
    modeling = sys.modules[type(module).__module__]
    original = type(module).forward
    cache_arg = _cache_arg(original)

    # Arguments after position_embeddings pass through by keyword, as the decoder layer gives them.
    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
        cos, sin = position_embeddings
        q_norm, k_norm = self.q_norm, self.k_norm
        why = _qwen3_unsupported(hidden_states, q_norm, k_norm, cos)
        if why is not None:
            inj.fallback("qk_norm_rope", why)
            return original(self, hidden_states, position_embeddings, attention_mask, **kwargs)
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states, key_states = tk.hf_qk_norm_rope(
            self.q_proj(hidden_states).view(hidden_shape), self.k_proj(hidden_states).view(hidden_shape),
            q_norm.weight, k_norm.weight, q_norm.variance_epsilon, cos, sin)
        query_states, key_states = query_states.transpose(1, 2), key_states.transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

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
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling,
            sliding_window=getattr(self, "sliding_window", None), **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights

    inj.set_forward(module, forward)


def _qwen3_attention_skip(m) -> str | None:
    needed = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm", "head_dim", "layer_idx", "scaling", "config")
    missing = [a for a in needed if not hasattr(m, a)]
    if missing:
        return f"not Qwen3's attention (no {', '.join(missing)})"
    for norm in (m.q_norm, m.k_norm):
        if not hasattr(norm, "variance_epsilon") or getattr(norm, "weight", None) is None:
            return f"q/k norm {type(norm).__name__} is not a transformers RMSNorm with a weight"
        if tuple(norm.weight.shape) != (m.head_dim,):
            return f"q/k norms are not per head (weight {tuple(norm.weight.shape)}, head_dim {m.head_dim})"
    if m.q_norm.variance_epsilon != m.k_norm.variance_epsilon:
        return f"q_norm and k_norm have different eps ({m.q_norm.variance_epsilon}, {m.k_norm.variance_epsilon})"
    if m.head_dim % 2:
        return f"odd head_dim {m.head_dim}: RoPE rotates pairs"
    if _cache_arg(type(m).forward) is None:
        return f"its forward takes none of the cache arguments this rule knows ({', '.join(_CACHE_ARGS)})"
    modeling = sys.modules.get(type(m).__module__)
    if not (hasattr(modeling, "eager_attention_forward") and hasattr(modeling, "ALL_ATTENTION_FUNCTIONS")):
        return "its modeling module has no eager_attention_forward or ALL_ATTENTION_FUNCTIONS"
    return None


def _patch_rotary(module: torch.nn.Module, inj) -> None:
    # The attention forward calls its modeling module's apply_rotary_pos_emb by global name, so the
    # swap is per modeling module (as Liger does it): every model of that class in the process gets
    # it, until the last injected one is uninjected. Tensors off the GPU still go to transformers'
    # own function.
    def make(original: Callable) -> Callable:
        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            if _on_kernel_device(q):
                return inj.tk.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
            inj.fallback("rope", f"tensors on {q.device.type}")
            return original(q, k, cos, sin, unsqueeze_dim)

        return apply_rotary_pos_emb

    inj.swap_global(sys.modules[type(module).__module__], "apply_rotary_pos_emb", make)


def _rotary_skip(m) -> str | None:
    fn = getattr(sys.modules.get(type(m).__module__), "apply_rotary_pos_emb", None)
    return None if callable(fn) else "its modeling module has no apply_rotary_pos_emb"


RULES: tuple[Rule, ...] = (
    Rule("decoder_layer", ("rms_norm", "fused_add_rms_norm"), suffixed("DecoderLayer"),
         forward_from(_decoder_layer_forward), claims=("post_attention_layernorm",), skip=_decoder_skip),
    Rule("qk_norm_rope", ("rms_norm", "rope", "qk_norm_rope"), named(*QWEN3_ATTENTIONS), _patch_qwen3_attention,
         claims=("q_norm", "k_norm"), skip=_qwen3_attention_skip,
         fallback="CPU tensors, autocast, or q/k norm weights or cos of another dtype than the input run "
                  "transformers' attention forward"),
    Rule("rope", ("rope",), suffixed("Attention"), _patch_rotary, skip=_rotary_skip,
         fallback="tensors off the GPU run transformers' apply_rotary_pos_emb (the swap is process-wide)"),
    Rule("mlp", ("swiglu",), suffixed("MLP"), forward_from(_mlp_forward), skip=_mlp_skip),
    Rule("rms_norm", ("rms_norm",), suffixed("RMSNorm"), layer_forward("RMSNorm"),
         skip=lambda m: None if hasattr(m, "variance_epsilon") else "no variance_epsilon (not a transformers RMSNorm)"),
)

SWITCHES = switches_of(RULES)


def inject(model: torch.nn.Module, tk: ModuleType | None = None, *, strict: bool = False,
           **switches: bool) -> InjectionReport:
    """Patches a transformers model in place; returns what was replaced, what was skipped (why),
    and which patched paths can fall back at run time.

    Switches (keywords, all on by default; ``False`` leaves that op kind to transformers):
    {switches}. ``strict=True`` makes a run-time fallback raise ``KernelFallbackError`` instead of
    logging it once. `tk`: the kernel module (default: ``load_kernel()``). Undo with ``uninject``."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"inject: expected a transformers model (torch.nn.Module), got {type(model).__name__}")
    on = check_switches(switches, SWITCHES, "inject")
    return apply_rules([("", model, RULES)], tk or load_kernel(), switches=on, strict=strict)


inject.__doc__ = inject.__doc__.format(switches=", ".join(f"``{s}``" for s in SWITCHES))


def uninject(model: torch.nn.Module) -> int:
    """Restores every forward and function ``inject`` patched in `model`; returns how many changes
    were undone (0 for a model that was not injected)."""
    return uninject_models([model])
