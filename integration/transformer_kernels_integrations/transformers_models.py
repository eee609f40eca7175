"""Swap transformer-kernels into transformers' Llama-family models: ``report = inject(model)``.

Table-driven like the diffusers integration (``RULES``, matched by class-name suffix so Llama,
Mistral, Qwen2 and Qwen3 share one table):

- ``*DecoderLayer``: the attention residual add and ``post_attention_layernorm`` fused
  (``fused_add_rms_norm``); claims that norm.
- ``*MLP`` with ``gate_proj``/``up_proj``/``down_proj`` and a SiLU ``act_fn``: gate and up as one GEMM
  over one concatenated weight (``merged_gate_up_mlp``, see ``merging.py``) and ``silu_and_mul`` on
  its output; or, unmerged (``merge_projections=False``, training, non-Linear projections),
  ``act_mul`` between the two projections.
- ``*RMSNorm`` with ``variance_epsilon``: the Hub ``RMSNorm`` layer's forward (transformers'
  rounding) for the remaining input norms and the final norm.
- ``Qwen3Attention``/``Qwen3MoeAttention`` with per-head ``q_norm``/``k_norm``: the attention forward
  runs the two norms and the rotation as one kernel (``hf_qk_norm_rope``, transformers' rounding),
  on q/k/v from one GEMM (``merged_qkv_qk_norm_rope``; ``qk_norm_rope`` unmerged), and goes on as
  transformers' does (cache update, the ``ALL_ATTENTION_FUNCTIONS`` interface, o_proj);
  claims q_norm and k_norm. Tensors the kernel does not take (CPU, mixed dtypes, autocast) run
  transformers' own forward. A module this rule skips falls to the next.
- ``*Attention`` (Llama, Mistral, Qwen2): q, k and v as one GEMM (``merged_qkv_rope``), its output
  split into strided views that our RoPE reads without copies, then transformers' cache update,
  attention interface and o_proj. Either way (merged or not, ``rope``):
  the modeling module's ``apply_rotary_pos_emb`` becomes ours (q and k in one launch).
  The attention forward looks that function up by global name, so the swap applies to every model
  of that modeling module in the process (as Liger's patching does); CPU tensors still take
  transformers' function.

Merged projections (``merge_projections=True``, the default) keep one weight per merge: the
original parameters become views of it (no memory growth; ``state_dict`` keys unchanged); they are
used where no gradient is needed (inference, ``generate``), the separate projections elsewhere.

The Hub path is separate: ``kernelize`` with ``kernel_mapping()`` swaps in our ``RMSNorm``, ``Silu``
and ``RotaryPosEmb`` layers.
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Callable

import torch

from . import merging
from .loading import REPO_ID, load_kernel
from .patching import InjectionReport, Rule, apply_rules, forward_from, layer_forward, named, set_forward, suffixed

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")

# Devices whose tensors go to the kernels; elsewhere (CPU) transformers' own code runs. Tests widen
# it to run reference stand-ins for the kernels through the patched forwards on CPU.
KERNEL_DEVICES = ("cuda",)

# Attention classes whose forward is Qwen3's (q_norm/k_norm per head before the transpose, then
# apply_rotary_pos_emb): checked against the installed transformers' source.
QWEN3_ATTENTIONS = ("Qwen3Attention", "Qwen3MoeAttention")

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


def _patch_merged_mlp(module: torch.nn.Module, tk: ModuleType) -> None:
    """gate_proj and up_proj as one GEMM ([..., 2I], gate first) and silu_and_mul on it: the
    rounding of act_fn(gate) * up on the separate projections, one launch fewer."""
    merged = merging.attach(module, "gate_up", GATE_UP)

    def forward(self, x):
        if merged.usable(x) and _on_kernel_device(x):
            return self.down_proj(tk.silu_and_mul(merged(x)))
        return self.down_proj(tk.act_mul(self.gate_proj(x), self.up_proj(x), "silu"))

    set_forward(module, forward)


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


def _patch_attention(module: torch.nn.Module, tk: ModuleType, qk_norm: bool, merge: bool) -> None:
    """The attention forward from the projections to o_proj, as transformers' own (cache update,
    the ``ALL_ATTENTION_FUNCTIONS`` interface, o_proj), with q/k/v as one GEMM where ``merge`` (the
    outputs strided views of it) and, for Qwen3 (``qk_norm``), q_norm/k_norm and the rotation as
    one kernel (``hf_qk_norm_rope``). Tensors the kernels do not take (CPU, mixed dtypes, autocast)
    and calls that need gradients of merged weights run transformers' own forward."""
    modeling = sys.modules[type(module).__module__]
    original = type(module).forward
    cache_arg = _cache_arg(original)
    merged = merging.attach(module, "qkv", QKV) if merge else None

    # Arguments after position_embeddings pass through by keyword, as the decoder layer gives them.
    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
        cos, sin = position_embeddings
        dtype = hidden_states.dtype
        kernel_ok = _on_kernel_device(hidden_states) and not torch.is_autocast_enabled(hidden_states.device.type)
        fused_norm = qk_norm and kernel_ok and (self.q_norm.weight.dtype == dtype and self.k_norm.weight.dtype == dtype
                                                and cos.dtype == dtype)
        use_merged = merged is not None and kernel_ok and merged.usable(hidden_states)
        if not (fused_norm or use_merged):
            # transformers' own forward for other devices, autocast and mixed dtypes (an fp32 norm
            # weight makes eager's q fp32; the kernel keeps q's dtype)
            return original(self, hidden_states, position_embeddings, attention_mask, **kwargs)
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
        # Qwen2/Qwen3 keep the window per layer, Mistral reads its config's, Llama has none
        window = self.sliding_window if hasattr(self, "sliding_window") else getattr(self.config, "sliding_window", None)
        if window is not None:
            kwargs["sliding_window"] = window
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights

    set_forward(module, forward)


