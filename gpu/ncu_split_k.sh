#!/usr/bin/env bash
# Where a split-K kernel's warps wait, with its partial-sum exchange and without it (-DGEMMGEN_SM90_EXPERIMENT_SK_NO_FIXUP=1,
# wrong sums): ncu's warp-state and sampled-stall sections on one launch of each (docs/sm90.md, "What a split's partial
# sums cost").   gpu/ncu_split_k.sh SHAPE "PLAN ARGS"   e.g. 256x512x7168 "--tile 128x64x64 --cluster 1x1"
set -uo pipefail
shape=${1:-256x512x7168}
plan=${2:---tile 128x64x64 --cluster 1x1}
for variant in exchange nofix; do
  flags=""; [ $variant = nofix ] && flags="-DGEMMGEN_SM90_EXPERIMENT_SK_NO_FIXUP=1"
  export GEMMGEN_EXTRA_NVCC_FLAGS="$flags"
  python3 gpu/ncu_kernel.py --shape "$shape" $plan --stream-k > /dev/null   # build outside ncu
  echo "== $variant $shape $plan"
  ncu --launch-skip 3 --launch-count 1 -k regex:sm90 --section SpeedOfLight --section WarpStateStats \
      --section SourceCounters --section LaunchStats --print-details all python3 gpu/ncu_kernel.py --shape "$shape" $plan --stream-k 2>&1 \
    | grep -v "^\[gemmgen\]\|^==PROF==" 
done
