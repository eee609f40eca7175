"""group_norm / add_group_norm: float64 references, eager F.group_norm (+ F.silu), memory formats,
the split (two- and three-kernel) plans, validation, fake impls and the Hub layer.

Against eager: the per-element formula is ATen's (eps cast to x's dtype, the same FMAs, read from
torch 2.11's SASS), the statistics are fp32 like ATen's but summed in another order (two-pass chunk
moments combined by Chan's update, or shifted sums per channel for channels-last, against ATen's
Welford loop), then rounded to x's dtype as ATen stores them (torch <= 2.12). So a 16-bit output
equals F.group_norm's except in groups whose mean or rstd lies within fp32 summation error of a
rounding boundary of the dtype (reference.group_norm.ambiguous_statistics: there the two round
apart and the whole group differs by about an ulp, within the element bound), and but for a small
share of elements elsewhere (MISMATCH_BUDGET); an fp32 output differs in the last bits (checked
against float64 and against eager within a few ulps)."""

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import (
    DTYPES,
    MISMATCH_BUDGET,
    assert_all_written,
    assert_rejects,
    assert_within,
    mismatch_vs_eager,
    poisoned,
    random_input,
    with_poisoned_outputs,
)
from reference.group_norm import (
    ambiguous_statistics,
    channel_view,
    eager_group_norm,
    group_mask,
    group_norm_float64,
    statistics_rounding_magnitude,
)

# (shape, groups, where it comes from / which path it takes)
SHAPES = [
    ((2, 320, 16, 16), 32, "SD resnet, D = 10 (not a power of two), whole groups"),
    ((2, 640, 24, 24), 32, "D = 20, split groups (channels-first: two kernels)"),
    ((1, 1280, 8, 8), 32, "SDXL mid block 8x8, D = 40"),
    ((2, 6, 5, 7), 3, "odd spatial 5x7: single-element vectors"),
    ((3, 40), 8, "[N, C]: S = 1 (ATen's 1-d formula)"),
    ((3, 40, 1, 1), 5, "[N, C, 1, 1]: S = 1"),
    ((2, 24, 3, 4, 5), 4, "5-D (video), D = 6"),
    ((2, 12, 33), 6, "3-D [N, C, L], odd L"),
    ((5, 9, 4, 4), 9, "instance norm (D = 1), 9 channels"),
    ((2, 8, 16, 16), 1, "one group (layer norm over C, H, W)"),
]
LAYOUTS = ["channels_first", "channels_last"]


def make_x(shape, dtype, layout, device="cuda", scale=2.0, offset=0.5):
    """Fresh random x of `shape` in `layout` (channels-last: C innermost, for any rank)."""
    if layout == "channels_first" or len(shape) == 2:
        return random_input(shape, dtype, device, scale, offset)
    n, c, *spatial = shape
    return random_input((n, *spatial, c), dtype, device, scale, offset).movedim(-1, 1)


def assert_matches_eager(ours, eager, magnitude, stats, ulps=4):
    """Each element within `ulps` of eager's, and equal but for MISMATCH_BUDGET's share (or two
    elements: small tensors would otherwise fail on a single rounding-boundary case) of the
    elements outside the groups whose rounded statistics are ambiguous. `stats` is
    (x, num_groups, eps, bias_nc) of the call."""
    mismatch_vs_eager(ours, eager, magnitude, ulps)
    x, groups, eps, bias_nc = stats
    excused = group_mask(ambiguous_statistics(x, groups, eps, bias_nc), ours)
    counted = (~excused).sum().item()
    share = ((ours != eager) & ~excused).sum().item() / max(1, counted)
    budget = MISMATCH_BUDGET[ours.dtype]
    if budget is not None:  # fp32: the element bound above is the check
        allowed = max(budget, 2 / max(1, counted))
        assert share <= allowed, (f"{share:.2%} of the elements differ from eager "
                                  f"(outside {excused.sum().item()} of {ours.numel()} in ambiguous groups)")


def same_layout(a, b):
    """Equal strides wherever the size is not 1 (a size-1 dimension's stride is arbitrary)."""
    return all(a.stride(d) == b.stride(d) for d in range(a.dim()) if a.shape[d] > 1)


def affine_params(c, dtype, kind, device="cuda"):
    g = torch.Generator(device="cpu").manual_seed(c)
    w = (torch.rand(c, generator=g) + 0.5).to(device, dtype)
    b = (torch.randn(c, generator=g) * 0.5).to(device, dtype)
    return {"affine": (w, b), "weight": (w, None), "bias": (None, b), "none": (None, None)}[kind]


