"""rms_norm: accuracy against float64, rounding parity with the replaced modules, layouts,
empty tensors, every bad input, opcheck and torch.compile."""

import pytest
import torch

from reference.norms import RMS_NORM_EAGER, rms_norm_float64

from helpers import DTYPES, UNIT_ROUNDOFF, assert_mismatch_within_budget, assert_within, mismatch_vs_eager, poisoned, random_input

pytestmark = pytest.mark.gpu

ROUNDINGS = ["hf", "diffusers", "torch"]
WEIGHTS = ["none", "same", "fp32"]
# (rows, hidden): hidden 1, odd, a prime past 1K, real model widths, and rows past 64K wide.
SHAPES = [(1, 1), (5, 7), (33, 127), (300, 64), (1000, 128), (9, 769), (16, 3584), (64, 4096),
          (3, 65536), (2, 70001), (1, 262144)]
EPS = 1e-6


def make_weight(kind, hidden, dtype, device="cuda"):
    if kind == "none":
        return None
    wdtype = dtype if kind == "same" else torch.float32
    return (torch.rand(hidden, device=device) * 2 - 0.5).to(wdtype)


def assert_close_to_float64(out, x, weight, rounding):
    ref = rms_norm_float64(x, weight, EPS)
    # Two roundings at most (the normalized value, then the product) in the coarser of the input
    # and output dtypes, plus fp32 arithmetic.
    ulps = 2 * max(UNIT_ROUNDOFF[x.dtype], UNIT_ROUNDOFF[out.dtype]) / UNIT_ROUNDOFF[out.dtype]
    assert_within(out, ref, ref.abs(), ulps, f"rounding={rounding}")


def mid_rounding_dtype(rounding, x, weight):
    """The dtype the normalized value is rounded to before the weight multiply, or None."""
    if rounding == "hf" or (rounding == "diffusers" and (weight is None or weight.dtype == x.dtype)):
        return x.dtype
    return None


def rms_mismatch_vs_eager(ours, eager, mid_dtype):
    """Share of elements that differ from eager; any difference must be within 2 ulp of the
    coarsest dtype that rounds (two roundings can each land on the other side)."""
    coarse = max([d for d in (mid_dtype, ours.dtype) if d is not None], key=lambda d: UNIT_ROUNDOFF[d])
    ulps = 4 * UNIT_ROUNDOFF[coarse] / UNIT_ROUNDOFF[ours.dtype]
    return mismatch_vs_eager(ours, eager, eager.double().abs(), ulps)


