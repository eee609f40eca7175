#!/usr/bin/env python3
"""LLM end to end: prefill and greedy decode of a Llama-3.1-8B-shaped model (random weights, real
config) in the modes a transformers user can run, with and without our kernels.

    python benchmarks/bench_llm.py [--modes hf-eager,ours,ours+graphs] [--batch-sizes 1,8]
                                   [--prefill-tokens 2048] [--decode-tokens 64] [--quick] [--profile]
                                   [--host-profile] [--no-quality] [--no-isolate] [--out DIR]

Modes (decode always with transformers' static cache):
  hf-eager         generate(disable_compile=True): the committed eager baseline
  hf-auto          stock generate: a static cache makes generate compile the decode step itself
                   (its default CompileConfig: reduce-overhead, fullgraph off); disable_compile left off
  compile          generate with CompileConfig(mode="default", fullgraph=True); prefill: the
                   model compiled the same way
  compile-ro       the same with mode="reduce-overhead" (CUDA graphs)
  ours             our kernels injected (merged projections on), generate(disable_compile=True)
  ours+compile     ours, compiled as `compile`
  ours+compile-ro  ours, compiled as `compile-ro`
  graphs           HF eager with the decode step captured in a CUDA graph (cuda_graphs.CapturedDecoder)
  ours+graphs      ours with the captured decode step, no compiler (decode_linear where a step has
                   at most decode.BF16_MAX_ROWS rows, F.linear otherwise: the injected default)
  ours-fp8w+graphs ours with FP8 weights (inject(fp8=True, fp8_weights_only=True): e4m3 codes in place of
                   the bf16 weights, decode_linear on them for a step's rows), the decode step captured
Decode runs at each of --batch-sizes (default 1; prompts of 32 tokens, one row each), prefill at batch 1.
The floor of a decode step: the bytes it must read (every weight but the embedding, FP8 codes and
their scales where the mode has them, and the KV cache's valid tokens, averaged over the timed
tokens) at the speed of a device-to-device copy of that many bytes measured in the same process
(half read, half written, as the micro-benchmarks' "same-size copy"); each mode's ratio to it.
Logits' quality (modes with our kernels, unless --no-quality): the injected model's logits against the
same model's bf16 logits before inject, on the same inputs (8 prompts of 32 tokens; a cached decode
step of 8 rows and of 1 row): relative L2 error, cosine, and how many argmax tokens agree.
--profile adds kernels and GPU idle time per decoded token from one profiled generation;
--host-profile writes, per mode, the Python profiler's top functions over 16 decoded tokens
(llm-...-host-<mode>.txt: where the host time of a token goes). Each mode runs in a process of its
own (--no-isolate: all in this one), so no mode inherits another's compiled code, CUDA-graph pools,
leaked models or allocator state, and peak memory is the mode's own. A mode that fails is reported
with its error; the others still run. Writes llm-<gpu>-<date>.json/.md.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import inspect
import io
import json
import pstats
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from benchmarks.harness import build_line, copy_gbps, environment, result_stem, step_profile, wall_time_s  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402

LLAMA_31_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, rms_norm_eps=1e-5, vocab_size=128256, max_position_embeddings=8192)

# mode -> (our kernels, how decode runs: "eager" | "auto" | "default" | "reduce-overhead" | "graphs")
MODES = {"hf-eager": (False, "eager"), "hf-auto": (False, "auto"), "compile": (False, "default"),
         "compile-ro": (False, "reduce-overhead"), "ours": (True, "eager"), "ours+compile": (True, "default"),
         "ours+compile-ro": (True, "reduce-overhead"), "graphs": (False, "graphs"), "ours+graphs": (True, "graphs"),
         "ours-fp8w+graphs": (True, "graphs")}
# mode -> inject's keywords beyond the defaults
INJECT = {"ours-fp8w+graphs": {"fp8": True, "fp8_weights_only": True}}
DEFAULT_MODES = list(MODES)
PROMPT_TOKENS = 32
# the inputs of the logits' quality check: prompts of PROMPT_TOKENS tokens, this many
QUALITY_BATCH = 8
# where the model runs (a CPU test runs the modes' code with the eager stand-ins: tests/integration/test_bench_llm.py)
DEVICE = "cuda"


def on_gpu() -> bool:
    return torch.device(DEVICE).type == "cuda"


def build(layers: int):
    import transformers

    config = transformers.LlamaConfig(**{**LLAMA_31_8B, "num_hidden_layers": layers})
    torch.manual_seed(0)
    with torch.device(DEVICE):
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = transformers.LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(torch.float32)
    return model.eval()


def decode_weight_bytes(model) -> int:
    """Bytes of weights a decode step reads at least: every parameter but the input embedding (one row
    of it), and the buffers (the FP8 layers' weight scales; RoPE's inverse frequencies)."""
    embed = model.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    total += sum(b.numel() * b.element_size() for b in model.buffers())
    tied = model.get_output_embeddings() is not None and model.get_output_embeddings().weight is embed
    return total if tied else total - embed.numel() * embed.element_size()


def decode_kv_bytes(config, batch: int, context: float, dtype_bytes: int = 2) -> int:
    """Bytes of K and V a decode step reads at least: every layer's valid cache entries (`context`
    tokens a row; a static cache's attention may read its whole length, which the floor does not count)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * dtype_bytes
    return int(per_token * batch * context)


