"""What every example does first: its command line with --local-build, and the GPU check."""

import argparse
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "integration")]
from transformer_kernels_integrations.loading import use_local_build  # noqa: E402


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local-build", action="store_true", help="load our kernels from ./build, not the Hub")
    return p


def parse(p: argparse.ArgumentParser) -> argparse.Namespace:
    """The arguments, once a GPU is known to be there; --local-build resolves the Hub repository to
    this checkout's build/ (LOCAL_KERNELS), so the same loading code runs either way."""
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("transformer-kernels runs on NVIDIA GPUs: torch.cuda.is_available() is False")
    if args.local_build:
        use_local_build()
    return args
