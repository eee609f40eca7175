#!/usr/bin/env python3
"""Plots a micro-benchmark result (JSON from bench_micro.py): GB/s for each shape (ordered by bytes
moved), one panel per op, one bar per implementation, the device-to-device copy of the same run
drawn as the ceiling.

    python benchmarks/plot_micro.py benchmarks/results/micro-nvidia-h200-2026-12-01.json
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"ours": dict(color="#d62728"), "compile": dict(color="#1f77b4"), "liger": dict(color="#ff7f0e"),
         "native": dict(color="#2ca02c"), "eager": dict(color="#7f7f7f")}


def plot(result_path: Path, out: Path) -> Path:
    data = json.loads(result_path.read_text())
    copy = data["copy_gbps"]
    # op -> shape -> impl -> (MB, GB/s); bf16 size sweeps (decode calls are host-bound, in the tables)
    cases: dict[str, dict[str, dict[str, tuple[float, float]]]] = defaultdict(lambda: defaultdict(dict))
    for r in data["results"]:
        if r["bytes_moved"] >= 1 << 20 and r["dtype"] == "bfloat16" and not r.get("flops"):  # (TFLOP/s cases: tables)
            cases[r["op"]][r["shape"]][r["impl"]] = (r["bytes_moved"] / 1e6, r["gbps"])
    ops = sorted(cases)
    cols = 2
    rows = math.ceil(len(ops) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 3.4 * rows), squeeze=False)
    for ax, op in zip(axes.flat, ops):
        shapes = sorted(cases[op], key=lambda sh: next(iter(cases[op][sh].values()))[0])
        impls = sorted({i for sh in shapes for i in cases[op][sh]}, key=lambda i: (i != "ours", i))
        width = 0.8 / len(impls)
        for k, impl in enumerate(impls):
            xs = [j + (k - (len(impls) - 1) / 2) * width for j in range(len(shapes))]
            ys = [cases[op][sh].get(impl, (0, 0))[1] for sh in shapes]
            ax.bar(xs, ys, width, label=impl, color=STYLE.get(impl, {}).get("color"))
        ax.axhline(copy, color="black", linestyle="--", linewidth=1, label=f"copy {copy:.0f} GB/s")
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([f"{sh}\n{next(iter(cases[op][sh].values()))[0]:.0f} MB" for sh in shapes], fontsize=8)
        ax.set_ylim(0, copy * 1.12)
        ax.set_title(op, fontsize=10)
        ax.set_ylabel("GB/s")
        ax.legend(fontsize=7, ncol=len(impls) + 1, loc="upper left")
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    env = data["env"]
    fig.suptitle(f"{env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, {env['date'][:10]}: bf16, shapes "
                 "ordered by bytes moved", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("result", type=Path)
    p.add_argument("--out", type=Path, default=None, help="PNG path (default: next to the JSON)")
    args = p.parse_args()
    print(plot(args.result, args.out or args.result.with_suffix(".png")))


if __name__ == "__main__":
    main()
