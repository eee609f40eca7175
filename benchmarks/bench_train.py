#!/usr/bin/env python3
"""Training steps end to end: a Llama-3.2-1B-shaped model (random weights from its config) trained
with AdamW in bf16, and a LoRA step of the LTX-Video 2B transformer.

    python benchmarks/bench_train.py [--batch 8] [--seq 2048] [--steps 10] [--out DIR]
    python benchmarks/bench_train.py --variants eager ours          # a subset
    python benchmarks/bench_train.py --ltx-lora [--frames 49 --height 512 --width 768]

Llama variants: HF eager, torch.compile of it, Liger (``apply_liger_kernel_to_llama``: RoPE,
RMSNorm, SwiGLU, fused linear cross-entropy), ours (``inject`` in training mode: our ops with a
backward and the fused linear cross-entropy), ours + torch.compile. Each variant runs in its own
process (Liger patches transformers' classes; compile caches stay apart). Reported: tokens/s over
the timed steps (after warm-up, which includes compilation) and the peak memory allocated.
LTX LoRA: eager against ours, rank-16 adapters on the attention projections (peft when installed,
else a minimal adapter module), seconds per step and peak memory. Writes train-<gpu>-<date>.json/.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "integration")]
from benchmarks.harness import args_record, environment, result_stem, write_result  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402

LLAMA_32_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5, vocab_size=128256,
                   max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True)
VARIANTS = ("eager", "compile", "liger", "ours", "ours+compile")


def build_llama(layers: int):
    import transformers

    config = transformers.LlamaConfig(**{**LLAMA_32_1B, "num_hidden_layers": layers})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = transformers.LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(torch.float32)
    return model.train()


def timed_steps(step, warmup: int, steps: int) -> tuple[float, float]:
    """(seconds per step, peak GB) over `steps` after `warmup` untimed ones."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps, torch.cuda.max_memory_allocated() / 1e9


def run_llama(variant: str, args) -> dict:
    report = None
    if variant == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=True)
    model = build_llama(args.layers)
    if variant.startswith("ours"):
        from transformer_kernels_integrations.transformers_models import inject

        report = str(inject(model, load_kernel()))
    forward = torch.compile(model) if variant.endswith("compile") else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, LLAMA_32_1B["vocab_size"], (args.batch, args.seq), device="cuda", generator=g)

    def step():
        loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    seconds, peak = timed_steps(step, args.warmup, args.steps)
    return {"variant": variant, "tokens_per_s": args.batch * args.seq / seconds, "ms_per_step": 1e3 * seconds,
            "peak_memory_gb": peak, "injection": report}


class LoRALinear(torch.nn.Module):
    """A frozen linear layer plus a trainable low-rank update (used when peft is not installed)."""

    def __init__(self, base: torch.nn.Linear, rank: int):
        super().__init__()
        self.base = base.requires_grad_(False)
        kw = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.down = torch.nn.Linear(base.in_features, rank, bias=False, **kw)
        self.up = torch.nn.Linear(rank, base.out_features, bias=False, **kw)
        torch.nn.init.zeros_(self.up.weight)

    def forward(self, x):
        return self.base(x) + self.up(self.down(x))


LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")


def add_lora(model: torch.nn.Module, rank: int) -> tuple[torch.nn.Module, str]:
    try:
        import peft

        config = peft.LoraConfig(r=rank, lora_alpha=rank, target_modules=list(LORA_TARGETS))
        return peft.get_peft_model(model, config), "peft"
    except ImportError:
        model.requires_grad_(False)
        for module in list(model.modules()):
            for name in ("to_q", "to_k", "to_v"):
                if isinstance(getattr(module, name, None), torch.nn.Linear):
                    setattr(module, name, LoRALinear(getattr(module, name), rank))
            to_out = getattr(module, "to_out", None)
            if isinstance(to_out, torch.nn.ModuleList) and isinstance(to_out[0], torch.nn.Linear):
                to_out[0] = LoRALinear(to_out[0], rank)
        return model, "built-in LoRALinear (peft not installed)"


def run_ltx_lora(variant: str, args) -> dict:
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LTXVideoTransformer3DModel()  # the defaults are LTX-Video 2B
    model, lora = add_lora(model.to(torch.bfloat16).train(), args.lora_rank)
    report = None
    if variant == "ours":
        from transformer_kernels_integrations.diffusers_models import inject

        report = str(inject(model, load_kernel(), training=True))
    F, H, W = (args.frames - 1) // 8 + 1, args.height // 32, args.width // 32
    g = torch.Generator(device="cuda").manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    inputs = dict(hidden_states=torch.randn(1, F * H * W, 128, generator=g, device="cuda").to(**bf16),
                  encoder_hidden_states=torch.randn(1, 128, 4096, generator=g, device="cuda").to(**bf16),
                  timestep=torch.tensor([500], device="cuda"),
                  encoder_attention_mask=torch.ones(1, 128, **bf16), num_frames=F, height=H, width=W,
                  rope_interpolation_scale=(8 / 25, 32, 32), return_dict=False)
    target = torch.randn(1, F * H * W, 128, generator=g, device="cuda").to(**bf16)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step():
        loss = torch.nn.functional.mse_loss(model(**inputs)[0].float(), target.float())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    seconds, peak = timed_steps(step, args.warmup, args.steps)
    return {"variant": variant, "s_per_step": seconds, "peak_memory_gb": peak, "lora": lora,
            "tokens": F * H * W, "injection": report}


