"""attention_8bit: non-causal attention with INT8 q·kᵀ (k smoothed by its mean) and FP8 p·v.

Three references (reference/attention.py): exact attention in float64, SDPA's math backend for what
special values give, and the emulation of the kernel's quantization and tiling, which the CPU tests
check against float64 (the tiling and scaling math exactly, with the quantizations switched off; the
error each quantization costs, with them on) and the GPU tests hold the kernel to, tightly.

The kernel has two forms of p·v (csrc/attention/attention_8bit.cu): FP8 (e4m3 p and v) on sm_89,
16-bit tensor cores (p rounded to v's dtype, v as given) on sm_90 and later; the GPU tests hold it
to the emulation of the form it runs (kernel_values()).

The error bounds against float64 are what each form gives, measured on the emulation (QUALITY).
The FP8 form does not reach the issue's 0.9995 cosine on unstructured inputs: e4m3's 3-bit
mantissa on p and v costs about 3.5 % relative L2 there (test_fp8_pv_sets_the_error_floor); the
16-bit form does. Outlier channels of k (and of q) coarsen the INT8 grid of the other channels; the
channel balance between q and k (reference.attention.channel_balance) halves what that costs.

GPU tests are marked (and skip below compute capability 8.9, which the op refuses); their outputs
are allocated from NaN (conftest.poison_outputs), so an element the kernel does not write fails the
finiteness checks. The fake, the layouts, the refusals on meta and the CPU rejection run anywhere."""

import math
import re

import pytest
import torch
import torch.nn.functional as F

from conftest import FULL_CHECKOUT, HAS_GPU

if not FULL_CHECKOUT:
    pytest.skip("reference/ is not in this source set", allow_module_level=True)

from reference.attention import (  # noqa: E402
    E4M3_MAX,
    KEY_BLOCK,
    LOG2E,
    VALUES,
    attention_8bit_emulation,
    attention_reference,
    channel_balance,
    cosine_and_rel_l2,
    emulate_attention_8bit,
    key_blocks,
    quantize_k_blocks,
    quantize_q,
    quantize_v,
    smooth_k,
)

FP8_GPU = HAS_GPU and torch.cuda.get_device_capability() >= (8, 9)


def fp8_gpu(test):
    """A GPU test (skipped without one: conftest) that also skips below compute capability 8.9."""
    below = pytest.mark.skipif(HAS_GPU and not FP8_GPU, reason="attention_8bit needs compute capability 8.9+")
    return pytest.mark.gpu(below(test))


DTYPES16 = [torch.float16, torch.bfloat16]
HEAD_DIMS = [64, 128]
FORMS = ["e4m3", "input"]  # the kernel's two forms of p·v (reference.attention.emulate_attention_8bit)


def kernel_values() -> str:
    """The form of p·v the binding runs on this GPU (attention_8bit.cu): FP8 where mma.sync takes
    e4m3 natively (compute capability 8.9), 16-bit tensor cores elsewhere (sm_90 and later)."""
    return "e4m3" if torch.cuda.get_device_capability() == (8, 9) else "input"

# ---- inputs ----

KINDS = ("gaussian", "keys_structured", "qk_structured")


def draw(kind, B, H, Sq, Sk, D):
    """float32 q, k, v [B, H, S, D] from torch's generator (seeded by the test's node id: conftest),
    on the CPU. ``gaussian``: N(0, 1). ``keys_structured``: k with +20 on all keys in 4 channels (a
    per-channel mean, which the smoothing removes) and 3 outlier channels x10. ``qk_structured``: q
    likewise, on the same channels (the scores' outliers multiply)."""
    q, k, v = torch.randn(B, H, Sq, D), torch.randn(B, H, Sk, D), torch.randn(B, H, Sk, D)
    if kind != "gaussian":
        channels = torch.randperm(D)[:7]
        k[..., channels[:4]] += 20
        k[..., channels[4:]] *= 10
        if kind == "qk_structured":
            q[..., channels[:4]] += 20
            q[..., channels[4:]] *= 10
    return q, k, v


def placed(t, layout, dtype, device):
    """t [B, H, S, D] in a layout: ``heads`` (contiguous [B, H, S, D]) or ``tokens`` (diffusers' [B, S, H, D]
    memory, transposed)."""
    if layout == "heads":
        return t.to(device, dtype).contiguous()
    return t.transpose(1, 2).to(device, dtype).contiguous().transpose(1, 2)


def inputs(kind, shape, D, dtype, layout="heads", device="cuda"):
    B, H, Sq, Sk = shape
    return tuple(placed(t, layout, dtype, device) for t in draw(kind, B, H, Sq, Sk, D))


