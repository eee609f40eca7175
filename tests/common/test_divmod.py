"""Row addressing arithmetic on the host (no GPU): FastDivmod against / and % over divisors and
numerators up to 2^31 - 1, and RowIndexer's 32-bit fast path against its 64-bit division over
random strided layouts, and no fast path (no divider of 0) for empty layouts. Compiles
tests/host/divmod_check.cu with nvcc."""

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT


def test_fast_divmod_and_row_indexer_fast_path_match_exact_division(tmp_path: Path):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        pytest.skip("needs nvcc to compile the host check")
    exe = tmp_path / "divmod_check"
    subprocess.run([nvcc, "-std=c++17", "-O2", "-I", str(ROOT / "csrc"), "-o", str(exe),
                    str(ROOT / "tests" / "host" / "divmod_check.cu")], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
