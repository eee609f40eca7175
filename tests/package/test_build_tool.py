"""tools/build_kernel.py's own logic: variant names, the op-namespace id, arch selection."""

import re
import shutil
import subprocess

import pytest

from tools import build_kernel as bk

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def test_variant_name():
    assert bk.variant_name("2.11.0+cu130", (13, 0)) == "torch211-cxx11-cu130-x86_64-linux"
    assert bk.variant_name("2.9.1", (12, 8)) == "torch29-cxx11-cu128-x86_64-linux"


def test_cmake_architectures_sass_for_each_ptx_for_newest():
    assert bk.cmake_architectures(["7.5", "8.0", "9.0"]) == "75-real;80-real;90"
    assert bk.cmake_architectures(["9.0"]) == "90"


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_unique_id_is_tree_id_and_dirty_flag(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    tree = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD^{tree}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert bk.unique_id(tmp_path) == tree[:7]
    (tmp_path / "untracked.txt").write_text("x\n")  # untracked files do not make the tree dirty
    assert bk.unique_id(tmp_path) == tree[:7]
    (tmp_path / "a.txt").write_text("two\n")
    assert bk.unique_id(tmp_path) == f"{tree[:7]}_dirty"


def test_unique_id_outside_git_is_random_base32(tmp_path):
    ids = {bk.unique_id(tmp_path) for _ in range(3)}
    assert len(ids) == 3 and all(re.fullmatch(r"[a-z2-7]{13}", i) for i in ids)


def test_archs_resolution():
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    every = bk.resolve_archs("all", nvcc)
    assert every and set(every) <= set(bk.RELEASE_CAPABILITIES) and "9.0" in every
    assert bk.resolve_archs("8.0,9.0", nvcc) == ["8.0", "9.0"]
    with pytest.raises(SystemExit, match="does not support"):
        bk.resolve_archs("5.2", nvcc)


def test_variant_cuda_comes_from_torch_and_a_mismatched_nvcc_is_refused():
    assert bk.torch_cuda_version("13.0", (13, 0)) == (13, 0)
    assert bk.variant_name("2.11.0+cu130", bk.torch_cuda_version("13.0", (13, 0))) == "torch211-cxx11-cu130-x86_64-linux"
    # nvcc 13.2 with torch cu130: the build would be named cu132 and kernels (matching torch's 13.0) refuses it
    with pytest.raises(SystemExit, match=r"nvcc is CUDA 13.2 but torch was built with CUDA 13.0.*cu130"):
        bk.torch_cuda_version("13.0", (13, 2))
    with pytest.raises(SystemExit, match="nvcc is CUDA 12.8 but torch was built with CUDA 13.0"):
        bk.torch_cuda_version("13.0", (12, 8))
    with pytest.raises(SystemExit, match="no CUDA support"):
        bk.torch_cuda_version(None, (13, 0))


def test_build_refuses_a_mismatched_nvcc_before_compiling(monkeypatch, tmp_path):
    """The whole build stops at the check (nothing generated), with the message naming both versions."""
    import torch

    monkeypatch.setattr(bk, "nvcc_version", lambda nvcc: (13, 2))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(SystemExit, match="nvcc is CUDA 13.2 but torch was built with CUDA 13.0"):
        bk.build("9.0", root=bk.ROOT)


def test_metadata_archs_as_kernel_builder_writes_them():
    assert bk.metadata_archs(["7.5", "8.0", "9.0", "10.0"]) == ["10.0+PTX", "7.5", "8.0", "9.0"]
    assert bk.metadata_archs(["9.0"]) == ["9.0+PTX"]


def test_digest_and_provenance(tmp_path):
    import base64
    import hashlib

    (tmp_path / "sub").mkdir()
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "_x.abi3.so").write_bytes(b"hello world")
    (tmp_path / "sub" / "m.py").write_text("x = 1\n")
    (tmp_path / "metadata.json").write_text("{}")
    (tmp_path / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    digest = bk.variant_digest(tmp_path)
    # kernel-builder's own test vector for b"hello world" (kernels-data/src/digest.rs)
    assert digest == {"algorithm": "sha256", "files": {
        "_x.abi3.so": "uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek=",
        "sub/m.py": base64.b64encode(hashlib.sha256(b"x = 1\n").digest()).decode()}}
    from kernels._rust import Digest, DigestAlgorithm  # kernel-builder's own hashing, shipped in kernels

    assert Digest.hash_variant(DigestAlgorithm.SHA256, tmp_path).files == digest["files"]
    assert bk.provenance(tmp_path) == {"kernel-builder": {"version": "tools/build_kernel.py"}}  # not a git tree
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "sub/m.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert bk.provenance(tmp_path)["kernel"] == {"commit": head, "dirty": False}


def test_cxx_standard_follows_torch_as_kernel_builder_sets_it():
    assert bk.cxx_standard("2.11.0+cu130") == "17"
    assert bk.cxx_standard("2.12.0") == bk.cxx_standard("2.14.1+cu130") == "20"


def test_quiet_build_shows_ninja_progress_and_the_whole_log_on_failure(capsys):
    import sys

    script = ("print('[1/3] Building CUDA object CMakeFiles/x.dir/work/csrc/norm/norm.cu.o'); "
              "print('nvcc chatter'); print('[2/3] Building CXX object x/torch-ext/torch_binding.cpp.o'); "
              "print('[3/3] Linking CXX shared module _x.abi3.so')")
    bk._run_quiet([sys.executable, "-c", script], env=None)
    out = capsys.readouterr().out.splitlines()
    assert [line.split("  (")[0] for line in out] == ["[1/3] csrc/norm/norm.cu", "[2/3] torch-ext/torch_binding.cpp",
                                                     "[3/3] Linking"]
    assert all(re.search(r"\(\d+ min \d\d s\)$", line) for line in out)
    with pytest.raises(SystemExit, match="command failed"):
        bk._run_quiet([sys.executable, "-c", "print('error: the real reason'); raise SystemExit(2)"], env=None)
    assert "error: the real reason" in capsys.readouterr().err


def test_self_check_reports_the_python_abi_and_manylinux(tmp_path):
    """tools/self_check.py (scripts/main.sh without a GPU) loads the build and prints kernel-abi-check's
    findings: the limited API (which fails it) and manylinux_2_28 (which it reports, naming each newer
    symbol: a local build uses this host's glibc)."""
    import sys
    from pathlib import Path

    root = Path(bk.__file__).resolve().parents[1]
    if not list((root / "build").glob("torch*/metadata.json")):
        pytest.skip("no build under build/")
    pytest.importorskip("kernel_abi_check")
    out = subprocess.run([sys.executable, str(root / "tools" / "self_check.py")], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Python limited API 3.9: ok" in out.stdout
    assert re.search(r"manylinux_2_28 \(kernel-abi-check\): (ok|this local build needs .+GLIBC \d+\.\d+)", out.stdout)


def test_setup_env_is_never_silent_while_pip_works(tmp_path):
    """scripts/main.sh starts with scripts/setup_env.sh, whose pip installs (the torch and CUDA wheels)
    took two silent minutes: its with_heartbeat prints a line every TK_HEARTBEAT_S seconds while a step
    runs, stops with it, and keeps the step's exit status."""
    from pathlib import Path

    script = Path(bk.__file__).resolve().parents[1] / "scripts" / "setup_env.sh"
    body = re.search(r"^with_heartbeat\(\) \{.*?^\}", script.read_text(), re.S | re.M).group(0)
    run = subprocess.run(["bash", "-c", f'set -euo pipefail\n{body}\nwith_heartbeat "waiting" sleep 2.5\n'
                          'with_heartbeat "failing" false || echo "rc=$?"\nsleep 1.5'],
                         capture_output=True, text=True, env={"TK_HEARTBEAT_S": "1", "PATH": "/usr/bin:/bin"})
    lines = run.stderr.splitlines()
    assert run.returncode == 0 and run.stdout.strip() == "rc=1", (run.stdout, run.stderr)
    assert 2 <= sum(line.startswith("setup_env: still waiting (") for line in lines) <= 3, lines
    assert not any("still failing" in line for line in lines), lines  # stopped with its step
