"""Merged projections: q/k/v (or gate/up) as one GEMM over one concatenated weight.

``MergedLinear(module, ("q_proj", "k_proj", "v_proj"))`` concatenates the children's weights (and
biases) once and makes each child's parameter a view of its rows: memory does not grow, the
parameters keep their names, objects and ``state_dict`` keys, and an in-place update of one
(``load_state_dict``, an optimizer step) is an update of the merged weight. Calling it computes
``F.linear(x, merged_weight, merged_bias)`` (or the GEMM a pass set: ``low_precision``, FP8;
``decode``, ``decode_linear`` for a decode step's few rows); ``split`` gives the per-projection outputs as strided
views of that one result (the RoPE, q/k-norm and gated-unit ops read such views without copies).
As vLLM's ``QKVParallelLinear`` / ``MergedColumnParallelLinear`` and diffusers'
``fuse_qkv_projections`` (which keeps a second copy of the weights) do.

A module diffusers already fused (``fuse_qkv_projections()``: ``fused_projections`` set, ``to_qkv`` /
``to_kv`` / ``to_added_qkv`` holding the concatenated weights) is merged with its own fused projection:
its weight and bias are the merge, read as they are, and the children are left untouched, so no third
copy is made and ``unfuse_qkv_projections()`` works after ``detach`` as before ``attach``.

What moves parameters to new storage (``module.to()``/``.half()``, ``load_state_dict(assign=True)``,
replacing a parameter or a child) is noticed: ``module._apply`` is wrapped to merge again after a
conversion, and each eager call compares one tuple (the ids of the children and parameters the
module holds now, the parameters' data pointers) with the one taken at the merge, and merges again
if it differs: dictionary lookups and pointer reads, no attribute search through ``nn.Module``, no
tensor made. A compiled graph trusts the merge it traced (recompile after replacing parameters by
assignment).

The merged weight is used only where no gradient is needed (``torch.is_grad_enabled()`` off, or
no weight requiring one): the children's parameters are the leaves autograd knows, so training
takes the separate projections (``usable`` says which, ``unusable`` why; ``on_fallback``, set by
the integration, hears the reason where the caller asks through ``use``).

``detach`` undoes ``attach`` (``uninject``): each child's parameter, the same object, gets storage of
its own again holding its current values (a copy of its rows of the merged weight; the merged weight
is released once nothing else holds it), and the module loses the merge and the ``_apply`` wrapper.
What is not given back: the parameters' original storages (freed at the merge, so their
``data_ptr()`` differ from before ``inject``); values written through the merge in between (an
optimizer step, ``load_state_dict``) stay, as they would have on the unmerged parameters.
"""

from __future__ import annotations

import types
from typing import Callable, Sequence

import torch
import torch.nn.functional as F


def mergeable(module: torch.nn.Module, names: Sequence[str]) -> str | None:
    """Why ``names`` of ``module`` cannot be merged, or None."""
    linears = [getattr(module, n, None) for n in names]
    missing = [n for n, lin in zip(names, linears) if lin is None]
    if missing:
        return f"no {', '.join(missing)}"
    bad = [n for n, lin in zip(names, linears) if type(lin) is not torch.nn.Linear]
    if bad:  # LoRA/quantized wrappers compute more than x @ W^T + b
        return f"{', '.join(bad)} not a plain torch.nn.Linear ({type(getattr(module, bad[0])).__name__})"
    if len({lin.in_features for lin in linears}) != 1:
        return "the projections take inputs of different widths"
    weights = [lin.weight for lin in linears]
    if len({(w.dtype, w.device) for w in weights}) != 1 or weights[0].device.type == "meta":
        return "the projection weights differ in dtype or device, or are not materialized"
    if len({lin.bias is None for lin in linears}) != 1:
        return "some projections have a bias and others not"
    if any(hasattr(lin, "_hf_hook") for lin in linears) or hasattr(module, "_hf_hook"):
        return "under an accelerate hook (the weights move at each call)"
    return None


# The child diffusers' ``fuse_projections`` makes of each merge key's projections.
DIFFUSERS_FUSED = {"qkv": "to_qkv", "kv": "to_kv", "added_qkv": "to_added_qkv"}


