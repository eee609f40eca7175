"""A whole-suite GPU run's summary of record from its junit XML: collected, passed, failed, errors,
skipped and time, per file, the skip reasons grouped, and each failure's first line.

    python workshop/suite_summary.py RUN_DIR --commit SHA --title "..." [--notes FILE] > benchmarks/results/suite-....md

RUN_DIR holds junit.xml and gpu.txt (workshop/run_stages.sh's $R).
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from pathlib import Path


def outcome(case: ET.Element) -> tuple[str, str]:
    for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        child = case.find(tag)
        if child is not None:
            return name, (child.get("message") or "").strip().splitlines()[0] if child.get("message") else ""
    return "passed", ""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--title", required=True)
    parser.add_argument("--notes", type=Path)
    args = parser.parse_args()
    root = ET.parse(args.run_dir / "junit.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    per_file = collections.defaultdict(collections.Counter)
    skips, failures = collections.Counter(), []
    # a test can carry a call failure and a teardown error (a crashed worker adds another report)
    by_test = {}
    for case in suite.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        result, message = outcome(case)
        if by_test.get(name, ("passed",))[0] in ("failed", "error") and result == "passed":
            continue
        classname = case.get("classname") or ""
        by_test[name] = (result, message, classname.replace(".", "/") + ".py" if classname else "(collection)")
    for name, (result, message, path) in by_test.items():
        per_file[path][result] += 1
        if result == "skipped":
            skips[message] += 1
        elif result in ("failed", "error"):
            failures.append((name, message))
    totals = collections.Counter()
    for counts in per_file.values():
        totals.update(counts)
    gpu = (args.run_dir / "gpu.txt").read_text().strip() if (args.run_dir / "gpu.txt").exists() else "?"
    print(f"# {args.title}\n")
    print(f"Commit {args.commit}. Machine and packages (gpu.txt):\n\n```\n{gpu}\n```\n")
    if args.notes:
        print(args.notes.read_text().strip() + "\n")
    print("| collected | passed | failed | errors | skipped | time |\n|---|---|---|---|---|---|")
    print(f"| {len(by_test)} | {totals['passed']} | {totals['failed']} | {totals['error']} | {totals['skipped']} "
          f"| {float(suite.get('time', 0)):.0f} s |\n")
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