@pytest.mark.parametrize("rows,hidden", SHAPES)
@pytest.mark.parametrize("weight_kind", WEIGHTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_matches_float64_and_eager(tk, rows, hidden, weight_kind, dtype, rounding):
    if dtype == torch.float32 and weight_kind == "fp32":
        pytest.skip("same as weight_kind='same' for float32 input")
    x = random_input((rows, hidden), dtype)
    weight = make_weight(weight_kind, hidden, dtype)
    out = poisoned((rows, hidden), tk.norm.rms_norm_out_dtype(x, weight, rounding))
    result = tk.rms_norm(x, weight, EPS, out=out, rounding=rounding)
    assert result is out
    assert not out.isnan().any(), "some outputs were not written"

    assert_close_to_float64(out, x, weight, rounding)
    eager = RMS_NORM_EAGER[rounding](x, weight, EPS)
    assert out.dtype == eager.dtype, f"output dtype {out.dtype} differs from the module's {eager.dtype}"
    mismatch = rms_mismatch_vs_eager(out, eager, mid_rounding_dtype(rounding, x, weight))
    assert_mismatch_within_budget(mismatch, out, floor_elements=0)


def test_allocates_output(tk):
    x = random_input((4, 4096), torch.bfloat16)
    w = make_weight("same", 4096, torch.bfloat16)
    out = tk.rms_norm(x, w, EPS)
    assert out.shape == x.shape and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert_close_to_float64(out, x, w, "hf")


def test_leading_dims_and_eps(tk):
    x = random_input((2, 3, 5, 256), torch.float16)
    w = make_weight("same", 256, torch.float16)
    out = tk.rms_norm(x, w, 1e-2)
    ref = rms_norm_float64(x, w, 1e-2)
    torch.testing.assert_close(out.double(), ref, rtol=2 * 2**-11 + 1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["row_stride_aligned", "row_stride_odd", "transposed", "head_view", "unaligned_ptr"])
def test_strided_inputs_without_copy(tk, dtype, layout):
    hidden = 4096 if layout != "head_view" else 128
    if layout == "row_stride_aligned":
        x = random_input((64, hidden * 2), dtype)[:, :hidden]
    elif layout == "row_stride_odd":
        x = random_input((64, hidden + 3), dtype)[:, 1:hidden + 1]
    elif layout == "transposed":  # [S, B, H] -> [B, S, H]: two leading dims that cannot merge
        x = random_input((16, 3, hidden), dtype).transpose(0, 1)
    elif layout == "head_view":  # transformers' q: proj(x).view(B, S, H, d).transpose(1, 2)
        x = random_input((2, 33, 8, hidden), dtype).transpose(1, 2)
    else:
        x = random_input((64 * hidden + 1,), dtype)[1:].view(64, hidden)
    assert not x.is_contiguous() or layout == "unaligned_ptr"
    w = make_weight("same", hidden, dtype)
    out = tk.rms_norm(x, w, EPS)
    assert out.is_contiguous()
    assert_close_to_float64(out, x, w, "hf")
    mismatch = rms_mismatch_vs_eager(out, RMS_NORM_EAGER["hf"](x, w, EPS), dtype)
    assert_mismatch_within_budget(mismatch, out, floor_elements=0)


@pytest.mark.parametrize("hidden", [4096, 129])
def test_strided_output_writes_only_its_view(tk, hidden):
    x = random_input((32, hidden), torch.bfloat16)
    w = make_weight("same", hidden, torch.bfloat16)
    big = poisoned((32, hidden + 24), torch.bfloat16)
    out = big[:, 8:8 + hidden]
    tk.rms_norm(x, w, EPS, out=out)
    assert not out.isnan().any()
    assert big[:, :8].isnan().all() and big[:, 8 + hidden:].isnan().all(), "wrote outside the output view"
    assert_close_to_float64(out, x, w, "hf")


@pytest.mark.parametrize("shape", [(0, 64), (4, 0), (0,), (2, 0, 8)])
def test_empty(tk, shape):
    x = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(shape[-1], device="cuda", dtype=torch.bfloat16)
    out = tk.rms_norm(x, w, EPS)
    assert out.shape == x.shape


def test_runs_on_the_current_stream(tk):
    """x is written on a side stream after a sleep, then rms_norm is called on that stream: a launch
    on any other stream (the legacy default one, or the device's default) runs at once and reads
    the NaN placeholder instead. Every op, and other devices: tests/reliability/test_reliability_ops.py."""
    values = random_input((256, 1024), torch.bfloat16)
    w = make_weight("same", 1024, torch.bfloat16)
    expected = tk.rms_norm(values, w, EPS)
    x = torch.full_like(values, float("nan"))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~25-50 ms: the input is not ready before then
        x.copy_(values)
        out = tk.rms_norm(x, w, EPS)
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


# ---- bad input: a clear ValueError/TypeError naming the argument, never a crash ----

_BF16 = dict(device="cuda", dtype=torch.bfloat16)
# case -> (overrides of the valid arguments, built lazily, expected exception, message)
BAD = {
    "x_int": (lambda: dict(x=torch.ones(4, 64, device="cuda", dtype=torch.int32)), TypeError, "x must be float32"),
    "x_0d": (lambda: dict(x=torch.randn((), **_BF16)), ValueError, "x must have at least one dimension"),
    "x_last_dim_strided": (lambda: dict(x=torch.randn(64, 4, **_BF16).t()), ValueError,
                           "x must be contiguous in its last"),
    "x_too_many_dims": (lambda: dict(x=torch.randn(2, 3, 2, 3, 2, 3, 64, **_BF16).permute(0, 2, 4, 1, 3, 5, 6)),
                        ValueError, "leading dimensions"),
    "weight_size": (lambda: dict(weight=torch.randn(63, **_BF16)), ValueError, "weight must be 1-D with"),
    "weight_2d": (lambda: dict(weight=torch.randn(1, 64, **_BF16)), ValueError, "weight must be 1-D"),
    "weight_dtype": (lambda: dict(weight=torch.randn(64, device="cuda", dtype=torch.float16)), TypeError,
                     "weight must have the dtype of x"),
    "weight_cpu": (lambda: dict(weight=torch.randn(64, dtype=torch.bfloat16)), ValueError,
                   r"weight must be on the same device as x \(cuda:0\), got cpu"),
    "weight_strided": (lambda: dict(weight=torch.randn(128, **_BF16)[::2]), ValueError, "weight must be contiguous"),
    "out_shape": (lambda: dict(out=torch.empty(4, 65, **_BF16)), ValueError, r"out must have the shape \[4, 64\]"),
    "out_dtype": (lambda: dict(out=torch.empty(4, 64, device="cuda", dtype=torch.float32)), TypeError,
                  "out must have dtype"),
    "out_cpu": (lambda: dict(out=torch.empty(4, 64, dtype=torch.bfloat16)), ValueError,
                r"out must be on the same device as x \(cuda:0\), got cpu"),
    "out_expanded": (lambda: dict(out=torch.empty(1, 64, **_BF16).expand(4, 64)), ValueError,
                     "out must not have overlapping"),
    "eps_negative": (lambda: dict(eps=-1e-6), ValueError, "eps must be a finite number"),
    "eps_nan": (lambda: dict(eps=float("nan")), ValueError, "eps must be a finite number"),
    "rounding": (lambda: dict(rounding="llama"), ValueError, "rounding must be"),
    # 2^31 elements in a row (4 GB): the kernels index within a row in 32 bits
    "x_row_too_long": (lambda: dict(x=torch.empty(1, 2**31, **_BF16), weight=None), ValueError,
                       "last dimension must be at most 2147483647"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_clear_error(tk, case):
    make, exc, message = BAD[case]
    args = dict(x=torch.randn(4, 64, device="cuda", dtype=torch.bfloat16),
                weight=torch.randn(64, device="cuda", dtype=torch.bfloat16), eps=EPS, out=None, rounding="hf")
    args.update(make())
    with pytest.raises(exc, match=message):
        tk.rms_norm(args["x"], args["weight"], args["eps"], out=args["out"], rounding=args["rounding"])
    torch.cuda.synchronize()  # no deferred CUDA error either


def test_out_aliasing_inputs_raises(tk):
    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out must not share memory with x"):  # in place
        tk.ops.rms_norm_out(x, x, w, EPS, "hf")
    with pytest.raises(ValueError, match="out must not share memory with x"):  # shifted by one element
        tk.ops.rms_norm_out(x.view(-1)[1:65].view(1, 64), x[:1], w, EPS, "hf")
    holder = torch.randn(1, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out must not share memory with weight"):
        tk.ops.rms_norm_out(holder, x[:1], holder[0], EPS, "hf")


def test_opcheck(tk):
    for rounding in ROUNDINGS:
        x = random_input((8, 256), torch.bfloat16)
        w = make_weight("fp32", 256, torch.bfloat16)
        out = torch.empty(x.shape, device="cuda", dtype=tk.norm.rms_norm_out_dtype(x, w, rounding))
        torch.library.opcheck(tk.ops.rms_norm_out.default, (out, x, w, EPS, rounding))
        torch.library.opcheck(tk.ops.rms_norm.default, (x, w, EPS, rounding))
    x32 = random_input((3, 7), torch.float32)
    torch.library.opcheck(tk.ops.rms_norm_out.default, (torch.empty(3, 7, device="cuda"), x32, None, EPS, "hf"))
    torch.library.opcheck(tk.ops.rms_norm.default, (x32, None, EPS, "torch"))


def test_torch_compile_fullgraph(tk):
    torch._dynamo.reset()

    def block(x, w):
        return tk.rms_norm(x * 2, w, EPS) + 1

    x = random_input((64, 2048), torch.bfloat16)
    w = make_weight("same", 2048, torch.bfloat16)
    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), block(x, w), rtol=0, atol=0)
    x2 = random_input((17, 2048), torch.bfloat16)  # a new shape recompiles or runs dynamic, no break
    torch.testing.assert_close(compiled(x2, w), block(x2, w), rtol=0, atol=0)
