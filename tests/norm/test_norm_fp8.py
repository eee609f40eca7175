"""The norms' FP8 outputs (rms_norm_fp8, fused_add_rms_norm_fp8, layer_norm_fp8, norm_modulate_fp8,
gated_add_norm_modulate_fp8): each equals the composition it replaces, our norm op then our
quantize_fp8 (tests/quant: bit for bit against reference/fp8.py), every code and scale, on every
catalog case and dtype, with NaN-poisoned outputs; the dequantized values against a float64
norm; non-finite, all-zero and constant rows; compile; the fakes and the refusals. GPU tests are
marked; the fakes and the refusals run anywhere."""

import pytest
import torch

import op_catalog
from conftest import FULL_CHECKOUT
from helpers import DTYPES, random_input, with_poisoned_outputs

if not FULL_CHECKOUT:
    pytest.skip("reference/ is not in this source set", allow_module_level=True)

from reference.fp8 import AMAX_FLOOR, E4M3_MAX, dequantize_fp8  # noqa: E402

gpu = pytest.mark.gpu

# FP8 op -> (the norm op it quantizes, which of that op's outputs is quantized, which are returned as they are)
COMPOSED = {
    "rms_norm_fp8": ("rms_norm", 0, ()),
    "fused_add_rms_norm_fp8": ("fused_add_rms_norm", 0, (1,)),
    "layer_norm_fp8": ("layer_norm", None, ()),
    "norm_modulate_fp8": ("norm_modulate", None, ()),
    "gated_add_norm_modulate_fp8": ("gated_add_norm_modulate", 0, (1,)),
}
FP8_ENTRIES = [name for name, (_, op, _) in op_catalog.ENTRIES.items() if op in COMPOSED]
# Rows wider than 16384 and fewer than two per SM: the 16-bit op splits them across blocks (its sums in
# another order); the FP8 form keeps each row in one block, so the bits may differ there (the float64
# check below still holds).
SPLIT_CASES = ("split_vec",)


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    ints = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
            torch.float8_e4m3fn: torch.uint8}
    return t.contiguous().view(ints[t.dtype])


def _composed(tk, op: str, args: tuple):
    """(the quantized values' codes and scale, the passed-through outputs) from our 16-bit op then
    quantize_fp8, the values rounded to x's dtype (an fp32 weight's "hf" RMSNorm output is fp32)."""
    base, quantized, passed = COMPOSED[op]
    outs = getattr(tk.ops, base).default(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    values = outs[0 if quantized is None else quantized].to(args[0].dtype)
    codes, scale = tk.quantize_fp8(values)
    return codes, scale, tuple(outs[i] for i in passed), values


def _split(op: str, result):
    """An FP8 op's result as (codes, scale, passed-through outputs): every FP8 norm returns its codes
    and scale first and a residual op its residual stream last."""
    return result[0], result[1], tuple(result[2:])


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FP8_ENTRIES)
def test_equals_our_norm_then_quantize_fp8(tk, name, dtype):
    for case in op_catalog.cases_of(name):
        call = op_catalog.build(name, dtype, case, seed=7)
        x = call.args[0]
        likes = [torch.empty(x.shape, dtype=torch.float8_e4m3fn, device="cuda"),
                 torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device="cuda")]
        passed_likes = [torch.empty(x.shape, dtype=x.dtype, device="cuda")] * len(COMPOSED[call.op][2])
        run = lambda: getattr(tk.ops, call.op).default(*call.args)  # noqa: E731
        result = with_poisoned_outputs(run, *likes, *passed_likes) if x.numel() else run()
        codes, scale, passed = _split(call.op, result)
        want_codes, want_scale, want_passed, values = _composed(tk, call.op, call.args)
        assert codes.dtype == torch.float8_e4m3fn and codes.shape == x.shape and codes.is_contiguous(), case
        assert scale.dtype == torch.float32 and scale.shape == (*x.shape[:-1], 1), case
        assert not scale.isnan().any(), f"{case}: a scale was not written"
        for got, want in zip(passed, want_passed):  # h: the same kernel's pass 1, bit for bit
            assert torch.equal(_as_bits(got), _as_bits(want)), f"{case}: the residual output differs"
        if case not in SPLIT_CASES:
            same = _as_bits(codes) == _as_bits(want_codes)
            assert same.all(), f"{case}: {(~same).sum().item()} codes differ, first at {(~same).nonzero()[0].tolist()}"
            assert torch.equal(scale, want_scale), f"{case}: scales differ"
        # against float64: codes * scale within e4m3's half spacing (2^-4 relative, 2^-10 of the scale
        # for subnormals) of the values, which the norm tests hold to float64
        deq = dequantize_fp8(codes.cpu(), scale.cpu())
        ref = values.double().cpu()
        tol = ref.abs() * 2.0**-4 + scale.cpu().double() * 2.0**-9
        bad = (deq - ref).abs() > tol
        assert not bad.any(), f"{case}: {bad.sum().item()} values off by more than half an e4m3 spacing"


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_edge_rows(tk, dtype):
    """NaN and infinite rows give NaN/inf scales (dequantizing to NaN, as the 16-bit GEMM's row would);
    an all-zero row under RMSNorm and a constant row under LayerNorm (no bias) normalize to zeros:
    the floor's scale and zero codes."""
    x = random_input((6, 256), dtype, scale=3.0, offset=0.0)
    x[0] = 0
    x[1, 5] = float("nan")
    x[2, 7] = float("inf")
    x[3] = 2.5
    w = random_input((256,), dtype)
    for op, args in (("rms_norm_fp8", (x, w, 1e-6, "hf")), ("layer_norm_fp8", (x, None, None, 1e-5))):
        codes, scale = getattr(tk.ops, op).default(*args)
        want_codes, want_scale, _, _ = _composed(tk, op, args)
        assert torch.equal(_as_bits(codes), _as_bits(want_codes)), op
        assert torch.equal(scale.isnan(), want_scale.isnan()), op
        finite = ~scale.isnan()
        assert torch.equal(scale[finite], want_scale[finite]), op
        assert scale[1].isnan(), op
        assert scale[2].isnan() or scale[2].isinf(), op
    codes, scale = tk.rms_norm_fp8(x, w)
    assert scale[0].item() == pytest.approx(AMAX_FLOOR / E4M3_MAX, rel=1e-6) and not codes[0].float().any()
    codes, scale = tk.layer_norm_fp8(x)
    assert scale[3].item() == pytest.approx(AMAX_FLOOR / E4M3_MAX, rel=1e-6) and not codes[3].float().any()


