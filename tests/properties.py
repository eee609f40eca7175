"""Shared pieces of the hypothesis property tests (tests/test_properties_*.py).

Each property draws a description of a call (shapes, dtype, operand layouts, broadcasts, flags and
a seed for the values) and checks the result against the float64 reference. It runs twice:

- on the GPU with the kernels (``Kernel``; marked gpu), with KERNEL_EXAMPLES examples; the caching
  allocator is filled with NaN before every example, so an output element never written shows;
- here on the CPU, CPU_EXAMPLES examples each: with the eager code the kernels replace (the
  strategies, the test code and the bounds are checked on every machine: a bound the eager code
  itself cannot meet would be wrong, not the kernel), and with the package's own Python API over
  eager ops (``PackageOnCpu``, tests/eager_kernel.py: the calls the GPU run makes, argument for
  argument, go through the real wrappers and the ops' schemas).

Examples are derandomized (the same examples on every run and machine: hypothesis derives them
from the test's name) and no example database is kept. ``TK_PROPERTY_SCALE=10`` multiplies the
budgets for a longer search.
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from cuda_poison import poison_cuda_cache
from helpers import DTYPES, assert_padding_intact, with_nan_padding  # noqa: F401 (re-exported)

SCALE = float(os.environ.get("TK_PROPERTY_SCALE", "1"))
CPU_EXAMPLES = 15


def budget(examples: int):
    """Settings of a property test: `examples` examples (times TK_PROPERTY_SCALE), derandomized."""
    return settings(max_examples=max(1, int(examples * SCALE)), derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)


dtypes = st.sampled_from(DTYPES)
seeds = st.integers(0, 2**32 - 1)
LAYOUTS = ("contiguous", "offset", "padded", "transposed")


@st.composite
def layouts(draw, kinds=LAYOUTS):
    """(kind, k): contiguous; `offset` k elements past an aligned base; rows `padded` by k elements;
    the two leading dimensions `transposed` in memory, rows padded by k."""
    kind = draw(st.sampled_from(kinds))
    return kind, (0 if kind == "contiguous" else draw(st.integers(1, 9)))


@st.composite
def leading_dims(draw, max_dims=3, max_rows=64):
    """1 to max_dims leading dimensions of at most max_rows rows in all (sizes 1 up, some 0)."""
    n = draw(st.integers(1, max_dims))
    dims, rows = [], 1
    for _ in range(n):
        d = draw(st.integers(0 if draw(st.integers(0, 19)) == 0 else 1, max(1, max_rows // max(rows, 1))))
        dims.append(d)
        rows *= max(d, 1)
    return tuple(dims)


widths = st.one_of(st.integers(1, 300), st.sampled_from([512, 1024, 2048, 3584, 4096, 5120, 8192]),
                   st.integers(300, 9000))


def buffer(shape, dtype, device, layout):
    """A tensor of `shape` laid out as `layout` (see layouts); its allocation is NaN (the view
    too, until written: helpers.with_nan_padding), so that a read or a write past the view shows."""
    return with_nan_padding(_layout(shape, dtype, device, layout))


def _layout(shape, dtype, device, layout):
    kind, k = layout
    shape = tuple(shape)
    if kind == "offset":
        n = 1
        for s in shape:
            n *= s
        return torch.empty(n + k, dtype=dtype, device=device)[k:].view(shape)
    if kind in ("padded", "transposed") and shape:
        padded = (*shape[:-1], shape[-1] + k)
        if kind == "transposed" and len(shape) >= 3:
            t = torch.empty((padded[1], padded[0], *padded[2:]), dtype=dtype, device=device).transpose(0, 1)
        else:
            t = torch.empty(padded, dtype=dtype, device=device)
        return t[..., : shape[-1]]
    return torch.empty(shape, dtype=dtype, device=device)


def place(values, layout):
    t = buffer(values.shape, values.dtype, values.device, layout)
    t.copy_(values)
    return t


class Values:
    """Random values from one seed, on one device."""

    def __init__(self, seed, device):
        self.device = torch.device(device)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)

    def normal(self, shape, dtype, scale=2.0, offset=0.5):
        return (torch.randn(shape, generator=self.gen, device=self.device) * scale + offset).to(dtype)

    def uniform(self, shape, dtype, lo, hi):
        return (torch.rand(shape, generator=self.gen, device=self.device) * (hi - lo) + lo).to(dtype)

    def ints(self, hi, shape):
        return torch.randint(0, hi, shape, generator=self.gen, device=self.device)


class Impl:
    """What a property runs: the kernels (on CUDA) or the eager code (on the CPU)."""

    device = "cpu"

    def prepare(self):
        """Called before each example."""


class KernelImpl(Impl):
    device = "cuda"

    def __init__(self, tk):
        self.tk = tk

    def prepare(self):
        poison_cuda_cache(large_bytes=64 << 20, small_blocks=16)

    def __getattr__(self, name):  # the kernel's Python API
        return getattr(self.tk, name)


class PackageOnCpu(Impl):
    """The package's Python API (torch-ext/transformer_kernels) over eager CPU ops."""

    def __getattr__(self, name):
        from eager_kernel import eager_kernel

        return getattr(eager_kernel(), name)


CPU_IMPLS = ("eager", "package")


def nan_like(shape, dtype, device, layout):
    """An output buffer of NaN in `layout`, its allocation's padding NaN too (assert_padding_intact)."""
    return buffer(shape, dtype, device, layout)
