"""The examples: each runs as one command, documents itself, and without a GPU says so instead of
failing somewhere inside a model."""

import subprocess
import sys
import pytest
import torch

from conftest import ROOT

EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py")
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


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.py")),
                         ids=lambda p: p.name)
def test_examples_import_nothing_from_benchmarks(example):
    """Examples are what users copy: they use the installed packages, not the benchmark scripts."""
    import ast

    tree = ast.parse(example.read_text())
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    imported += [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
    assert not [m for m in imported if m.split(".")[0] == "benchmarks"], imported
