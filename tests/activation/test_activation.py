"""Activations and gated units: float64 accuracy, parity with F.silu/F.gelu and the eager MLP code,
halves ordering (vLLM vs diffusers' GEGLU), strided inputs, bad inputs, opcheck, torch.compile."""

import pytest
import torch
import torch.nn.functional as F

from helpers import DTYPES, UNIT_ROUNDOFF, assert_all_written, assert_matches_eager, assert_rejects, assert_within, poisoned, random_input
from reference.activations import (
    activation_error_magnitude,
    activation_float64,
    eager_act_and_mul,
    eager_act_mul,
    eager_activation,
    eager_gated_add,
)

pytestmark = pytest.mark.gpu

ACTS = ["silu", "gelu", "gelu_tanh"]
HIDDEN = [1, 7, 4097, 14336, 18944]


def rows_for(hidden):
    return max(1, min(65, (1 << 20) // hidden))


def act_magnitude(x, act):
    """reference.activations.activation_error_magnitude for x's dtype (the output's)."""
    return activation_error_magnitude(x, act, UNIT_ROUNDOFF[x.dtype])


def call_act(tk, x, act, out=None):
    return tk.silu(x, out=out) if act == "silu" else tk.gelu(x, "none" if act == "gelu" else "tanh", out=out)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_activation(tk, act, dtype, hidden):
    x = random_input((rows_for(hidden), hidden), dtype)
    out = poisoned(x.shape, dtype)
    assert call_act(tk, x, act, out=out) is out
    assert_all_written(out)
    ref = activation_float64(x, act)
    assert_within(out, ref, act_magnitude(x, act), 1.5, f"{act} vs float64")  # fp32 math, one rounding
    eager = eager_activation(x, act)
    assert_matches_eager(out, eager, act_magnitude(x, act), 2)  # 2u: one ulp at most
    assert torch.equal(call_act(tk, x, act), out)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("act_first", [True, False], ids=["act_first", "geglu_order"])
def test_act_and_mul(tk, act, dtype, hidden, act_first):
    x = random_input((rows_for(hidden), 2 * hidden), dtype)
    if act_first:
        fn = {"silu": tk.silu_and_mul, "gelu": tk.gelu_and_mul, "gelu_tanh": tk.gelu_tanh_and_mul}[act]
        run = lambda out=None: fn(x, out=out)  # noqa: E731
    elif act == "silu":
        pytest.skip("the gate-second order is GEGLU's, a GELU")
    else:
        run = lambda out=None: tk.geglu(x, "none" if act == "gelu" else "tanh", out=out)  # noqa: E731
    out = poisoned((x.shape[0], hidden), dtype)
    assert run(out) is out
    assert_all_written(out)
    a, b = x.chunk(2, dim=-1)
    if not act_first:
        a, b = b, a
    ref = activation_float64(a, act) * b.double()
    mag = act_magnitude(a, act) * b.double().abs()
    assert_within(out, ref, mag, 2.5, "act_and_mul vs float64")  # two roundings
    eager = eager_act_and_mul(x, act, act_first)
    assert_matches_eager(out, eager, mag, 4)  # two roundings: 2 ulp at most
    assert torch.equal(run(), out)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_act_mul_two_tensors(tk, act, dtype):
    gate, up = random_input((257, 14336), dtype), random_input((257, 14336), dtype)
    out = tk.act_mul(gate, up, act)
    eager = eager_act_mul(gate, up, act)
    mag = act_magnitude(gate, act) * up.double().abs()
    assert_within(out, activation_float64(gate, act) * up.double(), mag, 2.5, "act_mul vs float64")
    assert_matches_eager(out, eager, mag, 4)


def every_bit_pattern(dtype):
    """All 65536 values of a 16-bit dtype (NaNs, infinities, subnormals and both zeros included)."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32, device="cuda").to(torch.int16).view(dtype)


def same_bits(a, b):
    """Equal bit for bit, any NaN matching any NaN (payloads are not specified)."""
    nan = a.isnan()
    return bool(torch.equal(nan, b.isnan()) and torch.equal(a[~nan].view(torch.int16), b[~nan].view(torch.int16)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_silu_every_value_matches_aten(tk, dtype):
    """The SiLU follows ATen's formula op for op (expf, IEEE division): over every input value of
    the dtype the result must be F.silu's bits, and the product with `up` eager's."""
    x = every_bit_pattern(dtype).reshape(256, 256)
    assert same_bits(tk.silu(x), F.silu(x))
    up = random_input(x.shape, dtype)
    assert same_bits(tk.act_mul(x, up, "silu"), F.silu(x) * up)
    assert same_bits(tk.silu_and_mul(torch.cat([x, up], -1)), F.silu(x) * up)


def test_strided_and_unaligned_inputs(tk):
    big = random_input((64, 3 * 4096), torch.bfloat16)
    x = big[:, 4096:]  # [64, 2 * 4096] with row stride 3 * 4096: a slice of a fused projection
    assert not x.is_contiguous()
    eager = eager_act_and_mul(x, "silu")
    assert_matches_eager(tk.silu_and_mul(x), eager, eager.double().abs() + 1e-3, 4)
    odd = random_input((33, 2 * 4097 + 1), torch.float16)[:, 1:]  # misaligned pointer, odd half
    a, b = odd.chunk(2, dim=-1)
    assert_matches_eager(tk.gelu_tanh_and_mul(odd), eager_act_and_mul(odd, "gelu_tanh"),
                         act_magnitude(a, "gelu_tanh") * b.double().abs(), 4)
    t = random_input((16, 3, 2048), torch.bfloat16).transpose(0, 1)  # leading dims that cannot merge
    assert_matches_eager(tk.gelu(t, "tanh"), eager_activation(t, "gelu_tanh"), act_magnitude(t, "gelu_tanh"), 2)
    gate, up = random_input((2, 33, 8, 128), torch.bfloat16).transpose(1, 2), random_input((2, 8, 33, 128), torch.bfloat16)
    eager = eager_act_mul(gate, up, "silu")
    assert_matches_eager(tk.act_mul(gate, up, "silu"), eager, eager.double().abs() + 1e-3, 4)


# ---- every access path gives the same bits ----
# 16-byte vectors when every pointer and row stride is aligned (rows back to back, or located
# through RowIndexer's dividers), vectors and a scalar tail when only the row length is odd,
# scalars when anything is misaligned. Every path must give the same bits.


def misaligned(t):
    """A contiguous copy of t one element past a 16-byte boundary: the row kernel's scalar path."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = buf[1:].view(t.shape)
    assert view.data_ptr() % 16 != 0
    return view.copy_(t)


def padded_rows(t, fill=0.0):
    """A copy of t in a buffer whose rows are 8 elements longer (16-byte aligned, not back to back:
    rows located through the row indexer), and that buffer."""
    buf = torch.full((*t.shape[:-1], t.shape[-1] + 8), fill, dtype=t.dtype, device=t.device)
    return buf[..., : t.shape[-1]].copy_(t), buf


# name: (input shapes for (rows, h), call(tk, inputs, out), whether the inputs are [..., 2h] halves)
PATH_CASES = {
    "silu": (lambda r, h: [(r, h)], lambda tk, xs, out: tk.silu(*xs, out=out), False),
    "gelu": (lambda r, h: [(r, h)], lambda tk, xs, out: tk.gelu(*xs, out=out), False),
    "gelu_tanh": (lambda r, h: [(r, h)], lambda tk, xs, out: tk.gelu(*xs, "tanh", out=out), False),
    "silu_and_mul": (lambda r, h: [(r, 2 * h)], lambda tk, xs, out: tk.silu_and_mul(*xs, out=out), True),
    "geglu": (lambda r, h: [(r, 2 * h)], lambda tk, xs, out: tk.geglu(*xs, out=out), True),
    "act_mul_gelu_tanh": (lambda r, h: [(r, h), (r, h)],
                          lambda tk, xs, out: tk.act_mul(*xs, "gelu_tanh", out=out), False),
    "gated_add_per_sample": (lambda r, h: [(2, r, h), (2, r, h), (2, 1, h)],
                             lambda tk, xs, out: tk.gated_add(*xs, out=out), False),
}
# Decode row; 17 vectors a row (bf16); one vector a row; 128 and 256 vectors a row.
PATH_SHAPES = [(1, 14336), (33, 136), (3, 8), (4, 1024), (65, 2048)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", PATH_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("case", sorted(PATH_CASES))
def test_every_access_path_gives_the_same_bits(tk, case, shape, dtype):
    shapes, call, halves = PATH_CASES[case]
    rows, h = shape
    xs = [random_input(s, dtype, scale=0.3 if i == 2 else 2.0) for i, s in enumerate(shapes(rows, h))]
    out_shape = (rows, h) if halves else xs[0].shape
    dense = poisoned(out_shape, dtype)
    call(tk, xs, dense)  # contiguous and aligned: vectors, rows back to back
    assert_all_written(dense)
    if case.startswith("gated_add"):
        assert torch.equal(dense, eager_gated_add(*xs))

    # aligned rows that are not back to back, inputs and output: vectors, rows through the indexer
    out, out_buf = padded_rows(poisoned(out_shape, dtype), fill=float("nan"))
    call(tk, [padded_rows(x)[0] for x in xs], out)
    assert torch.equal(out, dense), "strided rows differ from dense rows"
    assert out_buf[..., h:].isnan().all(), "wrote past the end of a row"

    # misaligned inputs and output: the row kernel, scalar
    out = misaligned(poisoned(out_shape, dtype))
    call(tk, [misaligned(x) for x in xs], out)
    assert torch.equal(out, dense), "scalar path differs from the vector path"

    # aligned rows of h - 1 elements (not whole vectors): the row kernel, vectors and a scalar tail
    if not halves:
        out, out_buf = padded_rows(poisoned((*out_shape[:-1], h - 1), dtype), fill=float("nan"))
        call(tk, [x[..., : h - 1] for x in xs], out)
        assert torch.equal(out, dense[..., : h - 1]), "vectors with a scalar tail differ from whole vectors"
        assert out_buf[..., h - 1:].isnan().all(), "wrote past the end of a row"


def test_rows_through_strided_leading_dims(tk):
    """Leading dimensions that cannot merge (transposes, a table row) on inputs and the output:
    each row is located through 2-3 dimensions (RowIndexer's 32-bit dividers)."""
    dtype = torch.bfloat16
    gate = random_input((4, 33, 8, 136), dtype).transpose(1, 2)  # [4, 8, 33, 136]
    up = random_input((4, 8, 33, 136), dtype)
    out_buf = poisoned((33, 4, 8, 136), dtype)
    out = out_buf.permute(1, 2, 0, 3)  # [4, 8, 33, 136], rows 4 * 8 * 136 apart along the 33
    tk.act_mul(gate, up, "gelu_tanh", out=out)
    assert_all_written(out_buf)
    dense = tk.act_mul(gate.contiguous(), up, "gelu_tanh")
    assert torch.equal(out, dense)
    assert torch.equal(out, tk.act_mul(misaligned(gate.contiguous()), up, "gelu_tanh"))

    x = random_input((77, 2, 136), dtype).transpose(0, 1)  # [2, 77, 136]
    y = random_input((2, 77, 136), dtype)
    gate = random_input((2, 1, 6, 136), dtype, scale=0.3, offset=0.0)[:, :, 4]  # [2, 1, 136] of a table
    out = poisoned((2, 77, 136), dtype)
    assert torch.equal(tk.gated_add(x, y, gate, out=out), eager_gated_add(x, y, gate))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gate_shape", ["per_sample", "per_token", "per_feature", "table_view"])
def test_gated_add(tk, dtype, gate_shape):
    B, S, D = 2, 77, 2048
    x, y = random_input((B, S, D), dtype), random_input((B, S, D), dtype)
    gate = {
        "per_sample": lambda: random_input((B, 1, D), dtype, scale=0.3, offset=0.0),
        "per_token": lambda: random_input((B, S, D), dtype, scale=0.3, offset=0.0),
        "per_feature": lambda: random_input((D,), dtype, scale=0.3, offset=0.0),
        "table_view": lambda: random_input((B, 1, 6, D), dtype, scale=0.3, offset=0.0)[:, :, 5],
    }[gate_shape]()
    out = poisoned(x.shape, dtype)
    assert tk.gated_add(x, y, gate, out=out) is out
    assert_all_written(out)
    assert torch.equal(out, eager_gated_add(x, y, gate)), "x + gate * y must round exactly as the eager ops"


@pytest.mark.parametrize("shape", [(0, 64), (5, 0)])
def test_empty(tk, shape):
    x = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
    assert tk.silu(x).shape == x.shape
    assert tk.silu_and_mul(x).shape == (shape[0], shape[1] // 2)
    assert tk.gated_add(x, x.clone(), torch.ones(shape[-1], device="cuda", dtype=torch.bfloat16)).shape == x.shape


def _bf(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


BAD = {
    "odd_last_dim": (lambda t: t.silu_and_mul(_bf(4, 7)), ValueError, "last dimension must be even"),
    "int_input": (lambda t: t.silu(torch.ones(4, 8, device="cuda", dtype=torch.int32)), TypeError, "x must be float32"),
    "cpu_input": (lambda t: t.gelu(torch.randn(4, 8)), ValueError, "x must be a CUDA tensor"),
    "bad_approximate": (lambda t: t.gelu(_bf(4, 8), "fast"), ValueError, "approximate must be"),
    "bad_activation": (lambda t: t.act_mul(_bf(4, 8), _bf(4, 8), "relu"), ValueError, "activation must be"),
    "up_shape": (lambda t: t.act_mul(_bf(4, 8), _bf(4, 9)), ValueError, "up must have the shape of gate"),
    "up_dtype": (lambda t: t.act_mul(_bf(4, 8), _bf(4, 8).float()), TypeError,
                 r"up must have dtype BFloat16 \(the dtype of gate\)"),
    "out_shape": (lambda t: t.silu_and_mul(_bf(4, 8), out=_bf(4, 8)), ValueError, r"out must have the shape \[4, 4\]"),
    "out_dtype": (lambda t: t.silu(_bf(4, 8), out=_bf(4, 8).half()), TypeError, "out must have dtype"),
    "out_aliases_input": (lambda t: (lambda x: t.silu(x, out=x))(_bf(4, 8)), ValueError, "out must not share memory"),
    "gate_not_broadcast": (lambda t: t.gated_add(_bf(2, 3, 8), _bf(2, 3, 8), _bf(3, 1, 8)), ValueError,
                           "does not broadcast"),
    "last_dim_strided": (lambda t: t.silu(_bf(8, 4).t()), ValueError, "contiguous in its last dimension"),
    # 2^31 elements in a row (4 GB): the kernel indexes within a row in 32 bits
    "row_too_long": (lambda t: t.silu(torch.empty(1, 2**31, device="cuda", dtype=torch.bfloat16)), ValueError,
                     "last dimension must be at most 2147483647"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_clear_error(tk, case):
    call, exc, message = BAD[case]
    assert_rejects(lambda: call(tk), exc, message)


def test_opcheck(tk):
    x, g, u = _bf(8, 256), _bf(8, 128), _bf(8, 128)
    gate = _bf(128)
    for op, args in [
        (tk.ops.activation.default, (x, "gelu_tanh")),
        (tk.ops.activation_out.default, (torch.empty_like(x), x, "silu")),
        (tk.ops.act_and_mul.default, (x, "silu", True)),
        (tk.ops.act_and_mul_out.default, (torch.empty_like(g), x, "gelu", False)),
        (tk.ops.act_mul.default, (g, u, "silu")),
        (tk.ops.act_mul_out.default, (torch.empty_like(g), g, u, "gelu_tanh")),
        (tk.ops.gated_add.default, (g, u, gate)),
        (tk.ops.gated_add_out.default, (torch.empty_like(g), g, u, gate)),
    ]:
        torch.library.opcheck(op, args)


def test_mlp_compiles_fullgraph(tk):
    torch._dynamo.reset()
    gate_up = torch.nn.Linear(256, 2 * 512, bias=False).to("cuda", torch.bfloat16)
    x = _bf(16, 256)

    def mlp(x):
        h = gate_up(x)
        return tk.silu_and_mul(h) + tk.act_mul(*h.chunk(2, dim=-1), "silu")

    compiled = torch.compile(mlp, fullgraph=True)
    torch.testing.assert_close(compiled(x), mlp(x), rtol=0, atol=0)
