#!/usr/bin/env python3
"""Micro-benchmarks: every op on real model shapes and dtypes against its baselines.

    python benchmarks/bench_micro.py --out benchmarks/results [--ops rms_norm] [--quick]

Writes micro-<gpu>-<date>.json and .md (see benchmarks/harness.py for the method).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import re
import sys
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import Case, Report, copy_gbps, environment  # noqa: E402
from integrations.loading import load_kernel, use_local_build  # noqa: E402
from reference.norms import hf_rms_norm  # noqa: E402

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}

# (rows, hidden, where the shape comes from)
RMS_NORM_SHAPES = [
    (1, 4096, "Llama-3.1-8B decode, 1 token"),
    (4, 4096, "Llama-3.1-8B decode, batch 4"),
    (2048, 4096, "Llama-3.1-8B prefill 2048"),
    (16384, 4096, "Llama-3.1-8B prefill 4x4096"),
    (8192, 3584, "Qwen2.5-7B prefill 8192"),
    (16128, 2048, "LTX-Video 2B q/k norm across heads, 2x8064 tokens"),
    (16128, 4096, "LTX-Video 13B q/k norm across heads, 2x8064 tokens"),
    (65536, 128, "Qwen3-8B per-head q norm, 2048 tokens x 32 heads"),
]
RMS_NORM_QUICK = {(1, 4096), (16384, 4096), (65536, 128)}
EXTRA_DTYPES_SHAPE = (16384, 4096)  # fp16 and fp32 are timed on this shape too


def eager_llama_rms_norm(hidden: int, dtype: torch.dtype, eps: float) -> tuple[str, Callable]:
    """transformers' own LlamaRMSNorm when installed, else its verbatim copy in reference/."""
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
    except ImportError:
        return "eager", lambda x, w: hf_rms_norm(x, w, eps)
    module = LlamaRMSNorm(hidden, eps=eps).to("cuda", dtype)
    return "eager", lambda x, w: module(x)


def liger_rms_norm() -> Callable | None:
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return None
    # Liger's "llama" casting mode is the HF rounding (normalize in fp32, cast, then weight).
    return lambda x, w, eps: LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama")


def rms_norm_case(tk, rows: int, hidden: int, dtype: torch.dtype, note: str) -> Case:
    eps = 1e-6
    x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
    w = (torch.rand(hidden, device="cuda") + 0.5).to(dtype)
    _, eager = eager_llama_rms_norm(hidden, dtype, eps)
    compiled = torch.compile(lambda x, w: hf_rms_norm(x, w, eps), dynamic=False)
    impls = {
        "ours": lambda: tk.rms_norm(x, w, eps),
        "eager": lambda: eager(x, w),
        "native": lambda: F.rms_norm(x, (hidden,), w, eps),
        "compile": lambda: compiled(x, w),
    }
    liger = liger_rms_norm()
    if liger is not None:
        impls["liger"] = lambda: liger(x, w, eps)
    nbytes = 2 * x.numel() * x.element_size() + w.numel() * w.element_size()
    return Case("rms_norm", f"{rows}x{hidden}", DTYPE_NAMES[dtype], nbytes, impls, latency=rows <= 4, note=note)


def rms_norm_cases(tk, quick: bool) -> Iterator[Case]:
    configs = [(r, h, torch.bfloat16, note) for r, h, note in RMS_NORM_SHAPES if not quick or (r, h) in RMS_NORM_QUICK]
    configs += [(*EXTRA_DTYPES_SHAPE, dt, "dtype sweep") for dt in (torch.float16, torch.float32)]
    for rows, hidden, dtype, note in configs:
        yield rms_norm_case(tk, rows, hidden, dtype, note)


OPS = {"rms_norm": rms_norm_cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--ops", nargs="*", default=sorted(OPS), choices=sorted(OPS))
    parser.add_argument("--quick", action="store_true", help="a few shapes per op")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the micro-benchmarks need an NVIDIA GPU (torch.cuda.is_available() is False)")

    use_local_build()
    tk = load_kernel()
    report = Report(environment(), copy_gbps())
    print(f"{report.env['gpu']}: device-to-device copy {report.copy_gbps:.0f} GB/s")
    for op in args.ops:
        for case in tqdm(OPS[op](tk, args.quick), desc=op):
            report.run(case)
            torch.cuda.empty_cache()
    gpu = re.sub(r"[^a-z0-9]+", "-", report.env["gpu"].lower()).strip("-")
    stem = f"micro-{gpu}-{_dt.date.today().isoformat()}"
    js, md = report.save(args.out, stem)
    print(md.read_text())
    print(f"wrote {js} and {md}")


if __name__ == "__main__":
    main()