def magnitude(ref64, weight, bias, x, groups=None, eps=1e-5, bias_nc=None):
    """Bound on the terms the kernel rounds: the output, the weight and bias, and (given `groups`)
    the mean rounded to x's dtype times rstd * |w|, which exceeds the normalized unit where a group's
    spread is small next to its mean (ATen <= 2.12 and the kernel round the statistics)."""
    m = ref64.abs() + 1.0
    if weight is not None:
        m = m + channel_view(weight.double().abs(), x)
    if bias is not None:
        m = m + channel_view(bias.double().abs(), x)
    if groups is not None:
        m = m + statistics_rounding_magnitude(x, groups, weight, eps, bias_nc)
    return m


def silu64(y):
    return y / (1 + torch.exp(-y))


def check_against_float64(out, x, groups, weight, bias, eps, activation, bias_nc=None):
    ref = group_norm_float64(x, groups, weight, bias, eps, bias_nc)
    mag = magnitude(ref, weight, bias, x, groups, eps, bias_nc)
    # fp32 statistics of large groups: the mean and variance carry ~1e-6 relative error
    ulps = 3 if out.dtype != torch.float32 else 48
    if activation == "silu":
        ref, mag = silu64(ref), mag * 1.2 + silu64(ref).abs()
    assert_within(out, ref, mag, ulps, f"{tuple(x.shape)} {x.dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape,groups,note", SHAPES)
@pytest.mark.parametrize("activation", [None, "silu"])
def test_matches_float64_and_eager(tk, dtype, layout, shape, groups, note, activation):
    x = make_x(shape, dtype, layout)
    weight, bias = affine_params(shape[1], dtype, "affine")
    out = with_poisoned_outputs(lambda: (tk.group_norm(x, groups, weight, bias, 1e-5, activation),), x)[0]
    assert_all_written(out)
    assert out.shape == x.shape and out.dtype == dtype and same_layout(out, x)
    check_against_float64(out, x, groups, weight, bias, 1e-5, activation)
    eager = eager_group_norm(x, groups, weight, bias, 1e-5, activation)
    ref64 = group_norm_float64(x, groups, weight, bias, 1e-5)
    if dtype == torch.float32:
        assert_within(out, eager.double(), magnitude(ref64, weight, bias, x, groups), 48, note)
    else:
        assert_matches_eager(out, eager, magnitude(ref64, weight, bias, x, groups), (x, groups, 1e-5, None))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["weight", "bias", "none"])
@pytest.mark.parametrize("shape", [(2, 64, 9, 9), (4, 48)])
def test_partial_affine_and_one_d_formulas(tk, kind, shape):
    """Weight only, bias only, neither: each takes ATen's own formula (a/b coefficients, the 1-d
    form for S == 1, or (x - mean) * rstd), which bf16 shows as a small mismatch share only."""
    x = make_x(shape, torch.bfloat16, "channels_first")
    weight, bias = affine_params(shape[1], torch.bfloat16, kind)
    out = tk.group_norm(x, 16, weight, bias, 1e-5)
    ref64 = group_norm_float64(x, 16, weight, bias, 1e-5)
    check_against_float64(out, x, 16, weight, bias, 1e-5, None)
    assert_matches_eager(out, F.group_norm(x, 16, weight, bias, 1e-5), magnitude(ref64, weight, bias, x, 16),
                         (x, 16, 1e-5, None))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(2, 64, 12, 12), (3, 64)])
