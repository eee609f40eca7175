#!/usr/bin/env python3
"""LTX-Video end to end: the transformer's denoising loop, eager or with our kernels, with or
without torch.compile (the seed's flags). Weights cannot be downloaded here, so the transformer is
built from its real config (diffusers' LTXVideoTransformer3DModel defaults = LTX-Video 2B) with
random weights: speed does not depend on their values.

    python benchmarks/bench_ltx.py --use-optimized-kernels --compile --num-frames 49 --height 512 --width 768
    python benchmarks/bench_ltx.py --matrix      # every mode below in one run
    python benchmarks/bench_ltx.py --modes compile-ro,ours+compile-ro --num-frames 49 --quick --profile

Modes: eager, ours (our kernels injected), compile (torch.compile of the repeated blocks, default
mode), compile-ro (the whole transformer under mode="reduce-overhead": CUDA graphs), and
ours+compile, ours+compile-ro. --profile adds kernels per step and the GPU's idle time per step
from one profiled step. A mode that fails is reported with its error; the others still run.

Writes ltx-<gpu>-<date>.json and .md into --out.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from benchmarks.harness import (  # noqa: E402
    args_record, build_line, environment, result_stem, step_profile, write_result)
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


# mode -> (our kernels injected, torch.compile mode or None)
MODES = {"eager": (False, None), "ours": (True, None), "compile": (False, "default"),
         "compile-ro": (False, "reduce-overhead"), "ours+compile": (True, "default"),
         "ours+compile-ro": (True, "reduce-overhead")}
MATRIX = list(MODES)


def run_config(args, optimized: bool, compile_: str | None) -> dict:
    model = build_transformer(args.model_size)
    report = None
    if optimized:
        from transformer_kernels_integrations.diffusers_models import inject

        report = str(inject(model, load_kernel(), merge_projections=args.merge_projections,
                            linear_gelu=args.linear_gelu))
    if compile_ == "default":
        if hasattr(model, "compile_repeated_blocks"):
            model.compile_repeated_blocks(fullgraph=True)
        else:
            model = torch.compile(model, fullgraph=True)
    elif compile_ == "reduce-overhead":  # one CUDA graph per step: the whole transformer
        model = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    x = inputs(args)
    latents = x.pop("hidden_states")
    timesteps = torch.linspace(1000, 1, args.steps, device="cuda")

    def call(t):
        if compile_ == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are consumed
        return model(hidden_states=latents, timestep=t.expand(latents.shape[0]), **x)[0]

    def denoise(steps: int) -> list[float]:
        nonlocal latents
        times = []
        for t in tqdm(timesteps[:steps], desc="steps", leave=False):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                noise = call(t)
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
    if args.profile:
        with torch.no_grad():
            result["profile"] = step_profile(lambda: call(timesteps[0]))
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
    p.add_argument("--matrix", action="store_true", help=f"run every mode: {', '.join(MATRIX)}")
    p.add_argument("--modes", type=lambda v: v.split(","), default=None,
                   help=f"comma list of modes to run, of {', '.join(MODES)} (overrides --matrix/--compile)")
    p.add_argument("--quick", action="store_true", help="8 steps, one warm-up: for short device sessions")
    p.add_argument("--profile", action="store_true", help="kernels and GPU idle time per step from a profile")
    p.add_argument("--no-merge-projections", dest="merge_projections", action="store_false",
                   help="inject without merged q/k/v projections")
    p.add_argument("--no-linear-gelu", dest="linear_gelu", action="store_false",
                   help="inject without the GEMM + GELU epilogue in the FFNs")
    p.add_argument("--pipeline", action="store_true",
                   help="time whole generations (all steps + VAE decode) through LTXPipeline, eager and ours")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the LTX-Video benchmark needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    use_local_build()
    if args.quick:
        args.steps, args.warmup_iterations = 8, 1
    if args.modes:
        unknown = [m for m in args.modes if m not in MODES]
        if unknown:
            raise SystemExit(f"unknown modes {unknown}; choose from {list(MODES)}")
        configs = [MODES[m] for m in args.modes]
    elif args.matrix:
        configs = [MODES[m] for m in MATRIX]
    else:
        configs = [(args.optimized, "default" if args.compile else None)]
    if args.pipeline:
        configs = [(False, None), (True, None)]
    results = []
    for opt, comp in configs:
        try:
            results.append(run_pipeline(args, opt) if args.pipeline else run_config(args, opt, comp))
        except Exception as e:  # reported; the other modes still run
            results.append({"optimized_kernels": opt, "compile": comp, "error": f"{type(e).__name__}: {e}"[:500]})
        torch._dynamo.reset()
        torch.cuda.empty_cache()  # the model of that configuration is gone with its frame
    env = environment()
    base = next((r["step_ms_mean"] for r in results if not r["optimized_kernels"] and not r["compile"]
                 and "error" not in r), None)
    # each compile mode against the same mode without our kernels
    alone = {r["compile"]: r["step_ms_mean"] for r in results if not r["optimized_kernels"] and "error" not in r}
    shape = f"{args.model_size}, {args.num_frames} frames {args.height}x{args.width}, batch {2 * args.batch_size}"
    lines = [f"# LTX-Video transformer denoising: {env['gpu']}", "",
             f"torch {env['torch']}, CUDA {env['cuda']}, {env['date']}. {shape}, {args.steps} steps, random "
             "weights. " + ("Whole generations through LTXPipeline (all steps with CFG, then the VAE decode; "
                            "prompt embeddings given), total time divided by the steps." if args.pipeline else
                            "Wall time per step (synchronized), after warm-up."), "", build_line(env), "",
             "| kernels | compile | ms / step | vs eager | vs same compile mode without ours | peak GB "
             "| kernels / step | GPU idle ms / step |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        who, mode = "ours" if r["optimized_kernels"] else "eager", r["compile"] or "no"
        if "error" in r:
            lines.append(f"| {who} | {mode} | failed: {r['error'][:200]} | | | | | |")
            continue
        speed = f"{base / r['step_ms_mean']:.2f}×" if base else "—"
        same = alone.get(r["compile"]) if r["optimized_kernels"] else None
        vs_same = f"{same / r['step_ms_mean']:.2f}×" if same else "—"
        prof = r.get("profile")
        kernels = f"{prof['kernels']:.0f}" if prof else "—"
        idle = f"{prof['gpu_idle_ms']:.2f}" if prof else "—"
        lines.append(f"| {who} | {mode} | {r['step_ms_mean']:.1f} | {speed} | {vs_same} | {r['peak_memory_gb']:.1f} "
                     f"| {kernels} | {idle} |")
    md = "\n".join(lines) + "\n"
    kind = "ltx-pipeline" if args.pipeline else "ltx"
    stem = result_stem(f"{kind}-{args.model_size}-{args.num_frames}f", env)
    write_result(args.out, stem, {"env": env, "args": args_record(args), "results": results}, md)


if __name__ == "__main__":
    main()
