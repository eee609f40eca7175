"""The qk_norm_rope family's catalog entries (tests/op_catalog.py gathers them): the fused q/k norm +
RoPE of Flux (per head), Qwen3 (hf_qk_norm_rope and its out= form) and LTX-Video (across heads, cos/sin
from coordinates), and their backward ops. It composes the rope family (csrc/qk_norm_rope includes
its rotation), and so do its cases: the q/k operands and tables are rope's (ROPE_SHAPES' cases)."""

import torch

from families import family_module
from op_catalog import EPS

rope = family_module("rope", "cases")
ROPE_SHAPES, qk, neox_tables, interleaved_tables = rope.ROPE_SHAPES, rope.qk, rope.neox_tables, rope.interleaved_tables
ltx_coords, ltx_qk3 = rope.ltx_coords, rope.ltx_qk3
CASES = rope.CASES


def entries():
    def qk_norm(fp32_weights: bool):
        def build(m, case):
            (B, S, Hq, Hk, d), _ = ROPE_SHAPES[case]
            q, k = qk(m, case, pairs=True)
            wd = torch.float32 if fp32_weights else None
            cos, sin = interleaved_tables(m, 1, S, d)
            return (q, k, m.param(d, wd), m.param(d, wd), EPS, cos, sin), ()
        return build

    def hf_qk_norm(out: bool):
        def build(m, case):
            (B, S, Hq, Hk, d), lay = ROPE_SHAPES[case]
            q, k = qk(m, case)
            cos, sin = neox_tables(m, B, S, d, m.dtype)
            args = (q, k, m.param(d), m.param(d), EPS, cos, sin)
            if not out:
                return args, ()
            out_layout = "strided" if lay == "fused" else lay
            return (m.nan(q.shape, out_layout), m.nan(k.shape, out_layout), *args), (0, 1)
        return build

    def ltx(m, case):
        q, k, (B, S, C) = ltx_qk3(m, case, pairs=True)
        grid, freqs = ltx_coords(m, B, S, C)
        return (q, k, m.param(C), m.param(C), EPS, grid, freqs), ()

    def qk_backward(forward, pairs: bool, mask):
        def build(m, case):
            args, _ = forward(m, case)
            grad_q, grad_k = qk(m, case, pairs=pairs)
            return (grad_q, grad_k, *args, list(mask)), ()
        return build

    def ltx_qk_backward(mask):
        def build(m, case):
            args, _ = ltx(m, case)
            grad_q, grad_k, _ = ltx_qk3(m, case, pairs=True)
            return (grad_q, grad_k, *args, list(mask)), ()
        return build

    return {
        "qk_norm_rope": ("qk_norm_rope", qk_norm(False)),
        "qk_norm_rope[fp32_weights]": ("qk_norm_rope", qk_norm(True)),
        "hf_qk_norm_rope": ("hf_qk_norm_rope", hf_qk_norm(False)),
        "hf_qk_norm_rope_out": ("hf_qk_norm_rope_out", hf_qk_norm(True)),
        "ltx_qk_norm_rope_from_coords": ("ltx_qk_norm_rope_from_coords", ltx),
        # the fused q/k norm + RoPE backward: grad_q, grad_k in q's and k's layout, the forward's inputs, the mask
        "qk_norm_rope_backward": ("qk_norm_rope_backward", qk_backward(qk_norm(False), True, [True] * 4)),
        "qk_norm_rope_backward[fp32_weights,dqk]": ("qk_norm_rope_backward", qk_backward(qk_norm(True), True,
                                                                                          [True, True, False, False])),
        "hf_qk_norm_rope_backward": ("hf_qk_norm_rope_backward", qk_backward(hf_qk_norm(False), False, [True] * 4)),
        "ltx_qk_norm_rope_from_coords_backward": ("ltx_qk_norm_rope_from_coords_backward",
                                                  ltx_qk_backward([True] * 4)),
    }
