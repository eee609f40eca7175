"""Property tests of the rotary embeddings against float64 (see tests/properties.py): random batch,
tokens (some none), query and key heads (GQA, odd counts, no key heads), head widths, partial
rotary widths, layouts (views of one fused QKV projection, offset pointers, transformers' [B, H, S, d]
views), tables per batch or shared and strided, in place and out of place, model-dtype and fp32
tables, vLLM's cache with random positions, the fused q/k norm forms and LTX's coordinate forms.

Budgets (examples a test): KERNEL_EXAMPLES on the GPU, properties.CPU_EXAMPLES with eager code here."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import properties as P
from helpers import assert_within, rope_magnitude
from reference.norms import rms_norm_float64
from reference.rope import (
    diffusers_interleaved_rotary,
    hf_apply_rotary_pos_emb,
    hf_qk_norm_rope,
    hf_qk_norm_rope_float64,
    ltx_tables_float64,
    ltx_tables_from_coords,
    rotary_float64,
    vllm_rotary_embedding_native,
)

KERNEL_EXAMPLES = {"hf": 300, "cached": 200, "interleaved": 150, "qk_norm": 200, "hf_qk_norm": 200, "ltx_coords": 150}


def rms64_then(x, w, eps):
    return torch.nn.functional.rms_norm(x.double(), (x.shape[-1],), w.double(), eps)


def torch_rms(x, w, eps):
    """torch.nn.RMSNorm (diffusers' norm_q / norm_k): fp32 math, the weight in fp32, one rounding."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


class EagerRope(P.Impl):
    """The eager code each op replaces."""

    def apply_rotary_pos_emb(self, q, k, cos, sin, unsqueeze_dim=1):
        return hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)

    def apply_rotary_pos_emb_(self, q, k, cos, sin, unsqueeze_dim=1):
        q_out, k_out = hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
        q.copy_(q_out)
        k.copy_(k_out)
        return q, k

    def rotary_embedding(self, positions, query, key, head_size, cache, is_neox=True):
        if query.shape[0] == 0:  # no tokens (vLLM's code cannot view them)
            return query, key
        if cache.dtype == query.dtype:  # vLLM's own per-op rounding
            q_out, k_out = vllm_rotary_embedding_native(positions, query, key, head_size, cache, is_neox)
        else:  # an fp32 cache: fp32 math, one rounding
            c, s = cache.index_select(0, positions).chunk(2, dim=-1)
            c, s = (torch.cat((t, t), -1) if is_neox else t.repeat_interleave(2, -1) for t in (c, s))

            def apply(x):
                x3 = x.reshape(x.shape[0], x[0].numel() // head_size, head_size)
                r = c.shape[-1]
                rot = rotary_float64(x3[..., :r].float(), c[:, None], s[:, None], "neox" if is_neox else "interleaved")
                return torch.cat((rot.to(x.dtype), x3[..., r:]), -1).reshape(x.shape)

            q_out, k_out = apply(query), apply(key)
        query.copy_(q_out.reshape(query.shape))
        key.copy_(k_out.reshape(key.shape))
        return query, key

    def ltx_rope(self, q, k, cos, sin):
        return diffusers_interleaved_rotary(q, cos, sin), diffusers_interleaved_rotary(k, cos, sin)

    def flux_rope(self, q, k, cos, sin):
        c, s = cos[None, :, None], sin[None, :, None]
        return diffusers_interleaved_rotary(q, c, s), diffusers_interleaved_rotary(k, c, s)

    def ltx_qk_norm_rope(self, q, k, qw, kw, eps, cos, sin):
        return (diffusers_interleaved_rotary(torch_rms(q, qw, eps), cos, sin),
                diffusers_interleaved_rotary(torch_rms(k, kw, eps), cos, sin))

    def qk_norm_rope(self, q, k, qw, kw, eps, cos, sin):
        return self.ltx_qk_norm_rope(q, k, qw, kw, eps, cos[None, :, None], sin[None, :, None])

    def hf_qk_norm_rope(self, q, k, qw, kw, eps, cos, sin, out=None):
        q_out, k_out = hf_qk_norm_rope(q, k, qw, kw, eps, cos, sin)
        if out is None:
            return q_out, k_out
        out[0].copy_(q_out)
        out[1].copy_(k_out)
        return out

    def ltx_rope_from_coords(self, q, k, grid, freqs):
        return self.ltx_rope(q, k, *ltx_tables_from_coords(grid, freqs, q.shape[-1]))

    def ltx_qk_norm_rope_from_coords(self, q, k, qw, kw, eps, grid, freqs):
        return self.ltx_qk_norm_rope(q, k, qw, kw, eps, *ltx_tables_from_coords(grid, freqs, q.shape[-1]))


EAGER = EagerRope()


def cpu_impl(name):
    return EAGER if name == "eager" else P.PackageOnCpu()


# ---- strategies ----

head_widths = st.one_of(st.sampled_from([2, 8, 18, 32, 40, 64, 72, 96, 128, 256]),
                        st.integers(1, 256).map(lambda n: 2 * n))
QK_LAYOUTS = ("fused", "separate", "offset")


@st.composite
def qk_case(draw, max_heads=8, pair_offsets=False, widths=head_widths):
    """B, S, Hq, Hk, d and how q and k are laid out: views of one fused projection (optionally offset),
    or separate tensors (optionally offset)."""
    return dict(B=draw(st.integers(1, 3)), S=draw(st.integers(0, 24)), Hq=draw(st.integers(1, max_heads)),
                Hk=draw(st.integers(0, 4)), d=draw(widths), dtype=draw(P.dtypes), seed=draw(P.seeds),
                layout=draw(st.sampled_from(QK_LAYOUTS)),
                offset=draw(st.sampled_from([2, 4, 6]) if pair_offsets else st.integers(1, 7)))


def make_qk(v, c, dtype=None):
    """q [B, S, Hq, d], k [B, S, Hk, d]."""
    B, S, Hq, Hk, d, dt = c["B"], c["S"], c["Hq"], c["Hk"], c["d"], dtype or c["dtype"]
    if c["layout"] == "separate":
        return v.normal((B, S, Hq, d), dt), v.normal((B, S, Hk, d), dt)
    off = c["offset"] if c["layout"] == "offset" else 0
    qkv = v.normal((B, S, off + (Hq + 2 * Hk) * d), dt)[..., off:]
    return qkv[..., : Hq * d].unflatten(-1, (Hq, d)), qkv[..., Hq * d: (Hq + Hk) * d].unflatten(-1, (Hk, d))


def neox_tables(v, B, S, R, dtype, pad):
    """cos/sin [B, S, R] as transformers builds them (NeoX halves repeat), rows padded by `pad`."""
    a = v.uniform((B, S, R // 2), torch.float32, -200.0, 200.0)
    a = torch.cat((a, a), -1)
    return P.place(a.cos().to(dtype), ("padded", pad) if pad else ("contiguous", 0)), \
        P.place(a.sin().to(dtype), ("padded", pad) if pad else ("contiguous", 0))


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

def interleaved_tables(v, B, S, width, pad):
    a = v.uniform((B, S, width // 2), torch.float32, -200.0, 200.0).repeat_interleave(2, -1)
    lay = ("padded", pad) if pad else ("contiguous", 0)
    return P.place(a.cos(), lay), P.place(a.sin(), lay)


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
