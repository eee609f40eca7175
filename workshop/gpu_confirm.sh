#!/usr/bin/env bash
# The confirming device call for a short budget: build for the GPU present, then the triage nodeids
# (workshop/triage-gpu-nodeids.txt) with the training, loss, GroupNorm/SD, linear_gelu, integration and
# CUDA-graph test files and the empty-tensor tests, named and with tracebacks (TK_FAILURE_LOG),
# then the Llama training step (eager, Liger, ours) with what time is left.
#   BUILD_S=110 TESTS_S=170 TRAIN_S=50 workshop/gpu_confirm.sh OUT
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="$1"
FILES="tests/training/test_backward.py tests/norm/test_norm_backward.py tests/qk_norm_rope/test_qk_norm_rope_backward.py
  tests/loss/test_fused_linear_cross_entropy.py tests/integration/test_training_models.py tests/integration/test_training_integration.py
  tests/group_norm/test_group_norm.py tests/integration/test_integration_sd.py tests/gemm/test_linear_gelu.py tests/integration/test_decode_graphs.py
  tests/reliability/test_cuda_graphs.py tests/integration/test_integration_transformers.py tests/integration/test_integration_diffusers.py"
pattern="$(echo $FILES | tr ' ' '\n' | sed 's/[.]/[.]/g; s/^/^/; s/$/::/' | paste -sd'|')"
grep -Ev "$pattern" workshop/triage-gpu-nodeids.txt > /tmp/tk-nodeids.txt
echo $FILES | tr ' ' '\n' >> /tmp/tk-nodeids.txt
echo 'tests/reliability/test_reliability_ops.py::test_empty_tensors' >> /tmp/tk-nodeids.txt
TESTS="tr '\n' '\0' < /tmp/tk-nodeids.txt | TK_FAILURE_LOG=\$R/failures.txt xargs -0 python3 -m pytest -v -n 12 \
  --tb=short -p no:cacheprovider -rfE --junitxml=\$R/junit.xml"
TAIL_LINES=12 exec bash workshop/run_stages.sh "$OUT" \
  "build|${BUILD_S:-110}|python3 tools/build_kernel.py --archs native" \
  "tests|${TESTS_S:-170}|$TESTS" \
  "train|${TRAIN_S:-50}|python3 benchmarks/bench_train.py --variants eager liger ours --steps 5 --warmup 2 --out \$R"
