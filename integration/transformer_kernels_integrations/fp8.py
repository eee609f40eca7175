"""FP8 linear layers for ``inject(model, fp8=True)`` (off by default): the large ``nn.Linear`` layers
of the transformer blocks run as e4m3 GEMMs (``linear_fp8``) with per-token activation scales and
per-output-channel weight scales, torchao's dynamic row-wise recipe.

Which layers: a plain ``nn.Linear`` with a bf16 or fp16 weight inside a block (a path with
``layers.<i>``, ``blocks.<i>``, ``transformer_blocks.<i>`` or ``single_transformer_blocks.<i>``), both
widths multiples of 16 and at least ``FP8_MIN_FEATURES``, and none of its path's names in ``KEPT_IN_BF16`` (the AdaLN and timestep
MLPs inside the blocks: ``norm1.linear``, ``time_emb``...) nor matching a pattern of
``fp8_exclude=`` (``fnmatch`` on the module path, e.g. ``"*.attn2.*"``). Embeddings, the first and
last projections and ``lm_head`` are outside the blocks, so they stay bf16.

How they run: the weight is quantized once at inject time (``quantize_fp8``: one scale per output
channel, the weight's rows), and again when its values change (an in-place update bumps the
tensor's version; a new tensor has another data pointer): checked at each eager call, trusted under
``torch.compile``. Each call quantizes its input per row (``quantize_fp8``), or takes the codes a
producer of ours emitted in the same pass (``QuantizedRows``: a decoder layer's ``rms_norm_fp8`` and
``fused_add_rms_norm_fp8`` for the attention's and the MLP's inputs, LTX-Video's ``norm_modulate_fp8``
and ``gated_add_norm_modulate_fp8`` for its self-attention's and FFN's, ``act_mul_fp8`` for the gated
MLP's ``down_proj``), and runs ``linear_fp8`` with the bias (and, for a tanh-GELU FFN projection, the GELU) in its epilogue.

Merged projections (``merge_projections``) quantize their merged weight: per-row scales make that
the concatenation of the children's codes and scales. A merge with one projection excluded runs in
bf16, all of its projections with it.

The quant contract (vLLM's ``QuantizedActivation``): a ``QuantizedRows`` carries its key, what it is
(``QuantKey``; every producer of ours emits ``ROW_E4M3``: e4m3 codes, a float32 scale per row), and
each FP8 GEMM declares at inject the key it accepts (``Fp8Weight.accepts``). Which producer emits
FP8 is decided once per block, when the pass applies: a producer's rule declares its inputs and how
to find the GEMMs that read each (``produces``), and ``apply`` plans them (``Site``: every GEMM that
reads the input runs in FP8 and accepts the key; stored on the block, planned again when a merge it
feeds is refreshed). Per call the producer checks only the runtime conditions (``Site.takes``:
device, autocast, dtype, gradients). A GEMM given a key it does not accept runs its bf16 code on the
dequantized input, a logged fallback (``linear`` itself refuses it).

Where it cannot run (tensors off the GPU, autocast, an input of another dtype than the weight, or
fp32, gradients wanted) the layer runs its bf16 code: a logged fallback of kind ``fp8_linear``.

Memory: the bf16 weights are kept (``uninject`` gives them back untouched, bit for bit) beside the
FP8 codes and scales: weight memory grows by about half (one byte per weight plus 4 bytes per output
channel); the report says how many bytes (``report.extras["fp8"]``: ``layers``, ``weight_bytes``).

Weight-only (``inject(model, fp8=True, fp8_weights_only=True)``, for LLM decode): the same layers keep
e4m3 codes and a float32 scale per output channel and no 16-bit weight, and their inputs stay 16-bit
(no producer emits FP8 for them: each declares ``accepts=None``). The weights are quantized layer by
layer at inject (``quantize_fp8``; a merge's as one, its children views of the merged codes), so the
peak holds one layer's codes beside the 16-bit model: each linear layer's ``weight`` becomes a
``Parameter`` of the codes (``requires_grad=False``, the same shape) with a ``weight_scale`` buffer
``[out, 1]``, and the 16-bit storage is released (the original ``Parameter`` object, emptied, is kept
for uninject). A call with at most ``decode.FP8_MAX_ROWS`` rows (a decode step's tokens) runs
``decode_linear`` on the codes; more rows (prefill), and calls it cannot take (tensors off the GPU,
autocast, gradients wanted: a logged fallback where the rows were few enough), widen the codes to x's
dtype, scale them in place (``codes * scale`` rounded once) and run ``F.linear``: one layer's 16-bit
weight exists for the length of the call. The report counts them as ``fp8_weight_only``;
``report.extras["fp8"]`` adds ``weights_only`` and ``bf16_bytes_freed``. ``uninject`` gives each layer
its original ``Parameter`` back holding the dequantized weights (``codes * scale`` rounded to its dtype:
e4m3's error, about 2**-4 of each weight, stays). ``model.to(dtype)`` keeps the codes e4m3 and the
scales float32 (a wrapper of the layer's ``_apply``); ``.to(device)`` moves them.

``PASS`` is all the engine sees of it: the rule tables that serve FP8 carry it
(``RuleTable(..., passes=(fp8.PASS,))``), which makes ``fp8`` and ``fp8_exclude`` keywords of their
``inject``. Tensors go to the kernels only on the table's devices (``RuleTable.kernel_devices``).
"""

