#!/usr/bin/env python3
"""Self-check of the build on any machine: loads it the Hub way, lists the ops, traces them on
meta tensors, checks the Python ABI. Running the kernels themselves needs an NVIDIA GPU."""

import json
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from transformer_kernels_integrations.loading import REPO_ID, ROOT, load_kernel, use_local_build  # noqa: E402


MANYLINUX = "manylinux_2_28"


def main() -> None:
    use_local_build()
    tk = load_kernel()
    variant = Path(tk.__file__).parent
    meta = json.loads((variant / "metadata.json").read_text())
    namespace = getattr(torch.ops, meta["id"])
    ops = sorted(name for name in dir(namespace) if not name.startswith("_") and name not in ("name", "op"))
    print(f"{REPO_ID} v{meta['version']}: {variant.relative_to(ROOT)}")
    print(f"  op namespace {meta['id']}: {', '.join(ops)}")
    print(f"  CUDA archs: {', '.join(meta['backend']['archs'])}")

    x = torch.empty(2, 7, 4096, device="meta", dtype=torch.bfloat16)
    w = torch.empty(4096, device="meta", dtype=torch.float32)
    for rounding in ("hf", "diffusers", "torch"):
        out = tk.rms_norm(x, w, 1e-6, rounding=rounding)
        print(f"  rms_norm(bf16 x, fp32 weight, rounding={rounding!r}) traces on meta -> {out.dtype}")

    from kernel_abi_check import ObjectFile

    so = ObjectFile(str(next(variant.glob("*.abi3.so"))))
    problems = so.check_python_abi("3.9")
    print(f"  Python limited API 3.9: {'ok' if not problems else problems}")
    # Informational: a local build links against this host's glibc; only the Nix (Hub) build promises
    # manylinux_2_28 (kernel-abi-check, as kernel-builder runs it there).
    newer = so.check_manylinux(MANYLINUX)
    print(f"  {MANYLINUX} (kernel-abi-check): " + ("ok" if not newer else
          "this local build needs " + ", ".join(f"{s.name} ({s.dep} {s.version})" for s in newer) +
          "; only the Nix (Hub) build promises manylinux_2_28"))
    if torch.cuda.is_available():
        print(f"  GPU present ({torch.cuda.get_device_name()}): run scripts/test.sh and scripts/main.sh")
    else:
        print("Running the kernels needs an NVIDIA GPU; this machine has none (torch.cuda.is_available() is "
              "False). The build, its loading and its fake (meta) implementations are checked; the kernels "
              "were not run.")
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
