#!/usr/bin/env python3
"""Stable Diffusion end to end: one UNet denoising step (SDXL at 1024x1024: 128x128 latents, batch 2
for classifier-free guidance) and the VAE decode of one 1024x1024 image, eager, with our kernels
injected, under torch.compile, and both. Weights cannot be downloaded here, so the models are built
from their real configs (written below) with random weights: speed does not depend on their values.

    python benchmarks/bench_sd.py --out benchmarks/results                 # everything (~7 min on an H200)
    python benchmarks/bench_sd.py --parts unet --modes eager ours          # a subset
    python benchmarks/bench_sd.py --model sd15 --channels-last

Writes sd-<model>-<gpu>-<date>.json and .md into --out (one table per part; ours vs eager and
ours + compile vs compile). Each part's modes run in the order eager, compile, ours, ours + compile
on one model (inject patches it in place; dynamo is reset between the compiled modes).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from benchmarks.harness import args_record, environment, result_stem, wall_time_s, write_result  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402

# stabilityai/stable-diffusion-xl-base-1.0, unet/config.json
SDXL_UNET = dict(
    act_fn="silu", addition_embed_type="text_time", addition_embed_type_num_heads=64, addition_time_embed_dim=256,
    attention_head_dim=[5, 10, 20], block_out_channels=[320, 640, 1280], center_input_sample=False,
    cross_attention_dim=2048, down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    downsample_padding=1, flip_sin_to_cos=True, freq_shift=0, in_channels=4, layers_per_block=2,
    mid_block_scale_factor=1, mid_block_type="UNetMidBlock2DCrossAttn", norm_eps=1e-05, norm_num_groups=32,
    out_channels=4, projection_class_embeddings_input_dim=2816, resnet_out_scale_factor=1.0,
    resnet_skip_time_act=False, resnet_time_scale_shift="default", sample_size=128, time_embedding_type="positional",
    transformer_layers_per_block=[1, 2, 10], up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    use_linear_projection=True)
# stable-diffusion-v1-5, unet/config.json
SD15_UNET = dict(
    act_fn="silu", attention_head_dim=8, block_out_channels=[320, 640, 1280, 1280], center_input_sample=False,
    cross_attention_dim=768, down_block_types=["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                               "DownBlock2D"],
    downsample_padding=1, flip_sin_to_cos=True, freq_shift=0, in_channels=4, layers_per_block=2,
    mid_block_scale_factor=1, norm_eps=1e-05, norm_num_groups=32, out_channels=4, sample_size=64,
    up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"])
# madebyollin/sdxl-vae-fp16-fix and SDXL's vae/config.json (SD 1.5's VAE has the same blocks)
SD_VAE = dict(
    act_fn="silu", block_out_channels=[128, 256, 512, 512], down_block_types=["DownEncoderBlock2D"] * 4,
    in_channels=3, latent_channels=4, layers_per_block=2, norm_num_groups=32, out_channels=3, sample_size=1024,
    scaling_factor=0.13025, up_block_types=["UpDecoderBlock2D"] * 4, force_upcast=True)
# (unet config, image size, text tokens x channels, pooled text channels or None)
MODELS = {"sdxl": (SDXL_UNET, 1024, (77, 2048), 1280), "sd15": (SD15_UNET, 512, (77, 768), None)}
MODES = ("eager", "compile", "ours", "ours+compile")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
VAE_FACTOR = 8


def build_unet(config: dict, dtype: torch.dtype, channels_last: bool):
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    with torch.device("cuda"):  # initialising 2.6 B parameters on the CPU takes longer than the benchmark
        unet = UNet2DConditionModel.from_config(config)
    unet = unet.to(dtype).eval()
    return unet.to(memory_format=torch.channels_last) if channels_last else unet


def build_vae(dtype: torch.dtype, channels_last: bool):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    with torch.device("cuda"):
        vae = AutoencoderKL.from_config(SD_VAE)
    vae = vae.to(dtype).eval()
    return vae.to(memory_format=torch.channels_last) if channels_last else vae


def unet_step(unet, args) -> Callable[[bool], Callable[[], object]]:
    """One guided denoising step's UNet call (batch 2 x batch-size) from random inputs; the callable
    builds it eager or compiled."""
    _, size, (tokens, channels), pooled = MODELS[args.model]
    batch, latent = 2 * args.batch_size, size // VAE_FACTOR
    g = torch.Generator(device="cuda").manual_seed(0)
    opts = dict(device="cuda", dtype=unet.dtype)
    sample = torch.randn(batch, 4, latent, latent, generator=g, **opts)
    if args.channels_last:
        sample = sample.contiguous(memory_format=torch.channels_last)
    kwargs = dict(timestep=torch.full((batch,), 500, device="cuda"),
                  encoder_hidden_states=torch.randn(batch, tokens, channels, generator=g, **opts), return_dict=False)
    if pooled is not None:
        kwargs["added_cond_kwargs"] = {"text_embeds": torch.randn(batch, pooled, generator=g, **opts),
                                       "time_ids": torch.tensor([[size, size, 0, 0, size, size]] * batch, **opts)}

    def make(compiled: bool) -> Callable[[], object]:
        model = torch.compile(unet, fullgraph=True) if compiled else unet
        return lambda: model(sample, **kwargs)[0]

    return make


def vae_decode(vae, args) -> Callable[[bool], Callable[[], object]]:
    """The VAE decode of batch-size images from random latents (compiled: the whole decode call)."""
    _, size, _, _ = MODELS[args.model]
    g = torch.Generator(device="cuda").manual_seed(1)
    latents = torch.randn(args.batch_size, 4, size // VAE_FACTOR, size // VAE_FACTOR, generator=g, device="cuda",
                          dtype=vae.dtype)
    if args.channels_last:
        latents = latents.contiguous(memory_format=torch.channels_last)

    def make(compiled: bool) -> Callable[[], object]:
        decode = lambda: vae.decode(latents, return_dict=False)[0]  # noqa: E731
        return torch.compile(decode, fullgraph=True) if compiled else decode

    return make


def time_modes(name: str, model: torch.nn.Module, make: Callable[[bool], Callable[[], object]], modes: list[str],
               args) -> list[dict]:
    """Each mode's median time of one call (synchronized wall time after warm-up)."""
    from transformer_kernels_integrations.diffusers_models import inject

    results, report = [], None
    for mode in (m for m in MODES if m in modes):
        if mode.startswith("ours") and report is None:
            report = str(inject(model, load_kernel()))
        torch._dynamo.reset()
        call = make(mode.endswith("compile"))
        with torch.no_grad():
            t0 = time.perf_counter()
            call()  # compiles, for the compiled modes
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            for _ in range(args.warmup):
                call()
            torch.cuda.reset_peak_memory_stats()
            seconds = wall_time_s(call, args.repeats)
        results.append({"part": name, "mode": mode, "ms": 1e3 * seconds, "first_call_s": first_s,
                        "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9,
                        "injection": report if mode.startswith("ours") else None})
        print(f"{name} {mode}: {1e3 * seconds:.2f} ms (first call {first_s:.1f} s)", flush=True)
    return results


