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

Where it cannot run (tensors off the GPU, autocast, an input of another dtype than the weight, or
fp32, gradients wanted) the layer runs its bf16 code: a logged fallback of kind ``fp8_linear``.

Memory: the bf16 weights are kept (``uninject`` gives them back untouched, bit for bit) beside the
FP8 codes and scales: weight memory grows by about half (one byte per weight plus 4 bytes per output
channel); the report says how many bytes.
"""

from __future__ import annotations

import fnmatch
import re
from types import ModuleType
from typing import Iterable

import torch
import torch.nn.functional as F

from . import merging

KIND = "fp8_linear"
# The ops the FP8 layers run: the GEMM, the quantization of inputs no producer of ours emits, and the
# producers that emit them (a decoder layer's norms, the gated MLP's unit).
OPS = ("quantize_fp8", "linear_fp8", "act_mul_fp8", "rms_norm_fp8", "fused_add_rms_norm_fp8", "norm_modulate_fp8",
       "gated_add_norm_modulate_fp8")
# The GPUs with FP8 tensor cores: Ada (8.9) and Hopper (9.0) onwards.
MIN_CAPABILITY = (8, 9)
# A projection narrower than this on either side stays bf16: its GEMM is too small for FP8 to pay for
# the input's quantization.
FP8_MIN_FEATURES = 512
# Tensors on other devices run the bf16 code (the tests widen it for the eager stand-ins on the CPU).
KERNEL_DEVICES: tuple[str, ...] = ("cuda",)
# Names in a block that mark a layer kept in bf16: the AdaLN modulation and timestep/embedding MLPs
# (small, precision-sensitive, run once per block per step).
KEPT_IN_BF16 = ("norm", "emb", "time", "adaln", "scale_shift")
_IN_BLOCK = re.compile(r"(^|\.)(layers|blocks|transformer_blocks|single_transformer_blocks)\.\d+\.")
_STATE = "_tk_fp8"


class Fp8Weight:
    """A weight's e4m3 codes ``[out, in]`` and per-output-channel scales ``[out, 1]``, quantized with
    ``tk.quantize_fp8`` from the tensor ``source()`` returns, again whenever one of the tensors
    ``watched()`` gives (the weight; a merge's weight and its children's parameters, each with a version
    counter of its own) changed. ``lazy``: not before the first call (a merged projection's child,
    which runs alone only where its merge cannot)."""

    def __init__(self, tk: ModuleType, source, watched=None, lazy: bool = False):
        self.tk, self.source = tk, source
        self.watched = watched or (lambda: (source(),))
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
    ``fused_add_rms_norm_fp8``, ...): codes ``[..., K]``, row scales ``[..., 1]``, and the dtype the 16-bit
    activation has. A patched block passes it, in place of the tensor, to layers whose every GEMM on
    that input runs in FP8 (``takes_quantized``): the FP8 linear forwards and merged GEMMs take it as
    it is. ``shape``, ``dtype`` and ``device`` are the activation's, for the code around them."""

    __slots__ = ("codes", "scale", "dtype")
    requires_grad = False

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        self.codes, self.scale, self.dtype = codes, scale, dtype

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def dequantized(self) -> torch.Tensor:
        """The activation back in its dtype (codes * scale), for a layer that cannot take the codes."""
        return (self.codes.float() * self.scale).to(self.dtype)