def logits_for_quality(model, prompts: torch.Tensor, next_ids: torch.Tensor | None = None) -> dict:
    """The model's logits on the quality inputs: every position of the prompts (a prefill's GEMMs), and
    one cached decode step after them (a step of all rows, and of the first row alone) with `next_ids`
    (default: this model's greedy tokens; the compared model gets the reference's, so both see the
    same inputs)."""
    out = {}
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        first = model(prompts, use_cache=True)
        out["prefill"] = first.logits.float()
        next_ids = first.logits[:, -1].argmax(-1, keepdim=True) if next_ids is None else next_ids
        out["next_ids"] = next_ids
        out["step"] = model(next_ids, use_cache=True, **{cache_arg: first.past_key_values}).logits[:, -1].float()
        del first
        one = model(prompts[:1], use_cache=True)
        out["step1"] = model(next_ids[:1], use_cache=True, **{cache_arg: one.past_key_values}).logits[:, -1].float()
    return out


def compare_logits(ours: dict, ref: dict) -> dict:
    """Relative L2 error, cosine and argmax agreement of ours against ref, per quality input."""
    found = {}
    for key, rows in (("prefill", f"{QUALITY_BATCH}x{PROMPT_TOKENS} rows"), ("step", f"{QUALITY_BATCH} rows"),
                      ("step1", "1 row")):
        a, b = ours[key].double(), ref[key].double()
        found[key] = {"rows": rows, "rel_l2": ((a - b).norm() / b.norm()).item(),
                      "cosine": torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item(),
                      "argmax_agree": (a.argmax(-1) == b.argmax(-1)).double().mean().item()}
    return found


def compile_config(how: str):
    from transformers import CompileConfig

    return CompileConfig(fullgraph=True, mode=how)


