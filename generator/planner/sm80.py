"""The planner: enumerate the legal configs for an architecture, dtype and layout, estimate each one's
time with a small analytic model, keep the cheapest. Every choice is explainable in one line.

The kernel family follows the architecture (sm90 at arch 90, sm80 below it) unless the user fixes it;
this module plans the sm80 family; ``common`` holds what both share (Problem, Knobs, ``pick``) and
``sm90`` plans the sm90 family.

The sm80 model (relative units, not seconds):
    time = waves * blocks_per_sm * tile_flops / (tile_efficiency * sm_rate)
where waves = ceil(tiles / (sms * blocks_per_sm)). Big tiles reuse each loaded byte more (higher
efficiency) but quantize worse on small problems; the model trades the two. Measured tuning may later
replace the estimate; never the legality rules in config.check_config.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..spec.arch import ArchSpec
from ..spec.config import KernelConfig, max_stages_that_fit
from ..spec.epilogue import IDENTITY, Epilogue
from ..spec.types import DType, Layout
from .common import DEFAULT_PROBLEM, Estimate, Knobs, Problem, epilogue_overhead_k, pick

# Tile -> (warps, block K, relative per-SM efficiency). Efficiency follows arithmetic intensity per k
# step: a 64x64 warp tile issues 32 mma.sync per 8 ldmatrix.x4; smaller warp tiles load more per mma, and
# 4-warp blocks need two resident blocks to keep the SM's four schedulers fed. The 4-warp tiles take
# BK = 64: with their few mma per k tile, BK = 32 leaves the barrier and the copies exposed (H100,
# of the 13 benchmark shapes whose pick changed, 12 ran 8-41 % faster and one 2 % slower; docs/planner.md
# "sm80 small tiles take BK = 64"). The efficiencies are the BK = 32 era's; only the block K changed.
# BK is given for 16-bit inputs; other input types keep its bytes per row (``block_k``: tf32 takes half as many
# elements, so a stage, the swizzle and the copies stay those of the 16-bit config).
SM80_TILES: dict[tuple[int, int], tuple[tuple[int, int], int, float]] = {
    (128, 256): ((2, 4), 32, 1.00),
    (256, 128): ((4, 2), 32, 1.00),
    # 8 warps of 64x32: with 4 warps of 64x64 the copies' addresses push ptxas past 255 registers.
    (128, 128): ((2, 4), 32, 0.85),
    (128, 64): ((2, 2), 64, 0.70),
    (64, 128): ((2, 2), 64, 0.70),
    (64, 64): ((2, 2), 64, 0.50),
}
TABLE_ELEM_BYTES = 2      # SM80_TILES' BK counts 16-bit elements
PLANNER_MIN_STAGES, PLANNER_MAX_STAGES = 3, 4
# This family on Hopper (an H100 or H200, whose 227 KB of shared memory per block the A100's 163 KB is not): the
# 8-warp 128x128 tile takes BK = 64, and 4-warp tiles up to 7 stages (64x64: as many as two blocks per SM fit).
# Measured in the calibration sweeps (benchmarks/calibrate.py, H200, the LLM set and squares, bf16 and fp16 tn,
# h200_confirmed_calibrate_sm80_*.json; docs/tuning.md): the pick within 3 % of the measured best on 30 of 66 shapes,
# 18 before (bf16 11 -> 17, fp16 7 -> 13); the pick's time over the best, geomean, 1.069 -> 1.040. The 64x64 tile's
# fifth stage is 5-18 % at M = 128, 128x128's BK = 64 15-25 % at M = 128-512. 128x256 at BK = 64 also measured 3-5 %
# faster in bf16 at large M, but it spills (255 registers, 168 bytes of spill loads): not taken. A second sweep around
# the new picks (h200_calibrate_sm80_hopper_picks.json) found 64x64 with 6 stages 5-8 % ahead of 5 at M = 128 in both
# dtypes, a third (h200_calibrate_sm80_after_hopper_table.json) 7 stages 3-6 % ahead of 6; with 7, 8 of 10 such picks
# are within 3 % of the best (h200_calibrate_sm80_seven_stages.json). tf32 and int8 keep the 16-bit config's bytes per
# stage (block_k), so they follow (not swept).
HOPPER_BLOCK_K = {(128, 128): 64}
HOPPER_MAX_STAGES_4_WARPS = 7
# On Hopper, 128x256 (8 warps, BK = 32) takes 3 stages instead of 4 for a long K (at least LONG_K) on at least
# LONG_K_MIN_ROWS rows. In the calibration sweep (h200_calibrate_sm80_after_hopper_table.json, bf16 and fp16 tn), 3
# stages ran 0.3-3.9 % faster on 23 of the 24 such shapes, and on 19 of them the tuner picked 3 stages over 4: timed
# again side by side on fresh operands, 0.8-4.8 % faster. With K = 4096, or with fewer rows (one or two waves), 3
# stages read 0.90-1.01 of 4.
HOPPER_LONG_K_STAGES = {(128, 256): 3}
# The 4-warp 128x64 and 64x128 tiles' efficiency on Hopper (SM80_TILES: 0.70, the A100-era guess). Fitted to the
# calibration sweeps (H200, bf16 and fp16 tn): 0.8 moves one benchmark shape's pick, 512x6144x4096, from 128x256 (96
# tiles: a quarter of the SMs idle) to 128x64, which measured 8 % faster in both dtypes, timed again side by side
# (h200_calibrate_sm80_after_hopper_table.json); no other shape of the LLM set or the squares moves. A sweep after
# the change with two shapes the fit never saw, 768x4096x4096 and 384x8192x4096, found 128x64 the best of 16 on all
# three in both dtypes, the old pick 1.08-1.09x its time (h200_calibrate_sm80_hopper_small_tiles.json).
HOPPER_TILE_EFFICIENCY = {(128, 64): 0.8, (64, 128): 0.8}
LONG_K = 8192
LONG_K_MIN_ROWS = 512
HOPPER_CC = 90
DEFAULT_RASTER_GROUP = 8
# Registers per thread, for the occupancy estimate: the ptxas report gives 254 for a 64x64 warp tile
# (128 accumulators, double-buffered fragments, addresses); smaller warp tiles need fewer.
MAX_REGS_PER_THREAD = 255
BASE_REGS_PER_THREAD = 64


def block_k(table_bk: int, dtype: DType) -> int:
    """SM80_TILES' BK (16-bit elements) for ``dtype``: the same bytes per row (tf32: 32 -> 16, 64 -> 32)."""
    return table_bk * TABLE_ELEM_BYTES // dtype.bytes


