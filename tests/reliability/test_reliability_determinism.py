"""Is a row's result independent of the batch it is in? (The bitwise rerun of every op is in
test_reliability_ops.py.)

Where the norms' bits depend on more than the row itself, and why (the same text is in the
docstring of transformer_kernels.norm):

- Rows wider than 16384 elements on the 16-byte path (below) are split across blocks when the batch
  has fewer than two rows per SM (``norm_split_chunks`` in csrc/norm/norm.cuh): the row's statistic
  is then summed per 8192-element chunk and the chunks combined in order, instead of by one block.
  So such a row's bits depend on whether its batch has fewer than 2 x SM-count rows, and so on the
  GPU's SM count. Within each regime they do not depend on the batch (tested here).
- The 16-byte path takes rows whose width the vector divides (8 elements for fp16/bf16, 4 for
  fp32) when every operand's pointer and row stride are 16-byte aligned; the element-by-element
  path, for every other row, sums in another order: a row's bits can depend on its tensor's
  alignment (bounds against float64 hold on both; tested in test_norm_family / test_rms_norm). A
  batch of one row has no row stride: one row of a view whose row stride is not aligned (a padded
  slice) takes the 16-byte path where the view's batches of more rows do not.
- Everything else (row groups, warps or a block per row, chosen from the row width alone) gives a
  row the same bits in any batch, at any position, on any GPU of the same architecture.
"""

import pytest
import torch

from helpers import DTYPES, assert_within, random_input
from reference.norms import float64_norm, rms_norm_float64

pytestmark = pytest.mark.gpu
DEVICE = "cuda"  # (a CPU dry run of the test code sets it to "cpu" with an eager stand-in for the kernel)

SPLIT_MIN_HIDDEN = 16384  # csrc/norm/norm.cuh: kSplitMinHidden (rows wider than this may be split)
SPLIT_HIDDEN = 3 * 8192 + 8  # split (a width every vector divides), with a partial last chunk
ODD_WIDE_HIDDEN = 3 * 8192 + 5  # element by element: a block per row, never split


def sm_count():
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def param(n, dtype, lo=0.5, hi=1.5):
    return (torch.rand(n, device=DEVICE) * (hi - lo) + lo).to(dtype)


def norm_ops(hidden, dtype):
    """Per-row forms of the family: each returns the outputs for x [rows, hidden]."""
    w, b = param(hidden, dtype), param(hidden, dtype, -0.5, 0.5)
    scale = random_input((1, hidden), dtype, scale=0.5, offset=0.0, device=DEVICE)
    shift = random_input((1, hidden), dtype, device=DEVICE)
    return {
        "rms_norm": lambda t, x, r: (t.rms_norm(x, w),),
        "layer_norm": lambda t, x, r: (t.layer_norm(x, w, b),),
        "fused_add_rms_norm": lambda t, x, r: t.fused_add_rms_norm(x, r, w),
        "norm_modulate[layer]": lambda t, x, r: (t.norm_modulate(x, scale, shift, norm="layer"),),
        "gated_add_norm_modulate": lambda t, x, r: t.gated_add_norm_modulate(x, r, scale, scale, shift),
    }


OPS = ["rms_norm", "layer_norm", "fused_add_rms_norm", "norm_modulate[layer]", "gated_add_norm_modulate"]


def row_in_batches(tk, op, dtype, hidden, batches, row=0):
    """Row `row`'s outputs (the same values every time) computed in batches of the given sizes,
    the other rows random; returns one list of outputs per batch."""
    fn = norm_ops(hidden, dtype)[op]
    x0, r0 = random_input((1, hidden), dtype, device=DEVICE), random_input((1, hidden), dtype, device=DEVICE)
    results = []
    for n in batches:
        x, r = random_input((n, hidden), dtype, device=DEVICE), random_input((n, hidden), dtype, device=DEVICE)
        pos = min(row, n - 1) if row >= 0 else n - 1
        x[pos], r[pos] = x0[0], r0[0]
        results.append([o[pos] for o in fn(tk, x, r)])
    return results, x0, r0


def assert_all_same_bits(results, what):
    for n, outs in enumerate(results[1:], 1):
        for i, (a, b) in enumerate(zip(outs, results[0])):
            assert torch.equal(a, b), f"{what}: output {i} differs between batch {0} and {n}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [7, 64, 769, 4096, SPLIT_MIN_HIDDEN, ODD_WIDE_HIDDEN])
@pytest.mark.parametrize("op", OPS)
def test_unsplit_row_bits_do_not_depend_on_the_batch(tk, op, dtype, hidden):
    """Rows of at most 16384 elements, and rows of widths the vectors do not divide, are never
    split: a row has the same bits alone, first, last, or anywhere in batches of any size (one
    row, whose tensor has no row stride, included)."""
    batches = [1, 2, 33, 1000 if hidden <= 4096 else 300]
    for row in (0, -1, 1):
        results, _, _ = row_in_batches(tk, op, dtype, hidden, batches, row)
        assert_all_same_bits(results, f"{op} hidden {hidden} row {row}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_split_row_bits_do_not_depend_on_the_batch_within_a_regime(tk, op, dtype):
    """A wide row has the same bits in every batch of fewer than 2 x SM rows (all split) and in
    every batch of at least 2 x SM rows (one block per row)."""
    two_per_sm = 2 * sm_count()
    split, whole = [1, 2, 7, two_per_sm - 1], [two_per_sm, two_per_sm + 1, 3 * two_per_sm]
    for batches in (split, whole):
        for row in (0, -1):
            results, _, _ = row_in_batches(tk, op, dtype, SPLIT_HIDDEN, batches, row)
            assert_all_same_bits(results, f"{op} batches {batches} row {row}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_and_whole_rows_agree_with_float64(tk, dtype):
    """The documented dependence: the same wide rows normalized in a batch below 2 x SM rows (split)
    and above (whole; the batch repeats the rows) may differ in their last bits, and both are within
    the usual bounds of float64. The share of elements that differ is printed (-s) for the record."""
    two_per_sm = 2 * sm_count()
    x = random_input((3, SPLIT_HIDDEN), dtype, device=DEVICE)
    w = param(SPLIT_HIDDEN, dtype)
    b = param(SPLIT_HIDDEN, dtype, -0.5, 0.5)
    many = x.repeat(two_per_sm, 1)  # 3 x 2 x SM rows: not split
    outs = {}
    for xs in (x, many):
        out = tk.rms_norm(xs, w)[:3]
        ref = rms_norm_float64(x, w, 1e-6)
        assert_within(out, ref, ref.abs(), 2, f"rms_norm, {xs.shape[0]} rows")
        ln = tk.layer_norm(xs, w, b)[:3]
        mag = (float64_norm(x, "layer", None, None, 1e-5).abs() + 1) * w.double().abs() + b.double().abs()
        assert_within(ln, float64_norm(x, "layer", w, b, 1e-5), mag, 1.5, f"layer_norm, {xs.shape[0]} rows")
        outs[xs.shape[0]] = (out, ln)
    for i, op in enumerate(("rms_norm", "layer_norm")):
        split, whole = outs[3][i], outs[many.shape[0]][i]
        share = (split != whole).double().mean().item()
        print(f"{op} {dtype}: {share:.2%} of the elements of {SPLIT_HIDDEN}-wide rows differ split vs whole")
