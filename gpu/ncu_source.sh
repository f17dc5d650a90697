#!/usr/bin/env bash
# Per-instruction profile (SASS, warp-stall samples and executed counts per instruction) of the planner's kernel and
# of cuBLAS' on the same shape and data, to read where each one's warps wait: the main loop's wgmma waits, the
# barriers, the promotion, the epilogue. Clocks left alone (METHOD.md).
#   [CUBLAS_KERNEL=regex:nvjet] gpu/ncu_source.sh SHAPE DTYPE "EXTRA ncu_kernel.py args"
# Writes $OUT/ncu_source_<shape>_<dtype>_{ours,cublas}.csv (ncu's source page as CSV) and a summary of each.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
SHAPE=${1:-2048x7168x2048}
DTYPE=${2:-e4m3}
EXTRA=${3:-}
status=0
for who in ours cublas; do
  if [ $who = cublas ]; then kernel=${CUBLAS_KERNEL:-regex:nvjet}; args="--cublas $EXTRA"; else kernel=regex:'^sm[89]0_'; args=$EXTRA; fi
  report="/tmp/ncu_source_${who}"
  ncu --clock-control none --launch-skip 3 --launch-count 1 -k "$kernel" --section SourceCounters \
      --section WarpStateStats --section InstructionStats -f -o "$report" \
      python3 gpu/ncu_kernel.py --shape "$SHAPE" --dtype "$DTYPE" $args > "$OUT/ncu_source_${SHAPE}_${DTYPE}_${who}.log" 2>&1 || status=1
  ncu -i "$report.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu_source_${SHAPE}_${DTYPE}_${who}.csv" 2>&1 || status=1
  ncu -i "$report.ncu-rep" --page details > "$OUT/ncu_source_${SHAPE}_${DTYPE}_${who}_details.txt" 2>&1 || status=1
  head -c 600 "$OUT/ncu_source_${SHAPE}_${DTYPE}_${who}.csv"; echo
done
exit $status