from __future__ import annotations

import enum
import fnmatch
import functools
import re
import types
from types import ModuleType
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F

from . import decode, merging
from .patching import Option, Pass

SWITCH = "fp8"  # inject(model, fp8=True); its options: fp8_exclude, fp8_weights_only
KIND = "fp8_linear"
# what the report calls the layers under fp8_weights_only, and the ops they run
WEIGHTS_ONLY_KIND = "fp8_weight_only"
WEIGHTS_ONLY_OPS = ("quantize_fp8", "decode_linear")
# The ops the FP8 layers run: the GEMM, the quantization of inputs no producer of ours emits, and the
# producers that emit them (a decoder layer's norms, the gated MLP's unit).
OPS = ("quantize_fp8", "linear_fp8", "act_mul_fp8", "rms_norm_fp8", "fused_add_rms_norm_fp8", "norm_modulate_fp8",
       "gated_add_norm_modulate_fp8")
# The GPUs with FP8 tensor cores: Ada (8.9) and Hopper (9.0) onwards.
MIN_CAPABILITY = (8, 9)
# A projection narrower than this on either side stays bf16: its GEMM is too small for FP8 to pay for
# the input's quantization.
FP8_MIN_FEATURES = 512
# Names in a block that mark a layer kept in bf16: the AdaLN modulation and timestep/embedding MLPs
# (small, precision-sensitive, run once per block per step).
KEPT_IN_BF16 = ("norm", "emb", "time", "adaln", "scale_shift")
_IN_BLOCK = re.compile(r"(^|\.)(layers|blocks|transformer_blocks|single_transformer_blocks)\.\d+\.")
_STATE = "_tk_fp8"
# On a producer's block (``produces``): its inputs, each with the function that finds the GEMMs that
# read it (its consumers); and its plan, input -> Site or None (filled by ``apply``; the patched
# forward reads it).
_CONSUMERS = "_tk_fp8_consumers"
PLAN = "_tk_fp8_inputs"


class QuantKey(enum.Enum):
    """What a quantized activation is (vLLM's quant key): its codes' dtype, and what one scale covers
    (``"row"``: a float32 per row of the last dimension, ``[..., 1]``). An enum: torch.compile traces
    its comparisons as constants."""

    # What quantize_fp8, act_mul_fp8 and the norms' FP8 outputs give, and linear_fp8 takes.
    ROW_E4M3 = ("float8_e4m3fn", "row")

    def __str__(self) -> str:
        return f"{self.value[0]} per {self.value[1]}"


ROW_E4M3 = QuantKey.ROW_E4M3


