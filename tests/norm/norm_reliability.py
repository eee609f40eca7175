"""The norm family's cases of the reliability tests (tests/reliability/): CUDA-graph captures, bad
inputs the fakes refuse like the kernels and the binding's limits (rows past 2^31 - 1, float64, eps =
inf, overlapping and aliased outputs). Each dict is gathered, with the other families' dicts of its
name, by the test that checks it (tests/families.py)."""

import torch

from reliability_inputs import (
    BF16,
    BIG,
    bf,
    elementwise_inputs,
    expanded,
    expanded_on,
    out_form,
    out_forms,
    rand,
    shifted,
    t,
)


# ---- CUDA graphs (test_cuda_graphs.py) ----

def _cuda_graph_cases():
    c = {}
    act = elementwise_inputs  # gated_add: the elementwise kernel's gated form
    hidden = 4096

    def norm_inputs(rows, h, weight_dtype=BF16):
        return lambda: {"x": rand(*rows, h), "r": rand(*rows, h), "w": rand(h, dtype=weight_dtype, scale=0.2)}

    for label, rows, h in [("decode", (4, 1), hidden), ("prefill", (2, 333), hidden), ("block_rows", (3, 7), 8192),
                           ("split_rows", (2,), 65536)]:
        c[f"rms_norm/{label}"] = (norm_inputs(rows, h),
                                  lambda tk, t: (tk.ops.rms_norm.default(t["x"], t["w"], 1e-6, "hf"),))
    c["rms_norm_out"] = (norm_inputs((2, 333), hidden), lambda tk, t: out_form(
        lambda o: tk.ops.rms_norm_out.default(o, t["x"], t["w"], 1e-6, "diffusers"), t["x"]))
    c["rms_norm/fp32_weight"] = (norm_inputs((64,), hidden, torch.float32),
                                 lambda tk, t: (tk.ops.rms_norm.default(t["x"], t["w"], 1e-6, "hf"),))
    c["fused_add_rms_norm"] = (norm_inputs((4, 1), hidden),
                               lambda tk, t: tk.ops.fused_add_rms_norm.default(t["x"], t["r"], t["w"], 1e-5, "hf"))
    c["fused_add_rms_norm/split_rows"] = (norm_inputs((2,), 32768), lambda tk, t: tk.ops.fused_add_rms_norm.default(
        t["x"], t["r"], t["w"], 1e-5, "hf"))
    c["fused_add_rms_norm_out"] = (norm_inputs((64,), hidden), lambda tk, t: out_forms(
        lambda o, h: tk.ops.fused_add_rms_norm_out.default(o, h, t["x"], t["r"], t["w"], 1e-5, "hf"), t["x"], t["x"]))

    def fused_inplace(tk, t):
        x, r = t["x"].clone(), t["r"].clone()
        tk.ops.fused_add_rms_norm_.default(x, r, t["w"], 1e-5, "hf")
        return x, r

    c["fused_add_rms_norm_"] = (norm_inputs((4, 1), hidden), fused_inplace)

    def ln_inputs(rows, h):
        return lambda: {"x": rand(*rows, h), "w": rand(h, scale=0.2), "b": rand(h, scale=0.2)}

    c["layer_norm"] = (ln_inputs((2, 1024), 3072),
                       lambda tk, t: (tk.ops.layer_norm.default(t["x"], t["w"], t["b"], 1e-6),))
    c["layer_norm_out"] = (ln_inputs((2, 1024), 3072), lambda tk, t: out_form(
        lambda o: tk.ops.layer_norm_out.default(o, t["x"], t["w"], t["b"], 1e-6), t["x"]))

    def mod_inputs(b, s, h):
        return lambda: {"x": rand(b, s, h), "y": rand(b, s, h), "gate": rand(b, 1, h, scale=0.5),
                        "scale": rand(b, 1, h, scale=0.2), "shift": rand(b, 1, h, scale=0.2), "w": rand(h, scale=0.2),
                        "bias": rand(h, scale=0.2)}

    ltx = mod_inputs(2, 1536, 2048)
    c["norm_modulate/rms"] = (ltx, lambda tk, t: (tk.ops.norm_modulate.default(
        t["x"], t["scale"], t["shift"], t["w"], None, 1e-6, "rms"),))
    c["norm_modulate/layer"] = (ltx, lambda tk, t: (tk.ops.norm_modulate.default(
        t["x"], t["scale"], t["shift"], t["w"], t["bias"], 1e-6, "layer"),))
    c["norm_modulate_out"] = (ltx, lambda tk, t: out_form(lambda o: tk.ops.norm_modulate_out.default(
        o, t["x"], t["scale"], t["shift"], None, None, 1e-6, "rms"), t["x"]))
    c["gated_add_norm_modulate"] = (ltx, lambda tk, t: tk.ops.gated_add_norm_modulate.default(
        t["x"], t["y"], t["gate"], t["scale"], t["shift"], t["w"], None, 1e-6, "rms"))
    c["gated_add_norm_modulate/no_gate"] = (ltx, lambda tk, t: tk.ops.gated_add_norm_modulate.default(
        t["x"], t["y"], None, t["scale"], t["shift"], None, None, 1e-6, "rms"))
    c["gated_add_norm_modulate_out"] = (ltx, lambda tk, t: out_forms(
        lambda o, h: tk.ops.gated_add_norm_modulate_out.default(o, h, t["x"], t["y"], t["gate"], t["scale"], t["shift"],
                                                                t["w"], t["bias"], 1e-6, "layer"), t["x"], t["x"]))

    c["gated_add"] = (act, lambda tk, t: (tk.ops.gated_add.default(t["x"], t["y"], t["gate"]),))
    c["gated_add_out"] = (act, lambda tk, t: out_form(
        lambda o: tk.ops.gated_add_out.default(o, t["x"], t["y"], t["gate"]), t["x"]))

    def norm_fp8(tk, t):  # LTX's residual add + AdaLN before its feed-forward, quantized for the FP8 GEMM
        codes, scale, h = tk.ops.gated_add_norm_modulate_fp8.default(t["x"], t["y"], t["g"], t["s"], t["sh"], None,
                                                                     None, 1e-6, "rms")
        return codes.float(), scale, h

    c["gated_add_norm_modulate_fp8"] = (lambda: {"x": rand(2, 512, 2048), "y": rand(2, 512, 2048),
                                                 "g": rand(2, 1, 2048), "s": rand(2, 1, 2048),
                                                 "sh": rand(2, 1, 2048)}, norm_fp8)

    def rms_fp8(tk, t):  # a Llama decoder layer's post-attention norm at decode, quantized
        codes, scale, h = tk.ops.fused_add_rms_norm_fp8.default(t["x"], t["r"], t["w"], 1e-5, "hf")
        return codes.float(), scale, h

    c["fused_add_rms_norm_fp8"] = (lambda: {"x": rand(4, 1, 4096), "r": rand(4, 1, 4096), "w": rand(4096)},
                                   rms_fp8)

    def codes_and_scale(pair):
        return pair[0].float(), pair[1]

    c["rms_norm_fp8"] = (lambda: {"x": rand(2, 77, 4096), "w": rand(4096)}, lambda tk, t: codes_and_scale(
        tk.ops.rms_norm_fp8.default(t["x"], t["w"], 1e-5, "hf")))
    c["layer_norm_fp8"] = (lambda: {"x": rand(2, 77, 1280), "w": rand(1280), "b": rand(1280)},
                           lambda tk, t: codes_and_scale(tk.ops.layer_norm_fp8.default(t["x"], t["w"], t["b"], 1e-5)))
    c["norm_modulate_fp8"] = (lambda: {"x": rand(2, 512, 3072), "s": rand(2, 1, 3072), "sh": rand(2, 1, 3072)},
                              lambda tk, t: codes_and_scale(tk.ops.norm_modulate_fp8.default(
                                  t["x"], t["s"], t["sh"], None, None, 1e-6, "layer")))

    c["gated_add_backward"] = (act, lambda tk, t: tk.ops.gated_add_backward.default(t["y"], t["x"], t["gate"],
                                                                                    [True, True]))

    c["rms_norm_backward"] = (norm_inputs((2, 333), hidden), lambda tk, t: tk.ops.rms_norm_backward.default(
        t["r"], t["x"], t["w"], 1e-6, [True, True]))
    c["fused_add_rms_norm_backward"] = (norm_inputs((2, 333), hidden), lambda tk, t: (
        tk.ops.fused_add_rms_norm_backward.default(t["r"], t["r"], t["x"], t["w"], 1e-6, [True, True])))
    c["layer_norm_backward"] = (ln_inputs((2, 1024), 3072), lambda tk, t: tk.ops.layer_norm_backward.default(
        t["x"], t["x"], t["w"], t["b"], 1e-6, [True, True, True]))
    c["norm_modulate_backward"] = (ltx, lambda tk, t: tk.ops.norm_modulate_backward.default(
        t["y"], t["x"], t["scale"], t["shift"], t["w"], None, 1e-6, "rms", [True] * 4 + [False]))
    c["gated_add_norm_modulate_backward"] = (ltx, lambda tk, t: tk.ops.gated_add_norm_modulate_backward.default(
        t["y"], t["y"], t["x"], t["y"], t["gate"], t["scale"], t["shift"], t["w"], None, 1e-6, "rms",
        [True] * 6 + [False]))
    return c


