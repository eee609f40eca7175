#!/usr/bin/env python3
"""Micro-benchmarks: every op on real model shapes and dtypes against its baselines.

    python benchmarks/bench_micro.py --out benchmarks/results [--ops rms_norm] [--quick]

Writes micro-<gpu>-<date>.json and .md (see benchmarks/harness.py for the method). The cases live
with their op family, in benchmarks/micro/<family>.py; benchmarks/micro/__init__.py gathers them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from benchmarks import harness  # noqa: E402
from benchmarks.harness import Report, copy_gbps, environment, result_stem  # noqa: E402
from benchmarks.micro import OPS  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--ops", nargs="*", default=sorted(OPS), choices=sorted(OPS))
    parser.add_argument("--quick", action="store_true", help="a few shapes per op")
    parser.add_argument("--flush", choices=harness.FLUSH_MODES, default="write",
                        help="how L2 is flushed before each timed rep: 'write' zeroes a 256 MB buffer as "
                             "triton's do_bench does (the benchmark of record), 'read' sums one and leaves "
                             "L2 clean (shows what the memset's dirty lines cost each kernel)")
    args = parser.parse_args()
    harness.L2_FLUSH = args.flush
    if not torch.cuda.is_available():
        raise SystemExit("the micro-benchmarks need an NVIDIA GPU (torch.cuda.is_available() is False)")

    use_local_build()
    tk = load_kernel()
    # Every case compiles its own specialized graph; the default limit would silently fall back to
    # eager after 8 shapes of one function.
    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.accumulated_recompile_limit = 4096
    report = Report(environment(), copy_gbps())
    print(f"{report.env['gpu']}: device-to-device copy {report.copy_gbps:.0f} GB/s")
    stem = result_stem("micro", report.env, "-read-flush" if args.flush == "read" else "")
    for op in args.ops:
        for case in tqdm(OPS[op](tk, args.quick), desc=op):
            report.run(case)
            torch.cuda.empty_cache()
        js, md = report.save(args.out, stem)  # after each op: a run cut short keeps what it measured
    print(md.read_text())
    print(f"wrote {js} and {md}")


if __name__ == "__main__":
    main()
