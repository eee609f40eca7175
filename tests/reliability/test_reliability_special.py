"""Special values and sizes: rows of zeros, with a NaN, with an infinity, and rows whose sum of
squares overflows fp32, through the norms and RoPE (with eps > 0 and eps = 0); tensors of more
than 2^31 elements, and of 2^31 - 1 rows (the most the row kernels take), on the GPU.

Special values must come out as the eager code of the replaced module gives them: NaN exactly
where it has NaN, the same infinities, finite elements close to its, and the other rows of the
batch untouched (bit for bit what they give alone)."""

import pytest
import torch

from helpers import DTYPES, UNIT_ROUNDOFF, FP32_REL_TOL, assert_within, random_input
from reference.norms import (
    RMS_NORM_EAGER,
    diffusers_norm_modulate,
    float64_norm,
    hf_fused_add_rms_norm,
    ltx_gated_add_norm_modulate,
    rms_norm_float64,
    torch_layer_norm,
)
from reference.activations import activation_float64
from reference.rope import (
    diffusers_interleaved_rotary,
    diffusers_qk_norm_rope,
    hf_apply_rotary_pos_emb,
    hf_qk_norm_rope,
    ltx_tables_from_coords,
    rotary_float64,
    vllm_rotary_embedding_native,
)

pytestmark = pytest.mark.gpu
DEVICE = "cuda"  # (a CPU dry run of the test code sets it to "cpu" with an eager stand-in for the kernel)

NAN, INF = float("nan"), float("inf")
# Rows of special values, by index in a batch of ROWS rows; the rest are normal random rows.
SPECIAL_ROWS = {1: "zeros", 3: "nan", 5: "+inf", 6: "-inf", 8: "huge"}
ROWS = 10
HUGE = 1e30  # squares overflow fp32 (bf16 and fp32 inputs; fp16's largest, 65504, does not)
# row groups, a block per row, rows split across blocks (10 rows: a width the vectors divide), and a
# width they do not (element by element, a block per row; eager's RMSNorm takes its Welford path)
HIDDEN = [64, 4096, 3 * 8192 + 8, 3 * 8192 + 5]


