"""The cascade guard (tests/process_guard.py), shown on the CPU: a planted sticky-error stand-in for
the CUDA context probe, and isolated tests that crash, fail, skip and pass in their child process.
Each case runs a small pytest session of its own (in a subprocess) and reads its junit XML."""

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parents[1]  # conftest.py and the shared helpers

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS_DIR)!r})
import process_guard

def pytest_configure(config):
    config.pluginmanager.register(process_guard, "process_guard")
"""

POISONING = """
import process_guard

def test_a_poisons():
    process_guard.set_probe(lambda: "CUDA error: device-side assert triggered (planted stand-in)")

{more}
"""

ISOLATED = """
import os
import pytest
import process_guard

@pytest.mark.isolated
def test_crashes():
    os.abort()

@pytest.mark.isolated
def test_fails():
    assert 1 + 1 == 3, "planted failure"

@pytest.mark.isolated
def test_skips():
    pytest.skip("planted reason")

@pytest.mark.isolated
def test_passes_in_child():
    assert os.environ.get("TK_ISOLATED_CHILD") == "1"

@pytest.mark.large
def test_large_passes_in_child():
    assert os.environ.get("TK_ISOLATED_CHILD") == "1"

@pytest.mark.isolated
def test_poisons_its_child():
    process_guard.set_probe(lambda: "CUDA error: an illegal memory access was encountered (planted)")

def test_after_them_in_the_parent():
    assert os.environ.get("TK_ISOLATED_CHILD") is None
"""


def run_session(tmp_path, test_source, *args):
    """Runs pytest on one planted test file; returns (exit code, output, {test name: outcome})."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_planted.py").write_text(textwrap.dedent(test_source))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    large: planted\n")
    junit = tmp_path / "junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "TK_FAILURE_LOG"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}",
                           "-o", "junit_family=xunit1", *args, "test_planted.py"],
                          cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    outcomes = {}
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
            # a test can carry a call failure and a crash report; any failure or error counts
            outcome = ("failed" if {"failure", "error"} & set(kinds) else "skipped" if kinds else "passed")
            if outcomes.get(case.get("name")) != "failed":
                outcomes[case.get("name")] = outcome
    return proc.returncode, proc.stdout, outcomes


def test_poisoned_context_stops_a_single_process_naming_the_test(tmp_path):
    rc, output, outcomes = run_session(tmp_path, POISONING.format(more="def test_b():\n    pass\n"))
    assert rc == 3, output
    assert "test_planted.py::test_a_poisons left the CUDA context unusable" in output, output
    assert "device-side assert triggered (planted stand-in)" in output, output
    assert "test_b" not in outcomes, outcomes  # the session stopped: nothing after it ran (or failed)


def test_poisoned_context_under_xdist_fails_only_that_test(tmp_path):
    pytest.importorskip("xdist")
    more = "\n".join(f"def test_b{i}():\n    pass\n" for i in range(12))
    rc, output, outcomes = run_session(tmp_path, POISONING.format(more=more), "-n", "2")
    assert rc == 1, output
    assert outcomes.pop("test_a_poisons") == "failed", output
    assert outcomes == {f"test_b{i}": "passed" for i in range(12)}, output
    assert "crashed while running 'test_planted.py::test_a_poisons'" in output, output


def test_isolated_tests_report_their_child_outcome(tmp_path):
    rc, output, outcomes = run_session(tmp_path, ISOLATED, "-rA")
    assert outcomes == {
        "test_crashes": "failed",
        "test_fails": "failed",
        "test_skips": "skipped",
        "test_passes_in_child": "passed",
        "test_large_passes_in_child": "passed",
        "test_poisons_its_child": "failed",
        "test_after_them_in_the_parent": "passed",
    }, output
    assert rc == 1, output
    assert "child process ended with killed by SIGABRT" in output, output
    assert "planted failure" in output, output
    assert "planted reason" in output, output
    assert "test_poisons_its_child left the CUDA context unusable" in output, output


def test_a_hanging_isolated_test_times_out(tmp_path):
    source = "import time, pytest\n\n@pytest.mark.isolated\ndef test_hangs():\n    time.sleep(60)\n"
    os.environ["TK_ISOLATED_TIMEOUT"] = "5"
    try:
        rc, output, outcomes = run_session(tmp_path, source)
    finally:
        del os.environ["TK_ISOLATED_TIMEOUT"]
    assert outcomes == {"test_hangs": "failed"}, output
    assert "timed out after 5 s" in output, output
