"""docs/ops.md, the table of ops and their public names, checked against the build: every registered
op once, in the family whose ops.h declares its C++ function; its public functions exist; its
backward column is has_backward's answer; and every op has a fake (a Meta kernel)."""

import re

import pytest
import torch

from conftest import ROOT
from ops_table import public_names, table


def registrations() -> dict[str, str]:
    """op -> the C++ function torch_binding.cpp registers for it."""
    text = (ROOT / "torch-ext" / "torch_binding.cpp").read_text()
    return dict(re.findall(r'ops\.impl\("(\w+)", key, &tk::(\w+)\)', text))


def family_of(function: str) -> str:
    for header in (ROOT / "csrc").glob("*/ops.h"):
        if re.search(rf"\b{function}\(", header.read_text()):
            return header.parent.name
    raise AssertionError(f"{function} is declared in no csrc/<family>/ops.h")


def test_every_op_is_listed_once_in_its_family():
    rows, registered = table(), registrations()
    assert set(rows) == set(registered), (sorted(set(registered) - set(rows)), sorted(set(rows) - set(registered)))
    for op, (family, _, _) in rows.items():
        assert family == family_of(registered[op]), f"{op}: listed in {family}, declared in {family_of(registered[op])}"


@pytest.mark.parametrize("op", sorted(table()))
def test_public_functions_backward_and_fake(tk, op):
    family, functions, backward = table()[op]
    for name in public_names(functions):
        target = tk
        for part in name.split("."):
            assert hasattr(target, part), f"{op}: {name} is not in the package"
            target = getattr(target, part)
    assert tk.has_backward(op) is backward, f"{op}: has_backward is {tk.has_backward(op)}, the table says {backward}"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(tk.add_op_namespace_prefix(op), "Meta"), f"{op}: no fake"


def test_the_recipe_names_what_exists():
    """docs/adding-an-op.md names files, functions and types of the code: each path it gives exists,
    and each identifier it gives in backticks is found in the sources (a renamed one makes it false)."""
    recipe = (ROOT / "docs" / "adding-an-op.md").read_text()
    paths = set(re.findall(r"`((?:csrc|tests|benchmarks|torch-ext|reference|workshop|integration|docs)/[\w./<>-]+)`",
                           recipe))
    for path in sorted(paths):
        if "<" in path:  # a pattern (csrc/<family>/)
            continue
        assert (ROOT / path).exists(), f"the recipe names {path}, which does not exist"
    sources = "\n".join(p.read_text() for pattern in ("csrc/**/*.cu", "csrc/**/*.cuh", "csrc/**/*.h",
                                                      "torch-ext/**/*.py", "torch-ext/*.cpp", "tests/**/*.py",
                                                      "integration/**/*.py", "benchmarks/*.py")
                        for p in ROOT.glob(pattern))
    identifiers = {"ElementwiseParams", "ElementwisePolicy", "ActivationBackward", "kDeclaredEntryPoints",
                   "validation_only", "launch_device", "empty_tensor", "register_fake", "register_backward",
                   "refuse_grad", "refuse_the_rest", "dispatch", "has_backward", "training_ops", "assert_every_kind_ran",
                   "activation_float64", "eager_act_mul", "with_poisoned_outputs", "assert_all_written",
                   "assert_within", "assert_matches_eager", "_patch_mlp", "_mlp_skip", "kernel_entry_for",
                   "RowIndexer", "vec_t", "GroupNorm", "LinearGelu", "Rope", "LaunchElementwise", "LaunchNorm",
                   "launch_elementwise_call"}
    for name in sorted(identifiers):
        assert name in recipe, f"{name} is no longer in the recipe: drop it here"
        assert re.search(rf"\b{re.escape(name)}\b", sources), f"the recipe names {name}, found in no source"


def test_python_modules_mirror_the_families():
    """One Python module per C++ family, of the same name (csrc/<family>/ <-> <package>/<family>.py)."""
    families = {p.parent.name for p in (ROOT / "csrc").glob("*/ops.h")}
    modules = {p.stem for p in (ROOT / "torch-ext" / "transformer_kernels").glob("*.py")}
    assert families <= modules, f"families without a module of their name: {sorted(families - modules)}"


def test_catalog_families_are_the_ops_families():
    """Each catalog entry sits in the family that owns its op (docs/ops.md's family column)."""
    import op_catalog as oc

    rows = table()
    wrong = {name: (family, rows[op][0]) for name, (family, op, _) in oc.ENTRIES.items() if rows[op][0] != family}
    assert not wrong, f"catalog entries in another family than their op's: {wrong}"


def test_integration_rules_name_registered_ops():
    """Every integration rule declares the ops it runs (``Rule.ops``) and those it needs a backward
    of, by the names of this table: the rule tables and the ops share one vocabulary."""
    pytest.importorskip("transformer_kernels_integrations")
    from transformer_kernels_integrations import diffusers_models, transformers_models

    rows = table()
    for table_ in (transformers_models.TABLE, diffusers_models.TABLE):
        for rule in table_.all_rules:
            assert rule.ops is not None, f"rule {rule.kind} declares no ops"
            unknown = sorted((set(rule.ops) | set(rule.needs_backward)) - set(rows))
            assert not unknown, f"rule {rule.kind} names ops that are not registered: {unknown}"


def test_tests_are_grouped_by_family():
    """Each op family has its folder of tests (tests/<family>/, as csrc/<family>/ and the Python
    module), and no test module sits loose in tests/ (the shared helpers do)."""
    families = {header.parent.name for header in (ROOT / "csrc").glob("*/ops.h")}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert families <= folders, f"families without a tests/<family>/ folder: {sorted(families - folders)}"
    loose = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    assert not loose, f"test modules outside a folder: {loose}"


# Schema arguments a public function fills in itself (docs/ops.md, "Arguments"): the cross-entropy's
# autograd asks its forward for the gradients only when one is wanted.
FILLED_IN = {"fused_linear_cross_entropy": {"compute_grads"}}


def schema_arguments(tk, op: str) -> list[str]:
    """The op's arguments in schema order, without the output tensors an `_out` form writes (an
    in-place op's written tensors are its inputs)."""
    schema = getattr(tk.ops, op).default._schema
    return [a.name for a in schema.arguments if op.endswith("_") or not (a.alias_info and a.alias_info.is_write)]


@pytest.mark.parametrize("op", sorted(op for op in table() if op in public_names(table()[op][1])))
def test_a_function_named_as_its_op_takes_the_schema_arguments_in_order(tk, op):
    import inspect

    wanted = [name for name in schema_arguments(tk, op) if name not in FILLED_IN.get(op, ())]
    params = list(inspect.signature(getattr(tk, op)).parameters)
    assert params[:len(wanted)] == wanted, f"{op}: the function takes {params}, the schema {wanted}"


def test_fp8_producers_take_their_16_bit_ops_arguments_and_return_codes_and_scale_in_its_place(tk):
    twins = [op for op in table() if op.endswith("_fp8") and op.removesuffix("_fp8") in table()]
    assert {"rms_norm_fp8", "act_mul_fp8", "gated_add_norm_modulate_fp8"} <= set(twins), twins
    for twin in twins:
        base = twin.removesuffix("_fp8")
        assert schema_arguments(tk, twin) == schema_arguments(tk, base), twin
        base_returns = len(getattr(tk.ops, base).default._schema.returns)
        assert len(getattr(tk.ops, twin).default._schema.returns) == base_returns + 1, twin
