"""The candidates a tuning run measures (generator/tune/candidates.py): the estimate's pick first, only legal configs
that keep the user's knobs, the pick's neighbours along every axis, the cap, the same list every time."""
from __future__ import annotations

from dataclasses import replace

import pytest

from generator import Gemm, check_config
from generator.gemm import _space
from generator.planner import Problem
from generator.tune import Space, candidates, neighbours
from generator.planner.sm90 import wave_fill

SHAPES = [(4096, 4096, 4096), (512, 4096, 14336), (128, 4096, 14336), (16384, 28672, 8192), (1000, 1000, 1000)]


def space_of(plan: Gemm) -> Space:
    return _space(plan._request)


def candidates_of(plan: Gemm, cap: int = 32) -> list:
    return candidates(space_of(plan), plan._request.problem, plan.estimate.config, cap)


@pytest.mark.parametrize("family", ["sm90", "sm80"])
@pytest.mark.parametrize("shape", SHAPES)
def test_pick_first_all_legal_distinct_capped(family: str, shape: tuple[int, int, int]) -> None:
    m, n, k = shape
    plan = Gemm("bf16", "tn", arch=90, family=family, m=m, n=n, k=k)
    found = candidates_of(plan)
    assert found[0] == plan.estimate.config
    assert 1 < len(found) <= 32
    assert len({c.name for c in found}) == len(found)
    for cfg in found:
        check_config(cfg)   # the planner's legality rules, not a copy of them
        assert (cfg.dtype, cfg.out_dtype, cfg.layout, cfg.epilogue, cfg.family) == (
            plan.config.dtype, plan.config.out_dtype, plan.config.layout, plan.config.epilogue, family)


def test_deterministic() -> None:
    plan = Gemm("fp16", "tn", arch=90, m=512, n=4096, k=14336)
    assert [c.name for c in candidates_of(plan)] == [c.name for c in candidates_of(plan)]


@pytest.mark.parametrize("cap", [1, 4, 7])
def test_cap_is_honoured_and_keeps_the_pick(cap: int) -> None:
    plan = Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096)
    found = candidates_of(plan, cap)
    assert len(found) == cap and found[0] == plan.estimate.config
    assert [c.name for c in found] == [c.name for c in candidates_of(plan)][:cap]


def test_cap_below_one_is_refused() -> None:
    plan = Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096)
    with pytest.raises(ValueError, match="max_candidates=0"):
        candidates_of(plan, 0)


def test_sm90_neighbours_cover_every_axis() -> None:
    plan = Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096)
    pick = plan.estimate.config
    assert (pick.tile, pick.cluster, pick.schedule, pick.stages) == ((128, 256, 64), (2, 1), "cooperative", 4)
    near = neighbours(pick, space_of(plan), plan._request.problem)
    found = candidates_of(plan)
    for group in (near, found):
        assert any(c.stages == pick.stages - 1 for c in group)                    # stages -
        assert any(c.cluster == (1, 1) for c in group) and any(c.cluster == (1, 2) for c in group)
        assert any(c.tile == (128, 192, 64) for c in group)                       # tile: BN - 64
        assert any(c.tile == (256, 256, 64) for c in group) is False              # illegal tiles never appear
        assert any(c.raster != pick.raster for c in group)                        # raster order
        assert any(c.raster_group != pick.raster_group for c in group)            # raster group
        assert any(c.stream_k for c in group)                                     # decomposition
        assert any(c.staging_in_ring for c in group)                              # the epilogue's staging
    assert any(c.schedule == "pingpong" for c in found)                           # schedule
    # one step each: a neighbour differs from the pick along one axis (a new tile brings its own stages and raster;
    # the staging its stages)
    for cfg in near:
        changed = {f for f in ("tile", "cluster", "schedule", "stages", "raster", "raster_group", "stream_k",
                               "staging_in_ring") if getattr(cfg, f) != getattr(pick, f)}
        assert changed and (len(changed) == 1 or changed & {"tile", "cluster", "schedule"}
                            or changed == {"staging_in_ring", "stages"}), cfg.name


def test_split_k_pick_has_its_data_parallel_neighbour() -> None:
    plan = Gemm("bf16", "tn", arch=90, m=128, n=4096, k=14336)
    pick = plan.estimate.config
    assert pick.stream_k   # the planner's split-K for a long K with few tiles
    names = {c.name for c in candidates_of(plan)}
    assert replace(pick, stream_k=False).name in names


def test_a_pingpong_pick_has_its_split_neighbour() -> None:
    """Both persistent schedules cut K: a whole 64x64 pingpong pick is timed beside the same kernel split."""
    plan = Gemm("bf16", "tn", arch=90, m=256, n=768, k=2048)
    pick = plan.estimate.config
    assert pick.schedule == "pingpong" and not pick.stream_k
    assert replace(pick, stream_k=True).name in {c.name for c in candidates_of(plan)}