def _patch_merged_attention(module: torch.nn.Module, tk: ModuleType) -> None:
    _patch_rotary(module, tk)  # the unmerged fallback (training) keeps our rotation
    _patch_attention(module, tk, qk_norm=False, merge=True)


def _attention_skip(m) -> str | None:
    """Why the generic attention forward does not fit m (Llama, Mistral, Qwen2 and Qwen3 fit)."""
    needed = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "layer_idx", "scaling", "config")
    missing = [a for a in needed if not hasattr(m, a)]
    if missing:
        return f"not a transformers Llama-family attention (no {', '.join(missing)})"
    if _cache_arg(type(m).forward) is None:
        return f"its forward takes none of the cache arguments this rule knows ({', '.join(_CACHE_ARGS)})"
    modeling = sys.modules.get(type(m).__module__)
    if not (hasattr(modeling, "eager_attention_forward") and hasattr(modeling, "ALL_ATTENTION_FUNCTIONS")
            and callable(getattr(modeling, "apply_rotary_pos_emb", None))):
        return "its modeling module has no eager_attention_forward, ALL_ATTENTION_FUNCTIONS or apply_rotary_pos_emb"
    return None


def _merged_attention_skip(m) -> str | None:
    if type(m).__name__ in QWEN3_ATTENTIONS:
        return "Qwen3's attention (its own rule)"
    if not all(hasattr(m, a) for a in QKV):
        return "no q_proj/k_proj/v_proj"
    return _attention_skip(m) or merging.mergeable(m, QKV)


