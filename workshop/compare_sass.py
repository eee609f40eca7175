#!/usr/bin/env python3
"""Compares the SASS of every kernel in two builds of the extension, kernel by kernel.

    python workshop/compare_sass.py BASE.so NEW.so [--arch sm_90] [--list changed,removed,added]
    python workshop/compare_sass.py A.cubin B.cubin --arch sm_86 --new-arch sm_89 --encodings

BASE and NEW are extensions (.so), objects or cubins, anything cuobjdump reads.
A kernel of NEW is paired with BASE's kernel of the same name once tuning-policy template arguments
(``...Policy...`` types, which only name the values a kernel is compiled with) are dropped from
both demangled names; a kernel left unpaired is paired by its code where BASE has an unpaired
kernel with the same instructions (a rename). The code compared is the instruction text with
addresses and encodings removed (branch targets are offsets within the function, so they compare
as they are), or with --encodings the instruction encodings alone (the machine code, whatever the
disassembler calls it on each architecture: to compare two architectures' code). Registers per
thread are listed with the changed kernels (cuobjdump -res-usage).

Prints how many kernels are identical, changed, removed and added, and lists the ones asked for.
Exit status 0 whatever the result (it reports, it does not judge).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

FUNCTION_RE = re.compile(r"^\s*Function : (\S+)")
INSTRUCTION_RE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*(.*?);")
ENCODING_RE = re.compile(r"/\* (0x[0-9a-f]{16}) \*/")
ARCH_RE = re.compile(r"code for (sm_\d+a?)")
RES_RE = re.compile(r"Function ([^:\s]+):\s*REG:(\d+)")
# Tuning-policy arguments in demangled names: "transformer_kernels::NormPolicy, " and the like.
POLICY_RE = re.compile(r"(?:transformer_kernels::)?(?:\w+::)*\w*Policy\w*(?:<[^<>]*>)?,?\s*")


def find_cuobjdump(explicit: str | None) -> str:
    candidates = [explicit] if explicit else []
    candidates += [shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    try:  # triton's wheel bundles one
        import triton  # type: ignore[import-not-found]

        candidates.append(str(Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"))
    except ImportError:
        pass
    for c in candidates:
        if c and Path(c).is_file():
            return c
    raise SystemExit("no cuobjdump found: pass --cuobjdump PATH")


def kernels(so: str, arch: str, cuobjdump: str, encodings: bool = False) -> dict[str, tuple[str, str]]:
    """{mangled name: (sha1 of the normalised instruction text (or of the encodings), sha1 of the
    opcodes alone, in order)} for the kernels of `arch`."""
    proc = subprocess.Popen([cuobjdump, "-sass", so], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out: dict[str, tuple[str, str]] = {}
    name, digest, opcodes, in_arch = None, None, None, True
    for line in proc.stdout:
        m = ARCH_RE.search(line)
        if m:
            in_arch = m.group(1) == arch
            continue
        m = FUNCTION_RE.match(line)
        if m:
            if name is not None:
                out[name] = (digest.hexdigest(), opcodes.hexdigest())
            name, digest, opcodes = (m.group(1), hashlib.sha1(), hashlib.sha1()) if in_arch else (None, None, None)
            continue
        if name is not None:
            m = INSTRUCTION_RE.match(line)
            if m:
                text = re.sub(r"\s+", " ", m.group(1)).strip()
                # the opcode, after any predicate (@P0, @!P1)
                opcodes.update((text.split(" ")[1] if text.startswith("@") else text.split(" ")[0]).encode() + b"\n")
                if not encodings:
                    digest.update(text.encode() + b"\n")
            if encodings:
                for word in ENCODING_RE.findall(line):
                    digest.update(word.encode())
    if name is not None:
        out[name] = (digest.hexdigest(), opcodes.hexdigest())
    proc.wait()
    return out


def registers(so: str, cuobjdump: str) -> dict[str, int]:
    text = subprocess.run([cuobjdump, "-res-usage", so], capture_output=True, text=True).stdout
    # "Function NAME:" and "REG:n ..." are on consecutive lines
    joined = re.sub(r":\n\s*", ": ", text)
    return {m.group(1): int(m.group(2)) for m in RES_RE.finditer(joined)}


def demangle(names: list[str]) -> dict[str, str]:
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None:
        return {n: n for n in names}
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return dict(zip(names, out))


# Types that only bundle a kernel's template arguments (NormOp<Policy, T, W, O, norm, pre-add,
# modulation>): their arguments count, not the bundle.
WRAPPERS = ("transformer_kernels::NormOp<",)


def _matching(text: str, open_at: int, pair: str) -> int:
    """Index of the bracket closing the one at `open_at` (pair: "<>" or "()")."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == pair[0]:
            depth += 1
        elif text[i] == pair[1]:
            depth -= 1
            if depth == 0:
                return i
    return len(text) - 1


