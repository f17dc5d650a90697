"""The configs a tuning run measures: the planner's pick first, then the legal configs around it.

Around means: the pick's neighbours along every axis the config has (stages one more or less, the other
clusters, cooperative against pingpong, the tile a step larger or smaller along M or N, the N tile that fills the
SMs' waves best, the raster order and group, data-parallel against split-K/stream-K), then the planner's next best
by estimate and their neighbours, then the rest of what the planner weighs. Every candidate honours the knobs the
user fixed and passes ``check_config``, the same legality rules the planner applies: tuning replaces the estimate,
never the rules.
Pure Python, like the planner: no torch, no GPU, no files.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Iterator

from ..planner import Knobs, Problem, estimate, ranked
from ..planner.sm80 import default_stages
from ..planner.sm90 import PLANNED_CLUSTERS, choose_raster, filling_block_n, ring_staged, with_staging_in_ring
from ..spec.arch import ArchSpec
from ..spec.config import (MIN_STAGES, RASTER_GROUPS, RASTERS, SM90_BLOCK_N, KernelConfig, is_legal, max_stages,
                           WGMMA_ROWS, sm80_block_k, sm90_max_stages_that_fit)
from ..spec.epilogue import IDENTITY, Epilogue
from ..spec.types import DType, Layout

#: How many configs a tuning run measures at most (the pick included).
DEFAULT_MAX_CANDIDATES = 32
#: The planner's best this many by estimate (the pick among them) lead the candidates after the pick's neighbours.
TOP_BY_ESTIMATE = 8
#: sm80 warp grids weighed for a tile besides the planner's (check_config keeps those that split it).
SM80_WARP_GRIDS = ((2, 2), (2, 4), (4, 2))


@dataclass(frozen=True)
class Space:
    """The planner's inputs that every candidate of a plan shares: what the user asked for but the problem size
    (``Gemm`` makes one from its request). ``epilogue`` is resolved, its scales composed in."""

    dtype: DType
    out_dtype: DType
    layout: Layout
    spec: ArchSpec
    sm_count: int
    knobs: Knobs = Knobs()
    epilogue: Epilogue = IDENTITY
    dtype_b: DType | None = None


def honours(cfg: KernelConfig, knobs: Knobs) -> bool:
    """Whether ``cfg`` keeps every knob the user fixed."""
    fixed = (("tile", cfg.tile), ("warps", cfg.warps), ("stages", cfg.stages), ("raster_group", cfg.raster_group),
             ("family", cfg.family), ("schedule", cfg.schedule), ("cluster", cfg.cluster), ("raster", cfg.raster),
             ("fast_accum", cfg.fast_accum), ("amax", cfg.amax))
    return all(getattr(knobs, knob) in (None, value) for knob, value in fixed)


# -- neighbours, one axis at a time -------------------------------------------------------------------------

def _stage_neighbours(cfg: KernelConfig) -> Iterator[KernelConfig]:
    for stages in (cfg.stages - 1, cfg.stages + 1):
        if MIN_STAGES <= stages <= max_stages(cfg.family):
            yield replace(cfg, stages=stages)


def _group_neighbours(cfg: KernelConfig) -> Iterator[KernelConfig]:
    for group in (cfg.raster_group // 2, cfg.raster_group * 2):
        if group in RASTER_GROUPS:
            yield replace(cfg, raster_group=group)


def _sm90_refit(cfg: KernelConfig, space: Space, problem: Problem) -> KernelConfig:
    """``cfg`` after a change of tile, schedule or cluster, with the stages, staging and raster the planner would give
    it."""
    if space.knobs.stages is None:
        cfg = replace(cfg, staging_in_ring=False)
        cfg = ring_staged(replace(cfg, stages=max(MIN_STAGES, sm90_max_stages_that_fit(cfg))), space.knobs)
    return choose_raster(cfg, problem, space.sm_count, space.knobs)


def _sm90_neighbours(cfg: KernelConfig, space: Space, problem: Problem) -> Iterator[KernelConfig]:
    yield from _stage_neighbours(cfg)
    for cluster in PLANNED_CLUSTERS:
        if cluster != cfg.cluster:
            yield _sm90_refit(replace(cfg, cluster=cluster), space, problem)
    other = {"cooperative": "pingpong", "pingpong": "cooperative"}.get(cfg.schedule)
    if other is not None:
        yield _sm90_refit(replace(cfg, schedule=other, stream_k=False, interleave_k=False), space, problem)
    bm, bn, bk = cfg.tile
    if cfg.promoted and bm == WGMMA_ROWS and other is not None:
        # (a promoted 64-row tile: its two warpgroups interleaving K against one warpgroup's tile, planner rule 22)
        interleaved = replace(cfg, schedule="cooperative", interleave_k=True)
        yield _sm90_refit(replace(cfg, schedule="pingpong", interleave_k=False) if cfg.interleave_k else interleaved,
                          space, problem)
    # (an odd N tile, the planner's where it fills the waves: the even ones on either side of it)
    wider, narrower = (bn + 64, bn - 64) if bn % 64 == 0 else (bn // 64 * 64 + 64, bn // 64 * 64)
    for tile in ((bm, narrower, bk), (bm, wider, bk), (bm // 2, bn, bk), (bm * 2, bn, bk)):
        if tile[1] in SM90_BLOCK_N and tile[0] >= 64:
            yield _sm90_refit(replace(cfg, tile=tile), space, problem)
    # (cuBLAS's 144-wide tiles at 512 x 4544 x 4544: 128 tiles instead of 96 of 128x192; ours measured 0.834x cuBLAS
    # against 0.795x, h100_midm_odd_n.json)
    filling = filling_block_n(cfg, problem, space.sm_count)
    if filling is not None:
        yield _sm90_refit(replace(cfg, tile=(bm, filling, bk)), space, problem)
    for raster in RASTERS:
        if raster != cfg.raster:
            yield replace(cfg, raster=raster)
    yield from _group_neighbours(cfg)
    if cfg.schedule in ("cooperative", "pingpong"):   # the decomposition: whole tiles against split-K / stream-K
        yield replace(with_staging_in_ring(cfg, False), stream_k=not cfg.stream_k)
    if space.knobs.stages is None:   # the epilogue's staging: its own buffers against the ring's stages
        yield with_staging_in_ring(cfg, not cfg.staging_in_ring)


def _sm80_neighbours(cfg: KernelConfig, space: Space) -> Iterator[KernelConfig]:
    yield from _stage_neighbours(cfg)
    for warps in SM80_WARP_GRIDS:
        if warps != cfg.warps:
            yield replace(cfg, warps=warps)
    bm, bn, bk = cfg.tile
    for block_k in sm80_block_k(cfg.dtype):
        if block_k != bk:
            tile = (bm, bn, block_k)
            stages = space.knobs.stages if space.knobs.stages is not None else default_stages(
                tile, cfg.warps, cfg.dtype, space.spec)
            yield replace(cfg, tile=tile, stages=stages)
    yield from _group_neighbours(cfg)


def neighbours(cfg: KernelConfig, space: Space, problem: Problem) -> list[KernelConfig]:
    """The configs one step from ``cfg`` along each axis that are legal and keep the user's knobs (in no order of
    preference; ``candidates`` orders them by estimate)."""
    steps = _sm90_neighbours(cfg, space, problem) if cfg.family == "sm90" else _sm80_neighbours(cfg, space)
    return [c for c in steps if c != cfg and honours(c, space.knobs) and is_legal(c)]


def is_fine_step(cfg: KernelConfig, base: KernelConfig) -> bool:
    """Whether ``cfg`` differs from ``base`` only in the stages or the raster order and group: steps that move a
    few percent, where a tile, schedule, cluster or decomposition can move tens."""
    return replace(cfg, stages=base.stages, raster=base.raster, raster_group=base.raster_group) == base


# -- the candidates -------------------------------------------------------------------------------------------

def candidates(space: Space, problem: Problem, pick: KernelConfig,
               max_candidates: int = DEFAULT_MAX_CANDIDATES) -> list[KernelConfig]:
    """At most ``max_candidates`` distinct configs to measure for ``problem``: ``pick`` (the estimate's choice)
    first, then its neighbours, the planner's next best by estimate, their neighbours in tile, schedule, cluster and
    decomposition, the rest of the planner's candidates, and last their neighbours in stages and raster; within each
    group cheapest by estimate first. Deterministic."""
    if max_candidates < 1:
        raise ValueError(f"max_candidates={max_candidates}: give at least 1 (the estimate's pick)")
    by_estimate = [est.config for est in ranked(space.dtype, space.out_dtype, space.layout, space.spec,
                                                knobs=space.knobs, problem=problem, sm_count=space.sm_count,
                                                epilogue=space.epilogue, dtype_b=space.dtype_b)]
    top = by_estimate[:TOP_BY_ESTIMATE]
    around_top = [(n, cfg) for cfg in top for n in neighbours(cfg, space, problem)]
    groups: list[Iterable[KernelConfig]] = [
        [pick],
        _cheapest_first(neighbours(pick, space, problem), space, problem),
        top,
        _cheapest_first([n for n, cfg in around_top if not is_fine_step(n, cfg)], space, problem),
        by_estimate[TOP_BY_ESTIMATE:],
        _cheapest_first([n for n, cfg in around_top if is_fine_step(n, cfg)], space, problem),
    ]
    chosen: dict[str, KernelConfig] = {}
    for group in groups:
        for cfg in group:
            if len(chosen) == max_candidates:
                return list(chosen.values())
            chosen.setdefault(cfg.name, cfg)
    return list(chosen.values())


def _cheapest_first(configs: list[KernelConfig], space: Space, problem: Problem) -> list[KernelConfig]:
    # sorted() is stable: equal estimates (stages, raster, split-K are not in the model) keep the order of the steps
    return sorted(configs, key=lambda cfg: estimate(cfg, space.spec, space.sm_count, problem).cost)
