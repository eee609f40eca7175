"""Autograd glue shared by the op families.

Every op is registered in C++ with CUDA (and CPU) kernels only. Without an Autograd kernel PyTorch
runs such an op on inputs that require grad and only warns: the output has no ``grad_fn``, so
training silently drops every gradient behind it. Each op therefore gets one of two things:

- a backward: ``torch.library.register_autograd`` (``register_backward`` here is that call);
  ``has_backward(name)`` says which ops have one (the integrations consult it in training mode);
- a refusal (``register_refusal(name, why)``): an Autograd kernel that raises, naming the op, when
  the op is called under grad mode with an input that requires grad, and otherwise runs it as
  before. ``refuse_the_rest()`` (called once every family has registered) gives one to every op of
  the namespace left without an Autograd kernel: the ``out=`` forms, the in-place inference forms
  (``rope_``, ``rotary_embedding``, ...), which stay forward-only, and the backward ops themselves
  (no double backward). The Python API of an ``out=`` or in-place form also checks early with
  ``refuse_grad`` (a clearer message, before any work).

Both kinds are Python Autograd kernels, which cost several µs a call even when autograd has
nothing to record; host-bound decode would pay that for every op. ``dispatch`` runs an op below
the Autograd key in that case (eager, grad off or no input requiring grad); under
``torch.compile`` the op is traced as it is, autograd included.

The helpers at the bottom are shared by the backward functions.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._ops import add_op_namespace_prefix, ops

_below_autograd = torch._C._AutoDispatchBelowAutograd
_LIBRARIES: dict[str, torch.library.Library] = {}  # namespace -> the FRAGMENT holding the refusals
_REFUSED: set[str] = set()  # ops whose Autograd kernel is a refusal


def dispatch(op, *args):
    """op(*args), below the Autograd key when autograd has nothing to record (eager code with grad
    off, or no tensor argument requiring grad): the Python autograd kernel that register_autograd
    installs costs several µs a call even then, which host-bound decode pays for every op. Under
    torch.compile the op is traced as it is, autograd included."""
    if torch.compiler.is_compiling() or (
            torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)):
        return op(*args)
    with _below_autograd():
        return op(*args)


def refuse_grad(op: str, form: str, *tensors: Optional[torch.Tensor]) -> None:
    """Raises for a form without a backward (in place, ``out=``) called where autograd would need
    one: grad enabled and an input that requires grad. Never a silently dropped gradient."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError(
            f"{op}: the {form} has no backward, and an input requires grad; call the functional form "
            f"(no out=, not in place) to train through it, or run under torch.no_grad()")


def register_backward(name: str, backward, setup_context) -> None:
    """``torch.library.register_autograd`` for op ``name`` of this build's namespace.
    ``setup_context(ctx, inputs, output)`` saves what ``backward(ctx, *grads)`` needs."""
    torch.library.register_autograd(add_op_namespace_prefix(name), backward, setup_context=setup_context)


def _has_autograd_kernel(name: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(add_op_namespace_prefix(name), "Autograd")


def has_backward(name: str) -> bool:
    """Whether op ``name`` (the C++ schema's name, e.g. ``"act_mul"``) has a backward."""
    return name not in _REFUSED and _has_autograd_kernel(name)


NO_BACKWARD = ("has no backward: it was called under grad mode with an input that requires grad, "
               "and its gradient would be lost. Call it under torch.no_grad() / torch.inference_mode(), "
               "detach the inputs, or use the functional form or the eager code for training")
IN_PLACE_INFERENCE = ("is an in-place inference form and has no backward: it was called under grad mode "
                      "with an input that requires grad. Use the out-of-place op for training "
                      "(it has a backward), or call this one under torch.no_grad() / torch.inference_mode()")
OUT_FORM = ("writes into `out` and has no backward: it was called under grad mode with an input that "
            "requires grad. Use the functional form (no out=) for training, which has a backward")
DOUBLE_BACKWARD = ("is a backward op and has no backward itself (no double backward): it was called under "
                   "grad mode with an input that requires grad (create_graph=True?)")


def register_refusal(name: str, why: str) -> None:
    """The refusal Autograd kernel for op ``name``: under grad mode with any tensor argument that
    requires grad it raises ``RuntimeError("<name>: <why>")``; otherwise (no_grad, inference mode,
    or no input requiring grad) the op runs unchanged."""
    qualname = add_op_namespace_prefix(name)
    op = getattr(ops, name).default
    message = f"{name}: {why}"

    def autograd_kernel(keyset, *args, **kwargs):
        if torch._C.is_grad_enabled() and torch._C._any_requires_grad(*args, *kwargs.values()):
            raise RuntimeError(message)
        with _below_autograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args, **kwargs)

    namespace = qualname.split("::")[0]
    if namespace not in _LIBRARIES:
        _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    _LIBRARIES[namespace].impl(name, autograd_kernel, "Autograd", with_keyset=True)
    _REFUSED.add(name)


def _namespace_ops() -> list[str]:
    namespace = add_op_namespace_prefix("")[:-2]  # "<namespace>::" without the separator
    prefix = f"{namespace}::"
    names = {n[len(prefix):].split(".")[0] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix)}
    return sorted(names)


def refuse_the_rest() -> list[str]:
    """Gives every op of the namespace without an Autograd kernel the refusal (the message says
    which kind of op it is); returns their names."""
    refused = []
    for name in _namespace_ops():
        if _has_autograd_kernel(name):
            continue
        if name.endswith("_backward"):
            why = DOUBLE_BACKWARD
        elif name.endswith("_out"):
            why = OUT_FORM
        elif name.endswith("_"):
            why = IN_PLACE_INFERENCE
        else:
            why = NO_BACKWARD
        register_refusal(name, why)
        refused.append(name)
    return refused


def grad_rows(grad: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """An incoming gradient as the backward kernels read it: rows of unit stride (leading dims any
    stride, read in place). The one shared place every op family's backward takes its incoming
    gradients through. Autograd may hand a layout the kernels refuse: an expanded one (the backward
    of ``.sum()`` or ``.mean()``: stride 0 everywhere) or one whose last dimension is strided; only
    those are materialized, once, as eager autograd's elementwise backward effectively reads them.
    ``clone`` rather than ``contiguous()``: an empty expanded gradient counts as contiguous and
    would keep its stride 0."""
    if grad is None or grad.dim() == 0 or grad.size(-1) <= 1 or grad.stride(-1) == 1:
        return grad
    return grad.clone(memory_format=torch.contiguous_format)


def grad_or_zeros(grad: Optional[torch.Tensor], like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The gradient of an output, zeros where autograd passes none (an output not used)."""
    return grad if grad is not None else like.new_zeros(like.shape, dtype=dtype)


def check_no_grad(op: str, **tensors: Optional[torch.Tensor]) -> None:
    """Raises when an argument the op's backward does not differentiate requires grad (RoPE's
    cos/sin, coordinates, frequencies): returning no gradient for it would silently drop one."""
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise RuntimeError(f"{op}: {name} requires grad, but this op's backward gives gradients for its "
                               f"other inputs only; detach {name} (tables built from buffers need no grad) "
                               f"or use the eager code")
