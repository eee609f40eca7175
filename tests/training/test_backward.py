"""Backward of the activations, gated units and out-of-place rotations on the GPU: against torch's
autograd of the float64 references (ulp bounds per dtype), against eager autograd of the code they
replace (the same rounding), on hostile grids (odd widths, strided and unaligned views, expanded
gradients, empty), opcheck with inputs that require grad, and torch.compile training steps."""

import pytest
import torch

from helpers import DTYPES, SUBNORMAL_ROUNDOFF, UNIT_ROUNDOFF, assert_matches_eager, mismatch_vs_eager, random_input
from reference.activations import activation_float64, eager_act_and_mul, eager_act_mul, eager_activation
from reference.rope import diffusers_interleaved_rotary, hf_apply_rotary_pos_emb, rotary_float64

pytestmark = pytest.mark.gpu

ACTS = ["silu", "gelu", "gelu_tanh"]
HIDDEN = [1, 7, 4097, 14336]
FP32_SLACK = 4e-6  # fp32 formulas: cancellation in 1 - sigmoid, 1 + erf, 1 + tanh, relative to |g| (1 + |x|)


def rows_for(hidden):
    return max(1, min(65, (1 << 20) // hidden))


def assert_grad_within(out, ref64, mag, ulps, slack, what):
    """|out - ref| <= ulps * (u(dtype) * mag + the subnormal floor) + FP32_SLACK * slack, every element
    (and every one written): fp16 gradients near zero round to a subnormal spacing, not relatively."""
    assert not out.isnan().any(), f"{what}: NaN in the gradient"
    err = (out.double() - ref64).abs()
    bound = ulps * (UNIT_ROUNDOFF[out.dtype] * mag + SUBNORMAL_ROUNDOFF[out.dtype]) + FP32_SLACK * slack
    worst = (err - bound).max().item() if err.numel() else 0.0
    assert worst <= 0, f"{what}: max error {err.max().item():.3g} exceeds the bound by {worst:.3g}"


def reference_grads(fn, inputs, grad):
    """torch's autograd of the float64 reference `fn` at the inputs (each taken in float64)."""
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    return torch.autograd.grad(fn(*leaves), leaves, grad.double())


def call_act(tk, x, act):
    return tk.silu(x) if act == "silu" else tk.gelu(x, "none" if act == "gelu" else "tanh")


def grads_of(out, inputs, grad):
    return torch.autograd.grad(out, inputs, grad)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_activation_backward(tk, act, dtype, hidden):
    x = random_input((rows_for(hidden), hidden), dtype).requires_grad_()
    g = random_input(x.shape, dtype)
    (dx,) = grads_of(call_act(tk, x, act), x, g)
    (ref,) = reference_grads(lambda x: activation_float64(x, act), [x], g)
    slack = g.double().abs() * (1 + x.detach().double().abs())
    assert_grad_within(dx, ref, ref.abs(), 1.5, slack, f"{act} backward vs float64")  # fp32 math, one rounding
    (eager,) = grads_of(eager_activation(x, act), x, g)
    assert_matches_eager(dx, eager, ref.abs() + FP32_SLACK * slack, 2)


def gated_case(tk, act, act_first, x):
    if act_first:
        fn = {"silu": tk.silu_and_mul, "gelu": tk.gelu_and_mul, "gelu_tanh": tk.gelu_tanh_and_mul}[act]
        return fn(x)
    return tk.geglu(x, "none" if act == "gelu" else "tanh")


def gated_reference(act, act_first):
    def fn(x):
        a, b = x.chunk(2, dim=-1)
        return activation_float64(a, act) * b if act_first else a * activation_float64(b, act)
    return fn


def gated_magnitudes(a, b, g, act):
    """Bound magnitudes and fp32 slacks of (da, db) for out = act(a) * b: da = act'(a) round(g b)
    (two roundings), db = round(g round(act(a))) (two, and act(a)'s fp32 cancellation, as the
    forward's tests bound it)."""
    a, b, g = (t.detach().double() for t in (a, b, g))
    a_ = a.clone().requires_grad_()
    (deriv,) = torch.autograd.grad(activation_float64(a_, act).sum(), a_)
    act_mag = activation_float64(a, act).abs() + (0.5 * a.abs() if act != "silu" else 0)
    mag_a, mag_b = deriv.abs() * g.abs() * b.abs(), g.abs() * act_mag
    slack_a, slack_b = g.abs() * b.abs() * (1 + a.abs()), g.abs() * (1 + a.abs())
    return mag_a, mag_b, slack_a, slack_b


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("act_first", [True, False], ids=["act_first", "geglu_order"])
def test_act_and_mul_backward(tk, act, dtype, hidden, act_first):
    if act == "silu" and not act_first:
        pytest.skip("the gate-second order is GEGLU's, a GELU")
    x = random_input((rows_for(hidden), 2 * hidden), dtype).requires_grad_()
    g = random_input((x.shape[0], hidden), dtype)
    (dx,) = grads_of(gated_case(tk, act, act_first, x), x, g)
    assert dx.shape == x.shape
    (ref,) = reference_grads(gated_reference(act, act_first), [x], g)
    first, second = x.chunk(2, dim=-1)
    a, b = (first, second) if act_first else (second, first)
    mag_a, mag_b, slack_a, slack_b = gated_magnitudes(a, b, g, act)
    ref_mag = torch.cat((mag_a, mag_b) if act_first else (mag_b, mag_a), -1)
    slack = torch.cat((slack_a, slack_b) if act_first else (slack_b, slack_a), -1)
    assert_grad_within(dx, ref, ref_mag, 2.5, slack, "act_and_mul backward vs float64")
    (eager,) = grads_of(eager_act_and_mul(x, act, act_first), x, g)
    assert_matches_eager(dx, eager, ref_mag + FP32_SLACK * slack, 4)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_act_mul_backward(tk, act, dtype):
    gate = random_input((37, 11008), dtype).requires_grad_()
    up = random_input((37, 11008), dtype).requires_grad_()
    g = random_input(gate.shape, dtype)
    dgate, dup = grads_of(tk.act_mul(gate, up, act), (gate, up), g)
    ref_gate, ref_up = reference_grads(lambda a, b: activation_float64(a, act) * b, [gate, up], g)
    mag_gate, mag_up, slack_gate, slack_up = gated_magnitudes(gate, up, g, act)
    assert_grad_within(dgate, ref_gate, mag_gate, 2.5, slack_gate, "act_mul dgate vs float64")
    assert_grad_within(dup, ref_up, mag_up, 2.5, slack_up, "act_mul dup vs float64")
    eager_gate, eager_up = grads_of(eager_act_mul(gate, up, act), (gate, up), g)
    assert_matches_eager(dgate, eager_gate, mag_gate + FP32_SLACK * slack_gate, 4)
    assert_matches_eager(dup, eager_up, mag_up + FP32_SLACK * slack_up, 4)


def test_activation_backward_hostile_layouts(tk):
    """Strided rows (a slice of a wider projection, transposed leading dims), unaligned views (the
    scalar path), expanded and strided incoming gradients: the same values as contiguous copies."""
    base = random_input((6, 5, 2 * 4099 + 3), torch.bfloat16)
    cases = {
        "sliced": base[..., 1: 1 + 2 * 4099],                   # unaligned: scalar path
        "aligned_slice": base[..., 8: 8 + 2 * 4096],            # strided rows, vectors
        "transposed": base[..., : 2 * 4096].transpose(0, 1),    # leading dims permuted
    }
    for name, view in cases.items():
        x = view.detach().requires_grad_()
        x_ref = view.detach().contiguous().requires_grad_()
        for fn in (lambda t: tk.silu(t), lambda t: tk.silu_and_mul(t), lambda t: tk.geglu(t, "tanh"),
                   lambda t: tk.act_mul(*t.chunk(2, dim=-1), "gelu")):
            out = fn(x)
            g_full = random_input(out.shape, out.dtype)
            grads = (g_full, g_full.transpose(0, 1).contiguous().transpose(0, 1),  # leading dims permuted
                     torch.ones((), device="cuda", dtype=out.dtype).expand(out.shape),  # a sum's: stride 0
                     random_input((*out.shape[:-1], 2 * out.shape[-1]), out.dtype)[..., ::2])  # last dim strided
            for g in grads:
                (dx,) = torch.autograd.grad(fn(x), x, g)
                (dx_ref,) = torch.autograd.grad(fn(x_ref), x_ref, g.contiguous())
                assert torch.equal(dx, dx_ref), name


def test_backward_through_sum_and_empty(tk):
    x = random_input((3, 5, 64), torch.float16).requires_grad_()
    tk.silu_and_mul(x).sum().backward()  # the incoming gradient is an expanded scalar
    ref = x.detach().requires_grad_()
    eager_act_and_mul(ref, "silu").sum().backward()
    torch.testing.assert_close(x.grad, ref.grad, rtol=2 ** -9, atol=1e-5)  # within 2 fp16 ulps of eager
    for shape in [(0, 64), (4, 0), (2, 0, 8)]:
        e = torch.empty(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        (de,) = torch.autograd.grad(tk.gelu(e).sum(), e)
        assert de.shape == e.shape
        if shape[-1] % 2 == 0:
            (de,) = torch.autograd.grad(tk.silu_and_mul(e).sum(), e, allow_unused=True)
            assert de.shape == e.shape


def test_out_forms_refuse_grad(tk):
    x = random_input((4, 64), torch.bfloat16).requires_grad_()
    with pytest.raises(RuntimeError, match="activation: the out= form has no backward"):
        tk.silu(x, out=torch.empty_like(x))
    with pytest.raises(RuntimeError, match="activation_out: writes into `out` and has no backward"):
        tk.ops.activation_out(torch.empty_like(x), x, "silu")  # the op itself, past the Python API
    with torch.no_grad():
        out = torch.empty_like(x)
        assert tk.silu(x, out=out) is out


# ---- RoPE ----

def hf_cos_sin(B, S, rotary_dim, dtype, theta=500000.0):
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device="cuda").float() / rotary_dim))
    freqs = torch.randint(0, 8192, (B, S), device="cuda").float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope_grad_magnitude(g, cos, sin, style):
    """|g_i| |cos_i| + |g_partner| |sin_partner|: the terms the backward rounds."""
    g64, c, s = g.double().abs(), cos.double().abs(), sin.double().abs()
    r = c.shape[-1]
    gr = g64[..., :r]
    if style == "neox":
        partner, s_partner = (torch.cat((t[..., r // 2:], t[..., : r // 2]), -1) for t in (gr, s.expand_as(gr)))
    else:
        partner, s_partner = (t.unflatten(-1, (-1, 2)).flip(-1).flatten(-2) for t in (gr, s.expand_as(gr)))
    return torch.cat((gr * c + partner * s_partner, g64[..., r:]), dim=-1) + 1e-3


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("heads", [(32, 8), (7, 1), (5, 2)])
@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_hf_rope_backward(tk, dtype, d, heads, partial, unsqueeze_dim):
    B, S = 2, 37
    Hq, Hk = heads
    qkv = random_input((B, S, (Hq + 2 * Hk) * d), dtype)
    q = qkv[..., : Hq * d].view(B, S, Hq, d)
    k = qkv[..., Hq * d: (Hq + Hk) * d].view(B, S, Hk, d)
    if unsqueeze_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
    cos, sin = hf_cos_sin(B, S, d // 2 if partial else d, dtype)
    q_out, k_out = tk.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
    gq, gk = random_input(q_out.shape, dtype), random_input(k_out.shape, dtype)
    dq, dk = torch.autograd.grad((q_out, k_out), (q, k), (gq, gk))
    assert dq.shape == q.shape and dk.shape == k.shape
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    eager_q, eager_k = hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
    edq, edk = torch.autograd.grad((eager_q, eager_k), (q, k), (gq, gk))
    for ours, eager, x, g in ((dq, edq, q, gq), (dk, edk, k, gk)):
        x64 = x.detach().double().requires_grad_()
        (ref,) = torch.autograd.grad(rotary_float64(x64, c, s, "neox"), x64, g.double())
        mag = rope_grad_magnitude(g, c, s, "neox")
        assert_grad_within(ours, ref, mag, 3.5, mag, "hf rope backward vs float64")  # three roundings, as eager
        assert_matches_eager(ours, eager, mag, 4)


def ltx_tables(B, S, C):
    import math

    freqs = torch.rand(B, S, C // 6 * 3, device="cuda") * 2 * math.pi
    cos, sin = freqs.cos().repeat_interleave(2, dim=-1), freqs.sin().repeat_interleave(2, dim=-1)
    pad = C - cos.shape[-1]
    if pad:
        cos = torch.cat([torch.ones(B, S, pad, device="cuda"), cos], dim=-1)
        sin = torch.cat([torch.zeros(B, S, pad, device="cuda"), sin], dim=-1)
    return cos, sin


def check_fp32_rope_backward(ours, x, g, cos, sin, eager_fn):
    """fp32 math, one rounding (eager's autograd rounds three times: within its bound, not its bits)."""
    x64 = x.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(rotary_float64(x64, cos, sin, "interleaved"), x64, g.double())
    mag = rope_grad_magnitude(g, cos, sin, "interleaved")
    assert_grad_within(ours, ref, mag, 1.5, mag, "interleaved rope backward vs float64")
    xe = x.detach().requires_grad_()
    (eager,) = torch.autograd.grad(eager_fn(xe), xe, g)
    mismatch_vs_eager(ours, eager, mag, 4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("C", [2048, 96, 100])
@pytest.mark.parametrize("offset", [0, 1], ids=["vectors", "pairs"])
def test_ltx_rope_backward_tables_and_coords(tk, dtype, C, offset):
    """ltx_rope (tables) and ltx_rope_from_coords: gradients vs float64, and the coordinate
    form's gradient equal to the table form's with the module's tables, bit for bit."""
    from families import family_module

    ltx_coords_and_tables = family_module("rope", "cases").ltx_coords_and_tables

    B, F, H, W = 2, 3, 5, 7
    grid, freqs, cos, sin = ltx_coords_and_tables(B, F, H, W, C, "video_coords")
    S = grid.shape[1]
    qkv = random_input((B, S, offset + 3 * C), dtype)[..., offset:]
    q, k = (t.detach().requires_grad_() for t in (qkv[..., :C], qkv[..., C: 2 * C]))
    gq, gk = random_input((B, S, C), dtype), random_input((B, S, C), dtype)
    dq, dk = torch.autograd.grad(tk.ltx_rope_from_coords(q, k, grid, freqs), (q, k), (gq, gk))
    tq, tk_ = torch.autograd.grad(tk.ltx_rope(q, k, cos, sin), (q, k), (gq, gk))
    assert torch.equal(dq, tq) and torch.equal(dk, tk_), "coordinate and table backward differ"
    for ours, x, g in ((dq, q, gq), (dk, k, gk)):
        check_fp32_rope_backward(ours, x, g, cos, sin, lambda t: diffusers_interleaved_rotary(t, cos, sin))
    cos_r, sin_r = ltx_tables(B, S, C)  # random tables too
    dq, _ = torch.autograd.grad(tk.ltx_rope(q, k, cos_r, sin_r), (q, k), (gq, gk))
    check_fp32_rope_backward(dq, q, gq, cos_r, sin_r, lambda t: diffusers_interleaved_rotary(t, cos_r, sin_r))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H", [24, 3])
def test_flux_rope_backward(tk, dtype, H):
    B, S, d = 1, 257, 128
    q, k = (random_input((B, S, H, d), dtype).requires_grad_() for _ in range(2))
    angles = torch.rand(S, d // 2, device="cuda") * 100
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    gq, gk = random_input(q.shape, dtype), random_input(k.shape, dtype)
    dq, dk = torch.autograd.grad(tk.flux_rope(q, k, cos, sin), (q, k), (gq, gk))
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    for ours, x, g in ((dq, q, gq), (dk, k, gk)):
        check_fp32_rope_backward(ours, x, g, c, s, lambda t: diffusers_interleaved_rotary(t, c, s))


def test_rope_backward_arbitrary_tables_and_layouts(tk):
    """Tables whose pairs' two sines differ (any tables, not only the models'), unaligned views, an
    expanded incoming gradient: the transposed-sine backward still equals autograd."""
    B, S, H, d = 2, 9, 3, 64
    base = random_input((B, S, H, d + 1), torch.float32)
    q = base[..., 1:].detach().requires_grad_()  # unaligned: the pair-by-pair path
    k = random_input((B, S, 2, d), torch.float32).requires_grad_()
    for style in ("neox", "interleaved"):
        cos, sin = random_input((1, S, d), torch.float32), random_input((1, S, d), torch.float32)
        outs = tk.ops.rope(q, k, cos, sin, style, True)
        for g in [(random_input(q.shape, torch.float32), random_input(k.shape, torch.float32)),
                  (torch.ones(()).cuda().expand(q.shape), torch.ones(()).cuda().expand(k.shape))]:
            dq, dk = torch.autograd.grad(outs, (q, k), g, retain_graph=True)
            for ours, x, gg in ((dq, q, g[0]), (dk, k, g[1])):
                x64 = x.detach().double().requires_grad_()
                (ref,) = torch.autograd.grad(rotary_float64(x64, cos[:, :, None], sin[:, :, None], style), x64,
                                             gg.double())
                torch.testing.assert_close(ours.double(), ref, rtol=2e-6, atol=2e-6)


def test_in_place_rope_refuses_grad(tk):
    q = random_input((1, 4, 2, 64), torch.bfloat16).requires_grad_()
    cos, sin = hf_cos_sin(1, 2, 64, torch.bfloat16)
    with pytest.raises(RuntimeError, match="apply_rotary_pos_emb_: the in-place form has no backward"):
        tk.apply_rotary_pos_emb_(q, q.detach().clone(), cos, sin)
    with pytest.raises(RuntimeError, match="hf_rope_: is an in-place inference form"):
        tk.ops.hf_rope_(q, q.detach().clone(), cos, sin, 1)


# ---- opcheck with inputs that require grad; torch.compile ----

def _req(t):
    return t.detach().requires_grad_()


def test_opcheck_with_grad(tk):
    x = _req(random_input((8, 256), torch.bfloat16))
    g, u = _req(random_input((8, 128), torch.bfloat16)), _req(random_input((8, 128), torch.bfloat16))
    q, k = _req(random_input((2, 9, 4, 64), torch.bfloat16)), _req(random_input((2, 9, 2, 64), torch.bfloat16))
    cos, sin = hf_cos_sin(2, 9, 64, torch.bfloat16)
    c32, s32 = ltx_tables(2, 9, 256)
    lq, lk = _req(random_input((2, 9, 256), torch.bfloat16)), _req(random_input((2, 9, 256), torch.bfloat16))
    grid, freqs = torch.rand(1, 9, 3, device="cuda"), torch.rand(256 // 6, device="cuda")
    for op, args in [
        (tk.ops.activation.default, (x, "gelu_tanh")),
        (tk.ops.act_and_mul.default, (x, "silu", True)),
        (tk.ops.act_and_mul.default, (x, "gelu", False)),
        (tk.ops.act_mul.default, (g, u, "silu")),
        (tk.ops.rope.default, (q, k, cos, sin, "neox", False)),
        (tk.ops.rope.default, (lq.unsqueeze(2), lk.unsqueeze(2), c32, s32, "interleaved", True)),
        (tk.ops.hf_rope.default, (q.transpose(1, 2), k.transpose(1, 2), cos, sin, 1)),
        (tk.ops.ltx_rope_from_coords.default, (lq, lk, grid, freqs)),
        (tk.ops.activation_backward.default, (g.detach(), g.detach(), "silu")),
        (tk.ops.act_and_mul_backward.default, (g.detach(), x.detach(), "gelu_tanh", False)),
        (tk.ops.act_mul_backward.default, (g.detach(), g.detach(), u.detach(), "gelu")),
        (tk.ops.rope_backward.default, (q.detach(), k.detach(), cos, sin, "neox", False)),
        (tk.ops.ltx_rope_from_coords_backward.default, (lq.detach(), lk.detach(), grid, freqs)),
    ]:
        torch.library.opcheck(op, args)


def test_training_step_compiles_fullgraph(tk):
    """A Llama MLP and attention rotation trained under torch.compile: no graph break, and the same
    gradients as the eager run of our ops."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    gate_up = torch.nn.Linear(256, 2 * 512, bias=False).to("cuda", torch.bfloat16)
    cos, sin = hf_cos_sin(2, 16, 64, torch.bfloat16)

    def step(x, q, k):
        h = gate_up(x)
        y = tk.silu_and_mul(h) + tk.act_mul(*h.chunk(2, dim=-1), "silu")
        qo, ko = tk.apply_rotary_pos_emb(q, k, cos, sin)
        return y.float().square().mean() + (qo.float() * ko.float()).mean()

    x = random_input((2, 16, 256), torch.bfloat16)
    q, k = (_req(random_input((2, 4, 16, 64), torch.bfloat16)) for _ in range(2))
    compiled = torch.compile(step, fullgraph=True)
    loss = compiled(x, q, k)
    grads = torch.autograd.grad(loss, (gate_up.weight, q, k))
    ref_grads = torch.autograd.grad(step(x, q, k), (gate_up.weight, q, k))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-3)  # compile may fuse the loss differently
