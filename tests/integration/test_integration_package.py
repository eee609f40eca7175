"""The integration package installs with pip (a pure-Python setuptools build) and imports from any
directory; installed outside a clone it has no checkout and asks where a local build is."""

import re
import shutil
import subprocess
import sys
import tomllib

import pytest

from conftest import ROOT


def test_pyproject_is_a_pure_python_build():
    project = tomllib.loads((ROOT / "integration" / "pyproject.toml").read_text())
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    assert not any("torch" in r for r in project["build-system"]["requires"]), "nothing compiled against torch"
    assert project["project"]["name"] == "transformer-kernels-integrations"
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["transformer_kernels_integrations*"]
    assert not (ROOT / "pyproject.toml").exists(), "the root pyproject.toml is kernel-builder's (generated)"


# What pip prints when the isolated build environment cannot fetch its build requirements (no network).
OFFLINE = re.compile(r"No matching distribution found for setuptools|Failed to establish a new connection|"
                     r"Network is unreachable|Temporary failure in name resolution|ProxyError|"
                     r"Could not find a version that satisfies the requirement setuptools")


def build_backend_installed() -> bool:
    """The build system integration/pyproject.toml requires (setuptools >= 77), installed here: then
    the build needs no network (--no-build-isolation)."""
    try:
        from importlib.metadata import version
        return int(version("setuptools").split(".")[0]) >= 77
    except Exception:
        return False


def test_pip_install_and_import_from_another_directory(tmp_path):
    target = tmp_path / "site"
    isolation = [] if not build_backend_installed() else ["--no-build-isolation"]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation, "--target",
                           str(target), str(ROOT / "integration")], capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and not isolation and OFFLINE.search(done.stdout + done.stderr):
        pytest.skip("pip could not fetch the build requirement setuptools>=77 (no network to the package index) "
                    "and this environment does not have it installed")
    assert done.returncode == 0, done.stdout + done.stderr
    script = (
        "import transformer_kernels_integrations as t\n"
        "from transformer_kernels_integrations import inject, uninject, injected\n"
        "from transformer_kernels_integrations import cuda_graphs, loading, merging\n"
        "from transformer_kernels_integrations.diffusers_models import ltx, sd\n"
        "from transformer_kernels_integrations.transformers_models import llama, qwen3\n"
        "assert t.__file__.startswith(%r), t.__file__\n"
        "assert loading.ROOT is None\n"
        "try:\n    loading.use_local_build()\nexcept ValueError as e:\n    print('asks:', e)\n"
        "print('switches:', ' '.join(t.SWITCHES))\n" % str(target))
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert "asks: no local build given" in run.stdout and "TRANSFORMER_KERNELS_ROOT" in run.stdout
    assert ("switches: fused_add_rms_norm fused_linear_cross_entropy geglu gelu group_norm layer_norm linear_gelu "
            "merge_projections norm_modulate qk_norm_rope rms_norm rope swiglu") in run.stdout


def test_a_failed_hub_load_says_how_to_use_a_local_build(monkeypatch):
    """No local build named and no network: the Hub's error, chained, under a message that says how to
    point at a local build (the first thing a new user without network meets)."""
    kernels = pytest.importorskip("kernels")
    from transformer_kernels_integrations import loading

    class ConnectError(Exception):  # httpx's, as huggingface_hub raises it offline
        pass

    def offline(*args, **kwargs):
        raise ConnectError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(kernels, "get_kernel", offline)
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    with pytest.raises(RuntimeError, match="could not load transformer-kernels/transformer-kernels") as info:
        loading.load_kernel()
    message = str(info.value)
    assert "ConnectError" in message and "TRANSFORMER_KERNELS_ROOT" in message and "LOCAL_KERNELS" in message
    assert "tools/build_kernel.py" in message and isinstance(info.value.__cause__, ConnectError)
    # with LOCAL_KERNELS set, the user chose the local build: its own error, unchanged
    monkeypatch.setenv("LOCAL_KERNELS", "transformer-kernels/transformer-kernels=/nowhere")
    with pytest.raises(ConnectError):
        loading.load_kernel()


def test_a_build_made_in_this_environment_is_the_one_it_loads(variant_dir):
    """The variant tools/build_kernel.py names a build made with this interpreter is the one the
    integration (and kernels) load here, and the build of this environment loads through the
    integration's own local-build path."""
    import torch

    from tools import build_kernel
    from transformer_kernels_integrations import loading

    cuda = tuple(int(p) for p in torch.version.cuda.split(".")[:2])
    assert loading.environment_variant() == build_kernel.variant_name(torch.__version__, cuda) == variant_dir.name
    tk = loading.load_kernel(local_build=variant_dir.parents[1])
    assert callable(tk.rms_norm)


def test_a_build_for_another_torch_says_which_it_holds_and_how_to_rebuild(tmp_path, monkeypatch, variant_dir):
    """A clone built in one environment (torch 2.11) used from another (torch 2.15, as `pip install
    ./integration` brings today): instead of kernels' bare 'Cannot find a build variant', the error names
    the variants the build holds, the one this torch needs, and the two ways out; kernels' error chained.
    Both ways of pointing at the build: load_kernel(path) and LOCAL_KERNELS."""
    pytest.importorskip("kernels")
    from transformer_kernels_integrations import loading

    other = tmp_path / "build" / "torch299-cxx11-cu130-x86_64-linux"
    other.mkdir(parents=True)
    shutil.copy(variant_dir / "metadata.json", other / "metadata.json")
    expected = (r"holds torch299-cxx11-cu130-x86_64-linux, none for this environment: torch .* loads "
                + re.escape(loading.environment_variant()) + r".*tools/build_kernel.py --archs native.*torch==2\.99\.\*")
    with pytest.raises(RuntimeError, match=expected) as info:
        loading.load_kernel(local_build=tmp_path)
    assert isinstance(info.value.__cause__, FileNotFoundError)
    monkeypatch.setenv("LOCAL_KERNELS", f"{loading.REPO_ID}={tmp_path}")
    with pytest.raises(RuntimeError, match=expected):
        loading.load_kernel()
