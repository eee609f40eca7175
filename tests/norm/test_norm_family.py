"""fused_add_rms_norm (both forms), layer_norm, norm_modulate (AdaLN) and gated_add_norm_modulate:
float64 accuracy, parity with the eager code of the modules they replace, broadcast and strided
modulation, in-place semantics, bad inputs, opcheck and torch.compile."""

import pytest
import torch

from helpers import DTYPES, UNIT_ROUNDOFF, assert_all_written, assert_matches_eager, assert_rejects, assert_within, poisoned, random_input
from reference.norms import (
    diffusers_norm_modulate,
    float64_norm,
    hf_fused_add_rms_norm,
    hf_rms_norm,
    ltx_gated_add_norm_modulate,
    torch_layer_norm,
)

pytestmark = pytest.mark.gpu

HIDDEN = [1, 7, 127, 769, 2048, 3584, 65536, 262144]
EPS = 1e-6


def rows_for(hidden):
    return max(1, min(33, (1 << 20) // hidden))


def param(hidden, dtype, kind="same", lo=0.5, hi=1.5):
    if kind == "none":
        return None
    return (torch.rand(hidden, device="cuda") * (hi - lo) + lo).to(dtype if kind == "same" else torch.float32)


# ---- fused_add_rms_norm ----

@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight_kind", ["same", "fp32", "none"])
def test_fused_add_rms_norm(tk, hidden, dtype, weight_kind):
    rows = rows_for(hidden)
    x, res = random_input((rows, hidden), dtype), random_input((rows, hidden), dtype)
    w = param(hidden, dtype, weight_kind)
    x0, res0 = x.clone(), res.clone()
    out, h = tk.fused_add_rms_norm(x, res, w, EPS)
    assert torch.equal(x, x0) and torch.equal(res, res0), "the out-of-place form changed its inputs"
    eager_out, eager_h = hf_fused_add_rms_norm(x, res, w, EPS)
    assert torch.equal(h, eager_h), "x + residual must round exactly as the eager add"
    ref = float64_norm(h, "rms", w, None, EPS)
    assert_within(out, ref, ref.abs(), 2 * UNIT_ROUNDOFF[dtype] / UNIT_ROUNDOFF[out.dtype], "out vs float64")
    assert_matches_eager(out, eager_out, eager_out.double().abs(), 4 * UNIT_ROUNDOFF[dtype] / UNIT_ROUNDOFF[out.dtype])

    # out= form, with poisoned outputs
    out2, h2 = poisoned(x.shape, out.dtype), poisoned(x.shape, dtype)
    tk.fused_add_rms_norm(x, res, w, EPS, out=out2, residual_out=h2)
    assert torch.equal(out2, out) and torch.equal(h2, h)


@pytest.mark.parametrize("hidden", [7, 4096, 70001])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_add_rms_norm_in_place(tk, hidden, dtype):
    rows = rows_for(hidden)
    x, res = random_input((rows, hidden), dtype), random_input((rows, hidden), dtype)
    w = param(hidden, dtype)
    expected_out, expected_h = tk.fused_add_rms_norm(x, res, w, EPS)
    x_ptr, res_ptr = x.data_ptr(), res.data_ptr()
    x_new, res_new = tk.fused_add_rms_norm_(x, res, w, EPS)
    assert x_new.data_ptr() == x_ptr and res_new.data_ptr() == res_ptr
    assert torch.equal(x, expected_out) and torch.equal(res, expected_h)


def test_fused_add_rms_norm_in_place_strided(tk):
    big_x, big_r = random_input((16, 2, 4096), torch.bfloat16), random_input((16, 2, 4096), torch.bfloat16)
    x, res = big_x[:, 0], big_r[:, 1]  # row strides 8192, not contiguous
    expected_out, expected_h = tk.fused_add_rms_norm(x, res, None, EPS)
    untouched_x, untouched_r = big_x[:, 1].clone(), big_r[:, 0].clone()
    tk.fused_add_rms_norm_(x, res, None, EPS)
    assert torch.equal(x, expected_out) and torch.equal(res, expected_h)
    assert torch.equal(big_x[:, 1], untouched_x) and torch.equal(big_r[:, 0], untouched_r)


# ---- layer_norm ----

@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("affine", ["weight_bias", "none", "weight_only", "fp32"])
def test_layer_norm(tk, hidden, dtype, affine):
    rows = rows_for(hidden)
    x = random_input((rows, hidden), dtype, scale=3.0, offset=2.0)  # a large mean: variance must be centered
    kind = "fp32" if affine == "fp32" else ("none" if affine == "none" else "same")
    w = param(hidden, dtype, kind)
    b = param(hidden, dtype, kind, -0.5, 0.5) if affine in ("weight_bias", "fp32") else None
    out = poisoned(x.shape, dtype)
    assert tk.layer_norm(x, w, b, 1e-5, out=out) is out
    assert_all_written(out)
    ref = float64_norm(x, "layer", w, b, 1e-5)
    # LayerNorm's error is absolute at the scale of its unit-variance output (the mean's rounding
    # shifts every element), so the magnitude has a floor of |weight|.
    w_abs = w.double().abs() if w is not None else 1.0
    magnitude = (float64_norm(x, "layer", None, None, 1e-5).abs() + 1) * w_abs + (b.double().abs() if b is not None else 0)
    assert_within(out, ref, magnitude, 1.5, "layer_norm vs float64")
    if affine != "fp32" or dtype == torch.float32:  # eager F.layer_norm rejects half x with fp32 params
        eager = torch_layer_norm(x, w, b, 1e-5)
        assert_matches_eager(out, eager, magnitude, 2)
    assert torch.equal(tk.layer_norm(x, w, b, 1e-5), out)


# ---- AdaLN modulation and the gated residual ----

def modulation_shapes(B, S, D):
    """scale/shift as the models pass them: per sample [B,1,D] (LTX text-to-video), per token
    [B,S,D] (LTX's condition pipeline), [D], and a strided slice of LTX's [B,T,6,D] table."""
    table = random_input((B, 1, 6, D), torch.float32, scale=0.3, offset=0.0)
    return {
        "per_sample": lambda dt: (random_input((B, 1, D), dt, scale=0.3, offset=0.0), random_input((B, 1, D), dt, scale=0.5, offset=0.0)),
        "per_token": lambda dt: (random_input((B, S, D), dt, scale=0.3, offset=0.0), random_input((B, S, D), dt, scale=0.5, offset=0.0)),
        "per_feature": lambda dt: (random_input((D,), dt, scale=0.3, offset=0.0), random_input((D,), dt, scale=0.5, offset=0.0)),
        "table_view": lambda dt: (table.to(dt)[:, :, 1], table.to(dt)[:, :, 0]),
    }


# After the norm, the modulation rounds three more times (n, n * (1 + scale), + shift): a 1-ulp
# difference in n from a differently ordered fp32 reduction can grow to ~3 ulp of the output.
MODULATE_ULPS = 4


def modulate64(n64, scale, shift, norm):
    """float64 reference of the modulation, and the magnitude its rounding errors scale with.

    LayerNorm's error is absolute at the scale of its unit-variance output (the rounded mean shifts
    every element), hence the floor of 1 on |n| for norm="layer"."""
    ref = n64 * (1 + scale.double())
    mag = (n64.abs() + (1.0 if norm == "layer" else 0.0)) * (1 + scale.double()).abs()
    if shift is not None:
        ref = ref + shift.double()
        mag = mag + shift.double().abs()
    return ref, mag


@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mod", ["per_sample", "per_token", "per_feature", "table_view"])
@pytest.mark.parametrize("hidden", [7, 2048, 4096, 65536])
def test_norm_modulate(tk, norm, dtype, mod, hidden):
    B, S = 2, 37
    x = random_input((B, S, hidden), dtype)
    scale, shift = modulation_shapes(B, S, hidden)[mod](dtype)
    out = poisoned(x.shape, dtype)
    tk.norm_modulate(x, scale, shift, norm=norm, eps=EPS, out=out)
    assert_all_written(out)
    ref, mag = modulate64(float64_norm(x, norm, eps=EPS), scale, shift, norm)
    assert_within(out, ref, mag, 4, f"{norm} modulate vs float64")
    eager = diffusers_norm_modulate(x, scale, shift, norm, eps=EPS)
    assert_matches_eager(out, eager, mag, MODULATE_ULPS)
    assert torch.equal(tk.norm_modulate(x, scale, shift, norm=norm, eps=EPS), out)


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_norm_modulate_with_affine_and_no_shift(tk, norm):
    x = random_input((3, 64, 1024), torch.bfloat16)
    w = param(1024, torch.bfloat16)
    b = param(1024, torch.bfloat16, lo=-0.3, hi=0.3) if norm == "layer" else None
    scale = random_input((3, 1, 1024), torch.bfloat16, scale=0.3, offset=0.0)
    out = tk.norm_modulate(x, scale, None, norm=norm, weight=w, bias=b, eps=EPS)
    eager = diffusers_norm_modulate(x, scale, None, norm, w, b, EPS)
    _, mag = modulate64(float64_norm(x, norm, w, b, EPS), scale, None, norm)
    assert_matches_eager(out, eager, mag * (w.double().abs().max() if norm == "layer" else 1), MODULATE_ULPS)


@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mod", ["per_sample", "per_token", "table_view", "no_gate"])
@pytest.mark.parametrize("hidden", [127, 2048, 65536])
def test_gated_add_norm_modulate(tk, norm, dtype, mod, hidden):
    B, S = 2, max(1, min(37, (1 << 19) // hidden))
    x, y = random_input((B, S, hidden), dtype), random_input((B, S, hidden), dtype)
    scale, shift = modulation_shapes(B, S, hidden)["per_sample" if mod == "no_gate" else mod](dtype)
    gate = None if mod == "no_gate" else modulation_shapes(B, S, hidden)[mod](dtype)[0]
    h, out = poisoned(x.shape, dtype), poisoned(x.shape, dtype)
    res = tk.gated_add_norm_modulate(x, y, gate, scale, shift, norm=norm, eps=EPS, h_out=h, out=out)
    assert res[0] is out and res[1] is h
    assert_all_written(h, out)
    eager_out, eager_h = ltx_gated_add_norm_modulate(x, y, gate, scale, shift, norm, eps=EPS)
    assert torch.equal(h, eager_h), "x + gate * y must round exactly as the eager ops"
    ref, mag = modulate64(float64_norm(h, norm, eps=EPS), scale, shift, norm)
    assert_within(out, ref, mag, 4, "gated modulate vs float64")
    assert_matches_eager(out, eager_out, mag, MODULATE_ULPS)
    out2, h2 = tk.gated_add_norm_modulate(x, y, gate, scale, shift, norm=norm, eps=EPS)
    assert torch.equal(h2, h) and torch.equal(out2, out)


# ---- rows split across blocks ----
# A few rows wider than 16 K columns are split into chunks of a block each (norm.cuh,
# norm_split_chunks): a first kernel writes each chunk's statistics, a second combines them and
# normalizes. Chunk boundaries, the row's tail in its last chunk, the scalar path and strided rows.

SPLIT_HIDDEN = 3 * 8192 + 5  # three whole chunks, a partial one, and a tail of 5


@pytest.mark.parametrize("layout", ["contiguous", "strided", "misaligned"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_rows(tk, layout, dtype):
    rows, hidden = 5, SPLIT_HIDDEN

    def view(scale=2.0, offset=0.5):
        if layout == "contiguous":
            return random_input((rows, hidden), dtype, scale=scale, offset=offset)
        big = random_input((rows, hidden + 24), dtype, scale=scale, offset=offset)
        return big[:, 8:8 + hidden] if layout == "strided" else big[:, 1:1 + hidden]  # misaligned: scalar path

    x, res = view(), view()
    w = param(hidden, dtype)
    b = param(hidden, dtype, lo=-0.5, hi=0.5)
    out, h = tk.fused_add_rms_norm(x, res, w, EPS)
    eager_out, eager_h = hf_fused_add_rms_norm(x, res, w, EPS)
    assert torch.equal(h, eager_h)
    assert_matches_eager(out, eager_out, eager_out.double().abs(), 4)
    # in place: the second kernel reads h back from the residual the first one overwrote
    x2, res2 = x.clone(), res.clone()
    tk.fused_add_rms_norm_(x2, res2, w, EPS)
    assert torch.equal(x2, out) and torch.equal(res2, h)

    xl = view(scale=3.0, offset=2.0)
    ln = tk.layer_norm(xl, w, b, 1e-5)
    ref = float64_norm(xl, "layer", w, b, 1e-5)
    magnitude = (float64_norm(xl, "layer", None, None, 1e-5).abs() + 1) * w.double().abs() + b.double().abs()
    assert_within(ln, ref, magnitude, 1.5, "split layer_norm vs float64")

    for norm in ("rms", "layer"):
        scale, shift = modulation_shapes(rows, 1, hidden)["per_sample"](dtype)
        xm = x.unsqueeze(1)
        out_m = poisoned(xm.shape, dtype)
        tk.norm_modulate(xm, scale, shift, norm=norm, eps=EPS, out=out_m)
        assert_all_written(out_m)
        ref_m, mag = modulate64(float64_norm(xm, norm, eps=EPS), scale, shift, norm)
        assert_within(out_m, ref_m, mag, 4, f"split {norm} modulate vs float64")
        gate = random_input((rows, 1, hidden), dtype, scale=0.3, offset=0.0)
        out_g, h_g = tk.gated_add_norm_modulate(xm, res.unsqueeze(1), gate, scale, shift, norm=norm, eps=EPS)
        eager_out_g, eager_h_g = ltx_gated_add_norm_modulate(xm, res.unsqueeze(1), gate, scale, shift, norm, eps=EPS)
        assert torch.equal(h_g, eager_h_g)
        _, mag_g = modulate64(float64_norm(h_g, norm, eps=EPS), scale, shift, norm)
        assert_matches_eager(out_g, eager_out_g, mag_g, MODULATE_ULPS)


def test_wide_rows_not_split_when_many(tk):
    """Many wide rows are not split (enough rows for every SM): each keeps a block, which re-reads
    the part of its row past what the block holds in registers."""
    x = random_input((600, 40000), torch.bfloat16)
    w = param(40000, torch.bfloat16)
    out = tk.rms_norm(x, w, EPS)
    eager = hf_rms_norm(x, w, EPS)
    assert_matches_eager(out, eager, eager.double().abs(), 4)


def test_rms_norm_over_heads(tk):
    """Per-head norms (Qwen3 q/k, Flux) on [B, S, H, d] and on transformers' [B, H, S, d] view."""
    q = random_input((2, 50, 32, 128), torch.bfloat16)
    w = param(128, torch.bfloat16)
    per_head = tk.rms_norm(q, w, 1e-6)

    assert_matches_eager(per_head, hf_rms_norm(q, w, 1e-6), hf_rms_norm(q, w, 1e-6).double().abs(), 4)
    view = q.transpose(1, 2)  # non-contiguous
    assert torch.equal(tk.rms_norm(view, w, 1e-6), per_head.transpose(1, 2))
    across = tk.rms_norm(q.flatten(2), param(4096, torch.bfloat16), 1e-5, rounding="torch")  # LTX q/k norm
    assert across.shape == (2, 50, 4096)


@pytest.mark.parametrize("op", ["fused_add", "layer", "modulate", "gated"])
def test_empty_rows(tk, op):
    x = torch.empty(0, 5, 64, device="cuda", dtype=torch.bfloat16)
    s = torch.zeros(64, device="cuda", dtype=torch.bfloat16)
    outs = {
        "fused_add": lambda: tk.fused_add_rms_norm(x, x.clone(), None),
        "layer": lambda: (tk.layer_norm(x),),
        "modulate": lambda: (tk.norm_modulate(x, s, s),),
        "gated": lambda: tk.gated_add_norm_modulate(x, x.clone(), s, s, s),
    }[op]()
    assert all(o.shape == x.shape for o in outs)


# ---- bad inputs ----

def _valid():
    bf = dict(device="cuda", dtype=torch.bfloat16)
    return dict(x=torch.randn(2, 8, 64, **bf), y=torch.randn(2, 8, 64, **bf), residual=torch.randn(2, 8, 64, **bf),
                scale=torch.randn(2, 1, 64, **bf), shift=torch.randn(2, 1, 64, **bf), gate=torch.randn(2, 1, 64, **bf),
                weight=torch.randn(64, **bf))


BAD = {
    "residual_shape": (lambda t, v: t.fused_add_rms_norm(v["x"], v["residual"][:, :4], v["weight"]), ValueError,
                       "residual must have the shape of x"),
    "residual_dtype": (lambda t, v: t.fused_add_rms_norm(v["x"], v["residual"].half(), v["weight"]), TypeError,
                       "residual must have dtype"),
    "in_place_fp32_weight": (lambda t, v: t.fused_add_rms_norm_(v["x"], v["residual"], v["weight"].float()),
                             TypeError, "in place, the output overwrites x"),
    "in_place_aliased": (lambda t, v: t.fused_add_rms_norm_(v["x"], v["x"], v["weight"]), ValueError,
                         "x must not share memory with residual"),
    "residual_out_overlaps": (lambda t, v: t.fused_add_rms_norm(v["x"], v["residual"], v["weight"],
                                                                 residual_out=v["residual"]), ValueError,
                              "residual_out must not share memory with residual"),
    "layer_bias_size": (lambda t, v: t.layer_norm(v["x"], v["weight"], v["weight"][:32]), ValueError,
                        "bias must be 1-D with"),
    "layer_mixed_param_dtypes": (lambda t, v: t.layer_norm(v["x"], v["weight"], v["weight"].float()), TypeError,
                                 "weight and bias must have one dtype"),
    "scale_not_broadcast": (lambda t, v: t.norm_modulate(v["x"], v["scale"][:, :, :32], v["shift"]), ValueError,
                            "scale must broadcast"),
    "scale_bad_batch": (lambda t, v: t.norm_modulate(v["x"], v["scale"].repeat(3, 1, 1), v["shift"]), ValueError,
                        "does not broadcast"),
    "scale_dtype": (lambda t, v: t.norm_modulate(v["x"], v["scale"].float(), v["shift"]), TypeError,
                    "scale must have dtype"),
    "shift_cpu": (lambda t, v: t.norm_modulate(v["x"], v["scale"], v["shift"].cpu()), ValueError,
                  r"shift must be on the same device as x \(cuda:0\), got cpu"),
    "norm_name": (lambda t, v: t.norm_modulate(v["x"], v["scale"], v["shift"], norm="group"), ValueError,
                  "norm must be"),
    "rms_with_bias": (lambda t, v: t.norm_modulate(v["x"], v["scale"], v["shift"], bias=v["weight"]), ValueError,
                      "bias is only used with norm=\"layer\""),
    "rms_modulate_fp32_weight": (lambda t, v: t.norm_modulate(v["x"], v["scale"], v["shift"],
                                                              weight=v["weight"].float()), TypeError,
                                 "the weight must have x's dtype"),
    "gate_dtype": (lambda t, v: t.gated_add_norm_modulate(v["x"], v["y"], v["gate"].float(), v["scale"], v["shift"]),
                   TypeError, "gate must have dtype"),
    "y_shape": (lambda t, v: t.gated_add_norm_modulate(v["x"], v["y"][:1], v["gate"], v["scale"], v["shift"]),
                ValueError, "y must have the shape of x"),
    "gated_out_aliases_x": (lambda t, v: t.gated_add_norm_modulate(v["x"], v["y"], v["gate"], v["scale"], v["shift"],
                                                                    out=v["x"]), ValueError,
                            "out must not share memory with x"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_clear_error(tk, case):
    call, exc, message = BAD[case]
    assert_rejects(lambda: call(tk, _valid()), exc, message)


def test_opcheck(tk):
    v = _valid()
    x, r, w, s, sh, g, y = v["x"], v["residual"], v["weight"], v["scale"], v["shift"], v["gate"], v["y"]
    cases = [
        (tk.ops.fused_add_rms_norm.default, (x, r, w, EPS, "hf")),
        (tk.ops.fused_add_rms_norm_out.default, (torch.empty_like(x), torch.empty_like(x), x, r, w, EPS, "hf")),
        (tk.ops.fused_add_rms_norm_.default, (x.clone(), r.clone(), w, EPS, "hf")),
        (tk.ops.layer_norm.default, (x, w, w, 1e-5)),
        (tk.ops.layer_norm_out.default, (torch.empty_like(x), x, None, None, 1e-5)),
        (tk.ops.norm_modulate.default, (x, s, sh, None, None, EPS, "rms")),
        (tk.ops.norm_modulate_out.default, (torch.empty_like(x), x, s, None, w, w, EPS, "layer")),
        (tk.ops.gated_add_norm_modulate.default, (x, y, g, s, sh, None, None, EPS, "rms")),
        (tk.ops.gated_add_norm_modulate.default, (x, y, None, s, sh, None, None, EPS, "layer")),
        (tk.ops.gated_add_norm_modulate_out.default,
         (torch.empty_like(x), torch.empty_like(x), x, y, g, s, sh, None, None, EPS, "layer")),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


def test_dit_block_compiles_fullgraph(tk):
    """An LTX-style block tail: gated residual + modulated norm, then a modulated norm, compiled."""
    torch._dynamo.reset()
    v = _valid()

    def block(x, y, gate, scale, shift):
        n, h = tk.gated_add_norm_modulate(x, y, gate, scale, shift, eps=EPS)
        return h, tk.norm_modulate(n * 2, scale, shift, norm="layer", eps=EPS)

    args = (v["x"], v["y"], v["gate"], v["scale"], v["shift"])
    compiled = torch.compile(block, fullgraph=True)
    for a, b in zip(compiled(*args), block(*args)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    inplace = torch.compile(lambda x, r: tk.fused_add_rms_norm_(x, r, None, EPS), fullgraph=True)
    xa, ra = v["x"].clone(), v["residual"].clone()
    xb, rb = v["x"].clone(), v["residual"].clone()
    inplace(xa, ra)
    tk.fused_add_rms_norm_(xb, rb, None, EPS)
    assert torch.equal(xa, xb) and torch.equal(ra, rb)
