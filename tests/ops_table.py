"""docs/ops.md's table of ops, read: each op's family, public functions and backward column."""

import re

from conftest import ROOT

ROW = re.compile(r"^\| `(\w+)` \| (\w+) \| (.*) \| (yes|no) \|$")


def table() -> dict[str, tuple[str, str, bool]]:
    rows = {}
    for line in (ROOT / "docs" / "ops.md").read_text().splitlines():
        m = ROW.match(line)
        if m:
            op, family, functions, backward = m.groups()
            assert op not in rows, f"{op} listed twice"
            rows[op] = (family, functions, backward == "yes")
    return rows


def public_names(cell: str) -> list[str]:
    """The function names of a table cell: `f` and `f(out=)`; none for (autograd of ...) / (the op alone ...)."""
    if cell.startswith("("):
        return []
    return [name.removesuffix("(out=)") for name in re.findall(r"`([\w.]+(?:\(out=\))?)`", cell)]


def function_ops() -> dict[str, str]:
    """Each public function of the package (and ``layers.X``, a Hub layer's forward) -> the op it
    runs: the first row that names it (a function's ``out=`` form is a later row)."""
    ops: dict[str, str] = {}
    for op, (_, functions, _) in table().items():
        for name in public_names(functions):
            ops.setdefault(name, op)
    return ops
