"""The qk_norm_rope family's cases of the reliability tests (tests/reliability/): CUDA-graph captures,
bad inputs the fakes refuse like the kernels and the binding's limits (head and row counts past 32 bits,
float64, eps = inf). Its inputs and the limits' messages are the rope family's (the rotation it
composes). Each dict is gathered, with the other families' dicts of its name, by the test that checks it
(tests/families.py)."""

import torch

from families import family_module
from reliability_inputs import BIG, bf, expanded, f32, out_forms, t

rope = family_module("rope", "reliability")
hf_inputs, ltx_inputs, flux, ltx_qk = rope.hf_inputs, rope.ltx_inputs, rope.flux, rope.ltx_qk
rope_tables, HEADS_MSG, ROPE_ROWS_MSG = rope.rope_tables, rope.HEADS_MSG, rope.ROPE_ROWS_MSG


# ---- CUDA graphs (test_cuda_graphs.py) ----


def _cuda_graph_cases():
    c = {}
    def qwen3(tk, t):  # hf_qk_norm_rope takes [B, S, H, d]: the views before the transpose
        return tk.ops.hf_qk_norm_rope.default(t["q"].transpose(1, 2), t["k"].transpose(1, 2), t["qw"], t["kw"], 1e-6,
                                              t["cos"], t["sin"])

    c["hf_qk_norm_rope"] = (hf_inputs(4, 1), qwen3)
    c["hf_qk_norm_rope_out"] = (hf_inputs(1, 256), lambda tk, t: out_forms(
        lambda qo, ko: tk.ops.hf_qk_norm_rope_out.default(qo, ko, t["q"].transpose(1, 2), t["k"].transpose(1, 2),
                                                          t["qw"], t["kw"], 1e-6, t["cos"], t["sin"]),
        t["q"].transpose(1, 2), t["k"].transpose(1, 2)))

    def flux_qk(tk, t):
        return tk.ops.qk_norm_rope.default(t["q"], t["k"], t["q"][0, 0, 0].float().abs() + 0.5,
                                           t["k"][0, 0, 0].float().abs() + 0.5, 1e-6, t["cos"], t["sin"])

    c["qk_norm_rope/flux"] = (flux, flux_qk)

    c["qk_norm_rope/ltx_shared_tables"] = (ltx_qk, lambda tk, t: tk.ops.qk_norm_rope.default(
        t["q"].unsqueeze(2), t["k"].unsqueeze(2), t["qw"], t["kw"], 1e-6, t["cos"], t["sin"]))
    c["qk_norm_rope/wide_rows"] = (ltx_inputs(1, 64, 32768), lambda tk, t: tk.ops.qk_norm_rope.default(
        t["q"].unsqueeze(2), t["k"].unsqueeze(2), t["qw"], t["kw"], 1e-6, t["cos"], t["sin"]))

    c["ltx_qk_norm_rope_from_coords"] = (ltx_qk, lambda tk, t: tk.ops.ltx_qk_norm_rope_from_coords.default(
        t["q"], t["k"], t["qw"], t["kw"], 1e-6, t["grid"], t["freqs"]))

    c["qk_norm_rope_backward"] = (flux, lambda tk, t: tk.ops.qk_norm_rope_backward.default(
        t["q"], t["k"], t["q"], t["k"], t["q"][0, 0, 0].float().abs() + 0.5, t["k"][0, 0, 0].float().abs() + 0.5,
        1e-6, t["cos"], t["sin"], [True] * 4))
    c["hf_qk_norm_rope_backward"] = (hf_inputs(1, 256), lambda tk, t: tk.ops.hf_qk_norm_rope_backward.default(
        t["q"].transpose(1, 2), t["k"].transpose(1, 2), t["q"].transpose(1, 2), t["k"].transpose(1, 2), t["qw"],
        t["kw"], 1e-6, t["cos"], t["sin"], [True] * 4))
    c["ltx_qk_norm_rope_from_coords_backward"] = (ltx_qk, lambda tk, t: (
        tk.ops.ltx_qk_norm_rope_from_coords_backward.default(t["q"], t["k"], t["q"], t["k"], t["qw"], t["kw"], 1e-6,
                                                             t["grid"], t["freqs"], [True] * 4)))
    return c


# name (op/label) -> (inputs(): the tensors a replay reads, call(tk, inputs) -> outputs): at a main shape of
# the models the op serves and at one of each other launch path (tests/reliability/test_cuda_graphs.py)
CUDA_GRAPH_CASES = _cuda_graph_cases()


# ---- bad inputs (test_fakes_check_like_kernels.py) ----

# name -> (call(tk, device), exception type, message regex): the fakes on meta raise what the kernel raises
# (tests/reliability/test_fakes_check_like_kernels.py)
BAD_INPUTS = {
    "hf_qk_norm_rope_eps_negative": (lambda tk, d: tk.hf_qk_norm_rope(t(d, 1, 4, 2, 64), t(d, 1, 4, 1, 64),
                                                                      t(d, 64), t(d, 64), -1.0, t(d, 1, 4, 64),
                                                                      t(d, 1, 4, 64)),
                                     ValueError, "eps must be a finite number >= 0"),
}


# ---- the binding's limits (test_reliability_validation.py) ----

# head counts in 32 bits, at most one block per row of head_dim: name -> (call(tk), message)
HEAD_AND_ROW_LIMITS = {
    "qk_norm_rope_heads": (lambda t: t.ops.qk_norm_rope(expanded(1, 1, BIG), bf(1, 1, 1, 2), bf(2), bf(2), 1e-6,
                                                        *rope_tables(1, dtype=torch.float32)), HEADS_MSG),
    "hf_qk_norm_rope_heads": (lambda t: t.hf_qk_norm_rope(expanded(1, 1, BIG), bf(1, 1, 1, 2), bf(2), bf(2), 1e-6,
                                                          *rope_tables(1)), HEADS_MSG),
    "hf_qk_norm_rope_rows": (lambda t: t.hf_qk_norm_rope(expanded(2**16, 2**15, 1), expanded(2**16, 2**15, 1), bf(2),
                                                         bf(2), 1e-6, *rope_tables(2**15)), ROPE_ROWS_MSG),
    "ltx_qk_norm_rope_from_coords_rows": (lambda t: t.ltx_qk_norm_rope_from_coords(
        expanded(2**16, 2**15), expanded(2**16, 2**15), bf(2), bf(2), 1e-6, f32(1, 2**15, 3), f32(0)), ROPE_ROWS_MSG),
}

# name -> (call(tk, x float64), message)
FLOAT64_INPUTS = {
    "qk_norm_rope": (lambda t, x: t.qk_norm_rope(x[None], x[None], x[0, 0], x[0, 0], 1e-6, x[0], x[0]),
                     "qk_norm_rope: q must be float32"),
}

INF = float("inf")
INFINITE_EPS = {
    "ltx_qk_norm_rope": lambda t: t.ltx_qk_norm_rope(bf(1, 4, 64), bf(1, 4, 64), bf(64), bf(64), INF, f32(1, 4, 64),
                                                     f32(1, 4, 64)),
    "hf_qk_norm_rope": lambda t: t.hf_qk_norm_rope(bf(1, 4, 2, 64), bf(1, 4, 1, 64), bf(64), bf(64), INF, bf(1, 4, 64),
                                                   bf(1, 4, 64)),
    "ltx_qk_norm_rope_from_coords": lambda t: t.ltx_qk_norm_rope_from_coords(bf(1, 4, 64), bf(1, 4, 64), bf(64), bf(64),
                                                                             INF, f32(1, 4, 3), f32(10)),
}
