"""The test registries follow the family (issue 41): a new op edits only its family's test files.

Every family of csrc/*/ops.h keeps its catalog entries, eager stand-ins and reliability cases in
tests/<family>/ (tests/families.py), each naming only its own ops; the central files that gather
them (the catalog, the eager kernel, the reliability tests) name no op of docs/ops.md's table."""

import ast
import re
import sys
import types

import pytest

import families
from conftest import ROOT
from ops_table import table

# The files that gather the families' registries, or iterate them: no op of the table is named in a
# string literal there (docstrings aside), so that adding an op never edits them.
CENTRAL = ["tests/op_catalog.py", "tests/eager_kernel.py", "tests/families.py", "tests/reliability_inputs.py",
           "tests/reliability/test_cuda_graphs.py", "tests/reliability/test_reliability_ops.py",
           "tests/reliability/test_fakes_check_like_kernels.py", "tests/reliability/test_reliability_validation.py",
           "tests/reliability/test_inplace_versions.py"]

# (file, the top-level function or assignment holding the literal) -> the ops it may name. Only tests
# of a mechanism that take one op as their example: adding an op never edits these.
ALLOWED = {
    # the fakes' device check: a CPU tensor beside a meta one is refused, named by the op's message
    ("tests/reliability/test_fakes_check_like_kernels.py", "test_a_cpu_tensor_beside_a_meta_one_is_refused_not_faked"):
        {"rms_norm", "linear_fp8"},
    # the script compiling a deep graph of two ops (inductor's implicit fallback hang)
    ("tests/reliability/test_fakes_check_like_kernels.py", "DEEP_CHAIN"): {"rms_norm", "gated_add"},
}


def docstrings(tree) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def scope_name(node) -> str:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return ",".join(t.id for t in targets if isinstance(t, ast.Name)) or f"line {node.lineno}"


def op_names_in_literals(source: str, ops) -> list[tuple[str, str, str]]:
    """(scope, op, literal) for each string literal (not a docstring) with an op's name as a word:
    an entry ("rms_norm[fp32_weight]"), a case ("rms_norm/decode"), a message ("rms_norm: x must ...")."""
    tree = ast.parse(source)
    skip = docstrings(tree)
    found = []
    for top in tree.body:
        for node in ast.walk(top):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                for word in sorted(set(re.findall(r"[A-Za-z_]\w*", node.value)) & ops):
                    found.append((scope_name(top), word, node.value))
    return found


def test_every_family_has_its_registries():
    """tests/<family>/<family>_cases.py, _eager.py and _reliability.py for every csrc/<family>/ops.h."""
    names = families.family_names()
    assert {"norm", "rope", "gemm"} <= set(names), names
    missing = [str(families.module_path(f, part).relative_to(ROOT)) for f in names for part in families.PARTS
               if not families.module_path(f, part).is_file()]
    assert not missing, f"families without their registries: {missing}"


def test_a_missing_registry_is_named(monkeypatch):
    monkeypatch.setattr(families, "family_names", lambda: ["norm", "newfamily"])
    with pytest.raises(FileNotFoundError, match=r"create tests/newfamily/newfamily_cases\.py"):
        families.gathered("cases", "CASES")


def test_a_key_two_families_define_is_refused(monkeypatch):
    modules = {"a": types.SimpleNamespace(IMPLS={"op": 1}), "b": types.SimpleNamespace(IMPLS={"op": 2})}
    monkeypatch.setattr(families, "family_names", lambda: ["a", "b"])
    monkeypatch.setattr(families, "family_module", lambda family, part: modules[family])
    with pytest.raises(ValueError, match=r"IMPLS\['op'\] is defined by the a family and by the b family"):
        families.gathered("eager", "IMPLS")


@pytest.mark.parametrize("path", CENTRAL)
def test_central_test_files_name_no_op(path):
    """An op's entries, stand-ins and special cases are its family's: the files that gather them name
    no op (ALLOWED: the few tests of a mechanism that take one op as their example)."""
    found = op_names_in_literals((ROOT / path).read_text(), set(table()))
    named = sorted({(scope, op) for scope, op, _ in found if op not in ALLOWED.get((path, scope), set())})
    assert not named, f"{path} names ops of docs/ops.md's table (move them to tests/<family>/): {named}"
    for (file, scope), ops in ALLOWED.items():
        if file == path:
            assert ops <= {op for s, op, _ in found if s == scope}, f"ALLOWED[{file}, {scope}] is no longer used"


def test_the_check_sees_an_op_name_and_skips_docstrings():
    source = '"""rms_norm in a docstring."""\n\nCASES = {"rms_norm[fp32]": 1}\n\n\ndef f():\n    """rope."""\n' \
             '    return "rope_/x", "layer_norm: x must be", "norm"\n'
    assert [(s, op) for s, op, _ in op_names_in_literals(source, {"rms_norm", "rope_", "layer_norm", "rope"})] == [
        ("CASES", "rms_norm"), ("f", "rope_"), ("f", "layer_norm")]


def test_each_family_registers_only_its_own_ops():
    """A family's stand-ins, CUDA-graph cases and empty-width results are of its ops (docs/ops.md's
    family column); its catalog entries are checked by test_ops_table."""
    rows = table()
    wrong = []
    for family in families.family_names():
        eager, reliability = families.family_module(family, "eager"), families.family_module(family, "reliability")
        ops = [*getattr(eager, "IMPLS", {}), *getattr(eager, "BACKWARD", {}), *getattr(eager, "IN_PLACE", {}),
               *(name.split("/")[0] for name in getattr(reliability, "CUDA_GRAPH_CASES", {})),
               *getattr(reliability, "EMPTY_WIDTH_RESULTS", {})]
        wrong += [(family, op, rows.get(op, ("no op",))[0]) for op in ops if rows.get(op, ("",))[0] != family]
    assert not wrong, f"(family, op, the op's family): {wrong}"


def test_family_modules_are_one_object_whoever_imports_them():
    """A family's module imported by its folder's tests (``from rope_cases import ...``) is the one
    the loaders use."""
    module = families.family_module("rope", "cases")
    assert sys.modules["rope_cases"] is module and families.family_module("rope", "cases") is module