# name (op/label) -> (inputs(): the tensors a replay reads, call(tk, inputs) -> outputs): at a main shape of
# the models the op serves and at one of each other launch path (tests/reliability/test_cuda_graphs.py)
CUDA_GRAPH_CASES = _cuda_graph_cases()


# ---- bad inputs (test_fakes_check_like_kernels.py) ----

# name -> (call(tk, device), exception type, message regex): the fakes on meta raise what the kernel raises
# (tests/reliability/test_fakes_check_like_kernels.py)
BAD_INPUTS = {
    "rms_norm_float64_x": (lambda tk, d: tk.rms_norm(t(d, 4, 64, dtype=torch.float64)), TypeError,
                           "rms_norm: x must be float32, float16 or bfloat16, got Double"),
    "rms_norm_int32_x": (lambda tk, d: tk.rms_norm(t(d, 4, 64, dtype=torch.int32)), TypeError,
                         "rms_norm: x must be float32, float16 or bfloat16, got Int"),
    "rms_norm_eps_negative": (lambda tk, d: tk.rms_norm(t(d, 4, 64), t(d, 64), -1.0), ValueError,
                              "rms_norm: eps must be a finite number >= 0, got -1"),
    "rms_norm_eps_nan": (lambda tk, d: tk.rms_norm(t(d, 4, 64), t(d, 64), float("nan")), ValueError,
                         "rms_norm: eps must be a finite number >= 0, got nan"),
    "rms_norm_weight_63_for_64": (lambda tk, d: tk.rms_norm(t(d, 4, 64), t(d, 63), 1e-5), ValueError,
                                  r"rms_norm: weight must be 1-D with x.shape\[-1\] = 64 elements, got shape \[63\]"),
    "rms_norm_stride_4": (lambda tk, d: tk.rms_norm(t(d, 4, 256)[:, ::4], t(d, 64), 1e-5), ValueError,
                          "rms_norm: x must be contiguous in its last dimension"),
    "rms_norm_2_31_rows": (lambda tk, d: tk.rms_norm(expanded_on(d, BIG)), ValueError,
                           f"rms_norm: x has {BIG} rows; at most {BIG - 1} are supported"),
    "rms_norm_out_wrong_shape": (lambda tk, d: tk.rms_norm(t(d, 4, 64), t(d, 64), 1e-5, out=t(d, 4, 65)), ValueError,
                                 r"rms_norm: out must have the shape \[4, 64\], got \[4, 65\]"),
    "rms_norm_out_expanded": (lambda tk, d: tk.rms_norm(t(d, 4, 64), None, 1e-5, out=t(d, 1, 64).expand(4, 64)),
                              ValueError, "rms_norm: out must not have overlapping elements"),
    "fused_add_rms_norm_residual_shape": (lambda tk, d: tk.fused_add_rms_norm(t(d, 4, 64), t(d, 4, 32), t(d, 64)),
                                          ValueError, "fused_add_rms_norm: residual must have"),
    "layer_norm_bias_shape": (lambda tk, d: tk.layer_norm(t(d, 4, 64), t(d, 64), t(d, 32)), ValueError,
                              "layer_norm: bias must be 1-D"),
    "layer_norm_eps_inf": (lambda tk, d: tk.layer_norm(t(d, 4, 64), eps=float("inf")), ValueError,
                           "layer_norm: eps must be a finite number >= 0, got inf"),
    "norm_modulate_bad_norm": (lambda tk, d: tk.norm_modulate(t(d, 2, 4, 64), t(d, 2, 1, 64), norm="batch"),
                               ValueError, "norm_modulate: norm must be"),
    "norm_modulate_scale_width": (lambda tk, d: tk.norm_modulate(t(d, 2, 4, 64), t(d, 2, 1, 32)), ValueError,
                                  "norm_modulate: scale"),
    # the norms' FP8 outputs check their inputs as the norms do, under their own names
    "rms_norm_fp8_float64_x": (lambda tk, d: tk.rms_norm_fp8(t(d, 4, 64, dtype=torch.float64)), TypeError,
                               "rms_norm_fp8: x must be float32, float16 or bfloat16, got Double"),
    "rms_norm_fp8_rounding": (lambda tk, d: tk.rms_norm_fp8(t(d, 4, 64), rounding="vllm"), ValueError,
                              "rms_norm_fp8: rounding must be"),
    "fused_add_rms_norm_fp8_residual_shape": (lambda tk, d: tk.fused_add_rms_norm_fp8(t(d, 4, 64), t(d, 4, 32)),
                                              ValueError, "fused_add_rms_norm_fp8: residual"),
    "layer_norm_fp8_bias_width": (lambda tk, d: tk.layer_norm_fp8(t(d, 4, 64), None, t(d, 63)), ValueError,
                                  r"layer_norm_fp8: bias must be 1-D with x.shape\[-1\] = 64 elements"),
    "norm_modulate_fp8_bad_norm": (lambda tk, d: tk.norm_modulate_fp8(t(d, 2, 4, 64), t(d, 2, 1, 64), norm="batch"),
                                   ValueError, "norm_modulate_fp8: norm must be"),
    "gated_add_norm_modulate_fp8_y_shape": (lambda tk, d: tk.gated_add_norm_modulate_fp8(
        t(d, 2, 4, 64), t(d, 2, 3, 64), None, t(d, 2, 1, 64)), ValueError, "gated_add_norm_modulate_fp8: y"),
    "gated_add_dtype": (lambda tk, d: tk.gated_add(t(d, 4, 64), t(d, 4, 64, dtype=torch.float16), t(d, 64)),
                        TypeError, "gated_add: y"),
}


