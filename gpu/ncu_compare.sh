#!/usr/bin/env bash
# ncu, clocks left alone (--clock-control none, as the device's METHOD.md asks), on the planner's kernel and on
# torch.matmul's (cuBLAS) for the same shapes and data: duration, SM clock, tensor-pipe activity, memory.
#   [CUBLAS_KERNEL=regex:"nvjet|gemv"] gpu/ncu_compare.sh [SHAPES (default "4096x4096x4096 8192x8192x8192")] [DTYPE (default bf16)] [EXTRA ncu_kernel.py args]
# Writes $OUT/ncu_<shape>_<dtype>_{ours,cublas}.txt.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
SHAPES=${1:-"4096x4096x4096 8192x8192x8192"}
DTYPE=${2:-bf16}
EXTRA=${3:-}
# The tensor pipe's activity counters this ncu knows for the chip (names differ between ncu versions).
TENSOR=$(ncu --query-metrics --chip gh100 2>/dev/null | awk '{print $1}' | grep -E '^sm__pipe_tensor_op_(gmma|hmma)_cycles_active$' |
         sed 's/$/.avg.pct_of_peak_sustained_elapsed/' | paste -sd, -)
# L2 -> SM bytes (the loads' sectors from L2) and the SMs' share of the kernel with a warp resident (SM fill): the
# terms issue 34's mid-M rows are read by, beside the stall reasons of WarpStateStats.
METRICS=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,sm__cycles_active.avg.pct_of_peak_sustained_elapsed${TENSOR:+,$TENSOR}
echo "metrics: $METRICS"
status=0
for shape in $SHAPES; do
  for who in ours cublas; do
    # cuBLAS on the same operands (EXTRA's --layout strides them); its kernel by CUBLAS_KERNEL (nvjet by default)
    if [ $who = cublas ]; then kernel=${CUBLAS_KERNEL:-regex:nvjet}; args="--cublas $EXTRA"; else kernel=regex:'sm[89]0_'; args=$EXTRA; fi
    ncu --clock-control none --launch-skip 3 --launch-count 1 -k "$kernel" \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section SchedulerStats --section WarpStateStats --metrics "$METRICS" \
        python3 gpu/ncu_kernel.py --shape "$shape" --dtype "$DTYPE" $args > "$OUT/ncu_${shape}_${DTYPE}_${who}.txt" 2>&1 || status=1
    grep -E "Profiling|Duration|SM Frequency|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|pipe_tensor|dram__bytes|lts__t_sectors|sm__cycles_active|Stall" \
        "$OUT/ncu_${shape}_${DTYPE}_${who}.txt" | sed "s/^/$shape $who: /"
  done
done
exit $status