class Fp8Weight:
    """A weight's e4m3 codes ``[out, in]`` and per-output-channel scales ``[out, 1]``, quantized with
    ``tk.quantize_fp8`` from the tensor ``source()`` returns, again whenever one of the tensors
    ``watched()`` gives (the weight; a merge's weight and its children's parameters, each with a version
    counter of its own) changed. ``lazy``: not before the first call (a merged projection's child,
    which runs alone only where its merge cannot). What its GEMM declares at inject: ``accepts``, the
    key of the quantized activations it consumes, and ``devices()``, where its tensors may be."""

    def __init__(self, tk: ModuleType, source, watched=None, lazy: bool = False, *,
                 accepts: QuantKey = ROW_E4M3, devices: Callable[[], tuple[str, ...]] = lambda: ("cuda",)):
        self.tk, self.source = tk, source
        self.watched = watched or (lambda: (source(),))
        self.accepts, self.devices = accepts, devices
        self.codes: torch.Tensor | None = None
        self.scale: torch.Tensor | None = None
        self._seen: tuple = ()
        if not lazy:
            self.refresh()

    def _state(self) -> tuple:
        return tuple((t.data_ptr(), t._version, t.dtype) for t in self.watched())

    def refresh(self) -> None:
        with torch.no_grad():
            self.codes, self.scale = self.tk.quantize_fp8(self.source().detach())
        self._seen = self._state()

    def current(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The codes and scales of the weight as it is now."""
        if self.codes is None or (not torch.compiler.is_compiling() and self._state() != self._seen):
            self.refresh()
        return self.codes, self.scale


def weight_bytes(linear: torch.nn.Linear) -> int:
    """The bytes of a linear layer's FP8 weight: a byte per weight, a float32 scale per output channel."""
    return linear.out_features * linear.in_features + 4 * linear.out_features


class QuantizedRows:
    """An activation's rows as a producer of ours emitted them in FP8 (``rms_norm_fp8``,
    ``fused_add_rms_norm_fp8``, ...): codes ``[..., K]``, scales (``[..., 1]`` for a row scale), the dtype
    the 16-bit activation has, and ``key``, what the codes are (``ROW_E4M3`` from every op of ours). A
    patched block passes it, in place of the tensor, to layers whose every GEMM on that input runs in
    FP8 and accepts its key (the block's plan, ``Site``): the FP8 linear forwards and merged GEMMs
    take it as it is. ``shape``, ``dtype`` and ``device`` are the activation's, for the code around them."""

    __slots__ = ("codes", "scale", "dtype", "key")
    requires_grad = False

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, key: QuantKey = ROW_E4M3):
        self.codes, self.scale, self.dtype, self.key = codes, scale, dtype, key

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def dequantized(self) -> torch.Tensor:
        """The activation back in its dtype (codes * scale), for a layer that cannot take the codes."""
        return (self.codes.float() * self.scale).to(self.dtype)


def unusable(x: torch.Tensor | QuantizedRows, weight: torch.Tensor, devices: tuple[str, ...]) -> str | None:
    """Why the FP8 GEMM cannot take input x for this weight now (the runtime conditions), or None."""
    if x.device.type not in devices:
        return f"tensors on {x.device.type}, not the GPU"
    if torch.is_autocast_enabled(x.device.type):
        return "autocast is on"
    if x.dtype not in (torch.bfloat16, torch.float16) or x.dtype != weight.dtype:
        return f"input {x.dtype}, weight {weight.dtype} (FP8 layers take bf16 or fp16 with the weight's dtype)"
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):  # QuantizedRows: no grad
        return "gradients are wanted (FP8 layers have no backward; run under torch.no_grad() / inference_mode())"
    return None


def linear(tk: ModuleType, fp8: Fp8Weight, x: torch.Tensor | QuantizedRows, bias: torch.Tensor | None,
           activation: str = "none") -> torch.Tensor:
    """``act(x @ W.T + bias)`` in FP8: x quantized per row (or as a producer quantized it, where its
    key is the one the GEMM accepts: else a ValueError; ``usable_of`` tells the caller first), then
    the FP8 GEMM."""
    if isinstance(x, QuantizedRows):
        if x.key != fp8.accepts:
            raise ValueError(f"fp8.linear: the input is quantized as {x.key}, this GEMM takes {fp8.accepts} "
                             "(run the bf16 layer on x.dequantized())")
        return quantized_linear(tk, fp8, x.codes, x.scale, bias, x.dtype, activation)
    codes, scale = tk.quantize_fp8(x)
    return quantized_linear(tk, fp8, codes, scale, bias, x.dtype, activation)


def quantized_linear(tk: ModuleType, fp8: Fp8Weight, codes: torch.Tensor, scale: torch.Tensor,
                     bias: torch.Tensor | None, out_dtype: torch.dtype, activation: str = "none") -> torch.Tensor:
    """The FP8 GEMM on an input already quantized (a producer's codes and row scales)."""
    w_codes, w_scale = fp8.current()
    return tk.linear_fp8(codes, scale, w_codes, w_scale, bias, out_dtype, activation)


def of(module: torch.nn.Module | None) -> Fp8Weight | None:
    """The FP8 weight inject gave this linear layer, or None."""
    return None if module is None else module.__dict__.get(_STATE)


