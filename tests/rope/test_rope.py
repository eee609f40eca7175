"""Rotary embeddings: transformers' apply_rotary_pos_emb (NeoX, strided q/k from a fused QKV,
GQA, partial rotary, in place), LTX-Video's and Flux's interleaved fp32 forms, vLLM's
rotary_embedding, LTX's form with cos/sin computed from coordinates; float64 accuracy, parity with
the libraries' eager code, bad inputs, opcheck, torch.compile. (The fused q/k norm + RoPE, which
composes this rotation, is tested in tests/qk_norm_rope/.)"""

import pytest
import torch

from helpers import (
    DTYPES,
    assert_all_written,
    assert_matches_eager,
    assert_rejects,
    assert_within,
    random_input,
    rope_magnitude,
    with_poisoned_outputs,
)
from reference.rope import (
    diffusers_interleaved_rotary,
    hf_apply_rotary_pos_emb,
    ltx_tables_float64,
    rotary_float64,
    vllm_rotary_embedding_native,
)
from rope_cases import LTX_COORD_SOURCES, hf_cos_sin, ltx_coords_and_tables, ltx_cos_sin

pytestmark = pytest.mark.gpu


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


# ---- LTX-Video with cos/sin computed from the token coordinates ----

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
    "ltx_coords_grid_fp16": (lambda t: t.ltx_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64), _bf(1, 4, 3).half(),
                                                                    _f32(10)),
                             TypeError, "grid must have dtype"),
    "ltx_coords_grid_axes": (lambda t: t.ltx_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64), _f32(1, 4, 2),
                                                                    _f32(10)),
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
