"""Reads compute-sanitizer logs (scripts/sanitize.sh) and attributes each reported error to the kernel
it was reported in: ours (the ``transformer_kernels`` namespace) or a library's (cuBLASLt's
``nvjet_*`` and ``*gemm*``/``*cutlass*`` kernels, torch's ``at::native`` ones, ...).

    python tests/sanitize/summarize.py OUT_DIR TOOL [TOOL ...]

Writes OUT_DIR/summary.md and summary.json; exits 0 only if no tool found an error in our kernels,
every error was attributed to a kernel, the driver had no failures and every tool finished. The
parsing is tested on the CPU (tests/reliability/test_sanitize_summary.py) and, on the GPU, against a planted
out-of-bounds write in a kernel of our namespace (tests/sanitize/planted.cu, sanitize.sh's
self-check)."""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
from pathlib import Path

OUR_NAMESPACE = "transformer_kernels"
HEADER = re.compile(r"^========= (?! )(?!ERROR SUMMARY)(?!RACECHECK SUMMARY)(?!COMPUTE-SANITIZER)(.*)$")
LOCATION = re.compile(r"^=========\s+at (.+)$")
RACE = re.compile(r"^========= (?:Error|Warning|WARN|ERROR)?:? ?Race reported between \w+ access at (.+)$")
OFFSET = re.compile(r"\+0x[0-9a-fA-F]+.*$")
# A host API's access ("Host API memory access error at host access to 0x.. of size N bytes", then
# "Uninitialized access to 0x.. on access by cudaMemcpy source"): attributed to that API, not a kernel.
HOST_ACCESS = re.compile(r"^=========\s+Uninitialized access to 0x[0-9a-fA-F]+ on access by (.+)$")
HOST_RANGE = re.compile(r"^========= Host API memory access error at host access to (0x[0-9a-fA-F]+) of size ([\d,]+) bytes")
ADDRESS = re.compile(r"^=========\s+Address (0x[0-9a-fA-F]+)")
CALL = re.compile(r"^\[\d+/\d+\] (\S+) \S+ \S+$")  # the driver's line before each call: entry, case, dtype
# Catalog entries whose op runs one of our kernels on the output of a cuBLASLt GEMM it called itself
# (linear_gelu's fallback: at::linear, then our GELU into the op's output).
READS_LIBRARY_GEMM_OUTPUT = re.compile(r"^linear_gelu\b")
UNTRACKED_GEMM_READS = "reads in our kernels of a cuBLASLt GEMM's output, whose stores initcheck does not see"


def kernel_name(location: str) -> str:
    """'void ns::k<float>(float *, int)+0x70 in /f.cu:12' -> 'void ns::k<float>' (no offset, file
    or parameter list: one name per kernel instantiation)."""
    name = OFFSET.sub("", location.split(" in /")[0]).strip()
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                return name[:i].strip()
    return name


def attributed_errors(log: str) -> list[tuple[str, str | None]]:
    """(kernel, catalog entry of the driver call it happened in, or None) for each error: the kernel
    of the error header's first 'at' line in the same block (or a race line's), or 'host API: <what>'
    for a host API's uninitialized access (a cudaMemcpy's source, say). API errors ("Program hit ...")
    and the sanitizer's own ("Internal Sanitizer Error") name no kernel: they stay unattributed."""
    errors: list[tuple[str, str | None]] = []
    pending, entry = False, None
    for line in log.splitlines():
        race = RACE.match(line)
        location = LOCATION.match(line)
        header = HEADER.match(line)
        host = HOST_ACCESS.match(line)
        call = CALL.match(line)
        if call:
            entry, pending = call.group(1), False
        elif race:
            errors.append((kernel_name(race.group(1)), entry))
            pending = False
        elif location or host:
            if pending:
                errors.append((kernel_name(location.group(1)) if location else f"host API: {host.group(1).strip()}",
                               entry))
            pending = False
        elif header and header.group(1).strip():
            pending = not header.group(1).startswith(("Program hit", "Saved host backtrace", "Internal Sanitizer",
                                                      "Target application"))
        elif not line.startswith("=========     "):  # a blank '=========' or the program's own output
            pending = False
    return errors


def errors_by_kernel(log: str) -> dict[str, int]:
    """kernel -> errors attributed to it (attributed_errors)."""
    return dict(collections.Counter(kernel for kernel, _ in attributed_errors(log)))


