"""Loading the kernel the way users do: through ``kernels``, never by importing the source tree.

From the Hub, ``trust_remote_code=True`` is passed explicitly: ``kernels`` (0.17) refuses a
repository whose organisation is not a trusted Kernel Hub publisher unless it is, and
``transformer-kernels`` is not one. Passing it means: you trust this repository's code (the
compiled extension and its Python files run in your process). With ``LOCAL_KERNELS`` the Hub and
its trust check are not involved: ``kernels`` loads the local build.

A local build is found from an argument, from ``TRANSFORMER_KERNELS_ROOT``, or from the checkout
this package is imported from (an editable install or ``PYTHONPATH=integration``); an installed
copy outside a clone has no checkout and loads from the Hub unless told where a build is.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

REPO_ID = "transformer-kernels/transformer-kernels"
VERSION = 1
REVISION = f"v{VERSION}"  # the branch version=1 names (LayerRepository resolves version= on the Hub)
ROOT_ENV = "TRANSFORMER_KERNELS_ROOT"


def checkout_root() -> Path | None:
    """The clone this package is imported from (integration/transformer_kernels_integrations/ inside
    it), or None when it is installed elsewhere."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "build.toml").is_file() and (root / "torch-ext").is_dir() else None


ROOT = checkout_root()


def local_root(root: str | os.PathLike | None = None) -> Path:
    """The kernel directory whose ``build/`` holds a local build: `root`, else $TRANSFORMER_KERNELS_ROOT,
    else the checkout. Raises when none is known."""
    chosen = root if root is not None else os.environ.get(ROOT_ENV) or ROOT
    if chosen is None:
        raise ValueError(f"no local build given: pass the kernel directory (the one holding build/), or set "
                         f"{ROOT_ENV}; this package is installed outside a clone, so there is no checkout to use")
    chosen = Path(chosen).expanduser().resolve()
    if not (chosen / "build").is_dir():
        raise FileNotFoundError(f"{chosen} has no build/ directory: build it with `python tools/build_kernel.py` there")
    return chosen


def use_local_build(root: str | os.PathLike | None = None) -> Path:
    """Makes ``kernels.get_kernel(REPO_ID, ...)`` resolve to ``<root>/build`` (call before the first
    load: ``kernels`` reads LOCAL_KERNELS once). An existing LOCAL_KERNELS is kept. Returns the root."""
    chosen = local_root(root)
    os.environ.setdefault("LOCAL_KERNELS", f"{REPO_ID}={chosen}")
    return chosen


def load_kernel(local_build: str | os.PathLike | None = None) -> ModuleType:
    """The kernel module: from `local_build` (a kernel directory with build/) if given, else the local
    build LOCAL_KERNELS names, else the Hub's (trusting this repository explicitly)."""
    import kernels

    if local_build is not None:
        return kernels.get_local_kernel(local_root(local_build) / "build")
    try:
        return kernels.get_kernel(REPO_ID, version=VERSION, trust_remote_code=True)
    except Exception as e:  # the Hub unreachable (no network, an offline cache miss), or the repo refused
        if os.environ.get("LOCAL_KERNELS"):
            raise
        raise RuntimeError(hub_load_failure(e)) from e


def hub_load_failure(error: BaseException) -> str:
    """What a user who reached the Hub path by default needs to know when it fails: what failed, and
    how to point at a local build instead."""
    checkout = f" (this clone: {ROOT})" if ROOT is not None else ""
    return (f"could not load {REPO_ID} (version {VERSION}) from the Hugging Face Hub: "
            f"{type(error).__name__}: {error}. To use a local build instead, build it in a clone "
            f"(`python tools/build_kernel.py`) and either call use_local_build(PATH) / load_kernel(PATH) with the "
            f"clone's directory{checkout}, or set {ROOT_ENV}=PATH and call use_local_build(), or set "
            f"LOCAL_KERNELS={REPO_ID}=PATH before the first load; then pass the module as inject(..., tk=...) or "
            "let inject load it")
