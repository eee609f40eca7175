#!/usr/bin/env bash
# One device call: the GPU check (build, whole suite, micro-benchmarks) then the end-to-end
# benchmarks, each under a time limit so the call ends inside the device's 10-minute cap, and
# everything packed into one archive (the device returns at most 8 files).
#   scripts/gpu_session.sh OUT_DIR [CHECK_SECONDS] [E2E_SECONDS] [gpu_e2e.sh args...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="$1"; CHECK_S="${2:-300}"; E2E_S="${3:-250}"; shift $(( $# < 3 ? $# : 3 ))
mkdir -p "$OUT/check" "$OUT/e2e"
timeout "$CHECK_S" bash scripts/gpu_check.sh "$OUT/check" 2>&1 | grep -v " PASSED" | tee "$OUT/check/stdout.log"
echo "gpu_check exit: ${PIPESTATUS[0]}"
if [ "$E2E_S" -gt 0 ]; then
  timeout "$E2E_S" bash scripts/gpu_e2e.sh "$OUT/e2e" "$@" 2>&1 | tee "$OUT/e2e/stdout.log"
  echo "gpu_e2e exit: ${PIPESTATUS[0]}"
fi
tar -C "$OUT" -czf "$OUT/results.tgz" check e2e && rm -rf "$OUT/check" "$OUT/e2e"
