"""The seed's Hub build rules, checked on the sources (no build or GPU needed)."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from tools.build_kernel import BuildConfigError, load_config

PACKAGE = ROOT / "torch-ext" / "transformer_kernels"
SOURCE_SUFFIXES = {".cpp", ".cc", ".cu", ".cuh", ".h", ".hpp", ".py"}
# Patterns the Hub build rejects (regex <TAB> reason); kept as data so this file does not match them.
FORBIDDEN = dict(line.split("\t") for line in
                 (ROOT / "tests" / "fixtures" / "hub_forbidden_patterns.tsv").read_text().splitlines() if line)


def tracked_files() -> list[Path]:
    if shutil.which("git") and (ROOT / ".git").exists():
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True).stdout
        return [ROOT / line for line in out.splitlines() if (ROOT / line).is_file()]
    ignored = {".venv", "build", "_build", ".git", ".whl"}
    return [p for p in ROOT.rglob("*") if p.is_file() and not ignored & set(p.relative_to(ROOT).parts)]


def sources() -> list[Path]:
    return [p for p in tracked_files() if p.suffix in SOURCE_SUFFIXES and "templates" not in p.parts
            and "fixtures" not in p.parts]


@pytest.mark.parametrize("pattern", sorted(FORBIDDEN))
def test_no_forbidden_binding_patterns(pattern):
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in sources()
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if re.search(pattern, line)]
    assert not hits, f"{FORBIDDEN[pattern]}: {hits}"


def test_binding_uses_expand_macros_once():
    text = (ROOT / "torch-ext" / "torch_binding.cpp").read_text()
    assert text.count("TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops)") == 1
    assert text.count("REGISTER_EXTENSION(TORCH_EXTENSION_NAME)") == 1
    assert '#include "registration.h"' in text


def test_no_setup_py_or_extension_building_pyproject():
    assert not (ROOT / "setup.py").exists(), "only kernel-builder may generate a setup.py"
    pyproject = ROOT / "pyproject.toml"
    build_patterns = [p for p, reason in FORBIDDEN.items() if reason == "kernel-builder owns the build"]
    assert not pyproject.exists() or not any(re.search(p, pyproject.read_text()) for p in build_patterns)


def test_generated_files_not_committed():
    tracked = {p.relative_to(ROOT).as_posix() for p in tracked_files()}
    generated = {"torch-ext/registration.h", "torch-ext/transformer_kernels/_ops.py", "metadata.json"}
    assert not tracked & generated
    assert not any(t.startswith(("build/", "_build/")) for t in tracked)


def package_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("module", package_modules(), ids=lambda p: p.name)
def test_package_imports_relative_stdlib_or_torch(module):
    allowed = set(sys.stdlib_module_names) | {"torch"}
    tree = ast.parse(module.read_text())
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.split(".")[0] not in allowed]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module.split(".")[0] not in allowed:
                bad.append(node.module)
    assert not bad, f"{module.name}: imports outside the standard library and torch (use relative imports): {bad}"


@pytest.mark.parametrize("module", package_modules(), ids=lambda p: p.name)
def test_package_is_python39_syntax(module):
    ast.parse(module.read_text(), feature_version=(3, 9))


@pytest.mark.parametrize("module", package_modules(), ids=lambda p: p.name)
def test_package_names_ops_through_generated_namespace(module):
    text = module.read_text()
    assert not re.search(r"torch\.ops\.\w+\.", text), "hard-coded torch.ops.<namespace>: use `from ._ops import ops`"
    # kernel-builder's torch-ops-check: torch.library registrations name ops via add_op_namespace_prefix
    for m in re.finditer(r"torch\.library\.(register_fake|custom_op|register_kernel|register_autograd)\(([^,)]*)", text):
        assert m.group(2).strip().startswith("add_op_namespace_prefix("), m.group(0)


def test_build_toml_is_valid_edition5():
    cfg = load_config(ROOT)
    assert cfg.name == "transformer-kernels" and cfg.python_name == PACKAGE.name
    assert cfg.version == 1 and cfg.license == "Apache-2.0" and cfg.repo_id
    assert all(k["backend"] == "cuda" and "torch" in k["depends"] for k in cfg.kernels.values())
    assert all("cuda-capabilities" not in k for k in cfg.kernels.values()), "do not over-constrain capabilities"


BROKEN_BUILD_TOMLS = {
    "underscore_name": ('name = "transformer-kernels"', 'name = "transformer_kernels"'),
    "no_license": ('license = "Apache-2.0"\n', ""),
    "edition_4": ("edition = 5", "edition = 4"),
    "unknown_key": ('backends = ["cuda"]', 'backends = ["cuda"]\ncolour = "blue"'),
    "no_torch_section": ("[torch]", "[torch-noarch]"),
    "missing_source": ('"csrc/norm/norm.cu"', '"csrc/norm/missing.cu"'),
}


@pytest.mark.parametrize("case", sorted(BROKEN_BUILD_TOMLS))
def test_build_toml_rules_reject(case, tmp_path):
    old, new = BROKEN_BUILD_TOMLS[case]
    text = (ROOT / "build.toml").read_text()
    assert old in text
    (tmp_path / "build.toml").write_text(text.replace(old, new, 1))
    for rel in ("torch-ext", "csrc"):
        shutil.copytree(ROOT / rel, tmp_path / rel)
    with pytest.raises(BuildConfigError):
        load_config(tmp_path)


# ---- one declaration per entry point: csrc/<family>/ops.h ----

def declared_entry_points() -> dict[str, set[str]]:
    """family -> the entry points its csrc/<family>/ops.h declares."""
    found = {}
    for header in sorted((ROOT / "csrc").glob("*/ops.h")):
        text = header.read_text()
        found[header.parent.name] = set(re.findall(r"(\w+)\(\s*(?:const |at::Tensor|std::optional)", text))
    return found


def test_each_family_declares_its_entry_points_once_and_pins_them():
    """Every entry point is declared in its family's ops.h, pinned in one of the family's .cu files
    (kDeclaredEntryPoints: a definition with another signature fails to compile there), and the
    binding includes every ops.h (and no other declaration of them) and registers only declared ones."""
    declared = declared_entry_points()
    assert set(declared) == {"activation", "attention", "gemm", "group_norm", "loss", "norm", "qk_norm_rope", "quant",
                             "rope"}, declared.keys()
    everything = set().union(*declared.values())
    assert sum(len(v) for v in declared.values()) == len(everything), "an entry point declared twice"
    for family, names in declared.items():
        pinned = set()
        for unit in (ROOT / "csrc" / family).glob("*.cu"):
            text = unit.read_text()
            assert f'#include "{family}/ops.h"' in text or "kDeclaredEntryPoints" not in text, unit
            for block in re.findall(r"kDeclaredEntryPoints = std::make_tuple\((.*?)\);", text, re.S):
                pinned |= set(re.findall(r"&(\w+)", block))
        assert pinned == names, f"{family}: declared but not pinned {names - pinned}, pinned but not declared {pinned - names}"
    binding = (ROOT / "torch-ext" / "torch_binding.cpp").read_text()
    assert {f'#include "{family}/ops.h"' for family in declared} <= set(binding.splitlines())
    registered = set(re.findall(r"&tk::(\w+)", binding))
    assert registered == everything, (registered ^ everything)
    assert not (ROOT / "torch-ext" / "torch_binding.h").exists()
