"""Facts the README, CARD.md and docs state that drift as the project changes, checked against their
sources: the archs the build ships (tools/build_kernel.py's RELEASE_CAPABILITIES, and the built
metadata.json of a build for every arch) and the test count the README gives."""

import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from tools import build_kernel as bk

CAPABILITY = re.compile(r"\b(\d{1,2}\.\d)\b")


def stated_capabilities(path, sentence_start: str, sentence_end: str) -> list[str]:
    text = " ".join((ROOT / path).read_text().split())
    start = text.index(sentence_start)
    end = text.index(sentence_end, start)
    # capabilities named as a GPU that runs another's SASS ("8.9, run it") are not shipped
    return [c for c in CAPABILITY.findall(text[start:end]) if not re.search(rf"{re.escape(c)}, run it", text[start:end])]


@pytest.mark.parametrize("path,start,end", [
    ("README.md", "`--archs all` (default) builds", "(SASS"),
    ("CARD.md", "SASS for compute capabilities", "and PTX of the newest"),
    ("docs/gpus.md", "The build ships SASS for", "and PTX of the"),
])
def test_the_stated_archs_are_the_ones_the_build_ships(path, start, end):
    assert stated_capabilities(path, start, end) == bk.RELEASE_CAPABILITIES, path


def test_a_build_for_every_arch_lists_them_in_its_metadata():
    built = sorted((ROOT / "build").glob("torch*/metadata.json"))
    if not built:
        pytest.skip("no build under build/")
    archs = json.loads(built[0].read_text())["backend"]["archs"]
    if len(archs) == 1:
        pytest.skip(f"a one-arch build ({archs}); CI's build for every arch is checked")
    assert [a.removesuffix("+PTX") for a in sorted(archs, key=lambda a: tuple(map(int, a.split("+")[0].split("."))))] \
        == bk.RELEASE_CAPABILITIES


def test_the_readme_gives_the_suite_s_test_count():
    stated = re.search(r"The suite collects (\d+) tests", (ROOT / "README.md").read_text())
    assert stated, "README.md no longer states the test count"
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True).stdout
    collected = re.search(r"(\d+) tests? collected", out)
    assert collected, out[-2000:]
    assert int(stated.group(1)) == int(collected.group(1)), (
        f"README.md says {stated.group(1)} tests; `pytest --collect-only` collects {collected.group(1)} here")


# The README's names of the micro cases whose results of record predate the cases' renames
# (benchmarks/NOTES.md §Method, "Case names").
RECORD_NAMES = {"apply_rotary_pos_emb": "rope (hf neox)", "rotary_embedding (vLLM)": "rope (vllm cached, in place)",
                "flux_rope": "rope (flux interleaved)", "ltx_rope": "rope (ltx interleaved)",
                "ltx_rope_from_coords": "rope (ltx from coords)", "ltx_qk_norm_rope": "qk_norm_rope (ltx)",
                "hf_qk_norm_rope (Qwen3-8B)": "qk_norm_rope (qwen3)"}
ROW = re.compile(r"^\| (?P<case>[^|]+?) \| (?P<ours>\d+) GB/s \((?P<pct>\d+) %\) \| (?P<impl>[a-z ]+?) (?P<base>\d+) \| "
                 r"(?P<ratio>[\d.]+)× \|$", re.MULTILINE)


def test_the_readme_s_micro_results_are_the_committed_ones():
    """Every GB/s row of the README's results table is in the micro-benchmark results of record it
    cites: ours (GB/s and % of copy) and the named baseline of the same case, and their ratio."""
    readme = (ROOT / "README.md").read_text()
    cited = re.search(r"benchmarks/results/(micro-[\w.-]+)\.md", readme)
    records = json.loads((ROOT / "benchmarks" / "results" / f"{cited.group(1)}.json").read_text())["results"]
    rows = list(ROW.finditer(readme))
    assert len(rows) >= 15, "the README's results table changed its format"
    for row in rows:
        case = row["case"]
        name = next((RECORD_NAMES[k] for k in RECORD_NAMES if case.startswith(k + " ")), case.split(" ")[0])
        ours = [r for r in records if r["impl"] == "ours" and (r["op"] == name or r["op"].startswith(name + " "))
                and round(r["gbps"]) == int(row["ours"]) and round(r["pct_copy"]) == int(row["pct"])]
        assert ours, f"README row {case!r}: no 'ours' record of {name!r} at {row['ours']} GB/s ({row['pct']} %)"
        group = [r for r in records if (r["op"], r["shape"], r["dtype"]) == (ours[0]["op"], ours[0]["shape"],
                                                                               ours[0]["dtype"])]
        base = [r for r in group if r["impl"] == row["impl"] and round(r["gbps"]) == int(row["base"])]
        assert base, f"README row {case!r}: no {row['impl']} record at {row['base']} GB/s in the same case"
        assert float(row["ratio"]) == round(ours[0]["gbps"] / base[0]["gbps"], 2), f"README row {case!r}: ratio"


def python_snippets(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def test_every_python_snippet_of_the_readme_and_the_card_compiles_and_imports_what_exists():
    """The README's and the rendered card's Python snippets parse, and every name they import from
    the project's packages (and from kernels, transformers) exists: a renamed function or module
    breaks the docs here, not for a new user. (Running them needs a GPU and the Hub.)"""
    import ast
    import importlib

    jinja2 = pytest.importorskip("jinja2")
    from test_card import card_context

    card = jinja2.Environment(trim_blocks=True).from_string((ROOT / "CARD.md").read_text()).render(**card_context())
    snippets = python_snippets((ROOT / "README.md").read_text()) + python_snippets(card)
    assert len(snippets) >= 8
    sys.path.insert(0, str(ROOT / "integration"))
    for snippet in snippets:
        tree = ast.parse(snippet)  # a SyntaxError names the snippet's line
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in (
                    "transformer_kernels_integrations", "kernels", "transformers"):
                module = pytest.importorskip(node.module) if node.module.split(".")[0] != "transformer_kernels_integrations" \
                    else importlib.import_module(node.module)
                missing = [a.name for a in node.names if not hasattr(module, a.name)]
                assert not missing, f"`from {node.module} import {', '.join(missing)}`: no such name\n{snippet}"
