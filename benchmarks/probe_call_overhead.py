#!/usr/bin/env python3
"""Where the host time of a decode-sized rms_norm call goes (µs per call from eager Python)."""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from benchmarks.harness import call_latency_us  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402


def main() -> None:
    use_local_build()
    tk = load_kernel()
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    op_out = tk.ops.rms_norm_out.default
    op = tk.ops.rms_norm.default
    probes = {
        "torch.empty": lambda: torch.empty((1, 4096), dtype=torch.bfloat16, device="cuda"),
        "x.add_(1) (one aten launch)": lambda: x.add_(1),
        "F.rms_norm": lambda: F.rms_norm(x, (4096,), w, 1e-6),
        "ops.rms_norm_out.default(out, ...)": lambda: op_out(out, x, w, 1e-6, "hf"),
        "ops.rms_norm.default(x, ...)": lambda: op(x, w, 1e-6, "hf"),
        "ops.rms_norm(x, ...) (packet)": lambda: tk.ops.rms_norm(x, w, 1e-6, "hf"),
        "tk.rms_norm(x, w, out=out)": lambda: tk.rms_norm(x, w, 1e-6, out=out),
        "tk.rms_norm(x, w)": lambda: tk.rms_norm(x, w, 1e-6),
    }
    for name, fn in probes.items():
        print(f"{name:40s} {call_latency_us(fn):6.2f} µs")


if __name__ == "__main__":
    main()
