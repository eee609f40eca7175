"""Tests of the tests: each shared bound and check fails on a planted error (on the CPU, with the
eager code standing in for the kernel), and passes on the eager code itself."""

import pytest
import torch

import op_catalog as oc
from eager_kernel import eager_kernel
from helpers import UNIT_ROUNDOFF, assert_matches_eager, assert_padding_intact, assert_within
from reference.activations import activation_error_magnitude, activation_float64, eager_activation


@pytest.mark.parametrize("name,case", [("rms_norm_out", "strided"), ("act_mul_out", "strided"),
                                       ("rope_[neox]", "unaligned"), ("group_norm_out", "unaligned")])
def test_a_write_past_the_output_view_is_caught(name, case):
    """Catalog calls check the padding of their output allocation: the eager stand-in's call passes;
    one element written past the view (inside the same allocation: memcheck cannot see it) fails."""
    call = oc.build(name, torch.bfloat16, case, "cpu")
    written = call(eager_kernel())  # checks the padding itself
    view = written[0]
    assert view._base is not None, "the case must give the output an allocation of its own with padding"
    assert_padding_intact(*written)
    base = view._base.view(-1)
    outside = torch.ones(base.shape, dtype=torch.bool)
    outside.as_strided(*view._base._tk_view_of_padding).fill_(False)
    base[outside.nonzero()[-1]] = 0.0  # the last padding element, as a store one vector too far would
    with pytest.raises(AssertionError, match="past the output view were written"):
        assert_padding_intact(*written, what=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_gelu_bound_catches_zeroed_negative_tail(dtype, act):
    """A GELU that returns 0 below x = -2.75 (where |gelu| < 0.01) fails the float64 bound."""
    x = (torch.randn(64, 257, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    ref, mag = activation_float64(x, act), activation_error_magnitude(x, act, UNIT_ROUNDOFF[dtype])
    good = eager_activation(x, act)
    assert_within(good, ref, mag, 2, act)
    planted = torch.where(x < -2.75, torch.zeros_like(good), good)
    with pytest.raises(AssertionError, match="exceeds the bound"):
        assert_within(planted, ref, mag, 2, act)


def test_fp32_eager_comparison_can_fail():
    """fp32 has no mismatch-share budget: its per-element bound fails a value 1e-4 off."""
    g = torch.Generator().manual_seed(1)
    eager = torch.randn(33, 129, generator=g)
    assert_matches_eager(eager.clone(), eager, eager.double().abs(), 2)
    planted = eager.clone()
    planted[7, 11] *= 1 + 1e-4
    with pytest.raises(AssertionError, match="difference from eager above"):
        assert_matches_eager(planted, eager, eager.double().abs(), 2)


def test_half_precision_share_budget_can_fail():
    """bf16: one-ulp differences in more than MISMATCH_BUDGET's share of the elements fail."""
    g = torch.Generator().manual_seed(2)
    eager = torch.randn(64, 256, generator=g).to(torch.bfloat16)
    planted = eager.clone()
    bits = planted.view(torch.int16)
    bits[:, :8] += 1  # 3 % of the elements one ulp off: each within the element bound
    with pytest.raises(AssertionError, match="of the elements differ from eager"):
        assert_matches_eager(planted, eager, eager.double().abs(), 2)


def test_unknown_dtype_has_no_silent_budget():
    eager = torch.zeros(4, dtype=torch.float64)
    with pytest.raises(KeyError):
        assert_matches_eager(eager.clone(), eager, eager.abs() + 1, 2)