def test_bit_exact_where_the_statistics_agree(tk, dtype, layout, shape):
    """Groups of one repeated value have the same statistics in any summation order (mean exact,
    M2 = 0): there the output is F.group_norm's (+ F.silu's) bit for bit, which checks the eps cast
    (rstd = rsqrt(eps in x's dtype)) and ATen's per-element formulas (a/b, 1-d, plain) exactly."""
    n, c = shape[:2]
    g = torch.Generator().manual_seed(11)
    # one value per (sample, group), of 8 significant bits: its sums are exact in fp32 too
    values = (torch.randn(n, 16, 1, generator=g) * 3).to(torch.bfloat16).float()
    x = values.expand(n, 16, c // 16 * math.prod(shape[2:])).reshape(shape).to("cuda", dtype)
    x = make_x(shape, dtype, layout).copy_(x)
    for kind in ("affine", "weight", "bias", "none"):
        weight, bias = affine_params(c, dtype, kind)
        for activation in (None, "silu"):
            out = tk.group_norm(x, 16, weight, bias, 1e-6, activation)
            assert torch.equal(out, eager_group_norm(x, 16, weight, bias, 1e-6, activation)), (kind, activation)


SD_SHAPES = [  # SDXL at 1024x1024 (batch 2 for guidance) and its VAE decoder
    ((2, 320, 128, 128), 32),
    ((2, 640, 64, 64), 32),
    ((2, 1280, 32, 32), 32),
    ((1, 128, 512, 512), 32),
]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape,groups", SD_SHAPES)
def test_sd_shapes_split_plans(tk, layout, shape, groups):
    """The benchmarked shapes: groups of 40 K to 2 M elements, 32 to 64 of them, split across blocks
    (channels-first: chunk moments; channels-last: tile moments, a finalize kernel)."""
    x = make_x(shape, torch.bfloat16, layout)
    weight, bias = affine_params(shape[1], torch.bfloat16, "affine")
    out = tk.group_norm(x, groups, weight, bias, 1e-6, "silu")
    assert same_layout(out, x)
    eager = eager_group_norm(x, groups, weight, bias, 1e-6, "silu")
    ref64 = group_norm_float64(x, groups, weight, bias, 1e-6)
    assert_matches_eager(out, eager, magnitude(ref64, weight, bias, x, groups, 1e-6) * 1.2, (x, groups, 1e-6, None))


@pytest.mark.gpu
@pytest.mark.parametrize("shape,groups", [((16, 512, 32, 32), 32), ((64, 64, 8, 8), 32)])
def test_whole_group_plan_many_groups(tk, shape, groups):
    """Enough groups to fill the GPU: one block per group, x read once (16 K and 128 elements)."""
    x = make_x(shape, torch.float16, "channels_first")
    weight, bias = affine_params(shape[1], torch.float16, "affine")
    out = tk.group_norm(x, groups, weight, bias, 1e-5, "silu")
    check_against_float64(out, x, groups, weight, bias, 1e-5, "silu")


@pytest.mark.gpu
def test_large_mean_small_spread_is_accurate(tk):
    """Statistics stay accurate when the mean dwarfs the spread (two-pass chunk moments; channels-last
    sums shifted by each channel's first value): offset 300, spread 0.05, fp32."""
    for layout in LAYOUTS:
        x = make_x((2, 64, 48, 48), torch.float32, layout, scale=0.05, offset=300.0)
        out = tk.group_norm(x, 8, None, None, 1e-5)
        ref = group_norm_float64(x, 8, None, None, 1e-5)
        err = (out.double() - ref).abs().max().item()
        # fp32 means of values near 300 carry ~1e-7 relative error (2e-3 in normalized units here,
        # as in any fp32 summation); a variance from plain sums of squares would be off by 100 %.
        assert err < 2e-2, f"{layout}: max error {err:.2e} in normalized units"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bias_shape", ["nc", "nc11", "1c"])
def test_add_group_norm_fuses_the_time_embedding(tk, dtype, layout, bias_shape):
    """ResnetBlock2D: norm2(h + temb[:, :, None, None]) then SiLU; the sum is rounded to x's dtype
    before the statistics, as the eager add rounds it."""
    shape = (2, 320, 12, 12)
    x = make_x(shape, dtype, layout)
    temb = random_input((2 if bias_shape != "1c" else 1, 320), dtype)
    bias_nc = temb[:, :, None, None] if bias_shape == "nc11" else temb
    weight, bias = affine_params(320, dtype, "affine")
    out = with_poisoned_outputs(lambda: (tk.add_group_norm(x, bias_nc, 32, weight, bias, 1e-5, "silu"),), x)[0]
    assert_all_written(out)
    assert same_layout(out, x)
    check_against_float64(out, x, 32, weight, bias, 1e-5, "silu", bias_nc=temb)
    if dtype != torch.float32:
        eager = eager_group_norm(x, 32, weight, bias, 1e-5, "silu", bias_nc=temb)
        ref64 = group_norm_float64(x, 32, weight, bias, 1e-5, bias_nc=temb)
        assert_matches_eager(out, eager, magnitude(ref64, weight, bias, x, 32, 1e-5, temb) * 1.2, (x, 32, 1e-5, temb))


@pytest.mark.gpu
def test_add_group_norm_split_channels_first(tk):
    x = make_x((2, 320, 64, 64), torch.bfloat16, "channels_first")
    temb = random_input((2, 320), torch.bfloat16)
    out = tk.add_group_norm(x, temb, 32, None, None, 1e-5)
    eager = eager_group_norm(x, 32, None, None, 1e-5, bias_nc=temb)
    assert_matches_eager(out, eager, group_norm_float64(x, 32, bias_nc=temb).abs() + 1, (x, 32, 1e-5, temb))


@pytest.mark.gpu
def test_eps_is_cast_to_x_dtype_as_aten_does(tk):
    """A variance of the order of eps: fp16 eps 1e-6 is 1.013e-6 once cast to fp16, and ATen adds
    the cast value (0.6 % of rstd here). Against eager the share of differing elements stays small;
    with eps added uncast it would be most of them."""
    x = (torch.randn(2, 64, 16, 16, device="cuda") * 1e-3 + 0.25).half()
    out = tk.group_norm(x, 32, None, None, 1e-6)
    eager = F.group_norm(x, 32, None, None, 1e-6)
    assert (out != eager).double().mean().item() < 0.05
    uncast = ((x.float().reshape(2, 32, -1) - x.float().reshape(2, 32, -1).mean(-1, keepdim=True))
              * torch.rsqrt(x.float().reshape(2, 32, -1).var(-1, unbiased=False, keepdim=True) + 1e-6))
    assert (uncast.reshape(x.shape).half() != eager).double().mean().item() > 0.2


@pytest.mark.gpu
def test_batch_strided_views_and_out(tk):
    """A slice of a batch (batch stride larger than the sample) in both layouts, and out= with
    x's layout; the output is written in place of out only."""
    for layout in LAYOUTS:
        big = make_x((6, 64, 10, 10), torch.bfloat16, layout)
        x = big[1:6:2]
        assert not x.is_contiguous() and x.stride(0) == 2 * big.stride(0)
        out_big = poisoned((6, 64, 10, 10), torch.bfloat16)
        if layout == "channels_last":
            out_big = out_big.contiguous(memory_format=torch.channels_last)
        out = out_big[0:6:2]
        assert tk.group_norm(x, 16, None, None, 1e-5, "silu", out=out) is out
        assert_matches_eager(out, eager_group_norm(x, 16, activation="silu"),
                             group_norm_float64(x, 16).abs() * 1.2 + 1, (x, 16, 1e-5, None))
        assert out_big[1::2].isnan().all()  # nothing outside out was written


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(0, 32, 8, 8), (2, 32, 0, 8), (0, 32)])
def test_empty(tk, shape):
    for layout in LAYOUTS:
        x = make_x(shape, torch.bfloat16, layout)
        out = tk.group_norm(x, 8, None, None, 1e-5, "silu")
        assert out.shape == x.shape
        assert tk.add_group_norm(x, torch.zeros(shape[0], 32, device="cuda", dtype=torch.bfloat16), 8).shape == x.shape


