#!/usr/bin/env python3
"""LLM end to end: prefill and greedy decode of a Llama-3.1-8B-shaped model (random weights, real
config) in the modes a transformers user can run, with and without our kernels.

    python benchmarks/bench_llm.py [--modes hf-eager,ours,ours+graphs] [--prefill-tokens 2048]
                                   [--decode-tokens 64] [--quick] [--profile] [--host-profile]
                                   [--no-isolate] [--out DIR]

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
  ours+graphs      ours with the captured decode step, no compiler
The bandwidth floor of a decode step (every weight but the embedding read once, at the speed of a
device-to-device copy measured in the same run) is reported with each mode's ratio to it.
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
         "ours+compile-ro": (True, "reduce-overhead"), "graphs": (False, "graphs"), "ours+graphs": (True, "graphs")}
DEFAULT_MODES = list(MODES)
PROMPT_TOKENS = 32


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


def decode_weight_bytes(model) -> int:
    """Bytes a decode step reads at least: every parameter but the input embedding (one row of it)."""
    embed = model.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    tied = model.get_output_embeddings() is not None and model.get_output_embeddings().weight is embed
    return total if tied else total - embed.numel() * embed.element_size()


def compile_config(how: str):
    from transformers import CompileConfig

    return CompileConfig(fullgraph=True, mode=how)


def run(args, optimized: bool, how: str) -> dict:
    model = build(args.layers)
    report = None
    if optimized:
        from transformer_kernels_integrations.transformers_models import inject

        report = str(inject(model, load_kernel(), merge_projections=args.merge_projections))
    result = {"optimized_kernels": optimized, "decode": how, "injection": report}
    ids = torch.randint(0, LLAMA_31_8B["vocab_size"], (1, args.prefill_tokens), device="cuda")
    prompt = ids[:, :PROMPT_TOKENS]
    with torch.no_grad():
        if not args.skip_prefill:
            forward = model
            if how in ("default", "reduce-overhead"):  # prefill through the same compiler mode
                compiled = torch.compile(model, mode=how, fullgraph=True, dynamic=False)

                def forward(x):
                    if how == "reduce-overhead":
                        torch.compiler.cudagraph_mark_step_begin()
                    return compiled(x)
            forward(ids)  # warm-up (and compile)
            forward(ids)
            result["prefill_ms"] = 1e3 * wall_time_s(lambda: forward(ids), args.repeats)
            del forward
            torch._dynamo.reset()
        if not args.skip_decode:
            n = args.decode_tokens
            if how == "graphs":
                from transformer_kernels_integrations.cuda_graphs import capture_decode

                decoder = capture_decode(model, 1, PROMPT_TOKENS + n + 8)
                generate = lambda tokens: decoder.generate(prompt, tokens)  # noqa: E731
            else:
                gen = dict(min_new_tokens=1, do_sample=False, cache_implementation="static")
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
    result["decode_weight_bytes"] = decode_weight_bytes(model)
    result["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return result


def host_profile(call, top: int = 40) -> str:
    """The Python profiler's top functions (by own time) over one call()."""
    profiler = cProfile.Profile()
    profiler.runcall(call)
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def run_mode(args, mode: str) -> dict:
    optimized, how = MODES[mode]
    try:
        return {"mode": mode, **run(args, optimized, how)}
    except Exception as e:  # reported; the other modes still run
        return {"mode": mode, "optimized_kernels": optimized, "decode": how, "error": f"{type(e).__name__}: {e}"[:500]}


def run_isolated(mode: str) -> dict:
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
    optimized, how = MODES[mode]
    return {"mode": mode, "optimized_kernels": optimized, "decode": how,
            "error": f"the process of this mode exited with status {proc.returncode} before reporting"}


def markdown(args, env, results, copy: float) -> str:
    base = next((r for r in results if r.get("decode") == "eager" and not r["optimized_kernels"] and "error" not in r),
                None)
    lines = [f"# Llama-3.1-8B shape ({args.layers} layers), random weights: {env['gpu']}", "",
             f"torch {env['torch']}, CUDA {env['cuda']}, {env['date']}. Prefill {args.prefill_tokens} tokens "
             f"(median of {args.repeats}); greedy decode of {args.decode_tokens} tokens after a {PROMPT_TOKENS}-token "
             f"prompt with a static cache, ms per token. Device-to-device copy in this run: {copy:.0f} GB/s; the "
             "decode floor is the weights (all but the embedding) read once at that speed.", "", build_line(env), "",
             "| mode | kernels | decode | prefill ms | vs HF eager | decode ms/token | vs HF eager | × floor "
             "| kernels / token | GPU idle ms / token |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        who = "ours" if r["optimized_kernels"] else "HF"
        if "error" in r:
            lines.append(f"| {r['mode']} | {who} | {r['decode']} | failed: {r['error'][:200]} | | | | | | |")
            continue
        floor_ms = 1e3 * r["decode_weight_bytes"] / (copy * 1e9)
        cells = [r["mode"], who, r["decode"]]
        for key in ("prefill_ms", "decode_ms_per_token"):
            v = r.get(key)
            ref = base.get(key) if base else None
            cells += [f"{v:.2f}" if v else "—", f"{ref / v:.2f}×" if v and ref else "—"]
        d = r.get("decode_ms_per_token")
        cells.append(f"{d / floor_ms:.2f} (floor {floor_ms:.2f} ms)" if d else "—")
        prof = r.get("profile")
        cells += [f"{prof['kernels']:.0f}" if prof else "—", f"{prof['gpu_idle_ms']:.2f}" if prof else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", type=lambda v: v.split(","), default=DEFAULT_MODES,
                   help=f"comma list of {', '.join(MODES)} (default: all)")
    p.add_argument("--prefill-tokens", type=int, default=2048)
    p.add_argument("--decode-tokens", type=int, default=64)
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
    args = p.parse_args()
    unknown = [m for m in args.modes if m not in MODES]
    if unknown:
        raise SystemExit(f"unknown modes {unknown}; choose from {list(MODES)}")
    if args.quick:
        args.decode_tokens, args.repeats = 32, 3
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
            results.append(run_isolated(mode))
        else:
            torch.cuda.reset_peak_memory_stats()
            results.append(run_mode(args, mode))
            torch._dynamo.reset()
            gc.collect()  # the merges and compiled callables hold cycles: free the model before the next
            torch.cuda.empty_cache()
        host = results[-1].pop("host_profile", None)
        if host:
            (args.out / f"{stem}-host-{re.sub(r'[^a-z0-9]+', '-', mode)}.txt").write_text(host)
        md = markdown(args, env, results, copy)  # after each mode: a run cut short keeps what it measured
        (args.out / f"{stem}.json").write_text(json.dumps(
            {"env": env, "copy_gbps": copy, "args": vars(args) | {"out": str(args.out)}, "results": results},
            indent=1) + "\n")
        (args.out / f"{stem}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
