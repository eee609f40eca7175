#!/usr/bin/env python3
"""LTX-Video end to end: the transformer's denoising loop, eager or with our kernels, with or
without torch.compile (the seed's flags). Weights cannot be downloaded here, so the transformer is
built from its real config (diffusers' LTXVideoTransformer3DModel defaults = LTX-Video 2B) with
random weights: speed does not depend on their values.

    python benchmarks/bench_ltx.py --use-optimized-kernels --compile --num-frames 49 --height 512 --width 768
    python benchmarks/bench_ltx.py --matrix      # eager, ours, compile, ours + compile in one run

Writes ltx-<gpu>-<date>.json and .md into --out.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from benchmarks.harness import build_line, environment  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402

VAE_SPATIAL, VAE_TEMPORAL, LATENT_CHANNELS = 32, 8, 128  # LTX-Video's VAE compression
TEXT_TOKENS, TEXT_CHANNELS = 128, 4096  # T5-XXL prompt embedding
CONFIGS = {"13b": dict(num_attention_heads=32, attention_head_dim=128, cross_attention_dim=4096, num_layers=48)}


def build_transformer(size: str):
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(0)
    with torch.device("cuda"):  # initialising 2B parameters on the CPU takes longer than the benchmark
        model = LTXVideoTransformer3DModel(**CONFIGS.get(size, {}))
    return model.to(torch.bfloat16).eval()


def build_pipeline(transformer, device="cuda", dtype=torch.bfloat16, vae_config: dict | None = None):
    """LTXPipeline around `transformer` with LTX-Video's VAE built from its config (random weights).
    The T5 text encoder is left out: nothing can be downloaded (its tokenizer needs a vocabulary) and
    prompt embeddings are passed directly, so the timing covers denoising and the VAE decode."""
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXPipeline

    torch.manual_seed(0)
    with torch.device(device):
        vae = AutoencoderKLLTXVideo(**(vae_config or {}))
    return LTXPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae.to(dtype).eval(), text_encoder=None,
                       tokenizer=None, transformer=transformer)


def pipeline_call(pipe, args, text_tokens: int = TEXT_TOKENS, text_channels: int = TEXT_CHANNELS) -> Callable:
    """One full generation (CFG, all steps, VAE decode) from random prompt embeddings."""
    device, dtype = pipe.transformer.device, pipe.transformer.dtype
    g = torch.Generator(device=device).manual_seed(0)
    embeds = torch.randn(args.batch_size, text_tokens, text_channels, generator=g, device=device, dtype=dtype)
    mask = torch.ones(args.batch_size, text_tokens, device=device, dtype=dtype)
    return lambda: pipe(prompt_embeds=embeds, prompt_attention_mask=mask, negative_prompt_embeds=torch.zeros_like(embeds),
                        negative_prompt_attention_mask=mask, num_frames=args.num_frames, height=args.height,
                        width=args.width, num_inference_steps=args.steps, output_type="pt").frames


def run_pipeline(args, optimized: bool) -> dict:
    pipe = build_pipeline(build_transformer(args.model_size))
    report = None
    if optimized:
        from transformer_kernels_integrations.diffusers_models import inject

        report = str(inject(pipe, load_kernel()))
    generate = pipeline_call(pipe, args)
    with torch.no_grad():
        for _ in range(args.warmup_iterations):
            generate()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        generate()
        torch.cuda.synchronize()
    total = time.perf_counter() - t0
    # One generation is timed whole: step_ms_mean is its time per step, VAE decode included.
    return {"optimized_kernels": optimized, "compile": False, "steps": args.steps, "total_s": total,
            "step_ms_mean": 1e3 * total / args.steps, "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9,
            "injection": report, "pipeline": True}


def inputs(args) -> dict:
    frames = (args.num_frames - 1) // VAE_TEMPORAL + 1
    h, w = args.height // VAE_SPATIAL, args.width // VAE_SPATIAL
    batch = 2 * args.batch_size  # classifier-free guidance: conditional and unconditional
    g = torch.Generator(device="cuda").manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    return dict(
        hidden_states=torch.randn(batch, frames * h * w, LATENT_CHANNELS, generator=g, **bf16),
        encoder_hidden_states=torch.randn(batch, TEXT_TOKENS, TEXT_CHANNELS, generator=g, **bf16),
        encoder_attention_mask=torch.ones(batch, TEXT_TOKENS, **bf16),
        num_frames=frames, height=h, width=w,
        rope_interpolation_scale=(VAE_TEMPORAL / 25, VAE_SPATIAL, VAE_SPATIAL), return_dict=False,
    )


def run_config(args, optimized: bool, compile_: bool) -> dict:
    model = build_transformer(args.model_size)
    report = None
    if optimized:
        from transformer_kernels_integrations.diffusers_models import inject

        report = str(inject(model, load_kernel()))
    if compile_:
        if hasattr(model, "compile_repeated_blocks"):
            model.compile_repeated_blocks(fullgraph=True)
        else:
            model = torch.compile(model, fullgraph=True)
    x = inputs(args)
    latents = x.pop("hidden_states")
    timesteps = torch.linspace(1000, 1, args.steps, device="cuda")

    def denoise(steps: int) -> list[float]:
        nonlocal latents
        times = []
        for t in tqdm(timesteps[:steps], desc="steps", leave=False):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                noise = model(hidden_states=latents, timestep=t.expand(latents.shape[0]), **x)[0]
            latents = latents - noise / args.steps  # an Euler step; the values do not matter
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return times

    for _ in range(args.warmup_iterations):
        denoise(min(args.steps, 3))
    torch.cuda.reset_peak_memory_stats()
    times = denoise(args.steps)
    result = {
        "optimized_kernels": optimized, "compile": compile_, "steps": args.steps,
        "total_s": sum(times), "step_ms_mean": 1e3 * sum(times) / len(times),
        "step_ms_median": 1e3 * sorted(times)[len(times) // 2],
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9, "injection": report,
    }
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kernels = p.add_mutually_exclusive_group()
    kernels.add_argument("--use-optimized-kernels", dest="optimized", action="store_true", default=True)
    kernels.add_argument("--no-optimized-kernels", dest="optimized", action="store_false")
    p.add_argument("--compile", action="store_true", help="torch.compile the transformer's repeated blocks")
    p.add_argument("--batch-size", type=int, default=1, help="videos per prompt (x2 for guidance)")
    p.add_argument("--num-frames", type=int, default=161)
    p.add_argument("--height", type=int, default=512)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup-iterations", type=int, default=2)
    p.add_argument("--model-size", choices=["2b", "13b"], default="2b")
    p.add_argument("--matrix", action="store_true", help="run eager, ours, compile and ours + compile")
    p.add_argument("--pipeline", action="store_true",
                   help="time whole generations (all steps + VAE decode) through LTXPipeline, eager and ours")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the LTX-Video benchmark needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    use_local_build()

    configs = [(False, False), (True, False), (False, True), (True, True)] if args.matrix else [
        (args.optimized, args.compile)]
    if args.pipeline:
        configs = [(False, False), (True, False)]
    results = []
    for opt, comp in configs:
        results.append(run_pipeline(args, opt) if args.pipeline else run_config(args, opt, comp))
        torch._dynamo.reset()
        torch.cuda.empty_cache()  # the model of that configuration is gone with its frame
    env = environment()
    base = next((r["step_ms_mean"] for r in results if not r["optimized_kernels"] and not r["compile"]), None)
    shape = f"{args.model_size}, {args.num_frames} frames {args.height}x{args.width}, batch {2 * args.batch_size}"
    lines = [f"# LTX-Video transformer denoising: {env['gpu']}", "",
             f"torch {env['torch']}, CUDA {env['cuda']}, {env['date']}. {shape}, {args.steps} steps, random "
             "weights. " + ("Whole generations through LTXPipeline (all steps with CFG, then the VAE decode; "
                            "prompt embeddings given), total time divided by the steps." if args.pipeline else
                            "Wall time per step (synchronized), after warm-up."), "", build_line(env), "",
             "| kernels | compile | ms / step | vs eager | peak GB |", "|---|---|---|---|---|"]
    for r in results:
        speed = f"{base / r['step_ms_mean']:.2f}×" if base else "—"
        lines.append(f"| {'ours' if r['optimized_kernels'] else 'eager'} | {'yes' if r['compile'] else 'no'} | "
                     f"{r['step_ms_mean']:.1f} | {speed} | {r['peak_memory_gb']:.1f} |")
    md = "\n".join(lines) + "\n"
    gpu = re.sub(r"[^a-z0-9]+", "-", env["gpu"].lower()).strip("-")
    kind = "ltx-pipeline" if args.pipeline else "ltx"
    stem = f"{kind}-{args.model_size}-{args.num_frames}f-{gpu}-{_dt.date.today().isoformat()}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps({"env": env, "args": {k: str(v) for k, v in vars(args).items()},
                                                       "results": results}, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