def gemm_stores_untracked(probe_log: str) -> bool:
    """Whether initcheck_probe.py's log shows initcheck not seeing a cuBLASLt GEMM's stores: in its
    'F.linear, then torch's copy' steps, torch's cudaMemcpy of F.linear's output is reported reading
    uninitialized memory, and in the step after each (our GELU reading F.linear's output itself), our
    kernel is reported, every read address inside that output. Then the same reports in the sanitizer
    run's linear_gelu calls are the library's stores going unseen, not reads of memory nothing wrote."""
    steps, step = {}, None
    for line in probe_log.splitlines():
        if line.startswith("probe "):
            step = line
            steps[step] = []
        elif step is not None:
            steps[step].append(line)
    names = list(steps)
    shown = 0
    for i, name in enumerate(names[:-1]):
        if "F.linear, then torch's copy" not in name:
            continue
        ranges = [(int(m.group(1), 16), int(m.group(2).replace(",", ""))) for m in map(HOST_RANGE.match, steps[name]) if m]
        copy_reported = any(k.startswith("host API: cudaMemcpy") for k, _ in attributed_errors("\n".join(steps[name])))
        replay = steps[names[i + 1]]
        ours = [k for k, _ in attributed_errors("\n".join(replay)) if is_ours(k)]
        addresses = [int(m.group(1), 16) for m in map(ADDRESS.match, replay) if m]
        inside = bool(addresses) and all(any(a <= x < a + n for a, n in ranges) for x in addresses)
        if not (copy_reported and ours and len(addresses) == len(ours) and inside):
            return False
        shown += 1
    return shown > 0


def is_ours(kernel: str) -> bool:
    return f"{OUR_NAMESPACE}::" in kernel


