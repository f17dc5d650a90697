#!/usr/bin/env bash
# What L2 serves a clustered kernel against its 1x1 twin and cuBLAS's (docs/corpus.md, "ncu beside cuBLAS on the worst
# mid-size rows"): 1024 x 1024 x 3072 bf16 on 64x128 pingpong tiles at clusters 1x1 (blocks in the SMs' order), 2x1
# and 1x2, the 1x1 again in launch order (sm90/block_order.cuh off), then torch.matmul.
# The bytes the SMs receive (l1tex__m_xbar2l1tex_read_bytes) against the sectors L2 reads for them. Writes $OUT/mc/.
#   OUT=/tmp/out bash gpu/ncu_multicast_probe.sh
set -u
OUT=${OUT:-$PWD/gpu_out}
M=gpu__time_duration.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_op_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum
mkdir -p $OUT/mc
for c in 1x1 2x1 1x2; do
  ncu --clock-control none --launch-skip 3 --launch-count 1 -k regex:'sm90_' --metrics $M python3 gpu/ncu_kernel.py --shape 1024x1024x3072 --tile 64x128x64 --schedule pingpong --cluster $c > $OUT/mc/ours_$c.txt 2>&1
  echo "== $c"; grep -E "Profiling \"|gpu__time|lts__|l1tex__" $OUT/mc/ours_$c.txt
done
GEMMGEN_EXTRA_NVCC_FLAGS=-DGEMMGEN_SM90_BLOCK_ORDER=0 ncu --clock-control none --launch-skip 3 --launch-count 1 \
  -k regex:'sm90_' --metrics $M python3 gpu/ncu_kernel.py --shape 1024x1024x3072 --tile 64x128x64 --schedule pingpong \
  --cluster 1x1 > $OUT/mc/ours_1x1_launch_order.txt 2>&1
echo "== 1x1 launch order"; grep -E "Profiling \"|gpu__time|lts__|l1tex__" $OUT/mc/ours_1x1_launch_order.txt
ncu --clock-control none --launch-skip 3 --launch-count 1 -k regex:nvjet --metrics $M python3 gpu/ncu_kernel.py --shape 1024x1024x3072 --cublas > $OUT/mc/cublas.txt 2>&1
echo "== cublas"; grep -E "Profiling \"|gpu__time|lts__|l1tex__" $OUT/mc/cublas.txt
