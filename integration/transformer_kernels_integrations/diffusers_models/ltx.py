"""LTX-Video: the transformer block (modulations and residuals fused), the attention processor (q/k
RMSNorm across heads and the rotation, in self-attention one launch), the rope module returning the
coordinates the kernels compute cos/sin from, and the merged projections.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Callable, Mapping, NamedTuple

import torch

from .. import fp8, merging
from ..patching import Rule, named
from .common import MERGED_FALLBACK, QKV, KernelProcessor, merged_projection, processor, torch_rms_norm

KV = ("to_k", "to_v")


def _ltx_block_forward(tk: ModuleType, plan: Mapping[str, fp8.Site | None] | None = None) -> Callable:
    """``LTXVideoTransformerBlock.forward`` with the modulations and residuals fused:
    norm1 + AdaLN in one kernel, the gated attention residual, the cross-attention residual fused
    with norm2 + AdaLN, and the gated FFN residual. Under ``inject(fp8=True)``, a modulated norm whose
    consumer GEMMs all run in FP8 (the self-attention's q/k/v under our processor; the FFN's input
    projection) emits its output's codes and row scales in the same pass (``norm_modulate_fp8``,
    ``gated_add_norm_modulate_fp8``): `plan` (``fp8.produces``, planned once by ``fp8.apply``) says
    which, the call only whether the runtime conditions allow it (``Site.takes``)."""
    plan = {} if plan is None else plan

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                encoder_attention_mask=None):
        batch_size = hidden_states.size(0)
        num_ada_params = self.scale_shift_table.shape[0]
        ada_values = self.scale_shift_table[None, None].to(temb.device) + temb.reshape(
            batch_size, temb.size(1), num_ada_params, -1)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = ada_values.unbind(dim=2)

        site = plan.get("attn1")
        if site is not None and site.takes(hidden_states):
            codes, scale = tk.norm_modulate_fp8(hidden_states, scale_msa, shift_msa, norm="rms",
                                                weight=self.norm1.weight, eps=self.norm1.eps)
            norm_hidden_states = fp8.QuantizedRows(codes, scale, hidden_states.dtype, fp8.ROW_E4M3)
        else:
            norm_hidden_states = tk.norm_modulate(hidden_states, scale_msa, shift_msa, norm="rms",
                                                  weight=self.norm1.weight, eps=self.norm1.eps)
        attn_hidden_states = self.attn1(hidden_states=norm_hidden_states, encoder_hidden_states=None,
                                        image_rotary_emb=image_rotary_emb)
        hidden_states = tk.gated_add(hidden_states, attn_hidden_states, gate_msa)
        attn_hidden_states = self.attn2(hidden_states, encoder_hidden_states=encoder_hidden_states,
                                        image_rotary_emb=None, attention_mask=encoder_attention_mask)
        site = plan.get("ff")
        if site is not None and site.takes(hidden_states):
            codes, scale, hidden_states = tk.gated_add_norm_modulate_fp8(
                hidden_states, attn_hidden_states, None, scale_mlp, shift_mlp, norm="rms",
                weight=self.norm2.weight, eps=self.norm2.eps)
            norm_hidden_states = fp8.QuantizedRows(codes, scale, hidden_states.dtype, fp8.ROW_E4M3)
        else:
            norm_hidden_states, hidden_states = tk.gated_add_norm_modulate(
                hidden_states, attn_hidden_states, None, scale_mlp, shift_mlp, norm="rms",
                weight=self.norm2.weight, eps=self.norm2.eps)
        ff_output = self.ff(norm_hidden_states)
        return tk.gated_add(hidden_states, ff_output, gate_mlp)

    return forward


def _fused_qk_norm_eps(norm_q: torch.nn.RMSNorm, norm_k: torch.nn.RMSNorm) -> float | None:
    """The eps the fused q/k norm + RoPE kernel uses, or None when the two norms cannot share one
    launch (no weight, or different eps). ``eps=None`` is ATen's fp32 epsilon, as in F.rms_norm."""
    if norm_q.weight is None or norm_k.weight is None or norm_q.eps != norm_k.eps:
        return None
    return norm_q.eps if norm_q.eps is not None else torch.finfo(torch.float32).eps