def fused_qkv(B, H, S, D, dtype, device="cuda"):
    """q, k, v as views of one fused projection's output [B, S, 3, H, D] (strided heads and tokens)."""
    fused = torch.randn(B, S, 3, H, D).to(device, dtype)
    return tuple(fused[:, :, i].transpose(1, 2) for i in range(3))


def expected_strides(q):
    """The layout the op allocates for q: [B, Sq, H, D] memory where q's heads are inner to its sequence."""
    B, H, Sq, D = q.shape
    if q.stride(1) < q.stride(2):
        return torch.empty(B, Sq, H, D, device="meta").transpose(1, 2).stride()
    return torch.empty(B, H, Sq, D, device="meta").stride()


# ---- the error bounds against float64 ----

# form -> kind -> (least cosine, largest relative L2) per (b, h) against float64, for Sq >= 64. Measured
# on the emulation (12 seeds x the shapes of QUALITY_SHAPES and three more, Sk 77-1000, D 64 and 128,
# fp16 and bf16), worst: e4m3 0.99915 / 0.041 (gaussian), 0.99899 / 0.045 (keys_structured), 0.9965 /
# 0.084 (qk_structured); input 0.99993 / 0.012, 0.99949 / 0.033, 0.9969 / 0.078. The bounds leave a
# third more relative error (1 - cosine goes with its square).
QUALITY = {"e4m3": {"gaussian": (0.9985, 0.055), "keys_structured": (0.998, 0.06), "qk_structured": (0.9935, 0.11)},
           "input": {"gaussian": (0.99985, 0.016), "keys_structured": (0.999, 0.044), "qk_structured": (0.994, 0.105)}}
QUALITY_SHAPES = [(1, 2, 512, 512), (2, 2, 256, 77)]  # (B, H, Sq, Sk): self-attention, cross-attention


def assert_quality(out, ref, kind, values, what):
    cos, rel = cosine_and_rel_l2(out.cpu(), ref.cpu(), dims=(-2, -1))
    least_cos, most_rel = QUALITY[values][kind]
    assert cos.min() >= least_cos and rel.max() <= most_rel, (
        f"{what}: per (b, h) least cosine {cos.min():.6f} (bound {least_cos}), largest relative L2 "
        f"{rel.max():.4f} (bound {most_rel})")


# Kernel against emulation. They compute the same codes but for float32 rounding order (the k mean's
# sum, exp2's approximation, the accumulators' order): now and then a code of p or v lands one step
# away (1/16 to 1/8 of the value in e4m3, 2^-8 in bf16), which moves an output by that step times its
# weight p / l, and an output's last bit may round the other way (1 ulp of bf16 everywhere: cosine
# 0.999998). The cosine is what tells a wrong recipe apart; on the emulation, at 512 x 512 x 64
# (before the channel balance): blocks of 32 or 128 keys 0.99924-0.99996, no smoothing 0.9980-0.99992,
# the scale 1 % off 0.99961-0.99997, the other form of p·v 0.99936-0.99957. The absolute bound
# catches wild elements.
EMULATION_ABS = 2e-2  # of max |out|
EMULATION_COS = 0.99999


def assert_matches_emulation(out, q, k, v, scale=None, what=""):
    want = attention_8bit_emulation(q.cpu(), k.cpu(), v.cpu(), scale, values=kernel_values())
    got = out.cpu()
    assert got.shape == want.shape and got.dtype == want.dtype, what
    assert got.isfinite().all(), f"{what}: non-finite outputs (NaN poison left?)"
    if got.numel() == 0:
        return
    err = (got.double() - want.double()).abs().max().item()
    top = want.double().abs().max().item()
    cos, _ = cosine_and_rel_l2(got, want)
    assert err <= EMULATION_ABS * top, f"{what}: max |kernel - emulation| {err:.4g} > {EMULATION_ABS} x {top:.4g}"
    assert cos >= EMULATION_COS, f"{what}: cosine to the emulation {cos:.7f} < {EMULATION_COS}"


# =========================== CPU: the emulation, its tiling and its error ===========================