@pytest.mark.gpu
def test_deterministic(tk):
    for layout in LAYOUTS:
        x = make_x((2, 320, 96, 96), torch.bfloat16, layout)
        a = tk.group_norm(x, 32, None, None, 1e-5, "silu")
        b = tk.group_norm(x, 32, None, None, 1e-5, "silu")
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_compiles_fullgraph(tk):
    def f(x, temb, w, b):
        h = tk.group_norm(x, 32, w, b, 1e-5, "silu")
        return tk.add_group_norm(h * 2, temb, 32, w, b, 1e-5, "silu")

    for layout in LAYOUTS:
        x = make_x((2, 320, 16, 16), torch.bfloat16, layout)
        temb = random_input((2, 320), torch.bfloat16)
        w, b = affine_params(320, torch.bfloat16, "affine")
        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True)
        out = compiled(x, temb, w, b)
        assert torch.equal(out, f(x, temb, w, b)) and same_layout(out, x)


def test_ambiguous_statistics_flags_rounding_midpoints_only():
    """The eager comparison excuses a group only where its exact mean or rstd lies at a rounding
    midpoint of x's dtype (within fp32 summation error): bf16 groups of mean 1 + 2^-8 (halfway
    between 1 and the next bf16 1 + 2^-7) are flagged, groups of a representable mean and an
    exact rstd are not, and fp32 never is."""
    one, next_up = 1.0, 1.0 + 2.0**-7
    x = torch.tensor([[one, one, next_up, one, one, one]], dtype=torch.bfloat16).reshape(1, 3, 2)
    # groups of one channel (2 elements): [1, 1] mean 1, var 0, rstd = 1 / sqrt(0.25) = 2 exactly;
    # [next_up, 1]: mean 1 + 2^-8, a midpoint; [1, 1] again
    flagged = ambiguous_statistics(x, 3, eps=0.25)
    assert flagged.tolist() == [[False, True, False]]
    assert not ambiguous_statistics(x.float(), 3, eps=0.25).any()
    mask = group_mask(flagged, x)
    assert mask.shape == x.shape and mask[0, 1].all() and not mask[0, 0].any() and not mask[0, 2].any()


