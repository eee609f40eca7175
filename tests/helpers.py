"""Shared test helpers: inputs, poisoned outputs, error bounds against float64 and eager code."""

import copy
import types

import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Unit roundoff of each dtype: the bound on one rounding's relative error.
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
# Where values are subnormal the relative bound fails: one rounding there errs by up to half the
# smallest subnormal (their spacing), whatever the value. A bound of `ulps` roundings is therefore
# ulps * (UNIT_ROUNDOFF * |v| + SUBNORMAL_ROUNDOFF): fp16's 2^-25 (3e-8) is reached by gradients
# near zero (below 2^-14 = 6e-5); bf16's and fp32's (1e-40, 1e-45) never matter.
SUBNORMAL_ROUNDOFF = {dtype: torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps / 2 for dtype in UNIT_ROUNDOFF}
# Share of elements of a half-precision output allowed to differ from the module's own eager code.
# They differ only where an fp32 reduction, summed in another order, puts a value on the other
# side of a rounding boundary: the share grows with the mantissa bits of the output dtype.
# An fp32 output differs in the last bits almost everywhere: no share is checked (None), only its
# per-element error bound (mismatch_vs_eager), which fails on a wrong value (test_bounds_can_fail).
MISMATCH_BUDGET = {torch.float16: 1e-2, torch.bfloat16: 2e-3, torch.float32: None}
FP32_REL_TOL = 4e-6  # rsqrtf's error plus a different summation order, relative


def random_input(shape, dtype, device="cuda", scale=2.0, offset=0.5):
    """Fresh random values, never zeros, with a non-zero mean and a spread of magnitudes."""
    return (torch.randn(shape, device=device, dtype=torch.float32) * scale + offset).to(dtype)


def poisoned(shape, dtype, device="cuda"):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def with_poisoned_outputs(fn, *likes):
    """fn() with the tensors it returns allocated from NaN: blocks shaped like `likes` are filled with
    NaN and freed in a private memory pool that fn() then allocates from, so an element a functional
    op never writes stays NaN (assert_all_written). Checks that every output took one of them."""
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        blocks = [torch.full(t.shape, float("nan"), dtype=t.dtype, device=t.device) for t in likes]
        addresses = sorted(b.data_ptr() for b in blocks)
        del blocks
        out = fn()
    assert sorted(o.data_ptr() for o in out) == addresses, "the outputs were not allocated from the poisoned blocks"
    return out


def with_nan_padding(view: torch.Tensor) -> torch.Tensor:
    """Fills the whole allocation under `view` (its base: the gaps between its rows and the
    elements before and after it) with NaN, records which part the view is, and returns `view`.
    Floating dtypes only."""
    if view.is_floating_point() and view._base is not None:
        base = view._base
        base.fill_(float("nan"))
        base._tk_view_of_padding = (tuple(view.shape), view.stride(), view.storage_offset() - base.storage_offset())
    elif view.is_floating_point():
        view.fill_(float("nan"))
    return view


def assert_padding_intact(*views, what=""):
    """Every element of each view's allocation outside the part with_nan_padding gave out (the
    padding) is still NaN: the op wrote nothing past its output views. memcheck cannot see such a
    write: it stays inside one allocation. None, meta tensors and views of other allocations pass."""
    flat = []
    for view in views:
        flat.extend(view if isinstance(view, (tuple, list)) else [view])
    for view in flat:
        if view is None or view._base is None or view.device.type == "meta":
            continue
        base = view._base
        region = getattr(base, "_tk_view_of_padding", None)
        if region is None:
            continue
        outside = torch.ones(base.shape, dtype=torch.bool, device=base.device)
        outside.as_strided(*region).fill_(False)
        written = (~base[outside].isnan()).sum().item()
        assert written == 0, f"{what}: {written} element(s) of the allocation past the output view were written"


def assert_all_written(*tensors):
    for t in tensors:
        assert not t.isnan().any(), "some outputs were not written (NaN poison left)"


def assert_within(out, ref64, magnitude, ulps, what=""):
    """|out - ref| <= ulps * u(out.dtype) * magnitude + fp32 slack, elementwise.

    `magnitude` bounds the size of the terms that were rounded (|ref| for a product chain; the
    sum of the terms' magnitudes where a sum can cancel)."""
    u = UNIT_ROUNDOFF[out.dtype]
    err = (out.double() - ref64).abs()
    bound = (ulps * u + FP32_REL_TOL) * magnitude + 1e-6
    worst = (err - bound).max().item() if err.numel() else 0.0
    assert worst <= 0, f"{what}: max error {err.max().item():.3g} exceeds the bound by {worst:.3g}"


