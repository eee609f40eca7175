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
  for linear_gelu the same shapes are [..., in_features];
- ``empty``: no rows (no tokens); ``empty_width``: rows of no elements (norms, activations).

Values are drawn on the CPU from a generator seeded by ``seed`` and then placed in the case's
layout on ``device``: the same seed gives the same bits on every device and in every layout, and
out= buffers are NaN.

The entries live with their family, in ``tests/<family>/<family>_cases.py`` (tests/families.py):
``entries()`` maps each entry's name to ``(op, build)``, ``build(maker, case) -> (args, writes)``;
optional ``CASES`` (the cases its entries take, by default every row case of ROW_SHAPES),
``ENTRY_CASES`` (an entry's own cases) and ``QUERY_OPS`` (its ops that launch nothing). This module
keeps what the families share (Maker, OpCall, the row cases) and gathers them on first use of
ENTRIES, FAMILIES or COVERED_OPS: a family's module imports this one, never the reverse at import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Optional

import torch

from families import family_module, family_names
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
# Index operands (RoPE positions, the rows of the vLLM-style cos_sin_cache) are drawn below it; the
# reliability tests make an index tensor unready by filling it with MAX_POSITION + 1.
MAX_POSITION = 64


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


def rows(m: Maker, case: str):
    """x's shape [B, S, H] and the layout of every row operand, for a row case."""
    shape, layout = ROW_SHAPES[case]
    return shape, layout


# ---- the families' entries, gathered ----

@cache
def _gathered():
    families, entry_cases, query_ops = {}, {}, []
    for family in family_names():
        module = family_module(family, "cases")
        families[family] = module.entries()
        cases = tuple(c for c in CASES if c in getattr(module, "CASES", ROW_SHAPES))
        entry_cases.update({name: cases for name in families[family]})
        entry_cases.update(getattr(module, "ENTRY_CASES", {}))
        query_ops += getattr(module, "QUERY_OPS", ())
    names = [name for found in families.values() for name in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    assert not twice, f"catalog entries two families define: {twice}"
    entries = {name: (family, op, make) for family, found in families.items() for name, (op, make) in found.items()}
    covered = sorted({op for _, op, _ in entries.values()} | set(query_ops))
    return {"FAMILIES": families, "ENTRIES": entries, "ENTRY_CASES": entry_cases, "QUERY_OPS": tuple(query_ops),
            "COVERED_OPS": covered}


def __getattr__(name: str):
    """FAMILIES (family -> its entries), ENTRIES (name -> (family, op, build)), ENTRY_CASES (name -> its
    cases), QUERY_OPS and COVERED_OPS (every op an entry calls, and the host queries)."""
    if name in ("FAMILIES", "ENTRIES", "ENTRY_CASES", "QUERY_OPS", "COVERED_OPS"):
        return _gathered()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cases_of(name: str) -> tuple[str, ...]:
    return _gathered()["ENTRY_CASES"][name]


def build(name: str, dtype: torch.dtype, case: str, device="cuda", seed: int = 0) -> OpCall:
    """The call of catalog entry `name` for `dtype` and `case`, its values drawn from `seed`."""
    family, op, make = _gathered()["ENTRIES"][name]
    args, writes = make(Maker(dtype, device, seed), case)
    return OpCall(name, op, tuple(args), tuple(writes))


def all_calls(dtype: torch.dtype, device="cuda", seed: int = 0, cases=CASES):
    """(entry, case, call) for every entry and every case it has among `cases`."""
    for name in _gathered()["ENTRIES"]:
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
