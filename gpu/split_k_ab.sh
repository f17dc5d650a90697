#!/usr/bin/env bash
# Split-K's partial sums: every part adding its slice of the tile (the template's default) against the k = 0 part
# adding all of them (-DGEMMGEN_SM90_EXPERIMENT_SK_SERIAL_FIXUP=1), on the planner's split-K kernels: 64x128 pingpong
# (at most 64 rows), 128x64 cooperative (up to a few hundred rows), 128x256 cooperative on a vocabulary head's dX.
#   OUT=/tmp/out gpu/split_k_ab.sh        (JSON and logs under $OUT)
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
status=0
variants=(--variant parallel= --variant serial=-DGEMMGEN_SM90_EXPERIMENT_SK_SERIAL_FIXUP=1)
run() {  # name, then ab_variants arguments
  local name=$1; shift
  python3 gpu/ab_variants.py --configs sm90 "${variants[@]}" --rounds ${ROUNDS:-3} --json "$OUT/ab_split_k_$name.json" "$@" \
    2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/ab_split_k_$name.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
}
run pp --kernel 64x128x64:1x1:pingpong:8:sk --shapes 64x1024x8192,48x2048x8192,64x2048x10944,32x4096x14336,64x4096x14336
run coop --kernel 128x64x64:1x1:cooperative:8:sk --shapes 128x1024x8192,256x1024x8192,512x1024x8192,128x2048x8192,256x2048x10944,128x4096x14336
run dx_head --layout tt --kernel 128x256x64:1x1:cooperative:4:sk --shapes 256x3584x152064,256x4096x128256,512x2048x151936
exit $status
