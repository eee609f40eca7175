"""Llama, Mistral and Qwen2 (and what Qwen3 shares with them): the decoder layer, the attention's
merged q/k/v and rotation, the gated MLP and the RMSNorms. Matched by class-name suffix, so one set
of rules serves every Llama-family model.

- ``*DecoderLayer`` (``rms_norm`` + ``fused_add_rms_norm``): the attention residual add and
  ``post_attention_layernorm`` fused (``fused_add_rms_norm``); claims that norm.
- ``*MLP`` with ``gate_proj``/``up_proj``/``down_proj`` and a SiLU ``act_fn``: with ``swiglu`` +
  ``merge_projections``, gate and up as one GEMM over one concatenated weight
  (``merged_gate_up_mlp``, see ``merging.py``) and ``silu_and_mul`` on its output; with ``swiglu``
  alone (or projections that cannot merge: not plain ``nn.Linear``, one with a bias) ``act_mul``
  between the two projections (``mlp``, one kernel for ``act_fn(gate) * up``).
- ``*RMSNorm`` with ``variance_epsilon`` (``rms_norm``): the Hub ``RMSNorm`` layer's forward
  (transformers' rounding) for the remaining input norms and the final norm.
- ``*Attention`` (``rope`` + ``merge_projections``): q, k and v as one GEMM (``merged_qkv_rope``),
  its output split into strided views that our RoPE reads without copies, then transformers' cache
  update, attention interface and o_proj (``attention.py``). Either way (merged, or ``rope`` alone)
  the modeling module's ``apply_rotary_pos_emb`` becomes ours (q and k in one launch). The
  attention forward looks that function up by global name, so the swap applies to every model of
  that modeling module in the process (as Liger's patching does), running the kernel of the most
  recently injected model still injected, until the last is uninjected; CPU tensors still take
  transformers' function (a logged fallback, kind ``rope``).
"""

from __future__ import annotations

import sys
from typing import Callable

import torch

from .. import fp8, merging
from ..patching import Rule, suffixed
from . import on_kernel_device
from .attention import QKV, attention_skip, patch_attention
from .qwen3 import QWEN3_ATTENTIONS

GATE_UP = ("gate_proj", "up_proj")


def _attention_gemms(layer: torch.nn.Module) -> list:
    return fp8.input_gemms(layer.self_attn, "qkv", QKV)


def _mlp_gemms(layer: torch.nn.Module) -> list:
    return fp8.input_gemms(layer.mlp, "gate_up", GATE_UP)


def _patch_decoder_layer(module: torch.nn.Module, inj) -> None:
    tk, original = inj.tk, type(module).forward
    # Under inject(fp8=True), a norm whose every consumer GEMM runs in FP8 (planned once, fp8.apply)
    # emits the codes and row scales of its output in the same pass (rms_norm_fp8,
    # fused_add_rms_norm_fp8) where the runtime conditions allow (Site.takes): the attention's and the
    # MLP's inputs are never written in 16 bits.
    plan = fp8.produces(inj, module, attn=_attention_gemms, mlp=_mlp_gemms)

    # Everything but hidden_states passes through to the attention by keyword, so the forward fits
    # every transformers version (the cache argument was renamed from past_key_values to cache).
    def forward(self, hidden_states, **kwargs):
        if not on_kernel_device(hidden_states):
            inj.fallback("decoder_layer", f"tensors on {hidden_states.device.type}")
            return original(self, hidden_states, **kwargs)
        residual = hidden_states
        norm = self.input_layernorm
        site = plan.get("attn")
        if site is not None and norm.weight.dtype == hidden_states.dtype and site.takes(hidden_states):
            codes, scale = tk.rms_norm_fp8(hidden_states, norm.weight, norm.variance_epsilon)
            hidden_states = fp8.QuantizedRows(codes, scale, hidden_states.dtype, fp8.ROW_E4M3)
        else:
            hidden_states = norm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        norm = self.post_attention_layernorm
        site = plan.get("mlp")
        if site is not None and norm.weight.dtype == hidden_states.dtype and site.takes(hidden_states):
            codes, scale, residual = tk.fused_add_rms_norm_fp8(hidden_states, residual, norm.weight,
                                                               norm.variance_epsilon)
            hidden_states = fp8.QuantizedRows(codes, scale, residual.dtype, fp8.ROW_E4M3)
        else:
            hidden_states, residual = tk.fused_add_rms_norm(hidden_states, residual, norm.weight,
                                                            norm.variance_epsilon)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states

    inj.set_forward(module, forward)


