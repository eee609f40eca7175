#!/usr/bin/env python3
"""Where the time of an end-to-end step goes: a torch.profiler trace of Llama decode (eager and with
our kernels) and of one LTX-Video denoising step (compile alone and ours + compile), summarised as
wall time, GPU-busy time, kernel launches, and GPU time by kernel class (GEMM, attention, ours,
Triton, other). The closing notes of the end-to-end issue cite it where a target is missed.

    python benchmarks/profile_e2e.py --out DIR [--llm-layers 32] [--skip-ltx]

Writes profile-<gpu>-<date>.md into --out.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from benchmarks import bench_llm, bench_ltx  # noqa: E402
from benchmarks.harness import build_line, environment, kernel_time_us, profile_step, result_stem  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402

# Kernel name -> class; first match wins.
CLASSES = (
    ("ours", re.compile(r"transformer_kernels::")),
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|wgmma|sm90_", re.I)),
    ("triton", re.compile(r"^triton_")),
)


def kernel_class(name: str) -> str:
    return next((cls for cls, pattern in CLASSES if pattern.search(name)), "other")


def summarise(title: str, step, per: int, unit: str) -> list[str]:
    """Profiles step() once (after the caller's warm-up) and returns markdown lines; times per `unit`
    (`per` of them in one step)."""
    wall_ms, kernels, prof = profile_step(step)
    by_class, by_name, count = defaultdict(float), defaultdict(float), defaultdict(int)
    for e in kernels:
        us = kernel_time_us(e)
        by_class[kernel_class(e.name)] += us
        by_name[e.name] += us
        count[e.name] += 1
    busy_ms = sum(by_class.values()) / 1e3
    lines = [f"### {title}", "",
             f"wall {wall_ms / per:.2f} ms / {unit}; GPU busy {busy_ms / per:.2f} ms / {unit} "
             f"({100 * busy_ms / wall_ms:.0f} % of wall); {len(kernels) / per:.0f} kernels / {unit}", "",
             "| kernel class | ms / " + unit + " | share of GPU time |", "|---|---|---|"]
    for cls, us in sorted(by_class.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {cls} | {us / 1e3 / per:.3f} | {100 * us / 1e3 / max(busy_ms, 1e-9):.1f} % |")
    lines += ["", "| top kernels | calls / " + unit + " | ms / " + unit + " |", "|---|---|---|"]
    for name, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:12]:
        lines.append(f"| `{name[:90]}` | {count[name] / per:.0f} | {us / 1e3 / per:.3f} |")
    cpu = prof.key_averages()
    lines += ["", "| top host ops (self CPU) | calls / " + unit + " | µs / " + unit + " |", "|---|---|---|"]
    for e in sorted(cpu, key=lambda e: -e.self_cpu_time_total)[:12]:
        lines.append(f"| `{e.key[:80]}` | {e.count / per:.0f} | {e.self_cpu_time_total / per:.0f} |")
    return lines + [""]


def profile_llm(args) -> list[str]:
    out = ["## Llama-3.1-8B shape: greedy decode with a static cache", ""]
    tokens = 16
    for optimized in (False, True):
        model = bench_llm.build(args.llm_layers)
        if optimized:
            from transformer_kernels_integrations.transformers_models import inject

            inject(model, load_kernel())
        prompt = torch.randint(0, bench_llm.LLAMA_31_8B["vocab_size"], (1, 32), device="cuda")
        gen = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, cache_implementation="static",
                   disable_compile=True)
        with torch.no_grad():
            model.generate(prompt, **gen)  # warm-up
            out += summarise(f"{'ours' if optimized else 'HF eager'} ({args.llm_layers} layers, {tokens} tokens "
                             "incl. the prompt's prefill)", lambda: model.generate(prompt, **gen), tokens, "token")
        del model
        torch.cuda.empty_cache()
    return out


def profile_ltx(args) -> list[str]:
    out = ["## LTX-Video 2B: one denoising step, 49 frames 512x768, batch 2", ""]
    shape = argparse.Namespace(num_frames=49, height=512, width=768, batch_size=1)
    for optimized, compiled in ((False, True), (True, True), (True, False)):
        model = bench_ltx.build_transformer("2b")
        if optimized:
            from transformer_kernels_integrations.diffusers_models import inject

            inject(model, load_kernel())
        if compiled:
            model.compile_repeated_blocks(fullgraph=True)
        x = bench_ltx.inputs(shape)
        t = torch.full((x["hidden_states"].shape[0],), 500.0, device="cuda")
        with torch.no_grad():
            step = lambda: model(timestep=t, **x)  # noqa: E731
            for _ in range(3):
                step()
            name = f"{'ours' if optimized else 'eager'}{' + compile' if compiled else ''}"
            out += summarise(name, step, 1, "step")
        del model
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--llm-layers", type=int, default=bench_llm.LLAMA_31_8B["num_hidden_layers"])
    p.add_argument("--skip-ltx", action="store_true")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profiling needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    use_local_build()
    env = environment()
    lines = [f"# End-to-end profiles: {env['gpu']}", "", f"torch {env['torch']}, CUDA {env['cuda']}, {env['date']}. "
             "torch.profiler, one profiled run after warm-up; random weights.", "", build_line(env), ""]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{result_stem('profile', env)}.md"
    for section in (profile_llm, None if args.skip_ltx else profile_ltx):
        if section is not None:
            lines += section(args)
            path.write_text("\n".join(lines) + "\n")  # after each section: a run cut short keeps the first
    print("\n".join(lines))


if __name__ == "__main__":
    main()