def test_e4m3_cast_of_p_times_448_is_round_to_nearest_even():
    """What steps 3 and 5 assume of torch's float8_e4m3fn cast on [0, 448] (p in [0, 1] times 448):
    each value goes to the nearest e4m3 value, a tie to the even code; 448 stays 448, and values
    below half the least subnormal (2^-10) go to 0. Checked on every e4m3 value, every midpoint
    between two of them, the points just beside each midpoint, and random p."""
    table = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float().double()  # 0 .. 448
    assert table[-1] == E4M3_MAX and bool((table[1:] > table[:-1]).all())
    mids = (table[1:] + table[:-1]) / 2
    p = torch.rand(100_000, dtype=torch.float64)
    x = torch.cat([table, mids, mids * (1 + 2**-20), mids * (1 - 2**-20), p * E4M3_MAX,
                   torch.tensor([2.0**-10, 2.0**-11, 0.0])]).float()
    # nearest, ties to the even code (the code is the index in the table)
    hi = torch.searchsorted(table, x.double()).clamp(max=len(table) - 1)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = (x.double() - table[lo]).abs(), (table[hi] - x.double()).abs()
    pick = torch.where(d_lo < d_hi, lo, torch.where(d_hi < d_lo, hi, torch.where(lo % 2 == 0, lo, hi)))
    got = x.to(torch.float8_e4m3fn)
    assert torch.equal(got.view(torch.uint8).long(), pick), "torch's e4m3 cast is not round-to-nearest-even here"
    assert got[-3].float() == 0 and got[-2].float() == 0  # 2^-10: a tie between 0 and 2^-9, to 0
    assert (torch.ones(1) * E4M3_MAX).to(torch.float8_e4m3fn).float().item() == E4M3_MAX


def test_int8_codes_round_half_to_even_and_clamp():
    """Step 1: a row whose amax is 127 has scale 1 and codes round(q) with halves to even; an
    all-zero row gets scale 1 and zero codes; the largest magnitude lands on ±127."""
    q = torch.zeros(1, 1, 3, 64)
    q[0, 0, 0, :6] = torch.tensor([127.0, 2.5, 3.5, -2.5, -0.5, 1.5])
    q[0, 0, 2] = torch.randn(64) * 3
    codes, scale = quantize_q(q)
    assert scale[0, 0, 0, 0] == 1 and codes[0, 0, 0, :6].tolist() == [127, 2, 4, -2, -0.0, 2]
    assert scale[0, 0, 1, 0] == 1 and bool((codes[0, 0, 1] == 0).all())
    assert codes[0, 0, 2].abs().max() == 127
    assert scale[0, 0, 2, 0] == q[0, 0, 2].abs().max() / 127


@pytest.mark.parametrize("n_keys,blocks", [(1, [(0, 1)]), (64, [(0, 64)]), (65, [(0, 64), (64, 65)]),
                                            (130, [(0, 64), (64, 128), (128, 130)]), (0, [])])
def test_key_blocks(n_keys, blocks):
    assert KEY_BLOCK == 64
    assert [(b.start, b.stop) for b in key_blocks(n_keys)] == blocks


def test_k_scales_are_per_block_of_64_keys_over_all_channels():
    """Sk = 130, D = 64: three blocks, the last of two keys. Each block's scale is its own keys'
    amax (all channels) / 127 after the mean is subtracted; a key changes only its own block's
    scale and codes."""
    k = torch.randn(2, 3, 130, 64)
    ks, mean = smooth_k(k)
    assert torch.allclose(mean, k.mean(dim=-2, keepdim=True)) and mean.shape == (2, 3, 1, 64)
    codes, scale = quantize_k_blocks(ks)
    assert scale.shape == (2, 3, 3) and codes.shape == ks.shape
    for j, (lo, hi) in enumerate([(0, 64), (64, 128), (128, 130)]):
        assert torch.equal(scale[..., j], ks[..., lo:hi, :].abs().amax(dim=(-2, -1)) / 127)
        assert bool((codes[..., lo:hi, :].abs().amax(dim=(-2, -1)) == 127).all())
    bigger = ks.clone()
    bigger[1, 2, 129, 5] = 50.0  # in the partial last block
    codes2, scale2 = quantize_k_blocks(bigger)
    changed = (scale2 != scale).nonzero().tolist()
    assert changed == [[1, 2, 2]], changed
    assert torch.equal(codes2[..., :128, :], codes[..., :128, :])
    assert codes2[1, 2, 129, 5] == 127


def test_v_scales_are_per_channel_over_all_keys():
    v = torch.randn(1, 2, 130, 64)
    v[0, 1, :, 7] = 0  # a zero channel: scale 1, codes 0
    codes, scale = quantize_v(v)
    assert scale.shape == (1, 2, 1, 64)
    assert scale[0, 1, 0, 7] == 1 and bool((codes[0, 1, :, 7] == 0).all())
    amax = v.abs().amax(dim=-2, keepdim=True)
    nonzero = amax != 0
    assert torch.equal(scale[nonzero], (amax / 448)[nonzero])
    assert bool((codes.abs().amax(dim=-2)[nonzero.squeeze(-2)] == 448).all())


