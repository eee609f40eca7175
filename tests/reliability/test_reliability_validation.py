"""Checks the bindings make that no other test reaches: more than 2^31 - 1 rows (expanded views, so
no memory is needed), more heads than 32 bits count, float64 inputs, eps = inf, outputs that
overlap each other, in-place operands that are expanded or overlap the tables, vLLM's
rotary_embedding's head size, token count, positions and overlaps, and outputs of act_mul and
gated_add aliasing an input. Each must raise a clear error naming the argument, with no launch.

The cases are the families' (tests/<family>/<family>_reliability.py): each dict below gathers the
dict of that name from every family."""

import pytest
import torch

from families import gathered
from helpers import assert_rejects
from reliability_inputs import BIG, INT_MAX, bf

pytestmark = pytest.mark.gpu

ROWS_MSG = f"has {BIG} rows; at most {INT_MAX} are supported"


# ---- more rows than the grid holds (row ops): check_row_count ----

ROWS = gathered("reliability", "ROW_LIMITS")  # name -> call(tk)


@pytest.mark.parametrize("case", sorted(ROWS))
def test_more_rows_than_the_grid_raise(tk, case):
    assert_rejects(lambda: ROWS[case](tk), ValueError, ROWS_MSG)


# ---- RoPE: head counts in 32 bits, at most one block per row of head_dim (new checks) ----

ROPE_LIMITS = gathered("reliability", "HEAD_AND_ROW_LIMITS")  # name -> (call(tk), message)


@pytest.mark.parametrize("case", sorted(ROPE_LIMITS))
def test_rope_head_and_row_counts_raise(tk, case):
    call, message = ROPE_LIMITS[case]
    assert_rejects(lambda: call(tk), ValueError, message)


@pytest.mark.large
def test_rope_cached_row_count_raises(tk):
    """vLLM's form checks query for overlap first, so its 2^31 rows must be real: 2^16 tokens of
    2^15 query heads of 2 elements, 8 GiB of bf16 (skips where the GPU has less free)."""
    need = 2 * 2**31 + (1 << 30)
    if torch.cuda.mem_get_info()[0] < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory")
    T, Hq = 2**16, 2**15
    query = torch.empty(T, Hq * 2, device="cuda", dtype=torch.bfloat16)
    key = bf(T, 2)
    positions = torch.zeros(T, dtype=torch.long, device="cuda")
    message = f"q and k have {T} tokens of {Hq + 1} heads .*; at most 2147483647 rows are supported"
    assert_rejects(lambda: tk.rotary_embedding(positions, query, key, 2, bf(8, 2)), ValueError, message)


# ---- float64 inputs, eps = inf ----

F64 = gathered("reliability", "FLOAT64_INPUTS")  # name -> (call(tk, x), message)


@pytest.mark.parametrize("case", sorted(F64))
def test_float64_inputs_raise(tk, case):
    call, message = F64[case]
    x = torch.randn(2, 4, 8, device="cuda", dtype=torch.float64)
    assert_rejects(lambda: call(tk, x), TypeError, message)


EPS_INF = gathered("reliability", "INFINITE_EPS")  # name -> call(tk)


@pytest.mark.parametrize("case", sorted(EPS_INF))
def test_infinite_eps_raises(tk, case):
    assert_rejects(lambda: EPS_INF[case](tk), ValueError, "eps must be a finite number >= 0, got inf")


# ---- outputs that overlap each other; in-place operands that are expanded or overlap ----

OVERLAP = gathered("reliability", "OVERLAPS")  # name -> (call(tk), message)


@pytest.mark.parametrize("case", sorted(OVERLAP))
def test_overlapping_outputs_and_operands_raise(tk, case):
    call, message = OVERLAP[case]
    assert_rejects(lambda: call(tk), ValueError, message)


# ---- vLLM's rotary_embedding: head size, token count, positions, overlap ----

CACHED = gathered("reliability", "ROTARY_EMBEDDING_CHECKS")  # name -> (call(tk), message)


@pytest.mark.parametrize("case", sorted(CACHED))
def test_rotary_embedding_checks(tk, case):
    call, message = CACHED[case]
    assert_rejects(lambda: call(tk), ValueError, message)


# ---- act_mul, gated_add (and act_and_mul): outputs aliasing an input ----

ALIASED = gathered("reliability", "ALIASED_OUTPUTS")  # name -> (call(tk), message)


@pytest.mark.parametrize("case", sorted(ALIASED))
def test_outputs_aliasing_an_input_raise(tk, case):
    call, message = ALIASED[case]
    assert_rejects(lambda: call(tk), ValueError, message)