def usable_of(module: torch.nn.Module | None, x: torch.Tensor | QuantizedRows, inj=None) -> Fp8Weight | None:
    """The layer's FP8 weight where its GEMM can take x now (and, for QuantizedRows, accepts its
    key); else None (and `inj` hears why, a fallback of kind ``fp8_linear``)."""
    fp8 = of(module)
    if fp8 is None or fp8.accepts is None:  # none, or weight-only (its forward takes 16-bit x)
        return None
    why = unusable(x, module.weight, fp8.devices())
    if why is None:
        why = _key_mismatch(x, fp8)
    if why is None:
        return fp8
    if inj is not None:
        inj.fallback(KIND, why, instead="the bf16 projection")
    return None


def _key_mismatch(x, fp8: Fp8Weight) -> str | None:
    if isinstance(x, QuantizedRows) and x.key != fp8.accepts:
        return f"its input is quantized as {x.key}, its FP8 GEMM takes {fp8.accepts} (dequantized)"
    return None


def accepted(gemm) -> QuantKey | None:
    """The key of the quantized activations `gemm` (a linear layer, or a ``MergedLinear``) consumes,
    as inject declared it; None where it does not run in FP8."""
    if isinstance(gemm, merging.MergedLinear):
        gemm_fp8 = getattr(gemm.low_precision, "fp8", None) if gemm.enabled else None
    else:
        gemm_fp8 = of(gemm)
    return None if gemm_fp8 is None else gemm_fp8.accepts


class Site:
    """One input a producer of ours computes, as ``apply`` planned it: the GEMMs that read it, each
    running in FP8 and accepting ``ROW_E4M3``. The producer emits QuantizedRows where ``takes(x)``."""

    __slots__ = ("gemms", "devices")

    def __init__(self, gemms: tuple, devices: Callable[[], tuple[str, ...]]):
        self.gemms, self.devices = gemms, devices

    def takes(self, x: torch.Tensor) -> bool:
        """Whether every GEMM takes x in FP8 now: the runtime conditions only (device, autocast, dtype,
        gradients; a merge whose parameters were replaced merges again here, and its block is
        planned again)."""
        devices = self.devices()
        for gemm in self.gemms:
            if isinstance(gemm, merging.MergedLinear) and not gemm.usable(x):
                return False
            if unusable(x, gemm.weight, devices) is not None:
                return False
        return True


def produces(inj, block: torch.nn.Module, **inputs: Callable[[torch.nn.Module], list]) -> dict[str, Site | None]:
    """Declares that `block`'s patched forward computes ``inputs`` with an op that has an FP8 twin:
    each input's name, with the function that finds the GEMMs that read it (``input_gemms``, ...).
    Returns the block's plan, input -> Site or None, which the forward reads: empty unless
    ``inject(fp8=True)`` plans it (``apply``). Both kept on the block (``_tk_fp8_consumers``,
    ``_tk_fp8_inputs``) until uninject."""
    plan: dict[str, Site | None] = {}
    block.__dict__[_CONSUMERS], block.__dict__[PLAN] = inputs, plan
    inj.undo.append(lambda: [block.__dict__.pop(k, None) for k in (_CONSUMERS, PLAN)])
    return plan


def _plan(block: torch.nn.Module, devices: Callable[[], tuple[str, ...]]) -> None:
    """Fills `block`'s plan: an input gets a Site where GEMMs read it and every one of them runs in
    FP8 and accepts what the producer emits (ROW_E4M3), else None."""
    planned = {}
    for name, find in block.__dict__[_CONSUMERS].items():
        gemms = tuple(find(block))
        planned[name] = Site(gemms, devices) if gemms and all(accepted(g) == ROW_E4M3 for g in gemms) else None
    block.__dict__[PLAN].update(planned)


def input_gemms(module: torch.nn.Module, key: str, names: tuple[str, ...]) -> list:
    """The GEMMs that read `module`'s input: its merge under `key` (merge_projections) where it has
    one, else its `names` projections."""
    merged = merging.merged_of(module, key)
    if merged is not None:
        return [merged]
    linears = [getattr(module, n, None) for n in names]
    return linears if all(isinstance(lin, torch.nn.Linear) for lin in linears) else []


