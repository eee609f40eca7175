"""The GEMMs of a decode step: ``decode_linear`` where a call has few rows, ``F.linear`` (cuBLAS) otherwise.

A decode step multiplies a few tokens' rows by every weight of the model: each GEMM reads its weight
once and computes little, so a kernel that streams the weight (``decode_linear``, at most 8 rows) can
read it at the copy rate where cuBLAS's GEMMs, tiled for many rows, read it below that rate.

Which calls take it is decided in Python at each call from x's shape (its rows: the tokens of the
step) and the weight (dtype, width), by ``takes``: per call in eager mode; once at capture inside a
captured decode step (``cuda_graphs.capture_decode``), whose graph replays the kernel chosen; at trace
time under ``torch.compile`` (static shapes; guarded where dynamic), where ``decode_linear`` is a
custom op with a fake: no graph break.

The thresholds are the one place this is decided, from what was measured (H100 80GB HBM3, 2026-12-06,
the micro-benchmarks of ``decode_linear`` at Llama-3.1-8B's shapes against ``F.linear`` in bf16, median
of CUDA-event timings with L2 flushed, kernel build 254ece3; the run ``2026-12-06-micro-fp8-decode-h100``):

============================  ==============  =================================  ======================
shape (rows x in -> out)      bf16 weight     e4m3 weight + scale (weight-only)  vs
============================  ==============  =================================  ======================
1 x 4096 -> 6144 (q/k/v)      1.04x           1.59x                              F.linear bf16
1 x 4096 -> 4096 (o)          1.03x           1.53x                              F.linear bf16
1 x 4096 -> 28672 (gate/up)   1.02x           1.66x                              F.linear bf16
1 x 14336 -> 4096 (down)      1.00x           1.43x                              F.linear bf16
1 x 4096 -> 1024 (k or v)     0.90x           1.04x                              F.linear bf16
8 x 4096 -> 28672             0.51x           0.68x                              F.linear bf16
============================  ==============  =================================  ======================

So, defaulting to what was measured faster:

- 16-bit weights (``BF16_MAX_ROWS``, ``BF16_MIN_OUT_FEATURES``): one row, and at least 4096 outputs.
  There ``decode_linear`` is not slower than ``F.linear`` (1.00-1.04x); at 8 rows it is half its
  speed, and 2-7 rows were not measured; 4096 -> 1024 ran at 0.90x. Raise these when the 8-row
  kernel improves (issue 44 item 1).
- e4m3 weights (``FP8_MAX_ROWS``, ``inject(fp8=True, fp8_weights_only=True)``): every row count the
  op takes (8). Such a layer has no 16-bit weight: its other path dequantizes the codes and runs
  ``F.linear`` (``fp8.py``), which reads the weight's byte, writes two and reads two per weight, more
  than ``F.linear`` bf16's two; ``decode_linear`` reads one (1.43-1.66x ``F.linear`` bf16 at 1 row, 0.68x
  at 8: faster than the dequantizing path at every row count it takes).

``PASS`` (the transformers table's, on by default: ``inject(model, decode_linear=False)`` turns it
off) gives the 16-bit projections inside the decoder layers (a path with ``layers.<i>``: attention
q/k/v/o, MLP gate/up/down, and their merges) whose shapes qualify the decode forward; the FP8 pass's
weight-only layers run the same choice with ``FP8_MAX_ROWS`` themselves (``fp8.py``). Where
``decode_linear`` does not run (more rows, tensors off the GPU, gradients wanted, autocast, x of
another dtype than the weight, rows not one aligned stride apart), ``F.linear`` runs: the designed
path, not a fallback, so nothing is logged and ``strict=True`` does not raise.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import torch
import torch.nn.functional as F

from . import merging
from .patching import Pass

# ---- the thresholds (see the module docstring for the figures they come from) ----

# The most rows of x (tokens of a decode step) that take decode_linear with a 16-bit weight: 1 row
# ran at F.linear's speed (1.00-1.04x), 8 rows at 0.51x, 2-7 unmeasured.
BF16_MAX_ROWS = 1
# ... and only for weights with at least this many outputs: 4096 -> 1024 ran at 0.90x, >= 4096 at 1.00-1.04x.
BF16_MIN_OUT_FEATURES = 4096
# The most rows that take decode_linear with an e4m3 weight (weight-only FP8): all the op takes (its
# kDecodeMaxRows): 1.43-1.66x F.linear bf16 at 1 row, 0.68x at 8, where the other path (dequantize, then
# F.linear) is slower than F.linear bf16 itself.
FP8_MAX_ROWS = 8
# What the op takes at all (csrc/gemm/decode_linear.cuh, kDecodeMaxRows).
OP_MAX_ROWS = 8

SWITCH = KIND = "decode_linear"
OPS = ("decode_linear",)
# The 16-bit dtypes decode_linear was measured with.
DTYPES = (torch.bfloat16, torch.float16)
# A path inside a decoder layer (transformers' model.layers.<i>).
_IN_LAYER = re.compile(r"(^|\.)layers\.\d+\.")


def rows(x: torch.Tensor) -> int:
    """The rows of x (every dimension but the last): the tokens of the call."""
    return math.prod(x.shape[:-1])


def aligned_rows(x: torch.Tensor) -> bool:
    """x's rows are contiguous and start on a 16-byte boundary (what the op loads). While tracing
    (torch.compile) an address cannot be read without a graph break: contiguity alone is checked there
    (the projections' inputs are fresh tensors; the op refuses a misaligned one with an error)."""
    if not x.is_contiguous():
        return False
    return torch.compiler.is_compiling() or x.data_ptr() % 16 == 0


def takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, max_rows: int,
          devices: Callable[[], tuple[str, ...]]) -> bool:
    """Whether ``decode_linear(x, weight, ...)`` can run this call: 1 to `max_rows` rows (never more
    than the op takes), on a kernel device, no gradient wanted, autocast off, x 16-bit with the weight's
    dtype (or the weight e4m3), the bias in x's dtype, a width the op loads in 16-byte steps. x's layout
    is the caller's to check (``aligned_rows``: the 16-bit path then takes F.linear, the FP8 one copies x)."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or not 1 <= rows(x) <= min(max_rows, OP_MAX_ROWS):
        return False
    if x.device.type not in devices() or torch.is_autocast_enabled(x.device.type):
        return False
    if x.dtype not in DTYPES or weight.dtype not in (x.dtype, torch.float8_e4m3fn):
        return False
    if bias is not None and bias.dtype != x.dtype:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return False
    return weight.is_contiguous() and x.shape[-1] % (16 // min(x.element_size(), weight.element_size())) == 0


def selected(path: str, module: torch.nn.Module) -> bool:
    """Whether the pass gives this module the decode forward: a plain ``nn.Linear`` inside a decoder
    layer, with a 16-bit weight of at least ``BF16_MIN_OUT_FEATURES`` outputs and a width the op
    loads in 16-byte steps, that no earlier pass took (the FP8 layers run their own GEMMs)."""
    if type(module) is not torch.nn.Linear or not _IN_LAYER.search(path + "."):
        return False
    if "_tk_fp8" in module.__dict__ or "forward" in module.__dict__ or hasattr(module, "_old_forward"):
        return False  # an FP8 layer, or a forward patched or hooked by someone else
    return _qualifies(module.weight)


def _qualifies(weight: torch.Tensor) -> bool:
    return (weight.dtype in DTYPES and weight.dim() == 2 and weight.shape[0] >= BF16_MIN_OUT_FEATURES
            and weight.shape[1] % 8 == 0)


def linear(tk, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           devices: Callable[[], tuple[str, ...]]) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, as ``decode_linear`` where this call takes it (16-bit weight)."""
    if weight.shape[0] >= BF16_MIN_OUT_FEATURES and takes(x, weight, bias, BF16_MAX_ROWS, devices) \
            and aligned_rows(x):
        return tk.decode_linear(x, weight, None, bias)
    return F.linear(x, weight, bias)


