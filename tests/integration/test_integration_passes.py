"""The engine (patching.py) and its passes: a feature applied after the rules (FP8) is a ``Pass`` the
rule tables carry, whose keywords inject takes from its declaration; the engine imports no feature."""

import ast
import types

import pytest
import torch

from conftest import ROOT
from transformer_kernels_integrations import patching
from transformer_kernels_integrations.patching import InjectionReport, Option, Pass, RuleTable, inject_models

PACKAGE = ROOT / "integration" / "transformer_kernels_integrations"
# What the engine may import from its package: the machinery it runs (merges), and the kernel's loader.
ENGINE_IMPORTS = {"merging", "loading"}


def test_the_engine_imports_no_feature():
    """patching.py imports nothing of its package but the merge machinery and the loader (anywhere in
    the file, function bodies included): no feature module (fp8), no model family."""
    tree = ast.parse((PACKAGE / "patching.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            imported |= {node.module} if node.module else {alias.name for alias in node.names}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            assert not any(n and n.startswith("transformer_kernels_integrations") for n in names), names
    assert imported <= ENGINE_IMPORTS, imported - ENGINE_IMPORTS
    features = {p.stem for p in PACKAGE.glob("*.py") if "Pass(" in p.read_text() and p.stem != "patching"}
    assert "fp8" in features and not imported & features


def toy_table(applied: list, devices=("cpu",)) -> RuleTable:
    """A table without rules whose one pass ("toy", option toy_level: an int) marks each Linear."""

    def apply(model, prefix, inj, options):
        applied.append((prefix, options, inj.kernel_devices()))
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        inj.report.extras["toy"]["marked"] += len(linears)
        return len(linears)

    def check(tk, models, training):
        if training:
            raise ValueError("toy is for inference")

    def level(value):
        if not isinstance(value, int):
            raise TypeError(f"takes an int, got {value!r}")
        return value

    toy = Pass(switch="toy", kind="toy_linear", what="the toy marks", ops=("toy_op",), apply=apply,
               options=(Option("level", 1, level),), check=check, fallback="never",
               extras=lambda: {"marked": 0}, describe=lambda r: f"toy: {r['marked']} marked" if r["marked"] else None)
    return RuleTable((), passes=(toy,), kernel_devices=lambda: devices)


def test_a_pass_is_switched_checked_applied_and_reported_by_the_engine():
    applied = []
    table = toy_table(applied)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval()
    tk = types.SimpleNamespace(toy_op=lambda: None)
    report = inject_models([("m", model, table)], tk, keywords={}, tables=(table,))
    assert applied == [] and report.extras == {"toy": {"marked": 0}} and "toy" not in str(report)
    patching.uninject_models([model])
    report = inject_models([("m", model, table)], tk, keywords={"toy": True, "toy_level": 3}, tables=(table,))
    assert applied == [("m", {"level": 3}, ("cpu",))]  # the table's devices reach the pass
    assert report.replaced == {"toy_linear": 2} and report.ops == {"toy_linear": ("toy_op",)}
    assert report.fallbacks == {"toy_linear": "never"} and report.toy_marked == 2
    assert "toy: 2 marked" in str(report).splitlines()
    patching.uninject_models([model])
    refused = [
        ({"toy_level": 2}, ValueError, r"inject: toy_level is given but toy is off \(toy=True turns the toy marks on\)"),
        ({"toy": "on"}, TypeError, "inject: toy takes True or False, got 'on'"),
        ({"toy": True, "toy_level": "high"}, TypeError, "inject: toy_level takes an int, got 'high'"),
        ({"toy_size": 1}, TypeError, r"unknown switch\(es\) \['toy_size'\]; the switches are \[\], and the passes "
                                     r"\(off unless given True\) toy \(the toy marks; options toy_level\)")]
    for keywords, error, message in refused:
        with pytest.raises(error, match=message):
            inject_models([("m", model, table)], tk, keywords=keywords, tables=(table,))
    with pytest.raises(ValueError, match="toy is for inference"):
        inject_models([("m", model, table)], tk, keywords={"toy": True}, tables=(table,), training=True)
    with pytest.raises(ValueError, match=r"inject: toy=True needs the kernel's toy_op; this build lacks it"):
        inject_models([("m", model, table)], types.SimpleNamespace(), keywords={"toy": True}, tables=(table,))
    assert not hasattr(model, patching.UNDO_ATTR) and len(applied) == 1  # nothing patched by a refused call


def test_the_report_reads_extras_by_switch_and_key():
    report = InjectionReport(extras={"toy": {"marked": 3}}, describe={"toy": lambda r: f"toy: {r['marked']}"})
    assert report.toy_marked == 3 and "toy: 3" in str(report)
    for missing in ("toy_size", "fp8_layers", "_private"):
        with pytest.raises(AttributeError):
            getattr(report, missing)