def markdown(env: dict, args, results: list[dict]) -> str:
    _, size, _, _ = MODELS[args.model]
    lines = [f"# Stable Diffusion ({args.model}) end to end: {env['gpu']}", "",
             f"torch {env['torch']}, CUDA {env['cuda']}, {env['date']}. Random weights from the real configs; "
             f"{size}x{size} images, batch {args.batch_size} (the UNet step runs 2x that for guidance); UNet "
             f"{args.dtype}, VAE {args.vae_dtype}; {'channels-last' if args.channels_last else 'contiguous'} "
             f"activations. Median of {args.repeats} synchronized calls after {args.warmup} warm-up calls; "
             "compile = torch.compile(fullgraph=True) of the model (of the injected one for ours + compile).", ""]
    for part in dict.fromkeys(r["part"] for r in results):
        rows = {r["mode"]: r for r in results if r["part"] == part}
        lines += [f"## {part}", "", "| mode | ms | vs eager | vs compile | peak GB |", "|---|---|---|---|---|"]
        for mode, r in rows.items():
            eager = f"{rows['eager']['ms'] / r['ms']:.2f}×" if "eager" in rows else "—"
            comp = f"{rows['compile']['ms'] / r['ms']:.2f}×" if "compile" in rows else "—"
            lines.append(f"| {mode} | {r['ms']:.2f} | {eager} | {comp} | {r['peak_memory_gb']:.1f} |")
        report = next((r["injection"] for r in rows.values() if r["injection"]), None)
        if report:
            lines += ["", "Injected: " + report.splitlines()[0].removeprefix("replaced: ")]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="sdxl")
    p.add_argument("--parts", nargs="*", choices=["unet", "vae"], default=["unet", "vae"])
    p.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES))
    p.add_argument("--batch-size", type=int, default=1, help="images per prompt (the UNet runs 2x for guidance)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float16", help="the UNet's dtype")
    p.add_argument("--vae-dtype", choices=sorted(DTYPES), default="float32",
                   help="the VAE's dtype (SDXL's VAE decodes upcast to float32: force_upcast)")
    p.add_argument("--channels-last", action="store_true", help="models and inputs in channels-last")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the Stable Diffusion benchmark needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    use_local_build()
    results = []
    if "unet" in args.parts:
        unet = build_unet(MODELS[args.model][0], DTYPES[args.dtype], args.channels_last)
        results += time_modes("UNet step", unet, unet_step(unet, args), args.modes, args)
        del unet
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    if "vae" in args.parts:
        vae = build_vae(DTYPES[args.vae_dtype], args.channels_last)
        results += time_modes("VAE decode", vae, vae_decode(vae, args), args.modes, args)
    env = environment()
    md = markdown(env, args, results)
    stem = result_stem(f"sd-{args.model}{'-cl' if args.channels_last else ''}", env)
    write_result(args.out, stem, {"env": env, "args": args_record(args), "results": results}, md)


if __name__ == "__main__":
    main()
