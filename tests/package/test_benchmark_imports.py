"""The benchmark scripts import each other without cycles (shared pieces live in benchmarks/harness.py),
and the micro-benchmark cases follow the op families (benchmarks/micro/<family>.py, gathered by
benchmarks/micro/__init__.py)."""

import importlib
import re
import types
from collections import Counter

import pytest

from conftest import ROOT


def benchmark_imports() -> dict[str, set[str]]:
    modules = {p.stem: p.read_text() for p in (ROOT / "benchmarks").glob("*.py")}
    graph = {}
    for name, text in modules.items():
        found = set(re.findall(r"from benchmarks\.(\w+) import", text))
        for group in re.findall(r"from benchmarks import ([\w, ]+)", text):
            found |= {m.strip() for m in group.split(",")}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_benchmark_imports_have_no_cycle():
    graph, done, path = benchmark_imports(), set(), []

    def visit(node):
        assert node not in path, f"import cycle: {' -> '.join(path[path.index(node):] + [node])}"
        if node in done:
            return
        path.append(node)
        for child in sorted(graph[node]):
            visit(child)
        path.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)
    assert graph["harness"] == set(), "the harness imports no benchmark script"


# Op families benchmarked outside benchmarks/micro/, each with where its benchmark lives.
FAMILIES_BENCHMARKED_ELSEWHERE = {
    "loss": "benchmarks/bench_flce.py: the fused linear cross-entropy times a whole LM head, not one op",
}


def micro_case_modules() -> dict[str, object]:
    """Every module of benchmarks/micro/ that defines cases, found by file (not by the loader under test)."""
    from benchmarks.micro import HELPER_MODULES

    names = sorted(p.stem for p in (ROOT / "benchmarks" / "micro").glob("*.py") if p.stem != "__init__")
    return {name: importlib.import_module(f"benchmarks.micro.{name}") for name in names if name not in HELPER_MODULES}


def test_bench_micro_runs_the_union_of_the_families_cases_each_name_once():
    from benchmarks.micro import OPS

    modules = micro_case_modules()
    defined = Counter(name for module in modules.values() for name in module.CASES)
    twice = {name: [m for m, module in modules.items() if name in module.CASES] for name, n in defined.items() if n > 1}
    assert not twice, f"--ops names defined by more than one module: {twice}"
    assert set(OPS) == set(defined), f"loader vs modules: {sorted(set(OPS) ^ set(defined))}"
    for module in modules.values():
        assert all(OPS[name] is cases for name, cases in module.CASES.items()), module.__name__


def test_the_loader_refuses_a_name_two_families_define():
    from benchmarks.micro import gather_cases

    first, second = (types.SimpleNamespace(__name__=name, CASES={"rms_norm": lambda tk, quick: iter(())})
                     for name in ("first", "second"))
    with pytest.raises(ValueError, match="'rms_norm' is defined twice"):
        gather_cases([first, second])


def test_every_op_family_has_its_micro_benchmark_module():
    """csrc/<family>/ops.h <-> benchmarks/micro/<family>.py, as the Python modules mirror the families."""
    families = {p.parent.name for p in (ROOT / "csrc").glob("*/ops.h")}
    missing = sorted(families - set(micro_case_modules()) - set(FAMILIES_BENCHMARKED_ELSEWHERE))
    assert not missing, f"families without benchmarks/micro/<family>.py: {missing}"
    stale = sorted(set(FAMILIES_BENCHMARKED_ELSEWHERE) - families)
    assert not stale, f"FAMILIES_BENCHMARKED_ELSEWHERE names no family: {stale}"
