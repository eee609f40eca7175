"""Merged projections: q/k/v (or gate/up) as one GEMM over one concatenated weight.

``MergedLinear(module, ("q_proj", "k_proj", "v_proj"))`` concatenates the children's weights (and
biases) once and makes each child's parameter a view of its rows: memory does not grow, the
parameters keep their names, objects and ``state_dict`` keys, and an in-place update of one
(``load_state_dict``, an optimizer step) is an update of the merged weight. Calling it computes
``F.linear(x, merged_weight, merged_bias)``; ``split`` gives the per-projection outputs as strided
views of that one result (the RoPE, q/k-norm and gated-unit ops read such views without copies).
As vLLM's ``QKVParallelLinear`` / ``MergedColumnParallelLinear`` and diffusers'
``fuse_qkv_projections`` (which keeps a second copy of the weights) do.

What moves parameters to new storage (``module.to()``/``.half()``, ``load_state_dict(assign=True)``,
replacing a parameter) is noticed: ``module._apply`` is wrapped to merge again after a conversion,
and each eager call checks that the children's weights are still the views (one pointer
comparison per weight) and merges again if not. A compiled graph trusts the merge it traced
(recompile after replacing parameters by assignment).

The merged weight is used only where no gradient is needed (``torch.is_grad_enabled()`` off, or
no weight requiring one): the children's parameters are the leaves autograd knows, so training
takes the separate projections (``usable`` says which).
"""

from __future__ import annotations

import types
from typing import Sequence

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


class MergedLinear:
    """One GEMM for the ``names`` children of ``module`` (plain ``nn.Linear`` with one input width)."""

    def __init__(self, module: torch.nn.Module, names: Sequence[str]):
        self.module = module
        self.names = tuple(names)
        self.sizes = [getattr(module, n).out_features for n in self.names]
        self.weight: torch.Tensor
        self.bias: torch.Tensor | None
        self.merge()

    def _linears(self) -> list[torch.nn.Linear]:
        return [getattr(self.module, n) for n in self.names]

    def merge(self) -> None:
        """Concatenates the children's current weights and makes them views of the result."""
        linears = self._linears()
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
        self.weight, self.bias = weight, bias
        self._pointers = self._current_pointers()

    def _current_pointers(self) -> tuple:
        params = [p for lin in self._linears() for p in (lin.weight, lin.bias) if p is not None]
        return tuple(p.data_ptr() for p in params)

    def usable(self, x: torch.Tensor) -> bool:
        """True where the merged GEMM gives what the separate projections give, gradients aside:
        no gradient is wanted, and x is on the weight's device."""
        if torch.is_grad_enabled() and self.weight_requires_grad():
            return False
        return x.device == self.weight.device

    def weight_requires_grad(self) -> bool:
        return any(p.requires_grad for lin in self._linears() for p in (lin.weight, lin.bias) if p is not None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling() and self._current_pointers() != self._pointers:
            self.merge()  # a parameter was replaced (assign=True load, manual swap): merge it again
        return F.linear(x, self.weight, self.bias)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The projections of x: strided views of one merged result, in ``names`` order."""
        return self(x).split(self.sizes, dim=-1)


def _apply_then_merge(module: torch.nn.Module, fn, *args, **kwargs):
    """``module._apply`` (behind ``.to()``, ``.half()``, ``.cuda()``), then the module's merges
    again from the converted weights. A function of the module alone, so ``copy.deepcopy`` of a
    model gives the copy its own."""
    result = type(module)._apply(module, fn, *args, **kwargs)
    for merged in module.__dict__.get("_tk_merged", {}).values():
        merged.merge()
    return result


def merged_of(module: torch.nn.Module, key: str) -> MergedLinear | None:
    return getattr(module, "_tk_merged", {}).get(key)


def attach(module: torch.nn.Module, key: str, names: Sequence[str]) -> MergedLinear:
    """Merges ``names`` of ``module`` and keeps the result on it (no parameter or buffer: nothing in
    ``state_dict``), under ``key``; the same call again returns the existing merge."""
    table = module.__dict__.setdefault("_tk_merged", {})
    if key not in table:
        table[key] = MergedLinear(module, names)
    if "_apply" not in module.__dict__:
        module._apply = types.MethodType(_apply_then_merge, module)
    return table[key]
