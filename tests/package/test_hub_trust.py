"""trust_remote_code is explicit wherever the Hub is reached: transformer-kernels is not a trusted
Kernel Hub publisher, and kernels 0.17 refuses such a repository without it. (LOCAL_KERNELS and
get_local_kernel never reach the Hub.) Checked in the code users run and copy: every
get_kernel(...) / LayerRepository(...) call in the examples, the integration package, and the
code blocks of README.md, CARD.md and docs/."""

import ast
import re

import pytest

from conftest import ROOT

HUB_CALLS = {"get_kernel", "LayerRepository"}
CODE = sorted([*(ROOT / "examples").glob("*.py"), *(ROOT / "integration" / "transformer_kernels_integrations").rglob("*.py")])
DOCS = sorted([ROOT / "README.md", ROOT / "CARD.md", *(ROOT / "docs").glob("*.md")])


def untrusted_calls(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in HUB_CALLS and "trust_remote_code" not in {k.arg for k in node.keywords}:
                found.append(ast.unparse(node)[:80])
    return found


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_code(path):
    assert not untrusted_calls(path.read_text()), path.name


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_code_blocks(path):
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
    # the card's template placeholders are not Python: fill them as kernel-builder would
    blocks = [re.sub(r"\{\{ *(\w+) *\}\}", lambda m: "1" if m.group(1) == "version" else "org/repo", b) for b in blocks]
    missing = [call for block in blocks for call in untrusted_calls(block)]
    assert not missing, f"{path.name}: Hub calls without trust_remote_code: {missing}"
