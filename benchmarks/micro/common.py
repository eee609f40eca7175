"""Helpers every family's micro-benchmark cases share: the baselines a case times beside ours
(the eager code, its torch.compile, Liger), the backward pass as a replayable call, and bytes moved."""

from __future__ import annotations

from typing import Callable

import torch

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}



def compiled(fn: Callable) -> Callable:
    """torch.compile of the eager code, specialized to the case's shapes (dynamic=False)."""
    return torch.compile(fn, dynamic=False)


def with_baselines(ours: Callable, eager: Callable, args: tuple, eager_name: str = "eager",
                   liger: Callable | None = None, liger_args: tuple = ()) -> dict[str, Callable]:
    """The implementations one case times: ours, the eager code, its torch.compile, and Liger."""
    compiled_eager = compiled(eager)
    impls = {"ours": ours, eager_name: lambda: eager(*args), "compile": lambda: compiled_eager(*args)}
    if liger is not None:
        impls["liger"] = lambda: liger(*liger_args)
    return impls


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def liger_fn(module: str, name: str) -> Callable | None:
    try:
        return getattr(__import__(f"liger_kernel.ops.{module}", fromlist=[name]), name).apply
    except (ImportError, AttributeError):
        return None


# ---- backward ----
# Each case times the backward pass alone: the forward runs once, then autograd.grad (retain_graph)
# replays the backward of ours (through the autograd registration), of the eager code, of its
# torch.compile and of Liger; "ours (op)" calls our backward op directly. Bytes: what a backward
# must move at least (the saved input and the output gradient read, the input gradient written,
# parameters and their gradients).

def backward_of(forward: Callable, inputs: tuple, grad_like: Callable | None = None) -> Callable:
    """The backward of forward(*inputs) as a replayable call: the forward runs here once; the
    output gradients are fresh random tensors of the outputs' shapes and dtypes."""
    leaves = [t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
              for t in inputs]
    outs = forward(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = [torch.randn_like(o) for o in outs]
    wrt = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    return lambda: torch.autograd.grad(outs, wrt, grads, retain_graph=True)


def backward_impls(ours: Callable, eager: Callable, inputs: tuple, eager_name: str = "eager",
                   liger: Callable | None = None, op: Callable | None = None) -> dict[str, Callable]:
    impls = {"ours": backward_of(ours, inputs), eager_name: backward_of(eager, inputs),
             "compile": backward_of(compiled(eager), inputs)}
    if liger is not None:
        impls["liger"] = backward_of(liger, inputs)
    if op is not None:
        impls["ours (op)"] = op
    return impls
