"""Property tests of the normalization family against float64 (see tests/properties.py): random
leading shapes (some empty), widths from 1 to 9000 (odd, aligned, model widths, split rows are in
the example tests), operand layouts (offset, padded, transposed leading dimensions), dtypes,
weights (none, x's dtype, fp32), roundings, eps, and broadcast modulation (per feature, per
sample, per token, strided views of a table); out= buffers in random layouts or functional outputs.

Budgets (examples a test): KERNEL_EXAMPLES on the GPU, properties.CPU_EXAMPLES with eager code here."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import properties as P
from helpers import UNIT_ROUNDOFF, assert_within
from reference.norms import RMS_NORM_EAGER, float64_norm, hf_fused_add_rms_norm, rms_norm_float64

KERNEL_EXAMPLES = {"rms_norm": 300, "fused_add_rms_norm": 150, "layer_norm": 200, "norm_modulate": 200,
                   "gated_add_norm_modulate": 150}
MODULATE_ULPS = 4  # the norm's rounding, then three more (as test_norm_family)


def out_dtype(x, weight, rounding):
    return x.dtype if rounding == "torch" or weight is None else weight.dtype


class EagerNorms(P.Impl):
    """The eager code each op replaces, with its documented rounding; out= copies into the buffer."""

    @staticmethod
    def _into(out, result):
        if out is None:
            return result
        out.copy_(result)
        return out

    def rms_norm(self, x, weight=None, eps=1e-6, rounding="hf", out=None):
        if rounding == "torch":  # F.rms_norm: fp32 math, the weight applied in fp32, one rounding
            y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
            result = (y if weight is None else y * weight.float()).to(x.dtype)
        else:
            result = RMS_NORM_EAGER[rounding](x, weight, eps)
        return self._into(out, result)

    def fused_add_rms_norm(self, x, residual, weight=None, eps=1e-6, rounding="hf"):
        return hf_fused_add_rms_norm(x, residual, weight, eps, rounding)

    def layer_norm(self, x, weight=None, bias=None, eps=1e-5, out=None):
        f = lambda t: None if t is None else t.float()  # noqa: E731 (fp32 math, one rounding)
        result = torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), f(weight), f(bias), eps).to(x.dtype)
        return self._into(out, result)

    def norm_modulate(self, x, scale, shift=None, weight=None, bias=None, eps=1e-6, norm="rms", out=None):
        n = (RMS_NORM_EAGER["diffusers"](x, weight, eps) if norm == "rms"
             else self.layer_norm(x, weight, bias, eps))
        n = n * (1 + scale)
        return self._into(out, n if shift is None else n + shift)

    def gated_add_norm_modulate(self, x, y, gate, scale, shift=None, weight=None, bias=None, eps=1e-6, norm="rms"):
        h = x + y if gate is None else x + y * gate
        return self.norm_modulate(h, scale, shift, weight, bias, eps, norm), h


IMPLS = {"eager": EagerNorms()}


def kernel(tk):
    return P.KernelImpl(tk)


def cpu_impl(name):
    return IMPLS["eager"] if name == "eager" else P.PackageOnCpu()


# ---- strategies ----

@st.composite
def row_case(draw, max_dims=3):
    return dict(lead=draw(P.leading_dims(max_dims)), hidden=draw(P.widths), dtype=draw(P.dtypes),
                x_layout=draw(P.layouts()), seed=draw(P.seeds), out=draw(st.one_of(st.none(), P.layouts())),
                eps=draw(st.sampled_from([1e-6, 1e-5, 1e-2, 0.0])))


def weight_of(v, kind, hidden, dtype):
    if kind == "none":
        return None
    return v.uniform((hidden,), dtype if kind == "same" else torch.float32, 0.5, 1.5)


# ---- properties ----

def prop_rms_norm(impl, case, weight_kind, rounding):
    impl.prepare()
    v = P.Values(case["seed"], impl.device)
    shape, dtype = (*case["lead"], case["hidden"]), case["dtype"]
    x = P.place(v.normal(shape, dtype), case["x_layout"])
    w = weight_of(v, weight_kind, case["hidden"], dtype)
    odt = out_dtype(x, w, rounding)
    out = None if case["out"] is None else P.nan_like(shape, odt, impl.device, case["out"])
    result = impl.rms_norm(x, w, case["eps"], out=out, rounding=rounding)
    P.assert_padding_intact(out, what="rms_norm")
    assert out is None or result is out
    assert result.shape == x.shape and result.dtype == odt
    ref = rms_norm_float64(x, w, case["eps"])
    ulps = 2 * max(UNIT_ROUNDOFF[x.dtype], UNIT_ROUNDOFF[odt]) / UNIT_ROUNDOFF[odt]  # as test_rms_norm
    assert_within(result, ref, ref.abs(), ulps + 0.5, f"rms_norm {rounding} {weight_kind}")


weight_kinds = st.sampled_from(["none", "same", "fp32"])
roundings = st.sampled_from(["hf", "diffusers", "torch"])


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["rms_norm"])
@given(case=row_case(), weight_kind=weight_kinds, rounding=roundings)
def test_rms_norm(tk, case, weight_kind, rounding):
    prop_rms_norm(kernel(tk), case, weight_kind, rounding)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(case=row_case(), weight_kind=weight_kinds, rounding=roundings)
def test_rms_norm_on_cpu(impl, case, weight_kind, rounding):
    prop_rms_norm(cpu_impl(impl), case, weight_kind, rounding)


def prop_fused_add_rms_norm(impl, case, weight_kind, rounding, res_layout):
    impl.prepare()
    v = P.Values(case["seed"], impl.device)
    shape, dtype = (*case["lead"], case["hidden"]), case["dtype"]
    x = P.place(v.normal(shape, dtype), case["x_layout"])
    r = P.place(v.normal(shape, dtype), res_layout)
    w = weight_of(v, weight_kind, case["hidden"], dtype)
    out, h = impl.fused_add_rms_norm(x, r, w, case["eps"], rounding=rounding)
    assert torch.equal(h, x + r), "residual_out must be x + residual rounded once"
    ref = rms_norm_float64(h, w, case["eps"])
    odt = out_dtype(x, w, rounding)
    assert out.dtype == odt
    ulps = 2 * max(UNIT_ROUNDOFF[x.dtype], UNIT_ROUNDOFF[odt]) / UNIT_ROUNDOFF[odt]
    assert_within(out, ref, ref.abs(), ulps + 0.5, f"fused_add_rms_norm {rounding} {weight_kind}")


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["fused_add_rms_norm"])
@given(case=row_case(), weight_kind=weight_kinds, rounding=roundings, res_layout=P.layouts())
def test_fused_add_rms_norm(tk, case, weight_kind, rounding, res_layout):
    prop_fused_add_rms_norm(kernel(tk), case, weight_kind, rounding, res_layout)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(case=row_case(), weight_kind=weight_kinds, rounding=roundings, res_layout=P.layouts())
def test_fused_add_rms_norm_on_cpu(impl, case, weight_kind, rounding, res_layout):
    prop_fused_add_rms_norm(cpu_impl(impl), case, weight_kind, rounding, res_layout)


def layer_magnitude(x, w, b, eps):
    """LayerNorm's error is absolute at the scale of its unit-variance output (test_layer_norm)."""
    w_abs = w.double().abs() if w is not None else 1.0
    return (float64_norm(x, "layer", None, None, eps).abs() + 1) * w_abs + (b.double().abs() if b is not None else 0)


