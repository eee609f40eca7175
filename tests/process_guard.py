"""One test's broken CUDA context fails that test alone (a pytest plugin; conftest loads it).

A device-side assert, an illegal address or any other sticky CUDA error leaves the process's CUDA
context unusable: every later CUDA call in that process fails. Two guards keep that from failing
every test after it:

* Tests marked ``isolated``, and every ``large`` test, run in a child pytest process of their own;
  the parent reports the child's outcome (a crash of the child is that test's failure, with the
  child's output). ``large`` tests also take a machine-wide lock, so that under xdist they run one at
  a time instead of skipping for each other's memory.
* After every test of a process where CUDA is initialized, the context is probed. If it is
  poisoned, the process stops with a message naming the test that poisoned it: an xdist worker
  exits (xdist reports that test as crashed and starts a fresh worker for the tests left), a
  single process ends the session (``pytest.exit``).

Standard library and pytest only; torch is read from ``sys.modules`` where a test imported it.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CHILD_ENV = "TK_ISOLATED_CHILD"  # set in the child: run the test here, report to this file
RESULT_ENV = "TK_ISOLATED_RESULT"
TIMEOUT_ENV = "TK_ISOLATED_TIMEOUT"
DEFAULT_TIMEOUT_S = 900
POISONED_EXIT_CODE = 3
LARGE_LOCK = Path(tempfile.gettempdir()) / "transformer-kernels-large-tests.lock"
OUTPUT_TAIL_CHARS = 6000


def cuda_context_error() -> str | None:
    """The sticky error a synchronize reports, or None (also where CUDA was never initialized)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
        return None
    except RuntimeError as error:  # torch raises RuntimeError (torch.AcceleratorError) for CUDA errors
        return str(error).strip().splitlines()[0]


_probe = cuda_context_error


def set_probe(probe) -> None:
    """Replaces the context probe (tests plant a sticky-error stand-in on machines without a GPU)."""
    global _probe
    _probe = probe


def in_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def runs_in_child(item: pytest.Item) -> bool:
    """True in the parent for a test that runs in a child process of its own."""
    return not in_child() and (item.get_closest_marker("isolated") is not None
                               or item.get_closest_marker("large") is not None)


def pytest_configure(config):
    config.addinivalue_line("markers", "isolated: runs in a child pytest process of its own (a test that can leave "
                                       "the CUDA context unusable); every `large` test does too")


# ---- the parent: run the test in a child, report its outcome ----

def _child_command(item: pytest.Item) -> list[str]:
    return [sys.executable, "-m", "pytest", item.nodeid, "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
            "--no-header", "-rN", f"--rootdir={item.config.rootpath}", "-c", str(item.config.inipath or os.devnull)]


def _child_env(result_file: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTEST_XDIST") and k not in ("PYTEST_ADDOPTS", "TK_FAILURE_LOG")}
    env[CHILD_ENV] = "1"
    env[RESULT_ENV] = result_file
    return env


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def run_in_child(item: pytest.Item) -> None:
    """Runs `item` in a child pytest; passes, skips or fails as the child's test did."""
    timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as f:
        result_file = f.name
    lock = open(LARGE_LOCK, "a") if item.get_closest_marker("large") is not None else None
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            proc = subprocess.run(_child_command(item), cwd=item.config.rootpath, env=_child_env(result_file),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
            output, returncode = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as expired:
            output = expired.stdout or ""
            if isinstance(output, bytes):
                output = output.decode(errors="replace")
            pytest.fail(f"isolated test timed out after {timeout:.0f} s ({TIMEOUT_ENV}) in its child process:\n"
                        f"{output[-OUTPUT_TAIL_CHARS:]}", pytrace=False)
        reports = [json.loads(line) for line in Path(result_file).read_text().splitlines() if line.strip()]
    finally:
        if lock is not None:
            lock.close()  # releases the flock
        Path(result_file).unlink(missing_ok=True)
    failed = [r for r in reports if r["outcome"] == "failed"]
    if failed:
        pytest.fail("in its child process:\n" + "\n".join(f"[{r['when']}] {r['text']}" for r in failed), pytrace=False)
    skipped = [r for r in reports if r["outcome"] == "skipped"]
    if skipped:
        pytest.skip(skipped[0]["text"])
    if returncode != 0:
        pytest.fail(f"its child process ended with {_describe_exit(returncode)}:\n{output[-OUTPUT_TAIL_CHARS:]}",
                    pytrace=False)
    if not any(r["when"] == "call" and r["outcome"] == "passed" for r in reports):
        pytest.fail(f"its child process ran no test:\n{output[-OUTPUT_TAIL_CHARS:]}", pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if runs_in_child(pyfuncitem):
        run_in_child(pyfuncitem)
        return True
    return None


# ---- the child: write each phase's outcome for the parent ----

def pytest_runtest_logreport(report):
    path = os.environ.get(RESULT_ENV)
    if not in_child() or not path:
        return
    if report.skipped and isinstance(report.longrepr, tuple):
        text = report.longrepr[2]
    else:
        text = report.longreprtext
    with open(path, "a") as f:
        f.write(json.dumps({"when": report.when, "outcome": report.outcome, "text": text}) + "\n")


# ---- every process: a poisoned context stops the process, naming the test ----

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    error = _probe()
    if error is None:
        return
    message = (f"{item.nodeid} left the CUDA context unusable ({error}); this process stops here so that the "
               "tests after it do not fail for it")
    sys.stderr.write(f"\n{message}\n")
    failure_log = os.environ.get("TK_FAILURE_LOG")
    if failure_log:
        with open(failure_log, "a") as f:
            f.write(f"=== {item.nodeid} (poisoned the CUDA context)\n{message}\n")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # xdist reports the test whose protocol was running as crashed and replaces the worker
        sys.stderr.flush()
        os._exit(POISONED_EXIT_CODE)
    pytest.exit(message, returncode=POISONED_EXIT_CODE)
