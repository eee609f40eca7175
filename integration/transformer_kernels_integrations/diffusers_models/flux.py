"""Flux: the attention processor (per-head q/k RMSNorms and Flux's rotation of q and k in one
launch) and the merged q/k/v (and added q/k/v) projections. Its AdaLayerNormZero modulations are in
``adaln.py``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch

from .. import merging
from ..patching import Rule, named
from .common import MERGED_FALLBACK, QKV, KernelProcessor, merged_projection, processor, torch_rms_norm

ADDED_QKV = ("add_q_proj", "add_k_proj", "add_v_proj")


class FluxAttnProcessor(KernelProcessor):
    """``FluxAttnProcessor`` with our per-head q/k RMSNorms and Flux's rotary embedding of q and k in
    one launch. Same positional signature as the original."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, tk: ModuleType, ours: Callable[[str], bool] = lambda op: True):
        self.tk = tk
        self.ours = ours  # which ops to run (training: those with a backward); the others run eager

    def _qk_norm(self, norm: torch.nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
        return torch_rms_norm(self.tk, norm, x) if self.ours("rms_norm") else norm(x)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.transformers.transformer_flux import _get_qkv_projections

        replaced = self._replaced_for(hidden_states)
        if replaced is not None:
            return replaced(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)

        qkv = merged_projection(attn, "qkv", hidden_states)
        added = merged_projection(attn, "added_qkv", encoder_hidden_states) if encoder_hidden_states is not None else None
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


def _flux_attention_skip(m: torch.nn.Module) -> str | None:
    if type(getattr(m, "processor", None)).__name__ != "FluxAttnProcessor":
        return f"processor {type(getattr(m, 'processor', None)).__name__} is not the default FluxAttnProcessor"
    if not isinstance(getattr(m, "norm_q", None), torch.nn.RMSNorm):
        return "q/k norm is not torch.nn.RMSNorm"
    return None


def _merge_flux_attention(attn: torch.nn.Module, inj) -> None:
    inj.merge(attn, "qkv", QKV, "flux_merged_projections")
    if getattr(attn, "added_kv_proj_dim", None) is not None and merging.mergeable(attn, ADDED_QKV) is None:
        inj.merge(attn, "added_qkv", ADDED_QKV, "flux_merged_projections")


RULES: tuple[Rule, ...] = (
    # also=True: q/k/v (and the added q/k/v) as one GEMM each, read by the flux_attention processor
    Rule("flux_merged_projections", ("merge_projections", "rms_norm", "rope"), named("FluxAttention"),
         _merge_flux_attention, skip=lambda m: _flux_attention_skip(m) or merging.mergeable(m, QKV),
         fallback=MERGED_FALLBACK, also=True, ops=(), merges=("qkv",)),
    # under grad the q/k norms run our kernel where it has a backward, the modules' own otherwise
    Rule("flux_attention", ("rms_norm", "rope"), named("FluxAttention"), processor(FluxAttnProcessor),
         claims=("norm_q", "norm_k", "norm_added_q", "norm_added_k"), skip=_flux_attention_skip,
         ops=("rms_norm", "rope"), training_ops=("rope",)),
)