# ---- the binding's limits (test_reliability_validation.py) ----

# more rows than the grid holds: check_row_count
ROW_LIMITS = {
    "rms_norm": lambda t: t.rms_norm(expanded(BIG), None),
    "rms_norm_out": lambda t: t.rms_norm(expanded(BIG), None, out=expanded(BIG)),
    "fused_add_rms_norm": lambda t: t.fused_add_rms_norm(expanded(BIG), expanded(BIG)),
    "fused_add_rms_norm_": lambda t: t.fused_add_rms_norm_(expanded(BIG), expanded(BIG)),
    "layer_norm": lambda t: t.layer_norm(expanded(BIG)),
    "norm_modulate": lambda t: t.norm_modulate(expanded(BIG), bf(2)),
    "gated_add_norm_modulate": lambda t: t.gated_add_norm_modulate(expanded(BIG), expanded(BIG), bf(2), bf(2)),
    "gated_add": lambda t: t.gated_add(expanded(BIG), expanded(BIG), bf(2)),
    # 2^16 x 2^15 rows in two leading dimensions (their product overflows 32 bits)
    "rms_norm_3d": lambda t: t.rms_norm(expanded(2**16, 2**15), None),
}

# name -> (call(tk, x float64), message)
FLOAT64_INPUTS = {
    "rms_norm": (lambda t, x: t.rms_norm(x), "rms_norm: x must be float32, float16 or bfloat16, got Double"),
    "layer_norm": (lambda t, x: t.layer_norm(x), "layer_norm: x must be float32"),
    "fused_add_rms_norm": (lambda t, x: t.fused_add_rms_norm(x, x), "x must be float32"),
    "norm_modulate": (lambda t, x: t.norm_modulate(x, x), "norm_modulate: x must be float32"),
    "gated_add_norm_modulate": (lambda t, x: t.gated_add_norm_modulate(x, x, None, x), "x must be float32"),
    "gated_add": (lambda t, x: t.gated_add(x, x, x), "gated_add: x must be float32"),
}

