"""Micro-benchmark cases of the group_norm family (csrc/group_norm/): group_norm and add_group_norm
(+ SiLU) on SDXL's UNet (`--ops group_norm`) and VAE decoder (`--ops group_norm_vae`) shapes, and
their backward on the UNet's (`--ops group_norm_backward`)."""

from __future__ import annotations

from typing import Iterator

import torch

from benchmarks.harness import Case
from benchmarks.micro.common import DTYPE_NAMES, backward_impls, nbytes, with_baselines
from reference.group_norm import eager_group_norm

# ([N, C, H, W], groups, where the shape comes from): SDXL's UNet at 1024x1024 (128x128 latents,
# batch 2 for guidance) and its VAE decoder (1024x1024 output, one image).
GROUP_NORM_SHAPES = [
    ((2, 320, 128, 128), 32, "SDXL UNet 128x128 level (resnets' norm1/norm2)"),
    ((2, 640, 64, 64), 32, "SDXL UNet 64x64 level"),
    ((2, 1280, 32, 32), 32, "SDXL UNet 32x32 level"),
    ((1, 512, 256, 256), 32, "VAE decoder up block 1"),
    ((1, 256, 512, 512), 32, "VAE decoder up block 2"),
    ((1, 128, 1024, 1024), 32, "VAE decoder last up block and conv_norm_out"),
]
GROUP_NORM_QUICK = {(2, 320, 128, 128), (1, 128, 1024, 1024)}
APEX_NOTE = "Apex (NVIDIA's NHWC GroupNorm) is not installed here: no Apex column"


def group_norm_case(tk, shape, groups: int, dtype: torch.dtype, layout: str, activation: str | None,
                    time_add: bool, note: str) -> Case:
    """GroupNorm (+ SiLU) of x [N, C, H, W] in `layout`; with `time_add`, ResnetBlock2D's norm2 of
    x + temb[:, :, None, None]. Baselines: F.group_norm (+ F.silu) and its torch.compile."""
    eps = 1e-5
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(shape, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    w = (torch.rand(shape[1], device="cuda") + 0.5).to(dtype)
    b = (torch.rand(shape[1], device="cuda") - 0.5).to(dtype)
    temb = torch.randn(shape[0], shape[1], device="cuda", dtype=dtype) if time_add else None
    if time_add:
        ours = lambda: tk.add_group_norm(x, temb, groups, w, b, eps, activation)  # noqa: E731
        eager = lambda x, t, w, b: eager_group_norm(x, groups, w, b, eps, activation, bias_nc=t)  # noqa: E731
        args = (x, temb, w, b)
    else:
        ours = lambda: tk.group_norm(x, groups, w, b, eps, activation)  # noqa: E731
        eager = lambda x, w, b: eager_group_norm(x, groups, w, b, eps, activation)  # noqa: E731
        args = (x, w, b)
    op = ("add_group_norm" if time_add else "group_norm") + (f" + {activation}" if activation else "")
    n, c, h, wd = shape
    return Case(f"{op} ({layout.replace('_', '-')})", f"{n}x{c}x{h}x{wd} G{groups}", DTYPE_NAMES[dtype],
                2 * nbytes(x) + nbytes(w, b, temb), with_baselines(ours, eager, args), note=f"{note}; {APEX_NOTE}")


def group_norm_cases(tk, quick: bool, vae: bool = False) -> Iterator[Case]:
    """The UNet's shapes (vae=False) or the VAE decoder's, in both memory formats, + SiLU (the
    UNet's also with the time add of norm2)."""
    for shape, groups, note in GROUP_NORM_SHAPES:
        if (shape[0] == 1) != vae or (quick and shape not in GROUP_NORM_QUICK):
            continue
        for layout in ("channels_first", "channels_last"):
            yield group_norm_case(tk, shape, groups, torch.bfloat16, layout, "silu", False, note)
            if not vae:  # the UNet's resnets: norm2 takes the time embedding
                yield group_norm_case(tk, shape, groups, torch.bfloat16, layout, "silu", True, note)
    if not vae:  # without the activation: Transformer2DModel's input norm
        yield group_norm_case(tk, (2, 640, 64, 64), 32, torch.bfloat16, "channels_first", None, False,
                              "Transformer2DModel input norm (no activation)")
    elif not quick:  # SDXL's VAE decodes upcast to fp32 (force_upcast), SD 1.5's in fp16
        for dtype in (torch.float32, torch.float16):
            for layout in ("channels_first", "channels_last"):
                yield group_norm_case(tk, (1, 128, 1024, 1024), 32, dtype, layout, "silu", False,
                                      "VAE decoder last up block, " + DTYPE_NAMES[dtype])


def group_norm_vae_cases(tk, quick: bool) -> Iterator[Case]:
    return group_norm_cases(tk, quick, vae=True)


def group_norm_backward_case(tk, shape, groups: int, layout: str, time_add: bool, note: str) -> Case:
    """The backward of ResnetBlock2D's norm2 + SiLU (with the time add) or norm1 + SiLU, as LoRA or full
    fine-tuning runs it: the gradients of x, the weight and bias (and the time embedding). Bytes: x and
    the output gradient read, the input gradient written (parameters are small)."""
    eps, dtype = 1e-5, torch.bfloat16
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(shape, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    w = (torch.rand(shape[1], device="cuda") + 0.5).to(dtype)
    b = (torch.rand(shape[1], device="cuda") - 0.5).to(dtype)
    temb = torch.randn(shape[0], shape[1], device="cuda", dtype=dtype)
    if time_add:
        ours = lambda x, t, w, b: tk.add_group_norm(x, t, groups, w, b, eps, "silu")  # noqa: E731
        eager = lambda x, t, w, b: eager_group_norm(x, groups, w, b, eps, "silu", bias_nc=t)  # noqa: E731
        inputs = (x, temb, w, b)
    else:
        ours = lambda x, w, b: tk.group_norm(x, groups, w, b, eps, "silu")  # noqa: E731
        eager = lambda x, w, b: eager_group_norm(x, groups, w, b, eps, "silu")  # noqa: E731
        inputs = (x, w, b)
    op = ("add_group_norm" if time_add else "group_norm") + " + silu backward"
    n, c, h, wd = shape
    return Case(f"{op} ({layout.replace('_', '-')})", f"{n}x{c}x{h}x{wd} G{groups}", DTYPE_NAMES[dtype],
                3 * nbytes(x), backward_impls(ours, eager, inputs), note=note)


def group_norm_backward_cases(tk, quick: bool) -> Iterator[Case]:
    for shape, groups, note in GROUP_NORM_SHAPES:
        if shape[0] == 1 or (quick and shape not in GROUP_NORM_QUICK):
            continue
        for layout in ("channels_first", "channels_last"):
            for time_add in (False, True):
                yield group_norm_backward_case(tk, shape, groups, layout, time_add, note)


CASES = {"group_norm": group_norm_cases, "group_norm_vae": group_norm_vae_cases,
         "group_norm_backward": group_norm_backward_cases}
