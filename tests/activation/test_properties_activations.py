"""Property tests of the activations against float64 (see tests/properties.py): random leading
shapes (some empty), widths from 1 to 9000, operand layouts (offset, padded rows, transposed
leading dimensions), dtypes, every activation and gated form, broadcast gates, out= buffers in
random layouts or functional outputs.

Budgets (examples a test): KERNEL_EXAMPLES on the GPU, properties.CPU_EXAMPLES with eager code here."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import properties as P
from helpers import UNIT_ROUNDOFF, assert_within
from reference.activations import activation_error_magnitude, activation_float64, eager_act_and_mul, eager_act_mul, eager_activation

KERNEL_EXAMPLES = {"activation": 300, "act_and_mul": 200, "act_mul": 150, "gated_add": 200}
ACTS = ("silu", "gelu", "gelu_tanh")


def into(out, result):
    if out is None:
        return result
    out.copy_(result)
    return out


class EagerActivations(P.Impl):
    """The eager code each op replaces (F.silu / F.gelu, transformers' MLP, diffusers' GEGLU)."""

    def silu(self, x, out=None):
        return into(out, eager_activation(x, "silu"))

    def gelu(self, x, approximate="none", out=None):
        return into(out, eager_activation(x, "gelu" if approximate == "none" else "gelu_tanh"))

    def silu_and_mul(self, x, out=None):
        return into(out, eager_act_and_mul(x, "silu"))

    def gelu_and_mul(self, x, out=None):
        return into(out, eager_act_and_mul(x, "gelu"))

    def gelu_tanh_and_mul(self, x, out=None):
        return into(out, eager_act_and_mul(x, "gelu_tanh"))

    def geglu(self, x, approximate="none", out=None):
        return into(out, eager_act_and_mul(x, "gelu" if approximate == "none" else "gelu_tanh", act_first=False))

    def act_mul(self, gate, up, activation="silu", out=None):
        return into(out, eager_act_mul(gate, up, activation))

    def gated_add(self, x, y, gate, out=None):
        return into(out, x + y * gate)


EAGER = EagerActivations()


def cpu_impl(name):
    return EAGER if name == "eager" else P.PackageOnCpu()


def act_magnitude(x, act):
    """reference.activations.activation_error_magnitude for x's dtype (the output's)."""
    return activation_error_magnitude(x, act, UNIT_ROUNDOFF[x.dtype])


@st.composite
def row_case(draw):
    return dict(lead=draw(P.leading_dims()), hidden=draw(P.widths), dtype=draw(P.dtypes), layout=draw(P.layouts()),
                seed=draw(P.seeds), out=draw(st.one_of(st.none(), P.layouts())), act=draw(st.sampled_from(ACTS)))


def values(v, shape, dtype, layout):
    return P.place(v.normal(shape, dtype, scale=3.0, offset=0.0), layout)  # both signs: GELU's cancellation


def prop_activation(impl, case):
    impl.prepare()
    v = P.Values(case["seed"], impl.device)
    shape, dtype, act = (*case["lead"], case["hidden"]), case["dtype"], case["act"]
    x = values(v, shape, dtype, case["layout"])
    out = None if case["out"] is None else P.nan_like(shape, dtype, impl.device, case["out"])
    result = impl.silu(x, out=out) if act == "silu" else impl.gelu(x, "none" if act == "gelu" else "tanh", out=out)
    P.assert_padding_intact(out, what=act)
    assert result.shape == x.shape and result.dtype == dtype and (out is None or result is out)
    assert_within(result, activation_float64(x, act), act_magnitude(x, act), 2, act)  # fp32 math, one rounding


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["activation"])
@given(case=row_case())
def test_activation(tk, case):
    prop_activation(P.KernelImpl(tk), case)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(case=row_case())
def test_activation_on_cpu(impl, case):
    prop_activation(cpu_impl(impl), case)


def prop_act_and_mul(impl, case, act_first):
    impl.prepare()
    v = P.Values(case["seed"], impl.device)
    H, dtype, act = case["hidden"], case["dtype"], case["act"]
    if not act_first and act == "silu":
        act = "gelu"  # the gate-second order is GEGLU's, a GELU
    x = values(v, (*case["lead"], 2 * H), dtype, case["layout"])
    out = None if case["out"] is None else P.nan_like((*case["lead"], H), dtype, impl.device, case["out"])
    if act_first:
        fn = {"silu": impl.silu_and_mul, "gelu": impl.gelu_and_mul, "gelu_tanh": impl.gelu_tanh_and_mul}[act]
        result = fn(x, out=out)
    else:
        result = impl.geglu(x, "none" if act == "gelu" else "tanh", out=out)
    P.assert_padding_intact(out, what=f"{act} and mul")
    a, b = x[..., :H], x[..., H:]
    if not act_first:
        a, b = b, a
    ref = activation_float64(a, act) * b.double()
    assert_within(result, ref, act_magnitude(a, act) * b.double().abs(), 3, f"{act} and mul")  # two roundings


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["act_and_mul"])
@given(case=row_case(), act_first=st.booleans())
def test_act_and_mul(tk, case, act_first):
    prop_act_and_mul(P.KernelImpl(tk), case, act_first)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(case=row_case(), act_first=st.booleans())
def test_act_and_mul_on_cpu(impl, case, act_first):
    prop_act_and_mul(cpu_impl(impl), case, act_first)


def prop_act_mul(impl, case, up_layout):
    impl.prepare()
    v = P.Values(case["seed"], impl.device)
    shape, dtype, act = (*case["lead"], case["hidden"]), case["dtype"], case["act"]
    gate, up = values(v, shape, dtype, case["layout"]), values(v, shape, dtype, up_layout)
    out = None if case["out"] is None else P.nan_like(shape, dtype, impl.device, case["out"])
    result = impl.act_mul(gate, up, act, out=out)
    P.assert_padding_intact(out, what="act_mul")
    ref = activation_float64(gate, act) * up.double()
    assert_within(result, ref, act_magnitude(gate, act) * up.double().abs(), 3, f"act_mul {act}")


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["act_mul"])
@given(case=row_case(), up_layout=P.layouts())
def test_act_mul(tk, case, up_layout):
    prop_act_mul(P.KernelImpl(tk), case, up_layout)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(case=row_case(), up_layout=P.layouts())
def test_act_mul_on_cpu(impl, case, up_layout):
    prop_act_mul(cpu_impl(impl), case, up_layout)


def gate_operand(v, kind, shape, dtype):
    """gate broadcast to x [..., H]: [H], [1, ..., 1, H], x's shape with some dims 1, a strided slice."""
    H = shape[-1]
    if kind == "feature":
        return v.normal((H,), dtype, 0.5, 0.0)
    if kind == "ones":
        return v.normal((*([1] * (len(shape) - 1)), H), dtype, 0.5, 0.0)
    if kind == "first_dim":  # per sample: [B, 1, ..., H]
        return v.normal((shape[0], *([1] * (len(shape) - 2)), H), dtype, 0.5, 0.0)
    if kind == "full":
        return v.normal(shape, dtype, 0.5, 0.0)
    table = v.normal((*shape[:-1], 3, H), dtype, 0.5, 0.0)  # a modulation table's slice: strided rows
    return table[..., 1, :]