INF = float("inf")
INFINITE_EPS = {
    "rms_norm": lambda t: t.rms_norm(bf(4, 64), bf(64), INF),
    "rms_norm_out": lambda t: t.rms_norm(bf(4, 64), bf(64), INF, out=bf(4, 64)),
    "fused_add_rms_norm": lambda t: t.fused_add_rms_norm(bf(4, 64), bf(4, 64), bf(64), INF),
    "fused_add_rms_norm_": lambda t: t.fused_add_rms_norm_(bf(4, 64), bf(4, 64), bf(64), INF),
    "layer_norm": lambda t: t.layer_norm(bf(4, 64), eps=INF),
    "norm_modulate": lambda t: t.norm_modulate(bf(2, 4, 64), bf(2, 1, 64), eps=INF),
    "gated_add_norm_modulate": lambda t: t.gated_add_norm_modulate(bf(2, 4, 64), bf(2, 4, 64), None, bf(2, 1, 64),
                                                                   eps=INF),
}


def fused_add_outs(t, same):
    a, b = (bf(4, 64),) * 2 if same else shifted(bf(4, 64))
    return t.fused_add_rms_norm(bf(4, 64), bf(4, 64), bf(64), out=a, residual_out=b)


def gated_outs(t, same):
    a, b = (bf(2, 4, 64),) * 2 if same else shifted(bf(2, 4, 64))
    return t.gated_add_norm_modulate(bf(2, 4, 64), bf(2, 4, 64), bf(2, 1, 64), bf(2, 1, 64), h_out=a, out=b)


