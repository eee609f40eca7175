"""The examples: each runs as one command, documents itself, and without a GPU says so instead of
failing somewhere inside a model."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = sorted(p for p in (Path(__file__).resolve().parent.parent / "examples").glob("*.py")
                  if not p.name.startswith("_"))  # _cli.py: their shared command-line setup


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_help(example):
    done = subprocess.run([sys.executable, str(example), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and "python examples/" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given on a machine without a GPU")
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_without_gpu_says_a_gpu_is_needed(example):
    args = ["--random-weights"] if example.name != "hub_get_kernel.py" else ["--local-build"]
    done = subprocess.run([sys.executable, str(example), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "runs on NVIDIA GPUs" in done.stderr
