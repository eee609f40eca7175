"""Property tests of the fused q/k norm + RoPE against float64 (see tests/properties.py): LTX-Video's
(across heads) and Flux's (per head) forms, Qwen3's (transformers' norms then apply_rotary_pos_emb,
with its out= form) on random batches, tokens (some none), heads, head widths and layouts, fp32 or
model-dtype weights, tables per batch or shared. The strategies and eager code are the rope
family's (tests/rope/rope_properties.py). These tests moved from tests/rope/test_properties_rope.py
and draw the data they drew there (SEED_FILE). LTX's coordinate forms are tested with rope's.

Budgets (examples a test): KERNEL_EXAMPLES on the GPU, properties.CPU_EXAMPLES with eager code here."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import properties as P
from families import family_module
from helpers import assert_within, rope_magnitude
from reference.norms import rms_norm_float64
from reference.rope import hf_qk_norm_rope_float64, rotary_float64

KERNEL_EXAMPLES = {"qk_norm": 200, "hf_qk_norm": 200}
SEED_FILE = "test_properties_rope.py"  # (conftest.node_seed)

rope = family_module("rope", "properties")
cpu_impl, make_qk, qk_case, rms64_then = rope.cpu_impl, rope.make_qk, rope.qk_case, rope.rms64_then
interleaved_tables, neox_tables = rope.interleaved_tables, rope.neox_tables


# ---- the fused q/k norm + RoPE: LTX-Video (across heads), Flux (per head), Qwen3 (transformers) ----

@st.composite
def qk_norm_case(draw):
    c = draw(qk_case(max_heads=4, pair_offsets=True, widths=st.integers(1, 256).map(lambda n: 2 * n)))
    c.update(form=draw(st.sampled_from(["ltx", "flux"])), weight_fp32=draw(st.booleans()),
             eps=draw(st.sampled_from([1e-6, 1e-5, 0.0])))
    return c


def prop_qk_norm_rope(impl, c):
    impl.prepare()
    v = P.Values(c["seed"], impl.device)
    B, S, d = c["B"], c["S"], c["d"]
    if c["form"] == "ltx":  # [B, S, C], normalized across the heads
        q, k = (t.flatten(-2) for t in make_qk(v, dict(c, Hk=c["Hq"])))
        width = q.shape[-1]
    else:  # Flux: per head
        q, k = make_qk(v, c)
        width = d
    wdt = torch.float32 if c["weight_fp32"] else c["dtype"]
    qw, kw = v.uniform((width,), wdt, 0.5, 1.5), v.uniform((width,), wdt, 0.5, 1.5)
    if c["form"] == "ltx":
        cos, sin = interleaved_tables(v, B, S, width, 0)
        q_out, k_out = impl.ltx_qk_norm_rope(q, k, qw, kw, c["eps"], cos, sin)
        cs, sn = cos, sin
    else:
        cos, sin = interleaved_tables(v, 1, S, d, 0)
        q_out, k_out = impl.qk_norm_rope(q, k, qw, kw, c["eps"], cos[0], sin[0])
        cs, sn = cos[0][None, :, None], sin[0][None, :, None]
    for out, x, w in ((q_out, q, qw), (k_out, k, kw)):
        n64 = rms64_then(x, w, c["eps"])
        mag = rope_magnitude(n64.to(x.dtype), cs, sn, "interleaved")
        # the norm's rounding, then one rounding of the rotation (as test_rope's check_qk_norm_rope)
        assert_within(out, rotary_float64(n64, cs, sn, "interleaved"), mag, 3.5, f"{c['form']} qk_norm_rope")


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["qk_norm"])
@given(c=qk_norm_case())
def test_qk_norm_rope(tk, c):
    prop_qk_norm_rope(P.KernelImpl(tk), c)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(c=qk_norm_case())
def test_qk_norm_rope_on_cpu(impl, c):
    prop_qk_norm_rope(cpu_impl(impl), c)


@st.composite
def hf_qk_norm_case(draw):
    c = draw(qk_case(widths=st.sampled_from([2, 18, 40, 64, 72, 128, 256, 512])))
    c.update(shared=draw(st.booleans()), out=draw(st.one_of(st.none(), P.layouts(("contiguous", "offset", "padded")))),
             eps=draw(st.sampled_from([1e-6, 1e-5])))
    return c


def prop_hf_qk_norm_rope(impl, c):
    impl.prepare()
    v = P.Values(c["seed"], impl.device)
    q, k = make_qk(v, c)
    d, dtype = c["d"], c["dtype"]
    qw, kw = v.uniform((d,), dtype, 0.5, 1.5), v.uniform((d,), dtype, 0.5, 1.5)
    cos, sin = neox_tables(v, 1 if c["shared"] else c["B"], c["S"], d, dtype, 0)
    out = None
    if c["out"] is not None:
        out = (P.nan_like(q.shape, dtype, impl.device, c["out"]), P.nan_like(k.shape, dtype, impl.device, c["out"]))
    q_out, k_out = impl.hf_qk_norm_rope(q, k, qw, kw, c["eps"], cos, sin, out=out)
    P.assert_padding_intact(out, what="hf_qk_norm_rope")
    for o, x, w in ((q_out, q, qw), (k_out, k, kw)):
        assert o.shape == x.shape and o.dtype == dtype
        mag = rope_magnitude(rms_norm_float64(x, w, c["eps"]), cos.unsqueeze(2), sin.unsqueeze(2), "neox")
        # five roundings: x * inv_rms, weight * that, n * cos, rotate_half(n) * sin, the sum
        assert_within(o, hf_qk_norm_rope_float64(x, w, c["eps"], cos, sin), mag, 5, "hf_qk_norm_rope")


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["hf_qk_norm"])
@given(c=hf_qk_norm_case())
def test_hf_qk_norm_rope(tk, c):
    prop_hf_qk_norm_rope(P.KernelImpl(tk), c)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(c=hf_qk_norm_case())
def test_hf_qk_norm_rope_on_cpu(impl, c):
    prop_hf_qk_norm_rope(cpu_impl(impl), c)
