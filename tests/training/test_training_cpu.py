"""Training without a GPU: the references the GPU tests differentiate, the identities the backward
kernels rely on, the fused linear cross-entropy's chunk loop (its CPU reference path), the refusal
guard, and autograd registration and fake impls traced on meta tensors and under torch.compile."""

import math

import pytest
import torch

from grad_helpers import KeepFlceGradients
from reference.activations import activation_float64
from reference.loss import linear_cross_entropy_float64
from reference.rope import rotary_float64

ACTS = ["silu", "gelu", "gelu_tanh"]


# ---- the references and the kernels' identities, in float64 ----

def closed_form_derivative(x, act):
    """act'(x) as the backward kernels compute it (ATen's formulas), in float64."""
    if act == "silu":
        s = torch.sigmoid(x)
        return s * (1 + x * (1 - s))
    if act == "gelu":
        return 0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    beta, kappa = math.sqrt(2 / math.pi), 0.044715
    t = torch.tanh(beta * (x + kappa * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * beta * (1 + 3 * kappa * x * x)


@pytest.mark.parametrize("act", ACTS)
def test_activation_reference_derivative(act):
    torch.manual_seed(0)
    x = (torch.randn(4097, dtype=torch.float64) * 4).requires_grad_()
    (grad,) = torch.autograd.grad(activation_float64(x, act).sum(), x)
    torch.testing.assert_close(grad, closed_form_derivative(x.detach(), act), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("act", ACTS)
def test_gated_backward_formula(act):
    """d(act(a) * b): da = act'(a) * (g * b), db = g * act(a): what act_mul_backward computes."""
    torch.manual_seed(1)
    a, b, g = (torch.randn(3, 257, dtype=torch.float64) * 3 for _ in range(3))
    a.requires_grad_(), b.requires_grad_()
    da, db = torch.autograd.grad(activation_float64(a, act) * b, (a, b), g)
    torch.testing.assert_close(da, closed_form_derivative(a.detach(), act) * (g * b.detach()), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(db, g * activation_float64(a.detach(), act), rtol=1e-12, atol=1e-12)


def transposed_sines(sin, style):
    """The tables of the backward rotation (rope.cuh's transpose_sines): (s1, s2) -> (-s2, -s1)."""
    r = sin.shape[-1]
    if style == "neox":
        s1, s2 = sin[..., : r // 2], sin[..., r // 2:]
        return torch.cat((-s2, -s1), dim=-1)
    pairs = sin.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], -pairs[..., 0]), dim=-1).flatten(-2)


@pytest.mark.parametrize("style", ["neox", "interleaved"])
@pytest.mark.parametrize("partial", [False, True])
def test_rope_backward_is_the_rotation_with_transposed_sines(style, partial):
    """For any tables (here random, so the two sines of a pair differ), the gradient of the rotation
    is the forward rotation of the gradient with the sines transposed: the backward kernels' identity."""
    torch.manual_seed(2)
    B, S, H, d = 2, 5, 3, 16
    r = d // 2 if partial else d
    x = torch.randn(B, S, H, d, dtype=torch.float64, requires_grad=True)
    cos, sin = (torch.randn(B, S, 1, r, dtype=torch.float64) for _ in range(2))
    g = torch.randn(B, S, H, d, dtype=torch.float64)
    (dx,) = torch.autograd.grad(rotary_float64(x, cos, sin, style), x, g)
    torch.testing.assert_close(dx, rotary_float64(g, cos, transposed_sines(sin, style), style), rtol=1e-13, atol=1e-13)
    # With the models' tables (each pair's two sines equal) it is the rotation by -theta.
    sin_dup = sin[..., : r // 2].repeat(1, 1, 1, 2) if style == "neox" else sin[..., ::2].repeat_interleave(2, -1)
    cos_dup = cos[..., : r // 2].repeat(1, 1, 1, 2) if style == "neox" else cos[..., ::2].repeat_interleave(2, -1)
    (dx,) = torch.autograd.grad(rotary_float64(x, cos_dup, sin_dup, style), x, g)
    torch.testing.assert_close(dx, rotary_float64(g, cos_dup, -sin_dup, style), rtol=1e-13, atol=1e-13)


# ---- the fused linear cross-entropy's chunk loop, on CPU (the kernel's math as ATen ops) ----

def flce_inputs(N, H, V, dtype=torch.float64, ignore_share=0.25, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(N, H, generator=g, dtype=torch.float64) + 0.1).to(dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=g, dtype=torch.float64) / math.sqrt(H)).to(dtype).requires_grad_()
    target = torch.randint(0, V, (N,), generator=g)
    target[torch.rand(N, generator=g) < ignore_share] = -100
    b = (torch.randn(V, generator=g, dtype=torch.float64) * 0.5).to(dtype).requires_grad_() if bias else None
    return hidden, weight, target, b


def grads_of(loss, tensors, grad_out=None):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None], grad_out)


OPTIONS = [
    dict(),
    dict(reduction="sum"),
    dict(reduction="none"),
    dict(label_smoothing=0.1),
    dict(label_smoothing=0.3, reduction="sum"),
    dict(softcap=3.0),
    dict(softcap=2.0, label_smoothing=0.2, reduction="none"),
    dict(ignore_index=5),
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("chunk_rows", [0, 8, 1, 64], ids=lambda c: f"chunk{c}")
def test_flce_chunk_loop_float64(tk, options, bias, chunk_rows):
    """N = 37 tokens: chunks of 8 leave a partial last one; 0 picks them from the shapes (here 8)."""
    hidden, weight, target, b = flce_inputs(37, 16, 100, bias=bias)
    if options.get("ignore_index") == 5:
        target[target == -100] = 5
    ours = tk.fused_linear_cross_entropy(hidden, weight, target, b, chunk_rows=chunk_rows, **options)
    ref = linear_cross_entropy_float64(hidden, weight, target, b, **options)
    assert ours.dtype == torch.float64 and ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    grad_out = torch.rand_like(ref) + 0.5  # an incoming gradient that is not 1
    for mine, theirs in zip(grads_of(ours, (hidden, weight, b), grad_out), grads_of(ref, (hidden, weight, b), grad_out)):
        torch.testing.assert_close(mine, theirs, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_flce_all_ignored(tk, reduction):
    hidden, weight, target, _ = flce_inputs(9, 8, 30, ignore_share=1.0)
    ours = tk.fused_linear_cross_entropy(hidden, weight, target, reduction=reduction)
    ref = linear_cross_entropy_float64(hidden, weight, target, reduction=reduction)
    torch.testing.assert_close(ours, ref, equal_nan=True)  # mean: NaN (0 / 0), as PyTorch
    dh, dw = grads_of(ours.sum() if reduction == "none" else ours, (hidden, weight))
    assert torch.equal(dh, torch.zeros_like(dh)) and torch.equal(dw, torch.zeros_like(dw))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_flce_no_tokens(tk, reduction):
    hidden, weight, target, _ = flce_inputs(0, 8, 30)
    ours = tk.fused_linear_cross_entropy(hidden, weight, target, reduction=reduction)
    ref = linear_cross_entropy_float64(hidden, weight, target, reduction=reduction)
    torch.testing.assert_close(ours, ref, equal_nan=True)
    if reduction != "none":
        dh, dw = grads_of(ours, (hidden, weight))
        assert dh.shape == hidden.shape and torch.equal(dw, torch.zeros_like(dw))


def test_flce_leading_dims_frozen_weight_and_no_grad(tk):
    """[B, S, H] hidden with [B, S] targets; a frozen lm_head (LoRA) gets no gradient computed; under
    no_grad only the loss is computed."""
    hidden, weight, target, _ = flce_inputs(24, 8, 30)
    hidden3, target2 = hidden.detach().view(2, 12, 8).requires_grad_(), target.view(2, 12)
    frozen = weight.detach()
    loss = tk.fused_linear_cross_entropy(hidden3, frozen, target2, reduction="none")
    assert loss.shape == (2, 12)
    ref = linear_cross_entropy_float64(hidden3.view(24, 8), frozen, target, reduction="none").view(2, 12)
    torch.testing.assert_close(loss, ref)
    (dh,) = torch.autograd.grad(loss.sum(), hidden3)
    (dh_ref,) = torch.autograd.grad(ref.sum(), hidden3)
    torch.testing.assert_close(dh, dh_ref)
    with torch.no_grad():
        assert tk.fused_linear_cross_entropy(hidden, weight, target).grad_fn is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_flce_cpu_low_precision_close_to_float64(tk, dtype):
    hidden, weight, target, b = flce_inputs(50, 32, 70, dtype=dtype, bias=True)
    ours = tk.fused_linear_cross_entropy(hidden, weight, target, b, label_smoothing=0.1, softcap=5.0, chunk_rows=16)
    ref = linear_cross_entropy_float64(hidden, weight, target, b, label_smoothing=0.1, softcap=5.0)
    assert ours.dtype == torch.float32
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours.double(), ref, rtol=tol, atol=tol)
    for mine, theirs in zip(grads_of(ours, (hidden, weight, b)), grads_of(ref, (hidden, weight, b))):
        assert mine.dtype == dtype
        torch.testing.assert_close(mine.double(), theirs.double(), rtol=tol, atol=tol * theirs.abs().max().item())


def test_flce_backward_twice_is_refused(tk):
    hidden, weight, target, _ = flce_inputs(8, 8, 30)
    loss = tk.fused_linear_cross_entropy(hidden, weight, target)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


def test_flce_gradients_reach_the_leaves_without_a_copy(tk):
    """The forward's gradient buffers become the leaves' .grad (AccumulateGrad steals them): handed
    over detached, they are not copied even while the op's outputs are referenced elsewhere (a kept
    reference made AccumulateGrad copy the [V, H] gradient: twice its memory at the peak)."""
    torch.manual_seed(0)
    hidden = torch.randn(300, 64).to(torch.bfloat16).requires_grad_()
    weight = torch.randn(5000, 64).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, 5000, (300,))
    with KeepFlceGradients() as kept:
        loss = tk.fused_linear_cross_entropy(hidden, weight, target)
    loss.backward()
    assert [g.data_ptr() for g in kept.grads] == [hidden.grad.data_ptr(), weight.grad.data_ptr()]


class RecordFreshTensors(torch.utils._python_dispatch.TorchDispatchMode):
    """The op and shape of each tensor an op call returns in storage of its own (not a view or
    the storage of one of its inputs), while active."""

    def __init__(self):
        super().__init__()
        self.fresh = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_flatten((args, kwargs))[0]
                  if isinstance(a, torch.Tensor)}
        for t in torch.utils._pytree.tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.fresh.append((str(func), tuple(t.shape)))
        return out


