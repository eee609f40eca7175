"""In-place and out= forms tell autograd what they wrote: each written tensor's version counter
moves (as after an aten in-place op), so a backward that would read a tensor saved before the write
raises instead of computing a gradient from the modified values. Every catalog entry that writes an
argument, on meta tensors (the fakes; the CPU shows it) and on CUDA."""

import pytest
import torch

import op_catalog as oc

WRITING = sorted(name for name in oc.ENTRIES if oc.build(name, torch.float32, oc.cases_of(name)[0], "meta").writes)
DEVICES = ["meta", pytest.param("cuda", marks=pytest.mark.gpu)]


def test_every_form_that_writes_is_covered():
    """Every in-place and out= op of torch_binding.cpp (a `!` in its schema) has a writing catalog entry."""
    from eager_kernel import schemas

    mutating = {name for name, schema in schemas().items() if "!" in schema}
    covered = {oc.ENTRIES[name][1] for name in WRITING}
    assert mutating and mutating <= covered, f"no writing catalog entry for {sorted(mutating - covered)}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", WRITING)
def test_writes_bump_the_version_counter(tk, name, device):
    call = oc.build(name, torch.bfloat16, oc.cases_of(name)[0], device)
    read_only = [i for i in call.tensor_positions() if i not in call.writes]
    before = [t._version for t in call.args if isinstance(t, torch.Tensor)]
    with torch.no_grad():
        call(tk)
    after = [t._version for t in call.args if isinstance(t, torch.Tensor)]
    positions = call.tensor_positions()
    for k, i in enumerate(positions):
        if i in call.writes:
            assert after[k] > before[k], f"{name}: written argument {i} kept version {before[k]}"
        elif i in read_only and device == "meta":  # (CUDA entries may alias a read argument with a written one)
            assert after[k] == before[k], f"{name}: read-only argument {i} bumped {before[k]} -> {after[k]}"




@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", WRITING)
def test_backward_through_a_saved_tensor_it_wrote_raises(tk, name, device):
    """`y = t * w` saves t for w's gradient; writing t afterwards must make y's backward raise, as
    aten's in-place ops do (`t.add_(1)` here raises the same)."""
    call = oc.build(name, torch.bfloat16, oc.cases_of(name)[0], device)
    for i in call.writes:
        t = call.args[i]
        w = torch.ones((), dtype=t.dtype, device=t.device, requires_grad=True)
        y = (t * w).sum()
        call(tk)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


def test_aten_raises_the_same():
    t = torch.randn(3, device="meta")
    w = torch.ones((), device="meta", requires_grad=True)
    y = (t * w).sum()
    t.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
