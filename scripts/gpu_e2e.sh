#!/usr/bin/env bash
# End-to-end benchmarks on the GPU machine (after scripts/gpu_check.sh has built the kernel):
# Llama-3.1-8B prefill/decode, then the LTX-Video 2B transformer at the baseline's shape (49 frames,
# 512x768, batch 2) in the four configurations. Results (JSON + markdown) into RESULTS_DIR.
#   scripts/gpu_e2e.sh [RESULTS_DIR]          LTX_S=seconds caps the LTX run (default 400)
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS_DIR="${1:-benchmarks/results}"
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
[ -d /tmp/tk-site ] && export PYTHONPATH="/tmp/tk-site${PYTHONPATH:+:$PYTHONPATH}"
time "$PYTHON" benchmarks/bench_llm.py --out "$RESULTS_DIR"
time timeout "${LTX_S:-400}" "$PYTHON" benchmarks/bench_ltx.py --matrix --num-frames 49 --height 512 --width 768 \
  --steps 10 --warmup-iterations 1 --out "$RESULTS_DIR"
time timeout "${PIPELINE_S:-300}" "$PYTHON" benchmarks/bench_ltx.py --pipeline --num-frames 49 --height 512 \
  --width 768 --steps 10 --warmup-iterations 1 --out "$RESULTS_DIR"