def key(demangled: str) -> str:
    """The demangled name without tuning-policy arguments and argument bundles, and without the
    parameter list of the kernel's device body (it follows from the body's template arguments)."""
    text = POLICY_RE.sub("", demangled)
    for wrapper in WRAPPERS:
        while (at := text.find(wrapper)) >= 0:
            close = _matching(text, at + len(wrapper) - 1, "<>")
            text = text[:at] + text[at + len(wrapper): close] + text[close + 1:]
    body = text.find("&(void ")
    if body >= 0:
        lt = text.find("<", body)
        gt = _matching(text, lt, "<>") if lt >= 0 else -1
        if gt >= 0 and gt + 1 < len(text) and text[gt + 1] == "(":
            text = text[: gt + 1] + text[_matching(text, gt + 1, "()") + 1:]
    return re.sub(r"\s+", " ", text).replace(", >", ">").replace("<>", "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument("--arch", default="sm_90", help="the architecture compared (default sm_90)")
    parser.add_argument("--new-arch", help="NEW's architecture, where it is not --arch's")
    parser.add_argument("--encodings", action="store_true", help="compare instruction encodings, not text")
    parser.add_argument("--cuobjdump")
    parser.add_argument("--list", default="changed,renamed", help="comma list of: identical, renamed, changed, "
                        "removed, added (default: changed,renamed)")
    args = parser.parse_args()
    tool = find_cuobjdump(args.cuobjdump)
    new_arch = args.new_arch or args.arch
    base = kernels(args.base, args.arch, tool, args.encodings)
    new = kernels(args.new, new_arch, tool, args.encodings)
    if not base or not new:
        raise SystemExit(f"no {args.arch if not base else new_arch} kernels in {'BASE' if not base else 'NEW'}")
    base_regs, new_regs = registers(args.base, tool), registers(args.new, tool)
    names = demangle(list(base) + list(new))
    base_by_key: dict[str, list[str]] = collections.defaultdict(list)
    for n in base:
        base_by_key[key(names[n])].append(n)

    identical, changed, renamed = [], [], []
    unpaired_new = []
    paired_base = set()
    for n in new:
        candidates = [b for b in base_by_key.get(key(names[n]), []) if b not in paired_base]
        if not candidates:
            unpaired_new.append(n)
            continue
        b = candidates[0]
        paired_base.add(b)
        (identical if base[b][0] == new[n][0] else changed).append((b, n))
    unpaired_base = {b for b in base if b not in paired_base}
    by_code = collections.defaultdict(list)
    for b in unpaired_base:
        by_code[base[b][0]].append(b)
    added = []
    for n in unpaired_new:
        if by_code.get(new[n][0]):
            b = by_code[new[n][0]].pop()
            unpaired_base.discard(b)
            renamed.append((b, n))
        else:
            added.append(n)
    removed = sorted(unpaired_base, key=lambda b: names[b])

    arches = args.arch if new_arch == args.arch else f"{args.arch} (BASE) vs {new_arch} (NEW)"
    print(f"{arches}, {'encodings' if args.encodings else 'instructions'}: {len(base)} kernels in BASE, "
          f"{len(new)} in NEW")
    print(f"  identical SASS, same name:    {len(identical)}")
    print(f"  identical SASS, other name:   {len(renamed)}")
    same_opcodes = [pair for pair in changed if base[pair[0]][1] == new[pair[1]][1]]
    print(f"  changed SASS:                 {len(changed)}")
    print(f"    of which the same opcodes in the same order (operands differ): {len(same_opcodes)}")
    print(f"  removed (in BASE only):       {len(removed)}")
    print(f"  added (in NEW only):          {len(added)}")
    wanted = set(args.list.split(",")) if args.list else set()

    def regs(regs_of: dict[str, int], n: str) -> str:
        return str(regs_of.get(n, "?"))

    sections = [
        ("identical", identical, lambda p: names[p[1]]),
        ("renamed", renamed, lambda p: f"{names[p[0]]}\n      -> {names[p[1]]}"),
        ("changed", changed, lambda p: f"{names[p[1]]}  (registers {regs(base_regs, p[0])} -> {regs(new_regs, p[1])}"
                                       f"{'; same opcodes, operands differ' if base[p[0]][1] == new[p[1]][1] else ''})"),
        ("removed", [(b,) for b in removed], lambda p: names[p[0]]),
        ("added", [(n,) for n in added], lambda p: names[p[0]]),
    ]
    for label, items, fmt in sections:
        if label in wanted and items:
            print(f"\n## {label} ({len(items)})")
            for p in sorted(items, key=lambda p: names[p[-1]]):
                print("  " + fmt(p))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