def child(args) -> None:
    use_local_build()
    result = (run_ltx_lora if args.ltx_lora else run_llama)(args.run_one, args)
    Path(args.json).write_text(json.dumps(result))


def markdown_llama(results: list[dict], env: dict, args) -> str:
    by = {r["variant"]: r for r in results}
    lines = [f"# Training step, Llama-3.2-1B shape ({args.layers} layers), random weights: {env['gpu']}", "",
             f"torch {env['torch']}, CUDA {env['cuda']}, {env['date']}. bf16 weights, AdamW (fused), "
             f"batch {args.batch} x {args.seq} tokens, labels = inputs; mean of {args.steps} steps after "
             f"{args.warmup} warm-up steps (compilation included there). Peak: max memory allocated.", "",
             "| variant | tokens/s | ms/step | peak GB | vs eager | vs liger | vs compile |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        vs = [f"{r['tokens_per_s'] / by[b]['tokens_per_s']:.2f}×" if b in by else "—"
              for b in ("eager", "liger", "compile")]
        lines.append(f"| {r['variant']} | {r['tokens_per_s']:.0f} | {r['ms_per_step']:.1f} | "
                     f"{r['peak_memory_gb']:.1f} | {vs[0]} | {vs[1]} | {vs[2]} |")
    return "\n".join(lines) + "\n"


def markdown_ltx(results: list[dict], env: dict, args) -> str:
    by = {r["variant"]: r for r in results}
    lines = [f"# LoRA training step, LTX-Video 2B transformer, random weights: {env['gpu']}", "",
             f"torch {env['torch']}, CUDA {env['cuda']}, {env['date']}. {args.frames} frames "
             f"{args.height}x{args.width} ({results[0]['tokens'] if results else '?'} latent tokens), batch 1, "
             f"rank-{args.lora_rank} adapters on {', '.join(LORA_TARGETS)} ({results[0]['lora'] if results else ''}); "
             f"MSE loss, AdamW; mean of {args.steps} steps after {args.warmup}.", "",
             "| variant | s/step | peak GB | vs eager |", "|---|---|---|---|"]
    for r in results:
        vs = f"{by['eager']['s_per_step'] / r['s_per_step']:.2f}×" if "eager" in by else "—"
        lines.append(f"| {r['variant']} | {r['s_per_step']:.3f} | {r['peak_memory_gb']:.1f} | {vs} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="*", default=None, help=f"Llama: {VARIANTS}; --ltx-lora: eager ours")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--layers", type=int, default=LLAMA_32_1B["num_hidden_layers"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--ltx-lora", action="store_true", help="the LTX-Video 2B LoRA step instead of Llama")
    p.add_argument("--frames", type=int, default=49)
    p.add_argument("--height", type=int, default=512)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--run-one", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the training benchmark needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    if args.run_one:
        return child(args)
    variants = args.variants or (["eager", "ours"] if args.ltx_lora else list(VARIANTS))
    results, failed = [], []
    args.out.mkdir(parents=True, exist_ok=True)
    for variant in variants:
        out = args.out / f".train-{variant.replace('+', '-')}.json"
        cmd = [sys.executable, __file__, "--run-one", variant, "--json", str(out)]
        for name in ("batch", "seq", "layers", "steps", "warmup", "frames", "height", "width", "lora_rank"):
            cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        cmd += ["--ltx-lora"] if args.ltx_lora else []
        print(f"== {variant}", flush=True)
        proc = subprocess.run(cmd, cwd=ROOT)
        if proc.returncode == 0 and out.exists():
            results.append(json.loads(out.read_text()))
            out.unlink()
        else:
            failed.append(f"{variant}: exit status {proc.returncode}")
    env = environment()
    md = (markdown_ltx if args.ltx_lora else markdown_llama)(results, env, args)
    if failed:
        md += "\nNot run:\n\n" + "".join(f"- {f}\n" for f in failed)
    stem = result_stem(f"train-{'ltx-lora' if args.ltx_lora else 'llama1b'}", env)
    write_result(args.out, stem, {"env": env, "args": args_record(args), "results": results, "failed": failed}, md)


if __name__ == "__main__":
    main()