def mismatch_vs_eager(ours, eager, magnitude, ulps):
    """Share of elements that differ from eager code; fails if any differs by more than
    `ulps` * u * magnitude plus fp32 slack, u the unit roundoff of the output dtype. One ulp of a
    value v is at most 2u|v|: allow 2 per rounding that may land differently."""
    assert ours.dtype == eager.dtype, f"dtype {ours.dtype} differs from the module's {eager.dtype}"
    diff = (ours.double() - eager.double()).abs()
    bound = (ulps * UNIT_ROUNDOFF[ours.dtype] + FP32_REL_TOL) * magnitude + ulps * SUBNORMAL_ROUNDOFF[ours.dtype]
    worst = (diff - bound).max().item() if diff.numel() else 0.0
    assert worst <= 0, f"difference from eager above {ulps} ulp: max {diff.max().item()}"
    return (ours != eager).double().mean().item()


# Elements that may differ from eager however small the tensor: a share budget below 2 / n would
# demand bit equality, which no fp32 reduction in another order guarantees (a tie at a rounding
# boundary is as likely per element in 231 elements as in a million: ~2% of 33 x 7 bf16 LayerNorm
# batches have one, by emulation of both summation orders).
MISMATCH_FLOOR = 2


def assert_mismatch_within_budget(share, out, floor_elements=MISMATCH_FLOOR):
    """The share of `out`'s elements that differ from eager is within MISMATCH_BUDGET (or
    `floor_elements` of them); fp32 has no share budget (its element bound is the check). An
    output dtype without an entry is an error, not a pass."""
    budget = MISMATCH_BUDGET[out.dtype]
    if budget is None:
        return
    budget = max(budget, floor_elements / max(out.numel(), 1))
    assert share <= budget, f"{share:.2%} of the elements differ from eager ({share * out.numel():.0f} of {out.numel()})"


def assert_matches_eager(ours, eager, magnitude, ulps=2):
    assert_mismatch_within_budget(mismatch_vs_eager(ours, eager, magnitude, ulps), ours)


def assert_rejects(call, exc, message):
    """call() raises `exc` whose message contains `message` (a regex), and leaves no pending CUDA error."""
    import pytest

    with pytest.raises(exc, match=message):
        call()
    torch.cuda.synchronize()


class _EagerLayer:
    """Stand-in for a Hub layer: its forward is the host module's own (eager) class forward."""

    @staticmethod
    def forward(self, *args, **kwargs):
        return type(self).forward(self, *args, **kwargs)


# tk.layers for integration tests that run the eager code in place of the kernels
EAGER_LAYERS = types.SimpleNamespace(RMSNorm=_EagerLayer, LayerNorm=_EagerLayer)


def randomize_norm_weights(model):
    """Norm weights are ones at init, which would hide a weight that is dropped or misapplied."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)


def rope_magnitude(x, cos, sin, style):
    """|x_i| |cos_i| + |x_partner| |sin_i| (the terms that are rounded), |x| where x passes through."""
    x64, c, s = x.double().abs(), cos.double().abs(), sin.double().abs()
    r = c.shape[-1]
    xr = x64[..., :r]
    if style == "neox":
        partner = torch.cat((xr[..., r // 2:], xr[..., : r // 2]), dim=-1)
    else:
        partner = xr.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return torch.cat((xr * c + partner * s, x64[..., r:]), dim=-1) + 1e-3


# The integer type of each float dtype's width: adding 1 to its bits moves a value by one ulp.
SAME_WIDTH_INT = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def perturbed(model, share=0.1, seed=7):
    """A copy with one ulp (of the parameter's own dtype) added to a random `share` of every
    parameter's elements: the noise floor (how far a model's output or a run drifts from eager
    from one rounding's difference). peft's LoRA adapters are fp32 on a bf16 model: viewed as
    int16 they would have twice the elements the mask has."""
    twin = copy.deepcopy(model)
    g = torch.Generator(device=next(twin.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for p in twin.parameters():
            mask = torch.rand(p.shape, device=p.device, generator=g) < share
            bits = p.data.view(SAME_WIDTH_INT[p.dtype])
            bits[mask] += 1
    return twin