def regs_per_thread(cfg: KernelConfig) -> int:
    warp_m, warp_n = cfg.warp_tile
    return min(MAX_REGS_PER_THREAD, BASE_REGS_PER_THREAD + 3 * warp_m * warp_n // 64)


def default_warps(tile: tuple[int, int, int]) -> tuple[int, int]:
    """The warp grid for a tile: the table's choice, else 64x64 warp tiles with 4 or 8 warps."""
    bm, bn, _ = tile
    if (bm, bn) in SM80_TILES:
        return SM80_TILES[(bm, bn)][0]
    wm, wn = max(1, bm // 64), max(1, bn // 64)
    while wm * wn > 8:
        wm, wn = (wm // 2, wn) if wm >= wn else (wm, wn // 2)
    while wm * wn < 4:
        wm, wn = (wm * 2, wn) if bm // wm >= bn // wn else (wm, wn * 2)
    return wm, wn


def blocks_per_sm(cfg: KernelConfig, spec: ArchSpec) -> int:
    by_smem = spec.smem_per_sm // max(cfg.smem_bytes, 1)
    by_regs = spec.regs_per_sm // (cfg.threads * regs_per_thread(cfg))
    by_threads = spec.max_threads_per_sm // cfg.threads
    return max(1, min(by_smem, by_regs, by_threads))


def table_block_k(tile: tuple[int, int], spec: ArchSpec) -> int:
    """SM80_TILES' BK (16-bit elements) for ``tile`` on the GPU of ``spec`` (HOPPER_BLOCK_K on Hopper)."""
    bk = SM80_TILES[tile][1]
    return HOPPER_BLOCK_K.get(tile, bk) if spec.cc >= HOPPER_CC else bk


def default_stages(tile: tuple[int, int, int], warps: tuple[int, int], dtype: DType, spec: ArchSpec) -> int:
    """As deep as fits, 3 to 4 stages (4-warp tiles on Hopper: 5), leaving room for two blocks per SM when a block
    has 4 warps."""
    four_warps = warps[0] * warps[1] == 4
    resident = 2 if four_warps else 1
    bm, bn, bk = tile
    fit = (spec.smem_per_sm // resident - 1024) // ((bm + bn) * bk * dtype.bytes)
    fit = min(fit, max_stages_that_fit(tile, dtype, spec))
    deepest = HOPPER_MAX_STAGES_4_WARPS if four_warps and spec.cc >= HOPPER_CC else PLANNER_MAX_STAGES
    return max(PLANNER_MIN_STAGES, min(deepest, fit))


def estimate(cfg: KernelConfig, spec: ArchSpec, sm_count: int, problem: Problem) -> Estimate:
    bm, bn, _ = cfg.tile
    efficiency = tile_efficiency((bm, bn), spec)
    tiles = math.ceil(problem.m / bm) * math.ceil(problem.n / bn) * problem.batch
    resident = blocks_per_sm(cfg, spec)
    per_sm = math.ceil(tiles / sm_count)          # tiles the busiest SM computes
    # 4-warp blocks reach their efficiency only with two of them on an SM (four schedulers to feed).
    needed = 2 if cfg.threads <= 128 else 1
    efficiency *= min(1.0, min(per_sm, resident) / needed)
    cost = per_sm * bm * bn * (max(problem.k, 1) + epilogue_overhead_k(cfg)) / efficiency
    slots = sm_count * resident
    waves = math.ceil(tiles / slots)
    last_wave_fill = (tiles - (waves - 1) * slots) / slots
    reason = (f"{tiles} tiles of {bm}x{bn} in {waves} wave(s) over {sm_count} SMs x {resident} block(s) "
              f"(last wave {last_wave_fill:.0%} full), efficiency {efficiency:.2f}; {cfg.stages} stages use "
              f"{cfg.smem_bytes} of {spec.smem_per_block} bytes of shared memory")
    return Estimate(cfg, cost, reason)


def tile_efficiency(tile: tuple[int, int], spec: ArchSpec) -> float:
    """The relative per-SM efficiency of ``tile`` (SM80_TILES, HOPPER_TILE_EFFICIENCY on Hopper; 0.5 off the table)."""
    if spec.cc >= HOPPER_CC and tile in HOPPER_TILE_EFFICIENCY:
        return HOPPER_TILE_EFFICIENCY[tile]
    return SM80_TILES[tile][2] if tile in SM80_TILES else 0.5


def long_k_stages(tile: tuple[int, int, int], spec: ArchSpec, problem: Problem | None) -> int | None:
    """HOPPER_LONG_K_STAGES' depth for ``tile`` when ``problem`` has a long K on many rows (None: the default)."""
    if problem is None or spec.cc < HOPPER_CC or problem.k < LONG_K or problem.m < LONG_K_MIN_ROWS:
        return None
    return HOPPER_LONG_K_STAGES.get(tile[:2])


def candidates(dtype: DType, out_dtype: DType, layout: Layout, spec: ArchSpec, knobs: Knobs,
               problem: Problem | None = None) -> list[KernelConfig]:
    """Every config the planner would consider, honouring the fixed knobs (checked by check_config); ``problem``
    (when the plan has size hints) may change a tile's depth (long_k_stages)."""
    if knobs.tile is not None:
        tiles = [knobs.tile]
    else:
        tiles = [(bm, bn, block_k(table_block_k((bm, bn), spec), dtype)) for (bm, bn) in SM80_TILES]
    configs = []
    for tile in tiles:
        warps = knobs.warps or default_warps(tile)
        # "is None", not "or": a fixed stages=0 or raster_group=0 is judged (and refused), not replaced.
        stages = knobs.stages if knobs.stages is not None else (
            long_k_stages(tile, spec, problem) or default_stages(tile, warps, dtype, spec))
        group = knobs.raster_group if knobs.raster_group is not None else DEFAULT_RASTER_GROUP
        configs.append(KernelConfig(
            arch=spec.cc, dtype=dtype, out_dtype=out_dtype, layout=layout, tile=tile, warps=warps,
            stages=stages, raster_group=group))
    return configs


def choose_sm80(dtype: DType, out_dtype: DType, layout: Layout, spec: ArchSpec, *, knobs: Knobs,
                problem: Problem | None, sm_count: int, epilogue: Epilogue = IDENTITY,
                dtype_b: DType | None = None) -> tuple[Estimate, list[str]]:
    """planner.choose for the sm80 family. ``problem`` None: no size hints (plan for a large square)."""
    hinted = problem
    problem = problem or Problem(*DEFAULT_PROBLEM)
    configs = [replace(c, epilogue=epilogue, dtype_b=dtype_b)
               for c in candidates(dtype, out_dtype, layout, spec, knobs, hinted)]
    return pick(configs, lambda cfg: estimate(cfg, spec, sm_count, problem))