def feed_forward_input_gemms(ff: torch.nn.Module) -> list:
    """The GEMM that reads a diffusers ``FeedForward``'s input: its first module's projection (``GELU``,
    ``GEGLU``, ... call ``self.proj`` on the input first)."""
    first = ff.net[0] if isinstance(getattr(ff, "net", None), torch.nn.ModuleList) and len(ff.net) else None
    proj = getattr(first, "proj", None)
    return [proj] if type(proj) is torch.nn.Linear else []


def selected(path: str, module: torch.nn.Module, exclude: Iterable[str]) -> bool:
    """Whether inject(fp8=True) runs this module in FP8 (see the module docstring)."""
    if type(module) is not torch.nn.Linear or not _IN_BLOCK.search(path + "."):
        return False
    if module.weight.dtype not in (torch.bfloat16, torch.float16):  # FP8 layers serve 16-bit models
        return False
    if module.in_features % 16 or module.out_features % 16:
        return False
    if min(module.in_features, module.out_features) < FP8_MIN_FEATURES:
        return False
    inner = _IN_BLOCK.split(path + ".")[-1].lower()
    if any(word in part for part in inner.split(".") for word in KEPT_IN_BF16):
        return False
    return not any(fnmatch.fnmatchcase(path, pattern) for pattern in exclude)


def check_device(models: Iterable[torch.nn.Module]) -> None:
    """Refuses fp8=True for a model on a CUDA GPU without FP8 tensor cores (T4, A100), naming it."""
    for model in models:
        param = next(model.parameters(), None)
        if param is None or param.device.type != "cuda":
            continue
        capability = torch.cuda.get_device_capability(param.device)
        if capability < MIN_CAPABILITY:
            name = torch.cuda.get_device_name(param.device)
            raise ValueError(
                f"inject: fp8=True needs FP8 tensor cores (compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
                f"or later: L4, RTX 40, H100, H200); {name} is {capability[0]}.{capability[1]}. Leave fp8 off "
                "on this GPU")


def check(tk: ModuleType, models: list[torch.nn.Module], training: bool) -> None:
    """What refuses ``inject(fp8=True)`` before anything is patched: training, a GPU without FP8."""
    if training:
        raise ValueError("inject: fp8=True is for inference (FP8 layers have no backward); call it on a model in "
                         "eval mode, or with training=False")
    check_device(models)


def apply(model: torch.nn.Module, prefix: str, inj, options: dict[str, Any]) -> int:
    """Gives each selected linear layer of `model` (``options["exclude"]``: fnmatch patterns of paths
    kept in bf16) its FP8 weight and forward, and each merge whose projections are all selected its
    merged FP8 weight (its children then quantize their own only if they run alone); then plans the
    producers' blocks (``produces``). Records each change for uninject, and the layers and their
    bytes in ``report.extras["fp8"]``; returns how many layers."""
    tk, record = inj.tk, inj.report.extras[SWITCH]
    exclude = tuple(options["exclude"])
    chosen = {id(m): (path, m) for path, m in model.named_modules(prefix=prefix) if selected(path, m, exclude)}
    if options["weights_only"]:
        return _apply_weights_only(model, inj, chosen, record)
    merged_children: set[int] = set()
    for module in model.modules():
        for merged in module.__dict__.get("_tk_merged", {}).values():
            children = [id(getattr(module, n, None)) for n in merged.names]
            if all(c in chosen for c in children):
                merged.low_precision = _merged_gemm(inj, merged)
                inj.undo.append(lambda m=merged: setattr(m, "low_precision", None))
                merged_children.update(children)
            else:  # one excluded: the merge runs in bf16, and with it all its projections
                for c in children:
                    chosen.pop(c, None)
    for key, (path, module) in chosen.items():
        module.__dict__[_STATE] = Fp8Weight(tk, lambda m=module: m.weight, lazy=key in merged_children,
                                            accepts=ROW_E4M3, devices=inj.kernel_devices)
        inj.undo.append(lambda m=module: m.__dict__.pop(_STATE, None))
        inj.set_forward(module, _forward(inj, type(module).forward))
        record["layers"].append(path)
        record["weight_bytes"] += weight_bytes(module)
    for block in model.modules():
        if _CONSUMERS in block.__dict__:
            _plan_block(block, inj)
    return len(chosen)


def _plan_block(block: torch.nn.Module, inj) -> None:
    """Plans `block` now, and again whenever a merge among its inputs' GEMMs is refreshed."""
    replan = functools.partial(_plan, block, inj.kernel_devices)
    replan()
    plan = block.__dict__[PLAN]
    inj.undo.append(plan.clear)
    for find in block.__dict__[_CONSUMERS].values():
        for gemm in find(block):
            if isinstance(gemm, merging.MergedLinear):
                gemm.on_refresh = replan
                inj.undo.append(lambda g=gemm: setattr(g, "on_refresh", None))