@pytest.mark.parametrize("Sq,Sk", [(1, 1), (77, 63), (77, 64), (77, 65), (33, 130), (64, 1000), (5, 1)])
@pytest.mark.parametrize("smooth", [False, True])
def test_tiling_and_scaling_math_is_exact_attention_without_quantization(Sq, Sk, smooth):
    """With the quantizations off, the emulation's log2-domain scores, online softmax over blocks of
    64 keys (the last partial) with its rescaling, and final division are attention itself: within
    float32 rounding of float64, whether or not k's mean is subtracted first (softmax's invariance)."""
    q, k, v = (t * 2 for t in draw("keys_structured", 2, 2, Sq, Sk, 64))
    out = emulate_attention_8bit(q, k, v, values="exact", int8_qk=False, smooth=smooth, out_dtype=torch.float32)
    ref = attention_reference(q, k, v)
    err = (out.double() - ref).abs().max().item()
    assert err <= 2e-5 * ref.abs().max().item(), err


def direct_formula(q, k, v, scale, values):
    """Steps 1-6 without blocks: every key's score at once, p against each row's global max, one
    product with v, one division (float32; the integer products exact)."""
    b = channel_balance(q, k)
    qc, qs = quantize_q(q.float() * b)
    kc, kscale = quantize_k_blocks(smooth_k(k)[0] / b)
    per_key = kscale.repeat_interleave(KEY_BLOCK, dim=-1)[..., :k.shape[-2]]
    s = (qc.double() @ kc.double().transpose(-1, -2)).float() * per_key[..., None, :] * (qs * scale * LOG2E)
    p = torch.exp2(s - s.amax(dim=-1, keepdim=True))
    if values == "e4m3":
        vc, vs = quantize_v(v)
        o = (p * 448).to(torch.float8_e4m3fn).float().double() @ vc.double()
        return o.float() / p.sum(dim=-1, keepdim=True) * vs / 448, s
    o = p.to(v.dtype).double() @ v.double()
    return o.float() / p.sum(dim=-1, keepdim=True), s


