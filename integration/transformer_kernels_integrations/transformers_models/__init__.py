"""Swap transformer-kernels into transformers' Llama-family models: ``report = inject(model)``.

A table of rules (``TABLE``, ``patching.RuleTable``) matched by class name, so Llama, Mistral, Qwen2
and Qwen3 share it; each model's rules sit beside the forwards they patch in:

- ``llama.py``: the decoder layer, the attention's merged q/k/v and rotation, the gated MLP and the
  RMSNorms (Llama, Mistral, Qwen2, and Qwen3's non-attention modules);
- ``qwen3.py``: Qwen3's attention with its per-head q/k norms (tried before Llama's attention rules);
- ``attention.py``: the attention forward both use;
- ``causal_lm.py``: the fused linear cross-entropy loss, in training;
- ``hub.py``: the Hub path (``kernel_mapping``, ``kernel_config``).

Each rule names the switches it needs (``inject(model, rms_norm=..., rope=..., swiglu=...,
fused_add_rms_norm=..., qk_norm_rope=..., merge_projections=..., fused_linear_cross_entropy=...)``, all
on by default; the names follow Liger's ``apply_liger_kernel_to_*`` keywords), and the ops it runs
(``Rule.ops``, the names of ``docs/ops.md``).

Every patched forward checks the device: tensors off the GPU (``KERNEL_DEVICES``) run transformers'
own code (a logged fallback of that rule's kind), so a model on the CPU never reaches a kernel.

Merged projections (``merge_projections=True``, the default) keep one weight per merge: the
original parameters become views of it (no memory growth; ``state_dict`` keys unchanged); they are
used where no gradient is needed (inference, ``generate``), the separate projections elsewhere (a
logged fallback: ``strict=True`` raises there, so a model injected for inference and then trained
under ``strict`` needs ``merge_projections=False``; see Training below). ``uninject`` gives each
parameter, the same object, storage of its own again with its current values (``merging.detach``).

Training (``inject(model)`` on a model in training mode, or ``training=True``): only the rules whose
ops all have a backward (``tk.has_backward``, ``Rule.needs_backward``) are applied, the others are
skipped with the reason, and a ``*ForCausalLM`` called with ``labels`` computes its loss with the
fused linear cross-entropy (``causal_lm.py``). The merged rules stay in training (the separate
projections run under grad, a logged fallback) except under ``strict=True``, where they skip and the
unmerged rules take those modules, so a strict training step does not raise.
"""

from __future__ import annotations

from types import ModuleType

import torch

# Devices whose tensors go to the kernels; elsewhere (CPU) transformers' own code runs. Tests widen
# it to run reference stand-ins for the kernels through the patched forwards on CPU. Defined before
# the rule modules are imported: their forwards read it at call time through kernel_devices(), as
# the table's passes do (RuleTable.kernel_devices: the FP8 layers).
KERNEL_DEVICES = ("cuda",)


def kernel_devices() -> tuple[str, ...]:
    return KERNEL_DEVICES


def on_kernel_device(t: torch.Tensor) -> bool:
    return t.device.type in KERNEL_DEVICES


from .. import decode, fp8  # noqa: E402
from ..patching import InjectionReport, Rule, RuleTable, inject_models, uninject_models  # noqa: E402
from . import causal_lm, gemma, llama, qwen3  # noqa: E402
from .hub import HUB_LAYERS, LLAMA_HUB_LAYERS, kernel_config, kernel_mapping  # noqa: E402
from .qwen3 import QWEN3_ATTENTIONS  # noqa: E402

__all__ = ["HUB_LAYERS", "KERNEL_DEVICES", "LLAMA_HUB_LAYERS", "QWEN3_ATTENTIONS", "RULES", "SWITCHES", "TABLE",
           "TRAINING_RULES", "inject", "kernel_config", "kernel_mapping", "rules_for", "uninject"]

RULES: tuple[Rule, ...] = (llama.DECODER_LAYER, *qwen3.RULES, *llama.ATTENTION_RULES, *llama.MLP_RULES,
                           llama.RMS_NORM, *gemma.RULES)
TRAINING_RULES: tuple[Rule, ...] = causal_lm.TRAINING_RULES
# the FP8 pass first: the decode pass gives decode_linear to the 16-bit GEMMs it leaves
TABLE = RuleTable(RULES, TRAINING_RULES, passes=(fp8.PASS, decode.PASS), kernel_devices=kernel_devices)
SWITCHES = TABLE.switches


def rules_for(tk: ModuleType, training: bool, strict: bool = False) -> tuple[Rule, ...]:
    """The rules ``inject`` applies (``RuleTable.rules_for``)."""
    return TABLE.rules_for(tk, training, strict)


def inject(model: torch.nn.Module, tk: ModuleType | None = None, *, strict: bool = False,
           training: bool | None = None, **switches) -> InjectionReport:
    """Patches a transformers model in place; returns what was replaced, what was skipped (why),
    and which patched paths can fall back at run time.

    Switches (keywords, all on by default; ``False`` leaves that op kind to transformers):
    {switches}. ``strict=True`` makes a run-time fallback raise ``KernelFallbackError`` instead of
    logging it once. ``training`` (default: ``model.training``): only the rules whose ops have a
    backward, and the fused linear cross-entropy for the causal LM's loss (``training`` in the
    report; see the module docstring). ``fp8=True`` (a pass of the table, ``fp8.PASS``; off by default;
    inference on GPUs with FP8 tensor cores, compute capability 8.9+): the large linear layers of the
    blocks run as FP8 GEMMs (``fp8.py``: which layers, what stays bf16, memory); ``fp8_exclude``:
    ``fnmatch`` patterns of module paths kept in bf16; ``fp8_weights_only=True``: those layers keep
    e4m3 weights in place of their 16-bit ones and 16-bit inputs, ``decode_linear`` for a decode
    step's rows (at most ``decode.FP8_MAX_ROWS``), the dequantized weight with ``F.linear`` for more.
    ``decode_linear`` (a pass on by default, ``decode.PASS``; ``False`` turns it off): the decoder
    layers' 16-bit projections (and merges) run ``decode_linear`` where a call has at most
    ``decode.BF16_MAX_ROWS`` rows, ``F.linear`` otherwise (``decode.py``: the thresholds and what they
    come from). `tk`: the kernel module (default: ``load_kernel()``). Undo with ``uninject``."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"inject: expected a transformers model (torch.nn.Module), got {type(model).__name__}")
    return inject_models([("", model, TABLE)], tk, keywords=switches, tables=(TABLE,), strict=strict,
                         training=training)


inject.__doc__ = inject.__doc__.format(switches=", ".join(f"``{s}``" for s in SWITCHES))


def uninject(model: torch.nn.Module) -> int:
    """Restores every forward and function ``inject`` patched in `model`; returns how many changes
    were undone (0 for a model that was not injected)."""
    return uninject_models([model])
