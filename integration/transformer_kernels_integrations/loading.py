"""Loading the kernel the way users do: through ``kernels``, never by importing the source tree."""

import os
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]  # the checkout: integration/transformer_kernels_integrations/loading.py
REPO_ID = "transformer-kernels/transformer-kernels"
VERSION = 1


def use_local_build(root: Path = ROOT) -> None:
    """Makes ``kernels.get_kernel(REPO_ID, ...)`` resolve to ``root/build`` (call before loading)."""
    os.environ.setdefault("LOCAL_KERNELS", f"{REPO_ID}={root}")


def load_kernel() -> ModuleType:
    """The kernel module: the local build when LOCAL_KERNELS points at it, else the Hub's."""
    import kernels

    return kernels.get_kernel(REPO_ID, version=VERSION)