def _patch_mlp(module: torch.nn.Module, inj) -> None:
    original, act = type(module).forward, mlp_activation(module.act_fn)

    def forward(self, x):
        if not on_kernel_device(x):
            inj.fallback("mlp", f"tensors on {x.device.type}")
            return original(self, x)
        return _down_projection(inj, self, self.gate_proj(x), self.up_proj(x), act)

    inj.set_forward(module, forward)


def mlp_activation(act_fn) -> str | None:
    """The name our gated-unit ops give a gated MLP's ``act_fn`` (SiLU: Llama, Mistral, Qwen; GELU-tanh:
    Gemma), or None."""
    if isinstance(act_fn, torch.nn.SiLU) or type(act_fn).__name__ in ("SiLUActivation", "SiLU"):
        return "silu"
    if type(act_fn).__name__ in ("GELUTanh", "PytorchGELUTanh") or (
            isinstance(act_fn, torch.nn.GELU) and act_fn.approximate == "tanh"):
        return "gelu_tanh"
    return None


def _down_projection(inj, mlp: torch.nn.Module, gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """``down_proj(act_fn(gate) * up)``; where the down projection runs in FP8 (``inject(fp8=True)``),
    the gated unit is quantized in the pass that computes it (``act_mul_fp8``) and never written in
    16 bits."""
    tk = inj.tk
    down = fp8.usable_of(mlp.down_proj, gate)  # where None, down_proj's own forward says why
    if down is None:
        return mlp.down_proj(tk.act_mul(gate, up, act))
    codes, scale = tk.act_mul_fp8(gate, up, act)
    return fp8.linear(tk, down, fp8.QuantizedRows(codes, scale, gate.dtype, fp8.ROW_E4M3), mlp.down_proj.bias)


def _patch_rms_norm(module: torch.nn.Module, inj) -> None:
    layer, original = inj.tk.layers.RMSNorm.forward, type(module).forward  # the Hub layer's forward

    def forward(self, hidden_states):
        if not on_kernel_device(hidden_states):
            inj.fallback("rms_norm", f"tensors on {hidden_states.device.type}")
            return original(self, hidden_states)
        return layer(self, hidden_states)

    inj.set_forward(module, forward)


def _patch_merged_mlp(module: torch.nn.Module, inj) -> None:
    """gate_proj and up_proj as one GEMM ([..., 2I], gate first) and the gated unit on it
    (silu_and_mul, or gelu_tanh_and_mul for Gemma): the rounding of act_fn(gate) * up on the separate
    projections, one launch fewer."""
    tk, kind, original = inj.tk, "merged_gate_up_mlp", type(module).forward
    act = mlp_activation(module.act_fn)
    act_and_mul = tk.silu_and_mul if act == "silu" else tk.gelu_tanh_and_mul
    merged = inj.merge(module, "gate_up", GATE_UP, kind)

    def forward(self, x):
        if not on_kernel_device(x):  # transformers' MLP: act_mul is a kernel too
            inj.fallback(kind, f"tensors on {x.device.type}")
            return original(self, x)
        if merged.use(x):  # else it reported why (gradients wanted)
            gate_up = merged(x)
            if fp8.usable_of(self.down_proj, gate_up) is None:
                return self.down_proj(act_and_mul(gate_up))
            return _down_projection(inj, self, *gate_up.split_with_sizes(merged.sizes, dim=-1), act)
        return _down_projection(inj, self, self.gate_proj(x), self.up_proj(x), act)

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
    return None if mlp_activation(act) else f"activation {type(act).__name__} is neither SiLU nor GELU-tanh"


def _patch_merged_attention(module: torch.nn.Module, inj) -> None:
    _patch_rotary(module, inj)  # the unmerged fallback (training) keeps our rotation
    patch_attention(module, inj, "merged_qkv_rope", qk_norm=False, merge=True)


def _merged_attention_skip(m) -> str | None:
    if type(m).__name__ in QWEN3_ATTENTIONS:
        return "Qwen3's attention (its own rule)"
    if not all(hasattr(m, a) for a in QKV):
        return "no q_proj/k_proj/v_proj"
    if hasattr(m, "q_norm") or hasattr(m, "k_norm"):  # this forward would drop them
        return "per-head q/k norms of another model than Qwen3 (Gemma 3, OLMo 2, ...): not in this forward"
    return attention_skip(m) or merging.mergeable(m, QKV)


def _patch_rotary(module: torch.nn.Module, inj) -> None:
    # The attention forward calls its modeling module's apply_rotary_pos_emb by global name, so the
    # swap is per modeling module (as Liger does it): every model of that class in the process gets
    # it, until the last injected one is uninjected. Tensors off the GPU still go to transformers'
    # own function.
    def make(original: Callable) -> Callable:
        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            if on_kernel_device(q):
                return inj.tk.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
            inj.fallback("rope", f"tensors on {q.device.type}")
            return original(q, k, cos, sin, unsqueeze_dim)

        return apply_rotary_pos_emb

    inj.swap_global(sys.modules[type(module).__module__], "apply_rotary_pos_emb", make)


def _rotary_skip(m) -> str | None:
    fn = getattr(sys.modules.get(type(m).__module__), "apply_rotary_pos_emb", None)
    return None if callable(fn) else "its modeling module has no apply_rotary_pos_emb"


DECODER_LAYER = Rule(
    "decoder_layer", ("rms_norm", "fused_add_rms_norm"), suffixed("DecoderLayer"), _patch_decoder_layer,
    claims=("post_attention_layernorm",), skip=_decoder_skip, ops=("fused_add_rms_norm",),
    fallback="tensors off the GPU run transformers' decoder layer forward")

# merged rules first: each falls to its unmerged rule where the projections cannot be merged
ATTENTION_RULES: tuple[Rule, ...] = (
    Rule("merged_qkv_rope", ("rope", "merge_projections"), suffixed("Attention"), _patch_merged_attention,
         skip=_merged_attention_skip, ops=("hf_rope",), merges=("qkv",),
         fallback="CPU tensors or autocast run transformers' attention forward (whose apply_rotary_pos_emb, "
                  "swapped process-wide, falls back as rope off the GPU); where gradients are wanted, the "
                  "separate q/k/v projections"),
    Rule("rope", ("rope",), suffixed("Attention"), _patch_rotary, skip=_rotary_skip, ops=("hf_rope",),
         fallback="tensors off the GPU run transformers' apply_rotary_pos_emb (the swap is process-wide)"),
)

MLP_RULES: tuple[Rule, ...] = (
    # under grad: the separate projections, then act_mul
    Rule("merged_gate_up_mlp", ("swiglu", "merge_projections"), suffixed("MLP"), _patch_merged_mlp,
         skip=lambda m: _mlp_skip(m) or merging.mergeable(m, GATE_UP), ops=("act_and_mul",),
         training_ops=("act_mul",), merges=("gate_up",),
         fallback="tensors off the GPU run transformers' MLP forward; where gradients are wanted, the separate "
                  "gate/up projections (then act_mul)"),
    Rule("mlp", ("swiglu",), suffixed("MLP"), _patch_mlp, skip=_mlp_skip, ops=("act_mul",),
         fallback="tensors off the GPU run transformers' MLP forward"),
)

RMS_NORM = Rule(
    "rms_norm", ("rms_norm",), suffixed("RMSNorm"), _patch_rms_norm, ops=("rms_norm",),
    skip=lambda m: None if hasattr(m, "variance_epsilon") else "no variance_epsilon (not a transformers RMSNorm)",
    fallback="tensors off the GPU run transformers' RMSNorm forward")