def prop_gated_add(impl, case, gate_kind, y_layout):
    impl.prepare()
    v = P.Values(case["seed"], impl.device)
    shape, dtype = (*case["lead"], case["hidden"]), case["dtype"]
    x, y = values(v, shape, dtype, case["layout"]), values(v, shape, dtype, y_layout)
    gate = gate_operand(v, gate_kind, shape, dtype)
    out = None if case["out"] is None else P.nan_like(shape, dtype, impl.device, case["out"])
    result = impl.gated_add(x, y, gate, out=out)
    P.assert_padding_intact(out, what="gated_add")
    gy = gate.double() * y.double()
    # round(x + round(gate * y)): two roundings of terms at most |x| + |gate * y|
    assert_within(result, x.double() + gy, x.double().abs() + gy.abs(), 2.5, "gated_add")


gate_kinds = st.sampled_from(["feature", "ones", "first_dim", "full", "table"])


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["gated_add"])
@given(case=row_case(), gate_kind=gate_kinds, y_layout=P.layouts())
def test_gated_add(tk, case, gate_kind, y_layout):
    prop_gated_add(P.KernelImpl(tk), case, gate_kind, y_layout)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(case=row_case(), gate_kind=gate_kinds, y_layout=P.layouts())
def test_gated_add_on_cpu(impl, case, gate_kind, y_layout):
    prop_gated_add(cpu_impl(impl), case, gate_kind, y_layout)
