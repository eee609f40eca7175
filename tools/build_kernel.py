#!/usr/bin/env python3
"""Build this kernel-builder project without Nix or a kernel-builder binary.

build.toml is the single source of truth. From it this script generates, inside ``_build/``
(ignored by git): the CMake project, ``registration.h``, ``_ops.py`` and ``metadata.json``; compiles
with CMake (>= 3.26) and ninja against the installed torch as a Python limited-API (``.abi3.so``)
module; and installs the flat variant directory ``build/<variant>/`` that
``kernels.get_local_kernel(Path("build"))`` loads, e.g. ``build/torch211-cxx11-cu130-x86_64-linux``.

The op namespace is ``_<python name>_cuda_<id>``: ``<id>`` is the first 7 hex digits of the git
tree of HEAD, with ``_dirty`` when tracked files have uncommitted changes (as kernel-builder
does), or a random id outside a git checkout.

Usage:
    python tools/build_kernel.py                 # every arch nvcc supports (CI, releases)
    python tools/build_kernel.py --archs native  # the arch of the GPU present (fast builds)
    python tools/build_kernel.py --archs 9.0
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = Path(__file__).resolve().parent / "templates"

# Compute capabilities we ship SASS for: T4 (7.5), A100 (8.0), A10/3090 (8.6), L4/L40S/4090 (8.9),
# H100/H200 (9.0), B200 (10.0), RTX 50 (12.0), and the newest's PTX for later GPUs; intersected with
# what nvcc supports. 8.9 has its own: its e4m3 conversions are instructions (F2FP ... E4M3), which
# sm_86 code emulates in software, and the FP8 kernels (quantize_fp8, the norms' FP8 outputs,
# decode_linear's e4m3 weights) are what Ada GPUs are for (benchmarks/NOTES.md §Build size).
RELEASE_CAPABILITIES = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]

KERNEL_NAME_RE = re.compile(r"^[a-z][-a-z0-9]*[a-z0-9]$")
EDITION = 5
V5_GENERAL_KEYS = {"name", "version", "edition", "license", "backends", "upstream", "source",
                   "python-depends", "kernel-depends", "hub", "cuda", "xpu", "neuron", "tpu"}
V5_TORCH_KEYS = {"src", "include", "minver", "maxver", "pyext", "cxx-flags", "stable-abi"}
V5_CUDA_KERNEL_KEYS = {"backend", "cuda-capabilities", "cuda-flags", "cuda-minver", "cxx-flags",
                       "depends", "include", "src"}
V5_DEPENDS = {"torch", "cutlass_2_10", "cutlass_3_5", "cutlass_3_6", "cutlass_3_8", "cutlass_3_9",
              "cutlass_4_0", "cutlass_4_4", "cutlass_4_5", "sycl_tla", "metal-cpp"}
SOURCE_SUFFIXES = {".cu", ".cpp", ".cc"}


class BuildConfigError(ValueError):
    """build.toml breaks a rule of kernel-builder's edition-5 schema, or lists other headers than its
    sources include."""


QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def include_closure(root: Path, units: list[str], include_dirs: tuple[str, ...]) -> set[str]:
    """The headers of the tree (paths relative to root) that `units` include, directly or through one
    another, resolved against `include_dirs` as the compiler does (quoted includes only; generated
    headers such as registration.h are not in the tree and not counted)."""
    found: set[str] = set()
    pending = list(units)
    while pending:
        for name in QUOTED_INCLUDE.findall((root / pending.pop()).read_text()):
            for directory in include_dirs:
                rel = (Path(directory) / name).as_posix()
                if (root / rel).is_file():
                    if rel not in found:
                        found.add(rel)
                        pending.append(rel)
                    break
    return found


def check_sources_follow_includes(root: Path, section: str, src: list[str], include_dirs: tuple[str, ...]) -> None:
    """A section's src lists exactly its compiled units and the headers they include: a header missing
    from it leaves Nix's sandbox without the file (the Hub build fails where this one passed), one
    listed but never included is a stale entry left by a move."""
    units = [s for s in src if Path(s).suffix in SOURCE_SUFFIXES]
    headers = {s for s in src if Path(s).suffix not in SOURCE_SUFFIXES}
    closure = include_closure(root, units, include_dirs)
    missing, stale = sorted(closure - headers - set(units)), sorted(headers - closure)
    if missing or stale:
        raise BuildConfigError(f"{root / 'build.toml'}: {section} src must list the headers its sources include: "
                               f"missing {missing}, never included {stale}")


@dataclass(frozen=True)
class KernelConfig:
    name: str                   # "transformer-kernels"
    python_name: str            # "transformer_kernels"
    version: int
    license: str
    repo_id: str | None
    binding_sources: list[str]  # [torch] src
    kernels: dict[str, dict]    # [kernel.<family>] tables
    binding_include: tuple[str, ...] = ()  # [torch] include

    @property
    def sources(self) -> list[str]:
        files = list(self.binding_sources)
        for kernel in self.kernels.values():
            files += kernel["src"]
        return files

    @property
    def include_dirs(self) -> list[str]:
        dirs = ["torch-ext", *self.binding_include]
        for kernel in self.kernels.values():
            dirs += [d for d in kernel.get("include", []) if d not in dirs]
        return dirs


def load_config(root: Path = ROOT) -> KernelConfig:
    """Reads build.toml and checks it against the edition-5 rules.

    The rules checked here are the ones kernel-builder's parser enforces (huggingface/kernels,
    ``kernels-data/src/config``: the edition-5 schema); when the ``kernels`` package ships that
    parser (``kernels._rust.Build``), it is run as well.
    """
    path = root / "build.toml"
    with path.open("rb") as f:
        data = tomllib.load(f)

    def require(cond: bool, msg: str) -> None:
        if not cond:
            raise BuildConfigError(f"{path}: {msg}")

    general = data.get("general")
    require(isinstance(general, dict), "missing [general]")
    unknown = set(general) - V5_GENERAL_KEYS
    require(not unknown, f"unknown keys in [general]: {sorted(unknown)}")
    name = general.get("name")
    require(isinstance(name, str) and bool(KERNEL_NAME_RE.match(name)),
            f"[general] name must match {KERNEL_NAME_RE.pattern} (lowercase, dash-separated), got {name!r}")
    require(general.get("edition") == EDITION, f"[general] edition must be {EDITION}, got {general.get('edition')!r}")
    require(isinstance(general.get("version"), int) and general["version"] >= 0,
            "[general] version must be a non-negative integer")
    require(isinstance(general.get("license"), str) and general["license"], "[general] license is required")
    require(general.get("backends") == ["cuda"], f"[general] backends must be ['cuda'], got {general.get('backends')!r}")

    frameworks = [k for k in ("torch", "torch-noarch", "tvm-ffi") if k in data]
    require(frameworks == ["torch"], f"exactly one framework section, [torch], is expected; got {frameworks}")
    torch_section = data["torch"]
    unknown = set(torch_section) - V5_TORCH_KEYS
    require(not unknown, f"unknown keys in [torch]: {sorted(unknown)}")
    binding = torch_section.get("src", [])
    require(any(s.endswith(".cpp") for s in binding) and any(s.endswith(".h") for s in binding),
            "[torch] src must list the binding .cpp and the headers it includes")

    kernels = data.get("kernel", {})
    require(bool(kernels), "at least one [kernel.<name>] section is required")
    unknown_top = set(data) - {"general", "torch", "kernel"}
    require(not unknown_top, f"unknown top-level sections: {sorted(unknown_top)}")
    for kname, kernel in kernels.items():
        where = f"[kernel.{kname}]"
        require(kernel.get("backend") == "cuda", f"{where} backend must be 'cuda'")
        unknown = set(kernel) - V5_CUDA_KERNEL_KEYS
        require(not unknown, f"unknown keys in {where}: {sorted(unknown)}")
        depends = kernel.get("depends", [])
        require("torch" in depends, f"{where} depends must include 'torch'")
        require(set(depends) <= V5_DEPENDS, f"{where} unknown depends {sorted(set(depends) - V5_DEPENDS)}")
        require(bool(kernel.get("src")), f"{where} src must list its sources")
    for rel in binding + [s for k in kernels.values() for s in k["src"]]:
        require((root / rel).is_file(), f"source {rel} listed in build.toml does not exist")
    check_sources_follow_includes(root, "[torch]", binding, ("torch-ext", *torch_section.get("include", [])))
    for kname, kernel in kernels.items():
        check_sources_follow_includes(root, f"[kernel.{kname}]", kernel["src"], tuple(kernel.get("include", [])))

    try:  # kernel-builder's own parser, shipped inside the kernels package.
        from kernels._rust import Build  # type: ignore[import-not-found]
    except ImportError:
        Build = None
    if Build is not None:
        try:
            Build.open(str(root))
        except ValueError as e:
            raise BuildConfigError(f"{path}: rejected by kernel-builder's parser: {e}") from e

    return KernelConfig(
        name=name,
        python_name=name.replace("-", "_"),
        version=general["version"],
        license=general["license"],
        repo_id=general.get("hub", {}).get("repo-id"),
        binding_sources=binding,
        kernels=kernels,
        binding_include=tuple(torch_section.get("include", [])),
    )


def unique_id(root: Path = ROOT) -> str:
    """kernel-builder's id: git tree of HEAD (7 hex) + '_dirty' for tracked changes, else random."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                              text=True).stdout.strip()
    try:
        tree = git("rev-parse", "HEAD^{tree}")[:7]
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
        return f"{tree}_dirty" if dirty else tree
    except (subprocess.CalledProcessError, FileNotFoundError):
        alphabet = "abcdefghijklmnopqrstuvwxyz234567"  # base32 of a random u64, lowercase
        n = secrets.randbits(64)
        return "".join(alphabet[(n >> (5 * i)) & 31] for i in range(13))