def _forward(inj):
    tk, devices = inj.tk, inj.kernel_devices

    def forward(self, x):
        return linear(tk, x, self.weight, self.bias, devices)

    return forward


def _merged_gemm(inj, merged: merging.MergedLinear):
    """A merge's decode GEMM (``MergedLinear.decode``): decode_linear's output where the call takes
    it, else None (the merge runs F.linear)."""
    tk, devices = inj.tk, inj.kernel_devices

    def gemm(x: torch.Tensor) -> torch.Tensor | None:
        weight, bias = merged.weight, merged.bias
        if _qualifies(weight) and takes(x, weight, bias, BF16_MAX_ROWS, devices) and aligned_rows(x):
            return tk.decode_linear(x, weight, None, bias)
        return None

    return gemm


def apply(model: torch.nn.Module, prefix: str, inj, options: dict[str, Any]) -> int:
    """Gives each merge inside a decoder layer whose GEMM runs 16-bit (no FP8 GEMM of its own) the
    decode GEMM, and each selected linear layer that is not a child of such a merge the decode forward
    (a merge's children run alone only where the merge cannot: gradients wanted, F.linear's case);
    records each for uninject and its path in ``report.extras["decode_linear"]``; returns how many GEMMs."""
    gemms: list[str] = []
    merged_children: set[int] = set()
    for path, module in model.named_modules(prefix=prefix):
        for key, merged in module.__dict__.get("_tk_merged", {}).items():
            if not _IN_LAYER.search(path + ".") or merged.low_precision is not None or not merged.enabled:
                continue
            if not _qualifies(merged.weight):
                continue
            merged.decode = _merged_gemm(inj, merged)
            inj.undo.append(lambda m=merged: setattr(m, "decode", None))
            gemms.append(f"{path}.{key}" if path else key)
            merged_children.update(id(getattr(module, n)) for n in merged.names)
    for path, module in model.named_modules(prefix=prefix):
        if id(module) not in merged_children and selected(path, module):
            inj.set_forward(module, _forward(inj))
            gemms.append(path)
    inj.report.extras[SWITCH]["gemms"] += gemms
    return len(gemms)


def _describe(record: dict[str, Any]) -> str | None:
    if not record["gemms"]:
        return None
    return (f"decode_linear: {len(record['gemms'])} GEMMs with 16-bit weights run decode_linear at "
            f"<= {BF16_MAX_ROWS} row(s) (at least {BF16_MIN_OUT_FEATURES} outputs), F.linear otherwise")


# What the transformers table carries (RuleTable.passes), on by default: inject(model, decode_linear=False).
PASS = Pass(switch=SWITCH, kind=KIND, what="the decode steps' GEMMs", ops=OPS, apply=apply,
            default=True, extras=lambda: {"gemms": []}, describe=_describe)
