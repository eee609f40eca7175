"""decode_linear: the linear layer of decode steps (at most 8 rows), against float64 on the same
operands (the e4m3 weight dequantized) within fp32-accumulation bounds plus the output's rounding,
at Llama-3.1-8B's projection shapes and odd ones, every row count, every dtype, bias or none, bf16
and weight-only FP8 weights, strided rows, poisoned outputs; the refusals. GPU tests are marked; the
fakes and the refusals run anywhere."""

import pytest
import torch

from conftest import FULL_CHECKOUT
from helpers import DTYPES, random_input, with_poisoned_outputs

if not FULL_CHECKOUT:
    pytest.skip("reference/ is not in this source set", allow_module_level=True)

from reference.fp8 import quantize_fp8_rowwise  # noqa: E402

gpu = pytest.mark.gpu
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}

# (out_features, in_features): Llama-3.1-8B's q/k/v merged, o, gate/up merged, down; odd widths
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (77, 64), (1000, 1024), (16, 16)]


def check(out, x, weight, scale, bias):
    """|out - ref| <= the fp32 accumulation bound (K roundings of |x| . |w| per output) plus half an
    ulp of the output's dtype, ref in float64 on the dequantized operands."""
    w = weight.double() if scale is None else weight.double() * scale.double().reshape(-1, 1)
    ref = x.double() @ w.T + (0 if bias is None else bias.double())
    mag = x.double().abs() @ w.abs().T + (0 if bias is None else bias.double().abs())
    k = x.shape[-1]
    tol = mag * (k + 2) * 2.0**-24 + ref.abs() * UNIT_ROUNDOFF[x.dtype] + 1e-30
    err = (out.double() - ref).abs()
    bad = ~(err <= tol)
    assert not bad.any(), (f"{bad.sum().item()} of {out.numel()} outputs off (worst {(err / tol).max().item():.2f}x "
                           "the bound)")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("fp8", [False, True], ids=["same_dtype", "fp8_weight"])
def test_matches_float64(tk, dtype, n, k, fp8):
    torch.manual_seed(n + k)
    weight = random_input((n, k), dtype, scale=0.02, offset=0.0)
    scale = None
    if fp8:
        codes, scale = quantize_fp8_rowwise(weight)
        weight, scale = codes, scale.squeeze(-1)
    bias = random_input((n,), dtype, scale=0.5, offset=0.0)
    for rows in (1, 2, 3, 4, 5, 8):
        x = random_input((rows, 1, k), dtype, scale=1.0, offset=0.0)
        for b in (bias, None):
            out = with_poisoned_outputs(lambda: (tk.decode_linear(x, weight, scale, b),),
                                        torch.empty(rows, 1, n, dtype=dtype, device="cuda"))[0]
            assert out.shape == (rows, 1, n) and out.dtype == dtype
            check(out, x, weight, scale, b)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_rows_and_empty(tk, dtype):
    weight = random_input((48, 256), dtype, scale=0.05, offset=0.0)
    padded = random_input((3, 256 + 8), dtype, scale=1.0, offset=0.0)
    x = padded[:, :256]  # rows one stride apart, padded
    check(tk.decode_linear(x, weight), x, weight, None, None)
    assert tk.decode_linear(x[:0], weight).shape == (0, 48)
    assert tk.decode_linear(x, weight[:0]).shape == (3, 0)
    bias = random_input((48,), dtype)
    no_k = torch.empty(2, 0, device="cuda", dtype=dtype)  # no products: the bias (zeros without one)
    assert torch.equal(tk.decode_linear(no_k, torch.empty(48, 0, device="cuda", dtype=dtype), bias=bias),
                       bias.expand(2, 48))
    assert not tk.decode_linear(no_k, torch.empty(48, 0, device="cuda", dtype=dtype)).any()


@gpu
def test_is_deterministic_and_runs_under_compile(tk):
    x = random_input((4, 4096), torch.bfloat16, scale=1.0, offset=0.0)
    weight = random_input((4096, 4096), torch.bfloat16, scale=0.02, offset=0.0)
    first = tk.decode_linear(x, weight)
    assert torch.equal(first, tk.decode_linear(x, weight))
    assert torch.equal(first, torch.compile(tk.decode_linear, fullgraph=True)(x, weight))


@gpu
def test_misaligned_views_are_refused(tk):
    flat = random_input((4 * 64 + 1,), torch.bfloat16)
    x = flat[1:].view(4, 64)  # one element past a 16-byte boundary
    with pytest.raises(ValueError, match="decode_linear: x and weight must start on a 16-byte boundary"):
        tk.decode_linear(x, random_input((32, 64), torch.bfloat16))


def test_fake_gives_the_shape(tk):
    x = torch.empty(2, 1, 4096, device="meta", dtype=torch.bfloat16)
    out = tk.decode_linear(x, torch.empty(6144, 4096, device="meta", dtype=torch.float8_e4m3fn),
                           weight_scale=torch.empty(6144, device="meta"))
    assert out.shape == (2, 1, 6144) and out.dtype == torch.bfloat16 and out.device.type == "meta"


def test_bad_inputs_are_refused_with_the_argument_named(tk):
    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, device="meta", dtype=dtype)

    with pytest.raises(ValueError, match="decode_linear: x must be a CUDA tensor"):
        tk.decode_linear(torch.randn(2, 64), torch.randn(8, 64))
    with pytest.raises(ValueError, match="decode_linear: x must have at most 8 rows"):
        tk.decode_linear(meta(3, 3, 64), meta(8, 64))
    with pytest.raises(ValueError, match="decode_linear: weight must be a contiguous"):
        tk.decode_linear(meta(2, 64), meta(64, 8).t())
    with pytest.raises(ValueError, match="decode_linear: weight_scale is only for a float8_e4m3fn weight"):
        tk.decode_linear(meta(2, 64), meta(8, 64), weight_scale=meta(8, dtype=torch.float32))
    with pytest.raises(ValueError, match="decode_linear: in_features .* must be a multiple of 16"):
        tk.decode_linear(meta(2, 24), meta(8, 24, dtype=torch.float8_e4m3fn), weight_scale=meta(8, dtype=torch.float32))
    with pytest.raises(TypeError, match="decode_linear: bias must have dtype"):
        tk.decode_linear(meta(2, 64), meta(8, 64), bias=meta(8, dtype=torch.float32))
    with pytest.raises(ValueError, match="decode_linear: x's rows must be one stride apart"):
        tk.decode_linear(meta(2, 3, 64).transpose(0, 1)[:2], meta(8, 64))


def test_no_gradient_is_dropped_silently(tk):
    x = torch.empty(2, 64, device="meta", requires_grad=True)
    with pytest.raises(RuntimeError, match="decode_linear.*has no backward"):
        tk.decode_linear(x, torch.empty(8, 64, device="meta"))
    assert not tk.has_backward("decode_linear")
