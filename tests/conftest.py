"""Loads the built kernel the way users do (kernels + LOCAL_KERNELS) and gates GPU tests."""

import os
import random
import warnings
import zlib
from pathlib import Path

import pytest
import torch

from cuda_poison import poison_cuda_cache
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


def pytest_report_header(config):
    """The build the run tests (logs of record then name it): op namespace = git tree + _dirty."""
    import json

    ids = [json.loads((p / "metadata.json").read_text()).get("id", "?") for p in built_variants()]
    return f"kernel build: {', '.join(f'{p.name}: {i}' for p, i in zip(built_variants(), ids)) or 'none'}"


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


# ---- reliability (stream 7): every test seeded from its node id; CUDA outputs allocated from NaN ----

def node_seed(nodeid: str) -> int:
    """A stable 32-bit seed of a test's node id (Python's hash() is salted per process)."""
    return zlib.crc32(nodeid.encode())


@pytest.fixture(autouse=True)
def seed_from_node_id(request):
    """Every test draws its random data from a seed of its own node id, so its inputs do not depend
    on which tests ran before it (or on -k / -x / xdist) and a failure reruns with the same data."""
    seed = node_seed(request.node.nodeid)
    torch.manual_seed(seed)  # every device's generator too
    random.seed(seed)
    return seed


@pytest.fixture(autouse=True)
def poison_outputs(request):
    """GPU tests start with NaN in every free block of the caching allocator (cuda_poison): functional
    outputs are then allocated poisoned, as out= buffers are. Free blocks of segments that hold a
    live tensor (a session-scoped one) cannot be released and keep their old contents; a test that
    allocates past the 1 GiB + 128 MiB of poison is warned about.
    Opt out with @pytest.mark.no_poison (tests that size memory themselves, e.g. the large ones), or
    for a whole run with TK_NO_POISON=1."""
    if (not HAS_GPU or os.environ.get("TK_NO_POISON") == "1" or request.node.get_closest_marker("gpu") is None
            or request.node.get_closest_marker("no_poison")):
        yield
        return
    segments = poison_cuda_cache()
    yield
    grown = torch.cuda.memory_stats().get("segment.all.allocated", 0) - segments
    if grown:
        warnings.warn(f"{request.node.nodeid} allocated {grown} segment(s) past the NaN poison: outputs placed "
                      "there were not poisoned", stacklevel=1)
