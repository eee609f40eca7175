#!/usr/bin/env bash
# The next device call for what the last session could not run on a GPU, in order of what matters:
# the build for the GPU present (tarred into OUT_DIR for later calls); the GPU test of the inductor
# fallback registration (a deep chain of our ops compiles and gives eager's bits); the whole-model
# compile of the injected LTX-Video 2B after that fix, bf16 and fp8, against stock compile (issue 42's
# hang and its 1.3x compile-time target). Results packed into OUT_DIR/results.tgz after each stage.
#
#   workshop/gpu_pending.sh OUT_DIR        (about 8 minutes; carry .whl from scripts/fetch_gpu_wheels.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
bash workshop/run_stages.sh "$1" \
  'build|150|python3 tools/build_kernel.py --archs native && tar -czf "$OUT/build.tgz" build' \
  'compile_tests|120|python3 -m pytest -q -p no:cacheprovider -rs --junitxml=$R/junit-compile.xml tests/reliability/test_fakes_check_like_kernels.py -k "deep_graph or direct_fallback"' \
  'whole_bf16|120|TORCH_LOGS=recompiles,graph_breaks python3 workshop/compile_hang_probe.py $R/whole-bf16 --whole --every 100' \
  'whole_stock|120|python3 workshop/compile_hang_probe.py $R/whole-stock --whole --stock --every 100' \
  'whole_fp8|100|python3 workshop/compile_hang_probe.py $R/whole-fp8 --whole --fp8 --every 90'
