"""Loads the built kernel the way users do (kernels + LOCAL_KERNELS) and gates GPU tests."""

from pathlib import Path

import pytest
import torch

from transformer_kernels_integrations.loading import REPO_ID, ROOT, load_kernel, use_local_build

BUILD_HINT = "build it first: `python tools/build_kernel.py` (scripts/test.sh does it for you)"

# Point the Hub loader at this checkout before `kernels` reads the variable (it caches it).
use_local_build()

HAS_GPU = torch.cuda.is_available()
GPU_SKIP_REASON = "needs an NVIDIA GPU: torch.cuda.is_available() is False on this machine"


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def built_variants() -> list[Path]:
    return sorted(p for p in (ROOT / "build").glob("torch*") if (p / "metadata.json").exists())


@pytest.fixture(scope="session")
def variant_dir() -> Path:
    variants = built_variants()
    if not variants:
        pytest.fail(f"no build under {ROOT / 'build'}; {BUILD_HINT}")
    return variants[-1]


@pytest.fixture(scope="session")
def tk(variant_dir):
    """The kernel module, loaded through the Hub code path with LOCAL_KERNELS."""
    return load_kernel()


@pytest.fixture
def device() -> str:
    return "cuda"
