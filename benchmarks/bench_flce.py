#!/usr/bin/env python3
"""Fused linear cross-entropy: a causal LM's lm_head + loss, forward and backward, against
transformers' eager path (bf16 lm_head, fp32 logits, F.cross_entropy), its torch.compile and
Liger-Kernel's LigerFusedLinearCrossEntropyLoss: time (median, CUDA events, L2 flushed) and the
peak memory the step adds over its inputs.

    python benchmarks/bench_flce.py [--out DIR] [--quick]

Shapes: vocabulary 128256 (Llama 3), hidden 2048 (Llama-3.2-1B) and 4096 (Llama-3.1-8B), 8192 and
16384 tokens, bf16. Writes flce-<gpu>-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from benchmarks.harness import environment, result_stem, time_ms, write_result  # noqa: E402
from reference.loss import eager_causal_lm_loss  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402

VOCAB = 128256
SHAPES = [(8192, 2048), (16384, 2048), (8192, 4096), (16384, 4096)]  # (tokens, hidden)


def step(loss_fn: Callable, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> Callable:
    """Forward and backward of the loss, the gradients of hidden and weight (as training needs)."""
    def run():
        loss = loss_fn(hidden, weight, target)
        return torch.autograd.grad(loss, (hidden, weight))
    return run


def peak_extra_bytes(fn: Callable) -> int:
    """Memory the call allocates at its peak beyond what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    del result
    return torch.cuda.max_memory_allocated() - base


def implementations(tk) -> dict[str, Callable]:
    impls = {
        "ours": lambda h, w, t: tk.fused_linear_cross_entropy(h, w, t),
        "eager": eager_causal_lm_loss,
        "compile": torch.compile(eager_causal_lm_loss, dynamic=False),
    }
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss()
        impls["liger"] = lambda h, w, t: liger(w, h, t)  # Liger takes (lin_weight, _input, target)
    except ImportError:
        pass
    return impls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--quick", action="store_true", help="the first shape only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the FLCE benchmark needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    use_local_build()
    tk = load_kernel()
    torch._dynamo.config.recompile_limit = 64
    env = environment()
    rows, skipped = [], []
    for tokens, hidden_size in SHAPES[:1] if args.quick else SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        hidden = torch.randn(tokens, hidden_size, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
        weight = (torch.randn(VOCAB, hidden_size, device="cuda", generator=g) / hidden_size ** 0.5).to(
            torch.bfloat16).requires_grad_()
        target = torch.randint(0, VOCAB, (tokens,), device="cuda", generator=g)
        target[::7] = -100  # some ignored positions (padding, prompts)
        flops = 3 * 2 * tokens * hidden_size * VOCAB  # logits, and the two gradient GEMMs
        for name, fn in implementations(tk).items():
            run = step(fn, hidden, weight, target)
            try:
                extra = peak_extra_bytes(run)
                ms = time_ms(run)
            except Exception as e:  # e.g. eager's fp32 logits not fitting: reported, not fatal
                skipped.append(f"{tokens}x{hidden_size} {name}: {type(e).__name__}: {e}"[:300])
                torch.cuda.empty_cache()
                continue
            rows.append(dict(tokens=tokens, hidden=hidden_size, vocab=VOCAB, impl=name, ms=ms,
                             tflops=flops / (ms * 1e-3) / 1e12, peak_extra_gb=extra / 1e9))
            torch.cuda.empty_cache()
    lines = [f"# Fused linear cross-entropy: {env['gpu']}", "",
             f"torch {env['torch']}, CUDA {env['cuda']}, {env['date']}. bf16 hidden [N, H] and lm_head [{VOCAB}, H]; "
             "forward + backward (gradients of hidden and weight); median of CUDA-event timings with L2 flushed. "
             "TFLOP/s counts the three GEMMs (6 N H V). Peak: memory allocated beyond the inputs.", "",
             "| tokens | hidden | impl | ms | TFLOP/s | peak extra GB | vs liger (time) | vs eager (time) |",
             "|---|---|---|---|---|---|---|---|"]
    by_shape: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by_shape.setdefault((r["tokens"], r["hidden"]), {})[r["impl"]] = r
    for (tokens, hidden_size), impls in by_shape.items():
        for name, r in impls.items():
            vs = [f"{impls[b]['ms'] / r['ms']:.2f}×" if b in impls else "—" for b in ("liger", "eager")]
            lines.append(f"| {tokens} | {hidden_size} | {name} | {r['ms']:.2f} | {r['tflops']:.0f} | "
                         f"{r['peak_extra_gb']:.2f} | {vs[0]} | {vs[1]} |")
    if skipped:
        lines += ["", "Not run:", ""] + [f"- {s}" for s in skipped]
    md = "\n".join(lines) + "\n"
    write_result(args.out, result_stem("flce", env), {"env": env, "results": rows, "skipped": skipped}, md)


if __name__ == "__main__":
    main()