def run(args, mode: str) -> list[dict]:
    """One mode at each batch size (one model, injected once): a result per batch size."""
    optimized, how = MODES[mode]
    model = build(args.layers)
    report = quality = None
    if optimized:
        from transformer_kernels_integrations.transformers_models import inject

        if args.quality:  # the same model's bf16 logits, before inject, on the same inputs
            g = torch.Generator(device=DEVICE).manual_seed(1)
            quality_prompts = torch.randint(0, LLAMA_31_8B["vocab_size"], (QUALITY_BATCH, PROMPT_TOKENS),
                                            device=DEVICE, generator=g)
            reference = logits_for_quality(model, quality_prompts)
        report = str(inject(model, load_kernel(), merge_projections=args.merge_projections, **INJECT.get(mode, {})))
        free_memory()
        if args.quality:
            quality = compare_logits(logits_for_quality(model, quality_prompts, reference["next_ids"]), reference)
            del reference
    common = {"optimized_kernels": optimized, "decode": how, "injection": report, "quality": quality}
    ids = torch.randint(0, LLAMA_31_8B["vocab_size"], (max(args.batch_sizes), args.prefill_tokens), device=DEVICE)
    prefill = {}
    with torch.no_grad():
        if not args.skip_prefill:
            forward = model
            if how in ("default", "reduce-overhead"):  # prefill through the same compiler mode
                compiled = torch.compile(model, mode=how, fullgraph=True, dynamic=False)

                def forward(x):
                    if how == "reduce-overhead":
                        torch.compiler.cudagraph_mark_step_begin()
                    return compiled(x)
            x = ids[:1]
            forward(x)  # warm-up (and compile)
            forward(x)
            prefill["prefill_ms"] = 1e3 * wall_time_s(lambda: forward(x), args.repeats)
            del forward
            torch._dynamo.reset()
    results = []
    for batch in args.batch_sizes:
        if on_gpu():
            torch.cuda.reset_peak_memory_stats()
        result = {**common, "batch": batch, **(prefill if batch == args.batch_sizes[0] else {})}
        n = args.decode_tokens
        if not args.skip_decode:
            prompt = ids[:batch, :PROMPT_TOKENS]
            with torch.no_grad():
                decoder = None
                if how == "graphs":
                    from transformer_kernels_integrations.cuda_graphs import capture_decode

                    decoder = capture_decode(model, batch, PROMPT_TOKENS + n + 8)
                    generate = lambda tokens: decoder.generate(prompt, tokens)  # noqa: E731
                else:
                    gen = dict(min_new_tokens=1, do_sample=False, cache_implementation="static",
                               attention_mask=torch.ones_like(prompt), pad_token_id=0)
                    if how == "eager":
                        gen["disable_compile"] = True  # generate would otherwise compile a static-cache model
                    elif how != "auto":
                        gen["compile_config"] = compile_config(how)
                    generate = lambda tokens: model.generate(prompt, max_new_tokens=tokens,  # noqa: E731
                                                             **{**gen, "min_new_tokens": tokens})
                generate(n)  # warm-up (compiles or captures)
                generate(n)
                short = wall_time_s(lambda: generate(1), 3)
                full = wall_time_s(lambda: generate(n), 3)
                result["decode_ms_per_token"] = 1e3 * (full - short) / (n - 1)
                if args.profile:
                    tokens = 16
                    result["profile"] = step_profile(lambda: generate(tokens), tokens)
                if args.host_profile:
                    result["host_profile"] = host_profile(lambda: generate(16))
                del generate, decoder
        result["decode_weight_bytes"] = decode_weight_bytes(model)
        # the timed tokens are the 2nd to the n-th: their steps attend to PROMPT_TOKENS + 1 .. + n - 1 tokens
        result["decode_kv_bytes"] = decode_kv_bytes(model.config, batch, PROMPT_TOKENS + n / 2)
        result["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9 if on_gpu() else 0.0
        free_memory()
        floor_bytes = result["decode_weight_bytes"] + result["decode_kv_bytes"]
        result["same_size_copy_gbps"] = copy_gbps(floor_bytes // 2)  # half read, half written
        results.append(result)
    return results


def free_memory() -> None:
    gc.collect()  # the merges and compiled callables hold cycles
    if on_gpu():
        torch.cuda.empty_cache()


def host_profile(call, top: int = 40) -> str:
    """The Python profiler's top functions (by own time) over one call()."""
    profiler = cProfile.Profile()
    profiler.runcall(call)
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def failed(args, mode: str, error: str) -> list[dict]:
    optimized, how = MODES[mode]
    return [{"mode": mode, "optimized_kernels": optimized, "decode": how, "batch": batch, "error": error[:500]}
            for batch in args.batch_sizes]


def run_mode(args, mode: str) -> list[dict]:
    try:
        return [{"mode": mode, **r} for r in run(args, mode)]
    except Exception as e:  # reported; the other modes still run
        return failed(args, mode, f"{type(e).__name__}: {e}")


def run_isolated(args, mode: str) -> list[dict]:
    """run_mode in a fresh interpreter, with this command line's options for that one mode."""
    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--modes":
            skip = True
        elif not a.startswith("--modes="):
            argv.append(a)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        proc = subprocess.run([sys.executable, __file__, *argv, "--modes", mode, "--child-result", str(out)])
        if out.exists():
            return json.loads(out.read_text())
    return failed(args, mode, f"the process of this mode exited with status {proc.returncode} before reporting")


def floor_ms(r: dict) -> float:
    """The decode step's floor: its bytes (weights + KV) at the same-size copy rate of its process."""
    return 1e3 * (r["decode_weight_bytes"] + r.get("decode_kv_bytes", 0)) / (r["same_size_copy_gbps"] * 1e9)


def markdown(args, env, results, copy: float) -> str:
    def base_of(batch):  # stock generate (its automatic compile) where measured, else HF eager
        for name in ("hf-auto", "hf-eager"):
            found = next((r for r in results if r["mode"] == name and r.get("batch") == batch and "error" not in r), None)
            if found:
                return found
        return None

    lines = [f"# Llama-3.1-8B shape ({args.layers} layers), random weights: {env['gpu']}", "",
             f"torch {env['torch']}, CUDA {env['cuda']}, {env['date']}. Prefill {args.prefill_tokens} tokens at batch 1 "
             f"(median of {args.repeats}); greedy decode of {args.decode_tokens} tokens after {PROMPT_TOKENS}-token "
             "prompts (one a row) with a static cache, ms per token (a step of all rows). Floor: the bytes a step "
             "must read (weights but the embedding, with their FP8 scales; the KV cache's valid tokens) at the "
             "speed of a same-size device-to-device copy measured in the mode's process; % of floor = floor / "
             f"measured. 1 GiB copy in this run: {copy:.0f} GB/s. vs base: the same batch's stock `generate` "
             "(hf-auto) where measured, else HF eager.", "", build_line(env), "",
             "| mode | batch | decode | prefill ms | decode ms/token | vs base | floor ms (weights + KV GB, copy GB/s) "
             "| % of floor | kernels / token | GPU idle ms / token | peak GB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['mode']} | {r.get('batch', '')} | {r['decode']} | failed: {r['error'][:200]} "
                         "| | | | | | | |")
            continue
        base = base_of(r.get("batch"))
        d, p = r.get("decode_ms_per_token"), r.get("prefill_ms")
        cells = [r["mode"], str(r.get("batch", 1)), r["decode"], f"{p:.2f}" if p else "—", f"{d:.3f}" if d else "—",
                 f"{base['decode_ms_per_token'] / d:.2f}×" if d and base and base.get("decode_ms_per_token") else "—"]
        f = floor_ms(r)
        cells.append(f"{f:.3f} ({r['decode_weight_bytes'] / 1e9:.2f} + {r.get('decode_kv_bytes', 0) / 1e9:.3f}, "
                     f"{r['same_size_copy_gbps']:.0f})")
        cells.append(f"{100 * f / d:.0f} %" if d else "—")
        prof = r.get("profile")
        cells += [f"{prof['kernels']:.0f}" if prof else "—", f"{prof['gpu_idle_ms']:.2f}" if prof else "—",
                  f"{r['peak_memory_gb']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    quality = [(r["mode"], r["quality"]) for r in results if r.get("quality")]
    seen = set()
    if quality:
        lines += ["", "Logits against the same model's bf16 logits before inject (same inputs):", "",
                  "| mode | input | relative L2 error | cosine | argmax agree |", "|---|---|---|---|---|"]
        for mode, q in quality:
            if mode in seen:
                continue
            seen.add(mode)
            for key, v in q.items():
                lines.append(f"| {mode} | {key} ({v['rows']}) | {v['rel_l2']:.4f} | {v['cosine']:.6f} "
                             f"| {100 * v['argmax_agree']:.1f} % |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", type=lambda v: v.split(","), default=DEFAULT_MODES,
                   help=f"comma list of {', '.join(MODES)} (default: all)")
    p.add_argument("--prefill-tokens", type=int, default=2048)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--batch-sizes", type=lambda v: [int(b) for b in v.split(",")], default=[1],
                   help="comma list of decode batch sizes (default 1)")
    p.add_argument("--no-quality", dest="quality", action="store_false",
                   help="skip the logits' comparison with the bf16 model (modes with our kernels)")
    p.add_argument("--layers", type=int, default=LLAMA_31_8B["num_hidden_layers"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="32 decode tokens, 3 prefill repeats")
    p.add_argument("--skip-prefill", action="store_true")
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--profile", action="store_true", help="kernels and GPU idle time per token from a profile")
    p.add_argument("--host-profile", action="store_true", help="the Python profiler's top functions per mode")
    p.add_argument("--no-merge-projections", dest="merge_projections", action="store_false")
    p.add_argument("--no-isolate", dest="isolate", action="store_false", help="all modes in this process")
    p.add_argument("--child-result", type=Path, help=argparse.SUPPRESS)  # run_isolated's child: one mode
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)
    unknown = [m for m in args.modes if m not in MODES]
    if unknown:
        raise SystemExit(f"unknown modes {unknown}; choose from {list(MODES)}")
    if args.quick:
        args.decode_tokens, args.repeats = 32, 3
    return args


def main() -> None:
    args = parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the LLM benchmark needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    use_local_build()
    if args.child_result is not None:
        args.child_result.write_text(json.dumps(run_mode(args, args.modes[0])))
        return
    copy = copy_gbps()
    results = []
    env = environment()
    stem = result_stem("llm-llama8b", env)
    args.out.mkdir(parents=True, exist_ok=True)
    for mode in args.modes:
        if args.isolate:
            results += run_isolated(args, mode)
        else:
            results += run_mode(args, mode)
            torch._dynamo.reset()
            gc.collect()  # the merges and compiled callables hold cycles: free the model before the next
            torch.cuda.empty_cache()
        for r in results:
            host = r.pop("host_profile", None)
            if host:
                name = re.sub(r"[^a-z0-9]+", "-", f"{mode}-b{r['batch']}")
                (args.out / f"{stem}-host-{name}.txt").write_text(host)
        md = markdown(args, env, results, copy)  # after each mode: a run cut short keeps what it measured
        (args.out / f"{stem}.json").write_text(json.dumps(
            {"env": env, "copy_gbps": copy, "args": vars(args) | {"out": str(args.out)}, "results": results},
            indent=1) + "\n")
        (args.out / f"{stem}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
