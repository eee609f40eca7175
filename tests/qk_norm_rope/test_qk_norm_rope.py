"""The fused q/k norm + RoPE: LTX-Video's across heads (tables, and cos/sin computed from the token
coordinates), Flux's per head and Qwen3's (transformers' q_norm/k_norm then apply_rotary_pos_emb,
with its out= form); float64 accuracy, parity with the libraries' eager code, bad inputs, opcheck,
torch.compile. The rotation and its inputs are the rope family's (tests/rope/). These tests moved
from tests/rope/test_rope.py and draw the data they drew there (SEED_FILE)."""

import pytest
import torch

from families import family_module
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
from reference.rope import (
    diffusers_qk_norm_rope,
    hf_qk_norm_rope,
    hf_qk_norm_rope_float64,
    rotary_float64,
)

pytestmark = pytest.mark.gpu
SEED_FILE = "test_rope.py"  # (conftest.node_seed)

rope_cases = family_module("rope", "cases")
LTX_COORD_SOURCES, hf_cos_sin = rope_cases.LTX_COORD_SOURCES, rope_cases.hf_cos_sin
ltx_coords_and_tables, ltx_cos_sin = rope_cases.ltx_coords_and_tables, rope_cases.ltx_cos_sin


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


# ---- Qwen3: transformers' q_norm / k_norm, then apply_rotary_pos_emb ----

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


# ---- bad inputs ----

def _bf(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def _f32(*shape):
    return torch.rand(*shape, device="cuda")


BAD = {
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
    "ltx_coords_grid_seq_len": (lambda t: t.ltx_qk_norm_rope_from_coords(_bf(1, 4, 64), _bf(1, 4, 64), _bf(64),
                                                                         _bf(64), 1e-6, _f32(1, 5, 3), _f32(10)),
                                ValueError, r"grid must be \[B or 1, S, 3\]"),
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
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_clear_error(tk, case):
    call, exc, message = BAD[case]
    assert_rejects(lambda: call(tk), exc, message)
