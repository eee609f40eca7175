"""The quant family's cases of the reliability tests (tests/reliability/): CUDA-graph captures and bad
inputs the fakes refuse like the kernels. Each dict is gathered, with the other families' dicts of its
name, by the test that checks it (tests/families.py)."""

import torch

from reliability_inputs import rand, t


# ---- CUDA graphs (test_cuda_graphs.py) ----

def _cuda_graph_cases():
    c = {}
    # FP8 quantization of a GEMM input (the LTX FFN's [tokens, 2048]); the codes compared as float32
    def quantize(tk, t):
        codes, scale = tk.ops.quantize_fp8.default(t["x"])
        return codes.float(), scale

    c["quantize_fp8"] = (lambda: {"x": rand(2, 512, 2048, scale=3.0)}, quantize)

    def act_mul_fp8(tk, t):  # Llama-3.1-8B's down-projection input, from views of the merged gate/up output
        codes, scale = tk.ops.act_mul_fp8.default(t["gu"][..., :14336], t["gu"][..., 14336:], "silu")
        return codes.float(), scale

    c["act_mul_fp8"] = (lambda: {"gu": rand(64, 2 * 14336)}, act_mul_fp8)
    return c


# name (op/label) -> (inputs(): the tensors a replay reads, call(tk, inputs) -> outputs): at a main shape of
# the models the op serves and at one of each other launch path (tests/reliability/test_cuda_graphs.py)
CUDA_GRAPH_CASES = _cuda_graph_cases()


# ---- bad inputs (test_fakes_check_like_kernels.py) ----

# name -> (call(tk, device), exception type, message regex): the fakes on meta raise what the kernel raises
# (tests/reliability/test_fakes_check_like_kernels.py)
BAD_INPUTS = {
    "quantize_fp8_int_dtype": (lambda tk, d: tk.quantize_fp8(torch.zeros(4, 64, dtype=torch.int32, device=d)),
                               TypeError, "quantize_fp8: x must be"),
    "quantize_fp8_scalar": (lambda tk, d: tk.quantize_fp8(t(d, 4)[0]), ValueError,
                            "quantize_fp8: x must have at least one"),
    "quantize_fp8_last_dim_strided": (lambda tk, d: tk.quantize_fp8(t(d, 64, 4).t()), ValueError, "quantize_fp8: x"),
    "act_mul_fp8_act": (lambda tk, d: tk.act_mul_fp8(t(d, 4, 64), t(d, 4, 64), "relu"), ValueError,
                        "act_mul_fp8: activation must be"),
    "act_mul_fp8_up_shape": (lambda tk, d: tk.act_mul_fp8(t(d, 4, 64), t(d, 4, 32)), ValueError, "act_mul_fp8: up"),
}
