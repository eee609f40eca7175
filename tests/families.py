"""The op families and their test registries, found rather than listed.

A family is a folder of csrc/ with an ops.h (as the build, the Python package and the benchmarks
count them). Each keeps its test registries in its test folder, named after it:

- ``tests/<family>/<family>_cases.py``: its catalog entries (``entries()``), gathered by op_catalog;
- ``tests/<family>/<family>_eager.py``: its ops' eager CPU stand-ins (``IMPLS``, ``BACKWARD``),
  gathered by eager_kernel;
- ``tests/<family>/<family>_reliability.py``: its special cases of the reliability tests (CUDA-graph
  shapes, bad inputs, limits), each a dict the test of that name gathers.

A family's module is imported by its file under its own name (``rope_cases``), as pytest imports
the modules of a test folder: it is one object whether a test of the folder, another family's
module or a loader imports it first. A module or test of a family that needs another family's
(qk_norm_rope's of rope's, the declared composition: ``family_module("rope", "cases")``, and the
rope property tests' shared pieces, ``rope_properties``) asks ``family_module`` for it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
PARTS = ("cases", "eager", "reliability")


def family_names() -> list[str]:
    """Every family: the folders of csrc/ with an ops.h, in name order."""
    return sorted(header.parent.name for header in (ROOT / "csrc").glob("*/ops.h"))


def module_path(family: str, part: str) -> Path:
    return TESTS / family / f"{family}_{part}.py"


def family_module(family: str, part: str) -> ModuleType:
    """tests/<family>/<family>_<part>.py, imported once per process as ``<family>_<part>``."""
    name, path = f"{family}_{part}", module_path(family, part)
    module = sys.modules.get(name)
    if module is not None:
        if Path(module.__file__).resolve() != path:
            raise ImportError(f"{name} is already imported from {module.__file__}, not from {path}")
        return module
    if not path.is_file():
        raise FileNotFoundError(f"the {family} family (csrc/{family}/ops.h) has no {part} module: create "
                                f"{path.relative_to(ROOT)}")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def gathered(part: str, attr: str) -> dict:
    """The dicts ``attr`` of every family's ``part`` module merged (a family without one adds nothing);
    a key two families define is an error, never a silent override."""
    merged: dict = {}
    owner: dict = {}
    for family in family_names():
        for key, value in getattr(family_module(family, part), attr, {}).items():
            if key in merged:
                raise ValueError(f"{attr}[{key!r}] is defined by the {owner[key]} family and by the {family} family")
            merged[key], owner[key] = value, family
    return merged
