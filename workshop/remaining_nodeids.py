"""The node ids a cut-short whole-suite run did not report, for TK_ONLY_NODEIDS (tests/conftest.py).

    python workshop/remaining_nodeids.py RUN_LOG [--collected IDS] > bench-out/remaining-nodeids.txt

RUN_LOG: the run's `pytest -v` log (workshop/run_stages.sh's $R/suite.log). IDS: the collected node ids
(`pytest --collect-only -q`), by default collected here.
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

# A node id runs to the end of its line: parametrized ids may hold spaces ("(2, 77)").
REPORTED = re.compile(r"(?:PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (tests/\S.*?)\s*$", re.MULTILINE)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_log", type=Path)
    parser.add_argument("--collected", type=Path)
    args = parser.parse_args()
    done = set(REPORTED.findall(args.run_log.read_text(errors="replace")))
    if args.collected:
        collected = args.collected.read_text().splitlines()
    else:
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                             capture_output=True, text=True).stdout
        collected = out.splitlines()
    for nodeid in (line.strip() for line in collected):
        if "::" in nodeid and nodeid not in done:
            print(nodeid)


if __name__ == "__main__":
    main()
