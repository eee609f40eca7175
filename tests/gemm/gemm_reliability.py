"""The gemm family's cases of the reliability tests (tests/reliability/): CUDA-graph captures, bad
inputs the fakes refuse like the kernels, and what its ops give for rows of no elements. Each dict is
gathered, with the other families' dicts of its name, by the test that checks it (tests/families.py)."""

import torch

from helpers import UNIT_ROUNDOFF
from reliability_inputs import out_form, rand, t


# ---- CUDA graphs (test_cuda_graphs.py) ----

def _cuda_graph_cases():
    c = {}
    # the FFN input projection of LTX-Video (2048 -> 8192), and a view the epilogue cannot take
    def ffn_inputs():
        return {"x": rand(2, 512, 2048), "w": rand(8192, 2048, scale=0.02), "b": rand(8192, scale=0.1),
                "xt": rand(16, 2, 2048).transpose(0, 1)}

    c["linear_gelu"] = (ffn_inputs, lambda tk, t: (tk.ops.linear_gelu.default(t["x"], t["w"], t["b"]),))
    c["linear_gelu/no_bias"] = (ffn_inputs, lambda tk, t: (tk.ops.linear_gelu.default(t["x"], t["w"], None),))
    c["linear_gelu/separate_path"] = (ffn_inputs, lambda tk, t: (tk.ops.linear_gelu.default(t["xt"], t["w"], t["b"]),))
    c["linear_gelu_out"] = (ffn_inputs, lambda tk, t: out_form(
        lambda o: tk.ops.linear_gelu_out.default(o, t["x"], t["w"], t["b"]), t["x"].new_empty(2, 512, 8192)))

    # a batch-1 decode step's q/k/v projection of Llama-3.1-8B (4096 -> 6144), bf16 and weight-only FP8
    def decode_inputs():
        from reference.fp8 import quantize_fp8_rowwise
        w = rand(6144, 4096, scale=0.02)
        codes, scale = quantize_fp8_rowwise(w)
        return {"x": rand(1, 1, 4096), "w": w, "w8": codes, "ws": scale.squeeze(-1)}

    c["decode_linear"] = (decode_inputs, lambda tk, t: (tk.ops.decode_linear.default(t["x"], t["w"], None, None),
                                                       tk.ops.decode_linear.default(t["x"], t["w8"], t["ws"], None)))

    # the FP8 linear of LTX's FFN input projection on quantized operands (codes and scales as inputs)
    def fp8_inputs():
        from reference.fp8 import quantize_fp8_rowwise

        x, xs = quantize_fp8_rowwise(rand(2, 512, 2048).cpu())
        w, ws = quantize_fp8_rowwise(rand(8192, 2048, scale=0.02).cpu())
        return {"x": x.cuda(), "xs": xs.cuda(), "w": w.cuda(), "ws": ws.squeeze(-1).cuda(), "b": rand(8192, scale=0.1)}

    c["linear_fp8"] = (fp8_inputs, lambda tk, t: (tk.ops.linear_fp8.default(
        t["x"], t["xs"], t["w"], t["ws"], t["b"], torch.bfloat16, "gelu_tanh"),))
    return c


# name (op/label) -> (inputs(): the tensors a replay reads, call(tk, inputs) -> outputs): at a main shape of
# the models the op serves and at one of each other launch path (tests/reliability/test_cuda_graphs.py)
CUDA_GRAPH_CASES = _cuda_graph_cases()


# ---- bad inputs (test_fakes_check_like_kernels.py) ----

