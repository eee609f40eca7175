"""Glue between the transformer-kernels Hub kernel and the libraries users run (diffusers, transformers).

    from transformer_kernels_integrations import inject, uninject
    report = inject(model_or_pipe)                  # every op kind on; rope=False, rms_norm=False, ... turn one off
    print(report)                                   # replaced / skipped (why) / can fall back
    uninject(model_or_pipe)                         # every patched forward and function restored, merges undone
    with injected(model_or_pipe, swiglu=False):     # the same, undone on leaving the block
        ...

``inject`` dispatches by what it is given: a transformers model gets the transformers rules
(``transformers_models``), anything else (a diffusers model, or each component of a diffusers
pipeline) the diffusers rules (``diffusers_models``); a pipeline's transformers components (text
encoders) get the transformers rules. Each of the two is a package with one module per model
family, each rule beside the forwards it patches in; the machinery they share (rules, switches,
patching and its undo, training gating, the report) is ``patching.py``. The kernel loads through
``kernels`` (``loading.py``).

Lives outside ``torch-ext/``: it may import anything; the Hub package may not import it.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Iterator

import torch

from . import diffusers_models, transformers_models
from .loading import REPO_ID, VERSION, load_kernel, use_local_build
from .patching import InjectionReport, KernelFallbackError, inject_models

__all__ = ["InjectionReport", "KernelFallbackError", "REPO_ID", "SWITCHES", "VERSION", "inject", "injected",
           "load_kernel", "uninject", "use_local_build"]


def _is_transformers_model(model: torch.nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.")


# Both tables (they import neither diffusers nor transformers): inject takes the switches and passes of both
TABLES = (diffusers_models.TABLE, transformers_models.TABLE)
# Every switch of both tables' rules
SWITCHES = tuple(sorted(set(diffusers_models.SWITCHES) | set(transformers_models.SWITCHES)))


def inject(model_or_pipe, tk: ModuleType | None = None, *, strict: bool = False, training: bool | None = None,
           **switches) -> InjectionReport:
    """Patches a transformers model, a diffusers model, or every component of a diffusers pipeline in
    place, and returns the report (replaced, skipped with why, run-time fallbacks).

    Switches, one per op kind, all on by default (``SWITCHES``): ``rms_norm``, ``layer_norm``, ``rope``,
    ``swiglu``, ``gelu``, ``fused_add_rms_norm``, ``qk_norm_rope``, ``norm_modulate``,
    ``merge_projections`` (q/k/v and gate/up as one GEMM each), ``linear_gelu`` (a tanh-GELU FFN
    projection with the GELU in the GEMM's epilogue); a switch a model's rules do not use changes
    nothing. ``strict=True`` makes a run-time fallback (CPU tensors, autocast, other dtypes, merged
    projections where gradients are wanted) raise ``KernelFallbackError`` instead of logging it once. `tk`: the kernel
    module (default: ``load_kernel()``, the Hub or the local build LOCAL_KERNELS names). ``training``
    (default: whether any of the models is in training mode): only the rules whose ops have a
    backward, and a causal LM's loss through the fused linear cross-entropy
    (``fused_linear_cross_entropy``). Passes declared by the tables (``RuleTable.passes``): ``fp8=True``
    (off by default; inference on GPUs with FP8 tensor cores, compute capability 8.9+): the large linear
    layers of the transformer blocks run as FP8 GEMMs, quantized per token and per output channel
    (``fp8.py`` says which layers stay bf16 and what it costs in memory); ``fp8_exclude``: ``fnmatch``
    patterns of module paths kept in bf16; ``fp8_weights_only=True``: those layers keep e4m3 weights in
    place of their 16-bit ones (freed) and take 16-bit inputs (LLM decode). ``decode_linear`` (the
    transformers models' pass, on by default; ``False`` turns it off): the decoder layers' 16-bit
    projections run ``decode_linear`` for a decode step's rows (``decode.py``: the thresholds)."""
    if isinstance(model_or_pipe, torch.nn.Module):
        models = [("", model_or_pipe)]
    else:
        models = diffusers_models.components(model_or_pipe)
    with_tables = [(name, m, (transformers_models if _is_transformers_model(m) else diffusers_models).TABLE)
                   for name, m in models]
    return inject_models(with_tables, tk, keywords=switches, tables=TABLES, strict=strict, training=training)


def uninject(model_or_pipe) -> int:
    """Restores everything ``inject`` patched (forwards, processors, the process-wide RoPE function
    once no injected model needs it; merged projections give each parameter storage of its own
    again, with its current values); returns how many changes were undone."""
    return diffusers_models.uninject(model_or_pipe)


@contextlib.contextmanager
def injected(model_or_pipe, tk: ModuleType | None = None, *, strict: bool = False, training: bool | None = None,
             **switches) -> Iterator[InjectionReport]:
    """``inject`` for the duration of a ``with`` block; ``uninject`` on leaving it, even on an error."""
    report = inject(model_or_pipe, tk, strict=strict, training=training, **switches)
    try:
        yield report
    finally:
        uninject(model_or_pipe)

