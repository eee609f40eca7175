"""Rotary embeddings: transformers' apply_rotary_pos_emb (NeoX, strided q/k from a fused QKV,
GQA, partial rotary, in place), LTX-Video's and Flux's interleaved fp32 forms, the fused q/k norm +
RoPE of LTX-Video, Flux and Qwen3, LTX's forms with cos/sin computed from coordinates; float64
accuracy, parity with the libraries' eager code, bad inputs, opcheck, torch.compile."""

import math

import pytest
import torch

from helpers import (
    DTYPES,
    assert_all_written,
    assert_matches_eager,
    assert_rejects,
    assert_within,
    poisoned,
    random_input,
    rope_magnitude,
    with_poisoned_outputs,
)
from reference.norms import rms_norm_float64
from rope_cases import ltx_coords_and_tables
from reference.rope import (
    diffusers_interleaved_rotary,
    diffusers_qk_norm_rope,
    hf_apply_rotary_pos_emb,
    hf_qk_norm_rope,
    hf_qk_norm_rope_float64,
    ltx_tables_float64,
    rotary_float64,
    vllm_rotary_embedding_native,
)

pytestmark = pytest.mark.gpu


def hf_cos_sin(B, S, rotary_dim, dtype, theta=500000.0):
    """As transformers' LlamaRotaryEmbedding builds them, at random non-monotonic positions."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device="cuda").float() / rotary_dim))
    positions = torch.randint(0, 8192, (B, S), device="cuda").float()
    freqs = positions[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def fused_qkv(B, S, Hq, Hk, d, dtype):
    """q, k as transformers gets them: views of one projection, transposed to [B, H, S, d]."""
    qkv = random_input((B, S, (Hq + 2 * Hk) * d), dtype)
    q = qkv[..., : Hq * d].view(B, S, Hq, d).transpose(1, 2)
    k = qkv[..., Hq * d: (Hq + Hk) * d].view(B, S, Hk, d).transpose(1, 2)
    return q, k


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [64, 128, 256])
# Heads a token: 40 and 8 (groups of two heads share the token's cos/sin; with 7 + 1 a group holds
# q's last head and k's), 10, and 7 (odd: one head a group).
@pytest.mark.parametrize("heads", [(32, 8), (7, 1), (5, 5), (5, 2)])
@pytest.mark.parametrize("partial", [False, True])
def test_hf_apply_rotary_pos_emb(tk, dtype, d, heads, partial):
    B, S = 2, 37
    q, k = fused_qkv(B, S, *heads, d, dtype)
    cos, sin = hf_cos_sin(B, S, d // 2 if partial else d, dtype)
    q_out, k_out = tk.apply_rotary_pos_emb(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    q_eager, k_eager = hf_apply_rotary_pos_emb(q, k, cos, sin)
    for ours, eager, x in ((q_out, q_eager, q), (k_out, k_eager, k)):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        ref = rotary_float64(x, c, s, "neox")
        mag = rope_magnitude(x, c, s, "neox")
        assert_within(ours, ref, mag, 3.5, "rope vs float64")  # three roundings: x*cos, rot*sin, sum
        assert_matches_eager(ours, eager, mag, 4)
    # in place on the views of the fused projection gives the same values and leaves v alone
    qkv = q._base.clone()  # the fused projection q and k are views of
    q2, k2 = (qkv.as_strided(t.shape, t.stride(), t.storage_offset()) for t in (q, k))
    v_before = qkv[..., (heads[0] + heads[1]) * d:].clone()
    tk.apply_rotary_pos_emb_(q2, k2, cos, sin)
    assert torch.equal(q2, q_out) and torch.equal(k2, k_out)
    assert torch.equal(qkv[..., (heads[0] + heads[1]) * d:], v_before)


def ltx_cos_sin(B, S, C):
    """fp32 tables like LTXVideoRotaryPosEmbed: pairs repeated, identity channels prepended when
    C % 6 != 0."""
    freqs = torch.rand(B, S, C // 6 * 3, device="cuda") * 2 * math.pi
    cos, sin = freqs.cos().repeat_interleave(2, dim=-1), freqs.sin().repeat_interleave(2, dim=-1)
    pad = C - cos.shape[-1]
    if pad:
        cos = torch.cat([torch.ones(B, S, pad, device="cuda"), cos], dim=-1)
        sin = torch.cat([torch.zeros(B, S, pad, device="cuda"), sin], dim=-1)
    return cos, sin


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("C", [2048, 4096, 96])
def test_ltx_rope(tk, dtype, C):
    B, S = 2, 301
    q, k = random_input((B, S, C), dtype), random_input((B, S, C), dtype)
    cos, sin = ltx_cos_sin(B, S, C)
    q_out, k_out = tk.ltx_rope(q, k, cos, sin)
    for ours, x in ((q_out, q), (k_out, k)):
        eager = diffusers_interleaved_rotary(x, cos, sin)
        mag = rope_magnitude(x, cos, sin, "interleaved")
        assert_within(ours, rotary_float64(x, cos, sin, "interleaved"), mag, 1.5, "ltx rope vs float64")
        assert_matches_eager(ours, eager, mag, 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H", [24, 3])  # 3: a group of two heads holds q's last head and k's first
def test_flux_rope(tk, dtype, H):
    B, S, d = 1, 512, 128
    q, k = random_input((B, S, H, d), dtype), random_input((B, S, H, d), dtype)
    freqs = torch.rand(S, d // 2, device="cuda") * 100
    cos, sin = freqs.cos().repeat_interleave(2, -1), freqs.sin().repeat_interleave(2, -1)
    q_out, k_out = tk.flux_rope(q, k, cos, sin)
    for ours, x in ((q_out, q), (k_out, k)):
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        eager = diffusers_interleaved_rotary(x, c, s)
        mag = rope_magnitude(x, c, s, "interleaved")
        assert_within(ours, rotary_float64(x, c, s, "interleaved"), mag, 1.5, "flux rope vs float64")
        assert_matches_eager(ours, eager, mag, 2)


def test_unaligned_and_odd_layouts(tk):
    """Misaligned pointers and odd strides take the pair-by-pair path and give the same result."""
    B, S, H, d = 2, 9, 3, 64
    buf = random_input((B * S * H * d + 1,), torch.bfloat16)
    q = buf[1:].view(B, S, H, d)
    k = random_input((B, S, H, d), torch.bfloat16)
    cos, sin = hf_cos_sin(B, S, d, torch.bfloat16)
    q_out, _ = tk.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    q_eager, _ = hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    assert_matches_eager(q_out, q_eager, rope_magnitude(q, cos.unsqueeze(2), sin.unsqueeze(2), "neox"), 4)


def vllm_cos_sin_cache(max_position, rotary_dim, dtype, theta=10000.0):
    """As vLLM's RotaryEmbedding._compute_cos_sin_cache builds it: R/2 cosines then R/2 sines per row."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device="cuda").float() / rotary_dim))
    freqs = torch.outer(torch.arange(max_position, device="cuda").float(), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


def full_width_tables(cache, positions, is_neox):
    """The cache rows of the positions as full-width cos/sin [T, R] (one entry per element)."""
    c, s = cache[positions].chunk(2, dim=-1)
    if is_neox:
        return torch.cat((c, c), -1), torch.cat((s, s), -1)
    return c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cache_fp32", [False, True], ids=["cache_model_dtype", "cache_fp32"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("partial", [False, True], ids=["full", "partial"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_vllm_rotary_embedding(tk, dtype, cache_fp32, is_neox, partial, d):
    T, Hq, Hk, P = 37, 7, 1, 4096
    qkv = random_input((T, (Hq + 2 * Hk) * d), dtype)
    q, k = qkv[:, : Hq * d], qkv[:, Hq * d: (Hq + Hk) * d]  # in place on views of a fused projection
    q0, k0, v0 = q.clone(), k.clone(), qkv[:, (Hq + Hk) * d:].clone()
    R = d // 2 if partial else d
    cache = vllm_cos_sin_cache(P, R, torch.float32 if cache_fp32 else dtype)
    positions = torch.randint(0, P, (T,), device="cuda")  # not monotonic
    out = tk.rotary_embedding(positions, q, k, d, cache, is_neox)
    assert out[0] is q and out[1] is k
    cos, sin = full_width_tables(cache, positions, is_neox)
    style = "neox" if is_neox else "interleaved"
    for ours, x0, H in ((q, q0, Hq), (k, k0, Hk)):
        x = x0.view(T, H, d)
        c, s_ = cos[:, None], sin[:, None]
        ulps = 1.5 if (cache_fp32 and dtype != torch.float32) else 3.5  # one rounding, or three
        assert_within(ours.view(T, H, d), rotary_float64(x, c, s_, style), rope_magnitude(x, c, s_, style), ulps,
                      "rotary_embedding vs float64")
    assert torch.equal(qkv[:, (Hq + Hk) * d:], v0)  # v untouched
    if cache.dtype == dtype:  # per-op rounding in the model dtype, as vLLM's own code: same bits
        q_vllm, k_vllm = vllm_rotary_embedding_native(positions, q0, k0, d, cache, is_neox)
        assert torch.equal(q, q_vllm) and torch.equal(k, k_vllm)
    if is_neox and not cache_fp32:  # vLLM's per-op rounding is transformers' rounding: same bits
        q_hf, k_hf = tk.apply_rotary_pos_emb(q0.view(1, T, Hq, d), k0.view(1, T, Hk, d), cos[None], sin[None],
                                             unsqueeze_dim=2)
        assert torch.equal(q.view(1, T, Hq, d), q_hf) and torch.equal(k.view(1, T, Hk, d), k_hf)


def test_vllm_rotary_embedding_out_of_range_positions_give_nan(tk):
    T, H, d, P = 6, 2, 64, 16
    q, k = random_input((T, H * d), torch.bfloat16), random_input((T, H * d), torch.bfloat16)
    positions = torch.tensor([0, -1, 3, P, 15, P + 100], device="cuda")
    tk.rotary_embedding(positions, q, k, d, vllm_cos_sin_cache(P, d, torch.bfloat16))
    bad = torch.tensor([False, True, False, True, False, True], device="cuda")
    for t in (q, k):
        assert t[bad].isnan().all() and t[~bad].isfinite().all()


def test_vllm_rotary_embedding_opcheck_and_compile(tk):
    T, d = 16, 64
    positions = torch.randint(0, 128, (T,), device="cuda")
    cache = vllm_cos_sin_cache(128, d, torch.bfloat16)
    q, k = random_input((T, 4 * d), torch.bfloat16), random_input((T, 2 * d), torch.bfloat16)
    torch.library.opcheck(tk.ops.rope_cached_.default, (positions, q.clone(), k.clone(), d, cache, "neox"))
    torch._dynamo.reset()

    def f(q, k):
        q, k = q.clone(), k.clone()
        return tk.rotary_embedding(positions, q, k, d, cache)

    for a, b in zip(torch.compile(f, fullgraph=True)(q, k), f(q, k)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def check_qk_norm_rope(ours, x, weight, eps, cos, sin):
    """float64 bound (the norm's rounding, then one rounding of the rotation) and eager parity."""
    n64 = torch.nn.functional.rms_norm(x.double(), (x.shape[-1],), weight.double(), eps)
    ref = rotary_float64(n64, cos, sin, "interleaved")
    mag = rope_magnitude(n64.to(x.dtype), cos, sin, "interleaved")
    assert_within(ours, ref, mag, 3, "qk_norm_rope vs float64")
    # Two roundings may land differently from eager: the normalized value (its fp32 sum of squares
    # is added in another order, so inv_rms can differ in the last bit) and the rotation.
    assert_matches_eager(ours, diffusers_qk_norm_rope(x, x, weight, weight, eps, cos, sin)[0], mag, 4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight_fp32", [False, True], ids=["w_model_dtype", "w_fp32"])
@pytest.mark.parametrize("C", [2048, 4096, 96, 32768])
@pytest.mark.parametrize("shared_tables", [False, True])
@pytest.mark.parametrize("offset", [0, 2], ids=["aligned", "pair_aligned"])  # 2: the one-pair-per-vector path
def test_ltx_qk_norm_rope(tk, dtype, weight_fp32, C, shared_tables, offset):
    """q's and k's rows of a token share one thread group and its cos/sin loads."""
    B, S, eps = 2, 19, 1e-6
    if dtype == torch.float32:
        C = min(C, 16384)  # the widest row kept in registers: 4096 vectors of 4 floats
    if offset:
        C = min(C, 8192)  # and on the narrow path: 4096 vectors of one pair
    qkv = random_input((B, S, offset + 3 * C), dtype)[..., offset:]
    q, k = qkv[..., :C], qkv[..., C: 2 * C]  # views of the fused projection
    wq, wk = (torch.rand(C, device="cuda") + 0.5 for _ in range(2))
    if not weight_fp32:
        wq, wk = wq.to(dtype), wk.to(dtype)
    cos, sin = ltx_cos_sin(1 if shared_tables else B, S, C)
    q_out, k_out = tk.ltx_qk_norm_rope(q, k, wq, wk, eps, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    check_qk_norm_rope(q_out, q, wq, eps, cos, sin)
    check_qk_norm_rope(k_out, k, wk, eps, cos, sin)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("offset", [0, 2], ids=["aligned", "pair_aligned"])  # 2: the one-pair-per-vector path
def test_qk_norm_rope(tk, dtype, d, offset):
    B, S, H, eps = 2, 23, 3, 1e-6
    qkv = random_input((B, S, offset + 3 * H * d), dtype)[..., offset:]
    q = qkv[..., : H * d].unflatten(-1, (H, d))
    k = qkv[..., H * d: 2 * H * d].unflatten(-1, (H, d))
    wq, wk = ((torch.rand(d, device="cuda") + 0.5).to(dtype) for _ in range(2))
    angles = torch.rand(S, d // 2, device="cuda") * 100
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    q_out, k_out = tk.qk_norm_rope(q, k, wq, wk, eps, cos, sin)
    check_qk_norm_rope(q_out, q, wq, eps, cos[None, :, None], sin[None, :, None])
    check_qk_norm_rope(k_out, k, wk, eps, cos[None, :, None], sin[None, :, None])


def test_qk_norm_rope_empty_opcheck_and_compile(tk):
    q = torch.empty(2, 0, 1, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(256, device="cuda", dtype=torch.bfloat16)
    t = torch.empty(2, 0, 256, device="cuda")
    assert tk.ops.qk_norm_rope(q, q, w, w, 1e-6, t, t)[0].shape == q.shape
    q, k = random_input((2, 8, 1, 256), torch.bfloat16), random_input((2, 8, 1, 256), torch.bfloat16)
    cos, sin = ltx_cos_sin(2, 8, 256)
    torch.library.opcheck(tk.ops.qk_norm_rope.default, (q, k, w, w, 1e-6, cos, sin))
    torch._dynamo.reset()
    f = torch.compile(lambda q, k: tk.ltx_qk_norm_rope(q, k, w, w, 1e-6, cos, sin), fullgraph=True)
    for a, b in zip(f(q[:, :, 0], k[:, :, 0]), tk.ltx_qk_norm_rope(q[:, :, 0], k[:, :, 0], w, w, 1e-6, cos, sin)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---- LTX-Video with cos/sin computed from the token coordinates ----

LTX_COORD_SOURCES = ["scaled_grid", "video_coords", "large_angles"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("C", [2048, 4096, 96, 100, 98, 8])  # C % 6: 2, 4, 0, 4, 2, 2 identity channels
@pytest.mark.parametrize("source", LTX_COORD_SOURCES)
@pytest.mark.parametrize("offset", [0, 1], ids=["vectors", "pairs"])  # 1: the pair-by-pair path
def test_ltx_rope_from_coords(tk, dtype, C, source, offset):
    """The same bits as ltx_rope with the module's tables; float64 and eager bounds."""
    B, F, H, W = 2, 3, 5, 7
    grid, freqs, cos, sin = ltx_coords_and_tables(B, F, H, W, C, source)
    S = grid.shape[1]
    qkv = random_input((B, S, offset + 3 * C), dtype)[..., offset:]
    q, k = qkv[..., :C], qkv[..., C: 2 * C]  # views of the fused projection
    q_out, k_out = with_poisoned_outputs(lambda: tk.ltx_rope_from_coords(q, k, grid, freqs), q, k)
    assert_all_written(q_out, k_out)
    q_tab, k_tab = tk.ltx_rope(q, k, cos, sin)
    assert torch.equal(q_out, q_tab) and torch.equal(k_out, k_tab), "differs from the table form"
    cos64, sin64 = ltx_tables_float64(grid, freqs, C)
    for ours, x in ((q_out, q), (k_out, k)):
        mag = rope_magnitude(x, cos, sin, "interleaved")
        assert_within(ours, rotary_float64(x, cos64, sin64, "interleaved"), mag, 1.5, "ltx coords rope vs float64")
        assert_matches_eager(ours, diffusers_interleaved_rotary(x, cos, sin), mag, 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight_fp32", [False, True], ids=["w_model_dtype", "w_fp32"])
@pytest.mark.parametrize("C", [2048, 4096, 96, 100, 98, 16384])
@pytest.mark.parametrize("layout", ["grid_per_batch", "grid_shared", "pair_aligned"])
def test_ltx_qk_norm_rope_from_coords(tk, dtype, weight_fp32, C, layout):
    """The same bits as ltx_qk_norm_rope with the module's tables (each row is reduced by the same
    lanes in the same order), on every lane-group width; float64 and eager bounds."""
    B, F, H, W, eps = 2, 2, 3, 5, 1e-6
    offset = 2 if layout == "pair_aligned" else 0  # q, k not 16-byte aligned: one pair per vector
    if offset:
        C = min(C, 4096)  # the widest row the narrow path holds is 8192
    source = LTX_COORD_SOURCES[["grid_per_batch", "grid_shared", "pair_aligned"].index(layout)]
    grid, freqs, cos, sin = ltx_coords_and_tables(1 if layout == "grid_shared" else B, F, H, W, C, source)
    S = grid.shape[1]
    qkv = random_input((B, S, offset + 3 * C), dtype)[..., offset:]
    q, k = qkv[..., :C], qkv[..., C: 2 * C]
    wq, wk = (torch.rand(C, device="cuda") + 0.5 for _ in range(2))
    if not weight_fp32:
        wq, wk = wq.to(dtype), wk.to(dtype)
    q_out, k_out = with_poisoned_outputs(lambda: tk.ltx_qk_norm_rope_from_coords(q, k, wq, wk, eps, grid, freqs), q, k)
    assert_all_written(q_out, k_out)
    q_tab, k_tab = tk.ltx_qk_norm_rope(q, k, wq, wk, eps, cos, sin)
    assert torch.equal(q_out, q_tab) and torch.equal(k_out, k_tab), "differs from the table form"
    check_qk_norm_rope(q_out, q, wq, eps, cos, sin)
    check_qk_norm_rope(k_out, k, wk, eps, cos, sin)


def test_ltx_from_coords_empty_opcheck_and_compile(tk):
    C, bf16 = 2048, dict(device="cuda", dtype=torch.bfloat16)
    w = torch.ones(C, **bf16)
    freqs = torch.rand(C // 6, device="cuda")
    for B, S in ((2, 0), (0, 3)):
        q, grid = torch.empty(B, S, C, **bf16), torch.rand(B, S, 3, device="cuda")
        assert tk.ltx_rope_from_coords(q, q, grid, freqs)[0].shape == q.shape
        assert tk.ltx_qk_norm_rope_from_coords(q, q, w, w, 1e-6, grid, freqs)[1].shape == q.shape
    grid, freqs, _, _ = ltx_coords_and_tables(2, 2, 2, 2, C, "scaled_grid")  # grid: a transposed view
    q, k = random_input((2, 8, C), torch.bfloat16), random_input((2, 8, C), torch.bfloat16)
    torch.library.opcheck(tk.ops.ltx_rope_from_coords.default, (q, k, grid, freqs))
    torch.library.opcheck(tk.ops.ltx_qk_norm_rope_from_coords.default, (q, k, w, w, 1e-6, grid, freqs))
    torch._dynamo.reset()

    def attention_inputs(q, k):
        q, k = tk.ltx_qk_norm_rope_from_coords(q, k, w, w, 1e-6, grid, freqs)
        return tk.ltx_rope_from_coords(q, k, grid, freqs)

    for a, b in zip(torch.compile(attention_inputs, fullgraph=True)(q, k), attention_inputs(q, k)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


QWEN3_THETA = 1000000.0  # Qwen3's rope_theta


def qwen3_qk(B, S, Hq, Hk, d, dtype, offset=0, make=random_input):
    """q [B, S, Hq, d], k [B, S, Hk, d] as Qwen3's attention views its projections before the
    norms, here views of one fused QKV projection; `offset` elements into the buffer misaligns
    every pointer and row stride (the element-by-element path)."""
    qkv = make((B, S, offset + (Hq + 2 * Hk) * d), dtype)[..., offset:]
    return qkv[..., : Hq * d].unflatten(-1, (Hq, d)), qkv[..., Hq * d: (Hq + Hk) * d].unflatten(-1, (Hk, d))


def norm_weight(d, dtype):
    return (torch.rand(d, device="cuda") + 0.5).to(dtype)  # not ones: a dropped weight would show


def check_hf_qk_norm_rope(ours, x, weight, eps, cos, sin, eager):
    """float64 bound and eager parity of one of q, k ([B, S, H, d]); cos/sin [B or 1, S, d]."""
    assert ours.shape == x.shape and ours.dtype == x.dtype
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    mag = rope_magnitude(rms_norm_float64(x, weight, eps), c, s, "neox")
    # five roundings on the way: x * inv_rms, weight * that, n * cos, rotate_half(n) * sin, the sum
    assert_within(ours, hf_qk_norm_rope_float64(x, weight, eps, cos, sin), mag, 4.5, "hf_qk_norm_rope vs float64")
    # Eager rounds at the same points; only inv_rms may differ in its last bit (the fp32 sum of
    # squares is added in another order), and a flipped rounding of x * inv_rms grows through the
    # chain to at most 8 u of the magnitude: 2 ulp after the weight, then each product and the sum.
    assert_matches_eager(ours, eager, mag, 8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("heads", [(32, 8), (7, 1), (5, 3)], ids=["gqa_32_8", "odd_7_1", "odd_5_3"])
@pytest.mark.parametrize("shared_tables", [False, True], ids=["tables_per_batch", "tables_shared"])
def test_hf_qk_norm_rope(tk, dtype, d, heads, shared_tables):
    B, S, eps = 2, 37, 1e-6
    q, k = qwen3_qk(B, S, *heads, d, dtype)
    q0, k0 = q.clone(), k.clone()
    wq, wk = norm_weight(d, dtype), norm_weight(d, dtype)
    cos, sin = hf_cos_sin(1 if shared_tables else B, S, d, dtype, QWEN3_THETA)  # random, non-monotonic positions
    q_out, k_out = tk.hf_qk_norm_rope(q, k, wq, wk, eps, cos, sin)
    assert q_out.is_contiguous() and k_out.is_contiguous()
    q_eager, k_eager = hf_qk_norm_rope(q, k, wq, wk, eps, cos, sin)
    check_hf_qk_norm_rope(q_out, q, wq, eps, cos, sin, q_eager)
    check_hf_qk_norm_rope(k_out, k, wk, eps, cos, sin, k_eager)
    assert torch.equal(q, q0) and torch.equal(k, k0), "the inputs changed"
    # out= form into NaN-poisoned outputs: every element written, the same bits
    outs = poisoned(q.shape, dtype), poisoned(k.shape, dtype)
    assert tk.hf_qk_norm_rope(q, k, wq, wk, eps, cos, sin, out=outs) == outs
    assert_all_written(*outs)
    assert torch.equal(outs[0], q_out) and torch.equal(outs[1], k_out)


def exact_square_sums(shape, dtype, device="cuda"):
    """Values m/16 with 1 <= |m| <= 64, exact in every dtype, whose squares add up exactly in fp32 in
    any order (multiples of 2^-8 below 2^12 for rows up to 256): inv_rms is then the eager one, and
    so is every rounding after it."""
    m = torch.randint(1, 65, shape, device=device) * (torch.randint(0, 2, shape, device=device) * 2 - 1)
    return (m.float() / 16).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("offset", [0, 1], ids=["vectors", "elements"])
def test_hf_qk_norm_rope_equals_eager_bit_for_bit(tk, dtype, d, offset):
    """Where the sum of squares cannot round differently, the result is eager's, bit for bit."""
    B, S, Hq, Hk, eps = 2, 19, 6, 2, 1e-6
    q, k = qwen3_qk(B, S, Hq, Hk, d, dtype, offset, make=exact_square_sums)
    wq, wk = norm_weight(d, dtype), norm_weight(d, dtype)
    cos, sin = hf_cos_sin(B, S, d, dtype, QWEN3_THETA)
    for ours, eager in zip(tk.hf_qk_norm_rope(q, k, wq, wk, eps, cos, sin),
                           hf_qk_norm_rope(q, k, wq, wk, eps, cos, sin)):
        assert torch.equal(ours, eager), f"{(ours != eager).sum().item()} elements differ from eager"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [2, 18, 40, 72, 512, 1024, 4096])  # every lane-group width, odd half widths
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "unaligned"])
def test_hf_qk_norm_rope_widths_and_layouts(tk, dtype, d, offset):
    """Head widths from one pair to the widest the element-by-element path holds, misaligned
    pointers, tables that are strided views, and outputs written straight into the [B, H, S, d]
    layout the attention takes."""
    B, S, Hq, Hk, eps = 2, 5, 3, 1, 1e-5
    q, k = qwen3_qk(B, S, Hq, Hk, d, dtype, offset)
    wq, wk = norm_weight(d, dtype), norm_weight(d, dtype)
    cos_full, sin_full = hf_cos_sin(B, S + 1, d, dtype, QWEN3_THETA)
    cos, sin = cos_full[:, 1:], sin_full[:, 1:]  # leading strides of an [B, S + 1, d] table
    outs = (poisoned((B, Hq, S, d), dtype).transpose(1, 2), poisoned((B, Hk, S, d), dtype).transpose(1, 2))
    tk.hf_qk_norm_rope(q, k, wq, wk, eps, cos, sin, out=outs)
    assert_all_written(*outs)
    q_eager, k_eager = hf_qk_norm_rope(q, k, wq, wk, eps, cos, sin)
    check_hf_qk_norm_rope(outs[0], q, wq, eps, cos, sin, q_eager)
    check_hf_qk_norm_rope(outs[1], k, wk, eps, cos, sin, k_eager)


def test_hf_qk_norm_rope_empty(tk):
    d = 128
    w = norm_weight(d, torch.bfloat16)
    for B, S, Hq, Hk in ((2, 0, 4, 2), (0, 3, 4, 2)):
        q, k = qwen3_qk(B, S, Hq, Hk, d, torch.bfloat16)
        cos, sin = hf_cos_sin(B, S, d, torch.bfloat16)
        q_out, k_out = tk.hf_qk_norm_rope(q, k, w, w, 1e-6, cos, sin)
        assert q_out.shape == q.shape and k_out.shape == k.shape
    # no k heads: q's rows are still all done
    q, k = qwen3_qk(2, 3, 4, 0, d, torch.bfloat16)
    cos, sin = hf_cos_sin(2, 3, d, torch.bfloat16)
    q_out, k_out = tk.hf_qk_norm_rope(q, k, w, w, 1e-6, cos, sin)
    assert k_out.shape == k.shape
    check_hf_qk_norm_rope(q_out, q, w, 1e-6, cos, sin, hf_qk_norm_rope(q, k, w, w, 1e-6, cos, sin)[0])


def test_hf_qk_norm_rope_opcheck_and_compile(tk):
    q, k = qwen3_qk(2, 8, 4, 2, 128, torch.bfloat16)
    wq, wk = norm_weight(128, torch.bfloat16), norm_weight(128, torch.bfloat16)
    cos, sin = hf_cos_sin(2, 8, 128, torch.bfloat16, QWEN3_THETA)
    torch.library.opcheck(tk.ops.hf_qk_norm_rope.default, (q, k, wq, wk, 1e-6, cos, sin))
    outs = (poisoned(q.shape, torch.bfloat16), poisoned(k.shape, torch.bfloat16))
    torch.library.opcheck(tk.ops.hf_qk_norm_rope_out.default, (*outs, q, k, wq, wk, 1e-6, cos, sin))
    torch._dynamo.reset()

    def attention_inputs(q, k):  # as Qwen3's attention uses it: the [B, H, S, d] views
        q, k = tk.hf_qk_norm_rope(q, k, wq, wk, 1e-6, cos, sin)
        return q.transpose(1, 2), k.transpose(1, 2)

    for a, b in zip(torch.compile(attention_inputs, fullgraph=True)(q, k), attention_inputs(q, k)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _bf(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def _f32(*shape):
    return torch.rand(*shape, device="cuda")



def _vllm(t, positions=None, query=None, key=None, cache=None):
    """vLLM's rotary_embedding on 4 tokens, 2 query heads and 1 key head of 64, a [32, 64] cache;
    the argument given replaces the valid one."""
    positions = torch.zeros(4, dtype=torch.long, device="cuda") if positions is None else positions
    return t.rotary_embedding(positions, _bf(4, 128) if query is None else query, _bf(4, 64) if key is None else key,
                              64, _bf(32, 64) if cache is None else cache)


BAD = {
    "odd_rotary": (lambda t: t.ops.rope(_bf(1, 4, 2, 64), _bf(1, 4, 2, 64), _bf(1, 4, 63), _bf(1, 4, 63), "neox", False),
                   ValueError, "must be even"),
    "rotary_wider_than_head": (lambda t: t.ops.rope(_bf(1, 4, 2, 64), _bf(1, 4, 2, 64), _bf(1, 4, 128),
                                                    _bf(1, 4, 128), "neox", False), ValueError, "at most head_dim"),
    "fp32_tables_without_fp32_math": (lambda t: t.apply_rotary_pos_emb(_bf(1, 2, 4, 64), _bf(1, 2, 4, 64),
                                                                       _bf(1, 4, 64).float(), _bf(1, 4, 64).float()),
                                      TypeError, "cos must have dtype"),
    "k_head_dim": (lambda t: t.ops.rope(_bf(1, 4, 2, 64), _bf(1, 4, 2, 32), _bf(1, 4, 64), _bf(1, 4, 64), "neox", False),
                   ValueError, "k must be"),
    "q_3d": (lambda t: t.ops.rope(_bf(4, 2, 64), _bf(1, 4, 2, 64), _bf(1, 4, 64), _bf(1, 4, 64), "neox", False),
             ValueError, "q must be 4-D"),
    "style": (lambda t: t.ops.rope(_bf(1, 4, 2, 64), _bf(1, 4, 2, 64), _bf(1, 4, 64), _bf(1, 4, 64), "gptj", False),
              ValueError, "style must be"),
    "cos_seq_len": (lambda t: t.apply_rotary_pos_emb(_bf(1, 2, 4, 64), _bf(1, 2, 4, 64), _bf(1, 5, 64), _bf(1, 5, 64)),
                    ValueError, "cos must be"),
    "in_place_q_is_k": (lambda t: (lambda x: t.apply_rotary_pos_emb_(x, x, _bf(1, 4, 64), _bf(1, 4, 64)))(
        _bf(1, 2, 4, 64)), ValueError, "q must not share memory with k"),
    "in_place_k_overlaps_q": (lambda t: (lambda qkv: t.apply_rotary_pos_emb_(
        qkv[..., :128].unflatten(-1, (2, 64)), qkv[..., 127:255].unflatten(-1, (2, 64)), _bf(1, 4, 64), _bf(1, 4, 64),
        unsqueeze_dim=2))(
        _bf(1, 4, 384)), ValueError, "q must not share memory with k"),
    "hf_unsqueeze_dim": (lambda t: t.apply_rotary_pos_emb(_bf(1, 2, 4, 64), _bf(1, 2, 4, 64), _bf(1, 4, 64),
                                                          _bf(1, 4, 64), unsqueeze_dim=3),
                         ValueError, "unsqueeze_dim must be 1"),
    "hf_q_3d": (lambda t: t.apply_rotary_pos_emb(_bf(2, 4, 64), _bf(1, 2, 4, 64), _bf(1, 4, 64), _bf(1, 4, 64)),
                ValueError, "q must be 4-D"),
    "hf_in_place_k_3d": (lambda t: t.apply_rotary_pos_emb_(_bf(1, 2, 4, 64), _bf(2, 4, 64), _bf(1, 4, 64),
                                                           _bf(1, 4, 64)), ValueError, "k must be 4-D"),
    "vllm_positions_int32": (lambda t: _vllm(t, positions=torch.zeros(4, dtype=torch.int32, device="cuda")),
                             TypeError, "positions must have dtype"),
    "vllm_positions_count": (lambda t: _vllm(t, positions=torch.zeros(5, dtype=torch.long, device="cuda")),
                             ValueError, "one entry per token"),
    "vllm_head_size": (lambda t: _vllm(t, query=_bf(4, 100)), ValueError, "query must be"),
    "vllm_cache_odd": (lambda t: _vllm(t, cache=_bf(32, 63)), ValueError, "rotary_dim even"),
    "vllm_cache_wider_than_head": (lambda t: _vllm(t, cache=_bf(32, 128)), ValueError, "at most head_size"),
    "vllm_cache_fp16": (lambda t: _vllm(t, cache=_bf(32, 64).half()), TypeError, "cos_sin_cache must have"),
    "qk_norm_rope_odd_width": (lambda t: t.ops.qk_norm_rope(_bf(1, 4, 1, 63), _bf(1, 4, 1, 63), _bf(63), _bf(63),
                                                            1e-6, _bf(1, 4, 63).float(), _bf(1, 4, 63).float()),
                               ValueError, "must be even"),
    "qk_norm_rope_bf16_tables": (lambda t: t.ltx_qk_norm_rope(_bf(1, 4, 64), _bf(1, 4, 64), _bf(64), _bf(64), 1e-6,
                                                              _bf(1, 4, 64), _bf(1, 4, 64)),
                                 TypeError, "cos must have dtype"),
    "qk_norm_rope_weight_size": (lambda t: t.ltx_qk_norm_rope(_bf(1, 4, 64), _bf(1, 4, 64), _bf(32), _bf(64), 1e-6,
                                                              _bf(1, 4, 64).float(), _bf(1, 4, 64).float()),
                                 ValueError, "q_weight must be a contiguous"),
    "qk_norm_rope_too_wide": (lambda t: t.ltx_qk_norm_rope(_bf(1, 1, 32770), _bf(1, 1, 32770), _bf(32770),
                                                           _bf(32770), 1e-6, _bf(1, 1, 32770).float(),
                                                           _bf(1, 1, 32770).float()),
                              ValueError, r"rows of more than \d+ elements"),
    "qk_norm_rope_odd_offset": (lambda t: (lambda x: t.ltx_qk_norm_rope(x[..., 1:65], x[..., 65:129], _bf(64),
                                                                        _bf(64), 1e-6, _bf(1, 4, 64).float(),
                                                                        _bf(1, 4, 64).float()))(_bf(1, 4, 130)),
                                ValueError, "even element offsets"),
    "qk_norm_rope_eps": (lambda t: t.ltx_qk_norm_rope(_bf(1, 4, 64), _bf(1, 4, 64), _bf(64), _bf(64), -1.0,
                                                      _bf(1, 4, 64).float(), _bf(1, 4, 64).float()),
                         ValueError, "eps must be"),
    "ltx_coords_grid_fp16": (lambda t: t.ltx_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64), _bf(1, 4, 3).half(),
                                                                    _f32(10)),
                             TypeError, "grid must have dtype"),
    "ltx_coords_grid_axes": (lambda t: t.ltx_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64), _f32(1, 4, 2),
                                                                    _f32(10)),
                             ValueError, r"grid must be \[B or 1, S, 3\]"),
    "ltx_coords_grid_seq_len": (lambda t: t.ltx_qk_norm_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64), _bf(64),
                                                                         _bf(64), 1e-6, _f32(1, 5, 3), _f32(10)),
                                ValueError, r"grid must be \[B or 1, S, 3\]"),
    "ltx_coords_grid_batch": (lambda t: t.ltx_rope_from_coords(_bf(2, 4, 64), _bf(2, 4, 64), _f32(3, 4, 3),
                                                                     _f32(10)),
                              ValueError, r"grid must be \[B or 1, S, 3\]"),
    "ltx_coords_freqs_count": (lambda t: t.ltx_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64), _f32(1, 4, 3),
                                                                      _f32(11)),
                               ValueError, r"freqs must be a contiguous \[C // 6\] = \[10\]"),
    "ltx_coords_freqs_strided": (lambda t: t.ltx_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64), _f32(1, 4, 3),
                                                                        _f32(20)[::2]),
                                 ValueError, "freqs must be a contiguous"),
    "ltx_coords_freqs_fp64": (lambda t: t.ltx_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64), _f32(1, 4, 3),
                                                                     _f32(10).double()),
                              TypeError, "freqs must have dtype"),
    "ltx_coords_q_4d": (lambda t: t.ltx_rope_from_coords(_bf(1, 4, 1, 64), _bf(1, 4, 1, 64), _f32(1, 4, 3),
                                                               _f32(10)),
                        ValueError, r"q must be 3-D \[B, S, C\]"),
    "ltx_coords_k_shape": (lambda t: t.ltx_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 32), _f32(1, 4, 3),
                                                                  _f32(10)),
                           ValueError, "k must have the shape of q"),
    "ltx_coords_k_dtype": (lambda t: t.ltx_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64).half(), _f32(1, 4, 3),
                                                                  _f32(10)),
                           TypeError, "k must have dtype"),
    "ltx_coords_odd_width": (lambda t: t.ltx_rope_from_coords(_bf(1, 4, 63), _bf(1, 4, 63), _f32(1, 4, 3),
                                                                    _f32(10)),
                             ValueError, "must be even"),
    "ltx_coords_q_last_dim_strided": (lambda t: t.ltx_rope_from_coords(_bf(1, 64, 4).transpose(1, 2),
                                                                             _bf(1, 4, 64), _f32(1, 4, 3), _f32(10)),
                                      ValueError, "q must be contiguous in its last dimension"),
    "ltx_coords_int_q": (lambda t: t.ltx_rope_from_coords(torch.ones(1, 4, 64, dtype=torch.int32, device="cuda"),
                                                                _bf(1, 4, 64), _f32(1, 4, 3), _f32(10)),
                         TypeError, "q must be float32, float16 or bfloat16"),
    "ltx_coords_grid_cpu": (lambda t: t.ltx_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64), torch.rand(1, 4, 3),
                                                                   _f32(10)),
                            ValueError, r"grid must be on the same device as q \(cuda:0\), got cpu"),
    "ltx_coords_cpu": (lambda t: t.ltx_qk_norm_rope_from_coords(torch.randn(1, 4, 64), torch.randn(1, 4, 64),
                                                                torch.randn(64), torch.randn(64), 1e-6,
                                                                torch.rand(1, 4, 3), torch.rand(10)),
                       ValueError, "ltx_qk_norm_rope_from_coords: q must be a CUDA tensor"),
    "ltx_coords_weight_size": (lambda t: t.ltx_qk_norm_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64), _bf(32),
                                                                        _bf(64), 1e-6, _f32(1, 4, 3), _f32(10)),
                               ValueError, "q_weight must be a contiguous"),
    "ltx_coords_weight_dtypes": (lambda t: t.ltx_qk_norm_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64), _bf(64),
                                                                          _f32(64), 1e-6, _f32(1, 4, 3), _f32(10)),
                                 TypeError, "q_weight and k_weight must have the same dtype"),
    "ltx_coords_eps": (lambda t: t.ltx_qk_norm_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64), _bf(64), _bf(64), -1.0,
                                                                _f32(1, 4, 3), _f32(10)),
                       ValueError, "eps must be"),
    "ltx_coords_odd_offset": (lambda t: (lambda x: t.ltx_qk_norm_rope_from_coords(
        x[..., 1:65], x[..., 65:129], _bf(64), _bf(64), 1e-6, _f32(1, 4, 3), _f32(10)))(_bf(1, 4, 130)),
        ValueError, "q, k and the weights must start at even element offsets"),
    "ltx_coords_too_wide": (lambda t: t.ltx_qk_norm_rope_from_coords(_bf(1, 1, 32770), _bf(1, 1, 32770), _bf(32770),
                                                                     _bf(32770), 1e-6, _f32(1, 1, 3), _f32(5461)),
                            ValueError, r"rows of more than \d+ elements"),
    "qwen3_fp32_tables": (lambda t: t.hf_qk_norm_rope(_bf(1, 4, 2, 64), _bf(1, 4, 1, 64), _bf(64), _bf(64), 1e-6,
                                                          _bf(1, 4, 64).float(), _bf(1, 4, 64).float()),
                          TypeError, "cos must have dtype"),
    "qwen3_fp32_weight": (lambda t: t.hf_qk_norm_rope(_bf(1, 4, 2, 64), _bf(1, 4, 1, 64), _bf(64).float(),
                                                          _bf(64).float(), 1e-6, _bf(1, 4, 64), _bf(1, 4, 64)),
                          TypeError, "q_weight must have dtype"),
    "qwen3_k_dtype": (lambda t: t.hf_qk_norm_rope(_bf(1, 4, 2, 64), _bf(1, 4, 1, 64).half(), _bf(64), _bf(64), 1e-6,
                                                      _bf(1, 4, 64), _bf(1, 4, 64)),
                      TypeError, "k must have dtype"),
    "qwen3_int_q": (lambda t: t.hf_qk_norm_rope(torch.ones(1, 4, 2, 64, dtype=torch.int32, device="cuda"),
                                                    _bf(1, 4, 1, 64), _bf(64), _bf(64), 1e-6, _bf(1, 4, 64),
                                                    _bf(1, 4, 64)),
                    TypeError, "q must be float32, float16 or bfloat16"),
    "qwen3_k_seq_len": (lambda t: t.hf_qk_norm_rope(_bf(1, 4, 2, 64), _bf(1, 5, 1, 64), _bf(64), _bf(64), 1e-6,
                                                        _bf(1, 4, 64), _bf(1, 4, 64)),
                        ValueError, "k must be"),
    "qwen3_q_last_dim_strided": (lambda t: t.hf_qk_norm_rope(_bf(1, 4, 64, 2).transpose(-1, -2), _bf(1, 4, 1, 64),
                                                                 _bf(64), _bf(64), 1e-6, _bf(1, 4, 64), _bf(1, 4, 64)),
                                 ValueError, "q must be contiguous in its last dimension"),
    "qwen3_table_width": (lambda t: t.hf_qk_norm_rope(_bf(1, 4, 2, 64), _bf(1, 4, 1, 64), _bf(64), _bf(64), 1e-6,
                                                          _bf(1, 4, 32), _bf(1, 4, 32)),
                          ValueError, "cos must cover"),
    "qwen3_table_seq_len": (lambda t: t.hf_qk_norm_rope(_bf(1, 4, 2, 64), _bf(1, 4, 1, 64), _bf(64), _bf(64), 1e-6,
                                                            _bf(1, 5, 64), _bf(1, 5, 64)),
                            ValueError, "cos must be"),
    "qwen3_sin_shape": (lambda t: t.hf_qk_norm_rope(_bf(2, 4, 2, 64), _bf(2, 4, 1, 64), _bf(64), _bf(64), 1e-6,
                                                        _bf(1, 4, 64), _bf(2, 4, 64)),
                        ValueError, "sin must have the shape of cos"),
    "qwen3_odd_width": (lambda t: t.hf_qk_norm_rope(_bf(1, 4, 2, 63), _bf(1, 4, 1, 63), _bf(63), _bf(63), 1e-6,
                                                        _bf(1, 4, 63), _bf(1, 4, 63)),
                        ValueError, "must be even"),
    "qwen3_weight_size": (lambda t: t.hf_qk_norm_rope(_bf(1, 4, 2, 64), _bf(1, 4, 1, 64), _bf(64), _bf(128),
                                                          1e-6, _bf(1, 4, 64), _bf(1, 4, 64)),
                          ValueError, "k_weight must be a contiguous"),
    "qwen3_eps": (lambda t: t.hf_qk_norm_rope(_bf(1, 4, 2, 64), _bf(1, 4, 1, 64), _bf(64), _bf(64), float("nan"),
                                                  _bf(1, 4, 64), _bf(1, 4, 64)),
                  ValueError, "eps must be"),
    "qwen3_too_wide_unaligned": (lambda t: (lambda x: t.hf_qk_norm_rope(
        x[..., 1:4099].unflatten(-1, (1, 4098)), x[..., 4099:].unflatten(-1, (1, 4098)), _bf(4098), _bf(4098), 1e-6,
        _bf(1, 1, 4098), _bf(1, 1, 4098)))(_bf(1, 1, 8197)),
        ValueError, r"rows of more than 4096 elements"),
    "qwen3_out_shape": (lambda t: t.hf_qk_norm_rope(_bf(1, 4, 2, 64), _bf(1, 4, 1, 64), _bf(64), _bf(64), 1e-6,
                                                        _bf(1, 4, 64), _bf(1, 4, 64), out=(_bf(1, 4, 1, 64),
                                                                                           _bf(1, 4, 1, 64))),
                        ValueError, "q_out must have the shape"),
    "qwen3_out_dtype": (lambda t: t.hf_qk_norm_rope(_bf(1, 4, 2, 64), _bf(1, 4, 1, 64), _bf(64), _bf(64), 1e-6,
                                                        _bf(1, 4, 64), _bf(1, 4, 64), out=(_bf(1, 4, 2, 64),
                                                                                           _bf(1, 4, 1, 64).float())),
                        TypeError, "k_out must have dtype"),
    "qwen3_out_is_input": (lambda t: (lambda q, k: t.hf_qk_norm_rope(q, k, _bf(64), _bf(64), 1e-6, _bf(1, 4, 64),
                                                                        _bf(1, 4, 64), out=(q, k)))(
        _bf(1, 4, 2, 64), _bf(1, 4, 1, 64)), ValueError, "q_out must not share memory with q"),
    "qwen3_outs_overlap": (lambda t: (lambda o: t.hf_qk_norm_rope(_bf(1, 4, 2, 64), _bf(1, 4, 2, 64), _bf(64),
                                                                     _bf(64), 1e-6, _bf(1, 4, 64), _bf(1, 4, 64),
                                                                     out=(o, o)))(_bf(1, 4, 2, 64)),
                           ValueError, "k_out must not share memory with q_out"),
    "qwen3_out_not_a_pair": (lambda t: t.hf_qk_norm_rope(_bf(1, 4, 2, 64), _bf(1, 4, 1, 64), _bf(64), _bf(64), 1e-6,
                                                             _bf(1, 4, 64), _bf(1, 4, 64), out=_bf(1, 4, 2, 64)),
                             TypeError, r"out must be a \(q_out, k_out\) pair"),
    "qwen3_cpu": (lambda t: t.hf_qk_norm_rope(torch.randn(1, 4, 2, 64), torch.randn(1, 4, 1, 64), torch.randn(64),
                                                  torch.randn(64), 1e-6, torch.randn(1, 4, 64), torch.randn(1, 4, 64)),
                  ValueError, "hf_qk_norm_rope: q must be a CUDA tensor"),
    "cpu": (lambda t: t.apply_rotary_pos_emb(torch.randn(1, 2, 4, 64), torch.randn(1, 2, 4, 64),
                                             torch.randn(1, 4, 64), torch.randn(1, 4, 64)), ValueError,
            "q must be a CUDA tensor"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_clear_error(tk, case):
    call, exc, message = BAD[case]
    assert_rejects(lambda: call(tk), exc, message)


def test_opcheck_and_compile(tk):
    q, k = _bf(2, 16, 4, 64), _bf(2, 16, 2, 64)
    cos, sin = hf_cos_sin(2, 16, 64, torch.bfloat16)
    torch.library.opcheck(tk.ops.rope.default, (q, k, cos, sin, "neox", False))
    torch.library.opcheck(tk.ops.rope_.default, (q.clone(), k.clone(), cos.float(), sin.float(), "interleaved", True))
    # transformers' layout: q [B, H, S, d] as a transposed view of a [B, S, H, d] projection
    qh, kh = q.transpose(1, 2), k.transpose(1, 2)
    for dim, (qa, ka) in {1: (qh, kh), 2: (q, k)}.items():
        torch.library.opcheck(tk.ops.hf_rope.default, (qa, ka, cos, sin, dim))
        torch.library.opcheck(tk.ops.hf_rope_.default, (qa.clone(), ka.clone(), cos, sin, dim))
    torch._dynamo.reset()
    for dim, (qa, ka) in {1: (qh, kh), 2: (q, k)}.items():
        f = torch.compile(lambda q, k: tk.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=dim), fullgraph=True)
        for a, b in zip(f(qa, ka), tk.apply_rotary_pos_emb(qa, ka, cos, sin, unsqueeze_dim=dim)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
            assert a.stride() == b.stride()


def test_hf_layouts_give_the_same_bits(tk):
    """unsqueeze_dim=1 on [B, H, S, d] views and 2 on [B, S, H, d] rotate the same tokens the same way,
    in place and out of place, and return q and k in the layout they came in."""
    q, k = _bf(2, 9, 5, 128), _bf(2, 9, 3, 128)
    cos, sin = hf_cos_sin(2, 9, 128, torch.bfloat16)
    q2, k2 = tk.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    q1, k1 = tk.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    assert q1.shape == (2, 5, 9, 128) and k1.shape == (2, 3, 9, 128)
    assert torch.equal(q1.transpose(1, 2), q2) and torch.equal(k1.transpose(1, 2), k2)
    qi, ki = q.transpose(1, 2).clone(), k.transpose(1, 2).clone()
    assert tk.apply_rotary_pos_emb_(qi, ki, cos, sin)[0] is qi
    assert torch.equal(qi, q1) and torch.equal(ki, k1)
