"""The sm90 planner (Hopper: TMA, wgmma, warp specialization): the candidates it weighs and the small
analytic model it weighs them with. Every number here is a heuristic with its reason next to it; measured
tuning may replace the estimate later, never the legality rules in config.check_sm90.

What is chosen, and how:

* **schedule and tile**. A block always runs 3 warpgroups: one producer (TMA loads) and two consumers
  (wgmma). ``cooperative`` splits each tile between the consumers along M and is persistent (one block
  per SM walks many tiles); its epilogue (registers -> D) is not hidden behind math. ``pingpong`` gives
  each consumer its own tile, alternately, so one's epilogue runs under the other's mainloop; a tile
  then has to fit one warpgroup's 128 accumulator registers per thread, so pingpong tiles are half the
  size. ``ws`` (one tile per block, not persistent) is never chosen by the planner: the persistent
  schedules hide each tile's pipeline fill behind the previous tile; it is there when asked for.
* **cluster**. A 2x1 cluster puts two blocks on neighbouring M tiles of one N tile: they need the same B
  tile, so each loads half of it and TMA multicasts it to both (1x2: the same with A). That cuts the
  L2 -> SM bytes per flop, at the price of coupling the two blocks' pipelines.
* **stages**: as many as fit in shared memory (at most SM90_MAX_STAGES; only 64x64 tiles fit more than 8): the
  deeper the ring, the more TMA latency is hidden, and a Hopper block has nothing else to spend its 227 KB on.
* **raster order and group**: see ``choose_raster``.

The cost model, in relative units (not seconds):

    cost = tiles on the busiest SM * BM * BN * (K + per-tile overhead) / efficiency

* tiles on the busiest SM: the grid of tiles (rounded up to whole clusters: a partial cluster still
  occupies cluster-many SMs) over the SMs that clusters can fill. This is the wave quantization that
  decides small problems: one 128x256 tile per SM takes as long as one 64x128 tile takes four times.
* per-tile overhead, in units of K: the exposed epilogue (cooperative), also the pipeline fill (ws).
* efficiency = l2_efficiency * wgmma_efficiency * issue_efficiency. The first two have the form
  x / (x + x_half) where x is a reuse ratio: the tensor cores run at peak only if operands arrive
  fast enough.
    - l2: MACs per element brought from L2 into the SM per k step = BM*BN / (A rows + B columns),
      where a multicast operand counts half (each block of the cluster loads half of it) and rows
      past the matrix edge count nothing. (A load wholly past the edge is not issued; the rows past the
      edge of a box that straddles it TMA fills with zeros, slowly, which the model does not see: at most
      31 rows of A, which the tile across A's last row loads in 32-row boxes, but nearly a whole box
      of B's columns at N's edge; docs/sm90.md, "Loads past the matrix edge".)
    - wgmma: MACs per element read from shared memory by one wgmma m64nNk16 = 64*N / (64 + N): wide N
      reuses the A fragment; N=256 reads 17% fewer bytes per MAC than N=128.
    - issue: wgmma is asynchronous, and the tensor cores stay busy only while enough of them are in
      flight. Cooperative (and ws) tiles keep two warpgroups issuing at once; a pingpong warpgroup
      issues alone (its partner is in its epilogue), so a 64-row pingpong tile has a single m64
      wgmma stream whose latency shows: measured 0.58x of 128x256 cooperative at 4096^3 where the
      other terms predict 0.89x (docs/planner.md, sm90 cost model), hence ISSUE_EFFICIENCY.

Calibration (docs/planner.md, sm90 cost model, 4096^3 bf16, relative to 128x256 cooperative c2x1): c1x1 0.96 measured
/ 0.97 modelled, c1x2 0.98 / 0.97, 256x128 cooperative c1x1 0.97 / 0.94, 128x128 pingpong c2x1
0.94 / 0.94, 64x256 pingpong c1x1 0.58 / 0.58.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Optional

from ..spec.arch import ArchSpec
from ..spec.config import (MIN_STAGES, RASTER_GROUPS, RASTERS, SM90_BLOCK_N, SM90_ODD_BLOCK_N, KernelConfig,
                           check_config, exchanged_operands, is_legal, promote_slices, reads_a_into_registers,
                           runs_transposed_product, sm90_block_k, sm90_max_stages_that_fit, transposed_product,
                           transposes_in_smem)
from ..spec.epilogue import IDENTITY, Epilogue
from ..spec.types import DType, Layout, Order
from .common import DEFAULT_PROBLEM, Estimate, Knobs, Problem, epilogue_overhead_k, pick

# (schedule, (BM, BN)) in order of preference: on equal cost the earlier one wins. The big cooperative
# tiles first (most reuse per loaded byte), pingpong's half-size tiles after them.
CANDIDATE_TILES: tuple[tuple[str, tuple[int, int]], ...] = (
    ("cooperative", (128, 256)),
    ("cooperative", (256, 128)),
    ("cooperative", (128, 128)),
    # Where its tile count fills the last wave better than 128x256's: 512x6144x4096 0.91x cuBLAS against 0.83x
    # (96 tiles of 128x256 leave a quarter of the SMs idle, 128 of 128x192 none), 1024x6144x4096 1.02x against 1.00x
    # (H200, gpu/midm_tiles.py, docs/planner.md).
    ("cooperative", (128, 192)),
    ("cooperative", (128, 64)),     # small M: more tiles along N, so more SMs get work
    ("pingpong", (64, 256)),
    ("pingpong", (128, 128)),
    ("pingpong", (64, 128)),        # small M: 64 rows waste less of the tile than 128
)
# Promoted fp8 (KernelConfig.promoted) holds a second set of accumulators: 128x192 is the widest tile whose k tile
# fits whole beside the tile's sums, weighed for promoted plans alone (the 16-bit plans keep their measured
# candidates). 128x256 and 256x128 sum each k tile in two column slices (spec/config.py promote_slices), which
# costs the efficiency below: measured 0.97 of 128x192 at 8192^3 (1184 against 1220 TFLOP/s) and at 4096x14336x4096
# equal, while at 4096^3 its fewer waves win (1228 against 1149; docs/dtypes.md).
PROMOTED_TILES: tuple[tuple[str, tuple[int, int]], ...] = (("cooperative", (128, 192)),)
# 128-row cooperative tiles whose N is no multiple of 64 (SM90_ODD_BLOCK_N from 144 up), weighed after the others
# (equal cost keeps the even tile) for 16-bit inputs with a K-major B, where their count fills the waves better:
# 1024 x 4544 x 4544 128x144 c2x1 0.947x cuBLAS against 0.759x for 128x192 (256 tiles in 2 full waves against 192 in a
# half-empty second), 8192 x 576 x 2048 128x144 c1x1 0.925x against 0.769x (4 tiles across N instead of 3, last one
# full), 512 x 4544 x 4544 0.901x against 0.777x; where they add a wave the model keeps the even tile (2048 x 1408 x
# 2048: 0.899x for 128x192 against 0.674-0.690x). H200, bf16 tn, gpu/midm_tiles.py, h200_midm_odd_n_tma.json.
# Narrower ones (80-128) lost where measured (8192 x 576 x 2048: 128x112 0.522x, 128x96 0.734x).
ODD_TILES: tuple[tuple[str, tuple[int, int]], ...] = tuple(("cooperative", (128, bn)) for bn in SM90_ODD_BLOCK_N
                                                            if bn > 128)
# What the model does not see of an odd tile (its columns past the last whole 64-column subtile stored directly, the
# partial last tile column) as an efficiency factor: an odd tile is taken only where it saves more than this, as in
# the measured wins (the same waves on a quarter narrower tile), never for the 1-2 % that a wave count rounded a
# little better gives on a large problem (8192^3: 128x224 would model 1.5 % under 128x256).
ODD_N_EFFICIENCY = 0.85
# tf32 tiles transposed in shared memory (a column-major A, a row-major B: transposes_in_smem) cost shared-memory
# bandwidth beside TMA's writes and wgmma's reads: the kernel slows as 1 / (1 + TRANSPOSE_COST * x), x the bytes
# transposed per k tile per element of the tile (128x256: A 0.5, B 1.0). Fitted to H200 runs at 4096^3 and 8192^3
# (h200_bench_tf32_layouts.json): x = 0.5 0.76-0.83 of tn, 1.0 0.60-0.64, 1.5 0.55-0.57. So a row-major B takes
# 256x128 tiles rather than 128x256 (half the bytes transposed per product: 0.76 against 0.64 of tn).
TRANSPOSE_COST = 0.5
# tf32 tt runs as the transposed product D^T = B^T A^T (spec/config.py transposed_product), nn's kernel on N x M, and
# is planned as that (transposed_plan) above this many rows. At fewer, nn's few-column rules would plan it, which do
# not split K: H200, 128x4096x4096 ran 0.889x cuBLAS on nn's 128x64 pingpong, 1.142x on tt's own (tn's) 128x64
# cooperative split in 2; 64 rows 0.628x unsplit (docs/dtypes.md). At 256 rows both plan the same kernel.
TT_OWN_ROWS_MAX_M = 128
PROMOTION_SLICED_EFFICIENCY = 0.97
# A promoted (fp8) pingpong warpgroup waits for each k tile's wgmmas and promotes them alone (its partner is in its
# epilogue or waiting for its turn), so the tensor cores idle through every promotion; the two warpgroups of a
# cooperative tile each promote while the other's wgmmas run. Measured (H200, e4m3 tn, bench_dtypes.py,
# h200_fp8_schedules.json), the same 128x128 tile pingpong against cooperative: 2048x7168x2048 854 against 1044
# TFLOP/s per tensor and 793 against 947 per block (0.82, 0.84), 512x4096x7168 789 against 1013 and 708 against 883
# (0.78, 0.80). The mildest ratio: promoted pingpong then loses wherever a cooperative tile of the same shape exists
# (not at 256 rows, where the 64-row pingpong tile stays: 478 against 430 for 128x128 cooperative).
PROMOTED_PINGPONG_EFFICIENCY = 0.84
# tf32 with an M-major A read into registers (reads_a_into_registers: nn, nt, and tt's transposed product): a pingpong
# warpgroup alone on a 128-row tile loads both m64 halves' fragments of A from shared memory before its wgmmas, with
# no other warpgroup's wgmmas beside them; the two warpgroups of a cooperative 128-row tile load one half each.
# Measured (H200, bench_dtypes.py, h200_tf32_register_a_pingpong.json), 128x128 pingpong against cooperative on seven
# shapes of 128-2048 rows: nn 0.81-0.93 (1024x14336x4096: 244 against 283 TFLOP/s), tt 0.80-0.90, nt 0.99-1.01 (its
# B transpose bounds both schedules). 64-row pingpong tiles hold half the fragments and lose little (64x4096x4096 nn
# 0.98 of tn's kernel, h200_tf32_tt_planned.json).
REGISTER_A_PINGPONG_EFFICIENCY = 0.86
# tf32 with an M-major A read into registers, more than TT_OWN_ROWS_MAX_M rows (in the measured band below), D
# row-major: where the 128x256 cooperative tile splits over K (split_k_parts) and its tiles reach at least
# REGISTER_A_SPLIT_MIN_SM_SHARE of the SMs, plan it (register_a_split_tile). Its wgmmas are 256 columns wide, the A
# fragments' loads spread over twice the columns of the 128-column tiles the estimate prefers, and the split fills the
# SMs its tiles leave; the estimate weighs neither. Measured (H200, bench_dtypes.py, x cuBLAS TF32, this tile split
# against the planner's pick before), h200_tf32_register_a_pingpong.json (the `c256` rows): nn 512x4096x4096 0.960 /
# 0.920, 256x8192x8192 0.961 / 0.936, 2048x1024x8192 1.025 / 0.897, 1024x1024x8192 1.065 / 0.818, 768x2048x7168 0.966
# / 0.853, nt 1.029-1.145 / 0.941-0.960 on the same five; then on nine other shapes (h200_tf32_register_a_split.json,
# beside 128x128 cooperative and 64x128 pingpong): of 24-64 tiles, nn 0.99-1.14 and nt 1.07-1.24 against 0.86-1.00
# and 0.89-0.97 for the best other, but for nn 256x4096x4096 (0.889 against 1.030 for 128x128 split); of 8-16 tiles
# (256 and 512 x 1024 x 8192) the 128x128 split won by 1.1-1.3x, hence the share. At 128 rows (128x14336x4096) the
# split tile lost (nn 1.211 / 1.292); tt's transposed product (its D column-major) was not measured.
REGISTER_A_SPLIT_TILE = (128, 256)
REGISTER_A_SPLIT_MAX_M = 2048    # the measured rows and columns: 256-2048 x 1024-8192
REGISTER_A_SPLIT_MIN_N = 1024
REGISTER_A_SPLIT_MIN_SM_SHARE = 1 / 6
# The narrow tile's N (128x64 cooperative: see candidate_shapes).
NARROW_BN = 64
# 128x64 cooperative is weighed beyond one 128-row tile for problems of at most these many rows and columns (narrow
# layers: kv projections, an MoE's down projections). Measured (H200, bf16 tn, gpu/midm_tiles.py,
# h200_midm_narrow.json): 512 x 2048 x 2048 0.900x cuBLAS against 0.781x for 64x128 pingpong, 256 x 2048 x 4096
# 0.798x against 0.773x, 512 x 1024 x 4096 0.829x against 0.806x; at 1024 rows it lost (1024 x 1024 x 3072: 0.805x
# against 0.820x), and at 6144 columns by far (512 x 6144 x 4096, candidate_shapes).
NARROW_TILE_MAX_M = 512
NARROW_TILE_MAX_N = 2048
# 64x64 pingpong: where 64x128 pingpong tiles would reach at most half the SMs (so the 64x64 tiles still fit one wave)
# and K is short of split-K (SPLIT_K_MIN_K_TILES), twice the tiles put twice the SMs to work on the same bytes of B.
# Its 16 KB stages run 12 deep (SM90_MAX_STAGES), as cuBLAS runs its 64x64 tiles 13 deep. Measured (H100, bf16 tn,
# gpu/midm_tiles.py, h100_midm_narrow_stages.json), 12 stages against 8: 64 x 1024 x 4096 0.924x cuBLAS against
# 0.828x, 128 x 512 x 3584 0.944x against 0.840x, 256 x 512 x 2048 0.954x against 0.853x, 192 x 1024 x 2048 1.016x
# against 0.956x; and against the 128x64 cooperative tile that the quarter-share rule left these shapes (its 64x128
# tiles reach a quarter to half of the SMs): 256 x 1408 x 2048 0.942x against 0.800x, 512 x 768 x 2048 0.892x against
# 0.843x, 256 x 2048 x 4096 0.862x (2x1 cluster) against 0.797x. Where 64x128 tiles fill more than half the SMs the
# cooperative tile stays ahead (512 x 1408 x 2048: 0.939x against 0.681x; 512 x 2048 x 2048 0.935x against 0.683x);
# beside split-K it lost on the H200 (256 x 1024 x 8192: 0.701x against 0.764x, h200_midm_narrow.json).
SMALL_TILE = (64, 64)
SMALL_TILE_MAX_SM_SHARE = 1 / 2
# At most this many rows (M), and only tiles of as many rows: a 128-row cooperative tile gives its second consumer
# warpgroup nothing but zero rows. Measured (bf16 tn, H200, gpu/midm_tiles.py, docs/planner.md): 64x128 pingpong
# 0.93x cuBLAS at 32x8192x8192 and 1.01x at 64x8192x8192, against 0.55x and 0.65x for the 128x64 cooperative tile
# the model preferred (it prices the zero rows as work).
SMALL_M_TILE_ROWS = 64
# Split-K (KernelConfig.stream_k with fewer units than SMs: every unit in equal k parts, templates/sm90/launch.cuh)
# for a cooperative plan whose tiles leave at least half the SMs idle and whose K has at least this many k tiles
# (bf16: K >= 8192). Measured (H200, gpu/midm_tiles.py): 128x4096x14336 (224 k tiles) 0.98x cuBLAS split against
# 0.86x data-parallel; 128x4096x4096 (64 k tiles) 0.86x against 0.88x: the partial sums' round trip does not pay.
SPLIT_K_MIN_K_TILES = 128
# With more than one 64-row tile row (M > SMALL_M_TILE_ROWS) and 16-bit inputs, split-K from this many k tiles
# (K >= 2560). A block walks a 64-wide k tile of a 64x64 or 128x64 tile in ~190 ns whatever its width, depth and the
# number of blocks beside it (docs/corpus.md, "what a k tile costs one block"), so where the tiles leave half the
# SMs idle the run is the k tiles one block walks, and cuBLAS splits those layers (its 64x64 splitK kernel at
# 256 x 512 x 7168). Measured on the corpus' forward layers at 128-1024 tokens (H200, bf16 tn, gpu/midm_tiles.py
# --variants stream_k=true, h200_midm_corpus_split_k.json), the pick split against whole where its tiles reach at most
# half the SMs: 44-64 k tiles 1.02-1.27x on all 16 such rows (256 x 512 x 3584 0.658 -> 0.815x cuBLAS, 128 x 1024 x
# 4096 0.633 -> 0.799x), 32 k tiles 0.85-1.00x on all 12 (so not there). At most one 64-row tile row streams B
# alone and stays at SPLIT_K_MIN_K_TILES (docs/planner.md: 64 x 3584 x 4096 6 % behind split).
SPLIT_K_SEVERAL_ROWS_MIN_K_TILES = 40
# Few tiles, 16-bit inputs: split-K from fewer k tiles, in parts of SPLIT_K_PART_K_TILES k tiles but at least
# SPLIT_K_MIN_PARTS of them (split_parts; the launch's split_k_parts is the same rule). Four parts take three quarters
# of a tile's k walk off its block, and the exchange after the last part grows with the parts (2.4 us at 4 parts, 3.6
# us at 8: docs/sm90.md). Where the tiles reach at most SPLIT_K_FEW_TILES_SM_SHARE of the SMs: more than one 64-row
# tile row splits from SPLIT_K_SHORT_K_MIN_K_TILES (K >= 2048); one row from SPLIT_K_SEVERAL_ROWS_MIN_K_TILES, and
# from SPLIT_K_SHORT_K_MIN_K_TILES on at most SPLIT_K_ONE_ROW_SHORT_K_SM_SHARE of the SMs (its whole tiles share one
# A tile and run closer to cuBLAS). Measured (H200, bf16, the split kernel's time against the whole one's;
# gpu/ab_variants.py, h200_split_k_min_part_ab.json, and the corpus at 64-512 tokens, h200_corpus_split_parts.json
# against h200_corpus_{fwd,bwd}_ten_counts.json): one 64-row tile row of 8-16 tiles at K = 3072-4096 1.24-1.44x
# (0.63-0.74x cuBLAS whole), of 32 tiles at K = 2816-4096 1.05-1.18x (forward and dX); at K = 2048 (32 k tiles) 8-18
# tiles 1.03-1.18x, 22-24 tiles 0.98-1.07x, 32 tiles over one row 0.905-0.937x (64 x 2048 x 2048, forward and dX;
# over four rows, 256 x 512 x 2048, 1.05-1.09x). Where the tiles reach more than a quarter of the SMs (2-3 parts) the
# split read 0.96-1.01x at K = 2048-3072, so the other bounds stay there.
SPLIT_K_FEW_TILES_SM_SHARE = 1 / 4
SPLIT_K_ONE_ROW_SHORT_K_SM_SHARE = 1 / 5
SPLIT_K_SHORT_K_MIN_K_TILES = 32
SPLIT_K_PART_K_TILES = 16
SPLIT_K_MIN_PARTS = 4
# Two 64-row tile rows (65-128 rows) where the model picks the 128x64 cooperative tile and does not split it: 64-row
# pingpong tiles instead (two_tile_rows_tile), 64x64 where two rows of them fit one wave (twice the SMs on the same
# k tiles), else below 128 rows 64x128 where two rows of those reach at most TWO_TILE_ROWS_WIDE_SM_SHARE of the SMs.
# Read from every candidate at 72-128 rows (H200, bf16 tn, gpu/midm_tiles.py, h200_midm_two_tile_rows_candidates.json,
# h200_midm_two_tile_rows_m.json): 64x64 1.13-1.33x the whole cooperative tile at 72-120 rows, 1.06-1.08x at 128;
# 64x128 1.14-1.33x at 72-112 rows on 4544-column layers (72 tiles), 0.965x at 128 rows. Then the rule's picks against
# the cooperative tile on the corpus' layers it touches (h200_midm_two_tile_rows_tn.json, ..._tt.json for the dX) and
# a few more widths (h200_midm_two_tile_rows_wide.json): 64x128 lost wherever two rows of it fill the SMs (8192
# columns, 128 tiles: 0.90-0.97x) and won up to 96 tiles (6144 columns: 1.05-1.06x), hence the share. Where the
# cooperative tile splits (SPLIT_K_SEVERAL_ROWS_MIN_K_TILES) the two tie (80 x 4096 x 4096 1.010x, 112 x 4096 x 4096
# 0.996x), so it stays.
TWO_TILE_ROWS = 2
TWO_TILE_ROWS_WIDE_SM_SHARE = 3 / 4
# The share of the SMs a plan's tiles may reach at most for split-K to be weighed, by schedule. Pingpong (the 64-row
# tiles of at most 64 rows) streams W at nearly the rate of the whole GPU from half the SMs, so a split in two does not
# pay for its partial sums: measured (H200, bf16 tn, gpu/midm_tiles.py, h200_midm_tiles_pp_splitk.json) 32 tiles of
# 64x128 cut in 4 parts at 32x4096x14336 0.91x cuBLAS against 0.74x whole, 64x4096x14336 0.96x against 0.82x; 64
# tiles cut in 2 at 32x8192x8192 0.88x against 0.91x, 64x8192x8192 0.94x against 1.01x.
SPLIT_K_MAX_SM_SHARE = {"cooperative": 1 / 2, "pingpong": 1 / 4}
# 64x64 pingpong (SMALL_TILE) splits while its tiles reach at most half the SMs: its fp32 partial tile is half a 64x128
# one, and two parts still paid there (32 x 3584 x 14336, 56 tiles: 0.983x cuBLAS split, 0.879x whole; measured with
# few_rows_long_k's rule, below).
SPLIT_K_SMALL_TILE_SM_SHARE = 1 / 2
# From this many k tiles (16-bit: K >= 65536; a vocabulary head's dX, whose K is the vocabulary) every 1x1 candidate
# whose tiles the launch cuts into at least SPLIT_K_LONG_K_MIN_PARTS k parts (SMs // tiles) is weighed so split, for
# either schedule (split_k_parts): each part still streams hundreds of k tiles, so the partial sums' round trip is
# noise beside the SMs a whole-K grid leaves idle. Measured on the corpus' vocabulary heads (H200, dX, bench_corpus.py
# --layers lm_head, docs/corpus.md): 4 to 8 parts won everywhere (256 x 2048 x 151936 0.47x -> 0.96x cuBLAS, 512 x
# 2048 x 151936 0.90x -> 0.99x); 2 parts won one shape (512 x 3072 x 128256 0.80x -> 1.01x) and lost three by 2-6 %
# (512 x 4096 x 128256, 256 x 8192 x 128256, 1024 x 2048 x *), so a split in two is left to tune().
SPLIT_K_LONG_K_TILES = 1024
SPLIT_K_LONG_K_MIN_PARTS = 4
# Below SPLIT_K_LONG_K_TILES the same split where each of its parts still walks at least this many k tiles (so from
# 4 x 120 = 480 k tiles, bf16 K >= 30720: the vocabulary heads of 32000-65024 entries): the exchange after the last
# part (2.4-3.7 us) then stays a few percent of a part's walk. Measured (H200, bf16 dY @ W, gpu/midm_tiles.py --layout
# tt, h200_midm_dx_head_mid_vocab.json), ours / cuBLAS, the pick before -> the split: 16 x 4544 x 65024 (64x256 in 7
# parts of 145 k tiles) 0.653 -> 0.920, 64 x 4544 x 65024 0.775 -> 0.952, 128 x 4544 x 65024 (128x256) 0.683 -> 0.907,
# 256 x 3072 x 32064 (128x192 2x1 in 4 parts of 125) 0.647 -> 0.976; parts of 45 k tiles lost to the 64-row and
# 128x64 tiles split in two (64 x 3072 x 32064 64x256 in 11 parts 0.811 against 0.947, 128 x 3072 x 32064 128x256
# 0.800 against 0.896).
SPLIT_K_LONG_K_PART_MIN_K_TILES = 120
# A long-K split with a 2x1 cluster (each B tile loaded once for the cluster's two tile rows, by multicast), weighed
# beside the 1x1 one wherever the plan has at least two tile rows: that cluster streams W, the vocabulary head's
# weight, from L2 once where two 1x1 blocks each fetch it. Measured (H100, bf16 dY @ W, gpu/midm_tiles.py --layout tt,
# h100_midm_dx_head_cluster_sk.json), split 4 ways either way: 256 x 3584 x 152064 128x256 0.929x cuBLAS at 2x1 against
# 0.670x at 1x1, 256 x 4096 x 128256 0.957x against 0.665x, 256 x 2048 x 151936 0.963x against 0.859x; 512 x 3072 x
# 128256 128x192 2x1 0.927x against 0.744x for the pick before (128x128 pingpong 2x1, whole K: 2 parts, below the
# rule's 4, so the pick stays); 512 x 2048 x 151936 0.946x against 0.889x (h100_midm_dx_head_cluster_sk_512.json).
LONG_K_SPLIT_CLUSTERS = ((2, 1),)
# A K of at least SPLIT_K_LONG_K_TILES k tiles over more than one wave of 128x128 tiles (a vocabulary head's dX at
# thousands of tokens): cooperative tiles of at least 128x192 only. Each tile then streams its operands for hundreds of
# microseconds, the blocks of a wave drift apart along K and L2 stops serving the panels they share, so the tiles that
# load the fewest bytes per flop win whatever the wave count says. Measured (bf16 dY @ W, gpu/midm_tiles.py --layout
# tt): 4096 x 3584 x 152064 128x256 c2x1 cooperative 1.029x cuBLAS against 0.687x for the 128x128 c2x1 pingpong tile
# the wave count prefers (H100, h100_midm_dx_bigk.json; H200 0.949x against 0.985x, h200_midm_dx_bigk.json); at K =
# 18944 the two read 0.925x and 0.934x. With the rule (H100, h100_midm_dx_longk_rule.json): 8192 x 3584 x 152064
# 128x256 1.043x against 0.446x, 4096 x 3584 x 256000 128x192 1.049x against 0.677x, 4096 x 3584 x 152064 128x192
# 0.935x against 0.650x.
LONG_K_WIDE_TILE_MIN_AREA = 128 * 192
# The schedules the planner weighs for a tile the user fixed (ws only when asked for: see above).
PLANNED_SCHEDULES = ("cooperative", "pingpong")

# Per-tile overhead in units of K (a tile costs BM*BN*(K + overhead)). The epilogue of a 128x256 tile
# writes 64 KB of bf16 D at roughly the rate the SM computes 64 k of it; persistent cooperative blocks
# hide the next tile's pipeline fill (the producer runs ahead) but not the epilogue; pingpong hides
# the epilogue too; ws (one tile per block) pays both, the fill (~1 us of TMA latency) adding ~128 k.
OVERHEAD_K = {"pingpong": 0, "cooperative": 64, "ws": 192}
# x_half of the efficiency terms (see the module docstring): the reuse ratio at which operand traffic
# costs as much time as the math it feeds. L2 -> SM: ~32 B/clk/SM against 2048 bf16 MACs/clk/SM;
# shared memory: 128 B/clk/SM, more than enough at any N, so a mild term that only ranks N.
L2_HALF_REUSE = 16.0
SMEM_HALF_REUSE = 8.0
WGMMA_M = 64
# Efficiency by the number of m64 wgmma streams in flight at once (warpgroups issuing together x m64
# blocks each): one stream (64-row pingpong) leaves the tensor cores waiting; fitted to 64x256
# pingpong's measured 0.58x (see the module docstring). A 64-row cooperative tile (split along N between its two
# warpgroups, KernelConfig.splits_n) counts as one stream: its two half-width streams measured no faster than one
# pingpong warpgroup on the whole tile (H100, bf16 tn, gpu/midm_tiles.py, h100_midm_split_n.json: 64x128 at
# 1024 x 1024 x 3072 0.711x cuBLAS against 0.728x, 512 x 4096 x 4096 0.601x against 0.601x, 1024 x 4096 x 4096 0.522x
# against 0.521x), so the planner never prefers it; tune() and a user's schedule="cooperative" reach it.
ISSUE_EFFICIENCY = {1: 0.65}
# A cluster's blocks wait for each other (a stage is free only when both have used it): multicast has
# to save more than this to be worth it.
CLUSTER_COUPLING = 0.98
# A one-wave grid weighs a 2x1 cluster from this many k tiles on (see one_wave_streams_b).
ONE_WAVE_CLUSTER_K_TILES = 64
# At most two 64-row tile rows, a long K (SPLIT_K_MIN_K_TILES) and 64x128 tiles in 2x1 clusters that fill at least
# this share of the SMs in one wave: 64x128 pingpong 2x1 (few_rows_stream_b). The run is W's stream from L2: each
# block loads 64 rows of A and half of a 128-row B tile per k tile (multicast), against 192 rows for the 128x64
# cooperative tile the model prefers for its two wgmma streams. Measured (H200, bf16 tn, gpu/midm_tiles.py,
# h200_midm_tiles_m128.json; calibration sweeps h200_confirmed_calibrate_sm90_*.json): 128x8192x28672 1.030x cuBLAS
# against 0.954x, 128x8192x8192 0.976x against 0.942x; at 96 tiles (128x6144x4096, a short K) it lost, 0.880x
# against 0.938x.
FEW_ROWS_STREAM_B_SM_SHARE = 0.9
# At most one 64-row tile row (SMALL_M_TILE_ROWS), a long K (SPLIT_K_MIN_K_TILES up to SPLIT_K_LONG_K_TILES) and
# 64x128 tiles that reach at most half the SMs (SMALL_TILE_MAX_SM_SHARE): 64x64 pingpong, 1x1, split into the parts
# the SMs hold where its tiles reach at most SPLIT_K_SMALL_TILE_SM_SHARE of them, else whole (few_rows_long_k). The
# model kept the 64x128 tile there, split where it reached a quarter of the SMs and whole above. Measured (H200,
# bf16 tn, gpu/midm_tiles.py, h200_midm_small_tile_candidates.json; the rule's picks confirmed on shapes and dX it
# was not read from, h200_midm_small_tile_long_k_{tn,tt}.json and ..._corpus64_{tn,tt}.json, docs/planner.md rule 9),
# ours / cuBLAS, 64x128 (the pick before) against 64x64: split both, 32 x 3584 x 14336 0.924 -> 0.983,
# 64 x 2048 x 10944 0.834 -> 0.898, 64 x 1024 x 14336 0.840 -> 0.904, 64 x 3584 x 18944 0.962 -> 0.996,
# 64 x 4096 x 14336 0.978 -> 1.016; whole (64x128 tiles on a quarter to half of the SMs), 32 x 4544 x 18176
# 0.852 -> 0.998, 48 x 8192 x 29568 0.972 -> 1.052, 64 x 8192 x 8192 1.011 -> 1.029.
FEW_ROWS_LONG_K_BN = 128
FEW_ROWS_STREAM_B_BN = 128
DEFAULT_RASTER_GROUP = 8
# Few columns (129-512) and an M-major A with a K-major B (layout nn: a linear layer's dX computed as its transpose,
# dX.t() = W.t() @ dY.t(), the weight's rows along M and the tokens along N: planner.backward.swaps_operands): where
# the 128-row pingpong tile of 64-128 columns (16-column steps) whose one wave fills the most SMs has a width that is
# no multiple of 64, that tile, 1x1, raster m. The model prefers 128x128 there (it prices the odd widths as slower
# than they run) and 128x80 with raster n where it weighs them. Measured (H200, bf16, gpu/midm_tiles.py --layout nn,
# h200_midm_dx_swapped_nn.json; ratios to cuBLAS's dY @ W): 3072 x 384 x 3072 128x80 1.002 against 0.841 for the
# model's 128x128, 3584 x 384 x 3584 128x96 1.001 against 0.928, 4096 x 384 x 4096 128x96 1.043 against 0.981; 128x80
# in raster n read 0.61-0.69. Where the fill is best at a multiple of 64 (128x64, 128x128) the rule leaves the plan
# to the model: on the corpus' dX, 128x64 pingpong read 0.92-0.96x the tt kernels (h200_corpus_dx_swapped_*.json).
# Not over a K the long-K split takes (long_k: that split is the model's).
FEW_COLUMNS_FILL_N = (129, 512)
FEW_COLUMNS_FILL_BM = 128
FEW_COLUMNS_FILL_BN = tuple(range(64, 129, 16))
# A batch of problems that one 2x1 cluster of 128x256 cooperative tiles covers whole (129-256 rows, 129-256
# columns): that tile and cluster (cluster_covers_each_problem). Each problem's A and B then cross from L2 into the
# SMs once, B by multicast; 128x128 pingpong, which the model prefers for its hidden epilogue, loads each problem's A
# twice and B twice. Measured at 512 x 256^3 (bf16, x torch.bmm, gpu/bmm_tiles.py, docs/batched.md): H100 0.980
# against 0.886 for the pick, H200 0.982 against 0.941 (h200_bmm_tiles.json).
COVERING_TILE = (128, 256)
COVERING_CLUSTER = (2, 1)
# A ragged problem's groups (a grouped call's, Problem.ragged) have rows spread around the expected m: each group's
# last cluster unit along M is this much empty on average (a group of m rows takes m / rows-per-unit + 1/2 units).
RAGGED_LAST_UNIT = 0.5
# ... and the groups that hold most of its rows have about this many times the expected m (64-row tiles only where
# those fit one: candidate_shapes).
RAGGED_TYPICAL_ROWS = 2
# Ragged groups of at most RAGGED_FEW_ROWS expected rows are a decode step's experts (tokens x top-k rows over E
# groups): most groups hold one row or none, so how many groups have rows, and with them the grid, is unknown at plan
# time (one token of DeepSeek-V3 routed to 32 local experts: one group of one row). There a 64-row pingpong pick
# wider than RAGGED_FEW_ROWS_BN takes that width (ragged_few_rows): twice the tiles per group, each streaming half of
# the expert's weight columns, which loses nothing where every group has rows (the run is the weights' stream either
# way). Measured (H200, bf16 tn, benchmarks/bench_moe.py --tokens 1,16,64,256, five models, three routings,
# h200_bench_moe_small_tokens.json), 64x128 against the pick 64x256: 78 rows of m <= 4 1.069x geomean, 0.971-1.471x
# (1 token: 1.168x; 16 and 64 tokens 1.006-1.025x per m); 40 rows of m = 8-32 0.96-1.01x per m (no rule there).
# docs/planner.md rule 20, docs/grouped.md "Decode steps".
RAGGED_FEW_ROWS = 4
RAGGED_FEW_ROWS_BN = 128
# 16-bit pingpong tiles of an odd width (SM90_ODD_BLOCK_N) writing a row-major D stage it in the ring slot of their
# last k tile (KernelConfig.staging_in_ring), the ring taking the stages its buffers' bytes give (128x96 6 -> 8, 128x80
# 7 -> 8, 128x112 6 -> 7): ring_staged. Measured on the corpus' forward, each pick against itself staged or not (H200,
# bf16, gpu/midm_tiles.py, 3 rounds): pingpong 1.036x geomean over 13 GEMMs at 64-1024 tokens
# (h200_staging_in_ring_corpus_fwd.json) and 1.035x over 13 at 96, 384 and 768 tokens that the rule was not read from
# (h200_staging_in_ring_corpus_fwd_confirm.json): 14 of the 26 faster by more than 2 % (128x96: every one, up to
# 1.10x), one slower by more than 2 % (0.96x). Cooperative odd widths, whose epilogue overlaps nothing: 1.011x then
# 0.991x (down to 0.91x), so they keep their buffers, as do the widths of a multiple of 64 (0.998x over 183 GEMMs;
# 128x256 gains no stage) and a column-major D (the swapped dX's 128x80-112 pingpong tiles, staged transposed:
# 0.983x over 17, down to 0.89x, h200_staging_in_ring_dx_swapped_dcol.json).
LAYERED_RULE_DTYPES = (DType.bf16, DType.fp16)   # (rules 18 and 19's, measured on bf16)
# A 16-bit 128x128 pingpong pick writing a row-major D whose waves an odd width (SM90_ODD_BLOCK_N) fills at least this
# many times better takes that width, the pick's cluster and raster kept (filling_pingpong_tile). The model prices
# the odd widths' narrower wgmmas above what they cost at one or two waves. Read from the H200 dispatch table's
# tuned winners (generator/tune/tables/h200.json, 3-round medians of benchmarks/tune_corpus.py): of the 34 corpus
# forward rows where the estimate picked 128x128 pingpong and such a width filled the waves 1.3-1.6x better, the
# tuned winner was that width on 27 (1.024-1.250x the pick, the cluster and raster the pick's on every one); on the
# 7 others the pick stayed (within 1 % or ahead). Where the fill gains less than 1.3x, the width won 5 of 15.
FILLING_PINGPONG_MIN_GAIN = 1.3
# ... on the parts it was measured on. The H100 table (generator/tune/tables/h100.json, tuned the same day with the
# same candidates) kept 128x128 on all 4 of its rows where the rule fires (512 x 2816 x 2048, 512 x 3072 x 2048 and
# x 3072, 1024 x 1408 x 2048; the H200's winner on each was the odd width, +3-6 %), so an H100 plan keeps the model's
# pick until an H100 run says otherwise.
FILLING_PINGPONG_PARTS = ("H200",)
# ... up to this many rows (eight 128-row tile rows). Above it the narrower tile's extra reads of A outweigh the fill:
# out of sample 1280 and 1536 x 1024 x 4096 read 0.98x and 0.96x the 128x128 pick
# (h200_filling_pingpong_width_out_of_sample.json), and the corpus' forward at 2048 tokens, through the buckets,
# 2048 x 576 x 2048 0.90x and 2048 x 768 x 2048 1.03x (h200_corpus_fwd_rules_18_19.json against
# h200_corpus_ten_counts.json), where every row of 160-1024 tokens gained.
FILLING_PINGPONG_MAX_ROWS = 1024
# A promoted (fp8) 64-row pingpong pick without block scales takes the odd width (SM90_ODD_BLOCK_N, those promotion
# allows) that fills the waves at least this many times better, its cluster and raster kept (filling_promoted_tile):
# such a pick runs a wave or two of tiles, so the SMs its tiles leave idle are the time lost. Read from (H200, per
# tensor, benchmarks/bench_dtypes.py, 2 rounds, h200_fp8_fill_widths.json) 256 x 3072 x 8192, 64x96 c2x1 1.13x the
# 64x128 pick (96 tiles -> 128), and 64 x 14336 x 4096, 64x112 1.04x (112 -> 128); where the pick was a 128-row
# cooperative tile a filling width of either schedule lost (128 x 6144 x 4096, 128 x 7168 x 2048: 0.73-0.98x), so the
# rule keeps to 64-row pingpong picks. Out of sample (h200_fp8_fill_rule.json, h200_fp8_fill_rule_row.json: nine
# shapes of 16-256 rows on the corpus' layers, widths 80-144) per tensor 1.018-1.173x the 64x128 pick on all nine,
# rowwise 1.004-1.138x on five; block scales 0.914-1.113x (their fixed cost per k tile: the scales' loads and
# products), so not with block scales; fast accumulation 0.953-1.134x (h200_fp8_fill_rule_fast.json), so not there.
FILLING_PROMOTED_MIN_GAIN = 1.1
# A promoted (fp8) pick of one wave of 64-row pingpong tiles or 128x64 cooperative ones, over a K of at least
# INTERLEAVED_MIN_K_TILES k tiles, takes the 64-row cooperative tile whose two warpgroups interleave K
# (KernelConfig.interleave_k), of the width below with the most tiles that still fit one wave, where that is more tiles
# than the pick's (interleaved_promoted_tile): a 64-row pingpong tile, its CTA's only one, promotes alone, and the
# 128x64 tile leaves SMs idle. Read from (H200, benchmarks/bench_dtypes.py, 2 rounds, h200_fp8_interleave_k.json)
# 128 x 4096 x 4096, 64x64 interleaved 1.055x per tensor and 1.124x per block (64 tiles of 128x64 -> 128), and 256 x
# 3072 x 8192 per block, 64x96 1.13x (96 tiles of 64x128 pingpong -> 128); the same tile count as a pingpong pick
# gained -4 % to +3 % (not taken), more tiles than one wave lost 0.5-0.9x. On 19 corpus layers of 1-512 rows
# (h200_fp8_interleave_k_rule.json, per tensor, per row and per block against the pick without the rule) it lost at
# K = 512 and 768 (0.93-0.96x: two or three k tiles per warpgroup pay the hand-over), hence the bound; from K = 2048
# on 1.130x geomean over 33 rows, p10 1.002x, lowest 0.952x.
INTERLEAVED_BLOCK_N = (64, 96, 128)
INTERLEAVED_MIN_K_TILES = 16
# The cluster shapes the planner weighs. The 4-block ones (2x2, 4x1, 1x4) are built on request only: a
# cluster must sit inside one GPC, and the H100's GPCs (16-18 SMs after floor-sweeping) leave SMs over:
# 30 clusters of 4 fit at one block per SM, 120 of the 132 SMs (git show 8cd3d06:gpu/debug/cluster_occupancy.cu,
# docs/planner.md), so 4096^3 and 8192^3 take 5 and 18 waves of 128x256 tiles instead of 4 and 16.
PLANNED_CLUSTERS = ((1, 1), (2, 1), (1, 2))
# The share of the SMs that clusters of this many blocks can fill at once (measured on the 132-SM H100
# SXM; GPC shapes vary between chips, so the launch asks the driver and this only feeds the estimate).
CLUSTER_SM_SHARE = {4: 120 / 132}


def resident_clusters(sm_count: int, blocks_per_cluster: int) -> int:
    """How many clusters of ``blocks_per_cluster`` blocks run at once, one block per SM."""
    usable = int(sm_count * CLUSTER_SM_SHARE.get(blocks_per_cluster, 1.0))
    return max(1, usable // blocks_per_cluster)


# -- the walk over the tile grid ---------------------------------------------------------------------------

def raster_coords(unit: int, units_m: int, units_n: int, raster: str, group: int) -> tuple[int, int]:
    """(M, N) index of the ``unit``-th cluster-sized block of tiles; the Python twin of the Raster struct
    in templates/sm90/gemm_kernel.cuh. raster "m": bands of ``group`` rows, each walked down M first,
    then along N (Triton's GROUP_M order); "n": the same with M and N swapped."""
    along_m = raster == "m"
    fast, slow = (units_m, units_n) if along_m else (units_n, units_m)
    per_band = group * slow
    band, within = divmod(unit, per_band)
    first = band * group
    size = min(fast - first, group)
    f, s = first + within % size, within // size
    return (f, s) if along_m else (s, f)


def grid_units(cfg: KernelConfig, problem: Problem) -> tuple[int, int]:
    """The grid in cluster-sized units of tiles: (along M, along N)."""
    bm, bn, _ = cfg.tile
    cm, cn = cfg.cluster
    return math.ceil(math.ceil(problem.m / bm) / cm), math.ceil(math.ceil(problem.n / bn) / cn)


def wave_footprint(cfg: KernelConfig, problem: Problem, sm_count: int) -> int:
    """Rows of A plus columns of B (elements per unit of K) that the first wave of blocks touches: what
    L2 has to hold for the wave's blocks to share their operand tiles instead of refetching them."""
    units_m, units_n = grid_units(cfg, problem)
    in_flight = min(units_m * units_n, resident_clusters(sm_count, cfg.cluster[0] * cfg.cluster[1]))
    rows, cols = set(), set()
    for unit in range(in_flight):
        um, un = raster_coords(unit, units_m, units_n, cfg.raster, cfg.raster_group)
        rows.add(um)
        cols.add(un)
    return len(rows) * cfg.tile[0] * cfg.cluster[0] + len(cols) * cfg.tile[1] * cfg.cluster[1]


def default_group(units_along: int) -> int:
    """8 (Triton's default GROUP_M: a wave of ~132 blocks then covers a near-square patch of tiles), or 1
    when the grid has a single unit along the raster direction: the band is that one row (or column)
    whatever the group, and g1 says so."""
    return 1 if units_along <= 1 else DEFAULT_RASTER_GROUP


def choose_raster(cfg: KernelConfig, problem: Problem, sm_count: int, knobs: Knobs) -> KernelConfig:
    """``cfg`` with the raster order and group that make the first wave's footprint in L2 smallest.

    The footprint of a wave is the A rows plus B columns its tiles touch. For a grid that is wide or
    tall in units of clusters the two orders touch the same patch; they differ when a unit (cluster x
    tile) is not square: bands then run along the unit's short side. Ties go to "m".

    A ragged problem's bands along M are DEFAULT_RASTER_GROUP units whatever its expected rows: its groups run to
    several times those, and a band of one unit would walk a large group's tile rows one after another, each
    streaming the group's whole B again. A group of fewer units loses nothing: the kernel's band ends at the group's
    last unit."""
    options = []
    units_m, units_n = grid_units(cfg, problem)
    for raster in ([knobs.raster] if knobs.raster is not None else list(RASTERS)):
        group = knobs.raster_group
        if group is None:
            ragged_m = problem.ragged and raster == "m"
            group = DEFAULT_RASTER_GROUP if ragged_m else default_group(units_m if raster == "m" else units_n)
        options.append(replace(cfg, raster=raster, raster_group=group))
    if len(options) == 1 or options[0].raster_group not in RASTER_GROUPS:  # fixed by the user: check_config judges it
        return options[0]
    return min(options, key=lambda option: wave_footprint(option, problem, sm_count))  # min keeps the first of equals


# -- candidates ------------------------------------------------------------------------------------------

def candidate_shapes(knobs: Knobs, problem: Problem, block_k: int = 64, promoted: bool = False,
                     sm_count: int = 132, odd_n: bool = False) -> list[tuple[str, tuple[int, int, int]]]:
    """(schedule, tile) pairs to weigh, honouring a fixed tile and/or schedule.

    The narrow cooperative tile (128x64) only where M fits one 128-row tile or on a narrow layer
    (``narrow_tile_fits``): there it is the way to put enough N tiles on the SMs (128x4096x4096: 0.88x cuBLAS,
    the best measured), but with more rows of a wide layer its m64n64 wgmmas lose to the big tiles by far more than
    the model's reuse terms say (512x6144x4096: 0.63-0.75x against 0.84x for 128x256; benchmarks/sweep_sm90.py,
    docs/planner.md). 64x64 pingpong only on a narrow grid (``narrow_grid``); the ODD_TILES where ``odd_n`` (16-bit
    inputs, K-major B: odd_n_tiles_fit)."""
    if knobs.tile is not None:
        schedules = [knobs.schedule] if knobs.schedule else list(PLANNED_SCHEDULES)
        return [(schedule, knobs.tile) for schedule in schedules]
    wanted = "cooperative" if knobs.schedule == "ws" else knobs.schedule  # ws builds cooperative's tiles
    tiles = (PROMOTED_TILES if promoted else ()) + CANDIDATE_TILES
    if narrow_grid(problem, block_k, sm_count):
        tiles += (("pingpong", SMALL_TILE),)
    if odd_n:
        tiles += ODD_TILES
    shapes = [(knobs.schedule or schedule, (bm, bn, block_k)) for schedule, (bm, bn) in tiles
              if (wanted is None or schedule == wanted) and not (bn == NARROW_BN and not narrow_tile_fits(problem, bm))]
    short = [shape for shape in shapes if shape[1][0] == SMALL_M_TILE_ROWS]
    if typical_rows(problem) <= SMALL_M_TILE_ROWS and short:   # few rows: tiles of no more rows (see SMALL_M_TILE_ROWS)
        shapes = short
    if knobs.schedule is None and long_k_over_waves(problem, block_k, sm_count):
        wide = [shape for shape in shapes
                if shape[0] == "cooperative" and shape[1][0] * shape[1][1] >= LONG_K_WIDE_TILE_MIN_AREA]
        shapes = wide or shapes
    # A schedule that is none of ours still gets one candidate, for check_config to refuse with its sentence.
    return shapes or [(str(knobs.schedule), (128, 256, block_k))]


def typical_rows(problem: Problem) -> float:
    """The rows a problem's tiles are sized for: M, or for a ragged problem's groups RAGGED_TYPICAL_ROWS x the
    expected M (the groups that hold most of the rows are larger than the mean)."""
    return problem.m * (RAGGED_TYPICAL_ROWS if problem.ragged else 1)


def long_k_over_waves(problem: Problem, block_k: int, sm_count: int) -> bool:
    """Whether LONG_K_WIDE_TILE_MIN_AREA's rule holds: at least SPLIT_K_LONG_K_TILES k tiles and more 128x128 tiles than
    SMs."""
    return (math.ceil(problem.k / block_k) >= SPLIT_K_LONG_K_TILES
            and tile_count((128, 128, block_k), problem) > sm_count)


def odd_n_tiles_fit(dtype: DType, layout: Layout, promoted: bool) -> bool:
    """Whether the ODD_TILES are weighed: 16-bit inputs (their wgmma wrappers) with a K-major B (an M/N-major B tile
    loads whole 64-column chunks), not promoted fp8 (which has PROMOTED_TILES)."""
    return dtype.bytes == 2 and layout.b_k_major and not promoted


def narrow_tile_fits(problem: Problem, bm: int) -> bool:
    """Whether the narrow 128x64 cooperative tile is weighed: M fits one tile row, or the problem is a narrow layer of
    at most NARROW_TILE_MAX_M rows and NARROW_TILE_MAX_N columns."""
    return problem.m <= bm or (problem.m <= NARROW_TILE_MAX_M and problem.n <= NARROW_TILE_MAX_N)


def narrow_grid(problem: Problem, block_k: int, sm_count: int) -> bool:
    """Whether 64x64 pingpong (SMALL_TILE) is weighed: 64x128 pingpong tiles would reach at most
    SMALL_TILE_MAX_SM_SHARE of the SMs (so twice as many 64x64 tiles still fit one wave), K short of split-K, one
    problem. (Not only on narrow layers: 64 x 4096 x 4096 measured 1.012x cuBLAS on 64x64 against 0.901x on 64x128,
    h100_midm_split_n.json.)"""
    wide_tiles = tile_count((SMALL_M_TILE_ROWS, FEW_ROWS_STREAM_B_BN, block_k), problem)
    short_k = math.ceil(problem.k / block_k) < SPLIT_K_MIN_K_TILES
    return problem.batch == 1 and short_k and wide_tiles <= SMALL_TILE_MAX_SM_SHARE * sm_count


def tile_count(tile: tuple[int, int, int], problem: Problem) -> int:
    """The CTA tiles of every problem (a batch's or grouped plan's problems all count)."""
    return math.ceil(problem.m / tile[0]) * math.ceil(problem.n / tile[1]) * problem.batch


def cluster_candidates(tile: tuple[int, int, int], knobs: Knobs, problem: Problem,
                       sm_count: int) -> list[tuple[int, int]]:
    """The cluster shapes to weigh for ``tile``: all of them, or 1x1 alone when the tiles fit one wave.

    Multicast saves L2 -> SM bytes, which only limit a block that runs tile after tile; when every
    tile has its own SM the two blocks of a cluster just wait for each other. Measured (3-round
    medians, benchmarks/sweep_sm90.py, docs/planner.md): one wave, 1x1 won by 4-7 % (2048^3,
    1024^3, 128x6144x4096) and a 2x1 over a single tile row lost 20 %; several waves, 2x1 won
    (4096^3 +4 %, 512x28672x8192 +20 %)."""
    if knobs.cluster:
        return [knobs.cluster]
    tiles = tile_count(tile, problem)
    if tiles > sm_count:
        return list(PLANNED_CLUSTERS)
    wanted = long_k_over_two_rows(tile, problem) or one_wave_streams_b(tile, problem, tiles, sm_count)
    return [(1, 1), (2, 1)] if wanted else [(1, 1)]


def one_wave_streams_b(tile: tuple[int, int, int], problem: Problem, tiles: int, sm_count: int) -> bool:
    """One wave that still wants B multicast: more than half the SMs busy, at least two tile rows to share each
    B tile and a K of at least ``ONE_WAVE_CLUSTER_K_TILES`` k tiles. Then every SM streams its operands from L2
    for the whole kernel at once and L2 -> SM bandwidth is what limits it (H200, gpu/midm_tiles.py: 512x4096x4096
    128x128 pingpong 0.855x cuBLAS at 1x1, 0.946x at 2x1, ncu: L2 throughput 65 %, tensor pipe 60 %; cuBLAS runs
    the same tile in a 2x1 cluster). At 32 k tiles (2048^3) 1x1 still won, and 1x2 lost on one tile row."""
    return (tiles > sm_count // 2 and math.ceil(problem.m / tile[0]) >= 2
            and math.ceil(problem.k / tile[2]) >= ONE_WAVE_CLUSTER_K_TILES)


def rule_may_apply(dtype: DType, knobs: Knobs) -> bool:
    """Whether a measured tile rule (few_rows_stream_b, cluster_covers_each_problem) may fix the plan: 16-bit inputs
    (the measured ones) and none of tile, schedule and cluster fixed by the user."""
    return dtype.bytes == 2 and leaves_tile_free(knobs)


def leaves_tile_free(knobs: Knobs) -> bool:
    """Whether the user fixed none of tile, schedule and cluster, so that a tile rule may choose them."""
    return knobs.tile is None and knobs.schedule is None and knobs.cluster is None


def few_rows_stream_b(dtype: DType, knobs: Knobs, problem: Problem, sm_count: int) -> bool:
    """Whether the plan is 64x128 pingpong in a 2x1 cluster by FEW_ROWS_STREAM_B_SM_SHARE's rule: 16-bit inputs (the
    measured ones), and the user fixed none of tile, schedule and cluster."""
    if not rule_may_apply(dtype, knobs):
        return False
    block_k = sm90_block_k(dtype)
    rows = math.ceil(problem.m / SMALL_M_TILE_ROWS)
    tiles = tile_count((SMALL_M_TILE_ROWS, FEW_ROWS_STREAM_B_BN, block_k), problem)
    return (rows == 2 and problem.batch == 1 and math.ceil(problem.k / block_k) >= SPLIT_K_MIN_K_TILES
            and FEW_ROWS_STREAM_B_SM_SHARE * sm_count <= tiles <= sm_count)


def few_rows_long_k(dtype: DType, knobs: Knobs, problem: Problem, sm_count: int) -> bool:
    """Whether the plan is 64x64 pingpong 1x1 by FEW_ROWS_LONG_K_BN's rule: 16-bit inputs (the measured ones), none of
    tile, schedule and cluster fixed, one problem of at most one 64-row tile row, SPLIT_K_MIN_K_TILES to
    SPLIT_K_LONG_K_TILES k tiles, and 64x128 tiles on at most SMALL_TILE_MAX_SM_SHARE of the SMs (choose_sm90 plans a
    long-K split instead where the 64x64 tiles would run whole: small_tiles_whole_over_long_k)."""
    if not rule_may_apply(dtype, knobs):
        return False
    block_k = sm90_block_k(dtype)
    k_tiles = math.ceil(problem.k / block_k)
    wide_tiles = tile_count((SMALL_M_TILE_ROWS, FEW_ROWS_LONG_K_BN, block_k), problem)
    return (problem.batch == 1 and problem.m <= SMALL_M_TILE_ROWS
            and SPLIT_K_MIN_K_TILES <= k_tiles < SPLIT_K_LONG_K_TILES
            and wide_tiles <= SMALL_TILE_MAX_SM_SHARE * sm_count)


def small_tiles_whole_over_long_k(dtype: DType, problem: Problem, sm_count: int) -> bool:
    """Whether 64x64 tiles would run whole (on more than SPLIT_K_SMALL_TILE_SM_SHARE of the SMs) over a K the long-K
    split takes (``long_k``): then a wider tile split in long-K parts, where a candidate splits, takes
    few_rows_long_k's place (choose_sm90)."""
    block_k = sm90_block_k(dtype)
    return (tile_count((*SMALL_TILE, block_k), problem) > SPLIT_K_SMALL_TILE_SM_SHARE * sm_count
            and long_k(math.ceil(problem.k / block_k)))


def is_small_tile(cfg: KernelConfig) -> bool:
    return cfg.tile[:2] == SMALL_TILE and cfg.schedule == "pingpong"


def ruled_pingpong_config(tile: tuple[int, int], dtype: DType, out_dtype: DType, layout: Layout, spec: ArchSpec,
                          epilogue: Epilogue, dtype_b: DType | None) -> KernelConfig:
    """A rule's plan: ``tile`` pingpong, 1x1, raster m in groups of DEFAULT_RASTER_GROUP, the deepest pipeline that
    fits (not yet checked)."""
    cfg = KernelConfig(arch=spec.cc, dtype=dtype, out_dtype=out_dtype, layout=layout,
                       tile=(*tile, sm90_block_k(dtype)), warps=None, stages=MIN_STAGES,
                       raster_group=DEFAULT_RASTER_GROUP, family="sm90", cluster=(1, 1), schedule="pingpong",
                       raster="m", epilogue=epilogue, dtype_b=dtype_b)
    return replace(cfg, stages=max(MIN_STAGES, sm90_max_stages_that_fit(cfg)))


def register_a_split_tile(dtype: DType, out_dtype: DType, layout: Layout, spec: ArchSpec, knobs: Knobs,
                          problem: Problem, sm_count: int, epilogue: Epilogue) -> KernelConfig | None:
    """REGISTER_A_SPLIT_TILE's plan (cooperative, 1x1) where it applies and splits; None elsewhere."""
    if (dtype is not DType.tf32 or layout.a_k_major or layout.c is not Order.row
            or not TT_OWN_ROWS_MAX_M < problem.m <= REGISTER_A_SPLIT_MAX_M or problem.n < REGISTER_A_SPLIT_MIN_N
            or not leaves_tile_free(knobs)):
        return None
    cfg = replace(ruled_pingpong_config(REGISTER_A_SPLIT_TILE, dtype, out_dtype, layout, spec, epilogue, None),
                  schedule="cooperative")
    cfg = choose_raster(replace(cfg, stages=max(MIN_STAGES, sm90_max_stages_that_fit(cfg))), problem, sm_count, knobs)
    if tile_count(cfg.tile, problem) < REGISTER_A_SPLIT_MIN_SM_SHARE * sm_count:
        return None
    return cfg if is_legal(cfg) and split_k_parts(cfg, problem, sm_count) > 1 else None


def cluster_covers_each_problem(dtype: DType, knobs: Knobs, problem: Problem) -> bool:
    """Whether the plan is 128x256 cooperative in a 2x1 cluster by COVERING_TILE's rule: a batch of 16-bit problems
    of two 128-row tile rows and one 256-column tile column that a 128-column tile would not cover, the user fixed
    none of tile, schedule and cluster; not ragged groups (a group of one tile row would idle the cluster's second
    block: RAGGED_LAST_UNIT)."""
    if not rule_may_apply(dtype, knobs) or problem.ragged:
        return False
    bm, bn = COVERING_TILE
    return problem.batch > 1 and math.ceil(problem.m / bm) == COVERING_CLUSTER[0] and bn // 2 < problem.n <= bn


def few_columns_fill_tile(dtype: DType, out_dtype: DType, layout: Layout, knobs: Knobs, problem: Problem,
                          sm_count: int) -> tuple[int, int] | None:
    """The (BM, BN) of FEW_COLUMNS_FILL_N's rule, or None where it does not apply: 16-bit inputs and output (the
    measured ones), A M-major, B K-major, one problem of 129-512 columns and a K short of the long-K split (long_k),
    none of tile, schedule and cluster fixed, and the best one-wave tile (the most tiles; then the fewest padded
    columns, the wider tile) of a width that is no multiple of 64."""
    low, high = FEW_COLUMNS_FILL_N
    if (not rule_may_apply(dtype, knobs) or out_dtype.bytes != 2 or layout.a_k_major or not layout.b_k_major
            or problem.batch != 1 or not low <= problem.n <= high
            or long_k(math.ceil(problem.k / sm90_block_k(dtype)))):
        return None
    rows = math.ceil(problem.m / FEW_COLUMNS_FILL_BM)
    fits = [(tiles, -(math.ceil(problem.n / bn) * bn - problem.n), bn) for bn in FEW_COLUMNS_FILL_BN
            if (tiles := rows * math.ceil(problem.n / bn)) <= sm_count]
    if not fits:
        return None
    *_, bn = max(fits)
    return (FEW_COLUMNS_FILL_BM, bn) if bn % 64 else None


def two_tile_rows_tile(dtype: DType, knobs: Knobs, problem: Problem, sm_count: int) -> tuple[int, int] | None:
    """The (BM, BN) of TWO_TILE_ROWS' rule, or None where it does not apply: 16-bit inputs, none of tile, schedule and
    cluster fixed, one problem of 65-128 rows; 64x64 where two rows of its tiles fit one wave, else below 128 rows
    64x128 where two rows of those reach at most TWO_TILE_ROWS_WIDE_SM_SHARE of the SMs."""
    if (not rule_may_apply(dtype, knobs) or problem.batch != 1
            or not SMALL_M_TILE_ROWS < problem.m <= TWO_TILE_ROWS * SMALL_M_TILE_ROWS):
        return None
    if TWO_TILE_ROWS * math.ceil(problem.n / SMALL_TILE[1]) <= sm_count:
        return SMALL_TILE
    wide_tiles = TWO_TILE_ROWS * math.ceil(problem.n / FEW_ROWS_STREAM_B_BN)
    if problem.m < TWO_TILE_ROWS * SMALL_M_TILE_ROWS and wide_tiles <= TWO_TILE_ROWS_WIDE_SM_SHARE * sm_count:
        return SMALL_M_TILE_ROWS, FEW_ROWS_STREAM_B_BN
    return None


def ragged_few_rows(cfg: KernelConfig, knobs: Knobs, problem: Problem) -> bool:
    """Whether RAGGED_FEW_ROWS' rule moves the pick ``cfg`` to 64xRAGGED_FEW_ROWS_BN pingpong: ragged groups of at most
    RAGGED_FEW_ROWS expected rows, 16-bit inputs, none of tile, schedule and cluster fixed, and a 64-row pingpong pick
    wider than that."""
    return (problem.ragged and problem.m <= RAGGED_FEW_ROWS and rule_may_apply(cfg.dtype, knobs)
            and cfg.schedule == "pingpong" and cfg.tile[0] == SMALL_M_TILE_ROWS and cfg.tile[1] > RAGGED_FEW_ROWS_BN)


def is_whole_narrow_tile(cfg: KernelConfig, problem: Problem, sm_count: int) -> bool:
    """Whether ``cfg`` is the 128x64 cooperative tile (NARROW_BN) that split_k_parts leaves whole."""
    return (cfg.tile[:2] == (2 * SMALL_M_TILE_ROWS, NARROW_BN) and cfg.schedule == "cooperative"
            and split_k_parts(cfg, problem, sm_count) == 1)


def is_covering(cfg: KernelConfig) -> bool:
    return cfg.tile[:2] == COVERING_TILE and cfg.schedule == "cooperative" and cfg.cluster == COVERING_CLUSTER


def is_few_rows_stream_b(cfg: KernelConfig) -> bool:
    return (cfg.tile[:2] == (SMALL_M_TILE_ROWS, FEW_ROWS_STREAM_B_BN) and cfg.schedule == "pingpong"
            and cfg.cluster == (2, 1))


def candidates(dtype: DType, out_dtype: DType, layout: Layout, spec: ArchSpec, knobs: Knobs,
               problem: Problem, sm_count: int) -> list[KernelConfig]:
    """Every sm90 config the planner would consider, in order of preference (checked later by check_config)."""
    configs = []
    fast_accum = bool(knobs.fast_accum)
    promoted = dtype.is_fp8 and not fast_accum
    shapes = candidate_shapes(knobs, problem, sm90_block_k(dtype), promoted, sm_count,
                              odd_n_tiles_fit(dtype, layout, promoted))
    if knobs.interleave_k and knobs.schedule in (None, "cooperative"):
        # (only 64-row cooperative tiles interleave K: the user's tile, or those of the widths rule 22 weighs)
        tiles = [knobs.tile] if knobs.tile is not None else [
            (SMALL_M_TILE_ROWS, bn, sm90_block_k(dtype)) for bn in INTERLEAVED_BLOCK_N]
        shapes = [("cooperative", tile) for tile in tiles]
    for schedule, tile in shapes:
        for cluster in cluster_candidates(tile, knobs, problem, sm_count):
            cfg = KernelConfig(arch=spec.cc, dtype=dtype, out_dtype=out_dtype, layout=layout, tile=tile, warps=None,
                               stages=MIN_STAGES if knobs.stages is None else knobs.stages, raster_group=1,
                               family="sm90", cluster=cluster, schedule=schedule, fast_accum=fast_accum,
                               interleave_k=bool(knobs.interleave_k))
            if knobs.stages is None:
                cfg = replace(cfg, stages=max(MIN_STAGES, sm90_max_stages_that_fit(cfg)))
            configs.append(choose_raster(cfg, problem, sm_count, knobs))
    return configs


def cluster_larger_than_grid(cfg: KernelConfig, problem: Problem) -> str | None:
    """A fixed cluster that has more blocks along M (or N) than the problem has tiles: the second block
    would only compute zeros. Refused only when the user fixed the cluster and gave the problem size."""
    bm, bn, _ = cfg.tile
    cm, cn = cfg.cluster
    for along, c, size, block in (("M", cm, problem.m, bm), ("N", cn, problem.n, bn)):
        tiles = math.ceil(size / block)
        if c > tiles:
            return (f"cluster {cm}x{cn} is larger than the tile grid ({tiles} tile{'s' if tiles != 1 else ''} "
                    f"along {along} for {along}={size}): use cluster 1x1")
    return None


# -- the estimate ------------------------------------------------------------------------------------------

def efficiency(cfg: KernelConfig, problem: Problem) -> tuple[float, float]:
    """(efficiency, L2 -> SM bytes relative to no cluster): see the module docstring."""
    bm, bn, _ = cfg.tile
    cm, cn = cfg.cluster
    # A cluster shares an operand only between blocks that have a real tile: 2x1 over 1 tile row shares nothing.
    share_b = min(cm, math.ceil(problem.m / bm))
    share_a = min(cn, math.ceil(problem.n / bn))
    rows_a, cols_b = min(bm, problem.m), min(bn, problem.n)
    loaded = rows_a / share_a + cols_b / share_b
    l2_reuse = bm * bn / loaded
    wgmma_n = cfg.consumer_cols  # one warpgroup's wgmma: its share of the tile's columns
    smem_reuse = WGMMA_M * wgmma_n / (WGMMA_M + wgmma_n)
    issuing = 1 if cfg.schedule == "pingpong" or cfg.splits_n else 2    # wgmma streams issued at the same time
    streams = issuing * cfg.consumer_rows // WGMMA_M
    eff = (l2_reuse / (l2_reuse + L2_HALF_REUSE) * smem_reuse / (smem_reuse + SMEM_HALF_REUSE)
           * ISSUE_EFFICIENCY.get(streams, 1.0))
    if cm * cn > 1:
        eff *= CLUSTER_COUPLING
    if cfg.promoted and promote_slices(cfg) > 1:
        eff *= PROMOTION_SLICED_EFFICIENCY
    if cfg.promoted and cfg.schedule == "pingpong":
        eff *= PROMOTED_PINGPONG_EFFICIENCY
    if bn in SM90_ODD_BLOCK_N:
        eff *= ODD_N_EFFICIENCY
    if reads_a_into_registers(cfg) and cfg.schedule == "pingpong" and cfg.consumer_rows > WGMMA_M:
        eff *= REGISTER_A_PINGPONG_EFFICIENCY
    # (the transposed product's kernel, which a tt library runs on its fast path, transposes nothing)
    transposed_a, transposed_b = (False, False) if transposed_product(cfg) is not None else transposes_in_smem(cfg)
    if transposed_a or transposed_b:
        row_bytes = cfg.tile[2] * cfg.dtype.bytes   # a k tile's bytes per row of A (column of B)
        eff /= 1 + TRANSPOSE_COST * row_bytes * (transposed_a / bn + transposed_b / bm)
    return eff, loaded / (rows_a + cols_b)


def waves(cfg: KernelConfig, problem: Problem, sm_count: int) -> tuple[int, int, int]:
    """(blocks, slots, waves): the grid's blocks in whole clusters (idle blocks of partial clusters included), the
    blocks resident at once (one per SM: the ring takes the shared memory), and the waves they take."""
    cm, cn = cfg.cluster
    units_m, units_n = grid_units(cfg, problem)
    if problem.ragged:
        units_m = ragged_units_m(cfg, problem)
    blocks = math.ceil(units_m * units_n * cm * cn * problem.batch)
    slots = resident_clusters(sm_count, cm * cn) * cm * cn
    return blocks, slots, math.ceil(blocks / slots)


def wave_fill(cfg: KernelConfig, bn: int, problem: Problem, sm_count: int) -> float:
    """The share of the SMs the tiles of ``cfg`` with ``bn`` columns keep busy over their waves (1: every wave full;
    the count of blocks and waves of ``waves``)."""
    blocks, slots, count = waves(replace(cfg, tile=(cfg.tile[0], bn, cfg.tile[2])), problem, sm_count)
    return blocks / (count * slots)


def filling_block_n(cfg: KernelConfig, problem: Problem, sm_count: int) -> int | None:
    """The N tile that is no multiple of 64 (SM90_ODD_BLOCK_N) whose tile count fills the SMs' waves best, where it
    fills them better than ``cfg``'s own BN (a multiple of 64), among the widths ``cfg`` can take (a K-major B; fp8's
    promotion slices and block scales rule some out); None where no such tile does better."""
    if (cfg.dtype.bytes != 2 and not cfg.dtype.is_fp8) or not cfg.layout.b_k_major or cfg.tile[1] not in SM90_BLOCK_N:
        return None
    own = wave_fill(cfg, cfg.tile[1], problem, sm_count)
    legal = [bn for bn in SM90_ODD_BLOCK_N if is_legal(replace(cfg, tile=(cfg.tile[0], bn, cfg.tile[2])))]
    if not legal:
        return None
    best = max(legal, key=lambda bn: (wave_fill(cfg, bn, problem, sm_count), bn))
    return best if wave_fill(cfg, best, problem, sm_count) > own else None


def ragged_units_m(cfg: KernelConfig, problem: Problem) -> float:
    """The expected cluster units along M of one group of a ragged problem: groups of rows spread around ``m`` end
    half a unit past m on average (RAGGED_LAST_UNIT), and a group has at least one."""
    return max(1.0, problem.m / (cfg.tile[0] * cfg.cluster[0]) + RAGGED_LAST_UNIT)


def estimate(cfg: KernelConfig, spec: ArchSpec, sm_count: int, problem: Problem) -> Estimate:
    bm, bn, _ = cfg.tile
    cm, cn = cfg.cluster
    tiles = tile_count(cfg.tile, problem)
    blocks, slots, per_sm = waves(cfg, problem, sm_count)
    last_wave_fill = (blocks - (per_sm - 1) * slots) / slots
    eff, traffic = efficiency(cfg, problem)
    overhead = OVERHEAD_K[cfg.schedule] + (0 if cfg.schedule == "pingpong" else epilogue_overhead_k(cfg))
    parts = long_k_parts(cfg, problem, sm_count)   # (one wave of tiles x parts: per_sm is 1)
    cost = per_sm * bm * bn * (max(problem.k, 1) / parts + overhead) / eff
    persistent = "one tile per block" if cfg.schedule == "ws" else "persistent"
    if cm * cn > 1:
        shared = " and ".join(op for c, op in ((cm, "B"), (cn, "A")) if c > 1)
        cluster = f"cluster {cm}x{cn} multicasts {shared} ({traffic:.2f}x the L2->SM bytes of no cluster)"
    else:
        cluster = "cluster 1x1 (no multicast)"
    idle = f", {blocks - tiles} idle block(s) fill partial clusters" if blocks > tiles else ""
    split = f", each split into {parts} k parts (a K of {problem.k})" if parts > 1 else ""
    if problem.ragged:
        split += (f" (groups of about {problem.m} rows: {blocks} blocks expected, each group's last tile row half "
                  f"empty on average)")
    reason = (f"{tiles} tiles of {bm}x{bn}{split} in {per_sm} wave(s) over {slots} SMs (last wave {last_wave_fill:.0%} "
              f"full{idle}), {cfg.schedule} ({persistent}); {cluster}; efficiency {eff:.2f}; {cfg.stages} stages "
              f"use {cfg.smem_bytes} of {spec.smem_per_block} bytes of shared memory")
    return Estimate(cfg, cost, reason)


def choose_sm90(dtype: DType, out_dtype: DType, layout: Layout, spec: ArchSpec, *, knobs: Knobs,
                problem: Problem | None, sm_count: int, epilogue: Epilogue = IDENTITY,
                dtype_b: DType | None = None) -> tuple[Estimate, list[str]]:
    """planner.choose for the sm90 family. ``problem`` None: no size hints (plan for a large square)."""
    best, rejected = choose_kernel(dtype, out_dtype, layout, spec, knobs=knobs, problem=problem, sm_count=sm_count,
                                   epilogue=epilogue, dtype_b=dtype_b)
    model = best.config
    if problem is not None:
        for rule, why in tile_rules(knobs, problem, spec, sm_count):
            moved = rule(best.config)
            if moved:
                best = Estimate(moved, estimate(moved, spec, sm_count, problem).cost,
                                f"{best.reason}; {why(best.config, moved)}")
    staged = ring_staged(best.config, knobs)
    if staged != best.config:
        best = Estimate(staged, best.cost, f"{best.reason}; D staged in the ring slot of each tile's last k tile, "
                                           f"{staged.stages} stages where its own buffers left {best.config.stages}")
    return (best if best.config == model else replace(best, model=model)), rejected


TileRule = Callable[[KernelConfig], Optional[KernelConfig]]
RuleReason = Callable[[KernelConfig, KernelConfig], str]


def tile_rules(knobs: Knobs, problem: Problem, spec: ArchSpec, sm_count: int) -> list[tuple[TileRule, RuleReason]]:
    """The tile rules layered on the model's pick, in the order they apply (rules 19, 21 and 22, docs/planner.md):
    each gives the config it moves a pick to (None: it does not apply), and the reason print(plan) adds."""
    return [
        (lambda cfg: filling_pingpong_tile(cfg, knobs, problem, spec, sm_count),
         lambda old, new: f"128x{new.tile[1]} by rule: its tiles fill the SMs' waves {FILLING_PINGPONG_MIN_GAIN}x or "
                          f"more better than 128x128's"),
        (lambda cfg: filling_promoted_tile(cfg, knobs, problem, sm_count),
         lambda old, new: f"{new.tile[0]}x{new.tile[1]} by rule: its tiles fill the SMs' waves "
                          f"{FILLING_PROMOTED_MIN_GAIN}x or more better than {old.tile[0]}x{old.tile[1]}'s"),
        (lambda cfg: interleaved_promoted_tile(cfg, knobs, problem, sm_count),
         lambda old, new: f"{new.tile[0]}x{new.tile[1]} cooperative with K interleaved by rule: more tiles in one wave "
                          f"than {old.tile[0]}x{old.tile[1]}'s, two warpgroups promoting under each other's wgmmas"),
    ]


def filling_pingpong_tile(cfg: KernelConfig, knobs: Knobs, problem: Problem, spec: ArchSpec,
                          sm_count: int) -> KernelConfig | None:
    """FILLING_PINGPONG_MIN_GAIN's plan for a pick ``cfg``: 128x128 pingpong with the odd width that fills the waves
    best, the stages that fit; None where the rule does not apply (a part not in FILLING_PINGPONG_PARTS, more rows
    than FILLING_PINGPONG_MAX_ROWS, another pick, fp8, a column-major D, a fixed tile, schedule or cluster, a batch or
    ragged groups (not measured), a fill gained by less)."""
    if (spec.gpu.part not in FILLING_PINGPONG_PARTS or problem.m > FILLING_PINGPONG_MAX_ROWS
            or cfg.tile[:2] != (128, 128) or cfg.schedule != "pingpong"
            or cfg.dtype not in LAYERED_RULE_DTYPES
            or cfg.layout.c is not Order.row or cfg.stream_k or not leaves_tile_free(knobs) or problem.batch != 1
            or problem.ragged):
        return None
    bn = filling_block_n(cfg, problem, sm_count)
    if bn is None or wave_fill(cfg, bn, problem, sm_count) < FILLING_PINGPONG_MIN_GAIN * wave_fill(cfg, 128, problem,
                                                                                                      sm_count):
        return None
    filled = replace(cfg, tile=(cfg.tile[0], bn, cfg.tile[2]))
    if knobs.stages is None:
        filled = replace(filled, stages=max(MIN_STAGES, sm90_max_stages_that_fit(filled)))
    return filled if is_legal(filled) else None


def filling_promoted_tile(cfg: KernelConfig, knobs: Knobs, problem: Problem, sm_count: int) -> KernelConfig | None:
    """FILLING_PROMOTED_MIN_GAIN's plan for a pick ``cfg``: the promoted (fp8) 64-row pingpong tile with the odd width
    that fills the waves best, its cluster and raster kept, the stages that fit; None where the rule does not apply
    (another pick, fast accumulation, block scales, a column-major D, a fixed tile, schedule or cluster, a batch or
    ragged groups, a fill gained by less)."""
    if (not cfg.promoted or cfg.tile[0] != SMALL_M_TILE_ROWS or cfg.schedule != "pingpong"
            or cfg.epilogue.scale_mode == "block" or cfg.layout.c is not Order.row or cfg.stream_k
            or not leaves_tile_free(knobs) or problem.batch != 1 or problem.ragged):
        return None
    bn = filling_block_n(cfg, problem, sm_count)
    if bn is None or wave_fill(cfg, bn, problem, sm_count) < FILLING_PROMOTED_MIN_GAIN * wave_fill(
            cfg, cfg.tile[1], problem, sm_count):
        return None
    filled = replace(cfg, tile=(cfg.tile[0], bn, cfg.tile[2]))
    if knobs.stages is None:
        filled = replace(filled, stages=max(MIN_STAGES, sm90_max_stages_that_fit(filled)))
    return filled if is_legal(filled) else None


def interleaved_promoted_tile(cfg: KernelConfig, knobs: Knobs, problem: Problem,
                              sm_count: int) -> KernelConfig | None:
    """INTERLEAVED_BLOCK_N's plan for a pick ``cfg``: the 64-row cooperative tile with K interleaved whose tiles, more
    than the pick's, fill one wave best, the pick's cluster, the raster and stages that fit; None where the rule does
    not apply (another pick, fast accumulation, more than one wave, a column-major D, a fixed tile, schedule, cluster
    or interleave_k, a batch or ragged groups, fewer than INTERLEAVED_MIN_K_TILES k tiles, no width with more tiles
    in one wave)."""
    one_64_row_tile = cfg.tile[0] == SMALL_M_TILE_ROWS and cfg.schedule == "pingpong"
    narrow = cfg.tile[:2] == (2 * SMALL_M_TILE_ROWS, NARROW_BN) and cfg.schedule == "cooperative"
    if (not cfg.promoted or not (one_64_row_tile or narrow) or cfg.layout.c is not Order.row or cfg.stream_k
            or not leaves_tile_free(knobs) or knobs.interleave_k is not None or problem.batch != 1 or problem.ragged
            or problem.k < INTERLEAVED_MIN_K_TILES * cfg.tile[2]):
        return None
    own_blocks, slots, own_waves = waves(cfg, problem, sm_count)
    if own_waves != 1:
        return None
    best = None
    for bn in INTERLEAVED_BLOCK_N:
        candidate = replace(cfg, tile=(SMALL_M_TILE_ROWS, bn, cfg.tile[2]), schedule="cooperative", interleave_k=True)
        blocks, _, count = waves(candidate, problem, sm_count)
        if count == 1 and blocks > own_blocks and is_legal(candidate) and (best is None or blocks > best[0]):
            best = (blocks, candidate)
    if best is None:
        return None
    chosen = best[1]
    if knobs.stages is None:
        chosen = replace(chosen, stages=max(MIN_STAGES, sm90_max_stages_that_fit(chosen)))
    chosen = choose_raster(chosen, problem, sm_count, knobs)
    return chosen if is_legal(chosen) else None


def ring_staged(cfg: KernelConfig, knobs: Knobs) -> KernelConfig:
    """``cfg`` with its epilogue staged in the ring and the stages that frees (rule 18, docs/planner.md): 16-bit
    pingpong tiles of an odd width writing a row-major D, where the user fixed no stages and check_config takes it;
    else ``cfg``."""
    if (cfg.dtype not in LAYERED_RULE_DTYPES or cfg.schedule != "pingpong" or cfg.tile[1] not in SM90_ODD_BLOCK_N
            or cfg.layout.c is not Order.row or knobs.stages is not None or cfg.staging_in_ring):
        return cfg
    return with_staging_in_ring(cfg, True)


def with_staging_in_ring(cfg: KernelConfig, staged: bool) -> KernelConfig:
    """``cfg`` with its epilogue staged in the ring or not, its stages moved by those the buffers' bytes free or take
    (``cfg`` itself where check_config refuses that)."""
    moved = replace(cfg, staging_in_ring=staged)
    moved = replace(moved, stages=max(MIN_STAGES, cfg.stages + sm90_max_stages_that_fit(moved)
                                      - sm90_max_stages_that_fit(cfg)))
    return moved if is_legal(moved) else cfg


def choose_kernel(dtype: DType, out_dtype: DType, layout: Layout, spec: ArchSpec, *, knobs: Knobs,
                  problem: Problem | None, sm_count: int, epilogue: Epilogue = IDENTITY,
                  dtype_b: DType | None = None) -> tuple[Estimate, list[str]]:
    """choose_sm90's pick before the rules layered on it (the filling width, the ring's staging): the model's, and the
    tile rules that replace it."""
    planned = transposed_plan(dtype, out_dtype, layout, spec, knobs=knobs, problem=problem, sm_count=sm_count,
                              epilogue=epilogue)
    if planned is not None:
        return planned
    hinted = problem is not None
    problem = problem or Problem(*DEFAULT_PROBLEM)
    configs = [replace(c, epilogue=epilogue, dtype_b=dtype_b)
               for c in candidates(dtype, out_dtype, layout, spec, knobs, problem, sm_count)]

    def refuse(cfg: KernelConfig) -> str | None:
        return cluster_larger_than_grid(cfg, problem) if hinted and knobs.cluster else None

    streams_b = hinted and few_rows_stream_b(dtype, knobs, problem, sm_count)
    covers = hinted and cluster_covers_each_problem(dtype, knobs, problem)
    fill = few_columns_fill_tile(dtype, out_dtype, layout, knobs, problem, sm_count) if hinted else None
    ruled = fill and few_columns_fill(dtype, out_dtype, layout, spec, problem, sm_count, fill, epilogue, dtype_b)
    if ruled is not None:
        return ruled, []
    long_k_rows = hinted and few_rows_long_k(dtype, knobs, problem, sm_count)
    long_k_split = (long_k_rows and small_tiles_whole_over_long_k(dtype, problem, sm_count)
                    and [c for c in configs if long_k_parts(c, problem, sm_count) > 1])
    if long_k_split:
        configs, long_k_rows = long_k_split, False
    elif long_k_rows:
        small = choose_raster(ruled_pingpong_config(SMALL_TILE, dtype, out_dtype, layout, spec, epilogue, dtype_b),
                              problem, sm_count, knobs)
        configs = [small] if is_legal(small) else configs
    if streams_b:
        configs = [c for c in configs if is_few_rows_stream_b(c)] or configs
    elif covers:
        configs = [c for c in configs if is_covering(c)] or configs
    best, rejected = pick(configs, lambda cfg: estimate(cfg, spec, sm_count, problem), refuse)
    if streams_b and is_few_rows_stream_b(best.config):
        best = Estimate(best.config, best.cost, f"{best.reason}; 64x128 pingpong 2x1 by rule: two tile rows, a long K "
                                                f"and one full wave, so the run is B's stream from L2, which the "
                                                f"cluster halves")
    elif long_k_rows and is_small_tile(best.config):
        best = Estimate(best.config, best.cost, f"{best.reason}; 64x64 pingpong by rule: at most 64 rows and a long K, "
                                                f"where 64x128 tiles would leave at least half the SMs idle")
    elif covers and is_covering(best.config):
        best = Estimate(best.config, best.cost, f"{best.reason}; 128x256 cooperative 2x1 by rule: one cluster covers "
                                                f"each problem of the batch, so its A and B cross into the SMs once")
    two_rows = two_tile_rows_tile(dtype, knobs, problem, sm_count) if hinted else None
    if two_rows and is_whole_narrow_tile(best.config, problem, sm_count):
        ruled = choose_raster(ruled_pingpong_config(two_rows, dtype, out_dtype, layout, spec, epilogue, dtype_b),
                              problem, sm_count, knobs)
        if is_legal(ruled):
            best = Estimate(ruled, estimate(ruled, spec, sm_count, problem).cost,
                            f"{two_rows[0]}x{two_rows[1]} pingpong by rule: {problem.m} rows, two rows of its tiles in "
                            f"one wave, where the 128x64 cooperative tile would run whole")
    if hinted and ragged_few_rows(best.config, knobs, problem):
        narrower = choose_raster(ruled_pingpong_config((SMALL_M_TILE_ROWS, RAGGED_FEW_ROWS_BN), dtype, out_dtype,
                                                       layout, spec, epilogue, dtype_b), problem, sm_count, knobs)
        if is_legal(narrower):
            moved = estimate(narrower, spec, sm_count, problem)
            best = Estimate(narrower, moved.cost,
                            f"{moved.reason}; {SMALL_M_TILE_ROWS}x{RAGGED_FEW_ROWS_BN} pingpong by rule: groups of "
                            f"about {problem.m} rows (a decode step's), whose count with rows is unknown: twice "
                            f"{best.config.tile[0]}x{best.config.tile[1]}'s tiles per group")
    register_split = hinted and register_a_split_tile(dtype, out_dtype, layout, spec, knobs, problem, sm_count,
                                                      epilogue)
    if register_split:
        best = Estimate(register_split, estimate(register_split, spec, sm_count, problem).cost,
                        f"128x256 cooperative by rule: tf32's A read into registers, whose 256-column wgmmas spread "
                        f"the fragments' loads, split over K to fill the SMs (not {best.config.tile[0]}x"
                        f"{best.config.tile[1]} {best.config.schedule})")
    parts = split_k_parts(best.config, problem, sm_count) if hinted else 1
    if parts > 1:
        k_tiles = math.ceil(problem.k / best.config.tile[2])
        split = replace(best.config, stream_k=True)
        idle = sm_count - tile_count(best.config.tile, problem)
        best = Estimate(split, best.cost, f"{best.reason}; split-K: each tile's {k_tiles} k tiles in {parts} parts, "
                                          f"one block each, partial sums added in a fixed order (the tiles leave "
                                          f"{idle} of the {sm_count} SMs idle)")
    return best, rejected


def transposed_plan(dtype: DType, out_dtype: DType, layout: Layout, spec: ArchSpec, *, knobs: Knobs,
                    problem: Problem | None, sm_count: int, epilogue: Epilogue) -> tuple[Estimate, list[str]] | None:
    """The plan of a request whose library runs the transposed product D^T = B^T A^T (runs_transposed_product: tf32
    tt): the kernel that runs is planned, on N x M in its own layout (nn, every rule of an M-major A), and exchanged
    back (exchanged_operands). None where the user fixed the tile, cluster or raster (planned as given), or the
    exchanged pick is no tile the plain kernel builds (that kernel is the library's too, for the other paths), and at
    most TT_OWN_ROWS_MAX_M rows: there tt's own few-row rules plan it, as tn (nothing transposed either way)."""
    if (not runs_transposed_product(dtype, layout, epilogue, out_dtype)
            or (knobs.tile, knobs.cluster, knobs.raster) != (None, None, None)
            or (problem is not None and problem.m <= TT_OWN_ROWS_MAX_M)):
        return None
    swapped_problem = problem and replace(problem, m=problem.n, n=problem.m)
    best, rejected = choose_sm90(dtype, out_dtype, layout.transposed(), spec, knobs=knobs, problem=swapped_problem,
                                 sm_count=sm_count, epilogue=epilogue)
    back = exchanged_operands(best.config)
    if not is_legal(back) or transposed_product(back) is None:
        return None
    return Estimate(back, best.cost, f"planned as D^T = B^T A^T, the kernel that runs ({best.config.tile[0]}x"
                                     f"{best.config.tile[1]} on N x M): {best.reason}"), rejected


def few_columns_fill(dtype: DType, out_dtype: DType, layout: Layout, spec: ArchSpec, problem: Problem, sm_count: int,
                     tile: tuple[int, int], epilogue: Epilogue, dtype_b: DType | None) -> Estimate | None:
    """FEW_COLUMNS_FILL_N's plan: ``tile`` (few_columns_fill_tile) as ruled_pingpong_config builds it; None where
    check_config refuses it (the model plans then)."""
    cfg = ruled_pingpong_config(tile, dtype, out_dtype, layout, spec, epilogue, dtype_b)
    if not is_legal(cfg):
        return None
    tiles = tile_count(cfg.tile, problem)
    return Estimate(cfg, estimate(cfg, spec, sm_count, problem).cost,
                    f"{tile[0]}x{tile[1]} pingpong by rule: {problem.n} columns of an M-major A, whose {tiles} tiles "
                    f"fill {tiles} of {sm_count} SMs in one wave, the most of any 64-128 column tile")


def split_k_parts(cfg: KernelConfig, problem: Problem, sm_count: int) -> int:
    """How many k parts the launch cuts each tile of ``cfg`` into (1: none) when the plan takes split-K: a persistent
    single problem (grouped calls take no stream-K) whose tiles reach at most SPLIT_K_MAX_SM_SHARE of the SMs
    (SPLIT_K_SMALL_TILE_SM_SHARE for 64x64 pingpong), of at least split_k_min_k_tiles k tiles, not int8 (its int32
    sums are not added as fp32 partials); from SPLIT_K_LONG_K_TILES k tiles ``long_k_parts``, and below that where
    ``long_k_parts`` splits (its parts walk SPLIT_K_LONG_K_PART_MIN_K_TILES k tiles or more)."""
    units = tile_count(cfg.tile, problem)   # (1x1 clusters, one problem: a unit is a tile)
    k_tiles = math.ceil(problem.k / cfg.tile[2])
    if long_k(k_tiles):
        parts = long_k_parts(cfg, problem, sm_count)
        if parts > 1 or k_tiles >= SPLIT_K_LONG_K_TILES:
            return parts
    share = SPLIT_K_SMALL_TILE_SM_SHARE if is_small_tile(cfg) else SPLIT_K_MAX_SM_SHARE.get(cfg.schedule, 0.0)
    if (not _splittable(cfg, problem) or units > share * sm_count
            or k_tiles < split_k_min_k_tiles(cfg, problem, units, sm_count)):
        return 1
    return split_parts(sm_count // units, k_tiles)


def split_parts(fit: int, k_tiles: int) -> int:
    """The k parts of each tile of a split launch where ``fit`` parts of each tile fit the SMs: parts of
    SPLIT_K_PART_K_TILES k tiles but at least SPLIT_K_MIN_PARTS, at most ``fit``, none empty
    (templates/sm90/launch.cuh split_k_parts, the same rule)."""
    return min(fit, k_tiles, max(SPLIT_K_MIN_PARTS, k_tiles // SPLIT_K_PART_K_TILES))


def split_k_min_k_tiles(cfg: KernelConfig, problem: Problem, units: int, sm_count: int) -> int:
    """The fewest k tiles split_k_parts splits a plan of ``units`` tiles at. 16-bit inputs: on at most
    SPLIT_K_FEW_TILES_SM_SHARE of the SMs, SPLIT_K_SHORT_K_MIN_K_TILES (over one 64-row tile row only on at most
    SPLIT_K_ONE_ROW_SHORT_K_SM_SHARE, else SPLIT_K_SEVERAL_ROWS_MIN_K_TILES); on more,
    SPLIT_K_SEVERAL_ROWS_MIN_K_TILES over more than one tile row and SPLIT_K_MIN_K_TILES over one. Other inputs:
    SPLIT_K_MIN_K_TILES."""
    several_rows = problem.m > SMALL_M_TILE_ROWS
    if cfg.dtype.bytes != 2:
        return SPLIT_K_MIN_K_TILES
    if units <= SPLIT_K_FEW_TILES_SM_SHARE * sm_count:
        short_k = several_rows or units <= SPLIT_K_ONE_ROW_SHORT_K_SM_SHARE * sm_count
        return SPLIT_K_SHORT_K_MIN_K_TILES if short_k else SPLIT_K_SEVERAL_ROWS_MIN_K_TILES
    return SPLIT_K_SEVERAL_ROWS_MIN_K_TILES if several_rows else SPLIT_K_MIN_K_TILES


def _splittable(cfg: KernelConfig, problem: Problem) -> bool:
    """What both split-K rules ask of a plan: a 1x1 cluster, one problem (grouped calls take no stream-K), not int8
    (its int32 sums are not added as fp32 partials)."""
    return cfg.cluster == (1, 1) and problem.batch == 1 and cfg.dtype.value != "int8"


def long_k_parts(cfg: KernelConfig, problem: Problem, sm_count: int) -> int:
    """The k parts of each tile of a persistent plan of one problem over a long K (long_k_split_pays) whose
    cluster units the launch cuts into at least SPLIT_K_LONG_K_MIN_PARTS parts (resident clusters // units); 1
    otherwise, and for int8 (its int32 sums are not added as fp32 partials). A 1x1 plan, or a 2x1 one over real tile
    rows (LONG_K_SPLIT_CLUSTERS)."""
    units_m, units_n = grid_units(cfg, problem)
    parts = resident_clusters(sm_count, cfg.cluster[0] * cfg.cluster[1]) // (units_m * units_n)
    splittable = _splittable(cfg, problem) or long_k_split_cluster(cfg, problem)
    if (not splittable or parts < SPLIT_K_LONG_K_MIN_PARTS or cfg.schedule not in SPLIT_K_MAX_SM_SHARE
            or not long_k_split_pays(math.ceil(problem.k / cfg.tile[2]), parts)):
        return 1
    return parts


def long_k_split_pays(k_tiles: int, parts: int) -> bool:
    """Whether a long-K split of ``k_tiles`` k tiles into ``parts`` parts is weighed: from SPLIT_K_LONG_K_TILES k
    tiles, or with SPLIT_K_LONG_K_PART_MIN_K_TILES k tiles in each part."""
    return k_tiles >= SPLIT_K_LONG_K_TILES or k_tiles >= parts * SPLIT_K_LONG_K_PART_MIN_K_TILES


def long_k(k_tiles: int) -> bool:
    """Whether a K of ``k_tiles`` k tiles can take the long-K split (in SPLIT_K_LONG_K_MIN_PARTS parts at least)."""
    return long_k_split_pays(k_tiles, SPLIT_K_LONG_K_MIN_PARTS)


def long_k_split_cluster(cfg: KernelConfig, problem: Problem) -> bool:
    """Whether ``cfg`` takes LONG_K_SPLIT_CLUSTERS' rule: a 2x1 cluster where ``long_k_over_two_rows``, not int8."""
    return (cfg.cluster in LONG_K_SPLIT_CLUSTERS and long_k_over_two_rows(cfg.tile, problem)
            and cfg.dtype.value != "int8")


def long_k_over_two_rows(tile: tuple[int, int, int], problem: Problem) -> bool:
    """Where LONG_K_SPLIT_CLUSTERS' 2x1 cluster is weighed: a K the long-K split takes (long_k), at least two tile
    rows (the cluster's second block has a real tile), one problem."""
    return (long_k(math.ceil(problem.k / tile[2])) and problem.batch == 1
            and math.ceil(problem.m / tile[0]) >= 2)