# name -> (call(tk, device), exception type, message regex): the fakes on meta raise what the kernel raises
# (tests/reliability/test_fakes_check_like_kernels.py)
BAD_INPUTS = {
    "linear_gelu_in_features": (lambda tk, d: tk.linear_gelu(t(d, 4, 64), t(d, 96, 32)), ValueError,
                                "linear_gelu"),
    "linear_gelu_bias_shape": (lambda tk, d: tk.linear_gelu(t(d, 4, 64), t(d, 96, 64), t(d, 95)), ValueError,
                               "linear_gelu: bias"),
    "linear_fp8_x_dtype": (lambda tk, d: tk.linear_fp8(t(d, 4, 64), t(d, 4, 1, dtype=torch.float32),
                                                       t(d, 32, 64).to(torch.float8_e4m3fn),
                                                       t(d, 32, dtype=torch.float32)),
                           TypeError, "linear_fp8: x must have dtype Float8_e4m3fn"),
    "linear_fp8_in_features": (lambda tk, d: tk.linear_fp8(t(d, 4, 40).to(torch.float8_e4m3fn),
                                                           t(d, 4, 1, dtype=torch.float32),
                                                           t(d, 32, 40).to(torch.float8_e4m3fn),
                                                           t(d, 32, dtype=torch.float32)),
                               ValueError, "linear_fp8: in_features .* must be a multiple of 16"),
    "linear_fp8_scale_shape": (lambda tk, d: tk.linear_fp8(t(d, 4, 64).to(torch.float8_e4m3fn),
                                                           t(d, 4, dtype=torch.float32),
                                                           t(d, 32, 64).to(torch.float8_e4m3fn),
                                                           t(d, 32, dtype=torch.float32)),
                               ValueError, "linear_fp8: x_scale must be"),
    "linear_fp8_out_dtype": (lambda tk, d: tk.linear_fp8(t(d, 4, 64).to(torch.float8_e4m3fn),
                                                         t(d, 4, 1, dtype=torch.float32),
                                                         t(d, 32, 64).to(torch.float8_e4m3fn),
                                                         t(d, 32, dtype=torch.float32), out_dtype=torch.float32),
                             TypeError, "linear_fp8: out_dtype must be bfloat16 or float16"),
    "decode_linear_rows": (lambda tk, d: tk.decode_linear(t(d, 9, 64), t(d, 32, 64)), ValueError,
                           "decode_linear: x must have at most 8 rows"),
    "decode_linear_fp8_without_scale": (lambda tk, d: tk.decode_linear(t(d, 2, 64),
                                                                       t(d, 32, 64).to(torch.float8_e4m3fn)),
                                        ValueError, "decode_linear: a float8_e4m3fn weight needs its weight_scale"),
    "decode_linear_k_multiple": (lambda tk, d: tk.decode_linear(t(d, 2, 60), t(d, 32, 60)), ValueError,
                                 r"decode_linear: in_features \(x.shape\[-1\]\) must be a multiple of 8"),
    "decode_linear_weight_dtype": (lambda tk, d: tk.decode_linear(t(d, 2, 64), t(d, 32, 64, dtype=torch.float16)),
                                   TypeError, "decode_linear: weight must have x's dtype"),
}


# ---- rows of no elements (test_reliability_ops.py's check_empty) ----

def _no_bias_sums_nothing(call, outs, what):
    """linear_fp8 without a bias: sums of nothing, zeros."""
    assert len(outs) == 1 and bool((outs[0].float() == 0).all()), what


def _the_bias(call, outs, what):
    """decode_linear: sums of nothing, plus the bias."""
    bias = call.args[3]
    want = torch.zeros_like(outs[0]) if bias is None else bias.expand_as(outs[0])
    assert len(outs) == 1 and torch.equal(outs[0], want), what


def _gelu_of_the_bias(call, outs, what):
    """linear_gelu: gelu_tanh(bias) (0 without one), as F.linear + F.gelu give."""
    x, w, b = call.args[-3:]
    ref = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b), approximate="tanh")
    assert len(outs) == 1 and outs[0].shape == ref.shape, what
    u = UNIT_ROUNDOFF[x.dtype]  # gelu_tanh of one value, ours and eager's: a few roundings apart
    torch.testing.assert_close(outs[0], ref, rtol=8 * u, atol=8 * u, equal_nan=False,
                               msg=f"{what}: gelu_tanh(bias) expected")


# op -> check(call, outputs, what): the outputs of its "empty_width" case (in_features 0); returns the
# outputs left for the generic check (empty or zeros), None when it checked them all
EMPTY_WIDTH_RESULTS = {"linear_fp8": _no_bias_sums_nothing, "decode_linear": _the_bias,
                       "linear_gelu": _gelu_of_the_bias, "linear_gelu_out": _gelu_of_the_bias}
