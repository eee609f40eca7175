"""The arithmetic fact the kernels' packed 16-bit ops rely on (csrc/common/vec.cuh: mul_rn, add_rn),
checked on the host (no GPU): for bf16 and fp16 operands, eager PyTorch's
``(a.float() op b.float()).to(T)`` (an fp32 rounding, then a rounding to T) equals the correctly
rounded T result of the exact ``a op b``, which is what ``mul.rn``/``add.rn`` on bf16x2/f16x2 compute.
(Figueroa 1995: double rounding is innocuous when the wider format has at least 2p + 1 bits.)

The exact result is computed with fractions and rounded to nearest-even by hand, over random bit
patterns (every exponent, subnormals, zeros) and over pairs of close exponents, where ties and
carries happen. The kernels' bit-exactness against eager is tested on the GPU (test_norm_family,
test_activation, test_rope); this test shows why it holds for every input, not just sampled ones."""

import math
from fractions import Fraction

import pytest
import torch

# (mantissa bits p including the implicit one, smallest normal exponent, largest exponent)
FORMATS = {torch.bfloat16: (8, -126, 127), torch.float16: (11, -14, 15)}
SAMPLES = 20000


def round_to_nearest_even(x: Fraction, dtype: torch.dtype) -> float:
    """x rounded to the nearest value of `dtype` (ties to even, subnormals, overflow to inf)."""
    p, emin, emax = FORMATS[dtype]
    if x == 0:
        return 0.0
    sign, x = (-1.0 if x < 0 else 1.0), abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    quantum = Fraction(2) ** (max(e, emin) - p + 1)  # subnormals share the smallest normal quantum
    n = x / quantum
    whole = n.numerator // n.denominator
    rest = n - whole
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2 == 1):
        whole += 1
    r = whole * quantum
    return sign * (math.inf if r >= Fraction(2) ** (emax + 1) else float(r))


def random_operands(dtype: torch.dtype, close_exponents: bool, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Finite pairs: random bit patterns, or values whose exponents differ by at most 12."""
    if close_exponents:
        a = (torch.rand(SAMPLES, generator=g) + 0.5) * 2.0 ** torch.randint(-8, 8, (SAMPLES,), generator=g)
        b = (torch.rand(SAMPLES, generator=g) + 0.5) * 2.0 ** torch.randint(-8, 8, (SAMPLES,), generator=g)
        signs = torch.randint(0, 2, (2, SAMPLES), generator=g) * 2 - 1
        return (a * signs[0]).to(dtype), (b * signs[1]).to(dtype)
    bits = torch.randint(0, 1 << 16, (2, 4 * SAMPLES), generator=g, dtype=torch.int32).to(torch.int16)
    values = bits.view(dtype)
    finite = values.float().isfinite().all(0)
    return values[0][finite][:SAMPLES], values[1][finite][:SAMPLES]


@pytest.mark.parametrize("close_exponents", [False, True], ids=["any_bits", "close_exponents"])
@pytest.mark.parametrize("op", ["mul", "add"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp32_then_t_equals_one_t_rounding(dtype, op, close_exponents):
    g = torch.Generator().manual_seed(7)
    a, b = random_operands(dtype, close_exponents, g)
    eager = (a.float() * b.float() if op == "mul" else a.float() + b.float()).to(dtype).float().tolist()
    for x, y, got in zip(a.float().tolist(), b.float().tolist(), eager):
        exact = Fraction(x) * Fraction(y) if op == "mul" else Fraction(x) + Fraction(y)
        assert got == round_to_nearest_even(exact, dtype), f"{x!r} {op} {y!r}: eager {got!r}"


def test_reference_rounding_catches_double_rounding():
    """The hand rounding is not the fp32 path in disguise: for a value just above a bf16 tie, it
    rounds up where a rounding through a 9-bit format (a too-narrow intermediate) would tie to even."""
    x = 1 + Fraction(1, 256) + Fraction(1, 2**20)  # above the tie between 1 and 1 + 2^-7
    assert round_to_nearest_even(x, torch.bfloat16) == 1 + 2**-7
    nine_bits = Fraction(round(x * 2**8), 2**8)  # 1 + 2^-8: now exactly a tie
    assert round_to_nearest_even(nine_bits, torch.bfloat16) == 1.0