def special_batch(shape, dtype, rows_dim=-2):
    """Random values with SPECIAL_ROWS planted along `rows_dim`: an element in the middle of the row
    for NaN and the infinities."""
    x = random_input(shape, dtype, device=DEVICE)
    xr = x.movedim(rows_dim, 0)
    for r, kind in SPECIAL_ROWS.items():
        if kind == "zeros":
            xr[r] = 0
        elif kind == "huge":  # random, not constant: a constant row's variance is all rounding
            big = HUGE if dtype != torch.float16 else 60000.0
            xr[r] = ((torch.rand(xr[r].shape, device=x.device) * 2 - 1) * big).to(dtype)
        else:
            xr[r].view(-1)[xr[r].numel() // 2] = {"nan": NAN, "+inf": INF, "-inf": -INF}[kind]
    return x


def assert_like_eager(ours, eager, what, scale=4.0, rounded_to=None):
    """NaN where eager has NaN, the same infinities, finite elements within a few ulps of eager's
    (relative to |eager| + scale: this is about special values; accuracy is tested elsewhere).
    `rounded_to`: a dtype the output went through before its last op (HF's RMSNorm rounds the
    normalized row to x's dtype, then multiplies by an fp32 weight): its ulps count, since an fp32
    statistic summed in another order may put a value on the other side of that rounding."""
    assert ours.shape == eager.shape and ours.dtype == eager.dtype, what
    o, e = ours.double(), eager.double()
    nan_diff = o.isnan() != e.isnan()
    assert not nan_diff.any(), f"{what}: NaN differs from eager at {nan_diff.nonzero()[:5].tolist()}"
    inf = e.isinf()
    assert torch.equal(o.isinf(), inf) and torch.equal(o[inf], e[inf]), f"{what}: infinities differ from eager"
    fin = e.isfinite()
    u = max(UNIT_ROUNDOFF[ours.dtype], UNIT_ROUNDOFF[rounded_to or ours.dtype])
    tol = (8 * u + FP32_REL_TOL) * (e[fin].abs() + scale)
    err = (o[fin] - e[fin]).abs()
    assert (err <= tol).all(), f"{what}: finite elements differ from eager by up to {err.max().item():.3g}"


def assert_rows_isolated(ours, alone, rows_dim, what):
    """The normal rows of the batch are, bit for bit, what those rows give on their own."""
    normal = [r for r in range(ROWS) if r not in SPECIAL_ROWS]
    got = ours.movedim(rows_dim, 0)[normal]
    assert torch.equal(got, alone.movedim(rows_dim, 0)), f"{what}: a special row changed another row"


def normal_rows(x, rows_dim=-2):
    normal = torch.tensor([r for r in range(ROWS) if r not in SPECIAL_ROWS], device=x.device)
    return x.index_select(x.dim() + rows_dim if rows_dim < 0 else rows_dim, normal)


def param(n, dtype, lo=0.5, hi=1.5):
    return (torch.rand(n, device=DEVICE) * (hi - lo) + lo).to(dtype)


# ---- norms: op -> (ours(x, eps), eager(x, eps), launch_independent(x, eps, eager outputs)); x [1, ROWS, H] ----

HUGE_ROW = next(r for r, kind in SPECIAL_ROWS.items() if kind == "huge")
INF_ROWS = [r for r, kind in SPECIAL_ROWS.items() if kind in ("+inf", "-inf")]


def with_rows(t, rows, values):
    """t with rows `rows` (dim -2) replaced by `values` (broadcast to them)."""
    t = t.clone()
    t[..., rows, :] = values
    return t


def norm_ops(H, dtype):
    w, wf, b = param(H, dtype), param(H, torch.float32), param(H, dtype, -0.5, 0.5)
    scale = random_input((1, 1, H), dtype, scale=0.5, offset=0.0, device=DEVICE)
    shift = random_input((1, 1, H), dtype, scale=1.0, offset=0.0, device=DEVICE)
    res = random_input((1, ROWS, H), dtype, device=DEVICE)
    gate = random_input((1, 1, H), dtype, scale=0.5, offset=0.0, device=DEVICE)
    zeros = torch.zeros(1, 1, H, dtype=dtype, device=DEVICE)

    def layer_n0(i, n0):
        """The overflowing row as a normalized row of 0 (n0: the op's output for it from the eager
        code, a row of zeros with eps = 1) in output i; fp16's huge row (60000s) does not overflow."""
        return lambda x, e, want: want if dtype == torch.float16 else (
            *want[:i], with_rows(want[i], [HUGE_ROW], n0()), *want[i + 1:])

    def rms_norm_summing_squares(x, e, want):
        """F.rms_norm's vectorized-path form for the rows with an infinity, where 4-vectors do not
        divide the width (eager's Welford path makes them NaN): x * rsqrt(mean(x^2) + eps) * w."""
        if H % 4 == 0:
            return want
        xi = x[..., INF_ROWS, :].float()
        rows = (xi * torch.rsqrt(xi.pow(2).mean(-1, keepdim=True) + e) * w.float()).to(dtype)
        return (with_rows(want[0], INF_ROWS, rows),)

    ops = {}
    for rounding in RMS_NORM_EAGER:
        ops[f"rms_norm[{rounding}]"] = (lambda t, x, e, r=rounding: (t.rms_norm(x, w, e, rounding=r),),
                                        lambda x, e, r=rounding: (RMS_NORM_EAGER[r](x, w, e),),
                                        rms_norm_summing_squares if rounding == "torch" else None)
    ops["rms_norm[hf,fp32_weight]"] = (lambda t, x, e: (t.rms_norm(x, wf, e),),
                                       lambda x, e: (RMS_NORM_EAGER["hf"](x, wf, e),))
    ops["fused_add_rms_norm"] = (lambda t, x, e: t.fused_add_rms_norm(x, res, w, e),
                                 lambda x, e: hf_fused_add_rms_norm(x, res, w, e))
    ops["layer_norm"] = (lambda t, x, e: (t.layer_norm(x, w, b, e),), lambda x, e: (torch_layer_norm(x, w, b, e),),
                         layer_n0(0, lambda: torch_layer_norm(zeros, w, b, 1.0)))
    for norm in ("rms", "layer"):
        n0 = lambda: diffusers_norm_modulate(zeros, scale, shift, "layer", eps=1.0)  # noqa: E731
        ops[f"norm_modulate[{norm}]"] = (
            lambda t, x, e, n=norm: (t.norm_modulate(x, scale, shift, norm=n, eps=e),),
            lambda x, e, n=norm: (diffusers_norm_modulate(x, scale, shift, n, eps=e),),
            layer_n0(0, n0) if norm == "layer" else None)
        # the special values in the branch output y: h = x + gate * y carries them
        ops[f"gated_add_norm_modulate[{norm}]"] = (
            lambda t, y, e, n=norm: t.gated_add_norm_modulate(res, y, gate, scale, shift, norm=n, eps=e),
            lambda y, e, n=norm: ltx_gated_add_norm_modulate(res, y, gate, scale, shift, n, eps=e),
            layer_n0(0, n0) if norm == "layer" else None)
    return {op: fns if len(fns) == 3 else (*fns, None) for op, fns in ops.items()}


NORM_OP_NAMES = ["rms_norm[hf]", "rms_norm[diffusers]", "rms_norm[torch]", "rms_norm[hf,fp32_weight]",
                 "fused_add_rms_norm", "layer_norm", "norm_modulate[rms]", "norm_modulate[layer]",
                 "gated_add_norm_modulate[rms]", "gated_add_norm_modulate[layer]"]


@pytest.mark.parametrize("eps", [1e-6, 0.0], ids=["eps", "eps0"])
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", NORM_OP_NAMES)
def test_norms_special_rows(tk, op, dtype, hidden, eps):
    """Zero rows give zeros (eps > 0; NaN with eps = 0, as 0 * rsqrt(0) in eager), a NaN or an
    infinity makes its row what eager makes it, an overflowing sum of squares gives eager's zeros.

    Two rows where eager's CUDA result depends on its own launch rather than on the values; the
    kernels give, at every width, what eager gives on its other paths (launch_independent):
    - LayerNorm of the overflowing row (bf16, fp32): eager's Welford merges multiply the overflowed
      delta^2 by a count; where a block has threads without elements (widths below 4 x 128), a count
      is 0 and inf * 0 makes the row NaN; elsewhere the variance is inf, rstd 0, and the row
      normalizes to 0. The kernels' two passes overflow the variance to inf: the row normalizes to 0.
    - F.rms_norm of a row with an infinity, at widths 4-vectors do not divide: eager takes its
      Welford path, rstd = rsqrt(var + mean^2 + eps) with var = NaN (inf - inf), a NaN row; its
      vectorized path (and HF's and diffusers' code) sums squares: NaN at the infinity, x * 0 = 0
      elsewhere. The kernels sum squares."""
    if dtype == torch.float32 and "fp32_weight" in op:
        pytest.skip("the same as the x-dtype weight for float32")
    ours, eager, launch_independent = norm_ops(hidden, dtype)[op]
    x = special_batch((1, ROWS, hidden), dtype)
    got, want = ours(tk, x, eps), eager(x, eps)
    if launch_independent is not None:
        want = launch_independent(x, eps, want)
    rounded_to = dtype if op == "rms_norm[hf,fp32_weight]" else None
    for i, (g, w_) in enumerate(zip(got, want)):
        assert_like_eager(g, w_, f"{op} output {i}", rounded_to=rounded_to)
    if "gated" not in op and "fused_add" not in op:  # (their other row operands have ROWS rows)
        for i, (g, a) in enumerate(zip(got, ours(tk, normal_rows(x), eps))):
            assert_rows_isolated(g, a, -2, f"{op} output {i}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [7, 4096, 3 * 8192 + 5])
def test_eps_zero_matches_float64(tk, dtype, hidden):
    """eps = 0 on ordinary rows: rsqrt(mean(x^2)) alone, within the usual bounds of float64."""
    x = random_input((ROWS, hidden), dtype, device=DEVICE)
    w = param(hidden, dtype)
    out = tk.rms_norm(x, w, 0.0)
    ref = rms_norm_float64(x, w, 0.0)
    assert_within(out, ref, ref.abs(), 2, "rms_norm eps=0")
    b = param(hidden, dtype, -0.5, 0.5)
    ln = tk.layer_norm(x, w, b, 0.0)
    mag = (float64_norm(x, "layer", None, None, 0.0).abs() + 1) * w.double().abs() + b.double().abs()
    assert_within(ln, float64_norm(x, "layer", w, b, 0.0), mag, 1.5, "layer_norm eps=0")


# ---- RoPE: special values in some heads ----

# (b, s, h) of q's special heads in [B, S, H, d] = [2, 4, 3, d]
SPECIAL_HEADS = {(0, 1, 0): "zeros", (0, 2, 1): "nan", (1, 0, 2): "+inf", (1, 3, 0): "-inf"}


def special_heads(shape, dtype):
    x = random_input(shape, dtype, device=DEVICE)
    for (b, s, h), kind in SPECIAL_HEADS.items():
        if kind == "zeros":
            x[b, s, h] = 0
        else:
            x[b, s, h, shape[-1] // 2 + 1] = {"nan": NAN, "+inf": INF, "-inf": -INF}[kind]
    return x


def angles(*shape):
    return (torch.rand(*shape, device=DEVICE) * 2 - 1) * 100


def rope_ops(dtype, d, eps):
    B, S = 2, 4
    a = angles(B, S, d // 2)
    hf_cos, hf_sin = torch.cat((a, a), -1).cos().to(dtype), torch.cat((a, a), -1).sin().to(dtype)
    a2 = angles(S, d // 2).repeat_interleave(2, -1)
    flux_cos, flux_sin = a2.cos(), a2.sin()
    C = 3 * d
    a3 = angles(B, S, C // 2).repeat_interleave(2, -1)
    ltx_cos, ltx_sin = a3.cos(), a3.sin()
    grid, freqs = torch.rand(B, S, 3, device=DEVICE), torch.rand(C // 6, device=DEVICE) * 100
    g_cos, g_sin = ltx_tables_from_coords(grid, freqs, C)
    w, wc = param(d, dtype), param(C, dtype)
    cache_a = angles(64, d // 2)
    cache = torch.cat((cache_a.cos(), cache_a.sin()), -1).to(dtype)
    positions = torch.randint(0, 64, (B * S,), device=DEVICE)
    k4 = random_input((B, S, 1, d), dtype, device=DEVICE)

    def flat(x):  # [B, S, 3, d] -> [B, S, 3d] (LTX's q before the head split)
        return x.flatten(-2)

    def cached(t, x):
        q, k = x.flatten(0, 1).flatten(1).clone(), k4.flatten(0, 1).flatten(1).clone()
        return t.rotary_embedding(positions, q, k, d, cache)

    return {
        "apply_rotary_pos_emb": (lambda t, x: t.apply_rotary_pos_emb(x, k4, hf_cos, hf_sin, unsqueeze_dim=2),
                                 lambda x: hf_apply_rotary_pos_emb(x, k4, hf_cos, hf_sin, unsqueeze_dim=2)),
        "flux_rope": (lambda t, x: t.flux_rope(x, k4, flux_cos, flux_sin),
                      lambda x: tuple(diffusers_interleaved_rotary(y, flux_cos[None, :, None], flux_sin[None, :, None])
                                      for y in (x, k4))),
        "ltx_rope": (lambda t, x: t.ltx_rope(flat(x), flat(x), ltx_cos, ltx_sin),
                     lambda x: (diffusers_interleaved_rotary(flat(x), ltx_cos, ltx_sin),) * 2),
        "rotary_embedding": (cached,
                             lambda x: vllm_rotary_embedding_native(positions, x.flatten(0, 1).flatten(1),
                                                                    k4.flatten(0, 1).flatten(1), d, cache)),
        "qk_norm_rope": (lambda t, x: t.qk_norm_rope(x, k4, w, w, eps, flux_cos, flux_sin),
                         lambda x: diffusers_qk_norm_rope(x, k4, w, w, eps, flux_cos[None, :, None],
                                                          flux_sin[None, :, None])),
        "ltx_qk_norm_rope": (lambda t, x: t.ltx_qk_norm_rope(flat(x), flat(x), wc, wc, eps, ltx_cos, ltx_sin),
                             lambda x: diffusers_qk_norm_rope(flat(x), flat(x), wc, wc, eps, ltx_cos, ltx_sin)),
        "hf_qk_norm_rope": (lambda t, x: t.hf_qk_norm_rope(x, k4, w, w, eps, hf_cos, hf_sin),
                            lambda x: hf_qk_norm_rope(x, k4, w, w, eps, hf_cos, hf_sin)),
        "ltx_rope_from_coords": (lambda t, x: t.ltx_rope_from_coords(flat(x), flat(x), grid, freqs),
                                 lambda x: (diffusers_interleaved_rotary(flat(x), g_cos, g_sin),) * 2),
        "ltx_qk_norm_rope_from_coords": (
            lambda t, x: t.ltx_qk_norm_rope_from_coords(flat(x), flat(x), wc, wc, eps, grid, freqs),
            lambda x: diffusers_qk_norm_rope(flat(x), flat(x), wc, wc, eps, g_cos, g_sin)),
    }


ROPE_OP_NAMES = ["apply_rotary_pos_emb", "flux_rope", "ltx_rope", "rotary_embedding", "qk_norm_rope",
                 "ltx_qk_norm_rope", "hf_qk_norm_rope", "ltx_rope_from_coords", "ltx_qk_norm_rope_from_coords"]


@pytest.mark.parametrize("eps", [1e-6, 0.0], ids=["eps", "eps0"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ROPE_OP_NAMES)
def test_rope_special_heads(tk, op, dtype, d, eps):
    """Zero heads stay zero (NaN after a norm with eps = 0, as in eager), a NaN or an infinity goes
    where eager's arithmetic sends it, and the other heads are those of the same call without them."""
    if eps == 0.0 and "norm" not in op:
        pytest.skip("no eps in this form")
    ours, eager = rope_ops(dtype, d, eps)[op]
    x = special_heads((2, 4, 3, d), dtype)
    for i, (g, w_) in enumerate(zip(ours(tk, x), eager(x))):
        assert_like_eager(g, w_, f"{op} output {i}", scale=8.0)
    clean = x.clone()
    for (b, s, h) in SPECIAL_HEADS:
        clean[b, s, h] = random_input((d,), dtype, device=DEVICE)
    if op in ("apply_rotary_pos_emb", "qk_norm_rope", "hf_qk_norm_rope", "rotary_embedding"):  # per-head forms
        got, alone = ours(tk, x)[0], ours(tk, clean)[0]
        got, alone = got.reshape(2, 4, 3, d), alone.reshape(2, 4, 3, d)
        keep = torch.ones(2, 4, 3, dtype=torch.bool, device=DEVICE)
        for bsh in SPECIAL_HEADS:
            keep[bsh] = False
        assert torch.equal(got[keep], alone[keep]), f"{op}: a special head changed another head"


# ---- sizes: more than 2^31 elements, 2^31 - 1 rows ----

GiB = 2**30


def require_free(nbytes):
    free = torch.cuda.mem_get_info()[0]
    if free < nbytes:
        pytest.skip(f"needs {nbytes / GiB:.1f} GiB of free GPU memory, {free / GiB:.1f} GiB free")


def sample_rows(n, count=64):
    """Rows to check against float64: the first, the last ones (past 2^31 elements) and a spread."""
    # integers: a float32 linspace rounds n - 1 up past the last row near 2^30
    idx = [(n - 1) * i // (count - 1) for i in range(count)] + [n - 2, n - 1]
    assert 0 <= min(idx) and max(idx) == n - 1
    return torch.tensor(sorted(set(idx)), device=DEVICE)


def assert_no_nan(t, chunk=1 << 28):
    flat = t.view(-1)
    for i in range(0, flat.numel(), chunk):
        assert not flat[i:i + chunk].isnan().any(), f"NaN left at elements {i}..{i + chunk} (not written)"


@pytest.mark.parametrize("rows,hidden", [(2**31 // 4096 + 3, 4096), (2**31 - 1, 2)],
                         ids=["2^31+12288_elements", "2^31-1_rows"])
@pytest.mark.large
@pytest.mark.no_poison
def test_rms_norm_and_silu_past_2_31_elements(tk, rows, hidden):
    """bf16 x of more than 2^31 elements (the second with the most rows allowed): 2 x 4 GiB or
    2 x 8 GiB (x and out, written through out= from NaN), checked at sampled rows and the last."""
    n = rows * hidden
    require_free(2 * n * 2 + 2 * GiB)
    x = torch.randn(rows, hidden, device=DEVICE, dtype=torch.bfloat16)
    w = param(hidden, torch.bfloat16)
    out = torch.full_like(x, NAN)
    tk.rms_norm(x, w, 1e-6, out=out)
    assert_no_nan(out)
    idx = sample_rows(rows)
    ref = rms_norm_float64(x[idx], w, 1e-6)
    assert_within(out[idx], ref, ref.abs(), 2, "rms_norm, sampled rows")
    out.fill_(NAN)
    tk.silu(x, out=out)
    assert_no_nan(out)
    ref = activation_float64(x[idx], "silu")
    assert_within(out[idx], ref, ref.abs() + 1e-3, 1.5, "silu, sampled rows")  # fp32 math, one rounding


@pytest.mark.large
@pytest.mark.no_poison
def test_fused_add_rms_norm_and_silu_and_mul_past_2_31_elements(tk):
    """fused_add_rms_norm on 2^31 + 4096 bf16 elements (x, residual, out, h: 4 x 4 GiB, the outputs
    through out= from NaN) and
    silu_and_mul with an output of 2^31 + 4096 elements (x 8 GiB, out 4 GiB)."""
    rows, H = 2**31 // 4096 + 1, 4096
    require_free(4 * rows * H * 2 + 2 * GiB)
    x, res = torch.randn(rows, H, device=DEVICE, dtype=torch.bfloat16), torch.randn(rows, H, device=DEVICE,
                                                                                   dtype=torch.bfloat16)
    w = param(H, torch.bfloat16)
    out, h = torch.full_like(x, NAN), torch.full_like(x, NAN)
    tk.fused_add_rms_norm(x, res, w, out=out, residual_out=h)
    assert_no_nan(out)
    assert_no_nan(h)
    idx = sample_rows(rows)
    assert torch.equal(h[idx], x[idx] + res[idx])
    ref = rms_norm_float64(h[idx], w, 1e-6)
    assert_within(out[idx], ref, ref.abs(), 2, "fused_add_rms_norm, sampled rows")
    del x, res, out, h
    torch.cuda.empty_cache()
    require_free(3 * rows * H * 2 + 2 * GiB)
    x2 = torch.randn(rows, 2 * H, device=DEVICE, dtype=torch.bfloat16)
    out = torch.full((rows, H), NAN, device=DEVICE, dtype=torch.bfloat16)
    tk.silu_and_mul(x2, out=out)
    assert_no_nan(out)
    gate, up = x2[idx, :H].double(), x2[idx, H:].double()
    ref = activation_float64(gate, "silu") * up
    mag = (activation_float64(gate, "silu").abs() + 1e-3) * up.abs()
    assert_within(out[idx], ref, mag, 2.5, "silu_and_mul, sampled rows")  # two roundings


def neox_magnitude(x, cos, sin):
    """|x_i| |cos_i| + |x_partner| |sin_i|: what the rotation's roundings scale with (NeoX halves)."""
    x64 = x.double().abs()
    half = x.shape[-1] // 2
    partner = torch.cat((x64[..., half:], x64[..., :half]), dim=-1)
    return x64 * cos.double().abs() + partner * sin.double().abs() + 1e-3


@pytest.mark.large
@pytest.mark.no_poison
def test_rope_past_2_31_elements(tk):
    """apply_rotary_pos_emb and hf_qk_norm_rope on q [1, S, 32, 128] of 2^31 + 4096 bf16 elements
    (k [1, S, 8, 128], tables [1, S, 128]; about 11 GiB with the outputs), and rotary_embedding in
    place on the same q; checked at sampled tokens and the last."""
    S, Hq, Hk, d = 2**31 // (32 * 128) + 1, 32, 8, 128
    require_free((2 * S * (Hq + Hk) * d + 2 * S * d) * 2 + 2 * GiB)
    q = torch.randn(1, S, Hq, d, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(1, S, Hk, d, device=DEVICE, dtype=torch.bfloat16)
    a = torch.rand(1, S, d // 2, device=DEVICE) * 1000
    cos, sin = torch.cat((a, a), -1).cos().to(torch.bfloat16), torch.cat((a, a), -1).sin().to(torch.bfloat16)
    del a
    idx = sample_rows(S)
    q_out, k_out = tk.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    for out, x in ((q_out, q), (k_out, k)):
        c, s_ = cos[:, idx, None], sin[:, idx, None]
        ref = rotary_float64(x[:, idx], c, s_, "neox")
        assert_within(out[:, idx], ref, neox_magnitude(x[:, idx], c, s_), 4, "rope, sampled tokens")
    del q_out, k_out
    w = param(d, torch.bfloat16)
    q_out, k_out = tk.hf_qk_norm_rope(q, k, w, w, 1e-6, cos, sin)
    eq, ek = hf_qk_norm_rope(q[:, idx], k[:, idx], w, w, 1e-6, cos[:, idx], sin[:, idx])
    for ours, eager in ((q_out[:, idx], eq), (k_out[:, idx], ek)):
        assert_like_eager(ours, eager, "hf_qk_norm_rope, sampled tokens", scale=4.0)
    del q_out, k_out
    cache_a = torch.rand(4096, d // 2, device=DEVICE) * 1000
    cache = torch.cat((cache_a.cos(), cache_a.sin()), -1).to(torch.bfloat16)
    positions = torch.randint(0, 4096, (S,), device=DEVICE)
    query, key = q.view(S, Hq * d), k.view(S, Hk * d)
    eq, ek = vllm_rotary_embedding_native(positions[idx], query[idx], key[idx], d, cache)
    tk.rotary_embedding(positions, query, key, d, cache)
    assert_like_eager(query[idx], eq, "rotary_embedding, sampled tokens", scale=4.0)
    assert_like_eager(key[idx], ek, "rotary_embedding (key), sampled tokens", scale=4.0)


@pytest.mark.large
@pytest.mark.no_poison
def test_rope_with_2_31_minus_2_rows(tk):
    """RoPE's rows are B * S * (Hq + Hk) heads: 2^30 - 1 tokens of one q and one k head of 2 (q, k,
    cos, sin and both outputs: 6 x 4 GiB of bf16), the most rows but one the check allows."""
    S = 2**30 - 1
    require_free(6 * S * 2 * 2 + 2 * GiB)
    q = torch.randn(1, S, 1, 2, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(1, S, 1, 2, device=DEVICE, dtype=torch.bfloat16)
    a = torch.rand(1, S, 1, device=DEVICE) * 1000
    cos = a.cos().to(torch.bfloat16).expand(1, S, 2).contiguous()  # NeoX: the pair's one angle twice
    sin = a.sin().to(torch.bfloat16).expand(1, S, 2).contiguous()
    del a
    q_out, k_out = tk.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    idx = sample_rows(S)
    for out, x in ((q_out, q), (k_out, k)):
        eager = hf_apply_rotary_pos_emb(x[:, idx], x[:, idx], cos[:, idx], sin[:, idx], unsqueeze_dim=2)[0]
        assert_like_eager(out[:, idx], eager, "rope, sampled tokens")
