#!/usr/bin/env python3
"""LLM end to end: prefill and greedy decode of a Llama-3.1-8B-shaped model (random weights, real
config), eager transformers against the same model with our kernels injected.

    python benchmarks/bench_llm.py [--prefill-tokens 2048] [--decode-tokens 64] [--out DIR]

Decode uses transformers' static cache, as fast eager decoding does. Writes llm-<gpu>-<date>.json/.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from benchmarks.harness import build_line, environment, wall_time_s  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402

LLAMA_31_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, rms_norm_eps=1e-5, vocab_size=128256, max_position_embeddings=8192)


def build(layers: int):
    import transformers

    config = transformers.LlamaConfig(**{**LLAMA_31_8B, "num_hidden_layers": layers})
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = transformers.LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(torch.float32)
    return model.eval()


def run(args, optimized: bool) -> dict:
    model = build(args.layers)
    report = None
    if optimized:
        from transformer_kernels_integrations.transformers_models import inject

        report = str(inject(model, load_kernel()))
    ids = torch.randint(0, LLAMA_31_8B["vocab_size"], (1, args.prefill_tokens), device="cuda")
    with torch.no_grad():
        model(ids)  # warm-up
        prefill = wall_time_s(lambda: model(ids), args.repeats)
        prompt = ids[:, :32]
        gen = dict(max_new_tokens=args.decode_tokens, min_new_tokens=args.decode_tokens, do_sample=False,
                   cache_implementation="static",
                   disable_compile=True)  # HF eager: generate() would otherwise compile a static-cache model
        model.generate(prompt, **gen)  # warm-up
        short = wall_time_s(lambda: model.generate(prompt, **{**gen, "max_new_tokens": 1, "min_new_tokens": 1}), 3)
        full = wall_time_s(lambda: model.generate(prompt, **gen), 3)
    result = {"optimized_kernels": optimized, "prefill_ms": 1e3 * prefill,
              "decode_ms_per_token": 1e3 * (full - short) / (args.decode_tokens - 1),
              "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9, "injection": report}
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefill-tokens", type=int, default=2048)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--layers", type=int, default=LLAMA_31_8B["num_hidden_layers"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the LLM benchmark needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    use_local_build()
    results = []
    for optimized in (False, True):
        results.append(run(args, optimized))
        torch.cuda.empty_cache()  # the model of that run is gone with its frame
    env = environment()
    eager = results[0]
    lines = [f"# Llama-3.1-8B shape ({args.layers} layers), random weights: {env['gpu']}", "",
             f"torch {env['torch']}, CUDA {env['cuda']}, {env['date']}. Prefill {args.prefill_tokens} tokens "
             f"(median of {args.repeats}); greedy decode with a static cache, ms per token.", "", build_line(env), "",
             "| kernels | prefill ms | vs eager | decode ms/token | vs eager |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {'ours' if r['optimized_kernels'] else 'eager'} | {r['prefill_ms']:.1f} | "
                     f"{eager['prefill_ms'] / r['prefill_ms']:.2f}× | {r['decode_ms_per_token']:.2f} | "
                     f"{eager['decode_ms_per_token'] / r['decode_ms_per_token']:.2f}× |")
    md = "\n".join(lines) + "\n"
    gpu = re.sub(r"[^a-z0-9]+", "-", env["gpu"].lower()).strip("-")
    stem = f"llm-llama8b-{gpu}-{_dt.date.today().isoformat()}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps({"env": env, "args": vars(args) | {"out": str(args.out)},
                                                       "results": results}, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
