"""Autograd glue shared by the op families.

Every op is registered in C++ with CUDA (and CPU) kernels only. Without an Autograd kernel PyTorch
runs such an op on inputs that require grad and only warns: the output has no ``grad_fn``, so
training silently drops every gradient behind it. Each op therefore gets one of two things:

- ``register_backward(name, backward, setup_context)``: ``torch.library.register_autograd``, and the
  op is recorded as trainable (``has_backward(name)``, which the integrations consult in training
  mode);
- ``refuse_grad(name, why)``: an Autograd kernel that raises, naming the op, when the op is called
  under grad mode with an input that requires grad, and otherwise runs the op as before. For ops
  whose backward does not exist yet, the out= forms, the backward ops themselves (no double
  backward), and the in-place inference forms (``rope_``, ``rotary_embedding``, ...), which stay
  forward-only.

Both are Python Autograd kernels: a call outside ``torch.inference_mode()`` pays a few µs of host
time for them (``torch.no_grad()`` still dispatches through the Autograd key).

The small helpers at the bottom are shared by the backward functions.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._ops import add_op_namespace_prefix, ops

_LIBRARIES: dict[str, torch.library.Library] = {}  # namespace -> the FRAGMENT holding our kernels
_TRAINABLE: set[str] = set()  # ops registered with a backward


def _library(qualname: str) -> torch.library.Library:
    namespace = qualname.split("::")[0]
    if namespace not in _LIBRARIES:
        _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    return _LIBRARIES[namespace]


def register_backward(name: str, backward, setup_context) -> None:
    """``torch.library.register_autograd`` for op ``name`` of this build's namespace, recorded as
    trainable. ``setup_context(ctx, inputs, output)`` saves what ``backward(ctx, *grads)`` needs."""
    torch.library.register_autograd(add_op_namespace_prefix(name), backward, setup_context=setup_context)
    _TRAINABLE.add(name)


def has_backward(name: str) -> bool:
    """Whether op ``name`` (the C++ schema's name, e.g. ``"act_mul"``) has a backward."""
    return name in _TRAINABLE


def refuse_grad(name: str, why: str) -> None:
    """Registers the refusal guard for op ``name`` (of this build's namespace).

    Under grad mode with any tensor argument that requires grad, the op raises ``RuntimeError``:
    ``"<name>: <why>"``; otherwise (no_grad, inference mode, or no input requiring grad) it runs
    unchanged. ``why`` says what to do instead (another op, ``torch.no_grad()``, detaching)."""
    qualname = add_op_namespace_prefix(name)
    op = getattr(ops, name).default
    message = f"{name}: {why}"

    def autograd_kernel(keyset, *args, **kwargs):
        if torch._C.is_grad_enabled() and torch._C._any_requires_grad(*args, *kwargs.values()):
            raise RuntimeError(message)
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args, **kwargs)

    _library(qualname).impl(name, autograd_kernel, "Autograd", with_keyset=True)


NO_BACKWARD = ("has no backward: it was called under grad mode with an input that requires grad, "
               "and its gradient would be lost. Call it under torch.no_grad() / torch.inference_mode(), "
               "detach the inputs, or use the eager PyTorch code for training")
IN_PLACE_INFERENCE = ("is an in-place inference form and has no backward: it was called under grad mode "
                      "with an input that requires grad. Use the out-of-place op for training "
                      "(it has a backward), or call this one under torch.no_grad() / torch.inference_mode()")
OUT_FORM = ("writes into `out` and has no backward: it was called under grad mode with an input that "
            "requires grad. Use the functional form (no out=) for training, which has a backward")


def unit_stride_rows(grad: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A gradient as the kernels take it: autograd may hand a backward an expanded (stride-0) or
    otherwise strided gradient (the backward of ``.sum()``, of a broadcast), while the kernels read
    rows of unit stride. Such a gradient is copied once; any other is passed as it is."""
    if grad is None or grad.dim() == 0 or grad.size(-1) <= 1 or grad.stride(-1) == 1:
        return grad
    return grad.contiguous()


def check_no_grad(op: str, **tensors: Optional[torch.Tensor]) -> None:
    """Raises when an argument the op's backward does not differentiate requires grad (RoPE's
    cos/sin, coordinates, frequencies): returning no gradient for it would silently drop one."""
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise RuntimeError(f"{op}: {name} requires grad, but this op's backward gives gradients for its "
                               f"other inputs only; detach {name} (tables built from buffers need no grad) "
                               f"or use the eager code")
