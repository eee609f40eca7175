"""linear_fp8: the FP8 (e4m3) linear layer through cuBLASLt, on quantize_fp8's codes and scales.

The reference is float64 on the dequantized operands (codes x scales, exactly representable), so the
only errors are the GEMM's fp32 accumulation and the one rounding to the output dtype: each output
must lie within a few output roundings plus an fp32-accumulation bound of K x 2^-23 x sum|x w|. GPU
tests are marked; the fake, the refusals and the CPU rejection run anywhere."""

import pytest
import torch
import torch.nn.functional as F

from conftest import FULL_CHECKOUT
from helpers import UNIT_ROUNDOFF

if not FULL_CHECKOUT:
    pytest.skip("reference/ is not in this source set", allow_module_level=True)

from reference.fp8 import quantize_fp8_rowwise  # noqa: E402

gpu = pytest.mark.gpu

# (leading shape of x, in_features, out_features): LTX-Video 2B's FFN projections and attention
# projections (fewer tokens), Llama-3.1-8B's q/k/v, a decode row and small multiples of 16.
SHAPES = [((2, 77), 2048, 8192), ((256,), 8192, 2048), ((64,), 2048, 2048), ((1,), 4096, 6144), ((3, 5), 32, 16)]


def operands(lead, k, n, out_dtype, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, xs = quantize_fp8_rowwise(torch.randn(*lead, k, generator=g))
    w, ws = quantize_fp8_rowwise(torch.randn(n, k, generator=g) / k ** 0.5)
    b = (torch.randn(n, generator=g) * 0.5).to(out_dtype) if bias else None
    return x, xs, w, ws.squeeze(-1), b


def reference64(x, xs, w, ws, b, activation):
    out = F.linear(x.double() * xs.double(), w.double() * ws.double().unsqueeze(-1), None if b is None else b.double())
    return F.gelu(out, approximate="tanh") if activation == "gelu_tanh" else out


def bound(x, xs, w, ws, out_dtype, ref):
    """A few output roundings of the result, plus fp32 accumulation over K products."""
    k = x.shape[-1]
    magnitude = F.linear((x.double() * xs.double()).abs(), (w.double() * ws.double().unsqueeze(-1)).abs())
    return 2 * UNIT_ROUNDOFF[out_dtype] * ref.abs() + k * 2.0**-23 * magnitude + torch.finfo(out_dtype).tiny


@gpu
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lead,k,n", SHAPES)
@pytest.mark.parametrize("bias,activation", [(True, "gelu_tanh"), (False, "none"), (True, "none")])
def test_matches_float64_on_the_dequantized_operands(tk, out_dtype, lead, k, n, bias, activation):
    x, xs, w, ws, b = operands(lead, k, n, out_dtype, bias)
    out = tk.linear_fp8(x.cuda(), xs.cuda(), w.cuda(), ws.cuda(), None if b is None else b.cuda(), out_dtype, activation)
    assert out.dtype == out_dtype and out.shape == (*lead, n)
    ref = reference64(x, xs, w, ws, b, activation)
    err = (out.cpu().double() - ref).abs()
    allowed = bound(x, xs, w, ws, out_dtype, ref)
    assert bool((err <= allowed).all()), f"max excess {(err - allowed).max().item():.3g}"


@gpu
def test_quantized_with_our_kernel_end_to_end_is_close_to_bf16(tk):
    """quantize_fp8 on the GPU, then linear_fp8: the FP8 layer's relative error against the bf16
    layer is the e4m3 rounding's (a few percent at most), not a wrong scale or layout."""
    torch.manual_seed(0)
    x = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(8192, 2048, device="cuda") / 2048 ** 0.5).to(torch.bfloat16)
    out = tk.linear_fp8(*tk.quantize_fp8(x), *tk.quantize_fp8(w), None, torch.bfloat16, "none")
    ref = F.linear(x.double(), w.double())
    rel = (out.double() - ref).norm() / ref.norm()
    assert rel < 0.05, rel


@gpu
def test_empty_and_zero_width(tk):
    x, xs, w, ws, _ = operands((0,), 64, 32, torch.bfloat16, False)
    assert tk.linear_fp8(x.cuda(), xs.cuda(), w.cuda(), ws.cuda(), None).shape == (0, 32)
    x, xs, w, ws, _ = operands((3,), 0, 32, torch.bfloat16, False)
    out = tk.linear_fp8(x.cuda(), xs.cuda(), w.cuda(), ws.cuda(), None)
    assert out.shape == (3, 32) and bool((out == 0).all())


def test_fake_gives_the_shape_and_dtype(tk):
    meta = dict(device="meta")
    out = tk.linear_fp8(torch.empty(2, 9, 64, dtype=torch.float8_e4m3fn, **meta),
                        torch.empty(2, 9, 1, dtype=torch.float32, **meta),
                        torch.empty(32, 64, dtype=torch.float8_e4m3fn, **meta),
                        torch.empty(32, dtype=torch.float32, **meta), None, torch.float16, "gelu_tanh")
    assert out.shape == (2, 9, 32) and out.dtype == torch.float16 and out.device.type == "meta"


def test_bad_inputs_are_refused_with_the_argument_named(tk):
    meta = dict(device="meta")
    x = torch.empty(4, 64, dtype=torch.float8_e4m3fn, **meta)
    xs = torch.empty(4, 1, dtype=torch.float32, **meta)
    w = torch.empty(32, 64, dtype=torch.float8_e4m3fn, **meta)
    ws = torch.empty(32, dtype=torch.float32, **meta)
    with pytest.raises(ValueError, match="linear_fp8: activation must be"):
        tk.linear_fp8(x, xs, w, ws, None, torch.bfloat16, "silu")
    with pytest.raises(ValueError, match="linear_fp8: out_features .* must be a multiple of 16"):
        tk.linear_fp8(x, xs, torch.empty(40, 64, dtype=torch.float8_e4m3fn, **meta),
                      torch.empty(40, dtype=torch.float32, **meta))
    with pytest.raises(TypeError, match="linear_fp8: bias must have dtype"):
        tk.linear_fp8(x, xs, w, ws, torch.empty(32, dtype=torch.float16, **meta), torch.bfloat16)
    with pytest.raises(ValueError, match="linear_fp8: weight_scale must be"):
        tk.linear_fp8(x, xs, w, torch.empty(31, dtype=torch.float32, **meta))
    with pytest.raises(ValueError, match="linear_fp8: x must be a CUDA tensor"):
        tk.linear_fp8(torch.zeros(4, 64).to(torch.float8_e4m3fn), torch.ones(4, 1),
                      torch.zeros(32, 64).to(torch.float8_e4m3fn), torch.ones(32))
    with pytest.raises(ValueError, match="linear_fp8: in_features 0 with a bias is not supported"):
        tk.linear_fp8(torch.empty(4, 0, dtype=torch.float8_e4m3fn, **meta), xs,
                      torch.empty(32, 0, dtype=torch.float8_e4m3fn, **meta), ws,
                      torch.empty(32, dtype=torch.bfloat16, **meta), torch.bfloat16)
    assert not tk.has_backward("linear_fp8")
