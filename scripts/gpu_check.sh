#!/usr/bin/env bash
# The GPU check: build for the GPU present, run the whole test suite, run the micro-benchmarks,
# and write the logs and results (JSON + markdown) into RESULTS_DIR.
#
#   scripts/gpu_check.sh [RESULTS_DIR]      (default: benchmarks/results)
#
# On a machine without network, the wheels that scripts/fetch_gpu_wheels.sh put in .whl/ are
# installed first (kernels, kernel-abi-check, liger-kernel, diffusers).
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS_DIR="${1:-benchmarks/results}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$RESULTS_DIR"
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" > /dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tk-site .whl/*.whl
  export PYTHONPATH="/tmp/tk-site${PYTHONPATH:+:$PYTHONPATH}"
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$RESULTS_DIR/gpu.txt"
time "$PYTHON" tools/build_kernel.py --archs native
set +e
time "$PYTHON" -m pytest -v --tb=short -p no:cacheprovider --maxfail=200 2>&1 | tee "$RESULTS_DIR/tests.log"
tests_rc=${PIPESTATUS[0]}
set -e
time "$PYTHON" benchmarks/bench_micro.py --out "$RESULTS_DIR" "${@:2}"
for json in "$RESULTS_DIR"/micro-*.json; do "$PYTHON" benchmarks/plot_micro.py "$json"; done
exit "$tests_rc"
