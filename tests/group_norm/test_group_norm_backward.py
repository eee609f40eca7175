"""group_norm / add_group_norm backward (+ SiLU): the gradients of x, bias_nc, weight and bias against
a float64 reference that rounds where the forward rounds (h = x + bias_nc and, with SiLU, the norm's
output, each rounded to x's dtype with the gradient passed straight through), each no further from it
than eager autograd's own gradients in x's dtype are (twice their error, or the one-rounding bound of
an fp32 computation, whichever is larger); both layouts, every dtype, odd sizes, S = 1, empty
batches; the fakes and the autograd wiring on meta tensors (CPU)."""

import pytest
import torch
import torch.nn.functional as F

from grad_helpers import grad_bound
from helpers import DTYPES, assert_all_written, random_input, with_poisoned_outputs

gpu = pytest.mark.gpu

# (shape, groups, why)
SHAPES = [
    ((2, 64, 9, 7), 32, "SD-like: D = 2, odd spatial"),
    ((2, 320, 8, 8), 32, "SD resnet, D = 10"),
    ((1, 6, 5, 3), 3, "odd everything"),
    ((3, 40), 8, "[N, C]: S = 1 (ATen's 1-d formula)"),
    ((2, 12, 3, 4, 5), 4, "5-D (video)"),
]
EPS = 1e-5


def in_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "channels_first" or t.dim() < 3:
        return t.contiguous()
    return t.movedim(1, -1).contiguous().movedim(-1, 1)  # channels innermost, any rank


def straight_through(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t's value rounded to dtype, its gradient passed through (where the kernels round)."""
    return t + (t.to(dtype).double() - t).detach()


def forward(x, bias_nc, weight, bias, groups, silu, round_to=None):
    """F.group_norm(x + bias_nc) (+ F.silu), rounding where the forward rounds when round_to is given."""
    h = x if bias_nc is None else x + bias_nc.view(*bias_nc.shape[:2], *([1] * (x.dim() - 2)))
    if round_to is not None and bias_nc is not None:
        h = straight_through(h, round_to)
    y = F.group_norm(h, groups, weight, bias, EPS)
    if silu:
        y = F.silu(straight_through(y, round_to) if round_to is not None else y)
    return y


def grads(fn, inputs, grad_out):
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    present = [t for t in leaves if t is not None]
    found = iter(torch.autograd.grad(out, present, grad_out))
    return [None if t is None else next(found) for t in leaves]


def check_against_reference(ours, eager, ref, what, dtype, sums):
    if ref is None:
        assert ours is None, what
        return
    assert ours is not None, f"{what}: no gradient (dropped)"
    assert ours.shape == ref.shape and ours.dtype == dtype, (what, ours.shape, ours.dtype)
    assert torch.isfinite(ours).all(), f"{what}: non-finite values"
    err = (ours.double() - ref).abs().max().item() if ref.numel() else 0.0
    eager_err = (eager.double() - ref).abs().max().item() if ref.numel() else 0.0
    bound = grad_bound(ours, ref, sums).max().item() if ref.numel() else 0.0
    assert err <= max(2 * eager_err, bound), f"{what}: max error {err:.3g}, eager's {eager_err:.3g}, bound {bound:.3g}"


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("shape,groups,why", SHAPES, ids=[s[2] for s in SHAPES])
@pytest.mark.parametrize("silu", [False, True], ids=["none", "silu"])
@pytest.mark.parametrize("add", [None, "per_sample", "shared"])
def test_gradients_match_float64_no_worse_than_eager(tk, dtype, layout, shape, groups, why, silu, add):
    x = in_layout(random_input(shape, dtype, scale=2.0, offset=0.5), layout)
    C = shape[1]
    weight = random_input((C,), dtype, scale=1.0, offset=1.0)
    bias = random_input((C,), dtype, scale=0.5, offset=0.0)
    bias_nc = None if add is None else random_input((shape[0] if add == "per_sample" else 1, C), dtype)
    grad_out = in_layout(random_input(shape, dtype, scale=1.0, offset=0.0), layout)
    inputs = (x, bias_nc, weight, bias)

    def ours(x, bias_nc, weight, bias):
        act = "silu" if silu else None
        if bias_nc is None:
            return tk.group_norm(x, groups, weight, bias, EPS, activation=act)
        return tk.add_group_norm(x, bias_nc, groups, weight, bias, EPS, activation=act)

    got = grads(ours, inputs, grad_out)
    eager = grads(lambda *a: forward(*a, groups, silu), inputs, grad_out)
    ref = grads(lambda *a: forward(*a, groups, silu, round_to=dtype), [None if t is None else t.double() for t in inputs],
                grad_out.double())
    sums = x.numel() // groups  # the longest sums: a group's D * S terms, a weight's N * S
    for name, o, e, r in zip(("grad_x", "grad_bias_nc", "grad_weight", "grad_bias"), got, eager, ref):
        check_against_reference(o, e, r, f"{name} ({why}, {layout}, {dtype}, silu={silu}, add={add})", dtype, sums)
    if got[0] is not None and x.dim() >= 3:
        assert got[0].stride() == x.stride(), "grad_x keeps x's layout"


@gpu
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_the_op_writes_every_asked_gradient_and_only_those(tk, layout):
    x = in_layout(random_input((2, 32, 6, 5), torch.bfloat16), layout)
    w, b = random_input((32,), torch.bfloat16), random_input((32,), torch.bfloat16)
    bias_nc = random_input((2, 32), torch.bfloat16)
    g = in_layout(random_input(x.shape, torch.bfloat16, scale=1.0, offset=0.0), layout)
    full = tk.ops.group_norm_backward(g, x, bias_nc, 8, w, b, EPS, "silu", [True] * 4)
    assert all(t.numel() > 0 and torch.isfinite(t).all() for t in full)
    for i in range(4):
        mask = [j == i for j in range(4)]
        part = tk.ops.group_norm_backward(g, x, bias_nc, 8, w, b, EPS, "silu", mask)
        assert torch.equal(part[i], full[i]), f"gradient {i} alone differs from all together"
        assert all(part[j].numel() == 0 for j in range(4) if j != i)
    again = tk.ops.group_norm_backward(g, x, bias_nc, 8, w, b, EPS, "silu", [True] * 4)
    assert all(torch.equal(a, c) for a, c in zip(full, again)), "not deterministic"


@gpu
def test_empty_batch_and_spatial_give_zero_parameter_gradients(tk):
    for shape in ((0, 8, 4, 4), (2, 8, 0, 4)):
        x = torch.randn(shape, device="cuda", dtype=torch.float32, requires_grad=True)
        w = torch.randn(8, device="cuda", requires_grad=True)
        b = torch.randn(8, device="cuda", requires_grad=True)
        out = tk.group_norm(x, 4, w, b)
        dx, dw, db = torch.autograd.grad(out, (x, w, b), torch.ones_like(out))
        assert dx.shape == x.shape and not dw.any() and not db.any()


@gpu
def test_a_channels_first_gradient_for_a_channels_last_x(tk):
    """Autograd may hand a contiguous gradient for a channels-last output: the backward reads it in x's layout."""
    x = in_layout(random_input((2, 16, 5, 6), torch.float32), "channels_last").requires_grad_(True)
    out = tk.group_norm(x, 4, activation="silu")
    g = random_input(out.shape, torch.float32, scale=1.0, offset=0.0).contiguous()
    (dx,) = torch.autograd.grad(out, x, g)
    (ref,) = torch.autograd.grad(F.silu(F.group_norm(x, 4, eps=EPS)), x, g)
    torch.testing.assert_close(dx, ref, rtol=1e-4, atol=1e-5)


@gpu
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_every_element_of_every_gradient_is_written(tk, layout):
    x = in_layout(random_input((2, 40, 7, 3), torch.bfloat16), layout)
    g = in_layout(random_input(x.shape, torch.bfloat16, scale=1.0, offset=0.0), layout)
    w, b, bnc = (random_input(s, torch.bfloat16) for s in ((40,), (40,), (1, 40)))
    outs = with_poisoned_outputs(lambda: tk.ops.group_norm_backward(g, x, bnc, 4, w, b, EPS, "silu", [True] * 4),
                                 x, bnc, w, b)
    assert_all_written(*outs)


# ---- CPU: the fake, the wiring of autograd, refusals ----


def meta(*shape, dtype=torch.bfloat16, grad=False):
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)


