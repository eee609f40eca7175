"""CARD.md, the kernel card the Hub shows: kernel-builder fills it (minijinja, trim_blocks) with
build.toml's repo-id, version and license, the package's __all__, its layers and whether
benchmarks/benchmark.py exists. Rendered here with jinja2 (the same template syntax)."""

import ast
import tomllib

import pytest

from conftest import ROOT

jinja2 = pytest.importorskip("jinja2")


def card_context() -> dict:
    general = tomllib.loads((ROOT / "build.toml").read_text())["general"]
    package = ROOT / "torch-ext" / general["name"].replace("-", "_")
    init = ast.parse((package / "__init__.py").read_text())
    names = next(ast.literal_eval(n.value) for n in init.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == "__all__" for t in n.targets))
    layers = [n.name for n in ast.parse((package / "layers.py").read_text()).body if isinstance(n, ast.ClassDef)]
    return dict(repo_id=general["hub"]["repo-id"], version=general["version"], license=general["license"].lower(),
                functions=[n for n in names if n != "layers"], layers=layers,
                has_benchmark=(ROOT / "benchmarks" / "benchmark.py").exists(), upstream=None, source=None)


def test_card_renders_with_what_kernel_builder_fills_in():
    context = card_context()
    card = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined).from_string(
        (ROOT / "CARD.md").read_text()).render(**context)
    assert card.startswith("---\nlibrary_name: kernels\nlicense: apache-2.0\n")
    assert f'get_kernel("{context["repo_id"]}", version=1, trust_remote_code=True)' in card
    assert f"kernels benchmark {context['repo_id']} --version 1" in card
    assert all(f"- `{name}`" in card for name in context["functions"] + context["layers"])
    assert "{{" not in card and "{%" not in card


def test_the_card_lists_public_functions_only():
    """The card's function list is the package's __all__ (as kernel-builder fills it): no internal
    plumbing (the op namespace and its prefixer), and every name a function or a module of the package."""
    functions = card_context()["functions"]
    assert not {"ops", "add_op_namespace_prefix"} & set(functions), functions
    assert {"rms_norm", "quantize_fp8", "has_backward"} <= set(functions)
