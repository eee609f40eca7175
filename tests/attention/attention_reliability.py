"""The attention family's cases of the reliability tests (tests/reliability/): CUDA-graph captures at the
models' shapes, bad inputs the fakes refuse like the kernel, and what no keys give. Each dict is
gathered, with the other families' dicts of its name, by the test that checks it (tests/families.py)."""

import torch

from reliability_inputs import rand, t


# ---- CUDA graphs (test_cuda_graphs.py) ----

def _cuda_graph_cases():
    c = {}

    def tokens_first(tk, t, scale=None):
        """The op on [B, S, H, D] tensors as diffusers' processors hold them (transposed, no copy)."""
        return (tk.ops.attention_8bit.default(t["q"].transpose(1, 2), t["k"].transpose(1, 2), t["v"].transpose(1, 2),
                                              scale),)

    # LTX-Video 2B self-attention at 49 frames 512x768 (2688 tokens, 32 heads of 64, CFG batch 2)
    c["attention_8bit"] = (lambda: {n: rand(2, 2688, 32, 64) for n in "qkv"}, tokens_first)
    # Flux at 1024^2: 4096 image + 512 text tokens, 24 heads of 128
    c["attention_8bit/flux"] = (lambda: {n: rand(1, 4608, 24, 128) for n in "qkv"}, tokens_first)
    # LTX-Video's cross-attention to 128 text tokens, the scale given
    c["attention_8bit/cross"] = (lambda: {"q": rand(2, 2688, 32, 64), "k": rand(2, 128, 32, 64),
                                          "v": rand(2, 128, 32, 64)},
                                 lambda tk, t: tokens_first(tk, t, 0.125))
    return c


# name (op/label) -> (inputs(): the tensors a replay reads, call(tk, inputs) -> outputs): at a main shape of
# the models the op serves and at one of each other launch path (tests/reliability/test_cuda_graphs.py)
CUDA_GRAPH_CASES = _cuda_graph_cases()


# ---- bad inputs (test_fakes_check_like_kernels.py) ----

def heads(d, B=1, H=2, S=64, D=64, dtype=torch.bfloat16):
    """[B, H, S, D] on device d."""
    return t(d, B, H, S, D, dtype=dtype)


def _attention(q, k=None, v=None):
    def call(tk, d):
        qq = q(d)
        kk = k(d) if k is not None else heads(d, *qq.shape[:2], 64, qq.shape[-1], dtype=qq.dtype)
        vv = v(d) if v is not None else heads(d, *kk.shape, dtype=kk.dtype)
        return tk.attention_8bit(qq, kk, vv)
    return call


# name -> (call(tk, device), exception type, message regex): the fakes on meta raise what the kernel raises
# (tests/reliability/test_fakes_check_like_kernels.py). Each message names the op and the argument.
BAD_INPUTS = {
    "attention_8bit_float32": (_attention(lambda d: heads(d, dtype=torch.float32)), TypeError,
                               r"attention_8bit: .*\bq\b"),
    "attention_8bit_dtypes_differ": (_attention(lambda d: heads(d), lambda d: heads(d, dtype=torch.float16),
                                                lambda d: heads(d, dtype=torch.float16)), TypeError,
                                     r"attention_8bit: .*\bk\b"),
    "attention_8bit_head_dim": (_attention(lambda d: heads(d, D=96)), ValueError, r"attention_8bit: .*\bq\b"),
    "attention_8bit_head_dim_differs": (_attention(lambda d: heads(d), lambda d: heads(d, D=128),
                                                   lambda d: heads(d, D=128)), ValueError,
                                        r"attention_8bit: .*\bk\b"),
    "attention_8bit_last_dim_strided": (_attention(lambda d: heads(d, D=128)[..., ::2]), ValueError,
                                        r"attention_8bit: .*\bq\b"),
    "attention_8bit_rank": (_attention(lambda d: t(d, 2, 64, 64), lambda d: heads(d), lambda d: heads(d)),
                            ValueError, r"attention_8bit: .*\bq\b"),
    "attention_8bit_v_shape": (_attention(lambda d: heads(d), lambda d: heads(d, S=64),
                                          lambda d: heads(d, S=65)), ValueError, r"attention_8bit: .*\bv\b"),
    "attention_8bit_batch": (_attention(lambda d: heads(d), lambda d: heads(d, B=2), lambda d: heads(d, B=2)),
                             ValueError, r"attention_8bit: .*\bk\b"),
    "attention_8bit_grouped_heads": (_attention(lambda d: heads(d, H=4), lambda d: heads(d, H=2),
                                                lambda d: heads(d, H=2)), ValueError, r"attention_8bit: .*\bk\b"),
    # rows of 68 elements (a stride no 16-byte vector divides), and a start one element past alignment
    "attention_8bit_row_stride": (_attention(lambda d: t(d, 1, 2, 64, 68)[..., :64]), ValueError,
                                  r"attention_8bit: q must start at a 16-byte aligned address with strides"),
    "attention_8bit_unaligned": (_attention(lambda d: t(d, 1 + 2 * 64 * 64)[1:].view(1, 2, 64, 64)), ValueError,
                                 r"attention_8bit: q must start at a 16-byte aligned address"),
    # more batch x heads than the grid's y dimension (expanded views: no memory)
    "attention_8bit_batch_heads": (_attention(lambda d: heads(d, 1, 1).expand(65536, 1, 64, 64),
                                              lambda d: heads(d, 1, 1).expand(65536, 1, 64, 64),
                                              lambda d: heads(d, 1, 1).expand(65536, 1, 64, 64)), ValueError,
                                   r"attention_8bit: batch \* heads must be at most 65535"),
}


# ---- no keys (test_reliability_ops.py's check_empty) ----

def _zeros_without_keys(call, outs, what):
    """attention_8bit with Sk = 0: every query attends to nothing, zeros (SDPA's math backend)."""
    q = call.args[0]
    assert len(outs) == 1 and outs[0].shape == q.shape and outs[0].dtype == q.dtype, what
    assert bool((outs[0] == 0).all()), f"{what}: zeros expected"


# op -> check(call, outputs, what): the outputs of its "empty_width" case (no keys); returns the outputs
# left for the generic check (empty or zeros), None when it checked them all
EMPTY_WIDTH_RESULTS = {"attention_8bit": _zeros_without_keys}
