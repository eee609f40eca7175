"""The activation family's cases of the reliability tests (tests/reliability/): CUDA-graph captures, bad
inputs the fakes refuse like the kernels and the binding's limits (rows past 2^31 - 1, float64, outputs
aliasing an input). Each dict is gathered, with the other families' dicts of its name, by the test that
checks it (tests/families.py)."""

import torch

from reliability_inputs import BIG, bf, elementwise_inputs, expanded, expanded_on, out_form, shifted, t


# ---- CUDA graphs (test_cuda_graphs.py) ----

def _cuda_graph_cases():
    c = {}
    act = elementwise_inputs
    for a in ("silu", "gelu", "gelu_tanh"):
        c[f"activation/{a}"] = (act, lambda tk, t, a=a: (tk.ops.activation.default(t["x"], a),))
    c["activation_out"] = (act, lambda tk, t: out_form(
        lambda o: tk.ops.activation_out.default(o, t["x"], "gelu_tanh"), t["x"]))
    c["act_and_mul"] = (act, lambda tk, t: (tk.ops.act_and_mul.default(t["x"], "gelu", False),))
    c["act_and_mul_out"] = (act, lambda tk, t: out_form(
        lambda o: tk.ops.act_and_mul_out.default(o, t["x"], "silu", True), t["x"][..., :4096]))
    c["act_mul"] = (act, lambda tk, t: (tk.ops.act_mul.default(t["g"], t["u"], "silu"),))
    c["act_mul_out"] = (act, lambda tk, t: out_form(
        lambda o: tk.ops.act_mul_out.default(o, t["g"], t["u"], "silu"), t["g"]))

    c["activation_backward"] = (act, lambda tk, t: (tk.ops.activation_backward.default(t["y"], t["x"], "gelu_tanh"),))
    c["act_and_mul_backward"] = (act, lambda tk, t: (tk.ops.act_and_mul_backward.default(
        t["y"][..., :4096], t["x"], "silu", True),))
    c["act_mul_backward"] = (act, lambda tk, t: tk.ops.act_mul_backward.default(t["g"], t["g"], t["u"], "silu"))
    return c


# name (op/label) -> (inputs(): the tensors a replay reads, call(tk, inputs) -> outputs): at a main shape of
# the models the op serves and at one of each other launch path (tests/reliability/test_cuda_graphs.py)
CUDA_GRAPH_CASES = _cuda_graph_cases()


# ---- bad inputs (test_fakes_check_like_kernels.py) ----

# name -> (call(tk, device), exception type, message regex): the fakes on meta raise what the kernel raises
# (tests/reliability/test_fakes_check_like_kernels.py)
BAD_INPUTS = {
    "silu_float64": (lambda tk, d: tk.silu(t(d, 4, 64, dtype=torch.float64)), TypeError,
                     "x must be float32, float16 or bfloat16"),
    "gelu_bad_approximate": (lambda tk, d: tk.gelu(t(d, 4, 64), approximate="erf"), ValueError, "approximate"),
    "silu_and_mul_odd_width": (lambda tk, d: tk.silu_and_mul(t(d, 4, 63)), ValueError, "silu_and_mul|act_and_mul"),
    "act_mul_mismatched_shapes": (lambda tk, d: tk.act_mul(t(d, 4, 64), t(d, 4, 32)), ValueError,
                                  r"act_mul: up must have the shape of gate \[4, 64\], got \[4, 32\]"),
    "act_mul_2_31_rows": (lambda tk, d: tk.act_mul(expanded_on(d, BIG), expanded_on(d, BIG)), ValueError,
                          f"has {BIG} rows"),
}


# ---- the binding's limits (test_reliability_validation.py) ----

# more rows than the grid holds: check_row_count
ROW_LIMITS = {
    "activation": lambda t: t.silu(expanded(BIG)),
    "act_and_mul": lambda t: t.silu_and_mul(expanded(BIG, last=4)),
    "act_mul": lambda t: t.act_mul(expanded(BIG), expanded(BIG)),
}

# name -> (call(tk, x float64), message)
FLOAT64_INPUTS = {
    "activation": (lambda t, x: t.gelu(x), "activation: x must be float32"),
    "act_and_mul": (lambda t, x: t.geglu(x), "act_and_mul: x must be float32"),
    "act_mul": (lambda t, x: t.act_mul(x, x), "act_mul: gate must be float32"),
}

# outputs aliasing an input
ALIASED_OUTPUTS = {
    "act_mul_out_is_gate": (lambda t: (lambda g: t.act_mul(g, bf(4, 8), out=g))(bf(4, 8)),
                            "act_mul: out must not share memory with gate"),
    "act_mul_out_is_up": (lambda t: (lambda u: t.act_mul(bf(4, 8), u, out=u))(bf(4, 8)),
                          "act_mul: out must not share memory with up"),
    "act_mul_out_overlaps_up": (lambda t: (lambda a: t.act_mul(bf(4, 8), a[0], out=a[1]))(shifted(bf(4, 8))),
                                "out must not share memory with up"),
    "silu_and_mul_out_in_x": (lambda t: (lambda x: t.silu_and_mul(x, out=x[:, :4]))(bf(4, 8)),
                              "act_and_mul: out must not share memory with x"),
    "act_mul_out_expanded": (lambda t: t.act_mul(bf(4, 8), bf(4, 8), out=expanded(4, last=8)),
                             "out must not have overlapping elements"),
}
