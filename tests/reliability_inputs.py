"""The operands the families' reliability cases (tests/<family>/<family>_reliability.py) are made of,
shared by every family: the CUDA-graph cases' inputs (tests/reliability/test_cuda_graphs.py), the
bad inputs the fakes must refuse like the kernels (test_fakes_check_like_kernels.py) and the
binding's limits (test_reliability_validation.py)."""

import torch

BF16 = torch.bfloat16
BIG = 2**31  # one past the largest row (and head) count the kernels take
INT_MAX = 2**31 - 1


# ---- CUDA graphs: fresh values per replay, drawn from torch's generator (seeded by the test) ----

def rand(*shape, dtype=BF16, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale + 0.25).to(dtype)


def table(*shape):  # cos/sin-like values in [-1, 1], float32
    return torch.rand(*shape, device="cuda") * 2 - 1


def neox_table(b, s, d, dtype):  # transformers' layout: cos[..., i] == cos[..., i + d/2]
    half = table(b, s, d // 2)
    return torch.cat([half, half], dim=-1).to(dtype)


def positions(t, max_position):
    return torch.randint(0, max_position, (t,), device="cuda")


def elementwise_inputs():
    """The elementwise kernel's operands (the activations', gated_add's): LTX-Video's FFN rows, Llama's
    decode-step gate/up, a branch output and its gate."""
    return {"x": rand(2, 512, 8192), "g": rand(4, 1, 14336), "u": rand(4, 1, 14336), "y": rand(2, 512, 8192),
            "gate": rand(2, 1, 8192, scale=0.5)}


def out_form(call, like):
    """call(out) into an output shaped as `like`; returns (out,)."""
    out = torch.empty(like.shape, dtype=like.dtype, device=like.device)
    call(out)
    return (out,)


def out_forms(call, like_a, like_b):
    a = torch.empty(like_a.shape, dtype=like_a.dtype, device="cuda")
    b = torch.empty(like_b.shape, dtype=like_b.dtype, device="cuda")
    call(a, b)
    return a, b


# ---- bad inputs, on the device a case is given (meta: the fakes; cuda: the kernels) ----

def t(device, *shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=device).to(dtype) if device != "meta" else torch.empty(*shape, device=device,
                                                                                          dtype=dtype)


def expanded_on(device, *shape, last=2):
    return t(device, *([1] * len(shape)), last).expand(*shape, last)


# ---- the binding's limits, on the GPU ----

def bf(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def f32(*shape):
    return torch.rand(*shape, device="cuda")


def expanded(*shape, last=2, dtype=torch.bfloat16):
    """A [*shape, last] tensor of one row repeated (stride 0 in every leading dimension): no memory."""
    return torch.randn(*([1] * len(shape)), last, device="cuda", dtype=dtype).expand(*shape, last)


def shifted(t):
    """A view of t's buffer one element further on, t's shape: it overlaps t without being t."""
    flat = torch.empty(t.numel() + 1, device=t.device, dtype=t.dtype)
    return flat[:-1].view(t.shape), flat[1:].view(t.shape)