def test_backward_traces_on_meta_with_every_gradient(tk):
    x, w, b, bnc = meta(2, 32, 4, 4, grad=True), meta(32, grad=True), meta(32, grad=True), meta(2, 32, 1, 1, grad=True)
    out = tk.add_group_norm(x, bnc, 8, w, b, activation="silu")
    dx, dbnc, dw, db = torch.autograd.grad(out, (x, bnc, w, b), torch.empty_like(out))
    assert dx.shape == x.shape and dbnc.shape == bnc.shape and dw.shape == db.shape == (32,)
    assert tk.has_backward("group_norm") and tk.has_backward("add_group_norm")
    assert tk.layers.GroupNorm.has_backward


@pytest.mark.parametrize("shape", [(2, 16, 12), (2, 16, 4, 3), (2, 16, 2, 3, 2)], ids=["3d", "4d", "5d"])
def test_a_channels_first_gradient_reaches_a_channels_last_x_of_any_rank(tk, shape):
    """The autograd glue puts the incoming gradient in x's layout (channels innermost) whatever x's rank;
    the op itself refuses a gradient in another layout (its C++ check runs on meta tensors too)."""
    x = meta(*shape).movedim(1, -1).contiguous().movedim(-1, 1).requires_grad_(True)
    out = tk.group_norm(x, 4, activation="silu")
    (dx,) = torch.autograd.grad(out, x, meta(*shape))  # a contiguous (channels-first) gradient
    assert dx.shape == x.shape and dx.stride() == x.stride()
    with pytest.raises(Exception, match="grad_out must have x's memory format"):
        tk.ops.group_norm_backward(meta(*shape), x.detach(), None, 4, None, None, EPS, "none", [True] * 4)


def test_the_fake_gives_empty_tensors_for_gradients_not_asked(tk):
    x = meta(2, 32, 4, 4)
    dx, dbnc, dw, db = tk.ops.group_norm_backward(x, x, None, 8, meta(32), None, EPS, "none",
                                                  [False, True, True, True])
    assert dx.shape == (0,) and dbnc.shape == (0,) and dw.shape == (32,) and db.shape == (0,)


def test_bad_grad_out_is_refused_with_the_argument_named(tk):
    x = meta(2, 32, 4, 4)
    with pytest.raises(Exception, match="grad_out must have the shape of x"):
        tk.ops.group_norm_backward(meta(2, 32, 4, 3), x, None, 8, None, None, EPS, "none", [True] * 4)
    with pytest.raises(Exception, match="num_groups"):
        tk.ops.group_norm_backward(x, x, None, 5, None, None, EPS, "none", [True] * 4)
