#!/usr/bin/env bash
# One device call for what the sessions of 2026-12-02 built and could not run (no device time), in order of
# what matters: the build for the GPU present; every test of the FP8 ops (tests/quant,
# tests/gemm/test_linear_fp8.py, the norms' FP8 outputs in tests/norm/test_norm_fp8.py, and the catalog,
# graph, fake and kernels_ci tests of them), of decode_linear (tests/gemm/test_decode_linear.py) and of
# linear_gelu, whose cuBLASLt launch path was shared with linear_fp8; the node ids the last whole-suite run
# did not reach (workshop/remaining-nodeids.txt); the micro-benchmarks of quantize_fp8 (against torchao's
# recipe and its compile), linear_fp8 (against F.linear bf16 and torch._scaled_mm row-wise), decode_linear
# (against F.linear) and the untuned shapes; memcheck and initcheck over the FP8 catalog entries. Results
# packed into OUT_DIR/results.tgz after each stage.
#
#   workshop/gpu_pending.sh OUT_DIR        (about 9 minutes; carry .whl)
set -uo pipefail
cd "$(dirname "$0")/.."
bash workshop/run_stages.sh "$1" \
  'build|150|python3 tools/build_kernel.py --archs native' \
  'fp8_tests|200|python3 -m pytest -n 8 -v -p no:cacheprovider -rs --junitxml=$R/junit-fp8.xml tests/quant tests/gemm tests/norm tests/reliability tests/package/test_kernels_ci.py -k "fp8 or quantize or linear_gelu or decode_linear"' \
  'remaining|150|TK_ONLY_NODEIDS=workshop/remaining-nodeids.txt python3 -m pytest -n 16 -v -p no:cacheprovider -rs --junitxml=$R/junit-rest.xml' \
  'bench|150|python3 benchmarks/bench_micro.py --ops quantize_fp8 linear_fp8 decode_linear untuned --out $R' \
  'sanitize|60|SANITIZE_TIMEOUT=25 SANITIZE_ENTRIES=fp8 bash scripts/sanitize.sh $R/sanitize memcheck initcheck'
