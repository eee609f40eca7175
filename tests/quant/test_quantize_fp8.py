"""quantize_fp8: per-row dynamic e4m3 quantization, bit for bit against reference/fp8.py (the same
fp32 divisions, nearest-even e4m3 rounding with saturation), on every dtype and access path, with
non-finite, all-zero, tiny and huge rows. GPU tests are marked; the fakes, the refusals and the CPU
rejection run anywhere."""

import pytest
import torch

from conftest import FULL_CHECKOUT
from helpers import DTYPES, random_input

if not FULL_CHECKOUT:
    pytest.skip("reference/ is not in this source set", allow_module_level=True)

from reference.fp8 import AMAX_FLOOR, E4M3_MAX, quantize_fp8_rowwise  # noqa: E402

gpu = pytest.mark.gpu

# leading shape, row width: decode rows, the LTX/Flux projections' inputs, odd and wide rows
SHAPES = [((1,), 2048), ((2, 77), 1536), ((3, 11), 3072), ((5,), 127), ((2, 3), 8), ((1, 2), 3 * 8192 + 8), ((4,), 1)]


def layout(x: torch.Tensor, how: str) -> torch.Tensor:
    """x's values in another layout: one element past a 16-byte boundary, or padded rows with the
    two leading dimensions swapped in memory."""
    if how == "contiguous":
        return x
    if how == "offset":
        flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
        view = flat[1:].view(x.shape)
        view.copy_(x)
        return view
    padded = torch.empty(x.shape[1], x.shape[0], *x.shape[2:-1], x.shape[-1] + 8, dtype=x.dtype, device=x.device)
    view = padded.transpose(0, 1)[..., : x.shape[-1]]
    view.copy_(x)
    return view


def assert_bits(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor):
    want_codes, want_scale = quantize_fp8_rowwise(x.cpu())
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == x.shape and codes.is_contiguous()
    assert scale.dtype == torch.float32 and scale.shape == (*x.shape[:-1], 1)
    got_codes, got_scale = codes.cpu().view(torch.uint8), scale.cpu()
    bad = (got_codes != want_codes.view(torch.uint8)).nonzero()
    assert len(bad) == 0, f"{len(bad)} codes differ, first at {bad[0].tolist()}"
    same = (got_scale == want_scale) | (got_scale.isnan() & want_scale.isnan())
    assert same.all(), f"scales differ: {got_scale[~same][:4].tolist()} vs {want_scale[~same][:4].tolist()}"


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,k", SHAPES)
@pytest.mark.parametrize("how", ["contiguous", "offset", "strided"])
def test_matches_the_reference_bit_for_bit(tk, dtype, lead, k, how):
    if how == "strided" and len(lead) < 2:
        pytest.skip("the strided layout swaps two leading dimensions")
    torch.manual_seed(k)
    # rows of very different magnitudes: each row's scale is its own
    x = random_input((*lead, k), dtype, scale=3.0, offset=0.0) * torch.logspace(-2, 2, lead[-1], device="cuda").to(
        dtype).unsqueeze(-1)
    x = layout(x, how)
    codes, scale = tk.quantize_fp8(x)
    assert_bits(x, codes, scale)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_edge_rows(tk, dtype):
    k = 64
    x = random_input((8, k), dtype, scale=3.0, offset=0.0)
    x[0] = 0  # all zero: the floor's scale, zero codes
    x[1, 5] = float("nan")  # NaN scale and codes
    x[2, 7] = float("inf")  # infinite scale: NaN where x is infinite, zero elsewhere
    x[3, 9] = -float("inf")
    x[4] = x[4] * 1e-30 if dtype == torch.float32 else x[4]  # amax below the floor (fp32)
    x[5] = torch.finfo(dtype).max / 2  # the largest magnitudes
    x[6, 3] = -x[6].abs().max() * 4  # one dominant value: it lands on -448
    codes, scale = tk.quantize_fp8(x)
    assert_bits(x, codes, scale)
    assert scale[0].item() == pytest.approx(AMAX_FLOOR / E4M3_MAX, rel=1e-6)
    assert scale[1].isnan() and scale[2].isinf() and scale[3].isinf()
    assert codes[6, 3].float().item() == -E4M3_MAX


