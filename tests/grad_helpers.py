"""Gradient checks the backward tests share: inputs that require grad with the layout under test,
torch.autograd.grad of the present inputs, and the error bound of an fp32-computed gradient."""

import torch

from helpers import SUBNORMAL_ROUNDOFF, UNIT_ROUNDOFF


def grad_bound(out: torch.Tensor, ref: torch.Tensor, sums: int = 1, terms=None) -> torch.Tensor:
    """What a gradient computed in fp32 and rounded once to out's dtype may be off by: one rounding
    (u |ref|) plus fp32 arithmetic on terms of the tensor's magnitude, (256 + sums) 2^-24 max|ref|,
    `sums` the longest chain of additions beyond a row (the rows of a weight gradient). `terms`:
    elementwise, the magnitude of the terms whose sum the gradient is (norm_dx_terms), where they
    can cancel to much less than max|ref|: fp32's errors scale with them, not with the result."""
    scale = ref.abs().max().item() if ref.numel() else 0.0
    scale = scale if terms is None else terms.clamp(min=scale)
    return UNIT_ROUNDOFF[out.dtype] * ref.abs() + (256 + sums) * 2.0**-24 * scale + SUBNORMAL_ROUNDOFF[out.dtype]


def assert_grad(out, ref, what: str, dtype=None, sums: int = 1, terms=None):
    assert out is not None, f"{what}: no gradient (dropped)"
    ref = ref.detach()
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    if dtype is not None:
        assert out.dtype == dtype, f"{what}: dtype {out.dtype}, expected {dtype}"
    err = (out.double() - ref).abs()
    excess = (err - grad_bound(out, ref, sums, terms)).max().item() if err.numel() else 0.0
    assert excess <= 0, f"{what}: max error {err.max().item():.3g} exceeds the bound by {excess:.3g}"


def leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def grad_inputs(*tensors):
    """The op's inputs as tensors that require grad, each with its own strides: a view stays the
    same view (of a leaf copy of its base), so the kernels see the layout under test; take the
    gradients with grads_of."""
    out = []
    for t in tensors:
        if t is None or t._base is None:
            out.append(None if t is None else leaf(t))
        else:
            out.append(leaf(t._base).as_strided(t.shape, t.stride(), t.storage_offset()))
    return out


def grads_of(outs, inputs, grad_outs):
    """torch.autograd.grad of outs with respect to the present inputs (None kept in place)."""
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    grad_outs = grad_outs if isinstance(grad_outs, (tuple, list)) else (grad_outs,)
    present = [t for t in inputs if t is not None]
    found = iter(torch.autograd.grad(outs, present, grad_outs))
    return [None if t is None else next(found) for t in inputs]


def f64(t):
    return None if t is None else t.detach().double().requires_grad_(True)


class KeepFlceGradients(torch.utils._python_dispatch.TorchDispatchMode):
    """Keeps references to the gradient outputs of the fused_linear_cross_entropy op (hidden's,
    weight's), as anything holding the op's outputs would."""

    grads: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func._opname == "fused_linear_cross_entropy":
            self.grads = list(out[1:3])
        return out