def test_flce_backward_allocates_no_gradient_sized_tensor(tk):
    """The backward scales the forward's gradients in place: nothing of [N, H] or [V, H] is
    allocated, in particular not the zeros autograd materializes for outputs without a gradient (the
    H200's backward peak held both gradients twice: 1.185 GB where they are 0.592 GB)."""
    torch.manual_seed(0)
    hidden = torch.randn(300, 64).to(torch.bfloat16).requires_grad_()
    weight = torch.randn(5000, 64).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, 5000, (300,))
    loss = tk.fused_linear_cross_entropy(hidden, weight, target)
    with RecordFreshTensors() as recorded:
        loss.backward()
    big = [(op, shape) for op, shape in recorded.fresh if shape in (tuple(hidden.shape), tuple(weight.shape))]
    assert big == [], f"the backward allocated gradient-sized tensors: {big}"
    assert hidden.grad is not None and weight.grad is not None


def test_flce_invalid_target_gives_nan(tk):
    hidden, weight, target, _ = flce_inputs(6, 8, 30, ignore_share=0.0)
    target[2] = 30
    loss = tk.fused_linear_cross_entropy(hidden, weight, target, reduction="none")
    assert loss[2].isnan() and not loss[[0, 1, 3, 4, 5]].isnan().any()


