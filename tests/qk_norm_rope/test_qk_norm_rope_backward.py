"""Backward of the fused q/k norm + RoPE ops: qk_norm_rope (Flux per head), ltx_qk_norm_rope (LTX
across heads, tables), ltx_qk_norm_rope_from_coords (LTX, coordinates) and hf_qk_norm_rope (Qwen3):
dq, dk and the two weights' gradients against torch autograd of the float64 reference, on head
sizes and widths that take every path (16-byte vectors, pairs, strided views of a fused
projection), empty inputs; opcheck; torch.compile(fullgraph=True) of forward and backward; errors.

CPU: the closed form (the transposed rotation, then the RMSNorm backward) against autograd with
tables whose pairs disagree; autograd traced on meta tensors; the refusal of table gradients."""

import pytest
import torch

from helpers import DTYPES, assert_rejects, random_input
from reference.norm_backward import qk_norm_rope_backward_float64, qk_norm_rope_float64
from reference.rope import ltx_tables_from_coords
from grad_helpers import assert_grad, f64, grad_inputs, grads_of, leaf

gpu = pytest.mark.gpu
EPS = 1e-6


@pytest.mark.parametrize("style", ["interleaved", "neox"])
@pytest.mark.parametrize("weighted", [False, True])
def test_closed_form_matches_autograd(style, weighted):
    g = torch.Generator().manual_seed(2)
    B, S, H, L = 2, 3, 4, 12
    x = torch.randn(B, S, H, L, generator=g, dtype=torch.float64) * 2 + 0.5
    w = torch.rand(L, generator=g, dtype=torch.float64) + 0.5 if weighted else None
    # arbitrary tables: the two elements of a pair need not share an angle
    cos, sin = (torch.randn(B, S, 1, L, generator=g, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(B, S, H, L, generator=g, dtype=torch.float64)
    xl = x.clone().requires_grad_(True)
    wl = None if w is None else w.clone().requires_grad_(True)
    qk_norm_rope_float64(xl, wl, EPS, cos, sin, style).backward(dout)
    dx, dw = qk_norm_rope_backward_float64(dout, x, w, EPS, cos, sin, style)
    torch.testing.assert_close(dx, xl.grad, rtol=1e-10, atol=1e-10)
    if w is not None:
        torch.testing.assert_close(dw, wl.grad, rtol=1e-10, atol=1e-10)


def test_autograd_traced_on_meta(tk):
    meta = dict(device="meta", dtype=torch.bfloat16)

    def check(outs, inputs):
        grads = torch.autograd.grad(outs, inputs, [torch.empty_like(o) for o in outs])
        for g, t in zip(grads, inputs):
            assert g.shape == t.shape and g.dtype == t.dtype

    q, k = torch.empty(2, 9, 8, 128, **meta, requires_grad=True), torch.empty(2, 9, 2, 128, **meta, requires_grad=True)
    wq, wk = torch.empty(128, **meta, requires_grad=True), torch.empty(128, **meta, requires_grad=True)
    cos = torch.empty(2, 9, 128, **meta)
    check(tk.hf_qk_norm_rope(q, k, wq, wk, EPS, cos, cos), (q, k, wq, wk))
    cos32 = torch.empty(9, 128, device="meta")
    check(tk.qk_norm_rope(q, k, wq, wk, EPS, cos32, cos32), (q, k, wq, wk))
    x, r = torch.empty(2, 9, 256, **meta, requires_grad=True), torch.empty(2, 9, 256, **meta, requires_grad=True)
    w = torch.empty(256, device="meta", dtype=torch.float32, requires_grad=True)
    t = torch.empty(2, 9, 256, device="meta")
    check(tk.ltx_qk_norm_rope(x, r, w, w, EPS, t, t), (x, r, w))
    grid, freqs = torch.empty(1, 9, 3, device="meta"), torch.empty(256 // 6, device="meta")
    check(tk.ltx_qk_norm_rope_from_coords(x, r, w, w, EPS, grid, freqs), (x, r, w))


@pytest.mark.parametrize("which", ["cos", "sin", "grid", "freqs"])
def test_table_gradients_refused(tk, which):
    meta = dict(device="meta", dtype=torch.bfloat16)
    x = torch.empty(2, 9, 256, **meta, requires_grad=True)
    w = torch.empty(256, **meta)
    t = {n: torch.empty(2, 9, 256, device="meta", requires_grad=n == which) for n in ("cos", "sin")}
    grid = torch.empty(1, 9, 3, device="meta", requires_grad=which == "grid")
    freqs = torch.empty(42, device="meta", requires_grad=which == "freqs")
    if which in ("cos", "sin"):
        with pytest.raises(RuntimeError, match="qk_norm_rope: no gradient for cos and sin"):
            tk.ltx_qk_norm_rope(x, x, w, w, EPS, t["cos"], t["sin"])
    else:
        with pytest.raises(RuntimeError, match="ltx_qk_norm_rope_from_coords: no gradient for grid and freqs"):
            tk.ltx_qk_norm_rope_from_coords(x, x, w, w, EPS, grid, freqs)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_out_form_refuses_grad(tk, device):
    t = dict(device=device, dtype=torch.float32)
    q, k = torch.randn(1, 2, 4, 64, **t, requires_grad=True), torch.randn(1, 2, 2, 64, **t)
    w, cos = torch.ones(64, **t), torch.ones(1, 2, 64, **t)
    out = (torch.empty_like(q), torch.empty_like(k))
    with pytest.raises(RuntimeError, match="^hf_qk_norm_rope: the out= form has no backward"):
        tk.hf_qk_norm_rope(q, k, w, w, EPS, cos, cos, out=out)


def test_backward_ops_reject_cpu_tensors(tk):
    q, w, c = torch.randn(1, 2, 4, 64), torch.ones(64), torch.ones(1, 2, 64)
    with pytest.raises(ValueError, match="hf_qk_norm_rope_backward: q must be a CUDA tensor"):
        tk.ops.hf_qk_norm_rope_backward(q, q, q, q, w, w, EPS, c, c, [True] * 4)


# ---- GPU ----

def check_grads(ours, refs, names, rows):
    for got, ref, name in zip(ours, refs, names):
        assert_grad(got, ref.grad, name, sums=rows)


def flux_tables(S, d):
    angles = torch.rand(S, d // 2, device="cuda") * 100
    return angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [2, 64, 126, 128])
@pytest.mark.parametrize("weight_fp32", [False, True])
@pytest.mark.parametrize("offset", [0, 2])
def test_flux_qk_norm_rope_backward(tk, dtype, d, weight_fp32, offset):
    B, S, H = 2, 37, 3
    qkv = random_input((B, S, offset + 3 * H * d), dtype)[..., offset:]  # views of one projection
    q, k = qkv[..., : H * d].unflatten(-1, (H, d)), qkv[..., H * d: 2 * H * d].unflatten(-1, (H, d))
    wq, wk = ((torch.rand(d, device="cuda") + 0.5).to(torch.float32 if weight_fp32 else dtype) for _ in range(2))
    cos, sin = flux_tables(S, d)
    inputs = grad_inputs(q, k, wq, wk)
    q_out, k_out = tk.qk_norm_rope(*inputs, EPS, cos, sin)
    dq_out, dk_out = (random_input(t.shape, dtype, scale=1.0, offset=0.0) for t in (q_out, k_out))
    grads = grads_of((q_out, k_out), inputs, (dq_out, dk_out))
    refs = [f64(t) for t in (q, k, wq, wk)]
    c, s = cos[None, :, None], sin[None, :, None]
    torch.autograd.backward((qk_norm_rope_float64(refs[0], refs[2], EPS, c, s, "interleaved"),
                             qk_norm_rope_float64(refs[1], refs[3], EPS, c, s, "interleaved")),
                            (dq_out.double(), dk_out.double()))
    check_grads(grads, refs, ("dq", "dk", "dq_weight", "dk_weight"), B * S * H)


def ltx_tables(B, S, C):
    angles = torch.rand(B, S, C // 6 * 3, device="cuda") * 6.3
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    pad = C - cos.shape[-1]
    if pad:
        cos = torch.cat([torch.ones(B, S, pad, device="cuda"), cos], -1)
        sin = torch.cat([torch.zeros(B, S, pad, device="cuda"), sin], -1)
    return cos, sin


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("C", [8, 62, 2048, 4096])
@pytest.mark.parametrize("source", ["tables", "coords"])
def test_ltx_qk_norm_rope_backward(tk, dtype, C, source):
    B, S = 2, 129
    q, k = random_input((B, S, C), dtype), random_input((B, S, C), dtype)
    w = [(torch.rand(C, device="cuda") + 0.5).to(dtype) for _ in range(2)]
    if source == "tables":
        cos, sin = ltx_tables(B, S, C)
        call = lambda *a: tk.ltx_qk_norm_rope(*a, EPS, cos, sin)  # noqa: E731
    else:
        grid, freqs = torch.rand(B, S, 3, device="cuda") * 4, torch.rand(C // 6, device="cuda") * 3
        cos, sin = ltx_tables_from_coords(grid, freqs, C)  # the kernel's cos/sin, bit for bit
        call = lambda *a: tk.ltx_qk_norm_rope_from_coords(*a, EPS, grid, freqs)  # noqa: E731
    inputs = grad_inputs(q, k, *w)
    q_out, k_out = call(*inputs)
    dq_out, dk_out = (random_input(t.shape, dtype, scale=1.0, offset=0.0) for t in (q_out, k_out))
    grads = grads_of((q_out, k_out), inputs, (dq_out, dk_out))
    refs = [f64(t) for t in (q, k, *w)]
    torch.autograd.backward((qk_norm_rope_float64(refs[0], refs[2], EPS, cos, sin, "interleaved"),
                             qk_norm_rope_float64(refs[1], refs[3], EPS, cos, sin, "interleaved")),
                            (dq_out.double(), dk_out.double()))
    check_grads(grads, refs, ("dq", "dk", "dq_weight", "dk_weight"), B * S)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [64, 128, 130])
@pytest.mark.parametrize("heads", [(32, 8), (5, 2)])
@pytest.mark.parametrize("offset", [0, 1])
def test_qwen3_qk_norm_rope_backward(tk, dtype, d, heads, offset):
    B, S = 2, 33
    Hq, Hk = heads
    qkv = random_input((B, S, offset + (Hq + 2 * Hk) * d), dtype)[..., offset:]
    q, k = qkv[..., : Hq * d].unflatten(-1, (Hq, d)), qkv[..., Hq * d: (Hq + Hk) * d].unflatten(-1, (Hk, d))
    wq, wk = ((torch.rand(d, device="cuda") + 0.5).to(dtype) for _ in range(2))
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    emb = torch.randint(0, 8192, (B, S), device="cuda").float()[..., None] * inv_freq
    cos, sin = (f(torch.cat((emb, emb), -1)).to(dtype) for f in (torch.cos, torch.sin))
    inputs = grad_inputs(q, k, wq, wk)
    q_out, k_out = tk.hf_qk_norm_rope(*inputs, EPS, cos, sin)
    dq_out, dk_out = (random_input(t.shape, dtype, scale=1.0, offset=0.0) for t in (q_out, k_out))
    grads = grads_of((q_out, k_out), inputs, (dq_out, dk_out))
    refs = [f64(t) for t in (q, k, wq, wk)]
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    torch.autograd.backward((qk_norm_rope_float64(refs[0], refs[2], EPS, c, s, "neox"),
                             qk_norm_rope_float64(refs[1], refs[3], EPS, c, s, "neox")),
                            (dq_out.double(), dk_out.double()))
    check_grads(grads, refs, ("dq", "dk", "dq_weight", "dk_weight"), B * S * max(heads))


@gpu
def test_weight_gradients_only_where_asked(tk):
    q, k = random_input((1, 8, 4, 128), torch.bfloat16), random_input((1, 8, 2, 128), torch.bfloat16)
    w = (torch.rand(128, device="cuda") + 0.5).to(torch.bfloat16)
    cos, sin = flux_tables(8, 128)
    ql, kl = leaf(q), leaf(k)
    q_out, k_out = tk.qk_norm_rope(ql, kl, w, w, EPS, cos, sin)
    (q_out.float().sum() + k_out.float().sum()).backward()
    assert ql.grad is not None and kl.grad is not None and w.grad is None
    dq, dk, dwq, dwk = tk.ops.qk_norm_rope_backward(q_out.detach(), k_out.detach(), q, k, w, w, EPS, cos[None],
                                                    sin[None],
                                                    [True, True, False, True])
    assert dwq.shape == (0,) and dwk.shape == (128,)


@gpu
def test_empty(tk):
    q = torch.empty(2, 0, 4, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
    cos = torch.ones(2, 0, 64, device="cuda", dtype=torch.bfloat16)
    dq, dk, dwq, dwk = tk.ops.hf_qk_norm_rope_backward(q, q, q, q, w, w, EPS, cos, cos, [True] * 4)
    assert dq.shape == q.shape and dwq.shape == (64,) and not dwq.any() and not dwk.any()


@gpu
def test_too_wide_rows_raise(tk):
    C = 32768  # the forward holds it; the backward holds at most 1024 threads x 8 elements a row
    q = random_input((1, 4, C), torch.bfloat16)
    w = torch.ones(C, device="cuda", dtype=torch.bfloat16)
    cos, sin = ltx_tables(1, 4, C)
    assert_rejects(lambda: tk.ops.qk_norm_rope_backward(q[:, :, None], q[:, :, None], q[:, :, None], q[:, :, None], w,
                                                        w, EPS, cos, sin, [True] * 4),
                   ValueError, "qk_norm_rope_backward: rows of 32768 elements are too wide")


@gpu
def test_opcheck_and_compile(tk):
    torch._dynamo.reset()
    bf = dict(device="cuda", dtype=torch.bfloat16)
    q, k = (random_input((2, 9, 4, 128), torch.bfloat16).requires_grad_(True) for _ in range(2))
    w = (torch.rand(128, device="cuda") + 0.5).to(torch.bfloat16).requires_grad_(True)
    cos, sin = flux_tables(9, 128)
    hcos, hsin = cos.to(torch.bfloat16)[None].expand(2, 9, 128), sin.to(torch.bfloat16)[None].expand(2, 9, 128)
    torch.library.opcheck(tk.ops.qk_norm_rope.default, (q, k, w, w, EPS, cos[None], sin[None]))
    torch.library.opcheck(tk.ops.hf_qk_norm_rope.default, (q, k, w, w, EPS, hcos, hsin))
    x, r = (random_input((2, 9, 96), torch.bfloat16).requires_grad_(True) for _ in range(2))
    wx = (torch.rand(96, device="cuda") + 0.5).to(torch.bfloat16).requires_grad_(True)
    grid, freqs = torch.rand(2, 9, 3, device="cuda"), torch.rand(16, device="cuda")
    torch.library.opcheck(tk.ops.ltx_qk_norm_rope_from_coords.default, (x, r, wx, wx, EPS, grid, freqs))
    d = torch.randn(2, 9, 4, 128, **bf)
    torch.library.opcheck(tk.ops.hf_qk_norm_rope_backward.default,
                          (d, d, q.detach(), k.detach(), w.detach(), w.detach(), EPS, hcos, hsin, [True] * 4))

    def attention_inputs(q, k, w, x, r, wx):
        qo, ko = tk.qk_norm_rope(q, k, w, w, EPS, cos, sin)
        ho, hk = tk.hf_qk_norm_rope(q, k, w, w, EPS, hcos, hsin)
        lo, lk = tk.ltx_qk_norm_rope_from_coords(x, r, wx, wx, EPS, grid, freqs)
        return (qo * ho).float().sum() + (ko * hk).float().sum() + (lo * lk).float().sum()

    def grads(fn):
        leaves = [leaf(t) for t in (q, k, w, x, r, wx)]
        fn(*leaves).backward()
        return [t.grad for t in leaves]

    eager = grads(attention_inputs)
    compiled = grads(torch.compile(attention_inputs, fullgraph=True))
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(c, e, rtol=2e-2, atol=2e-2)