@gpu
def test_empty_inputs(tk):
    codes, scale = tk.quantize_fp8(torch.empty(2, 0, 64, device="cuda", dtype=torch.bfloat16))
    assert codes.shape == (2, 0, 64) and scale.shape == (2, 0, 1)
    # rows of no elements: each still gets a scale (the floor's), nothing else to write
    codes, scale = tk.quantize_fp8(torch.empty(3, 0, device="cuda", dtype=torch.float16))
    assert codes.shape == (3, 0) and scale.shape == (3, 1)
    assert torch.equal(scale.cpu(), torch.full((3, 1), AMAX_FLOOR / E4M3_MAX).float())


@gpu
def test_runs_under_compile_like_eager(tk):
    x = random_input((4, 9, 256), torch.bfloat16, scale=3.0, offset=0.0)
    eager_codes, eager_scale = tk.quantize_fp8(x)
    codes, scale = torch.compile(tk.quantize_fp8, fullgraph=True)(x)
    assert torch.equal(codes.view(torch.uint8), eager_codes.view(torch.uint8)) and torch.equal(scale, eager_scale)


def test_fake_gives_the_shapes_and_dtypes(tk):
    x = torch.empty(2, 9, 256, device="meta", dtype=torch.bfloat16)
    codes, scale = tk.quantize_fp8(x)
    assert codes.shape == x.shape and codes.dtype == torch.float8_e4m3fn and codes.device.type == "meta"
    assert scale.shape == (2, 9, 1) and scale.dtype == torch.float32


def test_bad_inputs_are_refused_with_the_argument_named(tk):
    with pytest.raises(ValueError, match="quantize_fp8: x must be a CUDA tensor"):
        tk.quantize_fp8(torch.randn(3, 4))
    with pytest.raises(TypeError, match="quantize_fp8: x must be float32, float16 or bfloat16"):
        tk.quantize_fp8(torch.empty(3, 4, device="meta", dtype=torch.float64))
    with pytest.raises(ValueError, match="quantize_fp8: x must have at least one dimension"):
        tk.quantize_fp8(torch.empty((), device="meta"))
    with pytest.raises(ValueError, match="quantize_fp8: x"):
        tk.quantize_fp8(torch.empty(64, 4, device="meta").t())


def test_no_gradient_is_dropped_silently(tk):
    x = torch.empty(3, 64, device="meta", requires_grad=True)
    with pytest.raises(RuntimeError, match="quantize_fp8.*has no backward"):
        tk.quantize_fp8(x)
    with torch.no_grad():
        assert tk.quantize_fp8(x)[0].shape == (3, 64)
    assert not tk.has_backward("quantize_fp8")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("rows,hidden", [(1, 14336), (37, 1024), (5, 127), (64, 8)])
def test_act_mul_fp8_is_quantize_of_act_mul_bit_for_bit(tk, dtype, act, rows, hidden):
    """The fused producer equals the composition it replaces, our act_mul then our quantize_fp8, on
    gate and up given as views of one merged projection's output (strided rows) and as separate
    tensors; every code and scale compared."""
    torch.manual_seed(rows * hidden)
    merged = random_input((rows, 2 * hidden), dtype, scale=3.0, offset=0.0)
    for gate, up in ((merged[:, :hidden], merged[:, hidden:]),
                     (merged[:, :hidden].contiguous(), merged[:, hidden:].contiguous())):
        codes, scale = tk.act_mul_fp8(gate, up, act)
        want_codes, want_scale = tk.quantize_fp8(tk.act_mul(gate, up, act))
        assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8))
        assert torch.equal(scale, want_scale)