def unusable(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why the FP8 GEMM cannot take input x for this weight, or None."""
    if x.device.type not in KERNEL_DEVICES:
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
    """``act(x @ W.T + bias)`` in FP8: x quantized per row (or as a producer quantized it), then the
    FP8 GEMM."""
    if isinstance(x, QuantizedRows):
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


def usable_of(module: torch.nn.Module | None, x: torch.Tensor, inj=None) -> Fp8Weight | None:
    """The layer's FP8 weight where its GEMM can take x now; else None (and `inj` hears why, a
    fallback of kind ``fp8_linear``)."""
    fp8 = of(module)
    if fp8 is None:
        return None
    why = unusable(x, module.weight)
    if why is None:
        return fp8
    if inj is not None:
        inj.fallback(KIND, why, instead="the bf16 projection")
    return None


def takes_quantized(consumers: Iterable, x: torch.Tensor) -> bool:
    """Whether every GEMM that reads x (``consumers``: linear layers, or ``MergedLinear``s) runs in FP8
    on it now, so that its producer may emit QuantizedRows instead of the 16-bit tensor."""
    consumers = list(consumers)
    if not consumers:
        return False
    for c in consumers:
        if isinstance(c, merging.MergedLinear):
            if c.low_precision is None or not c.usable(x) or unusable(x, c.weight) is not None:
                return False
        elif of(c) is None or unusable(x, c.weight) is not None:
            return False
    return True


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


def apply(model: torch.nn.Module, prefix: str, inj, exclude: Iterable[str]) -> None:
    """Gives each selected linear layer of `model` its FP8 weight and forward, and each merge whose
    projections are all selected its merged FP8 weight (its children then quantize their own only if
    they run alone); records each for uninject and counts them in the report (``replaced["fp8_linear"]``,
    ``fp8_layers``, ``fp8_weight_bytes``)."""
    tk, report = inj.tk, inj.report
    exclude = tuple(exclude)
    chosen = {id(m): (path, m) for path, m in model.named_modules(prefix=prefix) if selected(path, m, exclude)}
    merged_children: set[int] = set()
    for module in model.modules():
        for merged in module.__dict__.get("_tk_merged", {}).values():
            children = [id(getattr(module, n, None)) for n in merged.names]
            if all(c in chosen for c in children):
                merged.low_precision = _merged_gemm(tk, merged)
                inj.undo.append(lambda m=merged: setattr(m, "low_precision", None))
                merged_children.update(children)
            else:  # one excluded: the merge runs in bf16, and with it all its projections
                for c in children:
                    chosen.pop(c, None)
    inj.fp8 = bool(chosen)
    for key, (path, module) in chosen.items():
        module.__dict__[_STATE] = Fp8Weight(tk, lambda m=module: m.weight, lazy=key in merged_children)
        inj.undo.append(lambda m=module: m.__dict__.pop(_STATE, None))
        inj.set_forward(module, _forward(inj, type(module).forward))
        report.fp8_layers.append(path)
        report.fp8_weight_bytes += weight_bytes(module)
    if chosen:
        report.replaced[KIND] = report.replaced.get(KIND, 0) + len(chosen)
        report.ops[KIND] = OPS
        report.fallbacks[KIND] = ("tensors off the GPU, autocast, an input of another dtype than the weight, or "
                                  "gradients wanted: the bf16 projection")


def _forward(inj, original):
    """A selected ``nn.Linear``'s forward: the FP8 GEMM, or its own where that cannot take x."""
    tk = inj.tk

    def forward(self, x):
        fp8 = usable_of(self, x, inj)
        if fp8 is None:  # (a producer checks takes_quantized before it hands us codes: never in practice)
            return original(self, x.dequantized() if isinstance(x, QuantizedRows) else x)
        return linear(tk, fp8, x, self.bias)

    return forward


def _merged_gemm(tk: ModuleType, merged: merging.MergedLinear):
    """A merged projection's FP8 GEMM (``MergedLinear.low_precision``): its output where the GEMM takes
    x, None where not (the merge then runs its bf16 GEMM)."""
    fp8 = Fp8Weight(tk, lambda: merged.weight, lambda: (merged.weight, *merged._params))

    def gemm(x: torch.Tensor | QuantizedRows) -> torch.Tensor | None:
        if unusable(x, merged.weight) is None:
            return linear(tk, fp8, x, merged.bias)
        return None if not isinstance(x, QuantizedRows) else F.linear(x.dequantized(), merged.weight, merged.bias)

    gemm.fp8 = fp8
    return gemm
