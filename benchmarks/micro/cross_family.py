"""`--ops` names whose cases span op families, kept so that every name scripts and results use still
runs: `untuned` (norm's and activation's ops at widths nobody tunes to, shape by shape) and
`activation_rope_backward` (activation's backward cases, then rope's). A new op's cases go in its
family's module, not here."""

from __future__ import annotations

from typing import Iterator

import torch

from benchmarks.harness import Case
from benchmarks.micro.activation import activation_backward_cases
from benchmarks.micro.common import liger_fn, nbytes, with_baselines
from benchmarks.micro.norm import rms_norm_case
from benchmarks.micro.rope import rope_backward_cases
from reference.activations import eager_act_and_mul, eager_activation
from reference.norms import hf_fused_add_rms_norm

# Shapes nobody tunes to (issue 35, item 5): token counts from 1 to a few thousand that are not powers
# of two, widths that are not multiples of 64 (two not of 8). Drawn once (random.Random(20261202)) and
# kept, so that runs compare.
UNTUNED_SHAPES = [(1, 1598), (83, 7906), (111, 4659), (418, 2450), (3990, 1598), (4590, 7906)]


def untuned_cases(tk, quick: bool) -> Iterator[Case]:
    """rms_norm, fused_add_rms_norm, silu_and_mul and gelu (tanh) at UNTUNED_SHAPES, bf16, against the
    same baselines as their tuned cases (one-token rows are host-bound: timed per call)."""
    eps = 1e-6
    liger_add = liger_fn("fused_add_rms_norm", "LigerFusedAddRMSNormFunction")
    for rows, hidden in UNTUNED_SHAPES[:2] if quick else UNTUNED_SHAPES:
        note = "untuned shape"
        latency = rows <= 4
        yield rms_norm_case(tk, rows, hidden, torch.bfloat16, note)
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        r = torch.randn_like(x)
        w = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16)
        yield Case("fused_add_rms_norm", f"{rows}x{hidden}", "bfloat16", 4 * nbytes(x) + nbytes(w),
                   with_baselines(lambda: tk.fused_add_rms_norm(x, r, w, eps),
                                  lambda x, r, w: hf_fused_add_rms_norm(x, r, w, eps), (x, r, w),
                                  liger=liger_add, liger_args=(x, r, w, eps)), latency=latency, note=note)
        p = torch.randn(rows, 2 * hidden, device="cuda", dtype=torch.bfloat16)
        yield Case("silu_and_mul", f"{rows}x(2x{hidden})", "bfloat16", nbytes(p) * 3 // 2,
                   with_baselines(lambda: tk.silu_and_mul(p), lambda p: eager_act_and_mul(p, "silu", act_first=True),
                                  (p,)), latency=latency, note=note)
        yield Case("gelu (tanh)", f"{rows}x{hidden}", "bfloat16", 2 * nbytes(x),
                   with_baselines(lambda: tk.gelu(x, "tanh"), lambda h: eager_activation(h, "gelu_tanh"), (x,),
                                  eager_name="native"), latency=latency, note=note)


def activation_rope_backward_cases(tk, quick: bool) -> Iterator[Case]:
    """activation's backward cases, then rope's (full runs only), in the order of the one list they were."""
    yield from activation_backward_cases(tk, quick)
    if not quick:
        yield from rope_backward_cases(tk)


CASES = {"untuned": untuned_cases, "activation_rope_backward": activation_rope_backward_cases}
