#!/usr/bin/env python3
"""Host cost of one decode step on CPU: how much Python and dispatch a token costs, by variant.

    python benchmarks/probe_decode_host.py [--layers 32] [--steps 400] [--repeats 5] [--profile VARIANT]

Decode of a Llama-3.1-8B-shaped model on the GPU is host-bound (the GPU work of a token is a
fraction of the host's), so the injected model's per-layer Python decides its ms/token. This
measures that Python here, without a GPU: a Llama with the real number of layers and tiny widths
(the arithmetic is negligible), a static cache, and our ops given CPU implementations that return a
cached tensor of the right shape (the dispatcher call into the op stays, the kernel is gone), so the
injected forwards take exactly the code path they take on the GPU (``KERNEL_DEVICES`` widened).
Variants: ``hf`` (transformers' own forward), ``ours`` (``inject``, merged projections),
``ours-unmerged`` (``merge_projections=False``). Per variant: µs per step of the model forward
(``CapturedDecoder(capture=False).step``, the static-buffer step) and per token of ``generate``
(``disable_compile=True``), in this thread's CPU time (the host is shared), each the best of
``--repeats`` rounds that interleave the variants; aten and custom-op calls per step (a proxy for
kernel launches). ``--profile`` prints cProfile's top functions for one variant.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402

VARIANTS = ("hf", "ours", "ours-unmerged")
PROMPT = 32


class _Outputs:
    """One zero tensor per (shape, dtype): what the CPU stand-ins return (allocation-free, finite)."""

    def __init__(self):
        self.cache = {}

    def like(self, t: torch.Tensor, shape=None, tag: int = 0) -> torch.Tensor:
        key = (tuple(t.shape if shape is None else shape), t.dtype, tag)
        if key not in self.cache:
            self.cache[key] = torch.zeros(key[0], dtype=t.dtype)
        return self.cache[key]


def register_cpu_standins(tk) -> torch.library.Library:
    """CPU implementations of the ops a Llama/Qwen decode step calls, each returning cached zeros."""
    ns = tk._ops.add_op_namespace_prefix("x").split("::")[0]
    lib = torch.library.Library(ns, "IMPL")
    out = _Outputs()
    lib.impl("rms_norm", lambda x, w, eps, rounding: out.like(x), "CPU")
    lib.impl("fused_add_rms_norm", lambda x, r, w, eps, rounding: (out.like(x), out.like(r, tag=1)), "CPU")
    lib.impl("hf_rope", lambda q, k, cos, sin, dim: (out.like(q), out.like(k, tag=1)), "CPU")
    lib.impl("hf_qk_norm_rope", lambda q, k, qw, kw, eps, cos, sin: (out.like(q), out.like(k, tag=1)), "CPU")
    lib.impl("act_and_mul", lambda x, act, first: out.like(x, (*x.shape[:-1], x.shape[-1] // 2)), "CPU")
    lib.impl("act_mul", lambda g, u, act: out.like(g), "CPU")
    return lib


def build(layers: int):
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=101)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def make(variant: str, layers: int, tk):
    model = build(layers)
    if variant != "hf":
        from transformer_kernels_integrations.transformers_models import inject

        inject(model, tk, merge_projections=variant == "ours")
    return model


def restore_rotary(model) -> None:
    """inject() swaps apply_rotary_pos_emb in the modeling module: give the next variant transformers' own."""
    modeling = sys.modules[type(model).__module__]
    modeling.apply_rotary_pos_emb = getattr(modeling.apply_rotary_pos_emb, "_transformers_original",
                                            modeling.apply_rotary_pos_emb)


class _Count(TorchDispatchMode):
    def __init__(self, ns):
        super().__init__()
        self.ns, self.aten, self.ours = ns, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == self.ns:
            self.ours += 1
        else:
            self.aten += 1
        return func(*args, **(kwargs or {}))


def cpu_us(fn, n: int) -> float:
    """This thread's CPU time of fn(n), per unit, in µs: on a shared, loaded host the wall clock
    also counts the time other processes hold the core."""
    t0 = time.thread_time()
    fn(n)
    return 1e6 * (time.thread_time() - t0) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--tokens", type=int, default=32, help="tokens per generate")
    p.add_argument("--repeats", type=int, default=5, help="rounds over the variants (best of them is kept)")
    p.add_argument("--variants", type=lambda v: v.split(","), default=list(VARIANTS))
    p.add_argument("--profile", choices=VARIANTS)
    args = p.parse_args()
    torch.set_num_threads(1)
    use_local_build()
    tk = load_kernel()
    lib = register_cpu_standins(tk)  # noqa: F841 (kept alive)
    from transformer_kernels_integrations import transformers_models
    from transformer_kernels_integrations.cuda_graphs import CapturedDecoder

    transformers_models.KERNEL_DEVICES = ("cuda", "cpu")
    ns = tk._ops.add_op_namespace_prefix("x").split("::")[0]
    prompt = torch.randint(0, 101, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    runs = {}
    for variant in args.variants:  # each with the modeling module's apply_rotary_pos_emb it was injected with
        model = make(variant, args.layers, tk)
        modeling = sys.modules[type(model).__module__]
        runs[variant] = (model, modeling, modeling.apply_rotary_pos_emb,
                         CapturedDecoder(model, 1, PROMPT + args.steps + 8, capture=False))
        restore_rotary(model)
    token = torch.zeros(1, dtype=torch.long)
    best = {v: [float("inf"), float("inf")] for v in runs}
    counts = {}
    with torch.no_grad():
        for round_ in range(args.repeats):  # interleaved, so a change in the host's load hits every variant
            for variant, (model, modeling, rope, decoder) in runs.items():
                modeling.apply_rotary_pos_emb = rope

                def steps(n):
                    decoder.prefill(prompt)
                    for _ in range(n):
                        decoder.step(token)

                def generate(n):
                    model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                   cache_implementation="static", disable_compile=True, pad_token_id=0)

                if round_ == 0:
                    steps(4)
                    generate(2)
                    decoder.prefill(prompt)
                    with _Count(ns) as count:
                        decoder.step(token)
                    counts[variant] = (count.aten, count.ours)
                prefill = cpu_us(lambda n: decoder.prefill(prompt), 1)
                best[variant][0] = min(best[variant][0], cpu_us(steps, args.steps) - prefill / args.steps)
                short, full = cpu_us(generate, 1), cpu_us(generate, args.tokens) * args.tokens
                best[variant][1] = min(best[variant][1], (full - short) / (args.tokens - 1))
        if args.profile:
            model, modeling, rope, decoder = runs[args.profile]
            modeling.apply_rotary_pos_emb = rope
            decoder.prefill(prompt)
            profiler = cProfile.Profile()
            profiler.runcall(lambda: [decoder.step(token) for _ in range(args.steps)])
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    base = best.get("hf")
    print(f"{args.layers} layers, CPU thread time, torch {torch.__version__}; best of {args.repeats} rounds: "
          "µs per decode step (model forward) and per generate token; aten and our ops per step")
    print(f"{'variant':16s} {'step µs':>9s} {'vs hf':>6s} {'gen µs/tok':>11s} {'vs hf':>6s} {'aten':>6s} {'ours':>5s}")
    for v, (step, gen) in best.items():
        aten, ours = counts[v]
        print(f"{v:16s} {step:9.0f} {base[0] / step if base else 0:6.2f} {gen:11.0f} "
              f"{base[1] / gen if base else 0:6.2f} {aten:6d} {ours:5d}")


if __name__ == "__main__":
    main()
