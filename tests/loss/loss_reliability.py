"""The loss family's cases of the reliability tests (tests/reliability/): CUDA-graph captures, bad
inputs the fakes refuse like the kernels, and what its ops give for rows of no elements. Each dict is
gathered, with the other families' dicts of its name, by the test that checks it (tests/families.py)."""

import torch

from reliability_inputs import rand, t


# ---- CUDA graphs (test_cuda_graphs.py) ----

def _cuda_graph_cases():
    c = {}
    def lm_head_inputs():  # a 32 K vocabulary, 600 tokens: chunks of 8 by the memory rule, some ignored
        target = torch.randint(0, 32000, (600,), device="cuda")
        target[::5] = -100
        return {"h": rand(600, 256), "w": rand(32000, 256, scale=0.05), "t": target,
                "g": torch.rand(600, device="cuda"), "one": torch.ones((), device="cuda")}

    c["fused_linear_cross_entropy"] = (lm_head_inputs, lambda tk, t: tk.ops.fused_linear_cross_entropy.default(
        t["h"], t["w"], t["t"], None, -100, "mean", 0.1, 30.0, [True, True, False], 0)[:3])
    c["fused_linear_cross_entropy/none"] = (lm_head_inputs, lambda tk, t: (
        tk.ops.fused_linear_cross_entropy.default(t["h"], t["w"], t["t"], None, -100, "none", 0.0, None,
                                                  [False, False, False], 128)[0],))
    c["fused_linear_cross_entropy_backward"] = (lm_head_inputs, lambda tk, t: (
        tk.ops.fused_linear_cross_entropy_backward.default(t["g"], t["h"], t["w"], t["t"], None, -100, "none", 0.0,
                                                           None, [True, True, False], 0)[:2]))
    return c


# name (op/label) -> (inputs(): the tensors a replay reads, call(tk, inputs) -> outputs): at a main shape of
# the models the op serves and at one of each other launch path (tests/reliability/test_cuda_graphs.py)
CUDA_GRAPH_CASES = _cuda_graph_cases()


# ---- bad inputs (test_fakes_check_like_kernels.py) ----

# name -> (call(tk, device), exception type, message regex): the fakes on meta raise what the kernel raises
# (tests/reliability/test_fakes_check_like_kernels.py)
BAD_INPUTS = {
    "flce_target_dtype": (lambda tk, d: tk.fused_linear_cross_entropy(t(d, 6, 32), t(d, 50, 32),
                                                                      torch.zeros(6, dtype=torch.int32, device=d)),
                          TypeError, "fused_linear_cross_entropy: target"),
    "flce_hidden_width": (lambda tk, d: tk.fused_linear_cross_entropy(t(d, 6, 32), t(d, 50, 16),
                                                                      torch.zeros(6, dtype=torch.long, device=d)),
                          ValueError, "fused_linear_cross_entropy"),
    "flce_label_smoothing": (lambda tk, d: tk.fused_linear_cross_entropy(t(d, 6, 32), t(d, 50, 32),
                                                                         torch.zeros(6, dtype=torch.long, device=d),
                                                                         label_smoothing=1.5),
                             ValueError, "label_smoothing"),
}


# ---- rows of no elements (test_reliability_ops.py's check_empty) ----

def _log_vocabulary_per_token(call, outs, what):
    """The cross-entropy of hidden 0: logits 0, log(vocabulary) per token not ignored (summed, or one
    per token); the gradients are left to the generic check (empty or zeros)."""
    weight, target, ignore_index, reduction = call.args[1], call.args[2], call.args[4], call.args[5]
    ref = torch.where(target == ignore_index, 0.0, torch.log(torch.tensor(float(weight.shape[0]))))
    ref = ref.sum() if reduction == "sum" else ref
    torch.testing.assert_close(outs[0], ref.to(outs[0].device), rtol=1e-6, atol=1e-6,
                               msg=f"{what}: log(vocabulary) per token expected")
    return outs[1:]


# op -> check(call, outputs, what): the outputs of its "empty_width" case; returns the outputs left for
# the generic check (empty or zeros), None when it checked them all
EMPTY_WIDTH_RESULTS = {"fused_linear_cross_entropy": _log_vocabulary_per_token}
