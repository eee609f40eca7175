"""The kernel package's real Python code (torch-ext/transformer_kernels: the API, the Hub layers,
the fake impls) on the CPU, with each C++ op replaced by the eager code it reproduces.

``eager_kernel()`` defines every op of torch_binding.cpp (the same schemas, parsed from the file) in
a private torch.library namespace with CPU implementations made of the eager reference code
(reference/), and loads the package source against that namespace. Integration tests then inject
it into a model on the CPU in bf16: the layers' own logic (which rounding a host module gets, its
eps, its weight and bias) and every wrapper's argument handling run for real, and the result must
be the eager model's bit for bit (in fp32 the three RMSNorm roundings coincide; in bf16 they don't).

Each family's stand-ins are in ``tests/<family>/<family>_eager.py`` (tests/families.py): ``IMPLS``
(each functional op -> its eager code), ``BACKWARD`` (each backward op -> its eager gradients) and,
for an in-place op with no functional form, ``IN_PLACE``. This module keeps what they share (the
FP8 outputs, autograd below the Autograd key) and derives the other forms from the schemas: an
``_out`` op writes its functional form's results into its outputs, an in-place op (``name_``) into
the arguments it marks written.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import torch

from families import gathered
from reference.fp8 import quantize_fp8_rowwise

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "tk_eager_cpu"
PACKAGE = "tk_eager_cpu_package"


def schemas() -> dict[str, str]:
    """name -> schema of every ops.def in torch_binding.cpp (adjacent string literals joined)."""
    text = (ROOT / "torch-ext" / "torch_binding.cpp").read_text()
    found = {}
    for literals in re.findall(r'ops\.def\(((?:\s*"[^"]*")+)\s*\)', text):
        schema = "".join(re.findall(r'"([^"]*)"', literals))
        found[schema.split("(", 1)[0]] = schema
    return found


# ---- what the families' stand-ins share ----

def fp8_outputs(values):
    """quantize_fp8's (codes, scale) of values, contiguous as the op returns them."""
    return tuple(t.contiguous() for t in quantize_fp8_rowwise(values))


def with_autograd(fn):
    """fn() with autograd on: the impls run below the Autograd key, which this lifts again."""
    keys = torch._C.DispatchKeySet
    autograd = (keys(torch._C.DispatchKey.AutogradFunctionality) | keys(torch._C.DispatchKey.AutogradOther)
                | keys(torch._C.DispatchKey.AutogradNestedTensor))
    exclude = torch._C._dispatch_tls_local_exclude_set() - autograd
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude), torch.enable_grad():
        return fn()


def vjp(forward, inputs, grads, mask, like):
    """The gradients of sum(out_i * grads_i) over forward(*inputs)'s outputs for the inputs `mask`
    asks for (None grads: outputs not used); the empty placeholder (like the kernels' `like`-dtype
    [0] tensor) where an input is not asked for or is None."""
    def run():
        leaves = [None if t is None else t.detach().float().requires_grad_(bool(asked))
                  for t, asked in zip(inputs, mask)]
        outs = forward(*leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        used = [(o, g.float()) for o, g in zip(outs, grads) if g is not None]
        wanted = [leaf for leaf in leaves if leaf is not None and leaf.requires_grad]
        got = iter(torch.autograd.grad([o for o, _ in used], wanted, [g for _, g in used], allow_unused=True)
                   if wanted else ())
        result = []
        for t, leaf in zip(inputs, leaves):
            if leaf is None or not leaf.requires_grad:
                result.append(like.new_empty((0,)))
                continue
            g = next(got)
            result.append((torch.zeros_like(leaf) if g is None else g).to(t.dtype))
        return tuple(result)

    return with_autograd(run)


# ---- every op's stand-in: the families' IMPLS and BACKWARD, their out= and in-place forms ----

def impls() -> dict:
    """op -> its eager stand-in, for the functional and backward ops of every family."""
    return {**gathered("eager", "IMPLS"), **gathered("eager", "BACKWARD")}


def _out_form(functional, outs: int):
    """name_out(outs..., inputs...) writes the functional form's results into its outs."""
    def impl(*args):
        results = functional(*args[outs:])
        for o, r in zip(args[:outs], results if isinstance(results, tuple) else (results,)):
            o.copy_(r)

    return impl


def _in_place_form(functional, written: list[int]):
    """name_(args...) writes the functional form's results into the arguments its schema marks written."""
    def impl(*args):
        results = functional(*args)
        for i, r in zip(written, results if isinstance(results, tuple) else (results,)):
            args[i].copy_(r)

    return impl


def _written(schema: str) -> list[int]:
    arguments = schema.split("(", 1)[1].rsplit(") ->", 1)[0].split(", ")
    return [i for i, argument in enumerate(arguments) if "!" in argument.split(" ")[0]]


def stand_ins() -> dict:
    """op -> the CPU implementation of every op of torch_binding.cpp that has an eager twin here."""
    functional, in_place = impls(), gathered("eager", "IN_PLACE")
    found = {}
    for name, schema in schemas().items():
        if name in functional:
            found[name] = functional[name]
        elif name in in_place:
            found[name] = in_place[name]
        elif name.endswith("_out") and name[:-4] in functional:
            found[name] = _out_form(functional[name[:-4]], schema.split("(", 1)[1].count("Tensor!"))
        elif name.endswith("_") and name[:-1] in functional:
            found[name] = _in_place_form(functional[name[:-1]], _written(schema))
    return found


_LIB = None
_MODULE = None


def _define_ops():
    global _LIB
    if _LIB is not None:
        return
    lib = torch.library.Library(NAMESPACE, "DEF")
    found = stand_ins()
    for name, schema in schemas().items():
        lib.define(schema)
        if name in found:  # (an op with no eager twin here: calling it raises NotImplementedError)
            lib.impl(name, found[name], "CPU")
    _LIB = lib


def eager_kernel() -> types.ModuleType:
    """The package (API, layers, fake impls) over the eager CPU ops; loaded once per process."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    _define_ops()
    ops_module = types.ModuleType(f"{PACKAGE}._ops")
    ops_module.ops = getattr(torch.ops, NAMESPACE)
    ops_module.add_op_namespace_prefix = lambda op: f"{NAMESPACE}::{op}"
    sys.modules[ops_module.__name__] = ops_module
    source = ROOT / "torch-ext" / "transformer_kernels"
    spec = importlib.util.spec_from_file_location(PACKAGE, source / "__init__.py",
                                                  submodule_search_locations=[str(source)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)
    _MODULE = module
    return module