@gpu
def test_rows_of_no_elements_get_the_floor_scale(tk):
    x = torch.empty(3, 0, device="cuda", dtype=torch.bfloat16)
    for op, args in (("rms_norm_fp8", (x,)), ("norm_modulate_fp8", (x, torch.empty(1, 0, device="cuda",
                                                                                    dtype=torch.bfloat16)))):
        codes, scale = getattr(tk, op)(*args)
        assert codes.shape == (3, 0) and scale.shape == (3, 1)
        assert torch.equal(scale.cpu(), torch.full((3, 1), AMAX_FLOOR / E4M3_MAX).float()), op


@gpu
def test_runs_under_compile_like_eager(tk):
    x, y = (random_input((2, 9, 512), torch.bfloat16) for _ in range(2))
    gate, scale, shift = (random_input((2, 1, 512), torch.bfloat16, scale=0.5, offset=0.0) for _ in range(3))

    def block(x, y):
        codes, codes_scale, h = tk.gated_add_norm_modulate_fp8(x, y, gate, scale, shift, norm="layer")
        return h, codes.view(torch.uint8), codes_scale

    eager = block(x, y)
    compiled = torch.compile(block, fullgraph=True)(x, y)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def test_fakes_give_the_shapes_and_dtypes(tk):
    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, device="meta", dtype=dtype)

    x = meta(2, 9, 256)
    for codes, scale in (tk.rms_norm_fp8(x, meta(256)), tk.layer_norm_fp8(x, meta(256), meta(256)),
                         tk.norm_modulate_fp8(x, meta(2, 1, 256), meta(2, 1, 256), norm="layer"),
                         tk.fused_add_rms_norm_fp8(x, meta(2, 9, 256))[:2],
                         tk.gated_add_norm_modulate_fp8(x, meta(2, 9, 256), None, meta(2, 1, 256))[:2]):
        assert codes.shape == x.shape and codes.dtype == torch.float8_e4m3fn and codes.device.type == "meta"
        assert scale.shape == (2, 9, 1) and scale.dtype == torch.float32
    h = tk.fused_add_rms_norm_fp8(x, meta(2, 9, 256))[2]
    assert h.shape == x.shape and h.dtype == x.dtype
    h = tk.gated_add_norm_modulate_fp8(x, meta(2, 9, 256), None, meta(2, 1, 256))[2]
    assert h.shape == x.shape and h.dtype == x.dtype


def test_bad_inputs_are_refused_with_the_argument_named(tk):
    with pytest.raises(ValueError, match="rms_norm_fp8: x must be a CUDA tensor"):
        tk.rms_norm_fp8(torch.randn(3, 4))
    with pytest.raises(ValueError, match="norm_modulate_fp8: scale"):
        tk.norm_modulate_fp8(torch.empty(2, 4, 64, device="meta"), torch.empty(2, 1, 32, device="meta"))
    with pytest.raises(TypeError, match="norm_modulate_fp8: with norm=\"rms\" the weight must have x's dtype"):
        tk.norm_modulate_fp8(torch.empty(2, 4, 64, device="meta", dtype=torch.bfloat16),
                             torch.empty(2, 1, 64, device="meta", dtype=torch.bfloat16),
                             weight=torch.empty(64, device="meta"))


def test_no_gradient_is_dropped_silently(tk):
    x = torch.empty(3, 64, device="meta", requires_grad=True)
    for op, args in (("rms_norm_fp8", (x,)), ("layer_norm_fp8", (x,)),
                     ("fused_add_rms_norm_fp8", (x, torch.empty(3, 64, device="meta")))):
        with pytest.raises(RuntimeError, match=f"{op}.*has no backward"):
            getattr(tk, op)(*args)
        assert not tk.has_backward(op)
    with torch.no_grad():
        assert tk.rms_norm_fp8(x)[0].shape == (3, 64)
