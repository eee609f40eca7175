#!/usr/bin/env python3
"""Plots a training-step result (JSON from bench_train.py): tokens/s and peak memory per variant.

    python benchmarks/plot_train.py benchmarks/results/train-llama1b-nvidia-h200-2026-12-02.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from plot_micro import STYLE  # noqa: E402


def plot(result_path: Path, out: Path) -> Path:
    data = json.loads(result_path.read_text())
    rows = [r for r in data["results"] if r.get("tokens_per_s")]
    names = [r["variant"] for r in rows]
    colors = [STYLE.get(n.split("+")[0], {}).get("color") for n in names]
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(10, 3.6))
    speed.bar(names, [r["tokens_per_s"] for r in rows], color=colors)
    speed.set_ylabel("tokens/s")
    memory.bar(names, [r["peak_memory_gb"] for r in rows], color=colors)
    memory.set_ylabel("peak memory allocated, GB")
    env, args = data["env"], data["args"]
    fig.suptitle(f"Training step, batch {args['batch']} x {args['seq']}: {env['gpu']}, torch {env['torch']}, "
                 f"CUDA {env['cuda']}, {env['date'][:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", type=Path)
    parser.add_argument("--out", type=Path, help="the PNG (default: next to the JSON)")
    args = parser.parse_args()
    print(plot(args.result, args.out or args.result.with_suffix(".png")))


if __name__ == "__main__":
    main()