def fused_projection(module: torch.nn.Module, names: Sequence[str], key: str | None) -> torch.nn.Linear | None:
    """The module's own fused projection of ``names`` (diffusers' ``fuse_qkv_projections``) where it
    is a plain ``nn.Linear`` holding exactly their rows' shapes, else None."""
    fused = getattr(module, DIFFUSERS_FUSED.get(key or "", ""), None) if getattr(module, "fused_projections", False) else None
    if type(fused) is not torch.nn.Linear:
        return None
    linears = [getattr(module, n) for n in names]
    same_shape = (fused.out_features == sum(lin.out_features for lin in linears)
                  and fused.in_features == linears[0].in_features
                  and (fused.bias is None) == (linears[0].bias is None))
    return fused if same_shape else None


class MergedLinear:
    """One GEMM for the ``names`` children of ``module`` (plain ``nn.Linear`` with one input width)."""

    def __init__(self, module: torch.nn.Module, names: Sequence[str], key: str | None = None):
        self.module = module
        self.names = tuple(names)
        self.key = key  # the name attach() keeps it under (diffusers' fused projection of that key is used)
        self.sizes = [getattr(module, n).out_features for n in self.names]
        self.enabled = True
        self.weight: torch.Tensor
        self.bias: torch.Tensor | None
        # told why where use() finds the merge unusable (the integration logs, counts or raises it)
        self.on_fallback: Callable[[str], None] | None = None
        # set by inject(fp8=True) (fp8.py): the FP8 GEMM, giving its output, or None where it cannot take x
        self.low_precision: Callable[[torch.Tensor], torch.Tensor | None] | None = None
        # set by the decode pass (decode.py) where the GEMM runs 16-bit: decode_linear's output where the
        # call has few rows, or None (F.linear then runs)
        self.decode: Callable[[torch.Tensor], torch.Tensor | None] | None = None
        # told after each refresh() (inject(fp8=True) plans again what the block that feeds it emits)
        self.on_refresh: Callable[[], None] | None = None
        self.merge()

    def _linears(self) -> list[torch.nn.Linear]:
        return [getattr(self.module, n) for n in self.names]

    def merge(self) -> None:
        """Concatenates the children's current weights and makes them views of the result; or, where
        the module holds diffusers' fused projection of them, takes its weight and bias as they are."""
        linears = self._linears()
        self.sizes = [lin.out_features for lin in linears]
        fused = fused_projection(self.module, self.names, self.key)
        self.fused = fused is not None
        if fused is not None:
            self.weight, self.bias, self.device = fused.weight, fused.bias, fused.weight.device
            params = [p for p in (fused.weight, fused.bias) if p is not None]
            slots = [(self.module._modules, DIFFUSERS_FUSED[self.key])]
            slots += [(fused._parameters, k) for k in ("weight", "bias")]
            self._dicts, self._keys = tuple(d for d, _ in slots), tuple(k for _, k in slots)
            self._params = tuple(params)
            self._held = ((fused,), self._params)
            self._state = self._current_state()
            return
        with torch.no_grad():
            weight = torch.cat([lin.weight for lin in linears])
            bias = torch.cat([lin.bias for lin in linears]) if linears[0].bias is not None else None
            for lin, w in zip(linears, weight.split(self.sizes)):
                lin.weight.data = w
            if bias is not None:
                for lin, b in zip(linears, bias.split(self.sizes)):
                    lin.bias.data = b
        # static under CUDA-graph trees (reduce-overhead), as parameters are: never copied per replay
        torch._dynamo.mark_static_address(weight)
        if bias is not None:
            torch._dynamo.mark_static_address(bias)
        self.weight, self.bias, self.device = weight, bias, weight.device
        # What the per-call check reads: (dictionary, key) of each child and parameter, and the
        # parameters. The objects are held here, so no other object can take their ids.
        params = [p for lin in linears for p in (lin.weight, lin.bias) if p is not None]
        slots = [(self.module._modules, n) for n in self.names]
        slots += [(lin._parameters, k) for lin in linears for k in ("weight", "bias")]
        self._dicts, self._keys = tuple(d for d, _ in slots), tuple(k for _, k in slots)
        self._params = tuple(params)
        self._held = (tuple(linears), self._params)
        self._state = self._current_state()

    def _current_state(self) -> tuple:
        """The ids of the children and parameters in the module's slots, then the parameters' data
        pointers: different when a child or parameter was replaced or its data moved."""
        return (*map(id, map(dict.get, self._dicts, self._keys)), *map(torch.Tensor.data_ptr, self._params))

    def refresh(self) -> None:
        """Merges again after a child or parameter was replaced (``load_state_dict(assign=True)``, a
        manual swap), or turns the merge off where the children can no longer be merged."""
        self.enabled = mergeable(self.module, self.names) is None
        if self.enabled:
            self.merge()
        else:
            self._state = self._current_state()  # checked again only when the slots change again
        if self.on_refresh is not None:
            self.on_refresh()

    def usable(self, x: torch.Tensor) -> bool:
        """True where the merged GEMM gives what the separate projections give, gradients aside:
        no gradient is wanted, the merge is current (refreshed here when not), and x is on the
        weight's device. Call it before ``__call__``/``split``."""
        if torch.is_grad_enabled() and self.weight_requires_grad():
            return False
        if not torch.compiler.is_compiling() and self._current_state() != self._state:
            self.refresh()
        return self.enabled and x.device == self.device

    def unusable(self, x: torch.Tensor) -> str | None:
        """Why ``usable(x)`` is False, or None."""
        if torch.is_grad_enabled() and self.weight_requires_grad():
            return ("gradients are wanted (the projections' own parameters are the autograd leaves; "
                    "inject(..., merge_projections=False) for training)")
        if not self.enabled:
            return f"the projections {list(self.names)} can no longer be merged: {mergeable(self.module, self.names)}"
        if x.device != self.weight.device:
            return f"the input is on {x.device}, the merged weight on {self.weight.device}"
        return None

    def use(self, x: torch.Tensor) -> bool:
        """``usable(x)``; where False, ``on_fallback`` (if set) is told why."""
        if self.usable(x):
            return True
        if self.on_fallback is not None:
            self.on_fallback(self.unusable(x))
        return False

    def weight_requires_grad(self) -> bool:
        own = (self.weight, self.bias) if self.fused else ()
        return any(p.requires_grad for lin in self._linears() for p in (lin.weight, lin.bias) if p is not None) or \
            any(p is not None and p.requires_grad for p in own)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.low_precision is not None:
            out = self.low_precision(x)
            if out is not None:
                return out
        if self.decode is not None:
            out = self.decode(x)
            if out is not None:
                return out
        return F.linear(x, self.weight, self.bias)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The projections of x: strided views of one merged result, in ``names`` order."""
        return self(x).split_with_sizes(self.sizes, dim=-1)


def _apply_then_merge(module: torch.nn.Module, fn, *args, **kwargs):
    """``module._apply`` (behind ``.to()``, ``.half()``, ``.cuda()``), then the module's merges
    again from the converted weights. A function of the module alone, so ``copy.deepcopy`` of a
    model gives the copy its own."""
    result = type(module)._apply(module, fn, *args, **kwargs)
    for merged in module.__dict__.get("_tk_merged", {}).values():
        merged.refresh()
    return result


def merged_of(module: torch.nn.Module, key: str) -> MergedLinear | None:
    return getattr(module, "_tk_merged", {}).get(key)


def attach(module: torch.nn.Module, key: str, names: Sequence[str]) -> MergedLinear:
    """Merges ``names`` of ``module`` and keeps the result on it (no parameter or buffer: nothing in
    ``state_dict``), under ``key``; the same call again returns the existing merge."""
    table = module.__dict__.setdefault("_tk_merged", {})
    if key not in table:
        table[key] = MergedLinear(module, names, key)
    if "_apply" not in module.__dict__:
        module._apply = types.MethodType(_apply_then_merge, module)
    return table[key]


def detach(module: torch.nn.Module, key: str) -> None:
    """Undoes ``attach(module, key, ...)``: the children's parameters (the same objects) get storage
    of their own again with their current values, and with the module's last merge its
    ``_tk_merged`` table and ``_apply`` wrapper go (see the module docstring for what is restored)."""
    table = module.__dict__.get("_tk_merged", {})
    merged = table.pop(key, None)
    if merged is not None:
        shared = {t.untyped_storage().data_ptr() for t in (merged.weight, merged.bias) if t is not None}
        with torch.no_grad():
            for lin in merged._linears():
                for p in (lin.weight, lin.bias):
                    # only what is still a view of the merge (a parameter replaced since is the user's)
                    if p is not None and p.untyped_storage().data_ptr() in shared:
                        p.data = p.data.clone(memory_format=torch.contiguous_format)
    if not table:
        module.__dict__.pop("_tk_merged", None)
        apply = module.__dict__.get("_apply")
        if getattr(apply, "__func__", None) is _apply_then_merge:
            del module.__dict__["_apply"]