FALLBACK = ("tensors off the GPU, autocast, an input of another dtype than the weight, or gradients wanted: the "
            "bf16 projection")


def _forward(inj, original):
    """A selected ``nn.Linear``'s forward: the FP8 GEMM, or its own where that cannot take x."""
    tk = inj.tk

    def forward(self, x):
        fp8 = usable_of(self, x, inj)
        if fp8 is None:  # codes only from a producer whose plan and runtime check let it, or of another key
            return original(self, x.dequantized() if isinstance(x, QuantizedRows) else x)
        return linear(tk, fp8, x, self.bias)

    return forward


def _merged_gemm(inj, merged: merging.MergedLinear):
    """A merged projection's FP8 GEMM (``MergedLinear.low_precision``): its output where the GEMM takes
    x, None where not (the merge then runs its bf16 GEMM); QuantizedRows of a key it does not accept
    run the bf16 GEMM on their dequantized values (a logged fallback)."""
    tk = inj.tk
    fp8 = Fp8Weight(tk, lambda: merged.weight, lambda: (merged.weight, *merged._params), accepts=ROW_E4M3,
                    devices=inj.kernel_devices)

    def gemm(x: torch.Tensor | QuantizedRows) -> torch.Tensor | None:
        if unusable(x, merged.weight, fp8.devices()) is None:
            why = _key_mismatch(x, fp8)
            if why is None:
                return linear(tk, fp8, x, merged.bias)
            inj.fallback(KIND, why, instead="the bf16 merged projection")
        return None if not isinstance(x, QuantizedRows) else F.linear(x.dequantized(), merged.weight, merged.bias)

    gemm.fp8 = fp8
    return gemm


# ---- weight-only (fp8_weights_only=True): e4m3 codes in place of the 16-bit weights ----

class WeightOnly:
    """What inject gave a weight-only layer or merge (``of(module)``, ``MergedLinear.low_precision.fp8``):
    its GEMM takes 16-bit inputs, no quantized activation (``accepts`` None: no producer emits FP8 for
    it)."""

    accepts = None

    def __init__(self, devices: Callable[[], tuple[str, ...]]):
        self.devices = devices


def dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``codes * scale`` in `dtype`, rounded once: the codes widened (exact: every e4m3 value is a
    bf16 and an fp16 value), then scaled in place (the product computed in fp32), so no fp32 copy of
    the weight is made."""
    return codes.to(dtype).mul_(scale.reshape(-1, 1))


def dequantized_linear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor,
                       bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` on the dequantized weight (in x's dtype, for the length of the call)."""
    return F.linear(x, dequantize(codes, scale, x.dtype), bias)


def _why_not_decode(x: torch.Tensor, devices: Callable[[], tuple[str, ...]]) -> str:
    if x.device.type not in devices():
        return f"tensors on {x.device.type}, not the GPU"
    if torch.is_autocast_enabled(x.device.type):
        return "autocast is on"
    if x.dtype not in decode.DTYPES:
        return f"input {x.dtype} (decode_linear takes bf16 or fp16 inputs here)"
    if torch.is_grad_enabled() and x.requires_grad:
        return "gradients are wanted (decode_linear has no backward)"
    return "its bias has another dtype than its input"