def summarize_tool(log: str, rc: str = "0", seconds: str = "?", gemm_stores_unseen: bool = False) -> dict:
    """One tool's log: its error count, errors by kernel, those in our kernels, the driver's calls.
    With gemm_stores_unseen (initcheck, when the probe showed it: gemm_stores_untracked), errors in
    our kernels during the calls of entries that read a cuBLASLt GEMM's output are counted apart."""
    summary = re.findall(r"ERROR SUMMARY: (\d+) errors?", log)
    races = re.findall(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", log)
    if races and not summary:  # racecheck's own line: hazards displayed (errors, warnings)
        summary = [races[-1][1]]
    calls = re.findall(r"driver: (\d+) calls in", log)
    failures = re.findall(r"driver: \d+ calls in \d+ s, (\d+) failures", log)
    ns = re.findall(r"op namespace (\S+)", log)
    errors = attributed_errors(log)
    by_kernel = dict(collections.Counter(kernel for kernel, _ in errors))
    unseen = sum(1 for kernel, entry in errors if gemm_stores_unseen and is_ours(kernel) and entry
                 and READS_LIBRARY_GEMM_OUTPUT.match(entry))
    return {"errors": int(summary[-1]) if summary else None, "rc": rc, "seconds": seconds,
            "calls": int(calls[-1]) if calls else None, "driver_failures": int(failures[-1]) if failures else None,
            "op_namespace": ns[-1] if ns else None, "errors_by_kernel": by_kernel,
            "errors_in_our_kernels": sum(n for k, n in by_kernel.items() if is_ours(k)) - unseen,
            "gemm_output_reads_unseen": unseen,
            "racecheck_hazards": dict(zip(("displayed", "errors", "warnings"), map(int, races[-1]))) if races else None,
            "finished": bool(calls) and rc not in ("124", "137")}


def tool_is_clean(entry: dict) -> bool:
    """No error in our kernels, every error attributed to a kernel, the driver's calls all made."""
    attributed = sum(entry["errors_by_kernel"].values()) == entry["errors"]
    no_ours = entry["errors"] == 0 or (attributed and entry["errors_in_our_kernels"] == 0)
    return no_ours and entry["driver_failures"] == 0 and entry["finished"]


PLANTED_OURS = f"{OUR_NAMESPACE}::planted_out_of_bounds_write"
PLANTED_LIBRARY = "library_stand_in_out_of_bounds_write"


def check_planted(ours_filtered: str, library_filtered: str, library_unfiltered: str) -> list[str]:
    """What is wrong with the self-check's three memcheck runs of planted.cu (empty: the filter and
    the attribution work): under our filter the planted error in our namespace is reported and
    counted as ours, the library stand-in's is not reported; unfiltered, the library's is, and is
    not counted as ours."""
    problems = []
    for what, log, expected, ours in (("ours, filtered", ours_filtered, {PLANTED_OURS: 1}, 1),
                                      ("library, filtered", library_filtered, {}, 0),
                                      ("library, unfiltered", library_unfiltered, {PLANTED_LIBRARY: 1}, 0)):
        entry = summarize_tool(log)
        if entry["errors_by_kernel"] != expected or entry["errors_in_our_kernels"] != ours:
            problems.append(f"{what}: expected {expected} ({ours} ours), got {entry['errors_by_kernel']} "
                            f"({entry['errors_in_our_kernels']} ours)")
    return problems


def probe_report(log: str) -> str:
    """initcheck_probe.py's log: the errors by kernel of each step (its 'probe ...' lines)."""
    lines, step, segment = [], "before the first step", []

    def flush():
        lines.append(f"{step}: {errors_by_kernel(chr(10).join(segment)) or 'no errors'}")

    for line in log.splitlines():
        if line.startswith("probe "):
            flush()
            step, segment = line, []
        else:
            segment.append(line)
    flush()
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[0] == "--probe":
        print(probe_report(Path(argv[1]).read_text(errors="replace")))
        return 0
    if argv[0] == "--planted":
        problems = check_planted(*(Path(a).read_text(errors="replace") for a in argv[1:4]))
        print("planted self-check: " + ("; ".join(problems) if problems else
                                        "the filter reports our planted error, counted as ours, and not the library's"))
        return 1 if problems else 0
    out, tools = Path(argv[0]), argv[1:]
    git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    record = {"tree": git("rev-parse", "HEAD^{tree}")[:7], "commit": git("rev-parse", "--short", "HEAD"),
              "dirty": bool(git("status", "--porcelain", "--untracked-files=no")), "tools": {}}
    probe = out / "initcheck-probe.log"
    unseen = probe.exists() and gemm_stores_untracked(probe.read_text(errors="replace"))
    record["initcheck_gemm_stores_untracked"] = unseen
    rows = []
    for tool in tools:
        log_file, rc_file = out / f"{tool}.log", out / f"{tool}.rc"
        log = log_file.read_text(errors="replace") if log_file.exists() else ""
        rc, secs = ((rc_file.read_text().split() + ["?", "?"])[:2] if rc_file.exists() else ("?", "?"))
        entry = record["tools"][tool] = summarize_tool(log, rc, secs, gemm_stores_unseen=tool == "initcheck" and unseen)
        errors = "no summary" if entry["errors"] is None else str(entry["errors"])
        if entry["errors_by_kernel"]:
            errors += f" ({entry['errors_in_our_kernels']} in our kernels"
            if entry["gemm_output_reads_unseen"]:
                errors += f"; {entry['gemm_output_reads_unseen']} {UNTRACKED_GEMM_READS}"
            errors += ")"
        if entry["racecheck_hazards"]:
            errors += f" ({entry['racecheck_hazards']['warnings']} race warnings)"
        rows.append(f"| {tool} | {errors} | {entry['calls']} | {entry['driver_failures']} | {rc} | {secs} |")
    record["op_namespace"] = next((t["op_namespace"] for t in record["tools"].values() if t["op_namespace"]), None)
    md = ["# compute-sanitizer: every op x dtype x access path (tests/sanitize/driver.py)", "",
          f"Op namespace {record['op_namespace']} (git tree {record['tree']}{', dirty' if record['dirty'] else ''}; "
          f"commit {record['commit']}). rc 124: the tool ran past SANITIZE_TIMEOUT; 99: it found errors.", "",
          "| tool | errors | calls | driver failures | rc | seconds |", "|---|---|---|---|---|---|", *rows, ""]
    if unseen:
        md += ["The initcheck probe (initcheck-probe.log) shows initcheck not seeing a cuBLASLt GEMM's stores: torch's "
               "own cudaMemcpy of F.linear's output is reported reading uninitialized memory, and our GELU reading that "
               "output reads only inside it. Errors in our kernels during linear_gelu calls (our GELU on the output of "
               "the GEMM the op ran) are therefore counted apart, not as ours.", ""]
    library = {}
    for tool, entry in record["tools"].items():
        for kernel, n in entry["errors_by_kernel"].items():
            if not is_ours(kernel):
                library.setdefault(kernel, {})[tool] = n
    if library:
        md += ["Errors in library kernels (not ours), by kernel and tool:", "", "| kernel | tool: errors |", "|---|---|"]
        md += [f"| `{k[:160]}` | {', '.join(f'{t}: {n}' for t, n in v.items())} |" for k, v in sorted(library.items())]
        md.append("")
    (out / "summary.md").write_text("\n".join(md))
    (out / "summary.json").write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(md))
    return 0 if all(tool_is_clean(t) for t in record["tools"].values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
