"""linear_gelu: gelu_tanh(x @ W^T + b) through cuBLASLt's GELU-bias epilogue.

The epilogue (float16/bfloat16) rounds once where eager (F.linear, then F.gelu) rounds twice, so the
output is not eager's bits: each case measures eager's own error against a float64 reference on the
same inputs and requires ours to be no worse than a small multiple of it. The separate path
(F.linear + our gelu_tanh kernel, taken for float32 and where cuBLASLt has no epilogue algorithm)
must match eager to an ulp. GPU tests are marked; the fake impls and the CPU rejection run anywhere."""

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import DTYPES, assert_all_written, assert_matches_eager, assert_rejects, random_input, with_poisoned_outputs

gpu = pytest.mark.gpu
EPILOGUE_DTYPES = [torch.float16, torch.bfloat16]  # float32 takes the separate path

# (leading shape of x, in_features, out_features): the FFN input projections (LTX-Video 2048 ->
# 8192, SD3 1536 -> 6144, Flux 3072 -> 12288, here with fewer tokens), decode-sized rows, and odd
# sizes whose rows are not 16-byte aligned.
SHAPES = [
    ((256,), 2048, 8192),
    ((2, 77), 1536, 6144),
    ((33,), 3072, 1024),
    ((1,), 4096, 256),
    ((7,), 64, 264),
    ((5,), 33, 7),
    ((3, 4), 130, 66),
]
# Ours may be this many times eager's error against float64 (max and mean over the output): the
# GEMMs accumulate in another order, so neither is always the closer; what the epilogue removes,
# the rounding of the pre-activation, only makes ours closer.
MAX_ERROR_RATIO, MEAN_ERROR_RATIO = 2.0, 1.25


def make_inputs(lead, k, n, dtype, bias=True, seed=0):
    torch.manual_seed(seed)
    x = random_input((*lead, k), dtype, scale=1.0, offset=0.1)
    # nn.Linear's init scale (U(-1/sqrt(k), 1/sqrt(k))): pre-activations of order one, where GELU bends
    weight = ((torch.rand(n, k, device="cuda") * 2 - 1) / math.sqrt(max(k, 1))).to(dtype)
    b = ((torch.rand(n, device="cuda") * 2 - 1) * 0.5).to(dtype) if bias else None
    return x, weight, b


def reference64(x, weight, bias):
    return F.gelu(F.linear(x.double(), weight.double(), None if bias is None else bias.double()), approximate="tanh")


def eager(x, weight, bias):
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def assert_no_worse_than_eager(ours, x, weight, bias, what):
    ref = reference64(x, weight, bias)
    ours_err = (ours.double() - ref).abs()
    eager_err = (eager(x, weight, bias).double() - ref).abs()
    floor = torch.finfo(ours.dtype).tiny  # exact results on both sides (tiny cases) compare equal
    assert ours_err.max() <= MAX_ERROR_RATIO * eager_err.max() + floor, (
        f"{what}: max error {ours_err.max():.3g} vs eager's {eager_err.max():.3g}")
    assert ours_err.mean() <= MEAN_ERROR_RATIO * eager_err.mean() + floor, (
        f"{what}: mean error {ours_err.mean():.3g} vs eager's {eager_err.mean():.3g}")


def epilogue_expected(dtype, rows, k, n):
    """Where cuBLASLt must have a GELU-epilogue algorithm: half precision with 16-byte rows and
    enough of them for a GEMM (bf16 from sm_80, the first arch with bf16 tensor cores)."""
    aligned = (k * 2) % 16 == 0 and (n * 2) % 16 == 0 and rows >= 16
    if dtype == torch.float16:
        return aligned
    return dtype == torch.bfloat16 and aligned and torch.cuda.get_device_capability() >= (8, 0)


def assert_separate_path_matches_eager(out, x, weight, bias):
    """F.linear's bits, then our gelu_tanh: eager's result to an ulp of the GELU's terms."""
    pre = F.linear(x, weight, bias)
    magnitude = F.gelu(pre.double(), approximate="tanh").abs() + 0.5 * pre.double().abs() + 1e-3
    assert_matches_eager(out, eager(x, weight, bias), magnitude, 2)