class LTXAttnProcessor(KernelProcessor):
    """``LTXVideoAttnProcessor`` with our q/k RMSNorm (``torch.nn.RMSNorm`` across heads) and the
    LTX rotary embedding: in self-attention one launch for both norms and the rotation of q and k,
    otherwise the norms, then the rotation. Same positional signature as the original.

    ``fuse=False``: the norms and the rotation as separate kernels; ``qk_norm=False``: the norm
    modules' own forwards, then our rotation (the ``rms_norm`` or ``qk_norm_rope`` switch off)."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, tk: ModuleType, fuse: bool = True, qk_norm: bool = True,
                 ours: Callable[[str], bool] = lambda op: True):
        self.tk, self.fuse, self.qk_norm = tk, fuse and qk_norm, qk_norm
        self.ours = ours  # which ops to run (training: those with a backward); the others run eager

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        replaced = self._replaced_for(hidden_states)
        if replaced is not None:
            return replaced(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape)
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])

        self_attention = encoder_hidden_states is None
        qkv = merged_projection(attn, "qkv", hidden_states) if self_attention else None
        kv = merged_projection(attn, "kv", encoder_hidden_states) if not self_attention else None
        if self_attention:
            encoder_hidden_states = hidden_states
        if qkv is not None:  # one GEMM; q, k, v are strided views of its output
            query, key, value = qkv.split(hidden_states)
        else:
            query = attn.to_q(hidden_states)
            key, value = kv.split(encoder_hidden_states) if kv is not None else (
                attn.to_k(encoder_hidden_states), attn.to_v(encoder_hidden_states))
        eps = _fused_qk_norm_eps(attn.norm_q, attn.norm_k)
        # image_rotary_emb: the rope module's (cos, sin) tables, or its coordinates (LTXRopeCoords)
        # where inject patched the rope module (the kernel then computes cos/sin itself)
        from_coords = isinstance(image_rotary_emb, LTXRopeCoords)
        fused_op = "ltx_qk_norm_rope_from_coords" if from_coords else "qk_norm_rope"
        if (self.fuse and image_rotary_emb is not None and eps is not None and query.shape[1] == key.shape[1]
                and self.ours(fused_op)):
            # self-attention: both norms and the rotation in one launch
            fused = self.tk.ltx_qk_norm_rope_from_coords if from_coords else self.tk.ltx_qk_norm_rope
            query, key = fused(query, key, attn.norm_q.weight, attn.norm_k.weight, eps, *image_rotary_emb)
        else:
            query = self._qk_norm(attn.norm_q, query)
            key = self._qk_norm(attn.norm_k, key)
            if image_rotary_emb is not None:
                rotate = self.tk.ltx_rope_from_coords if from_coords else self.tk.ltx_rope
                query, key = rotate(query, key, *image_rotary_emb)

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
        return torch_rms_norm(self.tk, norm, x) if self.qk_norm and self.ours("rms_norm") else norm(x)


class LTXRopeCoords(NamedTuple):
    """What ``LTXVideoRotaryPosEmbed`` builds its fp32 cos/sin tables from, for the kernels'
    ``ltx_*_from_coords`` ops: ``grid`` ``[B, S, 3]`` float32 (frame, height, width per token, a
    strided view) and ``freqs`` ``[dim // 6]`` float32."""

    grid: torch.Tensor
    freqs: torch.Tensor


def ltx_rope_coords(rope: torch.nn.Module, hidden_states: torch.Tensor, num_frames: int | None = None,
                    height: int | None = None, width: int | None = None, rope_interpolation_scale=None,
                    video_coords: torch.Tensor | None = None) -> LTXRopeCoords:
    """``LTXVideoRotaryPosEmbed.forward`` up to (not including) its angles: the same arguments, and
    the same float32 ops on the same device (the grid through the module's own
    ``_prepare_video_coords``), so the kernels' cos/sin equal the module's tables bit for bit
    (tests/rope/test_rope.py checks that on the GPU). ``inject`` makes it the rope module's forward when
    every attention of the model takes our processor (``_ltx_rope_coords_patch``)."""
    if video_coords is None:
        grid = rope._prepare_video_coords(hidden_states.size(0), num_frames, height, width,
                                          rope_interpolation_scale=rope_interpolation_scale,
                                          device=hidden_states.device)
    else:
        grid = torch.stack([video_coords[:, 0] / rope.base_num_frames, video_coords[:, 1] / rope.base_height,
                            video_coords[:, 2] / rope.base_width], dim=-1)
    freqs = rope.theta ** torch.linspace(math.log(1.0, rope.theta), math.log(rope.theta, rope.theta), rope.dim // 6,
                                         device=hidden_states.device, dtype=torch.float32)
    return LTXRopeCoords(grid, freqs * math.pi / 2.0)


def _ltx_attention_skip(m: torch.nn.Module) -> str | None:
    if not isinstance(getattr(m, "norm_q", None), torch.nn.RMSNorm):
        return "q/k norm is not torch.nn.RMSNorm (not the LTX-Video 0.9 attention)"
    return None


def _ltx_rope_skip(model: torch.nn.Module) -> str | None:
    if type(getattr(model, "rope", None)).__name__ != "LTXVideoRotaryPosEmbed":
        return "its rope module is not LTXVideoRotaryPosEmbed"
    if getattr(model, "_parallel_config", None) is not None:  # its plan splits the rope's two [B, S, C] tables
        return "context parallelism splits the rope tables along the sequence"
    # The coordinates reach every attention of the model: each must take our processor, which
    # tells coordinates from tables (diffusers' processors take only tables).
    attentions = [m for m in model.modules() if type(m).__name__ == "LTXAttention"]
    reasons = {why for why in map(_ltx_attention_skip, attentions) if why is not None}
    return f"its attention keeps diffusers' processor ({'; '.join(sorted(reasons))})" if reasons else None


def _ltx_rope_coords_patch(model: torch.nn.Module, inj) -> None:
    """The rope module returns the coordinates its tables come from (``ltx_rope_coords``), not
    the fp32 tables: the attention kernels compute cos/sin from them, reading 2 x 4 bytes per
    channel less per token for each of q and k, and the tables are never built."""
    inj.set_forward(model.rope, ltx_rope_coords)


def _ltx_merged_projections_skip(block: torch.nn.Module) -> str | None:
    """Why neither attention of an LTX block merges: its self-attention (attn1) merges q/k/v, its
    cross-attention (attn2) k/v (they read the caption; q reads the video tokens), each where it
    takes our processor and its projections can merge."""
    reasons = []
    for name, names in (("attn1", QKV), ("attn2", KV)):
        attn = getattr(block, name, None)
        why = (f"no {name}" if attn is None else _ltx_attention_skip(attn) or merging.mergeable(attn, names))
        if why is None:
            return None
        reasons.append(f"{name}: {why}")
    return "; ".join(reasons)


def _self_attention_gemms(block: torch.nn.Module) -> list:
    """The GEMMs that read the self-attention's input: its q/k/v, where our processor (which takes
    QuantizedRows) runs it."""
    attn = block.attn1
    return fp8.input_gemms(attn, "qkv", QKV) if isinstance(attn.processor, LTXAttnProcessor) else []


def _feed_forward_gemms(block: torch.nn.Module) -> list:
    return fp8.feed_forward_input_gemms(block.ff)


def _patch_ltx_block(block: torch.nn.Module, inj) -> None:
    """The fused block forward; its two modulated norms produce the self-attention's and the FFN's
    inputs (``fp8.produces``: in FP8 where inject(fp8=True) plans it)."""
    plan = fp8.produces(inj, block, attn1=_self_attention_gemms, ff=_feed_forward_gemms)
    inj.set_forward(block, _ltx_block_forward(inj.tk, plan))


def _merge_ltx_block(block: torch.nn.Module, inj) -> None:
    for name, key, names in (("attn1", "qkv", QKV), ("attn2", "kv", KV)):
        attn = getattr(block, name, None)
        if attn is not None and _ltx_attention_skip(attn) is None and merging.mergeable(attn, names) is None:
            inj.merge(attn, key, names, "ltx_merged_projections")


# The ops of the LTX attention rules under grad: the rotation (from the tables or the coordinates);
# the q/k norms run our kernel where it has a backward, the modules' own norms otherwise.
_LTX_ROTATION = ("rope", "ltx_rope_from_coords")

RULES: tuple[Rule, ...] = (
    # the attention ops read the coordinates (ltx_*_from_coords): this rule runs no op itself
    Rule("ltx_rope_coords", ("rope",), named("LTXVideoTransformer3DModel"), _ltx_rope_coords_patch,
         skip=_ltx_rope_skip, ops=(), training_ops=("ltx_rope_from_coords",)),
    # also=True: merges the projections its attentions' processor (any LTX attention rule below; all
    # need rope) reads, and leaves the block to ltx_block
    Rule("ltx_merged_projections", ("merge_projections", "rope"), named("LTXVideoTransformerBlock"),
         _merge_ltx_block, skip=_ltx_merged_projections_skip, fallback=MERGED_FALLBACK, also=True, ops=(),
         merges=("qkv", "kv")),
    Rule("ltx_block", ("rms_norm", "norm_modulate"), named("LTXVideoTransformerBlock"),
         _patch_ltx_block, claims=("norm1", "norm2"),
         ops=("norm_modulate", "gated_add", "gated_add_norm_modulate")),
    # self-attention fused from the coordinates; the cross-attention's norms
    Rule("ltx_attention", ("rms_norm", "rope", "qk_norm_rope"), named("LTXAttention"),
         processor(LTXAttnProcessor), claims=("norm_q", "norm_k"), skip=_ltx_attention_skip,
         ops=("ltx_qk_norm_rope_from_coords", "rms_norm"), training_ops=_LTX_ROTATION),
    Rule("ltx_attention_unfused", ("rms_norm", "rope"), named("LTXAttention"),
         processor(LTXAttnProcessor, fuse=False), claims=("norm_q", "norm_k"), skip=_ltx_attention_skip,
         ops=("rms_norm", "ltx_rope_from_coords"), training_ops=_LTX_ROTATION),
    Rule("ltx_attention_rope", ("rope",), named("LTXAttention"), processor(LTXAttnProcessor, qk_norm=False),
         skip=_ltx_attention_skip, ops=("ltx_rope_from_coords",), training_ops=_LTX_ROTATION),
)
