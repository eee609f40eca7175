"""reference/fp8.py, the rounding every FP8-quantizing kernel is tested against, checked against an
independent float64 model of e4m3 (its 256 codes decoded from bits, the nearest chosen by value) on
ties, saturation, subnormals and non-finite values, and the row-wise recipe's edge rows. CPU only."""

import pytest
import torch

from conftest import FULL_CHECKOUT

if not FULL_CHECKOUT:
    pytest.skip("reference/ is not in this source set", allow_module_level=True)

from reference.fp8 import AMAX_FLOOR, E4M3_MAX, dequantize_fp8, e4m3_round, e4m3_spacing, quantize_fp8_rowwise


def e4m3_values() -> torch.Tensor:
    """Every finite e4m3fn value, ascending, decoded from its bits (sign, 4 exponent bits of bias 7,
    3 mantissa bits; exponent 0 subnormal; 0x7F/0xFF NaN, no infinities)."""
    values = set()
    for code in range(256):
        sign, exponent, mantissa = code >> 7, (code >> 3) & 0xF, code & 0x7
        if exponent == 0xF and mantissa == 0x7:
            continue  # NaN
        magnitude = mantissa / 8 * 2.0**-6 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7)
        values.add(-magnitude if sign else magnitude)
    return torch.tensor(sorted(values), dtype=torch.float64)


def nearest_even(v: float, grid: torch.Tensor) -> float:
    """v rounded to the grid (saturating): the nearest value, a tie to the one with an even code
    (an even mantissa: even multiples of the spacing)."""
    v = min(max(v, -E4M3_MAX), E4M3_MAX)
    d = (grid - v).abs()
    best = d.min()
    candidates = grid[d == best]
    if len(candidates) == 1:
        return candidates.item()
    even = [c for c in candidates.tolist() if (abs(c) / e4m3_spacing(torch.tensor(c)).item()) % 2 == 0]
    return even[0]


def test_decoded_grid_has_the_e4m3fn_range():
    grid = e4m3_values()
    assert len(grid) == 253  # 254 finite codes, +0 and -0 one value
    assert grid.max().item() == E4M3_MAX and grid[grid > 0].min().item() == 2.0**-9


def test_rounding_matches_the_independent_model_on_ties_saturation_and_random_values():
    grid = e4m3_values()
    mids = ((grid[1:] + grid[:-1]) / 2).float()  # exact ties (fp32 holds them)
    gen = torch.Generator().manual_seed(8)
    samples = torch.cat([mids, grid.float(), torch.randn(4000, generator=gen) * 50, torch.randn(1000, generator=gen) * 0.01,
                         torch.tensor([449.0, 463.9, 464.0, 464.1, 1e4, -1e30, 2.0**-10, 2.0**-11, 3 * 2.0**-11])])
    got = e4m3_round(samples).double()
    want = torch.tensor([nearest_even(v, grid) for v in samples.double().tolist()], dtype=torch.float64)
    bad = (got != want).nonzero().flatten()
    assert len(bad) == 0, [(samples[i].item(), got[i].item(), want[i].item()) for i in bad[:8]]


def test_non_finite_values_saturate_or_become_the_positive_nan():
    values = torch.tensor([float("inf"), -float("inf"), float("nan"), -float("nan")])
    values = torch.cat([values, torch.tensor([float("inf")]) / torch.tensor([float("inf")])])  # the CPU's -NaN
    got = e4m3_round(values)
    assert got[0].float().item() == E4M3_MAX and got[1].float().item() == -E4M3_MAX
    assert got[2:].view(torch.uint8).tolist() == [0x7F] * 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rowwise_rounds_once_and_keeps_each_row_within_half_a_spacing(dtype):
    gen = torch.Generator().manual_seed(9)
    x = (torch.randn(37, 129, generator=gen) * torch.logspace(-3, 3, 37).unsqueeze(1)).to(dtype)
    q, scale = quantize_fp8_rowwise(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert scale.dtype == torch.float32 and scale.shape == (37, 1)
    # the row's largest magnitude lands on ±448, and every value within half an e4m3 spacing
    assert (q.float().abs().amax(-1) == E4M3_MAX).all()
    exact = x.double() / scale.double()
    assert ((q.double() - exact).abs() <= e4m3_spacing(exact) / 2 * (1 + 2.0**-20)).all()
    err = (dequantize_fp8(q, scale) - x.double()).abs()
    assert (err <= e4m3_spacing(exact) / 2 * scale.double() * (1 + 2.0**-20)).all()


def test_edge_rows():
    x = torch.tensor([[0.0, -0.0, 0.0], [1.0, float("nan"), 2.0], [1.0, float("inf"), -2.0], [3.0, -7.0, 0.5]])
    q, scale = quantize_fp8_rowwise(x)
    assert scale[0].item() == pytest.approx(AMAX_FLOOR / E4M3_MAX, rel=1e-7) and (q[0].float() == 0).all()
    assert scale[1].isnan().all() and q[1].float().isnan().all()  # x / NaN is NaN everywhere
    assert scale[2].isinf().all() and q[2].float()[1].isnan() and (q[2].float()[[0, 2]] == 0).all()
    assert scale[3].item() == pytest.approx(7.0 / E4M3_MAX, rel=1e-7) and q[3].float()[1].item() == -E4M3_MAX
    assert dequantize_fp8(q, scale)[1:3].isnan().all()
