"""Swap transformer-kernels into transformers' Llama-family models: ``report = inject(model)``.

Table-driven like the diffusers integration (``RULES``, matched by class-name suffix so Llama,
Mistral, Qwen2 and Qwen3 share one table). Each rule names the switches it needs
(``inject(model, rms_norm=..., rope=..., swiglu=..., fused_add_rms_norm=..., qk_norm_rope=...)``,
all on by default):

- ``*DecoderLayer`` (``rms_norm`` + ``fused_add_rms_norm``): the attention residual add and
  ``post_attention_layernorm`` fused (``fused_add_rms_norm``); claims that norm.
- ``*MLP`` with ``gate_proj``/``up_proj``/``down_proj`` and a SiLU ``act_fn``: with ``swiglu`` +
  ``merge_projections``, gate and up as one GEMM over one concatenated weight
  (``merged_gate_up_mlp``, see ``merging.py``) and ``silu_and_mul`` on its output; with ``swiglu``
  alone (or projections that cannot merge: not plain ``nn.Linear``, one with a bias) ``act_mul``
  between the two projections (``mlp``, one kernel for ``act_fn(gate) * up``).
- ``*RMSNorm`` with ``variance_epsilon`` (``rms_norm``): the Hub ``RMSNorm`` layer's forward
  (transformers' rounding) for the remaining input norms and the final norm.
- ``Qwen3Attention``/``Qwen3MoeAttention`` with per-head ``q_norm``/``k_norm`` (``rms_norm`` + ``rope``
  + ``qk_norm_rope``): the attention forward runs the two norms and the rotation as one kernel
  (``hf_qk_norm_rope``, transformers' rounding), on q/k/v from one GEMM where ``merge_projections``
  is on too (``merged_qkv_qk_norm_rope``; ``qk_norm_rope`` unmerged), and goes on as transformers'
  does (cache update, the ``ALL_ATTENTION_FUNCTIONS`` interface, o_proj); claims q_norm and k_norm.
  Tensors the kernel does not take (CPU, mixed dtypes, autocast) run transformers' own forward (a
  logged fallback). A module this rule skips falls to the next.
- ``*Attention`` (Llama, Mistral, Qwen2; ``rope`` + ``merge_projections``): q, k and v as one GEMM
  (``merged_qkv_rope``), its output split into strided views that our RoPE reads without copies,
  then transformers' cache update, attention interface and o_proj. Either way (merged, or ``rope``
  alone):
  the modeling module's ``apply_rotary_pos_emb`` becomes ours (q and k in one launch). The
  attention forward looks that function up by global name, so the swap applies to every model of
  that modeling module in the process (as Liger's patching does), running the kernel of the most
  recently injected model still injected, until the last is uninjected; CPU tensors still take
  transformers' function (a logged fallback, kind ``rope``).

Every patched forward checks the device: tensors off the GPU (``KERNEL_DEVICES``) run transformers'
own code (a logged fallback of that rule's kind), so a model on the CPU never reaches a kernel.

Merged projections (``merge_projections=True``, the default) keep one weight per merge: the
original parameters become views of it (no memory growth; ``state_dict`` keys unchanged); they are
used where no gradient is needed (inference, ``generate``), the separate projections elsewhere (a
logged fallback: ``strict=True`` raises there, so a model injected for inference and then trained
under ``strict`` needs ``merge_projections=False``; see Training below). ``uninject`` gives each parameter, the same object, storage of its own again with its
current values (``merging.detach``).

Training (``inject(model)`` on a model in training mode, or ``training=True``): only the rules whose
ops all have a backward (``tk.has_backward``, ``RULE_OPS``) are applied, the others are skipped with
the reason, and a ``*ForCausalLM`` called with ``labels`` in training mode computes its loss with the
fused linear cross-entropy (``causal_lm_loss``, switch ``fused_linear_cross_entropy``: ``lm_head`` and
the loss chunk by chunk, the logits never materialized, as Liger's ``fused_linear_cross_entropy=True``;
it then returns no logits). The merged rules stay in training (the separate projections run under
grad, a logged fallback) except under ``strict=True``, where they skip and the unmerged rules take
those modules, so a strict training step does not raise.

The Hub paths are separate: ``kernelize`` with ``kernel_mapping()``, or transformers'
``from_pretrained(..., use_kernels=True, kernel_config=kernel_config())``, swap in our ``RMSNorm``,
``Silu`` and ``RotaryPosEmb`` layers (``mode=Mode.TRAINING`` takes those whose ``has_backward`` is true).
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Callable

import torch

from . import merging
from .loading import REPO_ID, REVISION, load_kernel
from .patching import (InjectionReport, Rule, apply_rules, check_switches, for_training, named, suffixed, switches_of,
                       uninject_models)

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")

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


def _patch_decoder_layer(module: torch.nn.Module, inj) -> None:
    tk, original = inj.tk, type(module).forward

    # Everything but hidden_states passes through to the attention by keyword, so the forward fits
    # every transformers version (the cache argument was renamed from past_key_values to cache).
    def forward(self, hidden_states, **kwargs):
        if not _on_kernel_device(hidden_states):
            inj.fallback("decoder_layer", f"tensors on {hidden_states.device.type}")
            return original(self, hidden_states, **kwargs)
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        norm = self.post_attention_layernorm
        hidden_states, residual = tk.fused_add_rms_norm(hidden_states, residual, norm.weight, norm.variance_epsilon)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states

    inj.set_forward(module, forward)


def _patch_mlp(module: torch.nn.Module, inj) -> None:
    tk, original = inj.tk, type(module).forward

    def forward(self, x):
        if not _on_kernel_device(x):
            inj.fallback("mlp", f"tensors on {x.device.type}")
            return original(self, x)
        return self.down_proj(tk.act_mul(self.gate_proj(x), self.up_proj(x), "silu"))

    inj.set_forward(module, forward)


def _patch_rms_norm(module: torch.nn.Module, inj) -> None:
    layer, original = inj.tk.layers.RMSNorm.forward, type(module).forward  # the Hub layer's forward

    def forward(self, hidden_states):
        if not _on_kernel_device(hidden_states):
            inj.fallback("rms_norm", f"tensors on {hidden_states.device.type}")
            return original(self, hidden_states)
        return layer(self, hidden_states)

    inj.set_forward(module, forward)


def _patch_merged_mlp(module: torch.nn.Module, inj) -> None:
    """gate_proj and up_proj as one GEMM ([..., 2I], gate first) and silu_and_mul on it: the
    rounding of act_fn(gate) * up on the separate projections, one launch fewer."""
    tk, kind, original = inj.tk, "merged_gate_up_mlp", type(module).forward
    merged = inj.merge(module, "gate_up", GATE_UP, kind)

    def forward(self, x):
        if not _on_kernel_device(x):  # transformers' MLP: act_mul is a kernel too
            inj.fallback(kind, f"tensors on {x.device.type}")
            return original(self, x)
        if merged.use(x):  # else it reported why (gradients wanted)
            return self.down_proj(tk.silu_and_mul(merged(x)))
        return self.down_proj(tk.act_mul(self.gate_proj(x), self.up_proj(x), "silu"))

    inj.set_forward(module, forward)


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


def _kernel_unsupported(hidden_states: torch.Tensor) -> str | None:
    """Why the kernels cannot take these tensors (transformers' forward then runs), or None."""
    if not _on_kernel_device(hidden_states):
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


def _patch_attention(module: torch.nn.Module, inj, kind: str, qk_norm: bool, merge: bool) -> None:
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
        kernel_ok = device_type in KERNEL_DEVICES and not torch.is_autocast_enabled(device_type)
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


def _patch_merged_attention(module: torch.nn.Module, inj) -> None:
    _patch_rotary(module, inj)  # the unmerged fallback (training) keeps our rotation
    _patch_attention(module, inj, "merged_qkv_rope", qk_norm=False, merge=True)


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


# ---- training: the causal LM's loss through the fused linear cross-entropy ----


def _causal_lm_loss(tk: ModuleType, module: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor,
                    num_items_in_batch=None, ignore_index: int = -100, shift_labels=None, **_model_kwargs
                    ) -> torch.Tensor:
    """transformers' ``ForCausalLMLoss`` on ``lm_head(hidden)`` without the logits: the same label
    shift (pad with ignore_index, drop the first), the same reduction (sum over
    ``num_items_in_batch`` when given, else the mean over targets not ignored), and Gemma 2's
    ``final_logit_softcapping`` when the config has one."""
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    reduction = "sum" if num_items_in_batch is not None else "mean"
    lm_head = module.lm_head
    loss = tk.fused_linear_cross_entropy(hidden, lm_head.weight, shift_labels.to(hidden.device), lm_head.bias,
                                         ignore_index=ignore_index, reduction=reduction,
                                         softcap=getattr(module.config, "final_logit_softcapping", None))
    if num_items_in_batch is not None:
        loss = loss / (num_items_in_batch.to(loss.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch)
    return loss


def _patch_causal_lm(module: torch.nn.Module, inj) -> None:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    tk, kind = inj.tk, "causal_lm_loss"

    original = type(module).forward
    # The forward's positional parameters, so that positional arguments can be named (no
    # inspect.Signature.bind per call: torch.compile traces this forward).
    positional = [p.name for p in inspect.signature(original).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]
    carried = [name for name in CausalLMOutputWithPast.__dataclass_fields__ if name not in ("loss", "logits")]

    def forward(self, *args, **kwargs):
        if len(args) > len(positional):
            return original(self, *args, **kwargs)
        kwargs = {**dict(zip(positional, args)), **kwargs}
        labels, keep = kwargs.get("labels"), kwargs.get("logits_to_keep", 0)
        if labels is None or not self.training or not torch.is_grad_enabled():
            return original(self, **kwargs)  # no training loss asked for: transformers' forward, its logits
        if kwargs.get("return_dict") is False or not (keep is None or (isinstance(keep, int) and keep == 0)):
            inj.fallback(kind, "return_dict=False or logits_to_keep given (the caller wants logits)",
                         instead="transformers' forward (lm_head, then its loss)")
            return original(self, **kwargs)
        kwargs.pop("labels")
        kwargs.pop("logits_to_keep", None)
        outputs = self.model(**kwargs)  # the loss's kwargs go to the base model too, as transformers does
        hidden = outputs.last_hidden_state
        if not _on_kernel_device(hidden):
            inj.fallback(kind, f"tensors on {hidden.device.type}", instead="lm_head, then transformers' loss")
            logits = self.lm_head(hidden)
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        else:
            logits, loss = None, _causal_lm_loss(tk, self, hidden, labels, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{name: getattr(outputs, name, None) for name in carried})

    inj.set_forward(module, forward)


def _causal_lm_skip(m) -> str | None:
    head, config = getattr(m, "lm_head", None), getattr(m, "config", None)
    if not isinstance(head, torch.nn.Linear) or not hasattr(m, "model"):
        return "not a causal LM with a base model and a linear lm_head"
    if head.out_features != getattr(config, "vocab_size", None):
        return f"lm_head gives {head.out_features} logits, the config's vocabulary is {getattr(config, 'vocab_size', None)}"
    if getattr(m, "loss_type", "ForCausalLM") != "ForCausalLM":
        return f"its loss is {m.loss_type}, not transformers' causal LM loss"
    if "labels" not in inspect.signature(type(m).forward).parameters:
        return "its forward takes no labels"
    return None


RULES: tuple[Rule, ...] = (
    Rule("decoder_layer", ("rms_norm", "fused_add_rms_norm"), suffixed("DecoderLayer"), _patch_decoder_layer,
         claims=("post_attention_layernorm",), skip=_decoder_skip,
         fallback="tensors off the GPU run transformers' decoder layer forward"),
    # merged rules first: each falls to its unmerged rule where the projections cannot be merged
    Rule("merged_qkv_qk_norm_rope", ("rms_norm", "rope", "qk_norm_rope", "merge_projections"),
         named(*QWEN3_ATTENTIONS), lambda m, inj: _patch_attention(m, inj, "merged_qkv_qk_norm_rope", qk_norm=True,
                                                                    merge=True),
         claims=("q_norm", "k_norm"), skip=lambda m: _qwen3_attention_skip(m) or merging.mergeable(m, QKV),
         fallback="CPU tensors, autocast, or q/k norm weights or cos of another dtype than the input run "
                  "transformers' attention forward; where gradients are wanted, the separate q/k/v projections"),
    Rule("qk_norm_rope", ("rms_norm", "rope", "qk_norm_rope"), named(*QWEN3_ATTENTIONS),
         lambda m, inj: _patch_attention(m, inj, "qk_norm_rope", qk_norm=True, merge=False),
         claims=("q_norm", "k_norm"), skip=_qwen3_attention_skip,
         fallback="CPU tensors, autocast, or q/k norm weights or cos of another dtype than the input run "
                  "transformers' attention forward"),
    Rule("merged_qkv_rope", ("rope", "merge_projections"), suffixed("Attention"), _patch_merged_attention,
         skip=_merged_attention_skip,
         fallback="CPU tensors or autocast run transformers' attention forward (whose apply_rotary_pos_emb, "
                  "swapped process-wide, falls back as rope off the GPU); where gradients are wanted, the "
                  "separate q/k/v projections"),
    Rule("rope", ("rope",), suffixed("Attention"), _patch_rotary, skip=_rotary_skip,
         fallback="tensors off the GPU run transformers' apply_rotary_pos_emb (the swap is process-wide)"),
    Rule("merged_gate_up_mlp", ("swiglu", "merge_projections"), suffixed("MLP"), _patch_merged_mlp,
         skip=lambda m: _mlp_skip(m) or merging.mergeable(m, GATE_UP),
         fallback="tensors off the GPU run transformers' MLP forward; where gradients are wanted, the separate "
                  "gate/up projections (then act_mul)"),
    Rule("mlp", ("swiglu",), suffixed("MLP"), _patch_mlp, skip=_mlp_skip,
         fallback="tensors off the GPU run transformers' MLP forward"),
    Rule("rms_norm", ("rms_norm",), suffixed("RMSNorm"), _patch_rms_norm,
         skip=lambda m: None if hasattr(m, "variance_epsilon") else "no variance_epsilon (not a transformers RMSNorm)",
         fallback="tensors off the GPU run transformers' RMSNorm forward"),
)

# The ops each rule's forward calls under grad (the C++ ops' names): in training, a rule is applied
# only when all have a backward. The merged rules take the separate projections under grad.
RULE_OPS: dict[str, tuple[str, ...]] = {
    "decoder_layer": ("fused_add_rms_norm",),
    "merged_qkv_qk_norm_rope": ("hf_qk_norm_rope",),
    "merged_qkv_rope": ("hf_rope",),
    "merged_gate_up_mlp": ("act_mul", "act_and_mul"),
    "qk_norm_rope": ("hf_qk_norm_rope",),
    "rope": ("hf_rope",),
    "mlp": ("act_mul",),
    "rms_norm": ("rms_norm",),
    "causal_lm_loss": ("fused_linear_cross_entropy",),
}

# Applied in training only (before RULES): the loss of a *ForCausalLM called with labels.
TRAINING_RULES: tuple[Rule, ...] = (
    Rule("causal_lm_loss", ("fused_linear_cross_entropy",), suffixed("ForCausalLM"), _patch_causal_lm,
         skip=_causal_lm_skip,
         fallback="CPU tensors, return_dict=False or logits_to_keep: lm_head, then transformers' loss"),
)

SWITCHES = switches_of(TRAINING_RULES + RULES)


def rules_for(tk: ModuleType, training: bool, strict: bool = False) -> tuple[Rule, ...]:
    """The table ``inject`` applies: ``RULES``, or in training ``for_training``'s gating of
    ``TRAINING_RULES + RULES``."""
    return for_training(TRAINING_RULES + RULES, RULE_OPS, tk, strict=strict) if training else RULES


def inject(model: torch.nn.Module, tk: ModuleType | None = None, *, strict: bool = False,
           training: bool | None = None, **switches: bool) -> InjectionReport:
    """Patches a transformers model in place; returns what was replaced, what was skipped (why),
    and which patched paths can fall back at run time.

    Switches (keywords, all on by default; ``False`` leaves that op kind to transformers):
    {switches}. ``strict=True`` makes a run-time fallback raise ``KernelFallbackError`` instead of
    logging it once. ``training`` (default: ``model.training``): only the rules whose ops have a
    backward, and the fused linear cross-entropy for the causal LM's loss (``training`` in the
    report; see the module docstring). `tk`: the kernel module (default: ``load_kernel()``). Undo
    with ``uninject``."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"inject: expected a transformers model (torch.nn.Module), got {type(model).__name__}")
    on = check_switches(switches, SWITCHES, "inject")
    tk = tk or load_kernel()
    training = model.training if training is None else training
    return apply_rules([("", model, rules_for(tk, training, strict))], tk, switches=on, strict=strict,
                       training=training)


inject.__doc__ = inject.__doc__.format(switches=", ".join(f"``{s}``" for s in SWITCHES))


def uninject(model: torch.nn.Module) -> int:
    """Restores every forward and function ``inject`` patched in `model`; returns how many changes
    were undone (0 for a model that was not injected)."""
    return uninject_models([model])
