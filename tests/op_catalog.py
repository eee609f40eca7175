"""Every op of the kernel, with valid arguments for each access path it has.

The shared catalog of the reliability tests (bitwise reruns, empty tensors, streams, devices) and of
the sanitizer driver (tests/sanitize/driver.py). An entry builds one call of one C++ op
(``tk.ops.<op>``, arguments in schema order) for a dtype and a case:

- ``small``, ``aligned``, ``wide``: the kernels' row-group, warp and block modes (vectorized);
- ``odd``: widths that no vector divides (the element-by-element path);
- ``unaligned``: operands one element (two for the forms that rotate whole pairs) past a 16-byte boundary;
- ``strided``: leading dimensions that cannot merge and padded rows (norms, activations); views of
  one fused QKV projection (RoPE);
- ``split``, ``split_vec``: a few rows wider than 16K (norms: odd, a block per row; aligned, split across blocks);
  for linear_gelu the same shapes are [..., in_features] (out_features LINEAR_OUT_FEATURES);
- ``empty``: no rows (no tokens); ``empty_width``: rows of no elements (norms, activations).

Values are drawn on the CPU from a generator seeded by ``seed`` and then placed in the case's
layout on ``device``: the same seed gives the same bits on every device and in every layout, and
out= buffers are NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from helpers import assert_padding_intact, with_nan_padding

CASES = ("small", "aligned", "wide", "odd", "unaligned", "strided", "split", "split_vec", "empty", "empty_width")
EPS = 1e-6

# Row ops: x [B, S, H] and the layout of every row operand.
ROW_SHAPES = {
    "small": ((1, 7, 64), "contiguous"),
    "aligned": ((3, 11, 1024), "contiguous"),
    "wide": ((1, 3, 8192), "contiguous"),
    "odd": ((1, 5, 127), "contiguous"),
    "unaligned": ((1, 9, 256), "offset"),
    "strided": ((2, 5, 512), "strided"),
    "split": ((1, 2, 3 * 8192 + 5), "contiguous"),  # odd: element by element, a block per row (not split)
    "split_vec": ((1, 2, 3 * 8192 + 8), "contiguous"),  # split, vectorized, with a partial last chunk
    "empty": ((2, 0, 64), "contiguous"),
    "empty_width": ((2, 3, 0), "contiguous"),
}
# RoPE: B, S, Hq, Hk, d and the layout of q and k.
ROPE_SHAPES = {
    "small": ((1, 3, 2, 1, 64), "contiguous"),
    "aligned": ((2, 7, 4, 2, 128), "contiguous"),
    "wide": ((1, 2, 2, 1, 1024), "contiguous"),
    "odd": ((1, 5, 5, 3, 18), "contiguous"),
    "unaligned": ((2, 3, 3, 1, 64), "offset"),
    "strided": ((2, 5, 4, 2, 64), "fused"),
    "empty": ((2, 0, 4, 2, 64), "contiguous"),
}
MAX_POSITION = 64  # rows of the vLLM-style cos_sin_cache


@dataclass
class OpCall:
    """One call of ``tk.ops.<op>`` with its arguments; ``writes``: the arguments it writes (in place, out=)."""

    name: str
    op: str
    args: tuple
    writes: tuple[int, ...] = ()

    def __call__(self, tk, args: Optional[tuple] = None) -> tuple[torch.Tensor, ...]:
        """Runs the op (with `args` in place of its own when given) and returns what it produced:
        its results, or the tensors it wrote."""
        args = self.args if args is None else args
        result = getattr(tk.ops, self.op)(*args)
        if self.writes:
            written = tuple(args[i] for i in self.writes)
            assert_padding_intact(*written, what=self.name)
            return written
        return result if isinstance(result, tuple) else (result,)

    def tensor_positions(self) -> list[int]:
        return [i for i, a in enumerate(self.args) if isinstance(a, torch.Tensor)]


class Maker:
    """Operands drawn on the CPU (seeded), placed on `device` in a given layout."""

    def __init__(self, dtype: torch.dtype, device, seed: int):
        self.dtype, self.device = dtype, torch.device(device)
        self.gen = torch.Generator().manual_seed(seed)

    def values(self, shape, scale=2.0, offset=0.5) -> torch.Tensor:
        """Random values, never zeros, with a non-zero mean (as helpers.random_input)."""
        return torch.randn(shape, generator=self.gen) * scale + offset

    def uniform(self, shape, lo, hi) -> torch.Tensor:
        return torch.rand(shape, generator=self.gen) * (hi - lo) + lo

    def buffer(self, shape, layout: str, dtype=None, shift: int = 1) -> torch.Tensor:
        """A tensor of `shape` in `layout`, its whole allocation NaN (the padding stays NaN:
        OpCall checks that a call wrote nothing past its output views): contiguous; `offset`
        (`shift` elements past an aligned base); `strided` (rows padded by 8 elements, the two
        leading dims swapped in memory)."""
        return with_nan_padding(self._layout(shape, layout, dtype, shift))

    def _layout(self, shape, layout: str, dtype=None, shift: int = 1) -> torch.Tensor:
        dtype = dtype or self.dtype
        shape = tuple(shape)
        if layout == "contiguous":
            return torch.empty(shape, dtype=dtype, device=self.device)
        if layout == "offset":
            n = math.prod(shape)
            return torch.empty(n + shift, dtype=dtype, device=self.device)[shift:].view(shape)
        if layout == "strided":
            padded = (*shape[:-1], shape[-1] + 8)
            if len(shape) >= 3:
                swapped = (padded[1], padded[0], *padded[2:])
                return torch.empty(swapped, dtype=dtype, device=self.device).transpose(0, 1)[..., : shape[-1]]
            return torch.empty(padded, dtype=dtype, device=self.device)[..., : shape[-1]]
        raise ValueError(layout)

    def place(self, values: torch.Tensor, layout: str = "contiguous", dtype=None, shift: int = 1) -> torch.Tensor:
        t = self.buffer(values.shape, layout, dtype, shift)
        t.copy_(values.to(t.dtype))
        return t

    def tensor(self, shape, layout="contiguous", dtype=None, shift=1, **kw) -> torch.Tensor:
        return self.place(self.values(shape, **kw), layout, dtype, shift)

    def nan(self, shape, layout="contiguous", dtype=None, shift=1) -> torch.Tensor:
        return self.buffer(shape, layout, dtype, shift)

    def param(self, n, dtype=None) -> torch.Tensor:
        """A norm weight or bias [n]: uniform in [0.5, 1.5) (never ones, which would hide a dropped weight)."""
        return self.uniform((n,), 0.5, 1.5).to(self.device, dtype or self.dtype)


# ---- row ops: norms and activations ----

def _rows(m: Maker, case: str):
    shape, layout = ROW_SHAPES[case]
    return shape, layout


def _norm_entries():
    def rms(weight: str, rounding: str):
        def build(m, case):
            (B, S, H), lay = _rows(m, case)
            w = None if weight == "none" else m.param(H, torch.float32 if weight == "fp32" else None)
            return (m.tensor((B, S, H), lay), w, EPS, rounding), ()
        return build

    def rms_out(m, case):
        (B, S, H), lay = _rows(m, case)
        w = m.param(H, torch.float32)
        out_dtype = torch.float32  # diffusers' rounding returns the weight's dtype
        return (m.nan((B, S, H), lay, out_dtype), m.tensor((B, S, H), lay), w, EPS, "diffusers"), (0,)

    def fused_add(m, case):
        (B, S, H), lay = _rows(m, case)
        return (m.tensor((B, S, H), lay), m.tensor((B, S, H), lay), m.param(H), EPS, "hf"), ()

    def fused_add_fp32_weight(m, case):
        (B, S, H), lay = _rows(m, case)
        return (m.tensor((B, S, H), lay), m.tensor((B, S, H), lay), m.param(H, torch.float32), EPS, "hf"), ()

    def fused_add_out(m, case):
        (B, S, H), lay = _rows(m, case)
        return (m.nan((B, S, H), lay), m.nan((B, S, H), lay), m.tensor((B, S, H), lay), m.tensor((B, S, H), lay),
                m.param(H, torch.float32), EPS, "torch"), (0, 1)

    def fused_add_inplace(m, case):
        (B, S, H), lay = _rows(m, case)
        return (m.tensor((B, S, H), lay), m.tensor((B, S, H), lay), m.param(H), EPS, "hf"), (0, 1)

    def layer(fp32: bool):
        def build(m, case):
            (B, S, H), lay = _rows(m, case)
            pd = torch.float32 if fp32 else None
            return (m.tensor((B, S, H), lay), m.param(H, pd), m.param(H, pd), 1e-5), ()
        return build

    def layer_out(m, case):
        (B, S, H), lay = _rows(m, case)
        return (m.nan((B, S, H), lay), m.tensor((B, S, H), lay), m.param(H), None, 1e-5), (0,)

    def mod_args(m, B, H):
        return m.tensor((B, 1, H), scale=0.5, offset=0.0), m.tensor((B, 1, H), scale=1.0, offset=0.0)

    def modulate(norm: str):
        def build(m, case):
            (B, S, H), lay = _rows(m, case)
            x = m.tensor((B, S, H), lay)
            scale, shift = mod_args(m, B, H)
            w, b = (m.param(H), m.param(H)) if norm == "layer" else (None, None)
            return (x, scale, shift, w, b, EPS, norm), ()
        return build

    def modulate_out(m, case):
        (B, S, H), lay = _rows(m, case)
        x = m.tensor((B, S, H), lay)
        scale, shift = mod_args(m, B, H)
        return (m.nan((B, S, H), lay), x, scale, shift, m.param(H), None, EPS, "rms"), (0,)

    def gated(norm: str, gate: bool):
        def build(m, case):
            (B, S, H), lay = _rows(m, case)
            x, y = m.tensor((B, S, H), lay), m.tensor((B, S, H), lay)
            g = m.tensor((B, 1, H), scale=0.5) if gate else None
            scale, shift = mod_args(m, B, H)
            w, b = (m.param(H, torch.float32), m.param(H, torch.float32)) if norm == "layer" else (None, None)
            return (x, y, g, scale, shift, w, b, EPS, norm), ()
        return build

    def gated_out(m, case):
        (B, S, H), lay = _rows(m, case)
        x, y = m.tensor((B, S, H), lay), m.tensor((B, S, H), lay)
        g = m.tensor((B, 1, H), scale=0.5)
        scale, shift = mod_args(m, B, H)
        return (m.nan((B, S, H), lay), m.nan((B, S, H), lay), x, y, g, scale, shift, None, None, EPS, "rms"), (0, 1)

    def grad_of(forward, like: int, saved, mask):
        """A backward op's call: grad_out in the layout of the forward's argument `like`, then
        saved(forward's arguments) (what its autograd passes on), then the output mask."""
        def build(m, case):
            args, _ = forward(m, case)
            x = args[like]
            lay = _rows(m, case)[1]
            return (m.tensor(x.shape, lay, scale=1.0, offset=0.0), *saved(args), list(mask)), ()
        return build

    def fused_add_backward(grad_h: bool):
        def build(m, case):
            (B, S, H), lay = _rows(m, case)
            h = m.tensor((B, S, H), lay)  # residual_out: the normalized sum
            g_h = m.tensor((B, S, H), lay, scale=1.0, offset=0.0) if grad_h else None
            return (m.tensor((B, S, H), lay, scale=1.0, offset=0.0), g_h, h, m.param(H), EPS, [True, True]), ()
        return build

    def gated_backward(norm: str, gate: bool):
        def build(m, case):
            (x, y, g, scale, shift, w, b, eps, n), _ = gated(norm, gate)(m, case)
            lay = _rows(m, case)[1]
            grads = [m.tensor(x.shape, lay, scale=1.0, offset=0.0) for _ in range(2)]  # grad_out, grad_h
            h = x  # the saved sum h (any values: the backward reads h, not x)
            return (*grads, h, y, g, scale, shift, w, b, eps, n, [True] * 7), ()
        return build

    return {
        "rms_norm": ("rms_norm", rms("same", "hf")),
        "rms_norm[fp32_weight]": ("rms_norm", rms("fp32", "hf")),
        "rms_norm[torch,no_weight]": ("rms_norm", rms("none", "torch")),
        "rms_norm_out": ("rms_norm_out", rms_out),
        "fused_add_rms_norm": ("fused_add_rms_norm", fused_add),
        "fused_add_rms_norm[fp32_weight]": ("fused_add_rms_norm", fused_add_fp32_weight),
        "fused_add_rms_norm_out": ("fused_add_rms_norm_out", fused_add_out),
        "fused_add_rms_norm_": ("fused_add_rms_norm_", fused_add_inplace),
        "layer_norm": ("layer_norm", layer(False)),
        "layer_norm[fp32_params]": ("layer_norm", layer(True)),
        "layer_norm_out": ("layer_norm_out", layer_out),
        "norm_modulate": ("norm_modulate", modulate("rms")),
        "norm_modulate[layer]": ("norm_modulate", modulate("layer")),
        "norm_modulate_out": ("norm_modulate_out", modulate_out),
        "gated_add_norm_modulate": ("gated_add_norm_modulate", gated("rms", True)),
        "gated_add_norm_modulate[layer,no_gate]": ("gated_add_norm_modulate", gated("layer", False)),
        "gated_add_norm_modulate_out": ("gated_add_norm_modulate_out", gated_out),
        # the FP8 outputs (e4m3 codes and row scales of the same values)
        "rms_norm_fp8": ("rms_norm_fp8", rms("same", "hf")),
        "rms_norm_fp8[fp32_weight]": ("rms_norm_fp8", rms("fp32", "hf")),
        "fused_add_rms_norm_fp8": ("fused_add_rms_norm_fp8", fused_add),
        "layer_norm_fp8": ("layer_norm_fp8", layer(False)),
        "layer_norm_fp8[fp32_params]": ("layer_norm_fp8", layer(True)),
        "norm_modulate_fp8": ("norm_modulate_fp8", modulate("rms")),
        "norm_modulate_fp8[layer]": ("norm_modulate_fp8", modulate("layer")),
        "gated_add_norm_modulate_fp8": ("gated_add_norm_modulate_fp8", gated("rms", True)),
        "gated_add_norm_modulate_fp8[layer,no_gate]": ("gated_add_norm_modulate_fp8", gated("layer", False)),
        # backward: the outputs' gradients first (x's layout), then what the forward saved
        "rms_norm_backward": ("rms_norm_backward", grad_of(rms("same", "hf"), 0, lambda a: (a[0], a[1], EPS),
                                                           [True, True])),
        "rms_norm_backward[fp32_weight]": ("rms_norm_backward", grad_of(rms("fp32", "hf"), 0,
                                                                         lambda a: (a[0], a[1], EPS), [True, True])),
        "rms_norm_backward[no_weight,dx]": ("rms_norm_backward", grad_of(rms("none", "torch"), 0,
                                                                          lambda a: (a[0], None, EPS), [True, False])),
        "fused_add_rms_norm_backward": ("fused_add_rms_norm_backward", fused_add_backward(True)),
        "fused_add_rms_norm_backward[no_grad_residual]": ("fused_add_rms_norm_backward", fused_add_backward(False)),
        "layer_norm_backward": ("layer_norm_backward", grad_of(layer(False), 0, lambda a: a, [True, True, True])),
        "layer_norm_backward[fp32_params,dx]": ("layer_norm_backward", grad_of(layer(True), 0, lambda a: a,
                                                                                [True, False, False])),
        "norm_modulate_backward": ("norm_modulate_backward", grad_of(modulate("rms"), 0, lambda a: a, [True] * 5)),
        "norm_modulate_backward[layer]": ("norm_modulate_backward", grad_of(modulate("layer"), 0, lambda a: a,
                                                                            [True] * 5)),
        "gated_add_norm_modulate_backward": ("gated_add_norm_modulate_backward", gated_backward("rms", True)),
        "gated_add_norm_modulate_backward[layer,no_gate]": ("gated_add_norm_modulate_backward",
                                                            gated_backward("layer", False)),
    }


def _gated_add_entries():
    """gated_add, a member of the norm family: x + gate * y (the elementwise kernel's gated form) and
    its backward (the norm backward with no norm)."""
    def gated_add(out: bool):
        def build(m, case):
            (B, S, H), lay = _rows(m, case)
            args = (m.tensor((B, S, H), lay), m.tensor((B, S, H), lay), m.tensor((B, 1, H), scale=0.5))
            return ((m.nan((B, S, H), lay), *args) if out else args), ((0,) if out else ())
        return build

    return {
        "gated_add": ("gated_add", gated_add(False)),
        "gated_add_out": ("gated_add_out", gated_add(True)),
        # backward: grad_out, y, gate and the mask (dy, dgate)
        "gated_add_backward": ("gated_add_backward", lambda m, case: (
            (m.tensor(_rows(m, case)[0], _rows(m, case)[1], scale=1.0, offset=0.0),
             *gated_add(False)(m, case)[0][1:], [True, True]), ())),
        "gated_add_backward[dgate]": ("gated_add_backward", lambda m, case: (
            (m.tensor(_rows(m, case)[0], _rows(m, case)[1], scale=1.0, offset=0.0),
             *gated_add(False)(m, case)[0][1:], [False, True]), ())),
    }


def _activation_entries():
    def act(name: str):
        def build(m, case):
            (B, S, H), lay = _rows(m, case)
            return (m.tensor((B, S, H), lay, scale=3.0, offset=0.0), name), ()
        return build

    def act_out(m, case):
        (B, S, H), lay = _rows(m, case)
        return (m.nan((B, S, H), lay), m.tensor((B, S, H), lay, scale=3.0, offset=0.0), "gelu_tanh"), (0,)

    def and_mul(name: str, act_first: bool):
        def build(m, case):
            (B, S, H), lay = _rows(m, case)
            return (m.tensor((B, S, 2 * H), lay, scale=3.0, offset=0.0), name, act_first), ()
        return build

    def and_mul_out(m, case):
        (B, S, H), lay = _rows(m, case)
        return (m.nan((B, S, H), lay), m.tensor((B, S, 2 * H), lay, scale=3.0, offset=0.0), "silu", True), (0,)

    def mul(name: str):
        def build(m, case):
            (B, S, H), lay = _rows(m, case)
            return (m.tensor((B, S, H), lay, scale=3.0, offset=0.0), m.tensor((B, S, H), lay), name), ()
        return build

    def mul_out(m, case):
        (B, S, H), lay = _rows(m, case)
        return (m.nan((B, S, H), lay), m.tensor((B, S, H), lay, scale=3.0, offset=0.0), m.tensor((B, S, H), lay),
                "gelu"), (0,)

    return {
        "activation[silu]": ("activation", act("silu")),
        "activation[gelu]": ("activation", act("gelu")),
        "activation[gelu_tanh]": ("activation", act("gelu_tanh")),
        "activation_out": ("activation_out", act_out),
        "act_and_mul[silu]": ("act_and_mul", and_mul("silu", True)),
        "act_and_mul[gelu,geglu]": ("act_and_mul", and_mul("gelu", False)),
        "act_and_mul[gelu_tanh]": ("act_and_mul", and_mul("gelu_tanh", True)),
        "act_and_mul_out": ("act_and_mul_out", and_mul_out),
        "act_mul[silu]": ("act_mul", mul("silu")),
        "act_mul[gelu_tanh]": ("act_mul", mul("gelu_tanh")),
        "act_mul_out": ("act_mul_out", mul_out),
        # backward: the output's gradient first, then the forward's inputs
        "activation_backward[gelu_tanh]": ("activation_backward", lambda m, case: (
            (m.tensor(_rows(m, case)[0], _rows(m, case)[1]), *act("gelu_tanh")(m, case)[0]), ())),
        "act_and_mul_backward[silu]": ("act_and_mul_backward", lambda m, case: (
            (m.tensor(_rows(m, case)[0], _rows(m, case)[1]), *and_mul("silu", True)(m, case)[0]), ())),
        "act_and_mul_backward[gelu,geglu]": ("act_and_mul_backward", lambda m, case: (
            (m.tensor(_rows(m, case)[0], _rows(m, case)[1]), *and_mul("gelu", False)(m, case)[0]), ())),
        "act_mul_backward[silu]": ("act_mul_backward", lambda m, case: (
            (m.tensor(_rows(m, case)[0], _rows(m, case)[1]), *mul("silu")(m, case)[0]), ())),
    }


# ---- RoPE ----

def _qk(m: Maker, case: str, pairs: bool = False):
    """q [B, S, Hq, d] and k [B, S, Hk, d] in the case's layout: separate tensors, each `shift`
    elements off (2 for the forms that need whole pairs), or views of one fused QKV projection."""
    (B, S, Hq, Hk, d), lay = ROPE_SHAPES[case]
    if lay == "fused":
        qkv = m.tensor((B, S, (Hq + 2 * Hk) * d))
        return qkv[..., : Hq * d].unflatten(-1, (Hq, d)), qkv[..., Hq * d: (Hq + Hk) * d].unflatten(-1, (Hk, d))
    shift = 2 if pairs else 1
    return m.tensor((B, S, Hq, d), lay, shift=shift), m.tensor((B, S, Hk, d), lay, shift=shift)


def _angles(m: Maker, shape):
    return m.uniform(shape, -math.pi * 64, math.pi * 64)


def neox_tables(m: Maker, B, S, R, dtype):
    """cos/sin [B, S, R] as transformers builds them (each angle twice: NeoX halves)."""
    a = _angles(m, (B, S, R // 2))
    a = torch.cat((a, a), dim=-1)
    return a.cos().to(m.device, dtype), a.sin().to(m.device, dtype)


def interleaved_tables(m: Maker, B, S, R):
    """fp32 cos/sin [B, S, R] as diffusers builds them (each angle for a pair of channels)."""
    a = _angles(m, (B, S, R // 2)).repeat_interleave(2, dim=-1)
    return a.cos().to(m.device), a.sin().to(m.device)


def ltx_coords(m: Maker, B, S, C):
    """grid [B, S, 3] in [0, 1) and freqs [C // 6], float32, as LTX-Video's rotary module makes them."""
    grid = m.uniform((B, S, 3), 0.0, 1.0).to(m.device)
    freqs = (m.uniform((C // 6,), 1.0, 100.0) * (math.pi / 2)).to(m.device)
    return grid, freqs


def _rope_entries():
    """The rope family's entries and the fused q/k norm + RoPE family's (they share the builders)."""
    def rope(style: str, fp32: bool, in_place: bool, partial: bool):
        def build(m, case):
            (B, S, Hq, Hk, d), _ = ROPE_SHAPES[case]
            q, k = _qk(m, case)
            R = (d // 4) * 2 if partial else d
            if style == "neox":
                cos, sin = neox_tables(m, B, S, R, torch.float32 if fp32 else m.dtype)
            else:
                cos, sin = interleaved_tables(m, 1, S, R)  # shared by the batch (Flux)
            return (q, k, cos, sin, style, fp32), ((0, 1) if in_place else ())
        return build

    def cached(style: str, fp32_cache: bool):
        def build(m, case):
            (B, S, Hq, Hk, d), _ = ROPE_SHAPES[case]
            q, k = _qk(m, case)
            query, key = q.flatten(0, 1).flatten(1, 2), k.flatten(0, 1)  # [T, Hq*d] and [T, Hk, d]
            R = d
            a = _angles(m, (MAX_POSITION, R // 2))
            cache = torch.cat((a.cos(), a.sin()), dim=-1).to(m.device, torch.float32 if fp32_cache else m.dtype)
            positions = torch.randint(0, MAX_POSITION, (B * S,), generator=m.gen).to(m.device)
            return (positions, query, key, d, cache, style), (1, 2)
        return build

    def hf(in_place: bool):
        def build(m, case):
            (B, S, Hq, Hk, d), _ = ROPE_SHAPES[case]
            q, k = _qk(m, case)
            cos, sin = neox_tables(m, B, S, d, m.dtype)
            return (q.transpose(1, 2), k.transpose(1, 2), cos, sin, 1), ((0, 1) if in_place else ())
        return build

    def qk_norm(fp32_weights: bool):
        def build(m, case):
            (B, S, Hq, Hk, d), _ = ROPE_SHAPES[case]
            q, k = _qk(m, case, pairs=True)
            wd = torch.float32 if fp32_weights else None
            cos, sin = interleaved_tables(m, 1, S, d)
            return (q, k, m.param(d, wd), m.param(d, wd), EPS, cos, sin), ()
        return build

    def hf_qk_norm(out: bool):
        def build(m, case):
            (B, S, Hq, Hk, d), lay = ROPE_SHAPES[case]
            q, k = _qk(m, case)
            cos, sin = neox_tables(m, B, S, d, m.dtype)
            args = (q, k, m.param(d), m.param(d), EPS, cos, sin)
            if not out:
                return args, ()
            out_layout = "strided" if lay == "fused" else lay
            return (m.nan(q.shape, out_layout), m.nan(k.shape, out_layout), *args), (0, 1)
        return build

    def ltx_qk3(m, case, pairs):
        (B, S, Hq, Hk, d), lay = ROPE_SHAPES[case]
        C = Hq * d
        if lay == "fused":
            qkv = m.tensor((B, S, 3 * C))
            return qkv[..., :C], qkv[..., C: 2 * C], (B, S, C)
        shift = 2 if pairs else 1
        return m.tensor((B, S, C), lay, shift=shift), m.tensor((B, S, C), lay, shift=shift), (B, S, C)

    def ltx(norm: bool):
        def build(m, case):
            q, k, (B, S, C) = ltx_qk3(m, case, pairs=norm)
            grid, freqs = ltx_coords(m, B, S, C)
            if norm:
                return (q, k, m.param(C), m.param(C), EPS, grid, freqs), ()
            return (q, k, grid, freqs), ()
        return build

    def qk_backward(forward, pairs: bool, mask):
        def build(m, case):
            args, _ = forward(m, case)
            grad_q, grad_k = _qk(m, case, pairs=pairs)
            return (grad_q, grad_k, *args, list(mask)), ()
        return build

    def ltx_qk_backward(mask):
        def build(m, case):
            args, _ = ltx(True)(m, case)
            grad_q, grad_k, _ = ltx_qk3(m, case, pairs=True)
            return (grad_q, grad_k, *args, list(mask)), ()
        return build

    rope_entries = {
        "rope[neox]": ("rope", rope("neox", False, False, False)),
        "rope[neox,partial]": ("rope", rope("neox", False, False, True)),
        "rope[interleaved,fp32]": ("rope", rope("interleaved", True, False, False)),
        "rope_[neox]": ("rope_", rope("neox", False, True, False)),
        "rope_[interleaved,fp32]": ("rope_", rope("interleaved", True, True, False)),
        "rope_cached_[neox]": ("rope_cached_", cached("neox", False)),
        "rope_cached_[interleaved,fp32_cache]": ("rope_cached_", cached("interleaved", True)),
        "hf_rope": ("hf_rope", hf(False)),
        "hf_rope_": ("hf_rope_", hf(True)),
        "ltx_rope_from_coords": ("ltx_rope_from_coords", ltx(False)),
        # backward: q's and k's gradients in q's and k's place (the same layouts)
        "rope_backward[neox]": ("rope_backward", rope("neox", False, False, True)),
        "rope_backward[interleaved,fp32]": ("rope_backward", rope("interleaved", True, False, False)),
        "ltx_rope_from_coords_backward": ("ltx_rope_from_coords_backward", ltx(False)),
    }
    qk_norm_rope_entries = {
        "qk_norm_rope": ("qk_norm_rope", qk_norm(False)),
        "qk_norm_rope[fp32_weights]": ("qk_norm_rope", qk_norm(True)),
        "hf_qk_norm_rope": ("hf_qk_norm_rope", hf_qk_norm(False)),
        "hf_qk_norm_rope_out": ("hf_qk_norm_rope_out", hf_qk_norm(True)),
        "ltx_qk_norm_rope_from_coords": ("ltx_qk_norm_rope_from_coords", ltx(True)),
        # the fused q/k norm + RoPE backward: grad_q, grad_k in q's and k's layout, the forward's inputs, the mask
        "qk_norm_rope_backward": ("qk_norm_rope_backward", qk_backward(qk_norm(False), True, [True] * 4)),
        "qk_norm_rope_backward[fp32_weights,dqk]": ("qk_norm_rope_backward", qk_backward(qk_norm(True), True,
                                                                                          [True, True, False, False])),
        "hf_qk_norm_rope_backward": ("hf_qk_norm_rope_backward", qk_backward(hf_qk_norm(False), False, [True] * 4)),
        "ltx_qk_norm_rope_from_coords_backward": ("ltx_qk_norm_rope_from_coords_backward",
                                                  ltx_qk_backward([True] * 4)),
    }
    return rope_entries, qk_norm_rope_entries


# ---- linear_gelu (cuBLASLt epilogue, or at::linear + our gelu_tanh where it has none) ----

LINEAR_OUT_FEATURES = 96


# decode_linear: (rows, in_features, layout) per case; 16-byte rows and alignment are what it takes
DECODE_SHAPES = {
    "small": (1, 64, "contiguous"),
    "aligned": (4, 1024, "contiguous"),
    "wide": (8, 4096, "contiguous"),
    "strided": (3, 512, "strided"),
    "empty": (0, 64, "contiguous"),
    "empty_width": (2, 0, "contiguous"),
}
DECODE_OUT_FEATURES = 77


def _gemm_entries():
    def linear(bias: bool, out: bool):
        def build(m, case):
            (B, S, K), lay = _rows(m, case)
            x = m.tensor((B, S, K), lay, scale=1.0, offset=0.0)
            w = m.tensor((LINEAR_OUT_FEATURES, K), scale=0.05, offset=0.0)
            b = m.tensor((LINEAR_OUT_FEATURES,), scale=0.5, offset=0.0) if bias else None
            if not out:
                return (x, w, b), ()
            return (m.nan((B, S, LINEAR_OUT_FEATURES), lay), x, w, b), (0,)
        return build

    def fp8(bias: bool, activation: str):
        """linear_fp8 on quantize_fp8's codes of x and of the weight (reference/fp8.py, drawn on the
        CPU): out_dtype is the case's dtype, bfloat16 for float32 (FP8 GEMMs give 16-bit outputs)."""
        from reference.fp8 import quantize_fp8_rowwise

        def build(m, case):
            (B, S, K), _ = _rows(m, case)
            out_dtype = torch.bfloat16 if m.dtype == torch.float32 else m.dtype
            x_codes, x_scale = quantize_fp8_rowwise(m.values((B, S, K), scale=1.0, offset=0.0))
            w_codes, w_scale = quantize_fp8_rowwise(m.values((LINEAR_OUT_FEATURES, K), scale=0.05, offset=0.0))
            b = m.place(m.values((LINEAR_OUT_FEATURES,), scale=0.5, offset=0.0), dtype=out_dtype) if bias else None
            return (m.place(x_codes, dtype=torch.float8_e4m3fn), m.place(x_scale, dtype=torch.float32),
                    m.place(w_codes, dtype=torch.float8_e4m3fn), m.place(w_scale.squeeze(-1), dtype=torch.float32),
                    b, out_dtype, activation), ()
        return build

    def decode(weight_fp8: bool, bias: bool):
        """decode_linear: a decode step's rows (at most 8) of the case's width; an odd number of output
        channels; the e4m3 weight as quantize_fp8's codes of each output channel."""
        from reference.fp8 import quantize_fp8_rowwise

        def build(m, case):
            rows, k, lay = DECODE_SHAPES[case]
            x = m.tensor((rows, 1, k), lay, scale=1.0, offset=0.0)
            w = m.values((DECODE_OUT_FEATURES, k), scale=0.05, offset=0.0)
            b = m.tensor((DECODE_OUT_FEATURES,), scale=0.5, offset=0.0) if bias else None
            if not weight_fp8:
                return (x, m.place(w), None, b), ()
            codes, scale = quantize_fp8_rowwise(w)
            return (x, m.place(codes, dtype=torch.float8_e4m3fn), m.place(scale.squeeze(-1), dtype=torch.float32),
                    b), ()
        return build

    return {
        "decode_linear": ("decode_linear", decode(False, True)),
        "decode_linear[fp8_weight,no_bias]": ("decode_linear", decode(True, False)),
        "linear_fp8": ("linear_fp8", fp8(True, "gelu_tanh")),
        "linear_fp8[no_bias]": ("linear_fp8", fp8(False, "none")),
        "linear_gelu": ("linear_gelu", linear(True, False)),
        "linear_gelu[no_bias]": ("linear_gelu", linear(False, False)),
        "linear_gelu_out": ("linear_gelu_out", linear(True, True)),
    }


# ---- the fused linear cross-entropy: hidden [B*S, H] in the row case's layout, a vocabulary of 37 ----
# (its hidden is 2-D: no "strided" case, whose check wants a 3-D view; the GEMMs take any strides)

LOSS_VOCAB = 37
LOSS_CASES = tuple(c for c in CASES if c != "strided")


def _loss_entries():
    def inputs(m, case):
        (B, S, H), lay = _rows(m, case)
        hidden = m.tensor((B * S, H), lay, scale=1.0, offset=0.0)
        weight = m.tensor((LOSS_VOCAB, H), scale=0.2, offset=0.0)
        target = torch.randint(0, LOSS_VOCAB, (B * S,), generator=m.gen)
        target[::3] = -100
        return hidden, weight, target.to(m.device)

    def flce(reduction: str, grads: bool):
        def build(m, case):
            hidden, weight, target = inputs(m, case)
            return (hidden, weight, target, None, -100, reduction, 0.1, 20.0, [grads, grads, False], 0), ()
        return build

    def flce_backward(m, case):
        hidden, weight, target = inputs(m, case)
        grad = m.place(m.uniform((hidden.shape[0],), 0.5, 1.5), _rows(m, case)[1], dtype=torch.float32)
        return (grad, hidden, weight, target, None, -100, "none", 0.0, None, [True, True, False], 0), ()

    return {
        "fused_linear_cross_entropy[sum,grads]": ("fused_linear_cross_entropy", flce("sum", True)),
        "fused_linear_cross_entropy[none]": ("fused_linear_cross_entropy", flce("none", False)),
        "fused_linear_cross_entropy_backward[none]": ("fused_linear_cross_entropy_backward", flce_backward),
    }


# ---- GroupNorm: x [N, C, *spatial] channels-first or channels-last ----

# case -> (x's shape, groups, layout): whole groups, split groups (chunk moments combined inline, or by
# the finalize kernel past 32 chunks), the element-by-element path (odd spatial, misaligned), and
# channels-last ([N, C, L] for "strided": the channel stride is 1, the tensor not contiguous).
GROUP_NORM_SHAPES = {
    "small": ((2, 16, 4, 4), 4, "channels_first"),
    "aligned": ((2, 64, 16, 16), 8, "channels_first"),
    "wide": ((1, 64, 64, 64), 4, "channels_first"),
    "odd": ((2, 6, 5, 7), 3, "channels_first"),
    "unaligned": ((2, 16, 8, 8), 4, "offset"),
    "strided": ((2, 40, 36), 8, "channels_last"),
    "split": ((1, 8, 256, 256), 1, "channels_first"),
    "split_vec": ((1, 64, 48, 48), 8, "channels_last"),
    "empty": ((0, 16, 4, 4), 4, "channels_first"),
    "empty_width": ((2, 16, 0, 4), 4, "channels_first"),
}


def _gn_place(m: Maker, values: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "channels_last":
        return m.place(values.movedim(1, -1).contiguous()).movedim(-1, 1)
    return m.place(values, "offset" if layout == "offset" else "contiguous")


def _group_norm_entries():
    def gn(affine: bool, add: bool, out: bool, activation: str):
        def build(m, case):
            shape, groups, layout = GROUP_NORM_SHAPES[case]
            c = shape[1]
            x = _gn_place(m, m.values(shape), layout)
            w, b = (m.param(c), m.tensor((c,), scale=0.5, offset=0.0)) if affine else (None, None)
            args = ((x, m.tensor((shape[0], c), scale=0.5)) if add else (x,)) + (groups, w, b, EPS, activation)
            if not out:
                return args, ()
            dst = _gn_place(m, torch.full(shape, float("nan")), layout)
            return (dst, *args), (0,)
        return build

    return {
        "group_norm": ("group_norm", gn(True, False, False, "silu")),
        "group_norm[plain]": ("group_norm", gn(False, False, False, "none")),
        "group_norm_out": ("group_norm_out", gn(True, False, True, "none")),
        "add_group_norm": ("add_group_norm", gn(True, True, False, "silu")),
        "add_group_norm_out": ("add_group_norm_out", gn(False, True, True, "silu")),
    }


# Ops that launch nothing (host queries): covered by the rest of their family.
def _quant_entries():
    def quantize(m, case):
        shape, lay = _rows(m, case)
        return (m.tensor(shape, lay, scale=3.0, offset=0.0),), ()

    def act_mul(act: str):
        def build(m, case):
            shape, lay = _rows(m, case)
            return (m.tensor(shape, lay, scale=3.0, offset=0.0), m.tensor(shape, lay), act), ()
        return build

    return {"quantize_fp8": ("quantize_fp8", quantize), "act_mul_fp8[silu]": ("act_mul_fp8", act_mul("silu")),
            "act_mul_fp8[gelu_tanh]": ("act_mul_fp8", act_mul("gelu_tanh"))}


QUERY_OPS = ("linear_gelu_fused",)

_ROPE_ENTRIES, _QK_NORM_ROPE_ENTRIES = _rope_entries()
FAMILIES = {"norm": {**_norm_entries(), **_gated_add_entries()}, "activation": _activation_entries(),
            "rope": _ROPE_ENTRIES, "qk_norm_rope": _QK_NORM_ROPE_ENTRIES, "gemm": _gemm_entries(),
            "loss": _loss_entries(), "group_norm": _group_norm_entries(), "quant": _quant_entries()}
ENTRIES: dict[str, tuple[str, str, Callable]] = {
    name: (family, op, build) for family, entries in FAMILIES.items() for name, (op, build) in entries.items()
}
COVERED_OPS = sorted({op for _, op, _ in ENTRIES.values()} | set(QUERY_OPS))


# Entries that take fewer cases than their family: the FP8 GEMM wants rows of a multiple of 16 bytes,
# 16-byte aligned (no odd, unaligned, padded-stride or split widths), and with a bias rows of at least one
# element (in_features 0 with a bias is refused).
ENTRY_CASES = {"decode_linear": tuple(DECODE_SHAPES), "decode_linear[fp8_weight,no_bias]": tuple(DECODE_SHAPES),
               "linear_fp8": ("small", "aligned", "wide", "empty"),
               "linear_fp8[no_bias]": ("small", "aligned", "wide", "empty", "empty_width")}


def cases_of(name: str) -> tuple[str, ...]:
    if name in ENTRY_CASES:
        return ENTRY_CASES[name]
    family = ENTRIES[name][0]
    shapes = {"rope": ROPE_SHAPES, "qk_norm_rope": ROPE_SHAPES, "group_norm": GROUP_NORM_SHAPES}.get(family, ROW_SHAPES)
    return tuple(c for c in CASES if c in shapes and (family != "loss" or c in LOSS_CASES))


def build(name: str, dtype: torch.dtype, case: str, device="cuda", seed: int = 0) -> OpCall:
    """The call of catalog entry `name` for `dtype` and `case`, its values drawn from `seed`."""
    family, op, make = ENTRIES[name]
    args, writes = make(Maker(dtype, device, seed), case)
    return OpCall(name, op, tuple(args), tuple(writes))


def all_calls(dtype: torch.dtype, device="cuda", seed: int = 0, cases=CASES):
    """(entry, case, call) for every entry and every case it has among `cases`."""
    for name in ENTRIES:
        for case in cases_of(name):
            if case in cases:
                yield name, case, build(name, dtype, case, device, seed)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaNs included), same shape, dtype and strides not required."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
            torch.float8_e4m3fn: torch.uint8}
    ai, bi = a.contiguous(), b.contiguous()
    if a.dtype in ints:
        ai, bi = ai.view(ints[a.dtype]), bi.view(ints[a.dtype])
    return torch.equal(ai, bi)
