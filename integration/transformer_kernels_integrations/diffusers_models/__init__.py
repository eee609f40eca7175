"""Swap transformer-kernels into diffusers models with one call: ``report = inject(pipe_or_model)``.

A table of rules (``TABLE``, ``patching.RuleTable``), each beside the forwards it patches in:

- ``ltx.py``: LTX-Video's blocks (modulations and residuals fused), attention processor, rope
  coordinates and merged projections;
- ``flux.py``: Flux's attention processor and merged projections;
- ``adaln.py``: the adaptive LayerNorms of Flux, SD3 and SD3.5 (LayerNorm and modulation in one kernel);
- ``sd.py``: Stable Diffusion 1.5/XL UNets and their VAE (ResNet blocks, GroupNorm + SiLU, GEGLU);
- ``generic.py``: any model's GELU (with ``linear_gelu``), RMSNorm and LayerNorm modules;
- ``common.py``: what the attention processors share.

Each rule names the switches it needs (``inject(pipe, rms_norm=..., layer_norm=..., rope=...,
qk_norm_rope=..., gelu=..., norm_modulate=..., merge_projections=..., linear_gelu=..., group_norm=...,
geglu=...)``, all on by default), the module class it matches (by class name, so both
``diffusers.models.normalization.RMSNorm`` and ``torch.nn.RMSNorm`` are found), how it patches an
instance, and the ops it runs (``Rule.ops``, the names of ``docs/ops.md``). Rules for a containing
module come first and claim the modules they fuse (an LTX block claims its norm1/norm2), so nothing
is patched twice; ``uninject`` undoes everything.

How modules are patched (and how hooks survive) is in ``patching.py``. ``enable_model_cpu_offload``
hooks whole components, so injecting before or after it works. Tensors off the GPU run diffusers'
own forwards and processors (``KERNEL_DEVICES``; a logged fallback counted in the report,
``KernelFallbackError`` under ``strict=True``): a model on the CPU never reaches a kernel.

``merge_projections`` (``ltx_merged_projections``, ``flux_merged_projections``: rules that add to a
module, ``also=True``) makes the LTX self-attention's q/k/v, its cross-attention's k/v, and Flux's
q/k/v and added q/k/v one GEMM each over one concatenated weight that the original parameters
become views of (``merging.py``; no memory growth), used where no gradient is wanted (else the
separate projections: a logged fallback); ``uninject`` gives each parameter, the same object,
storage of its own again with its current values.

Training (``inject(model)`` on a model in training mode, or ``training=True``, e.g. LoRA fine-tuning):
a rule is applied only when the ops it needs under grad (``Rule.needs_backward``) have a backward;
the attention processors run the q/k norms with our kernels where those have a backward and with
the modules' own norms otherwise, and the rotations with ours. The merged projections stay (the
separate projections run under grad, a logged fallback), except under ``strict=True``, where they
are skipped.
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType

import torch

from .. import fp8
from ..patching import InjectionReport, Rule, RuleTable, inject_models, uninject_models
from . import adaln, flux, generic, ltx, sd
from .flux import FluxAttnProcessor
from .ltx import LTXAttnProcessor, LTXRopeCoords, ltx_rope_coords

__all__ = ["KERNEL_DEVICES", "RULES", "SWITCHES", "TABLE", "FluxAttnProcessor", "LTXAttnProcessor", "LTXRopeCoords",
           "components", "inject", "ltx_rope_coords", "rules_for", "uninject"]

# Tensors off these devices run diffusers' own code (Rule.kernel_devices; the table's, read by its
# passes: the FP8 layers run their bf16 code): a model on the CPU never reaches a kernel. The merges
# need no guard: their GEMM runs anywhere.
KERNEL_DEVICES = ("cuda",)
_OFF_GPU = "tensors off the GPU: diffusers' own code"


def _kernel_devices() -> tuple[str, ...]:
    return KERNEL_DEVICES


def _guarded(rule: Rule) -> Rule:
    """The rule with ``kernel_devices`` set (merges excepted) and the off-GPU fallback in its text."""
    if rule.merges:
        return rule
    return replace(rule, kernel_devices=_kernel_devices,
                   fallback=f"{rule.fallback}; {_OFF_GPU}" if rule.fallback else _OFF_GPU)


RULES: tuple[Rule, ...] = tuple(map(_guarded, (*ltx.RULES, *flux.RULES, *adaln.RULES, *sd.RULES, *generic.RULES)))
TABLE = RuleTable(RULES, passes=(fp8.PASS,), kernel_devices=_kernel_devices)
SWITCHES = TABLE.switches


def components(pipe_or_model) -> list[tuple[str, torch.nn.Module]]:
    """(name, model) of a pipeline's torch components, or ("", model) for one model."""
    if isinstance(pipe_or_model, torch.nn.Module):
        return [("", pipe_or_model)]
    found = getattr(pipe_or_model, "components", None)
    if not isinstance(found, dict):
        raise TypeError(f"inject: expected a diffusers pipeline or a torch.nn.Module, got {type(pipe_or_model).__name__}")
    return [(name, m) for name, m in found.items() if isinstance(m, torch.nn.Module)]


def rules_for(tk: ModuleType, training: bool, strict: bool = False) -> tuple[Rule, ...]:
    """The rules ``inject`` applies (``RuleTable.rules_for``)."""
    return TABLE.rules_for(tk, training, strict)


def inject(pipe_or_model, tk: ModuleType | None = None, *, strict: bool = False, training: bool | None = None,
           **switches) -> InjectionReport:
    """Patches every supported module of a pipeline's components (or of one model) in place.

    Returns what was replaced, by kind, the matching modules skipped with the reason, and which
    patched paths can fall back at run time. Switches (keywords, all on by default; ``False`` leaves
    that op kind to diffusers): {switches}. ``strict=True``: a run-time fallback raises.
    ``training`` (default: whether any of the models is in training mode): only the rules whose ops
    have a backward (see the module docstring). ``fp8=True`` (a pass of the table, ``fp8.PASS``; off by
    default; inference on GPUs with FP8 tensor cores, compute capability 8.9+): the large linear layers
    of the blocks run as FP8 GEMMs (``fp8.py``: which layers, what stays bf16, memory);
    ``fp8_exclude``: ``fnmatch`` patterns of module paths kept in bf16. Undo with ``uninject``."""
    return inject_models([(name, m, TABLE) for name, m in components(pipe_or_model)], tk, keywords=switches,
                         tables=(TABLE,), strict=strict, training=training)


inject.__doc__ = inject.__doc__.format(switches=", ".join(f"``{s}``" for s in SWITCHES))


def uninject(pipe_or_model) -> int:
    """Restores every forward and processor ``inject`` patched; returns how many changes were undone."""
    return uninject_models([m for _, m in components(pipe_or_model)])