def nvcc_version(nvcc: str) -> tuple[int, int]:
    out = subprocess.run([nvcc, "--version"], check=True, capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    if not m:
        raise RuntimeError(f"cannot read the CUDA version from `{nvcc} --version`")
    return int(m.group(1)), int(m.group(2))


def nvcc_capabilities(nvcc: str) -> list[str]:
    out = subprocess.run([nvcc, "--list-gpu-arch"], check=True, capture_output=True, text=True).stdout
    caps = set()
    for m in re.finditer(r"compute_(\d+)(\d)\b", out):
        caps.add(f"{m.group(1)}.{m.group(2)}")
    return sorted(caps, key=lambda c: tuple(map(int, c.split("."))))


def resolve_archs(spec: str, nvcc: str) -> list[str]:
    supported = nvcc_capabilities(nvcc)
    if spec == "all":
        return [c for c in RELEASE_CAPABILITIES if c in supported]
    if spec == "native":
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("--archs native needs a visible NVIDIA GPU; use --archs all or a list like 9.0")
        major, minor = torch.cuda.get_device_capability()
        spec = f"{major}.{minor}"
    archs = [a.strip() for a in spec.split(",") if a.strip()]
    bad = [a for a in archs if a not in supported]
    if bad:
        raise SystemExit(f"nvcc does not support compute capability {bad}; it supports {supported}")
    return archs


def cmake_architectures(archs: list[str]) -> str:
    """SASS for every arch, plus PTX of the newest so future GPUs can JIT it."""
    nums = [a.replace(".", "") for a in archs]
    return ";".join([f"{n}-real" for n in nums[:-1]] + [nums[-1]])


def torch_cuda_version(torch_cuda: str | None, nvcc_cuda: tuple[int, int]) -> tuple[int, int]:
    """The CUDA version the variant is named from: torch's (``torch.version.cuda``), since that is
    what ``kernels`` matches a variant against. A compiler of another CUDA version is refused: its
    build would be named for one CUDA and built with another."""
    if torch_cuda is None:
        raise SystemExit("the installed torch has no CUDA support; install a CUDA build of torch")
    major, minor = (int(p) for p in torch_cuda.split(".")[:2])
    if (major, minor) != tuple(nvcc_cuda):
        raise SystemExit(
            f"nvcc is CUDA {nvcc_cuda[0]}.{nvcc_cuda[1]} but torch was built with CUDA {torch_cuda}: kernels loads "
            f"a variant named for torch's CUDA (cu{major}{minor}), so build with the CUDA {major}.{minor} toolkit "
            f"(put its nvcc first on PATH) or install the torch build for CUDA {nvcc_cuda[0]}.{nvcc_cuda[1]}")
    return major, minor


def cxx_standard(torch_version: str) -> str:
    """C++17 for torch < 2.12, C++20 from 2.12 on, as kernel-builder sets it (torch 2.12+'s headers
    need C++20)."""
    major, minor = (int(p) for p in torch_version.split("+")[0].split(".")[:2])
    return "20" if (major, minor) >= (2, 12) else "17"


def metadata_archs(archs: list[str]) -> list[str]:
    """The archs as kernel-builder's metadata lists them: sorted as strings, the one with PTX
    (the newest, see cmake_architectures) marked ``+PTX``."""
    newest = max(archs, key=lambda a: tuple(map(int, a.split("."))))
    return sorted(f"{a}+PTX" if a == newest else a for a in set(archs))


def variant_digest(variant: Path) -> dict:
    """kernel-builder's ``digest``: base64 SHA-256 of every file of the variant (relative path keys),
    without metadata.json (it holds the digest) and Python bytecode."""
    files = {}
    for path in sorted(p for p in variant.rglob("*") if p.is_file()):
        rel = path.relative_to(variant).as_posix()
        if rel in ("metadata.json", "metadata.json.sigstore") or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        files[rel] = base64.b64encode(hashlib.sha256(path.read_bytes()).digest()).decode()
    return {"algorithm": "sha256", "files": files}


def provenance(root: Path) -> dict:
    """kernel-builder's ``provenance``: the builder (this script, part of the kernel's own tree) and
    the kernel source's commit and dirty flag (omitted outside git)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()
    try:
        kernel = {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (subprocess.CalledProcessError, FileNotFoundError):
        return {"kernel-builder": {"version": "tools/build_kernel.py"}}
    return {"kernel-builder": {"version": "tools/build_kernel.py", **kernel}, "kernel": kernel}


def variant_name(torch_version: str, cuda: tuple[int, int]) -> str:
    major, minor = torch_version.split("+")[0].split(".")[:2]
    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}[platform.machine().lower()]
    return f"torch{major}{minor}-cxx11-cu{cuda[0]}{cuda[1]}-{arch}-linux"


def render(template: str, values: dict[str, str]) -> str:
    text = (TEMPLATES / template).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    leftover = re.findall(r"@[A-Z_]+@", text)
    if leftover:
        raise RuntimeError(f"{template}: unfilled placeholders {leftover}")
    return text


def write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def build(archs_spec: str = "all", jobs: int | None = None, root: Path = ROOT, verbose: bool = False) -> Path:
    """Builds and installs build/<variant>/; returns that directory."""
    import torch

    cfg = load_config(root)
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cuda = torch_cuda_version(torch.version.cuda, nvcc_version(nvcc))
    archs = resolve_archs(archs_spec, nvcc)
    ops_name = f"_{cfg.python_name}_cuda_{unique_id(root)}"
    variant = variant_name(torch.__version__, cuda)
    jobs = jobs or os.cpu_count() or 2

    gen = root / "_build" / f"{variant}-sm{'_'.join(a.replace('.', '') for a in archs)}"
    gen.mkdir(parents=True, exist_ok=True)
    sources = [root / s for s in cfg.sources if Path(s).suffix in SOURCE_SUFFIXES]
    binding_sources = [root / s for s in cfg.binding_sources if Path(s).suffix in SOURCE_SUFFIXES]
    # build.toml's cuda-flags, each once, for every source. Nothing else changes the kernels: a build
    # carries its git tree's op id only when it compiles that tree's kernels (variants of the tuning
    # policies live in the kernel lab, workshop/lab, never in a build of the extension).
    cuda_flags = " ".join(dict.fromkeys(f for k in cfg.kernels.values() for f in k.get("cuda-flags", [])))
    write_if_changed(gen / "CMakeLists.txt", render("CMakeLists.txt.in", {
        "PYTHON_NAME": cfg.python_name,
        "OPS_NAME": ops_name,
        "TORCH_CMAKE_PREFIX": torch.utils.cmake_prefix_path,
        "SOURCES": "\n".join(f'  "{s}"' for s in sources),
        "BINDING_SOURCES": " ".join(f'"{s}"' for s in binding_sources),
        "INCLUDE_DIRS": "\n".join(f'  "{root / d}"' for d in cfg.include_dirs) + f'\n  "{gen}"',
        "CUDA_ARCHITECTURES": cmake_architectures(archs),
        "NVCC_THREADS": str(min(jobs, len(archs))),
        "CUDA_FLAGS": cuda_flags,
        "CXX_STANDARD": cxx_standard(torch.__version__),
    }))
    write_if_changed(gen / "registration.h", render("registration.h.in", {}))

    # The system g++ (or TK_CXX), not $CXX, and no other toolchain on PATH or LIBRARY_PATH: on our
    # GPU machine $CXX and PATH name /opt/gcc, whose library directories (which CMake takes from
    # the CUDA compiler's host toolchain) hold only a static libstdc++. Linked in, that private
    # copy of the C++ runtime has an uninitialized locale and the first error message that formats
    # a number crashes the process. tests/package/test_build.py checks the .so for such a copy.
    cxx = os.environ.get("TK_CXX") or shutil.which("g++", path="/usr/bin") or shutil.which("g++")
    if cxx is None:
        raise SystemExit("no g++ found; install the system C++ compiler or set TK_CXX")
    env = {k: v for k, v in os.environ.items() if k not in ("LIBRARY_PATH", "CC", "CXX", "CUDAHOSTCXX")}
    env.setdefault("CCACHE_BASEDIR", str(root.parent))
    env.update(TORCH_CUDA_ARCH_LIST=";".join(archs), CUDACXX=nvcc, CXX=cxx, CUDAHOSTCXX=cxx,
               PATH=os.pathsep.join([str(Path(cxx).parent), str(Path(nvcc).parent), env.get("PATH", "")]))
    cmake = shutil.which("cmake", path=str(Path(sys.executable).parent)) or shutil.which("cmake")
    obj = gen / "cmake"
    run = (lambda cmd: subprocess.run(cmd, check=True, env=env)) if verbose else (
        lambda cmd: _run_quiet(cmd, env))
    if not (obj / "build.ninja").exists() or (obj / "CMakeCache.txt").stat().st_mtime < (gen / "CMakeLists.txt").stat().st_mtime:
        # ccache, where installed, reuses the objects of unchanged sources across builds and
        # checkouts (CCACHE_BASEDIR makes the paths relative); TK_NO_CCACHE=1 turns it off.
        ccache = None if os.environ.get("TK_NO_CCACHE") else shutil.which("ccache")
        launcher = [f"-DCMAKE_{lang}_COMPILER_LAUNCHER={ccache}" for lang in ("CUDA", "CXX")] if ccache else []
        run([cmake, "-S", str(gen), "-B", str(obj), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
             f"-DPython3_EXECUTABLE={sys.executable}", f"-DCMAKE_CUDA_COMPILER={nvcc}",
             f"-DCMAKE_CXX_COMPILER={cxx}", f"-DCMAKE_CUDA_HOST_COMPILER={cxx}", *launcher])
    run([cmake, "--build", str(obj), "--", f"-j{jobs}"])

    # Install the flat variant directory: extension, package sources, _ops.py, metadata.json.
    out = root / "build" / variant
    if out.exists():
        shutil.rmtree(out)
    package = root / "torch-ext" / cfg.python_name
    shutil.copytree(package, out, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_ops.py"))
    # exactly this build's name: a clean tree's "<id>" is a prefix of the same tree's "<id>_dirty"
    libs = [p for p in obj.glob(f"{ops_name}*.so") if p.name.split(".")[0] == ops_name]
    if len(libs) != 1:
        raise RuntimeError(f"expected one {ops_name}.*.so in {obj}, found {libs}")
    shutil.copy2(libs[0], out / libs[0].name)
    (out / "_ops.py").write_text(render("_ops.py.in", {"OPS_NAME": ops_name}))
    metadata = {
        "name": cfg.name,
        "id": ops_name,
        "version": cfg.version,
        "license": cfg.license,
        "python-depends": [],
        "backend": {"type": "cuda", "archs": metadata_archs(archs)},
        "digest": variant_digest(out),
        "provenance": provenance(root),
    }
    (out / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    return out


NINJA_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\] ")


def _run_quiet(cmd: list[str], env: dict[str, str]) -> None:
    """Runs cmd, showing only ninja's progress: one line per finished step, ``[n/N]`` and the source it
    compiled, with the minutes so far (a full build is many minutes of silence otherwise). The whole
    output is printed only if the command fails."""
    start = time.monotonic()
    lines = []
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            lines.append(line)
            m = NINJA_PROGRESS.match(line)
            if m:
                sources = re.findall(r"(?:csrc|torch-ext)/\S+?\.(?:cu|cpp)\b", line)
                what = sources[-1] if sources else line[m.end():].split(" ")[0].strip()
                print(f"[{m.group(1)}/{m.group(2)}] {what}  ({_minutes(time.monotonic() - start)})", flush=True)
    if proc.returncode != 0:
        sys.stderr.write("".join(lines)[-40000:])
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}")


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", default=os.environ.get("TK_CUDA_ARCHS", "all"),
                        help="'all' (default), 'native', or a comma list such as 9.0 or 8.0,9.0")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: CPU count)")
    parser.add_argument("--check-config", action="store_true", help="only validate build.toml")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    if args.check_config:
        cfg = load_config()
        print(f"build.toml OK: {cfg.name} v{cfg.version}, kernels {sorted(cfg.kernels)}")
        return
    start = time.monotonic()
    out = build(args.archs, args.jobs, verbose=args.verbose)
    print(f"built {out.relative_to(ROOT)} in {_minutes(time.monotonic() - start)}")


if __name__ == "__main__":
    main()