def test_sm80_neighbours() -> None:
    plan = Gemm("bf16", "tn", arch=80, m=4096, n=4096, k=4096)
    pick = plan.estimate.config
    found = candidates_of(plan)
    assert any(c.stages == pick.stages + 1 for c in found)
    assert any(c.warps != pick.warps and c.tile == pick.tile for c in found)
    assert any(c.tile[2] != pick.tile[2] and c.tile[:2] == pick.tile[:2] for c in found)   # block K
    assert any(c.raster_group != pick.raster_group for c in found)
    assert {c.tile[:2] for c in found} >= {(128, 256), (256, 128), (128, 128), (128, 64), (64, 128), (64, 64)}


def test_fixed_knobs_are_kept() -> None:
    plan = Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096, schedule="pingpong", stages=4)
    found = candidates_of(plan)
    assert len(found) > 1
    assert all(c.schedule == "pingpong" and c.stages == 4 for c in found)
    fixed_tile = Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096, tile_shape=(128, 128, 64), cluster_shape=(1, 1))
    assert all(c.tile == (128, 128, 64) and c.cluster == (1, 1) for c in candidates_of(fixed_tile))


def test_epilogue_and_dtypes_carry_over() -> None:
    plan = Gemm("bf16", "tn", arch=90, m=2048, n=2048, k=2048, activation="gelu", bias="col")
    assert all(c.epilogue == plan.config.epilogue and not c.epilogue.is_identity for c in candidates_of(plan))
    fp8 = Gemm("e4m3", "tn", arch=90, m=4096, n=4096, k=4096, scale="tensor")
    found = candidates_of(fp8)
    assert found[0] == fp8.config and all(c.dtype == fp8.config.dtype and c.promoted for c in found)
    for cfg in found:
        check_config(cfg)


def test_candidates_of_a_problem_other_than_the_plans() -> None:
    plan = Gemm("bf16", "tn", arch=90)
    small = candidates(space_of(plan), Problem(64, 8192, 8192), plan.estimate.config)
    assert small[0] == plan.estimate.config and len(small) > 1


def test_sm90_neighbours_include_the_n_tile_that_fills_the_waves() -> None:
    """512 x 4544 x 4544: 96 tiles of 128x192 leave a quarter of the SMs idle; 128x144 makes 128 tiles. Only 16-bit
    or fp8 inputs with a K-major B take such a tile, and only where it fills the waves better than the pick's own BN."""
    plan = Gemm("bf16", "tn", arch=90, m=512, n=4544, k=4544)
    pick = replace(plan.estimate.config, tile=(128, 192, 64), stages=4)   # (the planner's own pick is 128x144 now)
    near = neighbours(pick, space_of(plan), plan._request.problem)
    assert any(c.tile == (128, 144, 64) for c in near)
    assert wave_fill(pick, 144, plan._request.problem, 132) > wave_fill(pick, 192, plan._request.problem, 132)
    # An N-major B (layout tt) never gets one; fp8 gets the ones its promotion and block scales can take.
    tt = Gemm("bf16", "tt", arch=90, m=512, n=4544, k=4544)
    assert not any(c.tile[1] % 64 for c in neighbours(tt.estimate.config, space_of(tt), tt._request.problem))
    for scale in ("tensor", "block"):
        odd = [c for c in candidates_of(Gemm("e4m3", "tn", arch=90, m=512, n=4544, k=4544, scale=scale))
               if c.tile[1] % 64]
        assert odd, scale
        for c in odd:
            check_config(c)


def test_sm90_neighbours_of_an_odd_n_pick_include_the_even_tiles_around_it() -> None:
    """1024 x 4544 x 4544: the planner's 128x144 (ODD_TILES); tune() also tries 128x128 and 128x192."""
    plan = Gemm("bf16", "tn", arch=90, m=1024, n=4544, k=4544)
    assert plan.estimate.config.tile == (128, 144, 64)
    near = {c.tile for c in neighbours(plan.estimate.config, space_of(plan), plan._request.problem)}
    assert {(128, 128, 64), (128, 192, 64)} <= near


def test_a_promoted_64_row_tile_has_its_interleaved_k_twin_among_the_neighbours() -> None:
    """Rule 22's axis: a promoted fp8 64-row pingpong pick's neighbours include the same tile with K interleaved, and
    an interleaved pick's the pingpong tile; every one legal."""
    pingpong = Gemm("e4m3", "tn", arch=90, scale="tensor", m=256, n=4096, k=4096)
    assert pingpong.config.schedule == "pingpong" and not pingpong.config.interleave_k
    found = candidates_of(pingpong)
    assert any(c.interleave_k and c.tile == pingpong.config.tile for c in found)
    interleaved = Gemm("e4m3", "tn", arch=90, scale="tensor", m=128, n=4096, k=4096)
    assert interleaved.config.interleave_k
    found = candidates_of(interleaved)
    assert any(c.schedule == "pingpong" and c.tile == interleaved.config.tile for c in found)
    for cfg in found:
        check_config(cfg)
