"""A whole-suite GPU run's summary of record, from its parts: junit XML files and `pytest -v` logs (a
run cut by a device call's time limit leaves a log and no XML; TK_ONLY_NODEIDS finishes it in another
call). Collected, passed, failed, errors, skipped and time, per file, the skip reasons grouped, and each
failure's first line. A later part's result for a node id replaces an earlier one's (a rerun of the
skipped ids with --junitxml gives the reasons a -v log does not show).

    python workshop/suite_summary.py --commit SHA --title "..." [--notes FILE] [--gpu gpu.txt] PART ... > benchmarks/results/suite-....md

PART: a junit XML (*.xml) or a pytest -v log (anything else), e.g. workshop/run_stages.sh's $R/tests.log.
"""

from __future__ import annotations

import argparse
import collections
import re
import xml.etree.ElementTree as ET
from pathlib import Path


def outcome(case: ET.Element) -> tuple[str, str]:
    for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        child = case.find(tag)
        if child is not None:
            message = (child.get("message") or "").strip()
            if message in ("", "collection skipped") and child.text:  # the reason is in the text
                message = child.text.strip().split("Skipped: ")[-1]
                message = message[:-2] if message.endswith(("\")", "')")) else message
            return name, message.splitlines()[0] if message else ""
    return "passed", ""


LOGGED = re.compile(r"^(?:\[gw\d+\] \[ *\d+%\] )?(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (tests/\S.*?)\s*$", re.MULTILINE)
LOG_RESULT = {"PASSED": "passed", "FAILED": "failed", "SKIPPED": "skipped", "ERROR": "error", "XFAIL": "skipped",
              "XPASS": "passed"}


def junit_results(path: Path) -> tuple[dict[str, tuple[str, str]], float]:
    root = ET.parse(path).getroot()
    results, seconds = {}, 0.0
    for suite in ([root] if root.tag == "testsuite" else root.findall("testsuite")):
        seconds += float(suite.get("time", 0))
        for case in suite.iter("testcase"):
            classname = case.get("classname") or ""
            # a module skipped or broken at collection is a case with no class, named by its module
            name = (f"{classname.replace('.', '/')}.py::{case.get('name')}" if classname
                    else f"{case.get('name', '').replace('.', '/')}.py::(collection)")
            result, message = outcome(case)
            # a test can carry a call failure and a teardown error (a crashed worker adds another report)
            if results.get(name, ("passed",))[0] in ("failed", "error") and result == "passed":
                continue
            results[name] = (result, message)
    return results, seconds


def log_results(path: Path) -> dict[str, tuple[str, str]]:
    results = {}
    for word, nodeid in LOGGED.findall(path.read_text(errors="replace")):
        result = LOG_RESULT[word]
        if results.get(nodeid, ("passed",))[0] in ("failed", "error") and result == "passed":
            continue
        results[nodeid] = (result, "(reason not in the -v log)" if result == "skipped" else "")
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", type=Path, nargs="+")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--title", required=True)
    parser.add_argument("--notes", type=Path)
    parser.add_argument("--gpu", type=Path, help="workshop/run_stages.sh's gpu.txt")
    parser.add_argument("--seconds", type=float, default=0.0, help="time of the parts that are logs")
    args = parser.parse_args()
    by_test, seconds = {}, args.seconds
    for part in args.parts:
        if part.suffix == ".xml":
            results, part_seconds = junit_results(part)
            seconds += part_seconds
        else:
            results = log_results(part)
        by_test.update(results)
    per_file = collections.defaultdict(collections.Counter)
    skips, failures = collections.Counter(), []
    for name, (result, message) in by_test.items():
        per_file[name.split("::")[0]][result] += 1
        if result == "skipped":
            skips[message] += 1
        elif result in ("failed", "error"):
            failures.append((name, message))
    totals = collections.Counter()
    for counts in per_file.values():
        totals.update(counts)
    gpu = args.gpu.read_text().strip() if args.gpu and args.gpu.exists() else "?"
    print(f"# {args.title}\n")
    print(f"Commit {args.commit}. Machine and packages (gpu.txt):\n\n```\n{gpu}\n```\n")
    if args.notes:
        print(args.notes.read_text().strip() + "\n")
    print("| tests | passed | failed | errors | skipped | time |\n|---|---|---|---|---|---|")
    print(f"| {len(by_test)} | {totals['passed']} | {totals['failed']} | {totals['error']} | {totals['skipped']} "
          f"| {seconds:.0f} s |\n")
    print("## Per file\n\n| file | passed | failed | errors | skipped |\n|---|---|---|---|---|")
    for path, c in sorted(per_file.items()):
        print(f"| `{path}` | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} |")
    print("\n## Skips, by reason\n\n| tests | reason |\n|---|---|")
    for reason, n in skips.most_common():
        print(f"| {n} | {reason.replace('|', '/')[:300]} |")
    if failures:
        print("\n## Failures and errors\n\n| test | first line |\n|---|---|")
        for name, message in failures:
            print(f"| `{name}` | {message.replace('|', '/')[:300]} |")


if __name__ == "__main__":
    main()