def weights_only_linear(inj, x: torch.Tensor | QuantizedRows, codes: torch.Tensor, scale: torch.Tensor,
                        bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ (codes * scale).T + bias``: ``decode_linear`` on the codes for at most
    ``decode.FP8_MAX_ROWS`` rows (x copied first where its rows are not one aligned stride apart),
    else the dequantized weight with ``F.linear``; where the rows were few enough but the call cannot
    take the kernel (device, autocast, gradients), a logged fallback of kind ``fp8_weight_only``."""
    if isinstance(x, QuantizedRows):  # (not planned: every weight-only GEMM accepts no key)
        x = x.dequantized()
    devices = inj.kernel_devices
    if decode.takes(x, codes, bias, decode.FP8_MAX_ROWS, devices):
        if not decode.aligned_rows(x):
            x = x.clone(memory_format=torch.contiguous_format)
        return inj.tk.decode_linear(x, codes, scale, bias)
    if x.dim() and 1 <= decode.rows(x) <= decode.FP8_MAX_ROWS:
        inj.fallback(WEIGHTS_ONLY_KIND, _why_not_decode(x, devices), instead="the dequantized weight with F.linear")
    return dequantized_linear(x, codes, scale, bias)


def _weights_only_forward(inj):
    def forward(self, x):
        return weights_only_linear(inj, x, self.weight, self.weight_scale, self.bias)

    return forward


def _apply_keeping_codes(module: torch.nn.Module, fn, *args, **kwargs):
    """``module._apply`` (behind ``.to()``, ``.half()``, ``.cuda()``) of a weight-only layer: a dtype
    conversion leaves the codes e4m3 and the scales float32 (a device move moves them)."""
    codes, scale = module._parameters["weight"].data, module._buffers["weight_scale"]
    result = type(module)._apply(module, fn, *args, **kwargs)
    weight = module._parameters["weight"]
    if weight.dtype != codes.dtype:
        with torch.no_grad():
            weight.data = codes.to(weight.device)
    now = module._buffers["weight_scale"]
    if now.dtype != scale.dtype:
        module._buffers["weight_scale"] = scale.to(now.device)
    return result


def _keep_codes(inj, linear: torch.nn.Linear, codes: torch.Tensor, scale: torch.Tensor) -> int:
    """Makes `linear` a weight-only layer: ``weight`` a Parameter of the codes, ``weight_scale`` a
    buffer, the original Parameter emptied (its storage released once no merge holds it) and kept for
    uninject, which gives it back holding the dequantized weight. Returns the 16-bit bytes released."""
    original = linear._parameters["weight"]
    freed = original.numel() * original.element_size()
    linear._parameters["weight"] = torch.nn.Parameter(codes, requires_grad=False)
    linear.register_buffer("weight_scale", scale)
    with torch.no_grad():
        original.data = original.data.new_empty((0,))
    linear.__dict__[_STATE] = WeightOnly(inj.kernel_devices)
    linear._apply = types.MethodType(_apply_keeping_codes, linear)

    def undo() -> None:
        weight, weight_scale = linear._parameters["weight"], linear._buffers.pop("weight_scale")
        with torch.no_grad():
            original.data = dequantize(weight.detach(), weight_scale, original.dtype)
        linear._parameters["weight"] = original
        linear.__dict__.pop(_STATE, None)
        if getattr(linear.__dict__.get("_apply"), "__func__", None) is _apply_keeping_codes:
            del linear.__dict__["_apply"]

    inj.undo.append(undo)
    return freed


def _weights_only_merged_gemm(inj, merged: merging.MergedLinear, scale: torch.Tensor):
    """A merge of weight-only layers' GEMM (``MergedLinear.low_precision``): ``weights_only_linear`` on
    the merged codes (``merged.weight``) and ``scale``, the concatenation of its children's scales
    (their buffers are views of it; concatenated again where a move gave them storage of their own).
    None where the merge no longer holds codes (its children were replaced): the merge's own GEMM."""
    state = {"scale": scale, "seen": None}
    children = lambda: [getattr(merged.module, n) for n in merged.names]  # noqa: E731

    def current_scale() -> torch.Tensor:
        if not torch.compiler.is_compiling():
            scales = [getattr(c, "weight_scale", None) for c in children()]
            seen = tuple(None if t is None else t.data_ptr() for t in scales)
            if seen != state["seen"]:
                if None not in scales and state["seen"] is not None:
                    state["scale"] = torch.cat(scales)
                state["seen"] = seen
        return state["scale"]

    def gemm(x: torch.Tensor | QuantizedRows) -> torch.Tensor | None:
        codes = merged.weight
        if codes.dtype != torch.float8_e4m3fn:
            return None
        return weights_only_linear(inj, x, codes, current_scale(), merged.bias)

    current_scale()  # the views' pointers, as the children hold them now
    gemm.fp8 = WeightOnly(inj.kernel_devices)
    return gemm


def _apply_weights_only(model: torch.nn.Module, inj, chosen: dict[int, tuple[str, torch.nn.Module]],
                        record: dict[str, Any]) -> int:
    """``apply`` under ``fp8_weights_only``: each chosen layer keeps e4m3 codes and scales in place of
    its 16-bit weight (a merge whose projections are all chosen quantized as one, its children views
    of the merged codes; a merge with one left out, or diffusers' own fused projection, stays 16-bit
    with all its projections), layer by layer; records them; returns how many layers."""
    tk = inj.tk
    record["weights_only"] = True
    record["bf16_bytes_freed"] = record.get("bf16_bytes_freed", 0)
    order = list(chosen)
    done: set[int] = set()

    def keep(linear: torch.nn.Linear, codes: torch.Tensor, scale: torch.Tensor) -> None:
        record["bf16_bytes_freed"] += _keep_codes(inj, linear, codes, scale)
        inj.set_forward(linear, _weights_only_forward(inj))
        done.add(id(linear))

    for module in model.modules():
        for merged in module.__dict__.get("_tk_merged", {}).values():
            children = [getattr(module, n, None) for n in merged.names]
            if not merged.enabled:
                continue  # its projections run alone: each its own codes below
            if merged.fused or not all(id(c) in chosen for c in children):
                for c in children:
                    chosen.pop(id(c), None)
                continue
            with torch.no_grad():
                codes, scale = tk.quantize_fp8(merged.weight.detach())
            for child, child_codes, child_scale in zip(children, codes.split(merged.sizes), scale.split(merged.sizes)):
                keep(child, child_codes, child_scale)
            del codes
            merged.merge()  # one tensor of codes again, the children views of it; the 16-bit merge released
            merged.low_precision = _weights_only_merged_gemm(inj, merged, scale)
            inj.undo.append(lambda m=merged: setattr(m, "low_precision", None))
    for key, (path, module) in chosen.items():
        if key not in done:
            with torch.no_grad():
                keep(module, *tk.quantize_fp8(module.weight.detach()))
    for key in order:
        if key in done:
            path, module = chosen[key]
            record["layers"].append(path)
            record["weight_bytes"] += weight_bytes(module)
    return len(done)


def _exclude_patterns(value) -> tuple[str, ...]:
    """``fp8_exclude``'s value: a sequence of fnmatch patterns (strings)."""
    if isinstance(value, str):
        raise TypeError(f"takes a sequence of module-path patterns, got the string {value!r}")
    try:
        patterns = tuple(value)
    except TypeError:
        raise TypeError(f"takes a sequence of module-path patterns, got {type(value).__name__} {value!r}") from None
    bad = [p for p in patterns if not isinstance(p, str)]
    if bad:
        raise TypeError(f"takes module-path patterns (strings), got {type(bad[0]).__name__} {bad[0]!r}")
    return patterns


def _describe(record: dict[str, Any]) -> str | None:
    if not record["layers"]:
        return None
    if record.get("weights_only"):
        return (f"fp8: {len(record['layers'])} linear layers with FP8 weights (weight-only: decode_linear at <= "
                f"{decode.FP8_MAX_ROWS} rows, the dequantized weight and F.linear above), "
                f"{record['weight_bytes'] / 2**20:.1f} MiB of e4m3 weights and scales in place of "
                f"{record['bf16_bytes_freed'] / 2**20:.1f} MiB of 16-bit weights (freed; uninject restores them "
                "dequantized)")
    return (f"fp8: {len(record['layers'])} linear layers in FP8, {record['weight_bytes'] / 2**20:.1f} MiB of e4m3 "
            "weights and scales beside the bf16 weights (kept for uninject)")


def _flag(value) -> bool:
    """A boolean option's value (``fp8_weights_only``)."""
    if not isinstance(value, bool):
        raise TypeError(f"takes True or False, got {value!r}")
    return value


WEIGHTS_ONLY_FALLBACK = ("more rows than a decode step's, tensors off the GPU, autocast or gradients wanted: the "
                         "dequantized weight with F.linear")


def _variant(options: dict[str, Any]) -> tuple[str, tuple[str, ...], str]:
    """What the report calls the layers, the ops they run and when they take the other path."""
    if options["weights_only"]:
        return WEIGHTS_ONLY_KIND, WEIGHTS_ONLY_OPS, WEIGHTS_ONLY_FALLBACK
    return KIND, OPS, FALLBACK


# What the rule tables that serve FP8 carry (RuleTable.passes): inject(model, fp8=True, fp8_exclude=...,
# fp8_weights_only=...).
PASS = Pass(switch=SWITCH, kind=KIND, what="the FP8 layers", ops=OPS, apply=apply,
            options=(Option("exclude", (), _exclude_patterns), Option("weights_only", False, _flag)), check=check,
            fallback=FALLBACK, extras=lambda: {"layers": [], "weight_bytes": 0}, describe=_describe,
            variant=_variant)
