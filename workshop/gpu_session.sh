#!/usr/bin/env bash
# One device call that does everything a GPU run is for, in order of what matters most when time
# runs short: build for the GPU present, the whole test suite, the LLM end-to-end benchmark, the
# end-to-end profiles, the micro-benchmarks (saved after each op), the LTX end-to-end matrix, then
# whole LTX pipeline generations (VAE decode included).
# Each stage has a time limit (seconds, 0 skips it) so the call ends inside the device's 10-minute
# cap; everything is packed into one archive, OUT_DIR/results.tgz (the device returns at most 8 files).
#
#   TESTS_S=240 LLM_S=60 PROFILE_S=150 MICRO_S=200 LTX_S=0 workshop/gpu_session.sh OUT_DIR [bench_micro args]
#   PROBE_S=30 (default) times the host cost of a decode-sized call (benchmarks/probe_call_overhead.py)
#   NCU_S=90 adds Nsight Compute counters of our kernels (workshop/gpu_ncu.sh -> ncu.csv)
#   MICRO_READ_S=120 adds the micro-benchmarks with L2 flushed by a read (bench_micro --flush read)
#   PYTEST_ARGS="tests/rope/test_rope.py" runs part of the suite (a short confirming run)
#   LAB_VARIANTS="norm_fused_vecs_2,act_vecs_2" LAB_CASES="norm gelu" ...   the kernel lab's policy variants
#     side by side (workshop/lab/kernel_lab.cu, one binary; LAB_VARIANTS=all for every one), after the build
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="$1"; shift
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
# Results are written outside OUT and packed into OUT/results.tgz after every stage, so a call cut
# short by the device's time limit still returns what it measured (the device returns few files).
WORK="$(mktemp -d)"; R="$WORK/r"; mkdir -p "$R"
pack() { tar -C "$WORK" -czf "$OUT/results.tgz.tmp" r && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"; }
stage() {  # stage NAME SECONDS command...
  local name="$1" secs="$2"; shift 2
  [ "$secs" -gt 0 ] || return 0
  echo "=== $name (limit ${secs}s)"
  local t0=$SECONDS
  timeout "$secs" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0))s"
  pack
}
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tk-site .whl/*.whl
  export PYTHONPATH="/tmp/tk-site${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$R/gpu.txt"
"$PYTHON" -c "import importlib.metadata as m; print({p: m.version(p) for p in ('torch', 'transformers', 'diffusers', 'kernels', 'accelerate')})" >> "$R/gpu.txt" 2>&1
stage build "${BUILD_S:-240}" "$PYTHON" tools/build_kernel.py --archs native
tail -3 "$R/build.log"
if [ -n "${LAB_VARIANTS:-}" ]; then  # kernel-lab variants (workshop/gpu_lab.sh), comma-separated names
  lab_variants=()
  [ "$LAB_VARIANTS" = all ] || lab_variants=(--variants "$LAB_VARIANTS")
  stage lab "${LAB_S:-300}" bash workshop/gpu_lab.sh "$R/lab.txt" "${lab_variants[@]}" ${LAB_CASES:-}
fi
stage tests "${TESTS_S:-240}" "$PYTHON" -m pytest -v --tb=short -p no:cacheprovider --maxfail=200 ${PYTEST_ARGS:-}
grep -v " PASSED" "$R/tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -40
# Where a decode-sized call's host time goes (torch.empty, one aten launch, F.rms_norm, our op).
stage call_overhead "${PROBE_S:-30}" "$PYTHON" benchmarks/probe_call_overhead.py
stage llm "${LLM_S:-60}" "$PYTHON" benchmarks/bench_llm.py --out "$R"
stage profile "${PROFILE_S:-150}" "$PYTHON" benchmarks/profile_e2e.py --out "$R"
stage ncu "${NCU_S:-0}" bash workshop/gpu_ncu.sh "$R/ncu.csv"
stage micro "${MICRO_S:-200}" "$PYTHON" benchmarks/bench_micro.py --out "$R" "$@"
# The same with L2 flushed by a read (clean): what the memset flush's dirty lines cost each kernel.
stage micro_read_flush "${MICRO_READ_S:-0}" "$PYTHON" benchmarks/bench_micro.py --flush read --out "$R" "$@"
stage ltx "${LTX_S:-0}" "$PYTHON" benchmarks/bench_ltx.py --matrix --num-frames 49 --height 512 --width 768 \
  --steps 10 --warmup-iterations 1 --out "$R"
stage ltx_pipeline "${PIPELINE_S:-0}" "$PYTHON" benchmarks/bench_ltx.py --pipeline --num-frames 49 --height 512 \
  --width 768 --steps 10 --warmup-iterations 1 --out "$R"
cat "$R"/*.md 2>/dev/null | head -150
pack && rm -rf "$WORK"
