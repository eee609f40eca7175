#!/usr/bin/env bash
# The main job: set up .venv and build; then, with an NVIDIA GPU, run the micro-benchmarks
# (results in benchmarks/results/); without one, self-check the build and say so.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
if python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "main: a GPU is present: building for it, then the micro-benchmarks (results in benchmarks/results/)" >&2
  python tools/build_kernel.py --archs native
  python benchmarks/bench_micro.py --out benchmarks/results "$@"
else
  echo "main: no GPU: building for every arch (16-21 minutes on 2 cores; each unit is printed as it finishes)," \
       "then the self-check" >&2
  python tools/build_kernel.py --archs all
  python tools/self_check.py
fi