def prop_layer_norm(impl, case, affine):
    impl.prepare()
    v = P.Values(case["seed"], impl.device)
    shape, dtype = (*case["lead"], case["hidden"]), case["dtype"]
    x = P.place(v.normal(shape, dtype, scale=3.0, offset=2.0), case["x_layout"])  # a mean to center
    pdt = torch.float32 if affine == "fp32" else dtype
    w = None if affine == "none" else v.uniform((case["hidden"],), pdt, 0.5, 1.5)
    b = v.uniform((case["hidden"],), pdt, -0.5, 0.5) if affine in ("weight_bias", "fp32") else None
    out = None if case["out"] is None else P.nan_like(shape, dtype, impl.device, case["out"])
    # eps = 0 needs a variance: rows of few elements can be constant (all equal after rounding)
    eps = case["eps"] if case["eps"] > 0 or case["hidden"] >= 16 else 1e-5
    result = impl.layer_norm(x, w, b, eps, out=out)
    P.assert_padding_intact(out, what="layer_norm")
    assert result.dtype == dtype and (out is None or result is out)
    assert_within(result, float64_norm(x, "layer", w, b, eps), layer_magnitude(x, w, b, eps), 2, "layer_norm")


affines = st.sampled_from(["none", "weight_only", "weight_bias", "fp32"])


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["layer_norm"])
@given(case=row_case(), affine=affines)
def test_layer_norm(tk, case, affine):
    prop_layer_norm(kernel(tk), case, affine)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(case=row_case(), affine=affines)
def test_layer_norm_on_cpu(impl, case, affine):
    prop_layer_norm(cpu_impl(impl), case, affine)


# ---- AdaLN: broadcast scale / shift / gate ----

@st.composite
def modulation_case(draw):
    B, S = draw(st.integers(1, 4)), draw(st.integers(0, 24))
    return dict(B=B, S=S, hidden=draw(P.widths), dtype=draw(P.dtypes), x_layout=draw(P.layouts()),
                seed=draw(P.seeds), eps=draw(st.sampled_from([1e-6, 1e-5])),
                norm=draw(st.sampled_from(["rms", "layer"])), scale=draw(BROADCASTS),
                shift=draw(st.one_of(st.none(), BROADCASTS)), out=draw(st.one_of(st.none(), P.layouts())),
                affine=draw(st.booleans()))


BROADCASTS = st.sampled_from(["feature", "sample", "token", "table_view", "one_sample"])