@pytest.mark.parametrize("values", FORMS)
def test_one_block_is_the_direct_formula(values):
    """Sk <= 64 (one block, all quantizations on): steps 4-6 are the direct formula with the row max
    subtracted once (alpha = exp2(-inf) = 0 on the first block)."""
    q, k, v = (t.to(torch.bfloat16) for t in draw("gaussian", 1, 2, 40, 37, 64))
    want, _ = direct_formula(q, k, v, 0.3, values)
    got = emulate_attention_8bit(q, k, v, 0.3, values=values, out_dtype=torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("values", FORMS)
def test_online_softmax_with_the_max_in_the_first_block_is_the_direct_formula(values):
    """Sk = 300 (five blocks, the last partial), each row's largest score in key 0: the running max
    never moves after the first block (alpha = 1), so every block's p is rounded against the global
    max, as the direct formula does: the online rescaling is exact there."""
    q, k, v = draw("gaussian", 1, 2, 50, 300, 64)
    q[..., 0] = 3 + q[..., 0].abs()
    k[..., 0, 0] = 40.0  # key 0 wins every row by a wide margin
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    want, s = direct_formula(q, k, v, 0.125, values)
    assert bool((s.argmax(dim=-1) == 0).all())
    got = emulate_attention_8bit(q, k, v, values=values, out_dtype=torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_smoothing_k_leaves_attention_unchanged_and_saves_the_int8_grid():
    """Subtracting k's per-channel mean adds q_i · mean to every score of row i: exact attention is
    unchanged. Keys with +20 in 4 channels: unsmoothed, the INT8 grid spends itself on the offset
    (about 5x the error of q·kᵀ's codes); smoothed, the error is that of the keys without the offset."""
    q, plain_k, v = draw("gaussian", 1, 4, 256, 256, 64)
    k = plain_k.clone()
    k[..., :4] += 20
    ref = attention_reference(q, k, v)
    k64 = k.double()
    assert torch.allclose(attention_reference(q, k64 - k64.mean(dim=-2, keepdim=True), v), ref, rtol=0, atol=1e-12)
    qk_only = dict(values="exact", out_dtype=torch.float32)
    _, smoothed = cosine_and_rel_l2(emulate_attention_8bit(q, k, v, **qk_only), ref)
    _, unsmoothed = cosine_and_rel_l2(emulate_attention_8bit(q, k, v, smooth=False, **qk_only), ref)
    _, plain = cosine_and_rel_l2(emulate_attention_8bit(q, plain_k, v, **qk_only), attention_reference(q, plain_k, v))
    assert unsmoothed >= 3 * smoothed and smoothed <= 1.5 * plain, (smoothed, unsmoothed, plain)


def test_channel_balance_leaves_the_scores_and_spares_the_other_channels():
    """q times b and the smoothed k divided by b per channel (b = sqrt(amax(k - mean) / amax q)):
    q·kᵀ is the same, and an outlier channel of k (x10) no longer sets the INT8 grid of the others
    alone. On keys_structured inputs, INT8 q·kᵀ's error halves (2.2-2.5x measured); on Gaussian
    inputs it changes little."""
    q, k, v = draw("keys_structured", 1, 4, 256, 256, 64)
    b = channel_balance(q, k)
    assert b.shape == (1, 4, 1, 64) and bool((b > 0).all())
    ks = smooth_k(k)[0]
    torch.testing.assert_close((q * b) @ (ks / b).transpose(-1, -2), q @ ks.transpose(-1, -2), rtol=1e-4, atol=1e-3)
    ref = attention_reference(q, k, v)
    qk_only = dict(values="exact", out_dtype=torch.float32)
    _, balanced = cosine_and_rel_l2(emulate_attention_8bit(q, k, v, **qk_only), ref)
    _, unbalanced = cosine_and_rel_l2(emulate_attention_8bit(q, k, v, balance=False, **qk_only), ref)
    assert unbalanced >= 1.7 * balanced, (balanced, unbalanced)


@pytest.mark.parametrize("D", [64, 128])
def test_q_smoothing_and_per_key_scales_close_the_qk_structured_gap(D):
    """The next recipe, in the emulation only (the kernel does not take these steps yet): with q and
    k structured on the same channels, the kernel's recipe stays under the issue's cosine 0.9995
    (0.9984-0.9991 measured per (b, h)); subtracting q's channel mean (its product with each key
    added to the scores exactly) and one INT8 scale per key reach 0.99950-0.99972 (3 seeds, D 64
    and 128) and cut the relative L2 error by about a half. The bound leaves 0.0001 of cosine."""
    q, k, v = (t.to(torch.bfloat16) for t in draw("qk_structured", 1, 2, 512, 512, D))
    ref = attention_reference(q, k, v)
    now_cos, now_rel = cosine_and_rel_l2(
        emulate_attention_8bit(q, k, v, values="input", out_dtype=torch.float32), ref, dims=(-2, -1))
    next_cos, next_rel = cosine_and_rel_l2(
        emulate_attention_8bit(q, k, v, values="input", smooth_q=True, key_scale="key", out_dtype=torch.float32),
        ref, dims=(-2, -1))
    assert next_cos.min() >= 0.9994 and next_rel.max() <= 0.7 * now_rel.max(), (now_cos, now_rel, next_cos, next_rel)
    gaussian = [t.to(torch.bfloat16) for t in draw("gaussian", 1, 2, 512, 512, D)]
    g_cos, _ = cosine_and_rel_l2(emulate_attention_8bit(*gaussian, values="input", smooth_q=True, key_scale="key",
                                                        out_dtype=torch.float32), attention_reference(*gaussian))
    assert g_cos >= 0.99985, g_cos


def test_fp8_pv_sets_the_error_floor():
    """Where the error comes from, on N(0, 1) inputs: INT8 q·kᵀ alone (p·v exact) meets the issue's
    gate (cosine >= 0.9995; about 1 % relative L2), and so does the 16-bit p·v form; e4m3's 3-bit
    mantissa on p and on v adds about 2.5 % each (relative, whatever the scale: per-channel scaling
    cannot buy it back), so the FP8 form sits near 3.7 %, cosine 0.9993. A change of recipe moves
    these numbers."""
    q, k, v = (t.to(torch.bfloat16) for t in draw("gaussian", 1, 2, 512, 512, 64))
    ref = attention_reference(q, k, v)
    found = {values: cosine_and_rel_l2(emulate_attention_8bit(q, k, v, values=values, out_dtype=torch.float32), ref)
             for values in VALUES}
    (cos_exact, rel_exact), (cos_16, rel_16), (cos_8, rel_8) = found["exact"], found["input"], found["e4m3"]
    assert cos_exact >= 0.9995 and rel_exact <= 0.015, found
    assert cos_16 >= 0.9995 and rel_16 <= 0.015, found
    assert 0.025 <= rel_8 <= 0.05 and cos_8 < 0.9995, found


@pytest.mark.parametrize("values", FORMS)
@pytest.mark.parametrize("dtype", DTYPES16, ids=str)
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", QUALITY_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_emulation_against_float64(kind, shape, D, dtype, values):
    """The recipe's error: per (b, h), the emulation's cosine and relative L2 to exact attention
    within QUALITY (the bounds the kernel is then held to), for each form of p·v."""
    q, k, v = inputs(kind, shape, D, dtype, device="cpu")
    assert_quality(attention_8bit_emulation(q, k, v, values=values), attention_reference(q, k, v), kind, values,
                   f"{kind} {shape} D={D} {values}")


@pytest.mark.parametrize("values", FORMS)
def test_one_key_gives_v(values):
    """Sk = 1: p = 1, and v's one key quantizes to ±448 exactly (its own scale) or is taken as it is,
    so every query gets v."""
    q, k, v = inputs("gaussian", (2, 3, 9, 1), 64, torch.bfloat16, device="cpu")
    assert torch.equal(attention_8bit_emulation(q, k, v, values=values), v.expand(2, 3, 9, 64))


def test_emulation_without_keys_or_queries():
    q, k, v = inputs("gaussian", (2, 2, 5, 0), 64, torch.bfloat16, device="cpu")
    out = attention_8bit_emulation(q, k, v)
    assert out.shape == (2, 2, 5, 64) and bool((out == 0).all())
    assert torch.equal(out, attention_reference(q, k, v).to(out.dtype))
    q, k, v = inputs("gaussian", (0, 2, 5, 7), 64, torch.bfloat16, device="cpu")
    assert attention_8bit_emulation(q, k, v).shape == (0, 2, 5, 64)


# where a special value goes: (tensor, index [b, h, s, d], value). Not an infinity in k: SDPA then gives
# NaN rows where q·k is +inf and finite rows where it is -inf, while k's mean (inf - inf) makes every
# row NaN here; no model feeds infinite keys.
SPECIALS = {"nan_q": ("q", (0, 1, 5, 3), math.nan), "nan_k": ("k", (0, 0, 70, 2), math.nan),
            "nan_v": ("v", (0, 1, 100, 7), math.nan), "inf_q": ("q", (0, 0, 9, 4), math.inf),
            "inf_v": ("v", (0, 0, 3, 5), -math.inf)}


def with_special(name, device, dtype=torch.bfloat16):
    q, k, v = inputs("gaussian", (1, 2, 77, 130), 64, dtype, device=device)
    which, index, value = SPECIALS[name]
    {"q": q, "k": k, "v": v}[which][index] = value
    return q, k, v


def sdpa_math_finite(q, k, v):
    """Where SDPA's math backend (float32, on the CPU) gives finite values."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q.cpu().float(), k.cpu().float(), v.cpu().float()).isfinite()


def assert_special_pattern(name, finite):
    """The pattern of the contract: a NaN or infinity in q's row i spoils row i, a NaN in a key every
    row, one in v[j, c] column c; all else finite."""
    which, (b, h, s, d), _ = SPECIALS[name]
    want = torch.ones_like(finite)
    if which == "q":
        want[b, h, s] = False
    elif which == "k":
        want[b, h] = False
    else:
        want[b, h, :, d] = False
    assert torch.equal(finite, want), f"{name}: {int((finite != want).sum())} elements differ from the pattern"


@pytest.mark.parametrize("values", FORMS)
@pytest.mark.parametrize("name", sorted(SPECIALS))
def test_emulation_spreads_special_values_as_sdpa(name, values):
    q, k, v = with_special(name, "cpu")
    finite = attention_8bit_emulation(q, k, v, values=values).isfinite()
    assert torch.equal(finite, sdpa_math_finite(q, k, v))
    assert_special_pattern(name, finite)


# =========================== CPU: the fake, the layouts, the package ===========================

LAYOUT_CASES = {
    # name: (q's memory shape, the permutation that makes it [B, H, S, D])
    "heads": ((2, 3, 5, 64), (0, 1, 2, 3)),
    "tokens": ((2, 5, 3, 64), (0, 2, 1, 3)),
    "heads_first": ((3, 2, 5, 64), (1, 0, 2, 3)),  # [H, B, S, D] memory: not inner, so contiguous out
    "one_token": ((2, 1, 3, 64), (0, 2, 1, 3)),  # [B, 1, H, D] transposed: stride(1) < stride(2), tokens
}


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_fake_gives_the_kernel_s_layout(tk, case):
    """On meta (the binding's checks, then the fake): q's shape and dtype, [B, Sq, H, D] memory
    transposed where q.stride(1) < q.stride(2), contiguous [B, H, Sq, D] otherwise."""
    memory, perm = LAYOUT_CASES[case]
    q = torch.empty(memory, device="meta", dtype=torch.bfloat16).permute(perm)
    k = torch.empty(2, 3, 7, 64, device="meta", dtype=torch.bfloat16)
    out = tk.attention_8bit(q, k, k)
    assert out.device.type == "meta" and out.dtype == q.dtype and out.shape == q.shape
    assert out.stride() == expected_strides(q), (out.stride(), expected_strides(q))
    if case in ("tokens", "one_token"):
        assert out.transpose(1, 2).is_contiguous()
    else:
        assert out.is_contiguous()


def test_fake_of_fused_qkv_views(tk):
    q, k, v = fused_qkv(2, 3, 11, 128, torch.float16, device="meta")
    out = tk.attention_8bit(q, k, v, 0.1)
    assert out.shape == q.shape and out.transpose(1, 2).is_contiguous()


def test_eager_stand_in_gives_the_fake_s_layout_and_the_emulation():
    """tests/attention/attention_eager.py, the CPU stand-in of the package's tests: the emulation, in
    the layout the fake (and the kernel) allocate."""
    from eager_kernel import eager_kernel

    stand_in = eager_kernel()
    for layout in ("heads", "tokens"):
        q, k, v = inputs("gaussian", (1, 2, 70, 90), 64, torch.bfloat16, layout, device="cpu")
        out = stand_in.attention_8bit(q, k, v)
        assert out.stride() == expected_strides(q)
        assert torch.equal(out, attention_8bit_emulation(q, k, v))
        with torch.device("meta"):
            assert stand_in.attention_8bit(q.to("meta"), k.to("meta"), v.to("meta")).stride() == out.stride()


def test_cpu_tensors_are_refused(tk):
    q = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"attention_8bit: q must be a CUDA tensor"):
        tk.attention_8bit(q, q, q)


def test_a_tensor_on_another_device_is_named(tk):
    q = torch.empty(1, 2, 8, 64, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match=r"attention_8bit: v must be on the same device as q"):
        tk.attention_8bit(q, q, torch.randn(1, 2, 8, 64, dtype=torch.bfloat16))


def test_no_gradient_is_dropped_silently(tk):
    q = torch.empty(1, 2, 8, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    k = torch.empty(1, 2, 8, 64, dtype=torch.bfloat16, device="meta")
    with pytest.raises(RuntimeError, match="attention_8bit.*has no backward"):
        tk.attention_8bit(q, k, k)
    with torch.no_grad():
        assert tk.attention_8bit(q, k, k).shape == q.shape
    assert not tk.has_backward("attention_8bit")


def test_the_bad_inputs_name_the_argument_on_meta(tk):
    """The family's bad inputs (attention_reliability.BAD_INPUTS) raise on meta, through the fake,
    the binding's exception naming the op and the argument (the shared test checks CUDA gives the same)."""
    from attention_reliability import BAD_INPUTS

    for name, (call, exc, message) in BAD_INPUTS.items():
        with pytest.raises(exc) as err:
            call(tk, "meta")
        assert re.search(message, str(err.value).splitlines()[0]), f"{name}: {err.value}"


# =========================== GPU: the kernel ===========================

# (kind, B, H, Sq, Sk): blocks of 64 whole and partial, one query and one key, odd lengths, cross
# attention both ways, keys with a mean and outlier channels (the smoothing's path)
VS_EMULATION = [("gaussian", 1, 2, 512, 512), ("gaussian", 2, 3, 77, 77), ("gaussian", 1, 2, 1, 1),
                ("gaussian", 2, 2, 1, 300), ("gaussian", 2, 2, 256, 77), ("gaussian", 1, 2, 130, 130),
                ("gaussian", 1, 1, 64, 1000), ("keys_structured", 1, 2, 333, 64), ("keys_structured", 2, 2, 200, 520)]


@pytest.mark.parametrize("dtype", DTYPES16, ids=str)
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("layout", ["heads", "tokens"])
@pytest.mark.parametrize("case", VS_EMULATION, ids=lambda c: "-".join(map(str, c)))
@fp8_gpu
def test_kernel_matches_the_emulation(tk, case, layout, D, dtype):
    """Kernel against emulation, in both layouts: the same quantization and tiling, within the odd
    e4m3 code one step apart (EMULATION_ABS, EMULATION_COS); the output in the layout of q."""
    kind, *shape = case
    q, k, v = inputs(kind, tuple(shape), D, dtype, layout)
    out = tk.attention_8bit(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype and out.stride() == expected_strides(q)
    assert_matches_emulation(out, q, k, v, what=f"{case} {layout} D={D} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES16, ids=str)
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", QUALITY_SHAPES, ids=lambda s: "x".join(map(str, s)))
@fp8_gpu
def test_kernel_against_float64(tk, kind, shape, D, dtype):
    """Per (b, h), the kernel's cosine and relative L2 to exact attention within QUALITY of the form
    it runs (the emulation's error with margin), in diffusers' layout."""
    q, k, v = inputs(kind, shape, D, dtype, "tokens")
    assert_quality(tk.attention_8bit(q, k, v), attention_reference(q.cpu(), k.cpu(), v.cpu()), kind,
                   kernel_values(), f"{kind} {shape} D={D} {dtype}")


@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("scale", [None, 0.05, 0.3, -0.2])
@fp8_gpu
def test_given_scales(tk, D, scale):
    q, k, v = inputs("gaussian", (2, 2, 100, 150), D, torch.bfloat16, "tokens")
    assert_matches_emulation(tk.attention_8bit(q, k, v, scale), q, k, v, scale, what=f"scale={scale}")


@fp8_gpu
def test_default_scale_is_one_over_sqrt_d(tk):
    q, k, v = inputs("gaussian", (1, 2, 100, 150), 64, torch.bfloat16, "tokens")
    assert torch.equal(tk.attention_8bit(q, k, v), tk.attention_8bit(q, k, v, 0.125))


@pytest.mark.parametrize("dtype", DTYPES16, ids=str)
@pytest.mark.parametrize("D", HEAD_DIMS)
@fp8_gpu
def test_views_of_a_fused_qkv_projection(tk, D, dtype):
    """q, k, v strided views of one [B, S, 3, H, D] projection: taken without a copy, the same bits as
    contiguous copies of them, the output in the tokens layout."""
    q, k, v = fused_qkv(2, 3, 200, D, dtype)
    assert not q.is_contiguous() and q.stride(-1) == 1
    out = tk.attention_8bit(q, k, v)
    assert out.stride() == expected_strides(q) and out.transpose(1, 2).is_contiguous()
    assert torch.equal(out, tk.attention_8bit(q.contiguous(), k.contiguous(), v.contiguous()))
    assert_matches_emulation(out, q, k, v, what=f"fused qkv D={D} {dtype}")


@pytest.mark.parametrize("shape", [(0, 2, 16, 16), (2, 0, 16, 16), (2, 2, 0, 16), (2, 2, 0, 0)],
                         ids=["no_batch", "no_heads", "no_queries", "nothing"])
@pytest.mark.parametrize("layout", ["heads", "tokens"])
@fp8_gpu
def test_empty_outputs(tk, shape, layout):
    q, k, v = inputs("gaussian", shape, 64, torch.bfloat16, layout)
    out = tk.attention_8bit(q, k, v)
    torch.cuda.synchronize()
    assert out.shape == q.shape and out.numel() == 0 and out.device == q.device


@pytest.mark.parametrize("layout", ["heads", "tokens"])
@pytest.mark.parametrize("D", HEAD_DIMS)
@fp8_gpu
def test_no_keys_give_zeros(tk, layout, D):
    """Sk = 0: zeros (SDPA's math backend), every element written over the NaN poison."""
    q, k, v = inputs("gaussian", (2, 3, 50, 0), D, torch.float16, layout)
    out = tk.attention_8bit(q, k, v)
    assert out.shape == q.shape and out.stride() == expected_strides(q)
    assert bool((out == 0).all())


@pytest.mark.parametrize("name", sorted(SPECIALS))
@fp8_gpu
def test_special_values_spread_as_in_sdpa(tk, name):
    """A NaN (or infinity) in q, k or v: the kernel's output is finite exactly where SDPA's math
    backend gives finite values (float32, same inputs), which is the contract's pattern."""
    q, k, v = with_special(name, "cuda")
    finite = tk.attention_8bit(q, k, v).isfinite().cpu()
    assert torch.equal(finite, sdpa_math_finite(q, k, v))
    assert_special_pattern(name, finite)


@fp8_gpu
def test_rows_beside_a_special_row_are_untouched(tk):
    """A NaN in one query row changes nothing else: the other rows are the bits they are without it."""
    q, k, v = inputs("gaussian", (1, 2, 77, 130), 64, torch.bfloat16, "tokens")
    clean = tk.attention_8bit(q, k, v)
    q[0, 1, 5, 3] = math.nan
    spoiled = tk.attention_8bit(q, k, v)
    keep = torch.ones(77, dtype=torch.bool)
    keep[5] = False
    assert torch.equal(spoiled[0, 1, keep], clean[0, 1, keep]) and torch.equal(spoiled[0, 0], clean[0, 0])


@fp8_gpu
def test_runs_under_compile_like_eager(tk):
    """torch.compile(fullgraph=True) through the fake: the same bits and the same layout as eager."""
    q, k, v = inputs("gaussian", (2, 3, 100, 100), 64, torch.bfloat16, "tokens")
    eager = tk.attention_8bit(q, k, v)
    compiled = torch.compile(lambda q, k, v: tk.attention_8bit(q, k, v), fullgraph=True)(q, k, v)
    assert compiled.stride() == eager.stride() and torch.equal(compiled, eager)


@pytest.mark.gpu
@pytest.mark.skipif(FP8_GPU or not HAS_GPU, reason="a GPU below compute capability 8.9 is refused; this one is not")
def test_gpus_below_8_9_are_refused(tk):
    q = torch.randn(1, 2, 8, 64, device="cuda", dtype=torch.bfloat16)
    major, minor = torch.cuda.get_device_capability()
    with pytest.raises((ValueError, RuntimeError),
                       match=rf"attention_8bit:? needs compute capability 8\.9 or later \(FP8 tensor cores\), "
                             rf"got {major}\.{minor}"):
        tk.attention_8bit(q, q, q)

