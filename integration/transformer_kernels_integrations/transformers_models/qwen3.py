"""Qwen3 (and Qwen3-MoE): the attention with per-head ``q_norm``/``k_norm`` (``rms_norm`` + ``rope`` +
``qk_norm_rope``): the attention forward (``attention.py``) runs the two norms and the rotation as
one kernel (``hf_qk_norm_rope``, transformers' rounding), on q/k/v from one GEMM where
``merge_projections`` is on too (``merged_qkv_qk_norm_rope``; ``qk_norm_rope`` unmerged), and goes
on as transformers' does (cache update, the ``ALL_ATTENTION_FUNCTIONS`` interface, o_proj); claims
q_norm and k_norm. Tensors the kernel does not take (CPU, mixed dtypes, autocast) run transformers'
own forward (a logged fallback). A module these rules skip falls to the Llama-family rules. The
rest of a Qwen3 model (decoder layer, MLP, norms) is Llama's (``llama.py``).
"""

from __future__ import annotations

from .. import merging
from ..patching import Rule, named
from .attention import QKV, attention_skip, patch_attention

# Attention classes whose forward is Qwen3's (q_norm/k_norm per head before the transpose, then
# apply_rotary_pos_emb): checked against the installed transformers' source.
QWEN3_ATTENTIONS = ("Qwen3Attention", "Qwen3MoeAttention")


def _qwen3_attention_skip(m) -> str | None:
    missing = [a for a in ("q_norm", "k_norm") if not hasattr(m, a)]
    if missing:
        return f"not Qwen3's attention (no {', '.join(missing)})"
    why = attention_skip(m)
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


_QK_NORM_FALLBACK = ("CPU tensors, autocast, or q/k norm weights or cos of another dtype than the input run "
                     "transformers' attention forward")

# merged first: it falls to the unmerged rule where the projections cannot be merged
RULES: tuple[Rule, ...] = (
    Rule("merged_qkv_qk_norm_rope", ("rms_norm", "rope", "qk_norm_rope", "merge_projections"),
         named(*QWEN3_ATTENTIONS),
         lambda m, inj: patch_attention(m, inj, "merged_qkv_qk_norm_rope", qk_norm=True, merge=True),
         claims=("q_norm", "k_norm"), skip=lambda m: _qwen3_attention_skip(m) or merging.mergeable(m, QKV),
         ops=("hf_qk_norm_rope",), merges=("qkv",),
         fallback=f"{_QK_NORM_FALLBACK}; where gradients are wanted, the separate q/k/v projections"),
    Rule("qk_norm_rope", ("rms_norm", "rope", "qk_norm_rope"), named(*QWEN3_ATTENTIONS),
         lambda m, inj: patch_attention(m, inj, "qk_norm_rope", qk_norm=True, merge=False),
         claims=("q_norm", "k_norm"), skip=_qwen3_attention_skip, ops=("hf_qk_norm_rope",),
         fallback=_QK_NORM_FALLBACK),
)
