#!/usr/bin/env python3
"""Where torch.compile of an injected LTX-Video transformer spends its first call (issue 42: bf16 or
fp8=True, it did not finish in about 290 s on an H100, stock compile about 70 s).

Builds the 2B transformer from its config (random weights), injects our kernels, compiles it
(`compile_repeated_blocks(fullgraph=True)`, as benchmarks/bench_ltx.py does, or the whole model with
--whole) and makes one call at 49 frames 512x768 with CFG (batch 2). Every --every seconds the Python
stacks of all threads go to OUT/stacks.txt (faulthandler), so a call cut by the device's limit still
says where it was; dynamo's recompiles and graph breaks go to OUT/torch_logs.txt. When the call ends,
OUT/summary.json has its time, dynamo's counters and compile times.

    TORCH_LOGS=recompiles,graph_breaks python workshop/compile_hang_probe.py OUT [--fp8] [--layers N] [--whole]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "integration")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--fp8", action="store_true")
    p.add_argument("--layers", type=int, default=None, help="blocks (default: the 2B config's 28)")
    p.add_argument("--whole", action="store_true", help="torch.compile the whole model instead of its blocks")
    p.add_argument("--stock", action="store_true", help="no injection: stock compile, for comparison")
    p.add_argument("--every", type=float, default=30.0)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stacks = (args.out / "stacks.txt").open("w")
    faulthandler.dump_traceback_later(args.every, repeat=True, file=stacks)

    from diffusers import LTXVideoTransformer3DModel

    from bench_ltx import inputs
    from transformer_kernels_integrations.diffusers_models import inject
    from transformer_kernels_integrations.loading import load_kernel, use_local_build

    use_local_build(ROOT)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LTXVideoTransformer3DModel(**({"num_layers": args.layers} if args.layers else {}))
    model = model.to(torch.bfloat16).eval()
    summary: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    if not args.stock:
        summary["injection"] = str(inject(model, load_kernel(), fp8=args.fp8))
    if args.whole:
        model = torch.compile(model, fullgraph=True)
    else:
        model.compile_repeated_blocks(fullgraph=True)
    x = inputs(argparse.Namespace(num_frames=49, height=512, width=768, batch_size=1))
    latents = x.pop("hidden_states")
    t0 = time.perf_counter()
    with torch.no_grad():
        model(hidden_states=latents, timestep=torch.full((latents.shape[0],), 500.0, device="cuda"), **x)
    torch.cuda.synchronize()
    summary["first_call_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.no_grad():
        model(hidden_states=latents, timestep=torch.full((latents.shape[0],), 400.0, device="cuda"), **x)
    torch.cuda.synchronize()
    summary["second_call_s"] = time.perf_counter() - t0
    faulthandler.cancel_dump_traceback_later()
    from torch._dynamo.utils import compile_times, counters

    summary["counters"] = {k: dict(v) for k, v in counters.items()}
    summary["compile_times"] = compile_times(repr="str")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: summary[k] for k in ("first_call_s", "second_call_s")}))


if __name__ == "__main__":
    main()
