"""The benchmark scripts import each other without cycles (shared pieces live in benchmarks/harness.py)."""

import re

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