@gpu
@pytest.mark.parametrize("dtype", EPILOGUE_DTYPES, ids=str)
@pytest.mark.parametrize("lead,k,n", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_accuracy_against_float64_no_worse_than_eager(tk, dtype, lead, k, n, bias):
    x, weight, b = make_inputs(lead, k, n, dtype, bias)
    out = torch.full((*lead, n), float("nan"), dtype=dtype, device="cuda")
    assert tk.linear_gelu(x, weight, b, out=out) is out
    assert_all_written(out)
    assert_no_worse_than_eager(out, x, weight, b, f"{dtype} {lead}x{k}->{n}")
    functional = with_poisoned_outputs(lambda: [tk.linear_gelu(x, weight, b)], out)[0]
    assert_all_written(functional)
    assert torch.equal(functional, out), "the functional and out= forms differ"
    if epilogue_expected(dtype, math.prod(lead), k, n):
        assert tk.linear_gelu_fused(x, weight, b), "cuBLASLt took no GELU epilogue for an aligned half-precision case"


@gpu
@pytest.mark.parametrize("tf32", [False, True], ids=["ieee", "tf32"])
@pytest.mark.parametrize("lead,k,n", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_float32_takes_the_separate_path(tk, monkeypatch, lead, k, n, bias, tf32):
    """float32 never takes the epilogue (its GELU is less accurate than eager's in fp32): F.linear,
    with or without TF32 as torch.backends.cuda.matmul.allow_tf32 says, then our gelu_tanh kernel,
    eager's result to an ulp."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    x, weight, b = make_inputs(lead, k, n, torch.float32, bias)
    assert not tk.linear_gelu_fused(x, weight, b)
    out = with_poisoned_outputs(lambda: [tk.linear_gelu(x, weight, b)], torch.empty(*lead, n, device="cuda"))[0]
    assert_all_written(out)
    assert_separate_path_matches_eager(out, x, weight, b)


@gpu
@pytest.mark.parametrize("dtype", EPILOGUE_DTYPES, ids=str)
def test_epilogue_rounds_once(tk, dtype):
    """Where the epilogue runs, the result is the rounding of the fp32 value: closer to float64 than
    eager on average (eager rounds the pre-activation first)."""
    x, weight, b = make_inputs((512,), 1024, 4096, dtype)
    if not tk.linear_gelu_fused(x, weight, b):
        pytest.skip("cuBLASLt has no GELU epilogue for this dtype on this GPU")
    ref = reference64(x, weight, b)
    ours = (tk.linear_gelu(x, weight, b).double() - ref).abs().mean()
    theirs = (eager(x, weight, b).double() - ref).abs().mean()
    assert ours < theirs, f"mean error {ours:.3g} not below eager's {theirs:.3g}"


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_separate_path_for_views_the_epilogue_cannot_take(tk, dtype):
    """x whose leading dimensions do not merge into one stride, and a transposed weight: the op
    takes F.linear + our gelu_tanh kernel (no copy of x), which rounds as eager does."""
    base = random_input((9, 2, 96), dtype, scale=1.0, offset=0.1)
    x = base.transpose(0, 1)  # [2, 9, 96], rows not one stride apart
    _, w, b = make_inputs((1,), 96, 48, dtype)
    wt = w.t().contiguous().t()  # [48, 96] with stride (1, 48)
    for weight in (w, wt):
        assert not tk.linear_gelu_fused(x, weight, b)
        assert_separate_path_matches_eager(tk.linear_gelu(x, weight, b), x, weight, b)


@gpu
def test_strided_rows_and_outputs_take_the_epilogue(tk):
    """Rows a stride apart (a slice of a wider buffer) and an out= view of a wider buffer."""
    x_wide = random_input((64, 2048 + 64), torch.bfloat16, scale=1.0, offset=0.1)
    x = x_wide[:, :2048]
    _, w, b = make_inputs((1,), 2048, 1024, torch.bfloat16)
    out_wide = torch.full((64, 1024 + 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = out_wide[:, 128:]
    tk.linear_gelu(x, w, b, out=out)
    assert_all_written(out)
    assert out_wide[:, :128].isnan().all(), "wrote outside out"
    assert torch.equal(out, tk.linear_gelu(x.contiguous(), w, b))
    if torch.cuda.get_device_capability() >= (8, 0):
        assert tk.linear_gelu_fused(x, w, b)


@gpu
@pytest.mark.parametrize("lead,k,n", [((0,), 64, 32), ((4,), 0, 32), ((4,), 64, 0), ((2, 0), 64, 32)])
def test_empty(tk, lead, k, n):
    x, w, b = make_inputs(lead, k, n, torch.bfloat16)
    out = tk.linear_gelu(x, w, b)
    assert out.shape == (*lead, n)
    torch.testing.assert_close(out, eager(x, w, b))  # K = 0: gelu(bias) in every row


def _bf(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


BAD = {
    "cpu_input": (lambda t: t.linear_gelu(torch.randn(4, 8), torch.randn(16, 8)), ValueError,
                  "linear_gelu: x must be a CUDA tensor"),
    "int_input": (lambda t: t.linear_gelu(torch.ones(4, 8, device="cuda", dtype=torch.int32), _bf(16, 8)), TypeError,
                  "x must be float32, float16 or bfloat16"),
    "weight_dtype": (lambda t: t.linear_gelu(_bf(4, 8), _bf(16, 8).float()), TypeError,
                     r"weight must have dtype BFloat16 \(the dtype of x\)"),
    "weight_shape": (lambda t: t.linear_gelu(_bf(4, 8), _bf(16, 9)), ValueError,
                     r"weight must be \[out_features, in_features\] with in_features = x.shape\[-1\] = 8"),
    "bias_shape": (lambda t: t.linear_gelu(_bf(4, 8), _bf(16, 8), _bf(15)), ValueError, r"bias must be \[out_features\]"),
    "bias_dtype": (lambda t: t.linear_gelu(_bf(4, 8), _bf(16, 8), _bf(16).half()), TypeError, "bias must have dtype"),
    "out_shape": (lambda t: t.linear_gelu(_bf(4, 8), _bf(16, 8), out=_bf(4, 8)), ValueError,
                  r"out must have the shape \[4, 16\]"),
    "out_aliases_input": (lambda t: (lambda x: t.linear_gelu(x, _bf(8, 8), out=x))(_bf(4, 8)), ValueError,
                          "out must not share memory with x"),
    "zero_dim": (lambda t: t.linear_gelu(_bf(()), _bf(16, 1)), ValueError, "x must have at least one dimension"),
}


@gpu
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_clear_error(tk, case):
    call, exc, message = BAD[case]
    assert_rejects(lambda: call(tk), exc, message)


@gpu
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_gradients_match_eager_autograd(tk, bias):
    """The backward recomputes the pre-activation in the model dtype, as eager keeps it: the
    gradients equal eager autograd's up to the GEMMs' summation order."""
    x, w, b = make_inputs((3, 5), 96, 80, torch.float32, bias)
    leaves = [t.clone().requires_grad_() for t in (x, w) + ((b,) if bias else ())]
    grad = torch.randn(3, 5, 80, device="cuda")
    ours = torch.autograd.grad(tk.linear_gelu(*leaves, *(() if bias else (None,))), leaves, grad)
    theirs = torch.autograd.grad(eager(*leaves, *(() if bias else (None,))), leaves, grad)
    for o, t in zip(ours, theirs):
        torch.testing.assert_close(o, t, rtol=1e-5, atol=1e-5)


@gpu
def test_opcheck(tk):
    x, w, b = make_inputs((8,), 64, 128, torch.bfloat16)
    torch.library.opcheck(tk.ops.linear_gelu.default, (x, w, b))
    torch.library.opcheck(tk.ops.linear_gelu.default, (x, w, None))
    torch.library.opcheck(tk.ops.linear_gelu_out.default, (torch.empty(8, 128, device="cuda", dtype=torch.bfloat16),
                                                          x, w, b))
    xf, wf, bf = (t.float().requires_grad_() for t in (x, w, b))
    torch.library.opcheck(tk.ops.linear_gelu.default, (xf, wf, bf))  # with the autograd registration


@gpu
def test_ffn_compiles_fullgraph(tk):
    """The op is opaque to inductor: compiled and eager calls give the same bits."""
    torch._dynamo.reset()
    proj = torch.nn.Linear(256, 1024).to("cuda", torch.bfloat16)
    down = torch.nn.Linear(1024, 256).to("cuda", torch.bfloat16)
    x = _bf(2, 16, 256)

    def ffn(x):
        return down(tk.linear_gelu(x, proj.weight, proj.bias))

    torch.testing.assert_close(torch.compile(ffn, fullgraph=True)(x), ffn(x), rtol=0, atol=0)


# ---- without a GPU ----

def test_fake_impl_traces_on_meta(tk):
    meta = dict(device="meta", dtype=torch.bfloat16)
    x, w, b = torch.empty(2, 9, 256, **meta), torch.empty(1024, 256, **meta), torch.empty(1024, **meta)
    out = tk.linear_gelu(x, w, b)
    assert out.shape == (2, 9, 1024) and out.dtype == torch.bfloat16 and out.device.type == "meta"
    assert tk.linear_gelu(x, w).shape == (2, 9, 1024)
    assert tk.linear_gelu(x, w, b, out=torch.empty(2, 9, 1024, **meta)).shape == (2, 9, 1024)
    with pytest.raises(Exception, match="weight must be"):
        tk.linear_gelu(x, torch.empty(1024, 255, **meta))
    with pytest.raises(Exception, match="out must have the shape"):
        tk.linear_gelu(x, w, b, out=torch.empty(2, 9, 1023, **meta))


def test_traces_with_fake_tensors_and_autograd(tk):
    """make_fx through the fake impl and the autograd registration (forward and backward graphs)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(x, w, b):
        y = tk.linear_gelu(x, w, b)
        return torch.autograd.grad(y.sum(), (x, w, b))

    args = (torch.randn(4, 32, requires_grad=True), torch.randn(64, 32, requires_grad=True),
            torch.randn(64, requires_grad=True))
    graph = make_fx(step, tracing_mode="fake")(*args)
    names = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert any("linear_gelu" in name for name in names), names


def test_cpu_tensors_rejected_with_clear_error(tk):
    with pytest.raises(ValueError, match="linear_gelu: x must be a CUDA tensor, got a tensor on cpu"):
        tk.linear_gelu(torch.randn(2, 8), torch.randn(4, 8), torch.randn(4))
    with pytest.raises(ValueError, match="linear_gelu: x must be a CUDA tensor"):
        tk.linear_gelu_fused(torch.randn(2, 8), torch.randn(4, 8))