# ---- validation (GPU: the kernel's checks; the CPU test below runs everywhere) ----


@pytest.mark.gpu
def test_bad_inputs_rejected_with_clear_errors(tk):
    x = make_x((2, 64, 8, 8), torch.bfloat16, "channels_first")
    w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
    assert_rejects(lambda: tk.group_norm(x, 5), ValueError, "channel count .* must be divisible by num_groups")
    assert_rejects(lambda: tk.group_norm(x, 0), ValueError, "num_groups must be positive")
    assert_rejects(lambda: tk.group_norm(x, 8, w.float()), TypeError, "weight must have dtype .*BFloat16")
    assert_rejects(lambda: tk.group_norm(x, 8, None, w[:32]), ValueError, "bias must be 1-D with x.shape\\[1\\] = 64")
    assert_rejects(lambda: tk.group_norm(x.int(), 8), TypeError, "x must be float32, float16 or bfloat16")
    assert_rejects(lambda: tk.group_norm(x[0, 0, 0], 1), ValueError, "at least 2 dimensions")
    assert_rejects(lambda: tk.group_norm(x, 8, activation="gelu"), ValueError, "activation must be \"none\" or \"silu\"")
    assert_rejects(lambda: tk.group_norm(x, 8, eps=-1.0), ValueError, "eps must be a finite number")
    strided = x[:, :, :, ::2]
    assert_rejects(lambda: tk.group_norm(strided, 8), ValueError, "must be dense in its channel and spatial dimensions")
    cl = x.contiguous(memory_format=torch.channels_last)
    assert_rejects(lambda: tk.group_norm(cl, 8, out=torch.empty_like(x)), ValueError, "out must have x's memory format")
    assert_rejects(lambda: tk.group_norm(x, 8, out=torch.empty_like(cl)), ValueError, "out must have x's memory format")
    assert_rejects(lambda: tk.group_norm(x, 8, out=x), ValueError, "out must not share memory with x")
    assert_rejects(lambda: tk.group_norm(x, 8, out=torch.empty_like(x).float()), TypeError, "out must have dtype")
    temb = torch.zeros(2, 64, device="cuda", dtype=torch.bfloat16)
    assert_rejects(lambda: tk.add_group_norm(x, temb[:, :32], 8), ValueError, "bias_nc must be \\[N or 1, C\\]")
    assert_rejects(lambda: tk.add_group_norm(x, temb.float(), 8), TypeError, "bias_nc must have dtype")
    assert_rejects(lambda: tk.add_group_norm(x, temb.t().contiguous().t(), 8), ValueError, "unit stride along channels")
    big_cl = make_x((1, 8192, 2, 2), torch.bfloat16, "channels_last")
    assert_rejects(lambda: tk.group_norm(big_cl, 32), ValueError, "channels-last x with 8192 channels")


def test_cpu_tensors_rejected(tk):
    with pytest.raises(ValueError, match="group_norm: x must be a CUDA tensor, got a tensor on cpu"):
        tk.group_norm(torch.randn(2, 8, 4, 4), 4)
    with pytest.raises(ValueError, match="add_group_norm: x must be a CUDA tensor, got a tensor on cpu"):
        tk.add_group_norm(torch.randn(2, 8, 4, 4), torch.randn(2, 8), 4)


# ---- fake impls (meta tensors; run on every machine) ----


@pytest.mark.parametrize("rank", [2, 3, 4, 5])
def test_fake_impl_keeps_layout(tk, rank):
    meta = dict(device="meta", dtype=torch.bfloat16)
    shape = (2, 64, 5, 6, 7)[:rank]
    x = torch.empty(shape, **meta)
    assert tk.group_norm(x, 32).stride() == x.stride()
    n, c, *spatial = shape
    xl = torch.empty((n, *spatial, c), **meta).movedim(-1, 1)
    out = tk.group_norm(xl, 32, activation="silu")
    assert out.shape == xl.shape and out.stride() == xl.stride() and out.dtype == torch.bfloat16
    assert tk.add_group_norm(xl, torch.empty(2, 64, **meta), 8).stride() == xl.stride()
    with pytest.raises(Exception, match="activation must be"):
        tk.group_norm(x, 32, activation="gelu")
    with pytest.raises(Exception, match="must be divisible by num_groups"):
        tk.group_norm(x, 5)
    with pytest.raises(Exception, match="out must have the shape of x"):
        tk.ops.group_norm_out(torch.empty(2, 63, **meta), torch.empty(2, 64, **meta), 8, None, None, 1e-5, "none")


