"""The integration package installs with pip (a pure-Python setuptools build) and imports from any
directory; installed outside a clone it has no checkout and asks where a local build is."""

import subprocess
import sys
import tomllib

from conftest import ROOT


def test_pyproject_is_a_pure_python_build():
    project = tomllib.loads((ROOT / "integration" / "pyproject.toml").read_text())
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    assert not any("torch" in r for r in project["build-system"]["requires"]), "nothing compiled against torch"
    assert project["project"]["name"] == "transformer-kernels-integrations"
    assert project["tool"]["setuptools"]["packages"] == ["transformer_kernels_integrations"]
    assert not (ROOT / "pyproject.toml").exists(), "the root pyproject.toml is kernel-builder's (generated)"


def test_pip_install_and_import_from_another_directory(tmp_path):
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                           str(ROOT / "integration")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    script = (
        "import transformer_kernels_integrations as t\n"
        "from transformer_kernels_integrations import inject, uninject, injected\n"
        "from transformer_kernels_integrations import cuda_graphs, loading, merging\n"
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
