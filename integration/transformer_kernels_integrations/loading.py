"""Loading the kernel the way users do: through ``kernels``, never by importing the source tree.

From the Hub, ``trust_remote_code=True`` is passed explicitly: ``kernels`` (0.17 on) refuses a
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
        build = local_root(local_build) / "build"
        try:
            return kernels.get_local_kernel(build)
        except FileNotFoundError as e:
            mismatch = _build_for_another_environment(build, e)
            if mismatch is None:
                raise
            raise mismatch from e
    try:
        return kernels.get_kernel(REPO_ID, version=VERSION, trust_remote_code=True)
    except Exception as e:  # the Hub unreachable (no network, an offline cache miss), or the repo refused
        if os.environ.get("LOCAL_KERNELS"):
            mismatch = _build_for_another_environment(local_kernels_build(), e)
            if mismatch is None:
                raise
            raise mismatch from e
        raise RuntimeError(hub_load_failure(e)) from e


def local_kernels_build() -> Path | None:
    """The build/ directory LOCAL_KERNELS names for this repository, if it does."""
    for entry in os.environ.get("LOCAL_KERNELS", "").split(":"):
        repo, _, path = entry.partition("=")
        if repo == REPO_ID and path:
            return Path(path).expanduser() / "build"
    return None


def environment_variant() -> str:
    """The build variant ``kernels`` loads in this environment: the running torch's version and CUDA
    (what tools/build_kernel.py names a build made with this interpreter)."""
    import platform

    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    cuda = "".join(torch.version.cuda.split(".")[:2]) if torch.version.cuda else "none"
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    return f"torch{major}{minor}-cxx11-cu{cuda}-{arch}-linux"


def _build_for_another_environment(build: Path | None, error: BaseException) -> RuntimeError | None:
    """Where `build` holds builds, none of them for this environment's torch: an error saying which it
    holds, which this environment needs and the two ways out (kernels' own message lists the variants
    it rejected, not what to do). None when that is not the failure."""
    if build is None or not build.is_dir():
        return None
    import torch

    variants = sorted(p.name for p in build.iterdir() if (p / "metadata.json").is_file())
    want = environment_variant()
    if not variants or want in variants:
        return None
    built_for = ", ".join(variants)
    torches = sorted({v.split("-")[0] for v in variants})
    pins = " or ".join(f"torch=={t[5]}.{t[6:]}.*" for t in torches if len(t) > 6)
    message = (f"the local build {build} holds {built_for}, none for this environment: torch {torch.__version__} "
               f"(CUDA {torch.version.cuda}) loads {want}. A build is made for the torch of the interpreter that "
               f"runs tools/build_kernel.py: run `python tools/build_kernel.py --archs native` in this environment "
               f"(pip install cmake ninja; nvcc's CUDA must be {torch.version.cuda}), or install the torch the "
               f"build was made for ({pins}). kernels said: {error}")
    return RuntimeError(message)


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