def test_supported_layouts(tk):
    """The Python layout test (fake impls, the layer) mirrors the binding's: dense channels-first or
    channels-last, any batch stride."""
    import sys

    gn = sys.modules[tk.__name__ + ".group_norm"]
    x = torch.empty(4, 8, 6, 5, device="meta")
    assert gn.is_supported_layout(x) and gn.is_supported_layout(x[::2])
    assert gn.is_supported_layout(x.contiguous(memory_format=torch.channels_last))
    assert gn.is_supported_layout(torch.empty(4, 6, 8, device="meta").transpose(1, 2))  # [N, C, L] channels-last
    assert not gn.is_supported_layout(x[:, :, ::2]) and not gn.is_supported_layout(x.transpose(2, 3))
    assert not gn._is_channels_last(torch.empty(4, 8, 1, 1, device="meta"))  # dense both ways: channels-first
    # no elements: dense whatever the strides (torch gives an empty contiguous tensor the strides of
    # size-1 dimensions), taken channels-first; the fake impl then returns a contiguous empty tensor
    for empty in (torch.empty(2, 16, 0, 4, device="meta"), torch.empty_strided((2, 16, 0, 4), (64, 4, 4, 1), device="meta"),
                  torch.empty(0, 16, 4, 4, device="meta").contiguous(memory_format=torch.channels_last)):
        assert gn.is_supported_layout(empty) and not gn._is_channels_last(empty), empty.stride()
        out = tk.group_norm(empty.to(torch.bfloat16), 8, activation="silu")
        assert out.shape == empty.shape and out.is_contiguous()
        assert tk.add_group_norm(empty.to(torch.bfloat16), torch.empty(empty.shape[0], 16, device="meta",
                                                                       dtype=torch.bfloat16), 8).shape == empty.shape


def test_layer_follows_hub_rules(tk):
    from kernels.layer.layer import _validate_layer

    from conftest import REPO_ID

    _validate_layer(check_cls=torch.nn.GroupNorm, cls=tk.layers.GroupNorm, repo=REPO_ID)
    assert tk.layers.GroupNorm.can_torch_compile and tk.layers.GroupNorm.has_backward


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layer_matches_module(tk, layout):
    """The layer bound to a torch.nn.GroupNorm (what kernelize and inject install) equals the module,
    under torch.no_grad() as diffusers' pipelines run, and under grad mode (its backward: the module's
    weight gets its gradient)."""
    module = torch.nn.GroupNorm(32, 320, eps=1e-6).to("cuda", torch.bfloat16)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
        module.bias.normal_()
    x = make_x((2, 320, 20, 20), torch.bfloat16, layout)
    out = tk.layers.GroupNorm.forward(module, x)
    (dw,) = torch.autograd.grad(out.float().square().sum(), module.weight)
    (eager_dw,) = torch.autograd.grad(module(x).float().square().sum(), module.weight)
    torch.testing.assert_close(dw.float(), eager_dw.float(), rtol=2e-2, atol=2e-2)
    with torch.no_grad():
        out = tk.layers.GroupNorm.forward(module, x)
        expected = module(x)
        assert_matches_eager(out, expected, expected.double().abs() + 3, (x, 32, 1e-6, None))
        strided = x[:, :, :, ::2]  # neither layout: made contiguous first, as F.group_norm does
        expected = module(strided)
        assert_matches_eager(tk.layers.GroupNorm.forward(module, strided), expected, expected.double().abs() + 3,
                             (strided, 32, 1e-6, None))
        # a weight of another dtype takes the module's own F.group_norm (whatever it does with it)
        module32 = torch.nn.GroupNorm(32, 320).cuda()
        try:
            expected = module32(x)
        except RuntimeError:
            with pytest.raises(RuntimeError):
                tk.layers.GroupNorm.forward(module32, x)
        else:
            assert torch.equal(tk.layers.GroupNorm.forward(module32, x), expected)
