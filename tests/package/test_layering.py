"""The layering the docs promise (docs/adding-an-op.md, FlashInfer's): kernel headers (*.cuh) and the
instantiation units that compile a family's variants (csrc/*/instances/, csrc/norm/backward/) include
no torch header, directly or through a header of ours, so that they parse no torch per architecture
and the kernels stay callable from the lab (workshop/lab) without torch."""

import re
import sys

import pytest

from conftest import ROOT

CSRC = ROOT / "csrc"
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)
TORCH = re.compile(r"^(ATen|c10|torch)/")


def torch_includes(path, seen=None):
    """The torch headers `path` includes, directly or through our headers (quoted, under csrc/), each
    with the chain of our files that leads to it."""
    seen = set() if seen is None else seen
    found = []
    for kind, name in INCLUDE.findall(path.read_text()):
        if TORCH.match(name):
            found.append(f"{path.relative_to(ROOT)} -> <{name}>")
        elif kind == '"' and (CSRC / name).is_file() and (CSRC / name) not in seen:
            seen.add(CSRC / name)
            found += [f"{path.relative_to(ROOT)} -> {chain}" for chain in torch_includes(CSRC / name, seen)]
    return found


TORCH_FREE = sorted({*CSRC.rglob("*.cuh"), *CSRC.glob("*/instances/*.cu"), *CSRC.glob("norm/backward/*.cu")})


def test_the_instantiation_units_are_found():
    units = [p.relative_to(CSRC).as_posix() for p in TORCH_FREE if p.suffix == ".cu"]
    assert "norm/instances/rms.cu" in units and "norm/backward/rms.cu" in units, units


@pytest.mark.parametrize("path", TORCH_FREE, ids=lambda p: p.relative_to(CSRC).as_posix())
def test_kernel_headers_and_instantiation_units_include_no_torch(path):
    assert not torch_includes(path), torch_includes(path)


def test_the_check_sees_a_torch_include_through_our_headers(tmp_path, monkeypatch):
    # planted: a unit that includes a header of ours that includes ATen
    monkeypatch.setattr(sys.modules[__name__], "CSRC", tmp_path)
    (tmp_path / "binding.h").write_text("#include <ATen/core/Tensor.h>\n")
    unit = tmp_path / "unit.cu"
    unit.write_text('#include "binding.h"\n#include <cuda_runtime.h>\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert torch_includes(unit) == ["unit.cu -> binding.h -> <ATen/core/Tensor.h>"]


LAUNCH = re.compile(r"<<<")
LAUNCHER = CSRC / "common" / "kernel.cuh"


def raw_launches(root):
    """`path:line` of every `<<<` under `root` outside common/kernel.cuh's launch_kernel."""
    return [f"{p.relative_to(root).as_posix()}:{n}" for p in sorted(root.rglob("*")) if p.suffix in (".cu", ".cuh", ".h")
            and p.resolve() != LAUNCHER.resolve() for n, line in enumerate(p.read_text().splitlines(), 1)
            if LAUNCH.search(line)]


def test_every_launch_goes_through_launch_kernel():
    """launch_kernel (common/kernel.cuh) is the one guard against an empty grid, which CUDA refuses
    as an invalid argument (act_mul_fp8 on rows of no elements raised that before): a kernel launched
    with <<<>>> anywhere else would bypass it."""
    assert "<<<" in LAUNCHER.read_text()
    assert not raw_launches(CSRC), raw_launches(CSRC)


def test_the_launch_check_sees_a_raw_launch(tmp_path):
    (tmp_path / "family").mkdir()
    (tmp_path / "family" / "op.cuh").write_text("void f() {\n  kernel<<<grid, 128, 0, stream>>>(p);\n}\n")
    assert raw_launches(tmp_path) == ["family/op.cuh:2"]


# The compositions between families, declared: the fused q/k norm + RoPE applies the rope family's
# rotation (rope.cuh) with its sources of cos/sin (rope_sources.h, rope_binding.h). Anything a second
# family needs is in common/ (the elementwise engine, the activations' math, the gradient reductions,
# the name resolvers); common/ includes no family.
COMPOSES = {("qk_norm_rope", "rope")}


def cross_family_includes(root):
    """(including family, included family, `path:line`) of every quoted include under `root` that
    leaves the including file's family folder for another family's (common/ counts as none)."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".cu", ".cuh", ".h") or len(path.relative_to(root).parts) < 2:
            continue
        family = path.relative_to(root).parts[0]
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if m and m.group(1) == '"' and "/" in m.group(2) and (root / m.group(2)).is_file():
                target = m.group(2).split("/")[0]
                if target != family and (target != "common" or family == "common"):
                    found.append((family, target, f"{path.relative_to(root).as_posix()}:{n}"))
    return found


def test_families_include_only_common_their_own_and_the_declared_compositions():
    undeclared = [f for f in cross_family_includes(CSRC) if (f[0], f[1]) not in COMPOSES]
    assert not undeclared, undeclared
    assert {(f[0], f[1]) for f in cross_family_includes(CSRC)} == COMPOSES, "a declared composition is gone"


def test_the_seam_check_sees_an_undeclared_include(tmp_path):
    for family in ("norm", "activation", "common"):
        (tmp_path / family).mkdir()
    (tmp_path / "activation" / "engine.cuh").write_text("#pragma once\n")
    (tmp_path / "common" / "math.cuh").write_text("#pragma once\n")
    (tmp_path / "norm" / "gated.cu").write_text('#include "common/math.cuh"\n#include "activation/engine.cuh"\n')
    (tmp_path / "common" / "shared.cuh").write_text('#include "activation/engine.cuh"\n')
    assert cross_family_includes(tmp_path) == [("common", "activation", "common/shared.cuh:1"),
                                               ("norm", "activation", "norm/gated.cu:2")]