def test_flce_autocast(tk):
    hidden, weight, target, _ = flce_inputs(16, 8, 30, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = tk.fused_linear_cross_entropy(hidden, weight, target)
    assert loss.dtype == torch.float32
    dh, dw = grads_of(loss, (hidden, weight))
    assert dh.dtype == dw.dtype == torch.float32  # through the casts back to the fp32 parameters


def _flce_args(hidden, weight, target, bias=None, reduction="mean", compute=(False, False, False)):
    return (hidden, weight, target, bias, -100, reduction, 0.0, None, list(compute), 0)


FLCE_BAD = {
    "reduction": (lambda tk, h, w, t: tk.fused_linear_cross_entropy(h, w, t, reduction="avg"), ValueError,
                  "reduction must be one of"),
    "target_shape": (lambda tk, h, w, t: tk.fused_linear_cross_entropy(h, w, t[:-1]), ValueError,
                     "target must have hidden's shape"),
    "target_dtype": (lambda tk, h, w, t: tk.fused_linear_cross_entropy(h, w, t.int()), TypeError,
                     "target must have dtype Long"),
    "weight_dtype": (lambda tk, h, w, t: tk.fused_linear_cross_entropy(h, w.float(), t), TypeError,
                     "weight must have dtype Double"),
    "weight_shape": (lambda tk, h, w, t: tk.fused_linear_cross_entropy(h, w[:, :-1], t), ValueError,
                     r"weight must be \[V, H\]"),
    "bias_shape": (lambda tk, h, w, t: tk.fused_linear_cross_entropy(h, w, t, w[0]), ValueError,
                   r"bias must be \[V\]"),
    "smoothing": (lambda tk, h, w, t: tk.fused_linear_cross_entropy(h, w, t, label_smoothing=1.5), ValueError,
                  r"label_smoothing must be in \[0, 1\]"),
    "softcap": (lambda tk, h, w, t: tk.fused_linear_cross_entropy(h, w, t, softcap=0.0), ValueError,
                "softcap must be a finite number > 0"),
    "chunk_rows": (lambda tk, h, w, t: tk.fused_linear_cross_entropy(h, w, t, chunk_rows=-1), ValueError,
                   "chunk_rows must be >= 0"),
    "none_with_grads": (lambda tk, h, w, t: tk.ops.fused_linear_cross_entropy(
        *_flce_args(h, w, t, reduction="none", compute=(True, False, False))), ValueError,
        "computed in the backward"),
    "int_hidden": (lambda tk, h, w, t: tk.fused_linear_cross_entropy(h.long(), w.long(), t), TypeError,
                   "hidden must be float32, float16 or bfloat16"),
}


@pytest.mark.parametrize("case", sorted(FLCE_BAD))
def test_flce_bad_input_raises_clear_error(tk, case):
    hidden, weight, target, _ = flce_inputs(6, 8, 30)
    call, exc, message = FLCE_BAD[case]
    with pytest.raises(exc, match=message):
        call(tk, hidden.detach(), weight.detach(), target)


def test_flce_op_without_compute_grads_refuses_backward(tk):
    hidden, weight, target, _ = flce_inputs(6, 8, 30)
    with pytest.raises(RuntimeError, match="did not ask for its gradient"):
        tk.ops.fused_linear_cross_entropy(*_flce_args(hidden, weight, target))


def test_flce_opcheck(tk):
    hidden, weight, target, b = flce_inputs(20, 8, 30, dtype=torch.float32, bias=True)
    op = tk.ops.fused_linear_cross_entropy.default
    torch.library.opcheck(op, _flce_args(hidden, weight, target, b, compute=(True, True, True)))
    torch.library.opcheck(op, _flce_args(hidden, weight, target, b, reduction="none"))
    torch.library.opcheck(tk.ops.fused_linear_cross_entropy_backward.default,
                          (torch.rand(20), hidden.detach(), weight.detach(), target, b.detach(), -100, "none", 0.1,
                           4.0, [True, True, True], 7))


def test_flce_compiles_fullgraph_on_cpu(tk):
    torch._dynamo.reset()
    hidden, weight, target, _ = flce_inputs(40, 16, 50, dtype=torch.float32)

    def step(h, w, t):
        return tk.fused_linear_cross_entropy(h, w, t, label_smoothing=0.1)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(hidden, weight, target)
    torch.testing.assert_close(loss, step(hidden, weight, target))
    dh, dw = grads_of(loss, (hidden, weight))
    dh_ref, dw_ref = grads_of(step(hidden, weight, target), (hidden, weight))
    torch.testing.assert_close(dh, dh_ref)
    torch.testing.assert_close(dw, dw_ref)


# ---- the refusal guard (fires before the CUDA-only kernels, so it runs here) ----

def _refusing_calls(tk):
    x = torch.randn(4, 16, requires_grad=True)
    q = torch.randn(1, 3, 2, 16, requires_grad=True)
    cos = torch.randn(1, 3, 16)
    return {
        "activation_out": lambda: tk.ops.activation_out(torch.empty(4, 16), x, "silu"),
        "act_and_mul_out": lambda: tk.ops.act_and_mul_out(torch.empty(4, 8), x, "gelu", False),
        "act_mul_out": lambda: tk.ops.act_mul_out(torch.empty(4, 16), x, x, "silu"),
        "rope_": lambda: tk.ops.rope_(q, q, cos, cos, "neox", False),
        "hf_rope_": lambda: tk.ops.hf_rope_(q, q, cos, cos, 2),
        "rope_cached_": lambda: tk.ops.rope_cached_(torch.zeros(3, dtype=torch.long), q.view(3, 32), q.view(3, 32),
                                                    16, torch.randn(8, 16), "neox"),
        "activation_backward": lambda: tk.ops.activation_backward(x, x, "silu"),
        "act_and_mul_backward": lambda: tk.ops.act_and_mul_backward(x[:, :8], x, "silu", True),
        "act_mul_backward": lambda: tk.ops.act_mul_backward(x, x, x, "silu"),
        "rope_backward": lambda: tk.ops.rope_backward(q, q, cos, cos, "neox", False),
        "ltx_rope_from_coords_backward": lambda: tk.ops.ltx_rope_from_coords_backward(
            q[:, :, 0], q[:, :, 0], torch.rand(1, 3, 3), torch.rand(2)),
        "fused_linear_cross_entropy_backward": lambda: tk.ops.fused_linear_cross_entropy_backward(
            torch.ones(()), x, x, torch.zeros(4, dtype=torch.long), None, -100, "mean", 0.0, None, [True] * 3, 0),
    }


REFUSING = ["activation_out", "act_and_mul_out", "act_mul_out", "rope_", "hf_rope_", "rope_cached_",
            "activation_backward", "act_and_mul_backward", "act_mul_backward", "rope_backward",
            "ltx_rope_from_coords_backward", "fused_linear_cross_entropy_backward"]


@pytest.mark.parametrize("name", REFUSING)
def test_ops_without_backward_refuse_grad(tk, name):
    call = _refusing_calls(tk)[name]
    with pytest.raises(RuntimeError, match=f"^{name}: .*(no backward|double backward)"):
        call()
    # under no_grad the op runs as before: the CUDA kernels' own "must be a CUDA tensor" (or, for the
    # cross-entropy, its CPU path), not the guard
    with torch.no_grad():
        try:
            call()
        except (ValueError, RuntimeError) as e:
            assert "must be a CUDA tensor" in str(e), str(e)


def test_rope_tables_requiring_grad_are_refused(tk):
    q = torch.empty(1, 4, 2, 16, device="meta", requires_grad=True)
    cos = torch.empty(1, 4, 16, device="meta", requires_grad=True)
    with pytest.raises(RuntimeError, match="rope: cos requires grad"):
        tk.flux_rope(q, q, cos[0], cos[0].detach())
    with pytest.raises(RuntimeError, match="apply_rotary_pos_emb: sin requires grad"):
        tk.apply_rotary_pos_emb(q, q, cos.detach(), cos, 2)
    grid = torch.empty(1, 4, 3, device="meta", requires_grad=True)
    with pytest.raises(RuntimeError, match="ltx_rope_from_coords: grid requires grad"):
        tk.ltx_rope_from_coords(q[:, :, 0], q[:, :, 0], grid, torch.empty(2, device="meta"))


# ---- autograd registration and fake impls on meta tensors ----

META = dict(device="meta", dtype=torch.bfloat16)


def _leaf(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=True)


def _meta_cases(tk):
    """name -> (inputs requiring grad, the call on them)."""
    x, y = _leaf(2, 9, 256), _leaf(2, 9, 256)
    q, k = _leaf(2, 8, 9, 128), _leaf(2, 2, 9, 128)  # [B, H, S, d]
    cos = torch.empty(2, 9, 128, **META)
    c32 = torch.empty(2, 9, 256, device="meta")
    fq, fk = _leaf(1, 9, 4, 64), _leaf(1, 9, 4, 64)
    fc = torch.empty(9, 64, device="meta")
    grid, freqs = torch.empty(1, 9, 3, device="meta"), torch.empty(256 // 6, device="meta")
    return {
        "silu": ((x,), lambda x: tk.silu(x)),
        "gelu": ((x,), lambda x: tk.gelu(x)),
        "gelu_tanh": ((x,), lambda x: tk.gelu(x, approximate="tanh")),
        "silu_and_mul": ((x,), lambda x: tk.silu_and_mul(x)),
        "gelu_and_mul": ((x,), lambda x: tk.gelu_and_mul(x)),
        "gelu_tanh_and_mul": ((x,), lambda x: tk.gelu_tanh_and_mul(x)),
        "geglu": ((x,), lambda x: tk.geglu(x)),
        "act_mul": ((x, y), lambda x, y: tk.act_mul(x, y, "gelu_tanh")),
        "apply_rotary_pos_emb": ((q, k), lambda q, k: tk.apply_rotary_pos_emb(q, k, cos, cos)),
        "apply_rotary_pos_emb_bshd": ((q, k), lambda q, k: tk.apply_rotary_pos_emb(
            q.transpose(1, 2), k.transpose(1, 2), cos, cos, unsqueeze_dim=2)),
        "ltx_rope": ((x, y), lambda x, y: tk.ltx_rope(x, y, c32, c32)),
        "flux_rope": ((fq, fk), lambda q, k: tk.flux_rope(q, k, fc, fc)),
        "ltx_rope_from_coords": ((x, y), lambda q, k: tk.ltx_rope_from_coords(q, k, grid, freqs)),
    }


@pytest.mark.parametrize("case", ["silu", "gelu", "gelu_tanh", "silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul",
                                  "geglu", "act_mul", "apply_rotary_pos_emb", "apply_rotary_pos_emb_bshd",
                                  "ltx_rope", "flux_rope", "ltx_rope_from_coords"])
def test_backward_traces_on_meta(tk, case):
    inputs, fn = _meta_cases(tk)[case]
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    assert all(o.grad_fn is not None for o in outs), "no grad_fn: the gradient would be dropped"
    grads = torch.autograd.grad(outs, inputs, [torch.empty_like(o) for o in outs])
    for g, t in zip(grads, inputs):
        assert g.shape == t.shape and g.dtype == t.dtype and g.device.type == "meta"


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias", [False, True])
def test_flce_traces_on_meta(tk, reduction, bias):
    h, w = _leaf(300, 64), _leaf(1000, 64)
    b = _leaf(1000) if bias else None
    t = torch.empty(300, device="meta", dtype=torch.long)
    loss = tk.fused_linear_cross_entropy(h, w, t, b, reduction=reduction, softcap=30.0)
    assert loss.dtype == torch.float32 and loss.shape == ((300,) if reduction == "none" else ())
    grads = torch.autograd.grad(loss, [p for p in (h, w, b) if p is not None], torch.empty_like(loss))
    for g, p in zip(grads, (h, w, b)):
        assert g.shape == p.shape and g.dtype == p.dtype


@pytest.mark.parametrize("case", ["silu_and_mul", "act_mul", "apply_rotary_pos_emb", "ltx_rope_from_coords",
                                  "flux_rope"])
def test_training_step_compiles_fullgraph_on_meta(tk, case):
    """torch.compile traces forward and backward (AOTAutograd) with no graph break."""
    torch._dynamo.reset()
    inputs, fn = _meta_cases(tk)[case]

    def loss_of(*args):
        out = fn(*args)
        return sum(o.float().sum() for o in (out if isinstance(out, tuple) else (out,)))

    compiled = torch.compile(loss_of, fullgraph=True, backend="aot_eager")
    loss = compiled(*inputs)
    grads = torch.autograd.grad(loss, inputs)
    assert all(g.shape == t.shape for g, t in zip(grads, inputs))


# ---- the autograd glue: incoming gradients reach the backward ops in a layout the kernels read ----

def _grad_rows(tk):
    import importlib

    return importlib.import_module(f"{tk.__name__}._autograd").grad_rows


def test_grad_rows_materializes_only_what_the_kernels_refuse(tk):
    """grad_rows (the one place every backward takes its incoming gradients through): an expanded
    gradient (a sum's backward: stride 0, empty ones too, whose .contiguous() is a no-op) or one
    with a strided last dimension becomes a row-major copy of the same values; a gradient whose
    rows are already unit-stride, however its leading dims are strided, is passed on as it is."""
    grad_rows = _grad_rows(tk)
    base = torch.randn(6, 5, 16)
    for g in (torch.ones(()).expand(3, 5, 64), torch.ones(()).expand(0, 64), torch.ones(()).expand(2, 0, 8),
              base[..., ::2], base.transpose(1, 2)):
        out = grad_rows(g)
        assert out.stride(-1) == 1 and out.is_contiguous() and torch.equal(out, g), (g.shape, g.stride())
    for g in (base, base[:, 1:4], base.transpose(0, 1), base[::2], torch.ones(()).expand(4, 1),
              torch.ones(()).expand(4, 0), torch.ones(()), None):
        assert grad_rows(g) is g  # no silent copy of a readable layout


class _BackwardGradLayouts(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every backward op of the kernel's namespace and the layouts of its incoming gradients
    (the schema's arguments named grad*)."""

    def __init__(self, namespace):
        super().__init__()
        self.namespace, self.calls = namespace, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == self.namespace and func._opname.endswith("_backward"):
            for arg, value in zip(func._schema.arguments, args):
                if arg.name.startswith("grad") and isinstance(value, torch.Tensor):
                    self.calls.append((func._opname, arg.name, tuple(value.shape), value.stride()))
        return func(*args, **(kwargs or {}))


def _sum_backward_cases(tk):
    """name -> (inputs requiring grad, the call): every op family with a backward, including empty
    and one-row shapes."""
    cases = dict(_meta_cases(tk))
    x, w, b = _leaf(2, 9, 256), _leaf(256), _leaf(256)
    r, y, s = _leaf(2, 9, 256), _leaf(2, 9, 256), _leaf(2, 1, 256)
    q, k = _leaf(2, 9, 4, 128), _leaf(2, 9, 2, 128)
    qw, cos = _leaf(128), torch.empty(2, 9, 128, **META)
    no_rows, no_cols = _leaf(0, 64), _leaf(2, 0, 8)
    cases.update({
        "gelu_no_rows": ((no_rows,), lambda e: tk.gelu(e)),
        "gelu_no_cols": ((no_cols,), lambda e: tk.gelu(e)),
        "silu_and_mul_no_rows": ((no_rows,), lambda e: tk.silu_and_mul(e)),
        "rms_norm": ((x, w), lambda x, w: tk.rms_norm(x, w)),
        "fused_add_rms_norm": ((x, r, w), lambda x, r, w: tk.fused_add_rms_norm(x, r, w)),
        "layer_norm": ((x, w, b), lambda x, w, b: tk.layer_norm(x, w, b)),
        "norm_modulate": ((x, s), lambda x, s: tk.norm_modulate(x, s, s, norm="layer")),
        "gated_add_norm_modulate": ((x, y, s), lambda x, y, s: tk.gated_add_norm_modulate(x, y, s, s, s)),
        "gated_add": ((x, y, s), lambda x, y, s: tk.gated_add(x, y, s)),
        "hf_qk_norm_rope": ((q, k, qw), lambda q, k, qw: tk.hf_qk_norm_rope(q, k, qw, qw, 1e-6, cos, cos)),
    })
    return cases


def test_sum_backward_reaches_every_backward_op_row_major(tk):
    """A user's out.sum().backward() hands each op an expanded gradient (stride 0 everywhere; the
    H200 run's activation_backward refused it for empty inputs): every backward op of every family
    must receive gradients whose last dimension is unit-stride (or of size <= 1), as their C++ check
    (check_last_dim_contiguous) demands."""
    namespace = tk.add_op_namespace_prefix("x").split("::")[0]
    for name, (inputs, fn) in _sum_backward_cases(tk).items():
        out = fn(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        loss = sum(o.sum() for o in outs)
        mode = _BackwardGradLayouts(namespace)
        with mode:
            grads = torch.autograd.grad(loss, inputs, allow_unused=True)
        assert mode.calls, f"{name}: no backward op ran"
        for op, arg, shape, stride in mode.calls:
            assert len(shape) == 0 or shape[-1] <= 1 or stride[-1] == 1, f"{name}: {op} got {arg} {shape} strides {stride}"
        for g, t in zip(grads, inputs):
            assert g is None or g.shape == t.shape, name
