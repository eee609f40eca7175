"""The norm launchers' path choice on the host (no GPU): the 16-byte path for rows the vector
divides only, the same path for a contiguous batch of one row as for more (a row's summation order,
so its bits, must not depend on its batch; tests/reliability/test_reliability_determinism.py checks the bits on
the GPU). Compiles tests/host/norm_plan_check.cu with nvcc."""

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT


def test_vector_path_depends_on_the_width_not_the_batch(tmp_path: Path):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        pytest.skip("needs nvcc to compile the host check")
    exe = tmp_path / "norm_plan_check"
    subprocess.run([nvcc, "-std=c++17", "-O2", "--expt-relaxed-constexpr", "-I", str(ROOT / "csrc"), "-o", str(exe),
                    str(ROOT / "tests" / "host" / "norm_plan_check.cu")], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
