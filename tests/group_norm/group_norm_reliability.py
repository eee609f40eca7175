"""The group_norm family's cases of the reliability tests (tests/reliability/): CUDA-graph captures and
bad inputs the fakes refuse like the kernels. Each dict is gathered, with the other families' dicts of
its name, by the test that checks it (tests/families.py)."""

import torch

from reliability_inputs import out_form, rand, t


# ---- CUDA graphs (test_cuda_graphs.py) ----

def _cuda_graph_cases():
    c = {}
    # GroupNorm (SD resnets): whole groups, split groups (inline and finalize-kernel combine),
    # channels-last (three kernels), the time add; the statistics workspace comes from the graph's pool
    def gn_inputs(n, c_, h, w):
        return lambda: {"x": rand(n, c_, h, w), "xl": rand(n, h, w, c_).permute(0, 3, 1, 2), "temb": rand(n, c_),
                        "w": rand(c_, scale=0.2), "b": rand(c_, scale=0.2)}

    for label, shape in [("whole", (64, 64, 8, 8)), ("split", (2, 320, 64, 64)), ("finalize", (1, 128, 256, 256))]:
        c[f"group_norm/{label}"] = (gn_inputs(*shape), lambda tk, t: (tk.ops.group_norm.default(
            t["x"], 32, t["w"], t["b"], 1e-5, "silu"),))
    c["group_norm/channels_last"] = (gn_inputs(2, 320, 64, 64), lambda tk, t: (tk.ops.group_norm.default(
        t["xl"], 32, t["w"], t["b"], 1e-5, "silu"),))
    c["group_norm_out"] = (gn_inputs(2, 320, 32, 32), lambda tk, t: out_form(lambda o: tk.ops.group_norm_out.default(
        o, t["x"], 32, None, None, 1e-6, "none"), t["x"]))
    c["add_group_norm"] = (gn_inputs(2, 320, 64, 64), lambda tk, t: (tk.ops.add_group_norm.default(
        t["x"], t["temb"], 32, t["w"], t["b"], 1e-5, "silu"),))
    c["add_group_norm/channels_last"] = (gn_inputs(2, 640, 32, 32), lambda tk, t: (tk.ops.add_group_norm.default(
        t["xl"], t["temb"], 32, t["w"], t["b"], 1e-5, "silu"),))
    c["add_group_norm_out"] = (gn_inputs(2, 320, 32, 32), lambda tk, t: out_form(
        lambda o: tk.ops.add_group_norm_out.default(o, t["x"], t["temb"], 32, t["w"], t["b"], 1e-5, "silu"), t["x"]))
    # the backward of ResnetBlock2D's norm2 + SiLU (SD fine-tuning), both layouts; its workspace from the pool
    c["group_norm_backward"] = (gn_inputs(2, 320, 32, 32), lambda tk, t: tk.ops.group_norm_backward.default(
        t["x"], t["x"], t["temb"], 32, t["w"], t["b"], 1e-5, "silu", [True] * 4))
    c["group_norm_backward/channels_last"] = (gn_inputs(2, 320, 32, 32), lambda tk, t: tk.ops.group_norm_backward.default(
        t["xl"], t["xl"], None, 32, t["w"], t["b"], 1e-5, "silu", [True, False, True, True])[::2])
    return c


# name (op/label) -> (inputs(): the tensors a replay reads, call(tk, inputs) -> outputs): at a main shape of
# the models the op serves and at one of each other launch path (tests/reliability/test_cuda_graphs.py)
CUDA_GRAPH_CASES = _cuda_graph_cases()


# ---- bad inputs (test_fakes_check_like_kernels.py) ----

# name -> (call(tk, device), exception type, message regex): the fakes on meta raise what the kernel raises
# (tests/reliability/test_fakes_check_like_kernels.py)
BAD_INPUTS = {
    "group_norm_groups_not_dividing": (lambda tk, d: tk.group_norm(t(d, 2, 30, 4, 4), 8), ValueError,
                                       "group_norm"),
    "group_norm_weight_shape": (lambda tk, d: tk.group_norm(t(d, 2, 32, 4, 4), 8, t(d, 16)), ValueError,
                                "group_norm: weight"),
    "group_norm_float64": (lambda tk, d: tk.group_norm(t(d, 2, 32, 4, 4, dtype=torch.float64), 8), TypeError,
                           "x must be float32, float16 or bfloat16"),
}
