#!/usr/bin/env bash
# Nsight Compute counters of our kernels and a copy on benchmark shapes (workshop/ncu_probe.py):
# DRAM and L2 traffic, L1 hit rate, occupancy. Clocks are left as they run (no base-clock lock).
#   workshop/gpu_ncu.sh OUT_FILE.csv
set -uo pipefail
cd "$(dirname "$0")/.."
NCU="$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
[ -n "$NCU" ] || { echo "ncu not found on this machine"; exit 2; }
METRICS=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,\
dram__bytes_write.sum,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,\
l1tex__t_sector_hit_rate.pct,l1tex__throughput.avg.pct_of_peak_sustained_active,\
sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__block_size,\
launch__occupancy_limit_registers,sm__throughput.avg.pct_of_peak_sustained_elapsed,\
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct
# WarpStateStats (why warps stall) and InstructionStats / ComputeWorkloadAnalysis (which pipes
# issue): the modulated norms are 80 % SM-busy at 60 % of copy, and guesses at the cause
# (conversions, 64-bit divisions) bought a few points each (benchmarks/NOTES.md §Norms).
# Only our kernels (and Liger's rms_norm, the baseline ours trails): the probe's input generation
# (randn) would double the profiling time.
"$NCU" --clock-control none --kernel-name regex:"kernel_entry|_rms_norm_forward_kernel" \
  --metrics "$METRICS" --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis --csv \
  "${PYTHON:-python3}" workshop/ncu_probe.py > "$1"
