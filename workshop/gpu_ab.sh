#!/usr/bin/env bash
# A/B of a compile-time tuning knob on the GPU machine: benchmarks the given ops built with
# TK_CUDA_FLAGS=FLAGS into RESULTS_DIR/ab-<name>/, then rebuilds the default.
#   workshop/gpu_ab.sh RESULTS_DIR NAME "FLAGS" [bench_micro.py args]
#   e.g. workshop/gpu_ab.sh $OUT fused2 "-DTK_FUSED_CACHED_VECS=2" --ops modulate fused_add_rms_norm
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS_DIR="$1"; NAME="$2"; FLAGS="$3"; shift 3
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null && [ ! -d /tmp/tk-site ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tk-site .whl/*.whl
fi
[ -d /tmp/tk-site ] && export PYTHONPATH="/tmp/tk-site${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$RESULTS_DIR/ab-$NAME"
# The default build comes back however this ends (a failed or interrupted benchmark too), so that
# what runs after never uses the variant.
trap '"$PYTHON" tools/build_kernel.py --archs native' EXIT
trap 'exit 143' TERM
TK_CUDA_FLAGS="$FLAGS" "$PYTHON" tools/build_kernel.py --archs native
"$PYTHON" benchmarks/bench_micro.py --out "$RESULTS_DIR/ab-$NAME" "$@"
