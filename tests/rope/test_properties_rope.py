"""Property tests of the rotary embeddings against float64 (see tests/properties.py): random batch,
tokens (some none), query and key heads (GQA, odd counts, no key heads), head widths, partial
rotary widths, layouts (views of one fused QKV projection, offset pointers, transformers' [B, H, S, d]
views), tables per batch or shared and strided, in place and out of place, model-dtype and fp32
tables, vLLM's cache with random positions, LTX's coordinate forms (with their fused q/k norm twin).
The strategies and eager code are in tests/rope/rope_properties.py; the fused q/k norm forms'
properties are in tests/qk_norm_rope/test_properties_qk_norm_rope.py.

Budgets (examples a test): KERNEL_EXAMPLES on the GPU, properties.CPU_EXAMPLES with eager code here."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import properties as P
from helpers import assert_within, rope_magnitude
from reference.rope import ltx_tables_float64, ltx_tables_from_coords, rotary_float64
from rope_properties import cpu_impl, interleaved_tables, make_qk, neox_tables, qk_case, rms64_then

KERNEL_EXAMPLES = {"hf": 300, "cached": 200, "interleaved": 150, "ltx_coords": 150}


# ---- transformers' apply_rotary_pos_emb (NeoX, model-dtype tables, per-op rounding) ----

@st.composite
def hf_case(draw):
    c = draw(qk_case())
    c.update(partial=draw(st.booleans()), unsqueeze_dim=draw(st.sampled_from([1, 2])), in_place=draw(st.booleans()),
             shared=draw(st.booleans()), table_pad=draw(st.sampled_from([0, 0, 8, 3])))
    c["R"] = 2 * draw(st.integers(1, c["d"] // 2)) if c["partial"] else c["d"]
    return c


def prop_hf_rope(impl, c):
    impl.prepare()
    v = P.Values(c["seed"], impl.device)
    q, k = make_qk(v, c)
    cos, sin = neox_tables(v, 1 if c["shared"] else c["B"], c["S"], c["R"], c["dtype"], c["table_pad"])
    if c["unsqueeze_dim"] == 1:  # transformers' [B, H, S, d] views
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    q0, k0 = q.clone(), k.clone()
    fn = impl.apply_rotary_pos_emb_ if c["in_place"] else impl.apply_rotary_pos_emb
    q_out, k_out = fn(q, k, cos, sin, unsqueeze_dim=c["unsqueeze_dim"])
    if c["in_place"]:
        assert q_out is q and k_out is k
    cs, sn = cos.unsqueeze(c["unsqueeze_dim"]), sin.unsqueeze(c["unsqueeze_dim"])
    for out, x in ((q_out, q0), (k_out, k0)):
        assert out.shape == x.shape and out.dtype == x.dtype
        ref = rotary_float64(x, cs, sn, "neox")
        assert_within(out, ref, rope_magnitude(x, cs, sn, "neox"), 4, "apply_rotary_pos_emb")  # three roundings


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["hf"])
@given(c=hf_case())
def test_apply_rotary_pos_emb(tk, c):
    prop_hf_rope(P.KernelImpl(tk), c)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(c=hf_case())
def test_apply_rotary_pos_emb_on_cpu(impl, c):
    prop_hf_rope(cpu_impl(impl), c)


# ---- vLLM's rotary_embedding (positions index a cos_sin_cache; in place) ----

@st.composite
def cached_case(draw):
    c = draw(qk_case())
    c.update(R=2 * draw(st.integers(1, c["d"] // 2)), cache_fp32=draw(st.booleans()), is_neox=draw(st.booleans()),
             three_d=draw(st.booleans()), P=draw(st.integers(1, 300)))
    return c


def prop_rotary_embedding(impl, c):
    impl.prepare()
    v = P.Values(c["seed"], impl.device)
    q4, k4 = make_qk(v, c)
    T, d = c["B"] * c["S"], c["d"]
    query, key = q4.flatten(0, 1), k4.flatten(0, 1)  # [T, H, d] views
    if not c["three_d"]:
        query, key = query.flatten(1), key.flatten(1)  # [T, H * d]
    a = v.uniform((c["P"], c["R"] // 2), torch.float32, -200.0, 200.0)
    cache = torch.cat((a.cos(), a.sin()), -1).to(torch.float32 if c["cache_fp32"] else c["dtype"])
    positions = v.ints(c["P"], (T,))
    q0, k0 = query.clone(), key.clone()
    out = impl.rotary_embedding(positions, query, key, d, cache, c["is_neox"])
    assert out[0] is query and out[1] is key
    cos, sin = cache.index_select(0, positions).chunk(2, -1)
    cos, sin = (torch.cat((t, t), -1) if c["is_neox"] else t.repeat_interleave(2, -1) for t in (cos, sin))
    style = "neox" if c["is_neox"] else "interleaved"
    one_rounding = c["cache_fp32"] and c["dtype"] != torch.float32
    for ours, x0, H in ((query, q0, c["Hq"]), (key, k0, c["Hk"])):
        x = x0.reshape(T, H, d)
        cs, sn = cos[:, None], sin[:, None]
        assert_within(ours.reshape(T, H, d), rotary_float64(x, cs, sn, style), rope_magnitude(x, cs, sn, style),
                      2 if one_rounding else 4, "rotary_embedding")


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["cached"])
@given(c=cached_case())
def test_rotary_embedding(tk, c):
    prop_rotary_embedding(P.KernelImpl(tk), c)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(c=cached_case())
def test_rotary_embedding_on_cpu(impl, c):
    prop_rotary_embedding(cpu_impl(impl), c)


# ---- diffusers' interleaved forms (fp32 tables, one rounding): LTX-Video and Flux ----

@st.composite
def interleaved_case(draw):
    c = draw(qk_case(max_heads=6))
    c.update(form=draw(st.sampled_from(["ltx", "flux"])), table_pad=draw(st.sampled_from([0, 0, 4, 2])))
    return c


def prop_interleaved(impl, c):
    impl.prepare()
    v = P.Values(c["seed"], impl.device)
    B, S, d = c["B"], c["S"], c["d"]
    if c["form"] == "ltx":  # [B, S, C] (q and k alike): the whole hidden is one row of pairs
        q, k = (t.flatten(-2) for t in make_qk(v, dict(c, Hk=c["Hq"])))
        cos, sin = interleaved_tables(v, B, S, q.shape[-1], c["table_pad"])
        q_out, k_out = impl.ltx_rope(q, k, cos, sin)
        cs, sn = cos, sin
    else:  # Flux: [B, S, H, d] with [S, d] tables shared by the heads
        q, k = make_qk(v, c)
        cos, sin = interleaved_tables(v, 1, S, d, c["table_pad"])
        cos, sin = cos[0], sin[0]
        q_out, k_out = impl.flux_rope(q, k, cos, sin)
        cs, sn = cos[None, :, None], sin[None, :, None]
    for out, x in ((q_out, q), (k_out, k)):
        assert out.shape == x.shape and out.dtype == x.dtype
        assert_within(out, rotary_float64(x, cs, sn, "interleaved"), rope_magnitude(x, cs, sn, "interleaved"), 2,
                      f"{c['form']} rotary")  # fp32 math, one rounding


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["interleaved"])
@given(c=interleaved_case())
def test_interleaved_rotary(tk, c):
    prop_interleaved(P.KernelImpl(tk), c)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(c=interleaved_case())
def test_interleaved_rotary_on_cpu(impl, c):
    prop_interleaved(cpu_impl(impl), c)


# ---- LTX-Video's forms with cos/sin computed from the token coordinates ----

@st.composite
def ltx_coords_case(draw):
    return dict(B=draw(st.integers(1, 3)), S=draw(st.integers(0, 40)), C=2 * draw(st.integers(1, 1100)),
                dtype=draw(P.dtypes), seed=draw(P.seeds), grid_shared=draw(st.booleans()),
                norm=draw(st.booleans()), offset=draw(st.sampled_from([0, 2, 4])), weight_fp32=draw(st.booleans()),
                grid_view=draw(st.booleans()))


def prop_ltx_coords(impl, c):
    impl.prepare()
    v = P.Values(c["seed"], impl.device)
    B, S, C, dtype, off = c["B"], c["S"], c["C"], c["dtype"], c["offset"]
    qkv = v.normal((B, S, off + 3 * C), dtype)[..., off:]
    q, k = qkv[..., :C], qkv[..., C: 2 * C]
    Bg = 1 if c["grid_shared"] else B
    if c["grid_view"]:  # diffusers' grid is a transposed view of [B, 3, S]
        grid = v.uniform((Bg, 3, S), torch.float32, 0.0, 1.0).transpose(1, 2)
    else:
        grid = v.uniform((Bg, S, 3), torch.float32, 0.0, 1.0)
    freqs = v.uniform((C // 6,), torch.float32, 1.0, 100.0) * (math.pi / 2)
    cos32, sin32 = ltx_tables_from_coords(grid, freqs, C)
    cos64, sin64 = ltx_tables_float64(grid, freqs, C)
    if c["norm"]:
        wdt = torch.float32 if c["weight_fp32"] else dtype
        qw, kw = v.uniform((C,), wdt, 0.5, 1.5), v.uniform((C,), wdt, 0.5, 1.5)
        q_out, k_out = impl.ltx_qk_norm_rope_from_coords(q, k, qw, kw, 1e-6, grid, freqs)
        for out, x, w in ((q_out, q, qw), (k_out, k, kw)):
            n64 = rms64_then(x, w, 1e-6)
            mag = rope_magnitude(n64.to(dtype), cos32, sin32, "interleaved")
            ref = rotary_float64(n64, cos64, sin64, "interleaved")
            assert_within(out, ref, mag, 3.5, "ltx_qk_norm_rope_from_coords")
    else:
        q_out, k_out = impl.ltx_rope_from_coords(q, k, grid, freqs)
        for out, x in ((q_out, q), (k_out, k)):
            mag = rope_magnitude(x, cos32, sin32, "interleaved")
            assert_within(out, rotary_float64(x, cos64, sin64, "interleaved"), mag, 2, "ltx_rope_from_coords")


@pytest.mark.gpu
@P.budget(KERNEL_EXAMPLES["ltx_coords"])
@given(c=ltx_coords_case())
def test_ltx_coords(tk, c):
    prop_ltx_coords(P.KernelImpl(tk), c)


@pytest.mark.parametrize("impl", P.CPU_IMPLS)
@P.budget(P.CPU_EXAMPLES)
@given(c=ltx_coords_case())
def test_ltx_coords_on_cpu(impl, c):
    prop_ltx_coords(cpu_impl(impl), c)
