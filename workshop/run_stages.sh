#!/usr/bin/env bash
# One device call of named, time-limited stages; everything they write under $R (exported) and
# their logs are packed into OUT/results.tgz after each stage, so a call cut short still returns
# what it measured (the device returns at most 8 files).
#   workshop/run_stages.sh OUT 'build|120|python3 tools/build_kernel.py --archs native' \
#                              'tests|240|python3 -m pytest -q -p no:cacheprovider --junitxml=$R/junit.xml' ...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="$1"; shift
export PYTHONUNBUFFERED=1
WORK="$(mktemp -d)"; export R="$WORK/r"; mkdir -p "$R"
pack() { tar -C "$WORK" -czf "$OUT/results.tgz.tmp" r && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"; }
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tk-site .whl/*.whl
  export PYTHONPATH="/tmp/tk-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/integration${PYTHONPATH:+:$PYTHONPATH}"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import importlib.metadata as m; print({p: m.version(p) for p in ('torch', 'transformers', 'diffusers', 'kernels', 'accelerate', 'liger-kernel', 'peft')})"
  git log -1 --format='commit %H tree %T' 2>/dev/null; } > "$R/gpu.txt" 2>&1
for spec in "$@"; do
  IFS='|' read -r name secs cmd <<< "$spec"
  echo "=== $name (limit ${secs}s)"
  t0=$SECONDS
  timeout --kill-after=10 "$secs" bash -c "$cmd" > "$R/$name.log" 2>&1
  echo "=== $name: exit $? after $((SECONDS - t0))s"
  tail -n "${TAIL_LINES:-6}" "$R/$name.log"
  pack
done