def _qwen3_attention_skip(m) -> str | None:
    missing = [a for a in ("q_norm", "k_norm") if not hasattr(m, a)]
    if missing:
        return f"not Qwen3's attention (no {', '.join(missing)})"
    why = _attention_skip(m)
    if why is not None:
        return why
    for norm in (m.q_norm, m.k_norm):
        if not hasattr(norm, "variance_epsilon") or getattr(norm, "weight", None) is None:
            return f"q/k norm {type(norm).__name__} is not a transformers RMSNorm with a weight"
        if tuple(norm.weight.shape) != (m.head_dim,):
            return f"q/k norms are not per head (weight {tuple(norm.weight.shape)}, head_dim {m.head_dim})"
    if m.q_norm.variance_epsilon != m.k_norm.variance_epsilon:
        return f"q_norm and k_norm have different eps ({m.q_norm.variance_epsilon}, {m.k_norm.variance_epsilon})"
    if m.head_dim % 2:
        return f"odd head_dim {m.head_dim}: RoPE rotates pairs"
    return None


def _patch_rotary(module: torch.nn.Module, tk: ModuleType) -> None:
    # The attention forward calls its modeling module's apply_rotary_pos_emb by global name, so the
    # swap is per modeling module (as Liger does it): every model of that class in the process gets
    # it. Tensors off the GPU still go to transformers' own function.
    modeling = sys.modules[type(module).__module__]
    original = getattr(modeling.apply_rotary_pos_emb, "_transformers_original", modeling.apply_rotary_pos_emb)

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if _on_kernel_device(q):
            return tk.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
        return original(q, k, cos, sin, unsqueeze_dim)

    apply_rotary_pos_emb._transformers_original = original
    modeling.apply_rotary_pos_emb = apply_rotary_pos_emb


def _rotary_skip(m) -> str | None:
    fn = getattr(sys.modules.get(type(m).__module__), "apply_rotary_pos_emb", None)
    return None if callable(fn) else "its modeling module has no apply_rotary_pos_emb"


def rules(merge_projections: bool = True) -> tuple[Rule, ...]:
    """The table; ``merge_projections`` adds the merged q/k/v and gate/up rules (each falls to its
    unmerged rule where the projections cannot be merged)."""
    merged = (
        Rule("merged_qkv_qk_norm_rope", named(*QWEN3_ATTENTIONS),
             lambda m, tk: _patch_attention(m, tk, qk_norm=True, merge=True), claims=("q_norm", "k_norm"),
             skip=lambda m: _qwen3_attention_skip(m) or merging.mergeable(m, QKV)),
        Rule("merged_qkv_rope", suffixed("Attention"), _patch_merged_attention, skip=_merged_attention_skip),
        Rule("merged_gate_up_mlp", suffixed("MLP"), _patch_merged_mlp,
             skip=lambda m: _mlp_skip(m) or merging.mergeable(m, GATE_UP)),
    ) if merge_projections else ()
    return (
        Rule("decoder_layer", suffixed("DecoderLayer"), forward_from(_decoder_layer_forward),
             claims=("post_attention_layernorm",), skip=_decoder_skip),
        *merged,
        Rule("qk_norm_rope", named(*QWEN3_ATTENTIONS), lambda m, tk: _patch_attention(m, tk, qk_norm=True, merge=False),
             claims=("q_norm", "k_norm"), skip=_qwen3_attention_skip),
        Rule("rope", suffixed("Attention"), _patch_rotary, skip=_rotary_skip),
        Rule("mlp", suffixed("MLP"), forward_from(_mlp_forward), skip=_mlp_skip),
        Rule("rms_norm", suffixed("RMSNorm"), layer_forward("RMSNorm"),
             skip=lambda m: None if hasattr(m, "variance_epsilon") else "no variance_epsilon (not a transformers RMSNorm)"),
    )


RULES: tuple[Rule, ...] = rules()


def inject(model: torch.nn.Module, tk: ModuleType | None = None, *, merge_projections: bool = True
           ) -> InjectionReport:
    """Patches a transformers model in place; returns what was replaced and what was left, with why.

    ``merge_projections``: q/k/v and gate/up as one GEMM each (see the module docstring)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"inject: expected a transformers model (torch.nn.Module), got {type(model).__name__}")
    return apply_rules([("", model)], rules(merge_projections), tk or load_kernel())
