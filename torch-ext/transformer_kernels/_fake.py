"""Fake (meta) impls that check their arguments as the kernels do.

``register_fake(name)`` is ``torch.library.register_fake`` for op ``name`` of this build's
namespace, with the op's own C++ checks run first: the op's CUDA kernel is called on meta stand-ins
of the arguments (same sizes, strides, offsets and dtypes, no memory), where every check runs and
nothing launches (``validation_only`` in csrc/common/checks.h). A fake then raises what the kernel
raises, the same exception type and message, under ``torch.compile`` at trace time instead of at
run time, with one copy of each check (C++).

Device placement, which the stand-ins cannot show (they are all meta), is checked here first, with
the kernels' message: every tensor argument on the device of the op's first input (``check_devices``;
a CPU tensor beside meta ones would otherwise get a fake result of uninitialised memory). What else
the stand-ins cannot show is checked at run time only: whether outputs share memory with inputs
(meta tensors have no addresses), the pointer alignment the kernels' plans depend on, and arguments
with symbolic sizes (``dynamic=True``) or on the CPU (the CPU paths check themselves).

The first fake call on fake tensors (a trace: torch.compile, export) also registers every op of this
build with inductor as a fallback (``register_inductor_fallbacks``), so that inductor never takes its
"implicit fallback" path for them, whose log line stringifies the op's input IR eagerly: on a graph as
deep as a whole LTX-Video transformer (28 blocks of our ops) that string grows exponentially and the
first call of ``torch.compile(model)`` never ended (torch 2.11).
"""

from __future__ import annotations

import torch

from ._ops import add_op_namespace_prefix, ops

_CUDA_KERNEL = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)


def _concrete(t: torch.Tensor) -> bool:
    return all(type(v) is int for v in (*t.shape, *t.stride(), t.storage_offset()))


def _meta_stand_in(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with t's sizes, strides, storage offset and dtype."""
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0) if t.numel() else 0
    storage = torch.empty(t.storage_offset() + extent, dtype=t.dtype, device="meta")
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


def _stand_ins(value):
    if isinstance(value, torch.Tensor):
        return _meta_stand_in(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_stand_ins(v) for v in value)
    return value


def _named_tensors(name: str, args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor, bool]]:
    """(argument name, tensor, written by the op) for every tensor argument of op `name`'s call, in
    schema order (the elements of a tensor list as ``name[i]``)."""
    named = []
    for i, arg in enumerate(getattr(ops, name).default._schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        written = arg.alias_info is not None and arg.alias_info.is_write
        if isinstance(value, torch.Tensor):
            named.append((arg.name, value, written))
        elif isinstance(value, (list, tuple)):
            named += [(f"{arg.name}[{j}]", t, written) for j, t in enumerate(value) if isinstance(t, torch.Tensor)]
    return named


def check_devices(name: str, named: list[tuple[str, torch.Tensor, bool]]) -> None:
    """Every tensor argument of op `name` (``named``: ``_named_tensors``) on the device of its first
    input (outputs, ``out=`` and in place, are checked against it too): the kernels' ValueError
    (check_same_device in csrc/common/checks.h), naming the argument and both devices."""
    inputs = [(n, t) for n, t, written in named if not written] or [(n, t) for n, t, _ in named]
    if not inputs:
        return
    ref_name, ref = inputs[0]
    for arg, t, _ in named:
        if t.device != ref.device:
            raise ValueError(f"{name}: {arg} must be on the same device as {ref_name} ({ref.device}), got {t.device}")


def check_like_the_kernel(name: str, args: tuple, kwargs: dict) -> None:
    """Runs op `name`'s device check, then its C++ checks on meta stand-ins of `args` (see the
    module docstring)."""
    named = _named_tensors(name, args, kwargs)
    check_devices(name, named)
    tensors = [t for _, t, _ in named]
    if any(t.device.type == "cpu" for t in tensors) or not all(_concrete(t) for t in tensors):
        return
    if not torch._C._dispatch_has_kernel_for_dispatch_key(add_op_namespace_prefix(name), "CUDA"):
        return  # a build of the package without CUDA kernels (the CPU test stand-ins)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch._C._AutoDispatchBelowADInplaceOrView():
        getattr(ops, name).default.redispatch(_CUDA_KERNEL, *_stand_ins(args), **_stand_ins(kwargs))


_inductor_fallbacks_tried = False


def register_inductor_fallbacks() -> bool:
    """Registers every op of this build's namespace with inductor as the fallback (an extern call of
    the op) inductor would make of it implicitly, with the same layout constraint, but without its
    implicit path's eager ``log.info(..., operator_str(target, args, kwargs))``: that formats the
    inputs' IR, a string exponential in the depth of the graph behind them (whole-model compiles of
    LTX-Video hung there). Tried once per process; False where this torch's inductor lacks the pieces."""
    global _inductor_fallbacks_tried
    _inductor_fallbacks_tried = True
    try:
        from torch._inductor.lowering import lowerings, make_fallback, tag_to_layout_constraint
        from torch._library.utils import get_layout_constraint_tag
    except ImportError:
        return False
    prefix = add_op_namespace_prefix("")
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith(prefix):
            continue
        name, _, overload = qualified[len(prefix):].partition(".")
        op = getattr(getattr(ops, name), overload or "default")
        if op not in lowerings:
            constraint = tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
            make_fallback(op, layout_constraint=constraint)
    return True


def _traced(args: tuple, kwargs: dict) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(a, FakeTensor) for a in (*args, *kwargs.values()))


def register_fake(name: str):
    """``torch.library.register_fake`` for op `name`, the kernel's checks first."""

    def register(fake):
        def checked_fake(*args, **kwargs):
            if not _inductor_fallbacks_tried and _traced(args, kwargs):
                from torch._subclasses.fake_tensor import unset_fake_temporarily

                with unset_fake_temporarily():  # inductor's modules import outside the trace's fake mode
                    register_inductor_fallbacks()
            check_like_the_kernel(name, args, kwargs)
            return fake(*args, **kwargs)

        checked_fake.__name__ = checked_fake.__qualname__ = f"fake_{name}"
        checked_fake.__doc__ = fake.__doc__
        torch.library.register_fake(add_op_namespace_prefix(name))(checked_fake)
        return fake

    return register