# outputs that overlap each other; in-place operands that are expanded
OVERLAPS = {
    "fused_add_out_is_residual_out": (lambda t: fused_add_outs(t, True), "out must not share memory with residual_out"),
    "fused_add_out_overlaps_residual_out": (lambda t: fused_add_outs(t, False),
                                            "out must not share memory with residual_out"),
    "gated_out_is_h_out": (lambda t: gated_outs(t, True), "out must not share memory with h_out"),
    "gated_out_overlaps_h_out": (lambda t: gated_outs(t, False), "out must not share memory with h_out"),
    "fused_add_in_place_x_expanded": (lambda t: t.fused_add_rms_norm_(expanded(4, last=64), bf(4, 64), bf(64)),
                                      "x must not have overlapping elements"),
    "fused_add_in_place_residual_expanded": (lambda t: t.fused_add_rms_norm_(bf(4, 64), expanded(4, last=64), bf(64)),
                                             "residual must not have overlapping elements"),
}


def gated_add_out_over_gate(t):
    buf = bf(2, 3, 8)
    return t.gated_add(bf(2, 3, 8), bf(2, 3, 8), buf[:, :1], out=buf)


# outputs aliasing an input
ALIASED_OUTPUTS = {
    "gated_add_out_is_x": (lambda t: (lambda x: t.gated_add(x, bf(4, 8), bf(8), out=x))(bf(4, 8)),
                           "gated_add: out must not share memory with x"),
    "gated_add_out_is_y": (lambda t: (lambda y: t.gated_add(bf(4, 8), y, bf(8), out=y))(bf(4, 8)),
                           "gated_add: out must not share memory with y"),
    "gated_add_out_over_gate": (gated_add_out_over_gate, "gated_add: out must not share memory with gate"),
}