def broadcast_operand(v, kind, B, S, H, dtype, scale):
    """scale/shift/gate as models pass them: [H], [B, 1, H], [B, S, H], a strided slice of LTX's
    [B, 1, 6, H] modulation table, [1, 1, H]."""
    if kind == "feature":
        return v.normal((H,), dtype, scale, 0.0)
    if kind == "sample":
        return v.normal((B, 1, H), dtype, scale, 0.0)
    if kind == "token":
        return v.normal((B, S, H), dtype, scale, 0.0)
    if kind == "one_sample":
        return v.normal((1, 1, H), dtype, scale, 0.0)
    return v.normal((B, 1, 6, H), dtype, scale, 0.0)[:, :, 2]


def modulate64(n_unit, w, b, scale, shift, norm):
    """float64 of norm(x) * (1 + scale) + shift, and the magnitude its roundings scale with."""
    n64 = n_unit * (w.double() if w is not None else 1.0) + (b.double() if b is not None else 0.0)
    floor = 1.0 if norm == "layer" else 0.0
    w_abs = w.double().abs() if w is not None else 1.0
    n_mag = (n_unit.abs() + floor) * w_abs + (b.double().abs() if b is not None else 0.0)
    ref, mag = n64 * (1 + scale.double()), n_mag * (1 + scale.double()).abs()
    if shift is not None:
        ref, mag = ref + shift.double(), mag + shift.double().abs()
    return ref, mag


def modulation_inputs(v, case):
    B, S, H, dtype = case["B"], case["S"], case["hidden"], case["dtype"]
    scale = broadcast_operand(v, case["scale"], B, S, H, dtype, 0.3)
    shift = None if case["shift"] is None else broadcast_operand(v, case["shift"], B, S, H, dtype, 0.5)
    w = b = None
    if case["affine"]:  # diffusers' RMSNorm weight has x's dtype under modulation; LayerNorm's may be fp32
        w = v.uniform((H,), dtype, 0.5, 1.5)
        b = v.uniform((H,), dtype, -0.3, 0.3) if case["norm"] == "layer" else None
    return scale, shift, w, b


def prop_norm_modulate(impl, case):
    impl.prepare()
    v = P.Values(case["seed"], impl.device)
    B, S, H, dtype = case["B"], case["S"], case["hidden"], case["dtype"]
    x = P.place(v.normal((B, S, H), dtype), case["x_layout"])
    scale, shift, w, b = modulation_inputs(v, case)
    out = None if case["out"] is None else P.nan_like((B, S, H), dtype, impl.device, case["out"])
    result = impl.norm_modulate(x, scale, shift, norm=case["norm"], weight=w, bias=b, eps=case["eps"], out=out)
    P.assert_padding_intact(out, what="norm_modulate")
    ref, mag = modulate64(float64_norm(x, case["norm"], eps=case["eps"]), w, b, scale, shift, case["norm"])
    ulps = MODULATE_ULPS + (1 if w is not None and case["norm"] == "rms" else 0)  # the weight's own rounding
    assert_within(result, ref, mag, ulps + 0.5, f"norm_modulate {case['norm']}")


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["norm_modulate"])
@given(case=modulation_case())
def test_norm_modulate(tk, case):
    prop_norm_modulate(kernel(tk), case)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(case=modulation_case())
def test_norm_modulate_on_cpu(impl, case):
    prop_norm_modulate(cpu_impl(impl), case)


def prop_gated_add_norm_modulate(impl, case, gate_kind, y_layout):
    impl.prepare()
    v = P.Values(case["seed"], impl.device)
    B, S, H, dtype = case["B"], case["S"], case["hidden"], case["dtype"]
    x = P.place(v.normal((B, S, H), dtype), case["x_layout"])
    y = P.place(v.normal((B, S, H), dtype), y_layout)
    gate = None if gate_kind is None else broadcast_operand(v, gate_kind, B, S, H, dtype, 0.5)
    scale, shift, w, b = modulation_inputs(v, case)
    out, h = impl.gated_add_norm_modulate(x, y, gate, scale, shift, norm=case["norm"], weight=w, bias=b,
                                          eps=case["eps"])
    assert torch.equal(h, x + y if gate is None else x + y * gate), "h must be x + gate * y as the eager ops round it"
    ref, mag = modulate64(float64_norm(h, case["norm"], eps=case["eps"]), w, b, scale, shift, case["norm"])
    ulps = MODULATE_ULPS + (1 if w is not None and case["norm"] == "rms" else 0)
    assert_within(out, ref, mag, ulps + 0.5, f"gated_add_norm_modulate {case['norm']}")


gates = st.one_of(st.none(), BROADCASTS)


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["gated_add_norm_modulate"])
@given(case=modulation_case(), gate_kind=gates, y_layout=P.layouts())
def test_gated_add_norm_modulate(tk, case, gate_kind, y_layout):
    prop_gated_add_norm_modulate(kernel(tk), case, gate_kind, y_layout)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(case=modulation_case(), gate_kind=gates, y_layout=P.layouts())
def test_gated_add_norm_modulate_on_cpu(impl, case, gate_kind, y_layout):
    prop_gated_add_norm_modulate(cpu_impl(impl), case, gate_kind, y_layout)
