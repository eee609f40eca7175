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
