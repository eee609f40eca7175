"""Loads the built kernel the way users do (kernels + LOCAL_KERNELS) and gates GPU tests.

Imports only the standard library, torch, pytest and kernels: kernel-builder's Nix runner
(``nix run .#ci-test``) collects ``tests/`` from a source set that holds only ``tests/**/*.py``,
``torch-ext`` and the kernel sources, sets LOCAL_KERNELS itself and runs ``pytest -m kernels_ci``.
There the modules that need the rest of the checkout (reference/, integration/, tools/,
benchmarks/) are not collected; the ``kernels_ci`` tests import only the kernel package.
"""

import os
import random
import re
import sys
import tomllib
import warnings
import zlib
from pathlib import Path

import pytest
import torch

import process_guard
from cuda_poison import poison_cuda_cache

ROOT = Path(__file__).resolve().parent.parent
with (ROOT / "build.toml").open("rb") as f:
    _GENERAL = tomllib.load(f)["general"]
REPO_ID = _GENERAL["hub"]["repo-id"]
VERSION = _GENERAL["version"]
BUILD_HINT = "build it first: `python tools/build_kernel.py` (scripts/test.sh does it for you)"

# A checkout has reference/; the Nix runner's source set does not (see above).
FULL_CHECKOUT = (ROOT / "reference").is_dir()
KERNELS_CI_MODULES = {"test_kernels_ci.py"}

# Point the Hub loader at this checkout before `kernels` reads the variable (it caches it); the Nix
# runner's own LOCAL_KERNELS is kept.
os.environ.setdefault("LOCAL_KERNELS", f"{REPO_ID}={ROOT}")

HAS_GPU = torch.cuda.is_available()
GPU_SKIP_REASON = "needs an NVIDIA GPU: torch.cuda.is_available() is False on this machine"


def pytest_configure(config):
    # registered here too: the Nix runner has no pytest.ini
    config.addinivalue_line("markers", "kernels_ci: run by kernel-builder's Nix CI (nix run .#ci-test)")
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (skipped elsewhere, with the reason)")
    if not config.pluginmanager.has_plugin("process_guard"):
        config.pluginmanager.register(process_guard, "process_guard")


def pytest_ignore_collect(collection_path, config):
    if not FULL_CHECKOUT and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return collection_path.name not in KERNELS_CI_MODULES
    return None


def pytest_collection_modifyitems(config, items):
    """Without a GPU, GPU tests skip with the reason. TK_ONLY_NODEIDS=<file> keeps only the node ids
    the file lists (one per line): a whole-suite run cut short by a device call's time limit is
    finished in another call with the ids it did not report (workshop/remaining_nodeids.py)."""
    only = os.environ.get("TK_ONLY_NODEIDS")
    if only:
        wanted = {line.strip() for line in Path(only).read_text().splitlines() if line.strip()}
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
        items[:] = [item for item in items if item.nodeid in wanted]
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


def installed_torch_variant() -> str:
    """The variant directory kernels picks for the installed torch (build/ may also hold others,
    e.g. scripts/build_newest_torch.sh's)."""
    import platform

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    cuda = (torch.version.cuda or "").replace(".", "")
    return f"torch{major}{minor}-cxx11-cu{cuda}-{platform.machine()}-linux"


@pytest.fixture(scope="session")
def variant_dir() -> Path:
    variant = ROOT / "build" / installed_torch_variant()
    if not (variant / "metadata.json").exists():
        pytest.fail(f"no build for the installed torch ({variant.name}) under {ROOT / 'build'}; {BUILD_HINT}")
    return variant


def load_kernel():
    """The kernel through the Hub code path: LOCAL_KERNELS resolves it to the local build."""
    import kernels

    return kernels.get_kernel(REPO_ID, version=VERSION)


@pytest.fixture(scope="session")
def tk():
    """The kernel module, loaded through the Hub code path with LOCAL_KERNELS."""
    if FULL_CHECKOUT and not built_variants():
        pytest.fail(f"no build under {ROOT / 'build'}; {BUILD_HINT}")
    return load_kernel()


@pytest.fixture
def device() -> str:
    return "cuda"


# ---- reliability (stream 7): every test seeded from its node id; CUDA outputs allocated from NaN ----

def node_seed(nodeid: str, seed_file: "str | None" = None) -> int:
    """A stable 32-bit seed of a test's node id (Python's hash() is salted per process), without the
    family folder (tests/norm/test_x.py::t seeds as tests/test_x.py::t): the data each test drew
    before the tests moved into folders, the data of its GPU runs of record. A module whose tests
    moved from another file names that file (``SEED_FILE = "test_rope.py"``): its tests seed as
    they did there."""
    nodeid = re.sub(r"^tests/\w+/(test_\w+\.py::)", r"tests/\1", nodeid)
    if seed_file:
        nodeid = re.sub(r"^tests/test_\w+\.py::", f"tests/{seed_file}::", nodeid)
    return zlib.crc32(nodeid.encode())


@pytest.fixture(autouse=True)
def seed_from_node_id(request):
    """Every test draws its random data from a seed of its own node id, so its inputs do not depend
    on which tests ran before it (or on -k / -x / xdist) and a failure reruns with the same data."""
    seed = node_seed(request.node.nodeid, getattr(getattr(request.node, "module", None), "SEED_FILE", None))
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
            or request.node.get_closest_marker("no_poison") or process_guard.runs_in_child(request.node)):
        yield
        return
    segments = poison_cuda_cache()
    yield
    grown = torch.cuda.memory_stats().get("segment.all.allocated", 0) - segments
    if grown:
        warnings.warn(f"{request.node.nodeid} allocated {grown} segment(s) past the NaN poison: outputs placed "
                      "there were not poisoned", stacklevel=1)


@pytest.fixture(autouse=True)
def restore_process_wide_swaps():
    """inject() replaces functions of transformers' modeling modules for the whole process
    (apply_rotary_pos_emb) until the last injected model is uninjected: a test that leaves a model
    injected (most GPU tests do) would hand that swap, and its kernel, to every later test of the
    process (the H200 run's CPU training tests got the CUDA kernel's RoPE that way, and a later
    "eager" model would run ours). Undone after each test; imports nothing (the integration package
    only where a test loaded it)."""
    yield
    patching = sys.modules.get("transformer_kernels_integrations.patching")
    if patching is not None:
        patching.restore_global_swaps()


@pytest.fixture
def stand_ins_take_cpu_tensors(monkeypatch):
    """CPU tests inject eager stand-ins that take CPU tensors: the diffusers rules' device guard
    (diffusers_models.KERNEL_DEVICES, the GPU's) counts the CPU as a kernel device for them, as the
    transformers tests widen transformers_models.KERNEL_DEVICES. Imports the integration package
    only where a test uses it."""
    from transformer_kernels_integrations import diffusers_models

    monkeypatch.setattr(diffusers_models, "KERNEL_DEVICES", ("cuda", "cpu"))


def pytest_runtest_logreport(report):
    """With TK_FAILURE_LOG set, each failure's traceback is appended to that file as it happens (also
    from xdist workers' reports), so a run cut short by a time limit still says why tests failed."""
    path = os.environ.get("TK_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n")
