"""The micro-benchmark cases, one module per op family, gathered into OPS for benchmarks/bench_micro.py.

``benchmarks/micro/<family>.py`` (named as ``csrc/<family>/``) exports ``CASES``: each ``--ops`` name
mapped to ``cases(tk, quick)``, a generator of ``benchmarks.harness.Case``. This loader imports every
module of the package (pkgutil), so a new family's module is found without a list to edit, and
merges their ``CASES``; a name two modules define is an error, never a silent override.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Callable, Iterable, Iterator

from benchmarks.harness import Case

CasesFn = Callable[..., Iterator[Case]]  # cases(tk, quick: bool)

# Modules of shared helpers rather than of a family: they define no cases.
HELPER_MODULES = frozenset({"common"})


def case_modules() -> list[ModuleType]:
    """Every module of this package that defines cases, in name order."""
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if info.name not in HELPER_MODULES)
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


def gather_cases(modules: Iterable[ModuleType]) -> dict[str, CasesFn]:
    """The modules' CASES merged into one mapping; raises ValueError on a name two modules define."""
    ops: dict[str, CasesFn] = {}
    owner: dict[str, str] = {}
    for module in modules:
        if not hasattr(module, "CASES"):
            raise AttributeError(f"{module.__name__} defines no CASES (a helper module goes in HELPER_MODULES)")
        for name, cases in module.CASES.items():
            if name in ops:
                raise ValueError(f"--ops {name!r} is defined twice: by {owner[name]} and by {module.__name__}")
            ops[name], owner[name] = cases, module.__name__
    return ops


OPS = gather_cases(case_modules())
