#!/usr/bin/env python3
"""Plots an end-to-end result: a training step (JSON from bench_train.py: tokens/s and peak memory per
variant) or LLM prefill and decode (JSON from bench_llm.py: prefill ms and decode ms/token per mode,
the decode's bandwidth floor drawn).

    python benchmarks/plot_e2e.py benchmarks/results/train-llama1b-nvidia-h200-2026-12-02.json
    python benchmarks/plot_e2e.py benchmarks/results/llm-llama8b-modes-nvidia-h200-2026-12-01.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from plot_micro import STYLE  # noqa: E402


def color(name: str) -> str:
    """Ours red, HF's own modes (eager, auto compile, graphs) the baselines' colours, grey otherwise."""
    key = "ours" if name.startswith("ours") else {"hf-auto": "compile", "graphs": "native"}.get(name, name)
    return STYLE.get(key.split("+")[0].split("-")[0], {}).get("color", "#7f7f7f")


def plot(result_path: Path, out: Path) -> Path:
    data = json.loads(result_path.read_text())
    env, args = data["env"], data["args"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    if "modes" in args:  # bench_llm
        rows = data["results"]
        names = [r["mode"] for r in rows]
        left.bar(names, [r.get("prefill_ms") or 0 for r in rows], color=[color(n) for n in names])
        left.set_ylabel(f"prefill ms ({args['prefill_tokens']} tokens)")
        right.bar(names, [r.get("decode_ms_per_token") or 0 for r in rows], color=[color(n) for n in names])
        floor = rows[0]["decode_weight_bytes"] / (data["copy_gbps"] * 1e9) * 1e3
        right.axhline(floor, color="black", linestyle="--", linewidth=1, label=f"weights at copy speed {floor:.2f} ms")
        right.set_ylabel("decode ms/token")
        right.legend(fontsize=8)
        title = f"Llama ({args['layers']} layers), random weights"
    else:  # bench_train
        rows = [r for r in data["results"] if r.get("tokens_per_s")]
        names = [r["variant"] for r in rows]
        left.bar(names, [r["tokens_per_s"] for r in rows], color=[color(n) for n in names])
        left.set_ylabel("tokens/s")
        right.bar(names, [r["peak_memory_gb"] for r in rows], color=[color(n) for n in names])
        right.set_ylabel("peak memory allocated, GB")
        title = f"Training step, batch {args['batch']} x {args['seq']}"
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"{title}: {env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, {env['date'][:10]}", fontsize=10)
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
