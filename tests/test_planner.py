"""The planner's choices, pinned, and every refusal: its exact sentence, and the plan left as it was.

The pinned names are what the current cost model picks. A heuristic change shows up here as a diff
of names; update the pins in the same change, with the reason in its message.
"""
from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from generator.spec.describe import describe
from generator import Gemm, KernelConfig, check_config
from generator.spec import config as config_module
from generator.spec.arch import ARCHS, arch_spec
from generator.spec.config import (SM90_MAX_STAGES, max_stages_that_fit, sm90_max_stages_that_fit, sm90_smem_bytes,
                                   reads_a_into_registers, transposed_product, transposes_in_smem)
from generator.planner import DEFAULT_PROBLEM, Knobs, Problem, choose
from generator.planner.shipped import benchmark_shapes
from generator.spec.types import DType, Order, parse_layout
from tune_cases import visible_h200  # noqa: E402


def plan(**kwargs: object) -> Gemm:
    kwargs.setdefault("dtype", "bf16")
    kwargs.setdefault("layout", "tn")
    kwargs.setdefault("arch", 80)
    return Gemm(**kwargs)  # type: ignore[arg-type]


def snapshot(p: Gemm) -> tuple[object, ...]:
    """Everything observable about a plan, to prove a refused assignment changed nothing."""
    return (p.config, p.name, p.why, p.rejected, str(p), p.out_dtype, p.tile_shape, p.warps, p.stages,
            p.raster_group, p._request)


# -- default plans --------------------------------------------------------------------------------


def test_default_plan_sm90() -> None:
    """At arch 90 the default family is sm90: cooperative 128x256x64, B multicast over a 2x1 cluster."""
    p = Gemm(dtype="bf16", layout="tn", arch=90)
    assert p.name == "sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m"
    assert p.config == KernelConfig(arch=90, dtype=DType.bf16, out_dtype=DType.bf16, layout=parse_layout("tn"),
                                    tile=(128, 256, 64), warps=None, stages=4, raster_group=8, family="sm90",
                                    cluster=(2, 1), schedule="cooperative", raster="m")
    assert (p.arch, p.family, p.schedule, p.cluster_shape, p.raster, p.warps) == (90, "sm90", "cooperative", (2, 1),
                                                                                "m", None)
    assert p.rejected == []


def test_default_plan_sm80_family_at_arch_90() -> None:
    """family="sm80" at arch 90 plans the sm80 family for the H100's 132 SMs (for comparison)."""
    p = Gemm(dtype="bf16", layout="tn", arch=90, family="sm80")
    assert p.name == "sm80_bf16_tn_128x256x32_w2x4_s4_g8"
    assert p.config == KernelConfig(arch=90, dtype=DType.bf16, out_dtype=DType.bf16, layout=parse_layout("tn"),
                                    tile=(128, 256, 32), warps=(2, 4), stages=4, raster_group=8)
    assert (p.family, p.schedule, p.cluster_shape, p.raster) == ("sm80", "", (1, 1), "m")
    assert p.rejected == []


# tf32 on the sm80 family: every layout and order of D, the bf16 plan's tile with half its BK in elements (the same
# bytes per row, stage and stage count), fp32 out by default.
TF32_PROBLEMS = (None, Problem(128, 4096, 4096), Problem(197, 263, 141), Problem(8192, 8192, 8192))


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("layout_c", ["row", "col"])
def test_tf32_sm80_plans_the_bf16_tile_with_half_the_block_k(arch, layout, layout_c):
    spec = arch_spec(arch)
    for problem in TF32_PROBLEMS:
        lay = parse_layout(layout, layout_c=layout_c)
        knobs = Knobs(family="sm80")
        tf32, rejected = choose(DType.tf32, DType.fp32, lay, spec, knobs=knobs, problem=problem)
        bf16, _ = choose(DType.bf16, DType.bf16, lay, spec, knobs=knobs, problem=problem)
        t, b = tf32.config, bf16.config
        assert rejected == [], rejected
        assert (t.family, t.dtype, t.out_dtype, t.layout) == ("sm80", DType.tf32, DType.fp32, lay)
        assert t.tile == (b.tile[0], b.tile[1], b.tile[2] // 2) and t.warps == b.warps
        assert (t.stages, t.stage_bytes, t.smem_bytes) == (b.stages, b.stage_bytes, b.smem_bytes)
        assert t.smem_bytes <= spec.smem_per_block


def test_tf32_sm80_plan_reads_as_tf32() -> None:
    p = plan(dtype="float32", layout="nt")        # an fp32 tensor's dtype plans tf32
    assert p.name == "sm80_tf32_nt_128x256x16_w2x4_s4_g8_ofp32"
    assert "mma.sync m16n8k8" in str(p) and "dtype:        tf32 -> fp32" in str(p)
    assert "mma.sync m16n8k16" in str(plan())
    for out in ("bf16", "fp16"):
        assert plan(dtype="tf32", layout="nn", out_dtype=out).name == f"sm80_tf32_nn_128x256x16_w2x4_s4_g8_o{out}"
    assert plan(dtype="tf32", layout="nn", activation="gelu_tanh", bias="col", out_dtype="bf16").config.family == "sm80"
    assert plan(dtype="tf32", layout="tt", tile_shape=(128, 128, 32)).name == "sm80_tf32_tt_128x128x32_w2x4_s4_g8_ofp32"


def test_tf32_sm90_plans_every_layout_and_says_what_it_transposes() -> None:
    # wgmma reads tf32 from shared memory K-major only: the sm90 kernel reads an M-major A into registers and transposes
    # an N-major B in shared memory, so the planner keeps the sm90 family in every layout, and weighs the bytes
    # transposed per product: nt's row-major B takes 256x128 tiles (its 128 columns transposed per k tile). tt runs as
    # the transposed product D^T = B^T A^T (nn's kernel, nothing transposed), planned as that kernel on N x M: its
    # 256x128 tile is nn's 128x256.
    for layout, tile in (("tn", (128, 256)), ("nn", (128, 256)), ("tt", (256, 128)), ("nt", (256, 128))):
        p = Gemm("fp32", layout, arch=90)
        assert p.family == "sm90" and p.config.tile[:2] == tile
        assert transposes_in_smem(p.config) == (False, layout[1] == "t")   # the plain kernel's (tt's grouped walks)
        assert reads_a_into_registers(p.config) == (layout[0] == "n")
        assert (transposed_product(p.config) is not None) == (layout == "tt")
        assert ("transposed:   B tiles in shared memory" in str(p)) == (layout == "nt"), str(p)
        assert ("transposed:   runs as D^T = B^T A^T (128x256 tiles" in str(p)) == (layout == "tt"), str(p)
        assert ("registers:    A's M-major tiles" in str(p)) == (layout[0] == "n"), str(p)


def test_tf32_tt_plans_the_transposed_products_kernel() -> None:
    # A rule, once: above TT_OWN_ROWS_MAX_M rows tt is planned as the kernel that runs, nn on N x M (every rule of an
    # M-major A), and exchanged back (the tile's sides and the cluster); at fewer rows by its own few-row rules, as tn
    # (split-K over K); an epilogue keeps the plain kernel, planned as tt.
    for m, n, k in ((256, 4096, 4096), (512, 8192, 8192), (4096, 1024, 8192)):
        tt = Gemm("fp32", "tt", arch=90, m=m, n=n, k=k)
        nn = Gemm("fp32", "nn", arch=90, m=n, n=m, k=k).config
        assert transposed_product(tt.config).tile == nn.tile and transposed_product(tt.config).cluster == nn.cluster
        assert "planned as D^T = B^T A^T" in str(tt)
    tt, tn = (Gemm("fp32", layout, arch=90, m=128, n=4096, k=4096).config for layout in ("tt", "tn"))
    assert (tt.tile, tt.cluster, tt.stream_k) == (tn.tile, tn.cluster, True) and transposed_product(tt) is not None
    assert transposed_product(Gemm("fp32", "tt", arch=90, activation="gelu", bias="col").config) is None


def test_tf32_register_a_split_rule() -> None:
    # A rule, once: tf32 with A read into registers (nn, nt) at 129-2048 rows plans 128x256 cooperative split over K
    # where that tile splits and its tiles reach a sixth of the SMs; not on fewer tiles, nor at 128 rows.
    for layout in ("nn", "nt"):
        p = Gemm("fp32", layout, arch=90, m=1024, n=2048, k=7168)
        assert (p.config.tile[:2], p.config.schedule, p.config.cluster, p.config.stream_k) == (
            (128, 256), "cooperative", (1, 1), True) and "128x256 cooperative by rule" in str(p)
        for m, n, k in ((512, 1024, 8192), (128, 14336, 4096)):
            assert "128x256 cooperative by rule" not in str(Gemm("fp32", layout, arch=90, m=m, n=n, k=k))


@pytest.mark.parametrize("arch", [80, 86, 89])
def test_sm80_is_the_family_below_arch_90(arch: int) -> None:
    assert Gemm(dtype="bf16", layout="tn", arch=arch).family == "sm80"


def test_default_plan_sm80() -> None:
    p = Gemm(dtype="bf16", layout="tn", arch=80)
    assert p.name == "sm80_bf16_tn_128x256x32_w2x4_s4_g8"
    assert (p.tile_shape, p.warps, p.stages, p.raster_group) == ((128, 256, 32), (2, 4), 4, 8)
    assert p.config.arch == 80


def test_defaults_are_bf16_tn() -> None:
    assert Gemm(arch=80).config == plan().config


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_default_plan_every_dtype_and_layout(dtype: str, layout: str) -> None:
    assert Gemm(dtype=dtype, layout=layout, arch=80).name == f"sm80_{dtype}_{layout}_128x256x32_w2x4_s4_g8"


def test_no_hint_plans_the_default_problem() -> None:
    m, n, k = DEFAULT_PROBLEM
    assert plan(m=m, n=n, k=k).config == plan().config


def test_torch_dtype_spellings_plan_the_same() -> None:
    torch = pytest.importorskip("torch")
    assert Gemm(dtype=torch.bfloat16, layout="tn", arch=80).config == plan(dtype="bf16").config
    assert Gemm(dtype=torch.float16, layout="tn", arch=80).config == plan(dtype="fp16").config
    assert plan(out_dtype=torch.float32).name.endswith("_ofp32")


@pytest.mark.parametrize("arch", [80, "80", "sm80", "sm_80", 8.0, "8.0"])
def test_arch_spellings(arch: object) -> None:
    assert plan(arch=arch).arch == 80


@pytest.mark.parametrize("arch", [90, "sm90", "sm_90a", "9.0"])
def test_arch_spellings_90(arch: object) -> None:
    assert plan(arch=arch).arch == 90


# -- hints ---------------------------------------------------------------------------------------


# The sm80 family's choices, at arch 80 (108 SMs) and at arch 90 with family="sm80" (132 SMs).
@pytest.mark.parametrize("arch, hints, name", [
    (80, dict(m=16, n=4096, k=4096), "sm80_bf16_tn_64x64x64_w2x2_s4_g8"),
    (90, dict(m=16, n=4096, k=4096), "sm80_bf16_tn_64x64x64_w2x2_s7_g8"),
    (90, dict(m=16), "sm80_bf16_tn_64x64x64_w2x2_s7_g8"),                 # n, k default to 4096
    (80, dict(m=1, n=1, k=1), "sm80_bf16_tn_64x64x64_w2x2_s4_g8"),
    (80, dict(m=1000, n=1000, k=1000), "sm80_bf16_tn_128x128x32_w2x4_s4_g8"),
    (90, dict(m=1000, n=1000, k=1000), "sm80_bf16_tn_64x64x64_w2x2_s7_g8"),  # 132 SMs: smaller tiles fill them
    (90, dict(m=16, n=28672, k=8192), "sm80_bf16_tn_64x128x64_w2x2_s4_g8"),
    (90, dict(m=512, n=4096, k=4096), "sm80_bf16_tn_128x128x64_w2x4_s4_g8"),
    (90, dict(m=1024, n=6144, k=4096), "sm80_bf16_tn_128x128x64_w2x4_s4_g8"),
    (90, dict(m=8192, n=8192, k=8192), "sm80_bf16_tn_128x256x32_w2x4_s3_g8"),  # long K (sm80.long_k_stages)
])
def test_hints(arch: int, hints: dict[str, int], name: str) -> None:
    assert plan(arch=arch, family="sm80", **hints).name == name
    if arch == 80:
        assert plan(arch=arch, **hints).name == name  # the default family there


@pytest.mark.parametrize("hints, name", [
    (dict(), "sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m"),
    (dict(m=4096, n=4096, k=4096), "sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m"),
    (dict(m=8192, n=8192, k=8192), "sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m"),
    (dict(m=1024, n=4096, k=4096), "sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m"),   # one full wave, 64 k tiles: 2x1
    (dict(m=2048, n=2048, k=2048), "sm90_bf16_tn_128x256x64_c1x1_s4_coop_g8m"),   # one wave, 32 k tiles: no cluster
    (dict(m=512, n=4096, k=4096), "sm90_bf16_tn_128x128x64_c2x1_s6_pp_g8m"),      # (one_wave_streams_b)
    (dict(m=128, n=4096, k=4096), "sm90_bf16_tn_128x64x64_c1x1_s8_coop_sk_g1m"),  # 64 tiles, 64 k tiles: split
    (dict(m=16, n=4096, k=4096), "sm90_bf16_tn_64x64x64_c1x1_s12_pp_g1m"),        # few rows: 64-row tiles (narrow_grid)
    (dict(m=16), "sm90_bf16_tn_64x64x64_c1x1_s12_pp_g1m"),                        # n, k default to 4096
    (dict(m=64, n=8192, k=8192), "sm90_bf16_tn_64x64x64_c1x1_s12_pp_g1m"),       # (few_rows_long_k): whole
    (dict(m=128, n=4096, k=14336), "sm90_bf16_tn_128x64x64_c1x1_s8_coop_sk_g1m"), # half the SMs idle, long K
    (dict(m=128, n=4096, k=8192), "sm90_bf16_tn_128x64x64_c1x1_s8_coop_sk_g1m"),  # 128 k tiles: split
    (dict(m=128, n=4096, k=2496), "sm90_bf16_tn_64x64x64_c1x1_s12_pp_g8m"),      # 39 k tiles: whole, two rows of 64
    (dict(m=32, n=4096, k=14336), "sm90_bf16_tn_64x64x64_c1x1_s12_pp_sk_g1m"),   # 64 tiles of 64x64: split in 2
    (dict(m=128, n=8192, k=8192), "sm90_bf16_tn_64x128x64_c2x1_s8_pp_g1m"),       # (few_rows_stream_b)
    (dict(m=128, n=8192, k=4096), "sm90_bf16_tn_128x64x64_c1x1_s8_coop_g1m"),     # 64 k tiles: not
    (dict(m=128, n=6144, k=8192), "sm90_bf16_tn_128x64x64_c1x1_s8_coop_g1m"),     # 96 tiles: not one full wave
    (dict(m=129, n=8192, k=8192), "sm90_bf16_tn_128x128x64_c2x1_s6_pp_g1m"),      # three 64-row tile rows: not
    (dict(m=64, n=2048, k=8192), "sm90_bf16_tn_64x64x64_c1x1_s12_pp_sk_g1m"),    # 32 tiles in 4 parts
    (dict(m=32, n=4096, k=4096), "sm90_bf16_tn_64x64x64_c1x1_s12_pp_g1m"),       # 64 k tiles: no split-K; 64x64
    (dict(m=1, n=1, k=1), "sm90_bf16_tn_64x64x64_c1x1_s12_pp_g1m"),            # K=1: the epilogue is all; one
    # narrow tile (narrow_grid: 64x64 pingpong where 64x128 tiles reach at most half of the SMs)
    (dict(m=8192, n=8192, k=512), "sm90_bf16_tn_128x128x64_c2x1_s6_pp_g8m"),      # short K: pingpong
    (dict(m=4097, n=4095, k=4104), "sm90_bf16_tn_128x256x64_c1x2_s4_coop_g8n"),   # 1x2 fills 4 waves exactly
])
def test_hints_sm90(hints: dict[str, int], name: str) -> None:
    assert plan(arch=90, **hints).name == name


def test_few_rows_stream_b_rule_says_so_and_yields_to_knobs() -> None:
    """64x128 pingpong 2x1 by rule (few_rows_stream_b): print(plan) says why; a fixed schedule, tile or cluster, or
    an 8-bit type (not measured), plans as before."""
    hints = dict(m=128, n=8192, k=28672)
    assert "64x128 pingpong 2x1 by rule: two tile rows, a long K and one full wave" in plan(arch=90, **hints).why
    assert plan(arch=90, schedule="cooperative", **hints).name == "sm90_bf16_tn_128x64x64_c1x1_s8_coop_g1m"
    assert plan(arch=90, cluster_shape=(1, 1), **hints).name == "sm90_bf16_tn_128x64x64_c1x1_s8_coop_g1m"
    assert plan(arch=90, tile_shape=(128, 64, 64), **hints).name.startswith("sm90_bf16_tn_128x64x64_c1x1_")
    assert "_pp_" not in Gemm("e4m3", "tn", arch=90, **hints).name


def test_few_rows_long_k_rule_says_so_and_yields_to_knobs() -> None:
    """64x64 pingpong by rule (few_rows_long_k) at most 64 rows of a long K whose 64x128 tiles reach at most half the
    SMs: split where its own tiles reach at most half of them, print(plan) says why; more rows, a wider layer, a K
    short of split-K or past the long-K split, a fixed knob or an 8-bit type plan as before."""
    ruled = plan(arch=90, m=48, n=8192, k=29568)                # 64 tiles of 64x128: half the SMs
    assert ruled.name == "sm90_bf16_tn_64x64x64_c1x1_s12_pp_g1m"
    assert "64x64 pingpong by rule: at most 64 rows and a long K" in ruled.why
    split = plan(arch=90, m=32, n=3584, k=14336)                # 56 tiles of 64x64: two parts
    assert split.name == "sm90_bf16_tn_64x64x64_c1x1_s12_pp_sk_g1m" and "in 2 parts" in split.why
    assert plan(arch=90, m=48, n=8192, k=29568, layout="tt").config.tile[:2] == (64, 64)
    for other in (dict(m=65, n=4096, k=14336),                 # two 64-row tile rows
                  dict(m=64, n=8448 + 128, k=14336),           # 68 tiles of 64x128: more than half
                  dict(m=64, n=4096, k=65536)):                # the long-K split's
        assert "64x64 pingpong by rule" not in plan(arch=90, **other).why, other
    assert "64x64 pingpong by rule" not in plan(arch=90, m=64, n=4096, k=8128).why   # 127 k tiles
    from generator.planner.backward import backward_configs
    forward = plan(arch=90, m=64, n=14336, k=4096)               # a 17-64 token bucket's up projection
    dx, _ = backward_configs(forward.config, Order.row, forward.problem)
    assert dx.name == "sm90_bf16_tt_64x64x64_c1x1_s12_pp_sk_g1m"   # dX = dY @ W: 64 x 4096 x 14336
    hints = dict(m=48, n=8192, k=29568)
    assert plan(arch=90, tile_shape=(64, 128, 64), **hints).config.tile[:2] == (64, 128)
    assert plan(arch=90, schedule="cooperative", **hints).config.schedule == "cooperative"
    assert "64x64 pingpong by rule" not in Gemm("e4m3", "tn", arch=90, **hints).why


def test_few_columns_fill_rule_says_so_and_yields() -> None:
    """129-512 columns of an M-major A (nn): the odd-width 128-row pingpong tile whose one wave fills the most SMs, raster
    m (few_columns_fill_tile), and print(plan) says why; where the best fill is a multiple of 64 wide, an fp32 D, a
    vocabulary's K, a fixed knob or a K-major A, the model plans."""
    nn = dict(layout="nn", arch=90, layout_c="col")
    ruled = plan(m=3072, n=384, k=3072, **nn)      # 24 tile rows: 5 tiles of 80 columns fill 120 SMs
    assert ruled.name == "sm90_bf16_nn_dcol_128x80x64_c1x1_s7_pp_g8m"
    assert "128x80 pingpong by rule: 384 columns of an M-major A" in ruled.why
    assert plan(m=3584, n=384, k=3584, **nn).config.tile[:2] == (128, 96)   # 112 tiles either way: no padding
    for other in (dict(m=2816, n=384, k=2048),   # 132 tiles of 128x64: a multiple of 64
                  dict(m=3072, n=384, k=65536),  # 1024 k tiles: the long-K split is the model's
                  dict(m=3072, n=640, k=3072)):  # more than 512 columns
        assert "by rule" not in plan(**other, **nn).why, other
    assert "by rule" not in plan(m=3072, n=384, k=3072, out_dtype="fp32", **nn).why
    assert "by rule" not in plan(m=3072, n=384, k=3072, schedule="cooperative", **nn).why
    assert "columns of an M-major A" not in plan(m=3072, n=384, k=3072, layout="tn", arch=90).why


def test_dx_of_a_few_hundred_tokens_is_computed_as_its_transpose() -> None:
    """dX = dY @ W of a tn forward at 129-384 tokens (planner.backward.swaps_operands) where the swapped problem takes
    the few-column rule: its request is nn with a column-major D of (in, tokens, out); other token counts, a
    column-major dD and sm80 plans keep tt."""
    from generator.planner.backward import backward_configs, gradient_requests

    def dx_request(tokens: int, n: int = 1000, k: int = 3072, order: Order = Order.row, **hints: object):
        forward = Gemm("bf16", "tn", arch=90, m=tokens, n=n, k=k, **hints)
        return gradient_requests(forward.config, order, forward.problem)[0]

    swapped = dx_request(384)
    assert swapped.layout.tag == "nn_dcol" and swapped.problem == Problem(3072, 384, 1000)
    assert dx_request(200, k=5000).layout.tag == "nn_dcol"
    for tokens in (128, 512, 1024):
        assert dx_request(tokens).layout.tag == "tt", tokens
    assert dx_request(384, k=2816).layout.tag == "tt"                     # 128x64 fills best: no swap
    assert dx_request(384, order=Order.col).layout.tag != "nn_dcol"
    sm80 = Gemm("bf16", "tn", arch=90, family="sm80", m=384, n=1000, k=3072)
    assert backward_configs(sm80.config, Order.row, sm80.problem)[0].layout.tag == "tt"


def test_sm80_long_k_takes_three_stages_on_hopper_only() -> None:
    """128x256 at 3 stages for K >= 8192 on >= 512 rows on Hopper (sm80.long_k_stages); the A100, K = 4096, fewer
    rows and a fixed stages= keep what they had."""
    long_k = dict(family="sm80", m=4096, n=8192, k=28672)
    assert plan(arch=90, **long_k).name == "sm80_bf16_tn_128x256x32_w2x4_s3_g8"
    assert plan(arch=80, **long_k).name == "sm80_bf16_tn_128x256x32_w2x4_s4_g8"
    assert plan(arch=90, **dict(long_k, k=4096)).name == "sm80_bf16_tn_128x256x32_w2x4_s4_g8"
    assert plan(arch=90, **dict(long_k, m=256)).config.stages != 3
    assert plan(arch=90, stages=4, **long_k).name == "sm80_bf16_tn_128x256x32_w2x4_s4_g8"


def test_covering_cluster_rule_says_so_and_yields_to_knobs() -> None:
    """A batch of problems one 2x1 cluster of 128x256 tiles covers (cluster_covers_each_problem): that plan, and
    print(plan) says why; one problem, a problem a 128-column tile covers, fixed knobs or 8-bit types plan as before."""
    hints = dict(m=256, n=256, k=256, batch=512)
    covered = plan(arch=90, layout="tt", **hints)
    assert covered.name == "sm90_bf16_tt_128x256x64_c2x1_s4_coop_g1m"
    assert "128x256 cooperative 2x1 by rule: one cluster covers each problem of the batch" in covered.why
    assert plan(arch=90, layout="tt", m=200, n=160, k=64, batch=512).name.startswith("sm90_bf16_tt_128x256x64_c2x1_")
    for other in (dict(hints, batch=1), dict(hints, n=128), dict(hints, m=128), dict(hints, m=384)):
        assert "by rule" not in plan(arch=90, layout="tt", **other).why
    assert plan(arch=90, layout="tt", schedule="pingpong", **hints).config.schedule == "pingpong"
    assert plan(arch=90, layout="tt", cluster_shape=(1, 1), **hints).config.cluster == (1, 1)
    assert "by rule" not in Gemm("e4m3", "tn", arch=90, **hints).why


def test_small_m_gets_a_small_tile() -> None:
    big = plan(arch=90, family="sm80").tile_shape
    small = plan(arch=90, family="sm80", m=16).tile_shape
    assert small[0] * small[1] < big[0] * big[1]
    assert small[0] == 64


@pytest.mark.parametrize("m", [16, 128])
def test_small_m_gets_a_small_tile_sm90(m: int) -> None:
    """Few rows: a tile with 64 rows, or 128x64, so that more SMs get a tile than 128x256 would give."""
    small = plan(arch=90, m=m, n=4096, k=4096).config
    assert small.tile[:2] in ((64, 64), (64, 128), (64, 256), (128, 64))
    assert small.tile[0] * small.tile[1] < 128 * 256


def test_pingpong_for_short_k_cooperative_for_long_k() -> None:
    """A cooperative tile's epilogue is not hidden behind math; with a short K it is a larger share."""
    assert plan(arch=90, m=8192, n=8192, k=512).schedule == "pingpong"
    assert plan(arch=90, m=8192, n=8192, k=8192).schedule == "cooperative"


@pytest.mark.parametrize("arch, family", [(80, None), (90, "sm80"), (90, None)])
def test_fp16_hints_match_bf16(arch: int, family: str | None) -> None:
    for m, n, k in [(16, 4096, 4096), (1000, 1000, 1000), (4096, 4096, 4096)]:
        bf = plan(arch=arch, family=family, m=m, n=n, k=k).name
        fp = plan(arch=arch, family=family, dtype="fp16", m=m, n=n, k=k).name
        assert fp == bf.replace("_bf16_", "_fp16_")


# The sm80 family's pick for every shape of benchmarks/shapes.json at arch 90 (family="sm80"), bf16,
# layout tn (generated by running the planner, then pasted: a heuristic change shows as a diff here).
PINNED_SM80_AT_90_BF16_TN = {
    (1024, 1024, 1024): 'sm80_bf16_tn_64x64x64_w2x2_s7_g8',
    (2048, 2048, 2048): 'sm80_bf16_tn_128x256x32_w2x4_s4_g8',
    (4096, 4096, 4096): 'sm80_bf16_tn_128x256x32_w2x4_s4_g8',
    (8192, 8192, 8192): 'sm80_bf16_tn_128x256x32_w2x4_s3_g8',
    (16, 4096, 4096): 'sm80_bf16_tn_64x64x64_w2x2_s7_g8',
    (16, 6144, 4096): 'sm80_bf16_tn_64x64x64_w2x2_s7_g8',
    (16, 14336, 4096): 'sm80_bf16_tn_64x64x64_w2x2_s7_g8',
    (16, 4096, 14336): 'sm80_bf16_tn_64x64x64_w2x2_s7_g8',
    (16, 28672, 8192): 'sm80_bf16_tn_64x128x64_w2x2_s4_g8',
    (16, 8192, 28672): 'sm80_bf16_tn_64x64x64_w2x2_s7_g8',
    (128, 4096, 4096): 'sm80_bf16_tn_64x64x64_w2x2_s7_g8',
    (128, 6144, 4096): 'sm80_bf16_tn_64x64x64_w2x2_s7_g8',
    (128, 14336, 4096): 'sm80_bf16_tn_128x128x64_w2x4_s4_g8',
    (128, 4096, 14336): 'sm80_bf16_tn_64x64x64_w2x2_s7_g8',
    (128, 28672, 8192): 'sm80_bf16_tn_128x256x32_w2x4_s4_g8',
    (128, 8192, 28672): 'sm80_bf16_tn_64x64x64_w2x2_s7_g8',
    (512, 4096, 4096): 'sm80_bf16_tn_128x128x64_w2x4_s4_g8',
    (512, 6144, 4096): 'sm80_bf16_tn_128x64x64_w2x2_s4_g8',
    (512, 14336, 4096): 'sm80_bf16_tn_128x256x32_w2x4_s4_g8',
    (512, 4096, 14336): 'sm80_bf16_tn_128x128x64_w2x4_s4_g8',
    (512, 28672, 8192): 'sm80_bf16_tn_128x256x32_w2x4_s3_g8',
    (512, 8192, 28672): 'sm80_bf16_tn_128x256x32_w2x4_s3_g8',
    (1024, 4096, 4096): 'sm80_bf16_tn_128x256x32_w2x4_s4_g8',
    (1024, 6144, 4096): 'sm80_bf16_tn_128x128x64_w2x4_s4_g8',
    (1024, 14336, 4096): 'sm80_bf16_tn_128x256x32_w2x4_s4_g8',
    (1024, 4096, 14336): 'sm80_bf16_tn_128x256x32_w2x4_s3_g8',
    (1024, 28672, 8192): 'sm80_bf16_tn_128x256x32_w2x4_s3_g8',
    (1024, 8192, 28672): 'sm80_bf16_tn_128x256x32_w2x4_s3_g8',
    (4096, 6144, 4096): 'sm80_bf16_tn_128x256x32_w2x4_s4_g8',
    (4096, 14336, 4096): 'sm80_bf16_tn_128x256x32_w2x4_s4_g8',
    (4096, 4096, 14336): 'sm80_bf16_tn_128x256x32_w2x4_s3_g8',
    (4096, 28672, 8192): 'sm80_bf16_tn_128x256x32_w2x4_s3_g8',
    (4096, 8192, 28672): 'sm80_bf16_tn_128x256x32_w2x4_s3_g8',
    (16384, 4096, 4096): 'sm80_bf16_tn_128x256x32_w2x4_s4_g8',
    (16384, 6144, 4096): 'sm80_bf16_tn_128x256x32_w2x4_s4_g8',
    (16384, 14336, 4096): 'sm80_bf16_tn_128x256x32_w2x4_s4_g8',
    (16384, 4096, 14336): 'sm80_bf16_tn_128x256x32_w2x4_s3_g8',
    (16384, 28672, 8192): 'sm80_bf16_tn_128x256x32_w2x4_s3_g8',
    (16384, 8192, 28672): 'sm80_bf16_tn_128x256x32_w2x4_s3_g8',
    (1000, 1000, 1000): 'sm80_bf16_tn_64x64x64_w2x2_s7_g8',
    (3000, 5000, 1000): 'sm80_bf16_tn_128x256x32_w2x4_s4_g8',
    (4097, 4095, 4104): 'sm80_bf16_tn_128x256x32_w2x4_s4_g8',
    (127, 8191, 4096): 'sm80_bf16_tn_64x64x64_w2x2_s7_g8',
}


def test_pinned_choices_for_benchmark_shapes_sm80_at_90_bf16_tn() -> None:
    assert set(benchmark_shapes()) == set(PINNED_SM80_AT_90_BF16_TN), "shapes.json changed: re-pin the dict"
    chosen = {(m, n, k): Gemm("bf16", "tn", arch=90, family="sm80", m=m, n=n, k=k).name
              for (m, n, k) in benchmark_shapes()}
    assert chosen == PINNED_SM80_AT_90_BF16_TN


# The planner's pick for every shape of benchmarks/shapes.json at arch 90 (the sm90 family), bf16, layout
# tn (generated by running the planner, then pasted: a heuristic change shows as a diff here).
PINNED_SM90_BF16_TN = {
    (1024, 1024, 1024): 'sm90_bf16_tn_64x128x64_c1x1_s8_pp_g8m',
    (2048, 2048, 2048): 'sm90_bf16_tn_128x256x64_c1x1_s4_coop_g8m',
    (4096, 4096, 4096): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (8192, 8192, 8192): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (16, 4096, 4096): 'sm90_bf16_tn_64x64x64_c1x1_s12_pp_g1m',
    (16, 6144, 4096): 'sm90_bf16_tn_64x64x64_c1x1_s12_pp_g1m',
    (16, 14336, 4096): 'sm90_bf16_tn_64x128x64_c1x1_s8_pp_g1m',
    (16, 4096, 14336): 'sm90_bf16_tn_64x64x64_c1x1_s12_pp_sk_g1m',
    (16, 28672, 8192): 'sm90_bf16_tn_64x256x64_c1x1_s4_pp_g1m',
    (16, 8192, 28672): 'sm90_bf16_tn_64x64x64_c1x1_s12_pp_g1m',
    (128, 4096, 4096): 'sm90_bf16_tn_128x64x64_c1x1_s8_coop_sk_g1m',
    (128, 6144, 4096): 'sm90_bf16_tn_128x64x64_c1x1_s8_coop_g1m',
    (128, 14336, 4096): 'sm90_bf16_tn_128x128x64_c1x1_s6_pp_g1m',
    (128, 4096, 14336): 'sm90_bf16_tn_128x64x64_c1x1_s8_coop_sk_g1m',
    (128, 28672, 8192): 'sm90_bf16_tn_128x256x64_c1x1_s4_coop_g1m',
    (128, 8192, 28672): 'sm90_bf16_tn_64x128x64_c2x1_s8_pp_g1m',
    (512, 4096, 4096): 'sm90_bf16_tn_128x128x64_c2x1_s6_pp_g8m',
    (512, 6144, 4096): 'sm90_bf16_tn_128x192x64_c2x1_s4_coop_g8m',
    (512, 14336, 4096): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (512, 4096, 14336): 'sm90_bf16_tn_128x128x64_c2x1_s6_pp_g8m',
    (512, 28672, 8192): 'sm90_bf16_tn_128x128x64_c2x1_s6_pp_g8m',
    (512, 8192, 28672): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (1024, 4096, 4096): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (1024, 6144, 4096): 'sm90_bf16_tn_128x192x64_c2x1_s4_coop_g8m',
    (1024, 14336, 4096): 'sm90_bf16_tn_128x128x64_c2x1_s6_pp_g8m',
    (1024, 4096, 14336): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (1024, 28672, 8192): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (1024, 8192, 28672): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (4096, 6144, 4096): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (4096, 14336, 4096): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (4096, 4096, 14336): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (4096, 28672, 8192): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (4096, 8192, 28672): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (16384, 4096, 4096): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (16384, 6144, 4096): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (16384, 14336, 4096): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (16384, 4096, 14336): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (16384, 28672, 8192): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (16384, 8192, 28672): 'sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m',
    (1000, 1000, 1000): 'sm90_bf16_tn_64x128x64_c1x1_s8_pp_g8m',
    (3000, 5000, 1000): 'sm90_bf16_tn_128x192x64_c2x1_s4_coop_g8m',
    (4097, 4095, 4104): 'sm90_bf16_tn_128x256x64_c1x2_s4_coop_g8n',
    (127, 8191, 4096): 'sm90_bf16_tn_128x64x64_c1x1_s8_coop_g1m',
}


def test_pinned_choices_for_benchmark_shapes_sm90_bf16_tn() -> None:
    assert set(benchmark_shapes()) == set(PINNED_SM90_BF16_TN), "shapes.json changed: re-pin the dict"
    chosen = {(m, n, k): Gemm("bf16", "tn", arch=90, m=m, n=n, k=k).name for (m, n, k) in benchmark_shapes()}
    assert chosen == PINNED_SM90_BF16_TN


def test_choose_directly() -> None:
    spec = arch_spec(80)
    best, rejected = choose(DType.bf16, DType.bf16, parse_layout("tn"), spec, problem=Problem(16, 4096, 4096))
    assert best.config.name == "sm80_bf16_tn_64x64x64_w2x2_s4_g8"
    assert rejected == []
    assert best.cost > 0
    assert "tiles of 64x64" in best.reason


def test_planner_drops_illegal_candidates_with_reasons() -> None:
    """warps=(8, 1) fits some tiles and not others: the others are listed with their reason."""
    p = plan(warps=(8, 1))
    assert p.warps == (8, 1)
    check_config(p.config)
    assert p.rejected, "64x64 cannot take 8x1 warps, so something must have been dropped"
    assert any("sm80_bf16_tn_64x64x64_w8x1" in line and "warp tile" in line for line in p.rejected)


def test_planned_stages_fit_shared_memory() -> None:
    for arch in (80, 86, 89, 90):
        for m in (16, 1000, 4096):
            cfg = plan(arch=arch, family="sm80", m=m).config
            check_config(cfg)
            assert 3 <= cfg.stages <= max_stages_that_fit(cfg.tile, cfg.dtype, ARCHS[arch])


def test_planned_stages_sm90_are_as_many_as_fit() -> None:
    for m in (16, 128, 1000, 4096):
        cfg = plan(arch=90, m=m).config
        check_config(cfg)
        assert 2 <= cfg.stages == sm90_max_stages_that_fit(cfg) <= SM90_MAX_STAGES
        assert cfg.smem_bytes <= ARCHS[90].smem_per_block < sm90_smem_bytes(replace(cfg, stages=cfg.stages + 1)) \
            or cfg.stages == 8
    assert plan(arch=90, tile_shape=(128, 256, 64)).stages == 4      # 4 x 48 KB + 32 KB epilogue + 1 KB
    assert plan(arch=90, tile_shape=(128, 128, 64)).stages == 6
    assert plan(arch=90, tile_shape=(64, 128, 64)).stages == 8       # 9 would fit: 8 is the most


# -- print(plan) -----------------------------------------------------------------------------------


def test_print_plan(capsys: pytest.CaptureFixture[str]) -> None:
    p = plan(arch=90, family="sm80")
    print(p)
    out = capsys.readouterr().out
    assert f"name:         {p.name}\n" in out
    assert "name: " in out
    assert "why:" in out
    assert p.why in out
    for key in ("tile:", "warps:", "stages:", "raster_group:", "layout:", "dtype:", "arch:"):
        assert key in out
    assert "128x256x32" in out
    assert "98304 bytes of shared memory" in out
    assert repr(p) == "Gemm(sm80_bf16_tn_128x256x32_w2x4_s4_g8)"


def test_why_explains_the_estimate() -> None:
    why = plan(arch=90, family="sm80").why
    assert why == ("512 tiles of 128x256 in 4 wave(s) over 132 SMs x 1 block(s) (last wave 88% full), "
                   "efficiency 1.00; 4 stages use 98304 of 232448 bytes of shared memory")


SM90_DEFAULT_TEXT = """\
name:         sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m
family:       sm90 (TMA, mbarrier pipeline, wgmma m64nNk16, warp-specialized, fp32 accumulate)
arch:         sm_90
dtype:        bf16 -> bf16
layout:       tn (A row-major, B col-major, D row-major)
tile:         128x256x64
other paths:  M <= 16: the small-M kernel (streams B once from HBM: D^T = B^T A^T on mma.sync, K split between warps)
              A or B not 16-byte aligned (base or leading dimension): copied into an aligned workspace (its
              rows padded to 16 bytes) when M*N*K >= 2^26, else the unaligned kernel
batched:      3-D A or B (batch, ., .): every problem in one launch
              a 2-D B with A's matrices back to back (no per-row operand): one batch*M-row problem
schedule:     cooperative (persistent: two consumer warpgroups split each tile along M, 64x256 each)
cluster:      2x1 (2 blocks along M share each B tile: TMA multicasts B to both)
stages:       4 (230400 bytes of shared memory: 4 x 49152 operand tiles + 32768 epilogue + 1024 barriers and \
alignment)
raster:       m, group 8 (bands of 8 rows of 2x1 clusters, each walked down M then along N: Triton's GROUP_M order)
threads:      384 (1 producer warpgroup + 2 consumer warpgroups)
launch:       blocks start under the stream's previous kernel, touching memory once it has ended; the next GEMM may start once this one's loads are issued (programmatic dependent launch)
gpu:          H100 SXM (typical of sm_90; arch=None plans for the visible GPU): 132 SMs, 80 GB of HBM at 3.35 TB/s
why:          512 tiles of 128x256 in 4 wave(s) over 132 SMs (last wave 88% full), cooperative (persistent); \
cluster 2x1 multicasts B (0.67x the L2->SM bytes of no cluster); efficiency 0.75; 4 stages use 230400 of 232448 \
bytes of shared memory
tuned:        no, estimated (no measured winner for this problem on this GPU; plan.tune() measures)"""


def test_api_docs_show_the_current_sm90_plan() -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    heading = "With `arch=90` (on an H100 or H200, `arch=None` gives the same plan, its `gpu:` line naming that GPU):"
    block = page.split(f"{heading}\n\n```text\n")[1].split("```")[0]
    assert block == SM90_DEFAULT_TEXT + "\n", "docs/api.md's print(plan) example is out of date"


def test_print_plan_sm90(capsys: pytest.CaptureFixture[str]) -> None:
    p = plan(arch=90)
    print(p)
    assert capsys.readouterr().out == SM90_DEFAULT_TEXT + "\n"
    assert repr(p) == "Gemm(sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m)"
    assert p.why == SM90_DEFAULT_TEXT.split("why:          ")[1].split("\ntuned:")[0]


@pytest.mark.parametrize("knobs, lines", [
    (dict(schedule="pingpong", tile_shape=(128, 128, 64), cluster_shape=(1, 2), raster="n"), [
        "schedule:     pingpong (persistent: the two consumer warpgroups take alternate tiles, 128x128 each, one's "
        "epilogue overlapping the other's math)",
        "cluster:      1x2 (2 blocks along N share each A tile: TMA multicasts A to both)",
        "stages:       6 (230400 bytes of shared memory: 6 x 32768 operand tiles + 32768 epilogue + 1024 barriers "
        "and alignment)",
        "raster:       n, group 8 (bands of 8 columns of 1x2 clusters, each walked along N then down M)",
    ]),
    (dict(schedule="ws", tile_shape=(256, 128, 64), cluster_shape=(1, 1), raster="m", raster_group=1), [
        "schedule:     ws (one tile per block: two consumer warpgroups split it along M, 128x128 each)",
        "cluster:      1x1 (no cluster: each block loads its own A and B tiles)",
        "raster:       m, group 1 (one tile row at a time, along N)",
    ]),
    (dict(cluster_shape=(2, 2)), [
        "cluster:      2x2 (2 blocks along M share each B tile, 2 along N each A tile: TMA multicasts each operand "
        "to the blocks that share it)",
        "raster:       m, group 8 (bands of 8 rows of 2x2 clusters, each walked down M then along N: Triton's GROUP_M "
        "order)",
    ]),
    (dict(cluster_shape=(4, 1), raster="m"), [
        "cluster:      4x1 (4 blocks along M share each B tile: TMA multicasts B to all 4)",
    ]),
])
def test_describe_sm90_knobs(knobs: dict[str, object], lines: list[str]) -> None:
    text = describe(plan(arch=90, **knobs).config)
    for line in lines:
        assert line in text.splitlines()


def test_describe_says_which_grids_take_tiles_in_sm_order() -> None:
    """A 1x1 persistent plan says its grid runs a block per SM in the SMs' order (sm90/block_order.cuh); clustered,
    ws and stream-K plans keep the launch order and do not say it."""
    said = "tiles taken in the order of the SMs' indices"
    for knobs in (dict(schedule="pingpong", tile_shape=(128, 128, 64), cluster_shape=(1, 1)),
                  dict(schedule="cooperative", tile_shape=(128, 256, 64), cluster_shape=(1, 1))):
        assert said in describe(plan(arch=90, **knobs).config), knobs
    for knobs in (dict(schedule="cooperative", tile_shape=(128, 256, 64), cluster_shape=(2, 1)),
                  dict(schedule="ws", tile_shape=(128, 128, 64), cluster_shape=(1, 1))):
        assert said not in describe(plan(arch=90, **knobs).config), knobs
    split = replace(plan(arch=90, schedule="pingpong", tile_shape=(64, 128, 64), cluster_shape=(1, 1)).config,
                    stream_k=True)
    assert said not in describe(split)


def test_describe_says_how_the_launch_overlaps_the_previous_kernel() -> None:
    """Every sm90 plan says its blocks start under the previous kernel (sm90/launch.cuh); a grid taken in the SMs'
    order says it launches in stream order."""
    clustered = describe(plan(arch=90, schedule="cooperative", tile_shape=(128, 256, 64), cluster_shape=(2, 1)).config)
    ordered = describe(plan(arch=90, schedule="pingpong", tile_shape=(128, 128, 64), cluster_shape=(1, 1)).config)
    assert "start under the stream's previous kernel" in clustered and "in stream order" not in clustered
    assert "in stream order" in ordered


# -- KernelConfig ---------------------------------------------------------------------------------


def test_config_is_frozen_hashable_and_named() -> None:
    cfg = plan().config
    assert hash(cfg) == hash(plan().config)
    assert {cfg, plan().config} == {cfg}
    with pytest.raises(AttributeError):
        cfg.stages = 3  # type: ignore[misc]
    assert cfg.threads == 256
    assert cfg.warp_tile == (64, 64)
    assert cfg.stage_bytes == (128 + 256) * 32 * 2
    assert cfg.smem_bytes == 4 * cfg.stage_bytes == 98304


def test_name_spells_out_dtype_and_d_layout() -> None:
    assert plan(out_dtype="fp32").name == "sm80_bf16_tn_128x256x32_w2x4_s4_g8_ofp32"
    assert plan(out_dtype="bf16").name == "sm80_bf16_tn_128x256x32_w2x4_s4_g8"
    assert plan(dtype="fp16", out_dtype="bf16").name == "sm80_fp16_tn_128x256x32_w2x4_s4_g8_obf16"
    assert plan(layout_c="col").name == "sm80_bf16_tn_dcol_128x256x32_w2x4_s4_g8"
    assert plan(layout="tn", layout_a="col").name == "sm80_bf16_nn_128x256x32_w2x4_s4_g8"
    assert plan(layout_c="col").layout.c is Order.col


# -- overrides that work --------------------------------------------------------------------------


def test_overrides_are_honoured() -> None:
    p = plan()
    p.stages = 3
    assert p.stages == 3 and p.name == "sm80_bf16_tn_128x256x32_w2x4_s3_g8"
    p.tile_shape = (128, 128, 64)
    assert p.name == "sm80_bf16_tn_128x128x64_w2x4_s3_g8"
    p.tile_shape = "128x256x64"
    assert p.tile_shape == (128, 256, 64)
    p.warps = (4, 2)
    p.raster_group = 4
    assert p.name == "sm80_bf16_tn_128x256x64_w4x2_s3_g4"
    p.out_dtype = "fp32"
    assert p.name == "sm80_bf16_tn_128x256x64_w4x2_s3_g4_ofp32"


def test_constructor_knobs_equal_assignments() -> None:
    a = plan(tile_shape=(128, 128, 32), warps=(2, 2), stages=3, raster_group=2)
    b = plan()
    b.tile_shape = (128, 128, 32)
    b.warps = (2, 2)
    b.stages = 3
    b.raster_group = 2
    assert a.config == b.config
    assert a.name == "sm80_bf16_tn_128x128x32_w2x2_s3_g2"


def test_fixed_tile_keeps_the_hint_from_changing_it() -> None:
    assert plan(m=16, tile_shape=(128, 256, 32)).tile_shape == (128, 256, 32)


# -- refusals: the sentence, and the plan unchanged -------------------------------------------------

SMEM_SENTENCE = ("stages=6 with tile 128x256x64 bf16 needs 294912 bytes of shared memory; sm80 allows 166912: "
                 "use stages<=3 or tile 128x128x64")

# (what to set up first, knob, value, exact message)
REFUSED_ASSIGNMENTS = [
    pytest.param({}, "tile_shape", (96, 128, 32),
                 "tile 96x128x32 is not one the sm80 template builds: BM in (64, 128, 256), BN in (64, 128, 256), "
                 "BK in (32, 64) (e.g. 128x128x32 or 128x256x64)", id="tile-not-allowed"),
    pytest.param({}, "tile_shape", (128, 128, 16),
                 "tile 128x128x16 is not one the sm80 template builds: BM in (64, 128, 256), BN in (64, 128, 256), "
                 "BK in (32, 64) (e.g. 128x128x32 or 128x256x64)", id="tile-bk-not-allowed"),
    pytest.param({"tile_shape": (128, 128, 32)}, "warps", (3, 1),
                 "warps 3x1 cannot split tile 128x128: use 4 or 8 warps that divide it, e.g. warps=(2, 2) for "
                 "128x128 or (2, 4) for 128x256", id="warps-count"),
    pytest.param({"tile_shape": (128, 128, 32)}, "warps", (4, 4),
                 "warps 4x4 cannot split tile 128x128: use 4 or 8 warps that divide it, e.g. warps=(2, 2) for "
                 "128x128 or (2, 4) for 128x256", id="warps-too-many"),
    pytest.param({"tile_shape": (64, 64, 32)}, "warps", (8, 1),
                 "warps 8x1 give a 8x64 warp tile for tile 64x64; each warp needs a multiple of 16 rows and 16 "
                 "columns: use fewer warps along the short side", id="warp-tile-not-mma-multiple"),
    pytest.param({"tile_shape": (64, 64, 32)}, "warps", (1, 8),
                 "warps 1x8 give a 64x8 warp tile for tile 64x64; each warp needs a multiple of 16 rows and 16 "
                 "columns: use fewer warps along the short side", id="warp-tile-narrow"),
    pytest.param({"tile_shape": (128, 256, 32)}, "warps", (2, 2),
                 "warps 2x2 give a 64x128 warp tile for tile 128x256, which needs 256 accumulator registers per "
                 "thread; at most 64x64 fits: use more warps (e.g. warps=(2, 4) if that is 4 or 8) or a smaller "
                 "tile", id="warp-tile-too-large"),
    pytest.param({"tile_shape": (128, 256, 64)}, "stages", 1,
                 "stages=1: the multistage pipeline takes 2 to 8 stages", id="stages-too-few"),
    pytest.param({"tile_shape": (64, 64, 32)}, "stages", 9,
                 "stages=9: the multistage pipeline takes 2 to 8 stages", id="stages-too-many"),
    pytest.param({"tile_shape": (128, 256, 64)}, "stages", 6, SMEM_SENTENCE, id="smem-overflow"),
    pytest.param({"stages": 6}, "tile_shape", (128, 256, 64), SMEM_SENTENCE, id="smem-overflow-via-tile"),
    pytest.param({"tile_shape": (256, 128, 64), "stages": 3}, "stages", 4,
                 "stages=4 with tile 256x128x64 bf16 needs 196608 bytes of shared memory; sm80 allows 166912: "
                 "use stages<=3 or tile 128x128x64", id="smem-overflow-tall"),
    pytest.param({"tile_shape": (128, 128, 32)}, "raster_group", 3,
                 "raster_group=3: use one of (1, 2, 4, 8, 16)", id="raster-group"),
    pytest.param({}, "raster_group", "8", "raster_group='8': give an integer, e.g. raster_group=8",
                 id="raster-group-type"),
    pytest.param({}, "stages", "4", "stages='4': give an integer, e.g. stages=4", id="stages-type"),
    pytest.param({}, "stages", True, "stages=True: give an integer, e.g. stages=4", id="stages-bool"),
    pytest.param({}, "tile_shape", (128, 128),
                 "tile_shape=(128, 128): give 3 positive integers, e.g. tile_shape=(128, 128, 32)",
                 id="tile-shape-length"),
    pytest.param({}, "tile_shape", None,
                 "tile_shape=None: give 3 positive integers, e.g. tile_shape=(128, 128, 32)", id="tile-shape-none"),
    pytest.param({}, "warps", (0, 4), "warps=(0, 4): give 2 positive integers, e.g. warps=(2, 2)",
                 id="warps-zero"),
    pytest.param({}, "out_dtype", "int8",
                 "out_dtype='int8' is not supported here; supported: 'fp16', 'bf16', 'fp32', 'int32', 'e4m3', 'e5m2'",
                 id="out-dtype"),
]


@pytest.mark.parametrize("setup, knob, value, message", REFUSED_ASSIGNMENTS)
def test_refused_assignment(setup: dict[str, object], knob: str, value: object, message: str) -> None:
    p = plan(**setup)
    before = snapshot(p)
    with pytest.raises(ValueError) as err:
        setattr(p, knob, value)
    assert str(err.value) == message
    assert snapshot(p) == before
    # The refused value is forgotten: a later valid override does not resurrect it.
    p.raster_group = 4 if p.raster_group != 4 else 2
    assert getattr(p, knob) != value
    check_config(p.config)


def test_issue_example_smem_sentence() -> None:
    p = Gemm(dtype="bf16", layout="tn", arch=80, tile_shape=(128, 256, 64))
    before = snapshot(p)
    assert p.name == "sm80_bf16_tn_128x256x64_w2x4_s3_g8"
    with pytest.raises(ValueError, match="^" + SMEM_SENTENCE.replace("(", r"\(") + "$"):
        p.stages = 6
    assert snapshot(p) == before
    assert p.stages == 3


def test_smem_sentence_sm80_family_at_arch_90() -> None:
    p = Gemm(dtype="fp16", layout="nt", arch=90, family="sm80", tile_shape=(128, 256, 64))
    assert p.stages == 4
    with pytest.raises(ValueError) as err:
        p.stages = 5
    assert str(err.value) == ("stages=5 with tile 128x256x64 fp16 needs 245760 bytes of shared memory; "
                              "sm90 allows 232448: use stages<=4 or tile 128x128x64")
    assert p.stages == 4


def test_refused_constructor_knob() -> None:
    with pytest.raises(ValueError, match="^" + SMEM_SENTENCE.replace("(", r"\(") + "$"):
        Gemm(dtype="bf16", layout="tn", arch=80, tile_shape=(128, 256, 64), stages=6)


@pytest.mark.parametrize("knob, value, message", [
    ("stages", 1, "stages=1: the multistage pipeline takes 2 to 8 stages"),
    ("stages", 9, "stages=9: the multistage pipeline takes 2 to 8 stages"),
    ("raster_group", 3, "raster_group=3: use one of (1, 2, 4, 8, 16)"),
])
def test_refused_with_free_tile_says_it_once(knob: str, value: object, message: str) -> None:
    """With the tile left to the planner, a knob that fails the same way for every tile is refused with
    that one sentence, not once per candidate."""
    p = plan()
    before = snapshot(p)
    with pytest.raises(ValueError) as err:
        setattr(p, knob, value)
    assert str(err.value) == message
    assert snapshot(p) == before


def test_refused_with_free_tile_lists_every_candidate() -> None:
    """Reasons that differ per tile are listed, one line per candidate."""
    p = plan()
    before = snapshot(p)
    with pytest.raises(ValueError) as err:
        p.warps = (3, 1)
    lines = str(err.value).splitlines()
    assert lines[0] == "no config is legal for these knobs:"
    tiles = ("128x256x32", "256x128x32", "128x128x32", "128x64x64", "64x128x64", "64x64x64")
    assert len(lines) == 1 + len(tiles)
    for line, tile in zip(lines[1:], tiles):
        block = tile.rsplit("x", 1)[0]
        assert line == (f"  sm80_bf16_tn_{tile}_w3x1_s4_g8: warps 3x1 cannot split tile {block}: use 4 or 8 warps "
                        "that divide it, e.g. warps=(2, 2) for 128x128 or (2, 4) for 128x256")
    assert snapshot(p) == before


def test_256x256_tile_is_refused() -> None:
    """256x256 passes the per-dimension check, but no 4- or 8-warp grid holds its accumulators."""
    p = plan()
    before = snapshot(p)
    with pytest.raises(ValueError, match="the largest tiles are 128x256 and 256x128"):
        p.tile_shape = (256, 256, 32)
    assert snapshot(p) == before


def test_chunk_count_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unreachable with today's 4/8-warp table (256 threads always divide the chunk count); allow 16 warps
    to reach it and check the sentence."""
    monkeypatch.setattr(config_module, "SM80_WARP_COUNTS", (4, 8, 16))
    cfg = KernelConfig(arch=80, dtype=DType.bf16, out_dtype=DType.bf16, layout=parse_layout("tn"),
                       tile=(64, 64, 32), warps=(4, 4), stages=3, raster_group=8)
    with pytest.raises(ValueError) as err:
        check_config(cfg)
    assert str(err.value) == ("tile 64x64x32 with 512 threads: the smaller operand tile has 256 16-byte chunks, "
                              "not a multiple of the thread count; use 4 warps or a larger tile")


def test_out_dtype_refusal_in_check_config() -> None:
    """check_config's last line of defence: an out_dtype outside fp16/bf16/fp32 (Gemm's parser refuses
    it earlier, so build the config by hand)."""
    fake = SimpleNamespace(value="int8")
    cfg = KernelConfig(arch=80, dtype=DType.bf16, out_dtype=fake, layout=parse_layout("tn"),  # type: ignore[arg-type]
                       tile=(128, 128, 32), warps=(2, 2), stages=3, raster_group=8)
    with pytest.raises(ValueError) as err:
        check_config(cfg)
    assert str(err.value) == ("out_dtype=int8: use fp16, bf16 or fp32 (int32: int8 inputs; e4m3, e5m2: quantized with "
                              "per-block scales)")


def test_out_dtype_refused_assignment_keeps_plan() -> None:
    p = plan(out_dtype="fp32")
    before = snapshot(p)
    with pytest.raises(ValueError, match="out_dtype='fp64'"):
        p.out_dtype = "fp64"
    assert snapshot(p) == before
    assert p.out_dtype is DType.fp32


# -- refusals at construction ---------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    pytest.param(dict(dtype="int4"), "dtype='int4' is not a data type this generator knows; use one of 'fp16', "
                 "'bf16', 'tf32', 'e4m3', 'e5m2', 'int8', 'fp32' (or the matching torch dtype)", id="dtype"),
    pytest.param(dict(dtype="int8", layout="nt", arch=80), "dtype='int8' needs A and B K-major (layout 'tn': A "
                 "row-major, B column-major, i.e. x @ W.t() of row-major x and W), as torch._int_mm does; this plan is "
                 "layout 'nt': pass A.contiguous() and B.t().contiguous().t() and plan with layout='tn'",
                 id="int8-not-k-major"),
    pytest.param(dict(dtype="tf32", layout="tn", arch=80, tile_shape=(128, 256, 32), stages=5),
                 "stages=5 with tile 128x256x32 tf32 needs 245760 bytes of shared memory; sm80 allows 166912: use "
                 "stages<=3 or tile 128x128x32", id="tf32-sm80-smem"),
    pytest.param(dict(dtype="tf32", layout="nt", arch=80, tile_shape=(128, 256, 64)),
                 "tile 128x256x64 is not one the sm80 template builds: BM in (64, 128, 256), BN in (64, 128, 256), "
                 "BK in (16, 32) for tf32 (e.g. 128x128x16 or 128x256x32)", id="tf32-sm80-bk"),
    pytest.param(dict(out_dtype="int8"), "out_dtype='int8' is not supported here; supported: 'fp16', 'bf16', "
                 "'fp32', 'int32', 'e4m3', 'e5m2'", id="out-dtype"),
    pytest.param(dict(arch=70), "arch=70 is not an architecture this generator targets; use one of 80, 86, 89, 90",
                 id="arch"),
    pytest.param(dict(arch="sm_100a"), "arch='sm_100a' is not an architecture this generator targets; use one of "
                 "80, 86, 89, 90", id="arch-string"),
    pytest.param(dict(arch="hopper"), "arch='hopper' is not an architecture this generator targets; use one of "
                 "80, 86, 89, 90", id="arch-word"),
    pytest.param(dict(namespace="my-ns"), "namespace='my-ns' must be a Python identifier, e.g. 'gemmgen'",
                 id="namespace"),
    pytest.param(dict(namespace=""), "namespace='' must be a Python identifier, e.g. 'gemmgen'", id="namespace-empty"),
    pytest.param(dict(m=0), "m=0: give a positive integer problem size, or leave it out", id="m-zero"),
    pytest.param(dict(m=-5), "m=-5: give a positive integer problem size, or leave it out", id="m-negative"),
    pytest.param(dict(n=1.5), "n=1.5: give a positive integer problem size, or leave it out", id="n-float"),
    pytest.param(dict(k=True), "k=True: give a positive integer problem size, or leave it out", id="k-bool"),
    pytest.param(dict(m="16"), "m='16': give a positive integer problem size, or leave it out", id="m-string"),
    pytest.param(dict(layout="xy"), "layout='xy' is not one of 'nn', 'nt', 'tn', 'tt' (first letter A, second B; "
                 "'t' = row-major, 'n' = column-major)", id="layout"),
    pytest.param(dict(layout_b="diag"), "layout_b='diag' is not a storage order; use 'row' or 'col'",
                 id="layout-b"),
])
def test_refused_construction(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as err:
        plan(**kwargs)
    assert str(err.value) == message


def test_arch_none_without_gpu_says_what_to_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # Make `import torch` fail, so the test means the same with or without a GPU.
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(RuntimeError) as err:
        Gemm(dtype="bf16", layout="tn")
    msg = str(err.value)
    assert "torch is not installed" in msg
    assert "pass arch=80 (Ampere) or arch=90 (Hopper)" in msg


def test_arch_none_with_torch_but_no_gpu() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: arch=None plans for it")
    with pytest.raises(RuntimeError) as err:
        Gemm(dtype="bf16", layout="tn")
    assert str(err.value) == ("arch=None asks for the GPU's architecture, but no CUDA GPU is visible: pass arch=80 "
                              "(Ampere) or arch=90 (Hopper) to plan for a GPU this machine does not have")


def test_knobs_default() -> None:
    assert Knobs() == Knobs(tile=None, warps=None, stages=None, raster_group=None)


# -- the sm90 family: knobs, refusals, the raster walk -----------------------------------------------

SM90_SMEM_SENTENCE = ("stages=5 with tile 128x256x64 bf16 needs 279552 bytes of shared memory (5 x 49152 operand "
                      "tiles + 32768 epilogue + 1024 barriers and alignment); sm90 allows 232448: use stages<=4 or "
                      "tile 128x128x64")
SM90_BAD_TILE = ("tile {} is not one the sm90 template builds: BM in (64, 128, 192, 256) (64 with schedule "
                 "'pingpong' or a cooperative split along N, 192 a cooperative split along N, 256 with 'cooperative' or "
                 "'ws' only), BN in (64, 128, 192, 256, 320) "
                 "or, for 16-bit and fp8 inputs with a K-major B, (80, 96, 112, 144, 160, 176, 208, 224, 240), or for "
                 "16-bit inputs with a K-major B (16, 32, 48), BK = 64 (e.g. 128x256x64 or 128x128x64)")
SM90_ONLY = "{}= is a knob of the sm90 family (Hopper, arch=90); this plan is sm80: plan with arch=90"

# (plan keyword arguments, knob, value, exact message)
REFUSED_SM90_ASSIGNMENTS = [
    pytest.param(dict(arch=80), "family", "sm90",
                 "arch=80: the sm90 family uses wgmma and TMA, which exist only on sm_90a: plan with arch=90, "
                 "or family='sm80'", id="family-sm90-at-arch-80"),
    pytest.param(dict(arch=90), "family", "sm70",
                 "family='sm70': use 'sm80' (cp.async + mma.sync, arch 80 and newer), 'sm90' (TMA + wgmma, arch 90) "
                 "or None (the architecture's default)", id="family-unknown"),
    pytest.param(dict(arch=90), "tile_shape", (128, 128, 32),
                 "tile 128x128x32: the sm90 family needs BK=64 for bf16 (one 128-byte swizzle row of k values): use "
                 "tile 128x128x64", id="bk"),
    pytest.param(dict(arch=90), "tile_shape", (96, 128, 64), SM90_BAD_TILE.format("96x128x64"), id="bm"),
    pytest.param(dict(arch=90), "tile_shape", (128, 72, 64), SM90_BAD_TILE.format("128x72x64"), id="bn"),
    pytest.param(dict(arch=90, layout="tt"), "tile_shape", (128, 96, 64),
                 "tile 128x96x64 with layout 'tt': B is N-major here and loads in 64-column chunks, so BN must be a "
                 "multiple of 64 (one of (64, 128, 192, 256, 320)); BN=96 needs a K-major B (layout 'tn')",
                 id="bn-odd-n-major-b"),
    pytest.param(dict(dtype="int8", arch=90), "tile_shape", (128, 96, 128),
                 "tile 128x96x128: N tiles that are no multiple of 64 are built for bf16, fp16 and fp8 inputs; int8 "
                 "takes BN in (64, 128, 192, 256, 320)", id="bn-odd-int8"),
    pytest.param(dict(dtype="e4m3", arch=90, cluster_shape=(1, 1), schedule="cooperative"), "tile_shape",
                 (128, 208, 128),
                 "tile 128x208x128: promoted fp8 sums each k tile in 2 column slices of 104, a width no wgmma wrapper "
                 "is built for: use BN in (80, 96, 112, 144, 160, 176, 224) or a multiple of 64",
                 id="bn-odd-fp8-promote-slice"),
    pytest.param(dict(dtype="e4m3", arch=90, scale="block", cluster_shape=(1, 1), schedule="cooperative"),
                 "tile_shape", (128, 176, 128),
                 "tile 128x176x128 with scale='block': a tile starting at a multiple of 176 can reach into three "
                 "128-column scale blocks of B, and the kernel reads two per tile: use BN in (80, 96, 112, 144, 160) "
                 "or a multiple of 64", id="bn-odd-fp8-three-scale-blocks"),
    pytest.param(dict(dtype="e4m3", arch=90, scale="row", cluster_shape=(2, 1), schedule="pingpong"), "tile_shape",
                 (64, 224, 128),
                 "tile 64x224x128 pingpong with scale='row': the promoted kernel spills registers at this width "
                 "(ptxas: 8 bytes); use BN in (80, 96, 112, 144, 160, 176), a multiple of 64, or scale='tensor'",
                 id="bn-odd-fp8-rowwise-spills"),
    pytest.param(dict(arch=90, layout="tt", schedule="pingpong"), "tile_shape", (64, 32, 64),
                 "tile 64x32x64 with layout 'tt': B is N-major here and loads in 64-column chunks, so BN must be a "
                 "multiple of 64; BN=32 needs a K-major B (layout 'tn')", id="bn-narrow-n-major-b"),
    pytest.param(dict(dtype="e4m3", arch=90, schedule="pingpong"), "tile_shape", (64, 32, 128),
                 "tile 64x32x128: N tiles under 64 are built for bf16 and fp16 inputs; e4m3 takes BN in (64, 128, 192, "
                 "256, 320)", id="bn-narrow-fp8"),
    pytest.param(dict(arch=90, out_dtype="e4m3", schedule="pingpong"), "tile_shape", (64, 32, 64),
                 "tile 64x32x64: a quantized D is written in 128-column blocks; use BN >= 128", id="bn-narrow-quantized-d"),
    pytest.param(dict(arch=90, schedule="ws"), "tile_shape", (128, 32, 64),
                 "tile 128x32x64 with schedule 'ws': N tiles under 64 are built and tested for the pingpong and "
                 "cooperative schedules: use one of those, or BN >= 64", id="bn-narrow-ws"),
    pytest.param(dict(arch=90, schedule="pingpong", cluster_shape=(4, 1)), "tile_shape", (64, 16, 64),
                 "tile 64x16x64 with cluster 4x1: each block of a cluster column loads 4 rows of B, fewer than a "
                 "swizzle atom's 8: use cluster (1, 1) or a wider tile", id="bn-narrow-cluster-rows"),
    pytest.param(dict(arch=90), "tile_shape", (256, 256, 64),
                 "tile 256x256x64 needs more accumulator registers than two consumer warpgroups have (256 per "
                 "thread, at most 160): the largest sm90 tiles are 128x320, 128x256 and 256x128", id="tile-too-large"),
    pytest.param(dict(arch=90, cluster_shape=(1, 1), schedule="cooperative"), "tile_shape", (128, 320, 64),
                 "tile 128x320x64 with cluster 1x1: a K-major B tile is loaded in 1 slice(s) of 320 rows, and a TMA "
                 "box holds at most 256: use cluster (2, 1) (two blocks each load half of B) or a tile with "
                 "BN <= 256", id="tma-box-rows"),
    pytest.param(dict(arch=90, schedule="pingpong"), "tile_shape", (64, 320, 64),
                 "tile 64x320x64 with schedule 'pingpong': BN=320 (two wgmmas per k step) is built and tested for "
                 "schedule='cooperative' only: use it, or BN <= 256", id="wide-bn-pingpong"),
    pytest.param(dict(arch=90), "schedule", "fast",
                 "schedule='fast' is not an sm90 schedule: use 'ws' (one tile per block), 'cooperative' "
                 "(persistent, two warpgroups per tile) or 'pingpong' (persistent, warpgroups on alternate tiles)",
                 id="schedule"),
    pytest.param(dict(arch=90), "schedule", 3, "schedule=3: give one of 'ws', 'cooperative', 'pingpong'",
                 id="schedule-type"),
    pytest.param(dict(arch=90, schedule="ws"), "tile_shape", (64, 128, 64),
                 "tile 64x128x64 with schedule 'ws': BM must be one of (128, 256) (its two consumer "
                 "warpgroups split the tile along M into whole 64-row wgmma blocks): use schedule='pingpong' for "
                 "BM=64, or tile 128x128x64", id="ws-bm"),
    pytest.param(dict(arch=90, schedule="cooperative"), "tile_shape", (64, 64, 64),
                 "tile 64x64x64 with schedule 'cooperative': a 64-row cooperative tile splits along N between its "
                 "two consumer warpgroups, which rules out BN=64 (each warpgroup's half must be whole 64-column "
                 "epilogue subtiles): use BN in (128, 256), or schedule='pingpong'", id="cooperative-split-n-bn"),
    pytest.param(dict(arch=90, schedule="cooperative"), "tile_shape", (192, 192, 64),
                 "tile 192x192x64 with schedule 'cooperative': a 192-row cooperative tile splits along N between its "
                 "two consumer warpgroups, which rules out BN=192 (each warpgroup's half must be whole 64-column "
                 "epilogue subtiles): use BN=128, or tile 128x192x64", id="cooperative-192-split-n-bn"),
    pytest.param(dict(arch=90, schedule="cooperative", tile_shape=(192, 128, 64)), "stages", 5,
                 "stages=5 with tile 192x128x64 bf16 needs 238592 bytes of shared memory (5 x 40960 operand tiles + "
                 "32768 epilogue + 1024 barriers and alignment); sm90 allows 232448: use stages<=4 or tile 128x128x64",
                 id="cooperative-192-stages"),
    pytest.param(dict(arch=90, schedule="ws"), "tile_shape", (64, 256, 64),
                 "tile 64x256x64 with schedule 'ws': BM must be one of (128, 256) (its two consumer warpgroups split "
                 "the tile along M into whole 64-row wgmma blocks): use schedule='pingpong' for BM=64, or tile "
                 "128x256x64", id="ws-bm"),
    pytest.param(dict(arch=90, tile_shape=(256, 128, 64)), "schedule", "pingpong",
                 "tile 256x128x64 with schedule 'pingpong': BM must be one of (64, 128) (one consumer warpgroup "
                 "holds the whole tile): use schedule='cooperative' for BM=256, or tile 128x128x64", id="pingpong-bm"),
    pytest.param(dict(arch=90, schedule="pingpong"), "tile_shape", (128, 256, 64),
                 "tile 128x256x64 with schedule 'pingpong' needs 256 fp32 accumulators per consumer thread (a "
                 "warpgroup holds 128x256); at most 160 fit in registers: use schedule='cooperative' (two warpgroups "
                 "split it) or tile 64x256x64 or 128x128x64", id="pingpong-accumulators"),
    pytest.param(dict(arch=90), "cluster_shape", (3, 1),
                 "cluster 3x1 is not one the sm90 template launches: use (1, 1), (2, 1) (two blocks along M share B), "
                 "(1, 2) (two blocks along N share A), (2, 2), (4, 1) or (1, 4)", id="cluster"),
    pytest.param(dict(arch=90), "cluster_shape", "2x4",
                 "cluster 2x4 is not one the sm90 template launches: use (1, 1), (2, 1) (two blocks along M share B), "
                 "(1, 2) (two blocks along N share A), (2, 2), (4, 1) or (1, 4)", id="cluster-string"),
    pytest.param(dict(arch=90), "cluster_shape", (2,),
                 "cluster_shape=(2,): give 2 positive integers, e.g. cluster_shape=(2, 1)", id="cluster-length"),
    pytest.param(dict(arch=90), "stages", 1, "stages=1: the TMA pipeline takes 2 to 16 stages", id="stages-few"),
    pytest.param(dict(arch=90, m=64, n=1024, k=1024), "stages", 17, "stages=17: the TMA pipeline takes 2 to 16 stages",
                 id="stages-many"),
    pytest.param(dict(arch=90), "stages", 0, "stages=0: the TMA pipeline takes 2 to 16 stages", id="stages-zero"),
    pytest.param(dict(arch=90, tile_shape=(128, 256, 64)), "stages", 5, SM90_SMEM_SENTENCE, id="smem"),
    pytest.param(dict(arch=90, stages=5), "tile_shape", (128, 256, 64), SM90_SMEM_SENTENCE, id="smem-via-tile"),
    pytest.param(dict(arch=90, tile_shape=(128, 192, 64)), "stages", 5,
                 "stages=5 with tile 128x192x64 bf16 needs 238592 bytes of shared memory (5 x 40960 operand tiles + "
                 "32768 epilogue + 1024 barriers and alignment); sm90 allows 232448: use stages<=4 or tile 128x128x64",
                 id="smem-192"),
    pytest.param(dict(arch=90), "raster", "x",
                 "raster='x': use 'm' (tiles run down M through raster_group tile rows, then along N) or 'n' (along "
                 "N through raster_group tile columns, then down M)", id="raster"),
    pytest.param(dict(arch=90), "raster", 3, "raster=3: give one of 'm', 'n'", id="raster-type"),
    pytest.param(dict(arch=90), "raster_group", 3, "raster_group=3: use one of (1, 2, 4, 8, 16)", id="raster-group"),
    pytest.param(dict(arch=90), "warps", (2, 4),
                 "warps= is a knob of the sm80 family (cp.async + mma.sync, arch=80 and newer); this plan is sm90, "
                 "whose 384 threads are fixed (1 producer + 2 consumer warpgroups): plan with family='sm80'",
                 id="warps-on-sm90"),
    pytest.param(dict(arch=80), "schedule", "pingpong", SM90_ONLY.format("schedule"), id="schedule-on-sm80"),
    pytest.param(dict(arch=80), "cluster_shape", (2, 1), SM90_ONLY.format("cluster_shape"), id="cluster-on-sm80"),
    pytest.param(dict(arch=86), "raster", "n", SM90_ONLY.format("raster"), id="raster-on-sm80"),
    pytest.param(dict(arch=90, family="sm80"), "schedule", "cooperative",
                 "schedule= is a knob of the sm90 family (Hopper, arch=90); this plan is sm80: plan with "
                 "family='sm90' (or family=None)", id="schedule-on-sm80-at-arch-90"),
    pytest.param(dict(arch=90, schedule="pingpong"), "family", "sm80",
                 "schedule= is a knob of the sm90 family (Hopper, arch=90); this plan is sm80: plan with "
                 "family='sm90' (or family=None)", id="family-sm80-with-schedule"),
    pytest.param(dict(arch=90, m=16), "cluster_shape", (2, 1),
                 "cluster 2x1 is larger than the tile grid (1 tile along M for M=16): use cluster 1x1",
                 id="cluster-larger-than-grid-m"),
    pytest.param(dict(arch=90, m=16, n=64), "cluster_shape", (1, 2),
                 "cluster 1x2 is larger than the tile grid (1 tile along N for N=64): use cluster 1x1",
                 id="cluster-larger-than-grid-n"),
]


@pytest.mark.parametrize("setup, knob, value, message", REFUSED_SM90_ASSIGNMENTS)
def test_refused_sm90_assignment(setup: dict[str, object], knob: str, value: object, message: str) -> None:
    p = plan(**setup)
    before = snapshot(p)
    with pytest.raises(ValueError) as err:
        setattr(p, knob, value)
    assert str(err.value) == message
    assert snapshot(p) == before
    # The same knob in the constructor is refused with the same sentence.
    with pytest.raises(ValueError) as err:
        plan(**setup, **{knob: value})
    assert str(err.value) == message


def test_cluster_larger_than_the_grid_is_only_refused_when_fixed_with_hints() -> None:
    assert plan(arch=90, cluster_shape=(2, 1)).cluster_shape == (2, 1)          # no hints: a large problem
    assert plan(arch=90, m=16).cluster_shape == (1, 1)                          # free: the planner avoids it
    # M=100: BM=64 gives 2 tiles along M, so a 2x1 cluster fits the 64-row tiles; 128-row ones are dropped.
    p = plan(arch=90, m=100, cluster_shape=(2, 1))
    assert p.tile_shape[0] == 64 and p.cluster_shape == (2, 1)
    assert any("cluster 2x1 is larger than the tile grid (1 tile along M for M=100)" in r for r in p.rejected)


def test_sm90_overrides_are_honoured_and_refused_in_order() -> None:
    p = plan(arch=90)
    p.schedule = "pingpong"
    assert p.schedule == "pingpong" and p.tile_shape[0] * p.tile_shape[1] <= 128 * 128
    p.tile_shape = (64, 256, 64)
    p.cluster_shape = "1x2"
    p.raster = "n"
    p.raster_group = 4
    p.stages = 3
    assert p.name == "sm90_bf16_tn_64x256x64_c1x2_s3_pp_g4n"
    p.out_dtype = "fp32"
    assert p.name == "sm90_bf16_tn_64x256x64_c1x2_s3_pp_g4n_ofp32"
    with pytest.raises(ValueError, match="with schedule 'ws': BM must be one of"):
        p.schedule = "ws"                  # 64 rows cannot be split between two warpgroups
    assert p.schedule == "pingpong"


def test_sm90_constructor_knobs_equal_assignments() -> None:
    kwargs = dict(tile_shape=(128, 128, 64), schedule="cooperative", cluster_shape=(1, 2), stages=5, raster="n",
                  raster_group=2)
    a = plan(arch=90, **kwargs)
    b = plan(arch=90)
    for knob, value in kwargs.items():
        setattr(b, knob, value)
    assert a.config == b.config
    assert a.name == "sm90_bf16_tn_128x128x64_c1x2_s5_coop_g2n"


def test_constructor_knobs_are_judged_together() -> None:
    """A tile that only pingpong takes, with schedule="pingpong": fine in either keyword order."""
    assert plan(arch=90, tile_shape=(64, 256, 64), schedule="pingpong").name.startswith("sm90_bf16_tn_64x256x64")
    assert plan(arch=90, schedule="pingpong", tile_shape=(64, 256, 64)).schedule == "pingpong"
    # and family="sm80" with an sm80 tile, whatever comes first
    assert plan(arch=90, tile_shape=(128, 128, 32), family="sm80", warps=(2, 2)).name.startswith("sm80_")


def test_a_fixed_tile_weighs_both_persistent_schedules() -> None:
    assert plan(arch=90, tile_shape=(256, 128, 64)).schedule == "cooperative"   # pingpong cannot hold it
    p = plan(arch=90, tile_shape=(64, 128, 64))
    assert p.schedule == "pingpong"   # cooperative splits it along N: weighed, no faster (ISSUE_EFFICIENCY)
    assert not p.rejected
    assert plan(arch=90, tile_shape=(64, 64, 64)).rejected   # cooperative cannot split 64 columns


def test_family_switches_and_back() -> None:
    p = plan(arch=90)
    p.family = "sm80"
    assert p.name == "sm80_bf16_tn_128x256x32_w2x4_s4_g8"
    p.warps = (4, 2)
    with pytest.raises(ValueError, match="^warps= is a knob of the sm80 family"):
        p.family = "sm90"
    p.warps = (4, 2)  # still sm80
    assert p.family == "sm80" and p.warps == (4, 2)
    q = plan(arch=90, family="sm80")
    q.family = None
    assert q.config == plan(arch=90).config


def test_sm90_config_name_and_fields() -> None:
    cfg = KernelConfig(arch=90, dtype=DType.fp16, out_dtype=DType.fp32, layout=parse_layout("nt", layout_c="col"),
                       tile=(64, 128, 64), warps=None, stages=6, raster_group=16, family="sm90", cluster=(1, 2),
                       schedule="pingpong", raster="n")
    check_config(cfg)
    assert cfg.name == "sm90_fp16_nt_dcol_64x128x64_c1x2_s6_pp_g16n_ofp32"
    assert cfg.threads == 384
    assert cfg.consumer_rows == 64 and cfg.accumulators_per_thread == 64
    assert cfg.smem_bytes == sm90_smem_bytes(cfg) == 6 * (64 + 128) * 64 * 2 + 32768 + 1024
    with pytest.raises(ValueError, match="no warp grid"):
        cfg.warp_tile
    ws = replace(cfg, tile=(256, 128, 64), schedule="ws", cluster=(2, 1), raster="m", raster_group=8, stages=3,
                 out_dtype=DType.fp16)
    assert ws.name == "sm90_fp16_nt_dcol_256x128x64_c2x1_s3_ws_g8m"
    assert ws.consumer_rows == 128 and ws.accumulators_per_thread == 128


def test_sm80_config_refuses_sm90_fields() -> None:
    cfg = plan(arch=90, family="sm80").config
    for field_name, value, knob in (("schedule", "cooperative", "schedule"), ("cluster", (2, 1), "cluster_shape"),
                                    ("raster", "n", "raster")):
        with pytest.raises(ValueError) as err:
            check_config(replace(cfg, **{field_name: value}))
        assert str(err.value) == (f"{knob}= is a knob of the sm90 family (Hopper, arch=90); this plan is sm80: plan "
                                  f"with family='sm90' (or family=None)")
    with pytest.raises(ValueError, match="the sm80 family needs warps"):
        check_config(replace(cfg, warps=None))
    with pytest.raises(ValueError, match="family='sm70': use 'sm80'"):
        check_config(replace(cfg, family="sm70"))


def test_raster_walk_is_triton_group_m_order_for_m() -> None:
    from generator.planner.sm90 import raster_coords

    # raster m, group 2 over a 3 x 3 grid: rows 0-1 walked down M, column by column, then row 2.
    walk = [raster_coords(u, 3, 3, "m", 2) for u in range(9)]
    assert walk == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (2, 0), (2, 1), (2, 2)]
    walk = [raster_coords(u, 3, 3, "n", 2) for u in range(9)]
    assert walk == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (0, 2), (1, 2), (2, 2)]
    assert [raster_coords(u, 2, 3, "m", 1) for u in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


@pytest.mark.parametrize("raster", ["m", "n"])
@pytest.mark.parametrize("group", [1, 2, 8, 16])
def test_raster_walk_visits_every_unit_once(raster: str, group: int) -> None:
    from generator.planner.sm90 import raster_coords

    for units_m, units_n in ((1, 1), (1, 7), (7, 1), (5, 13), (16, 16), (33, 8)):
        seen = [raster_coords(u, units_m, units_n, raster, group) for u in range(units_m * units_n)]
        assert sorted(seen) == [(i, j) for i in range(units_m) for j in range(units_n)]


def test_knob_properties_of_the_other_family() -> None:
    p = plan(arch=80)
    assert (p.family, p.schedule, p.cluster_shape, p.raster) == ("sm80", "", (1, 1), "m")
    q = plan(arch=90)
    assert q.warps is None


def test_choose_sm90_directly() -> None:
    spec = arch_spec(90)
    best, rejected = choose(DType.bf16, DType.bf16, parse_layout("tn"), spec, problem=Problem(4096, 4096, 4096))
    assert best.config == plan(arch=90).config and rejected == []
    best, _ = choose(DType.bf16, DType.bf16, parse_layout("tn"), spec, knobs=Knobs(family="sm80"))
    assert best.config.name == "sm80_bf16_tn_128x256x32_w2x4_s4_g8"


@pytest.mark.parametrize("wrong, right", [("tile", "tile_shape"), ("cluster", "cluster_shape"), ("stage", "stages")])
def test_a_misspelt_knob_is_refused_not_ignored(wrong, right):
    """plan.tile = (...) used to create a new attribute and leave the plan as it was, silently."""
    plan = Gemm(dtype="bf16", layout="tn", arch=90)
    before = plan.name
    with pytest.raises(AttributeError, match=f"Gemm has no knob '{wrong}': did you mean '{right}'"):
        setattr(plan, wrong, (128, 128, 64))
    assert plan.name == before and not hasattr(plan, wrong)
    plan.namespace = "mine"  # the op namespace stays assignable
    assert plan.namespace == "mine"


def test_epilogue_refusals_name_the_fix() -> None:
    from dataclasses import replace

    from generator.spec import epilogue as ep

    names = [f"v{i}" for i in range(9)]
    result = ep.ACC
    for n in names:                                       # acc * v0 * v1 * ... * v8
        result = ep.Expr("mul", (result, ep.Expr("operand", name=n)))
    nine = ep.Epilogue(operands=tuple(ep.Operand(n, "scalar") for n in names), result=result)
    with pytest.raises(ValueError, match=r"takes 9 operands; a kernel takes at most 8: combine operands"):
        Gemm("bf16", "tn", arch=90, epilogue=nine)
    unresolved = ep.from_knobs(bias="col")               # bias dtype: "like the output", not resolved
    cfg = replace(Gemm("bf16", "tn", arch=90).config, epilogue=unresolved)
    with pytest.raises(ValueError, match=r"pass epilogue.resolved\('bf16'\) \(Gemm does this for you\)"):
        check_config(cfg)
    check_config(replace(cfg, epilogue=unresolved.resolved("bf16")))


def test_epilogue_argument_must_be_a_function() -> None:
    with pytest.raises(ValueError, match=r"epilogue='gelu': give a function of the accumulator and its operands"):
        Gemm("bf16", "tn", arch=90, epilogue="gelu")


def test_stream_k_is_a_persistent_sm90_config_field_with_its_own_name() -> None:
    """KernelConfig.stream_k (not a Gemm knob; the planner sets it for split-K): the name says it (``_sk``), both
    persistent schedules take it, and a family, schedule or type the kernel cannot cut is refused with the fix."""
    base = Gemm("bf16", "tn", arch=90, tile_shape=(128, 256, 64), schedule="cooperative").config
    cut = replace(base, stream_k=True)
    check_config(cut)
    assert "_coop_sk_" in cut.name and "_sk" not in base.name
    pingpong = replace(Gemm("bf16", "tn", arch=90, schedule="pingpong").config, stream_k=True)
    check_config(pingpong)
    assert "_pp_sk_" in pingpong.name
    assert not Gemm("bf16", "tn", arch=90, m=128, n=4096, k=2048).config.stream_k   # too few k tiles to split
    with pytest.raises(ValueError, match="stream_k is built for the sm90 persistent schedules; this config is sm90 "
                                         "ws: use family='sm90', schedule='cooperative' or 'pingpong'"):
        check_config(replace(Gemm("bf16", "tn", arch=90, schedule="ws").config, stream_k=True))
    with pytest.raises(ValueError, match="stream_k is built for the sm90 persistent schedules; this config is sm80"):
        check_config(replace(Gemm("bf16", "tn", arch=80).config, stream_k=True))
    int8 = Gemm("int8", "tn", arch=90, tile_shape=(128, 256, 128), schedule="cooperative").config
    with pytest.raises(ValueError, match="int8's int32 sums"):
        check_config(replace(int8, stream_k=True))
    narrow = Gemm("bf16", "tn", arch=90, tile_shape=(64, 32, 64), schedule="pingpong").config
    with pytest.raises(ValueError, match="N tiles under 64 are built and tested without stream-K: leave stream_k off"):
        check_config(replace(narrow, stream_k=True))


@pytest.mark.parametrize("arch", [80, 90])
def test_batch_hint_counts_every_problems_tiles(arch: int) -> None:
    p = plan(arch=arch, m=256, n=256, k=256, batch=512)
    bm, bn, _ = p.config.tile
    tiles = -(-256 // bm) * -(-256 // bn) * 512
    assert p.why.startswith(f"{tiles} tiles of {bm}x{bn} in ")


def test_batch_hint_weighs_clusters_by_every_problems_tiles() -> None:
    # One problem of 256 x 2048 x 2048 fills a single wave (1x1 only: too short a K for a one-wave 2x1, see
    # ONE_WAVE_CLUSTER_K_TILES); 64 of them take several, where multicast pays.
    assert plan(arch=90, m=256, n=2048, k=2048).config.cluster == (1, 1)
    assert plan(arch=90, m=256, n=2048, k=2048, batch=64).config.cluster != (1, 1)


def test_ragged_groups_count_each_groups_last_tile_row_half_empty() -> None:
    # A grouped call's groups vary around m (Problem.ragged): each group's last cluster unit along M counts half empty
    # (RAGGED_LAST_UNIT), so a 2x1 cluster over groups of about two 128-row tile rows no longer pays (DeepSeek-V3's
    # experts at 4096 tokens, 148 rows each on average: h200_bench_moe_ragged_plan.json), and tiles are sized for
    # groups RAGGED_TYPICAL_ROWS times the mean: at 64 rows per expert, 128-row tiles.
    from generator.planner.sm90 import RAGGED_LAST_UNIT, ragged_units_m, waves

    hints = dict(arch=90, m=148, n=4096, k=7168, batch=32)
    assert plan(**hints).config.cluster == (2, 1)
    ragged = plan(**hints, ragged=True)
    assert ragged.config.cluster[0] == 1 and ragged.problem.ragged
    assert "groups of about 148 rows" in ragged.why
    cfg = ragged.config
    units = ragged_units_m(cfg, ragged.problem)
    assert units == 148 / (cfg.tile[0] * cfg.cluster[0]) + RAGGED_LAST_UNIT
    blocks, _, _ = waves(cfg, ragged.problem, 132)
    assert blocks == math.ceil(units * -(-4096 // (cfg.tile[1] * cfg.cluster[1])) * cfg.cluster[1] * 32)
    few = dict(arch=90, m=64, n=2048, k=2048, batch=64)
    assert plan(**few).config.tile[0] == 64 and plan(**few, ragged=True).config.tile[0] == 128


def test_ragged_groups_walk_bands_of_tile_rows() -> None:
    # Mixtral's experts at 512 tokens (128 rows each on average): equal groups of one tile row take bands of one unit
    # (g1); ragged ones bands of DEFAULT_RASTER_GROUP along M, so a group of several tile rows reads its B once
    # (h200_bench_moe_ragged_raster.json).
    from generator.planner.sm90 import DEFAULT_RASTER_GROUP

    hints = dict(arch=90, m=128, n=28672, k=4096, batch=8)
    assert plan(**hints).config.raster_group == 1
    ragged = plan(**hints, ragged=True).config
    assert (ragged.raster, ragged.raster_group) == ("m", DEFAULT_RASTER_GROUP)


def test_ragged_groups_of_few_rows_take_64x128_pingpong() -> None:
    # A decode step's experts (RAGGED_FEW_ROWS: at most 4 expected rows per group, many groups empty, so the grid is
    # unknown) take 64x128 pingpong where the model picks 64x256: twice the tiles per group
    # (h200_bench_moe_small_tokens.json). Not above 4 rows, not for equal groups, not where the user fixed the tile.
    from generator.planner.sm90 import RAGGED_FEW_ROWS, RAGGED_FEW_ROWS_BN

    decode = dict(arch=90, n=1536, k=2048, batch=128)
    few = plan(**decode, m=RAGGED_FEW_ROWS, ragged=True)
    assert (few.config.tile[:2], few.config.schedule, few.config.cluster) == ((64, RAGGED_FEW_ROWS_BN), "pingpong",
                                                                              (1, 1))
    assert "64x128 pingpong by rule" in few.why and "small-M" not in few.why   # grouped calls never take small-M
    assert plan(**decode, m=1, ragged=True).config.tile[:2] == (64, RAGGED_FEW_ROWS_BN)
    assert plan(**decode, m=1).config.tile[:2] == (64, 256)                          # equal groups: the model's
    assert plan(**decode, m=2 * RAGGED_FEW_ROWS, ragged=True).config.tile[:2] == (64, 256)
    assert plan(**decode, m=1, ragged=True, tile_shape=(64, 256, 64)).config.tile[:2] == (64, 256)


@pytest.mark.parametrize("hints, error", [
    (dict(n=4096, k=4096, batch=8), ValueError), (dict(m=64, n=4096, k=4096), ValueError),
    (dict(m=64, batch=8, ragged="yes"), TypeError)])
def test_ragged_needs_the_expected_rows_and_the_groups(hints: dict, error: type) -> None:
    hints.setdefault("ragged", True)
    with pytest.raises(error, match="ragged"):
        plan(arch=90, **hints)


@pytest.mark.parametrize("batch", [0, -3, 2.5, True])
def test_batch_hint_must_be_a_positive_integer(batch: object) -> None:
    with pytest.raises(ValueError, match=r"batch=.*give a positive integer problem size"):
        plan(m=256, batch=batch)


def test_a_very_long_k_weighs_every_candidate_split() -> None:
    """From SPLIT_K_LONG_K_TILES k tiles (a vocabulary head's dX: K = the vocabulary) each 1x1 candidate the launch
    cuts into at least SPLIT_K_LONG_K_MIN_PARTS k parts (SMs // tiles) is weighed so split: at 512 x 2048 x 151936 the
    big cooperative tile in 4 parts, not 128 whole 64x128 pingpong tiles; 64 tiles (2 parts) stay whole. Below the
    threshold the rule holds where each part walks SPLIT_K_LONG_K_PART_MIN_K_TILES k tiles (long_k_split_pays), and
    short of 4 such parts the plan is the one without the rule."""
    from generator.planner.sm90 import SPLIT_K_LONG_K_PART_MIN_K_TILES, SPLIT_K_LONG_K_TILES, long_k_parts
    from generator.spec.arch import arch_spec

    long = Gemm("bf16", "tt", arch=90, m=512, n=2048, k=151936)
    # (2x1 clusters of 128x256 tiles: 16 units over 66 resident clusters, LONG_K_SPLIT_CLUSTERS)
    assert long.config.stream_k and long.config.tile[:2] == (128, 256) and long.config.cluster == (2, 1)
    assert long_k_parts(long.config, Problem(512, 2048, 151936), arch_spec(90).sm_count) == 66 // 16
    assert "each split into 4 k parts" in str(long)
    # 4 parts of SPLIT_K_LONG_K_PART_MIN_K_TILES k tiles: the same split; one k tile fewer, none
    part_k = 4 * SPLIT_K_LONG_K_PART_MIN_K_TILES * 64
    assert SPLIT_K_LONG_K_TILES > 4 * SPLIT_K_LONG_K_PART_MIN_K_TILES
    assert Gemm("bf16", "tt", arch=90, m=512, n=2048, k=part_k).config == replace(long.config)
    short_k = part_k - 64
    short = Gemm("bf16", "tt", arch=90, m=512, n=2048, k=short_k)
    assert not short.config.stream_k   # (the share rule: 64x128 tiles fill the SMs)
    two_parts = Gemm("bf16", "tt", arch=90, m=512, n=4096, k=128256)   # 64 tiles of 128x256: a split in two only
    assert not two_parts.config.stream_k
    assert long_k_parts(replace(long.config, stream_k=False), Problem(512, 2048, short_k), 132) == 1
    # Parts too short: 12 tiles of 64x256 would take 11 parts of 45 k tiles at 501; the 64x64 tiles split in two stay
    few_rows = Gemm("bf16", "tt", arch=90, m=64, n=3072, k=32064).config
    assert few_rows.tile[:2] == (64, 64) and few_rows.stream_k
    # ... and where the 64x64 tiles would run whole (71 of them), a wider tile in long-K parts
    whole = Gemm("bf16", "tt", arch=90, m=64, n=4544, k=65024).config
    assert whole.tile[:2] == (64, 256) and whole.stream_k


@pytest.mark.parametrize("m, n, k, tile", [
    (256, 1024, 4096, (64, 64)),      # 32 tiles of 64x128: 64x64 pingpong (narrow_grid)
    (512, 512, 3584, (64, 64)),
    (512, 1024, 4096, (64, 64)),      # 64 tiles of 64x128: half the SMs, still 64x64
    (512, 2048, 2048, (128, 64)),     # 128 tiles of 64x128: no 64x64; 128x64 cooperative up to 512 rows
    (256, 1024, 8192, (128, 64)),     # K long enough for split-K: no 64x64
    (1024, 1024, 3072, (64, 128)),    # 1024 rows: neither rule
    (256, 4096, 4096, (64, 128)),     # 4096 columns: not a narrow layer
])
def test_narrow_layers_weigh_the_narrow_tiles(m: int, n: int, k: int, tile: tuple[int, int]) -> None:
    """Narrow layers (at most NARROW_TILE_MAX_N columns): 64x64 pingpong where 64x128 tiles would reach at most
    half of the SMs and K is short of split-K; 128x64 cooperative up to NARROW_TILE_MAX_M rows; the measured
    losses are the boundaries (docs/corpus.md, "Narrow layers")."""
    assert Gemm("bf16", "tn", arch=90, m=m, n=n, k=k).config.tile[:2] == tile


def test_split_k_bounds_by_tile_rows_and_sm_share() -> None:
    """16-bit inputs on at most a quarter of the SMs split from 32 k tiles (one 64-row tile row: from 40, from 32 on at
    most a fifth of the SMs); on up to half of them from 40 over more than one tile row; one tile row on more than a
    quarter of the SMs, fp8 and full SMs keep the 128 k tile bound."""
    def split(m: int, n: int, k: int, dtype: str = "bf16") -> bool:
        return Gemm(dtype, "tn", arch=90, m=m, n=n, k=k).config.stream_k

    assert split(64, 512, 2048) and split(128, 768, 2048) and split(256, 512, 2048)   # 8, 24, 32 tiles; 32 k tiles
    assert not split(64, 512, 1984)                     # 31 k tiles
    assert not split(64, 2048, 2048) and split(64, 2048, 2560)   # 32 tiles, one row: from 40 k tiles
    assert split(256, 768, 2560) and split(128, 4096, 4096)   # 48 and 64 tiles, 40 and 64 k tiles
    assert not split(256, 768, 2496)                     # 48 tiles, 39 k tiles
    assert not split(64, 3584, 4096)                     # one 64-row tile row on 56 tiles: B's stream alone
    assert not split(512, 1024, 4096)                    # 128 tiles of 64x64: the SMs are full
    assert not split(256, 512, 4096, "e4m3")             # (fp8: not measured)


def test_split_parts_hold_16_k_tiles_but_are_at_least_four() -> None:
    """split_parts: parts of SPLIT_K_PART_K_TILES k tiles, at least SPLIT_K_MIN_PARTS, at most what fits and the k
    tiles."""
    from generator.planner.sm90 import split_parts

    assert split_parts(8, 32) == split_parts(16, 64) == 4
    assert split_parts(16, 128) == 8 and split_parts(132, 4096) == 132
    assert split_parts(2, 64) == 2 and split_parts(132, 3) == 3


def test_two_tile_rows_take_64_row_pingpong_tiles_where_the_cooperative_tile_runs_whole() -> None:
    """TWO_TILE_ROWS: 65-128 rows on 64x64 pingpong where two rows of it fit one wave, below 128 rows on 64x128 up to
    three quarters of the SMs; the 128x64 cooperative tile stays where it splits or where no 64-row tile fits."""
    from generator.planner.sm90 import two_tile_rows_tile

    def tile(m: int, n: int, k: int) -> str:
        cfg = Gemm("bf16", "tn", arch=90, m=m, n=n, k=k).config
        return f"{cfg.tile[0]}x{cfg.tile[1]} {cfg.schedule}{' split' if cfg.stream_k else ''}"

    assert tile(96, 4096, 2048) == tile(128, 4096, 2048) == "64x64 pingpong"     # 128 tiles: one wave
    assert tile(96, 4544, 4544) == tile(96, 6144, 3584) == "64x128 pingpong"     # 72 and 96 tiles
    assert tile(128, 4544, 4544) == "128x64 cooperative"                         # 128 rows: not 64x128
    assert tile(96, 8192, 2048) == "128x64 cooperative"                          # 128 tiles of 64x128
    assert tile(112, 4096, 4096) == "128x64 cooperative split"                   # the split stays
    assert two_tile_rows_tile(DType.e4m3, Knobs(), Problem(96, 4096, 2048), 132) is None   # 16-bit inputs only
    assert two_tile_rows_tile(DType.bf16, Knobs(), Problem(64, 4096, 2048), 132) is None   # one tile row


def test_a_64_row_cooperative_tile_splits_along_n() -> None:
    """Its two consumer warpgroups take 64 x BN/2 each: what print(plan) says and what the model weighs (one wgmma
    stream, as a 64-row pingpong warpgroup: measured no faster)."""
    cfg = plan(arch=90, tile_shape=(64, 256, 64), schedule="cooperative").config
    assert cfg.splits_n and (cfg.consumer_rows, cfg.consumer_cols, cfg.accumulators_per_thread) == (64, 128, 64)
    assert "split each tile along N, 64x128 each" in describe(cfg)
    wide = plan(arch=90, tile_shape=(128, 256, 64), schedule="cooperative").config
    assert not wide.splits_n and "split each tile along M, 64x256 each" in describe(wide)
    assert not plan(arch=90, tile_shape=(64, 256, 64), schedule="pingpong").config.splits_n


def test_odd_n_tiles_where_they_fill_the_waves_by_a_margin() -> None:
    """A 128x144 tile where its count fills the waves that 128x192 leaves half empty (the same waves on a quarter
    narrower tile); never for the percent a better-rounded wave count gives a large problem, never for an N-major B
    (layout tt: its B tiles load whole 64-column chunks) or fp8 (built and legal, not weighed by the planner: only a
    user's tile_shape or tune() takes them)."""
    for m, n, k in ((1024, 4544, 4544), (8192, 576, 2048)):
        assert Gemm("bf16", "tn", arch=90, m=m, n=n, k=k).config.tile == (128, 144, 64), (m, n, k)
    assert Gemm("bf16", "tn", arch=90, m=8192, n=8192, k=8192).config.tile[1] == 256
    assert Gemm("bf16", "tn", arch=90, m=2048, n=1408, k=2048).config.tile[1] % 64 == 0   # 144 would add a wave
    assert Gemm("bf16", "tt", arch=90, m=1024, n=4544, k=4544).config.tile[1] % 64 == 0
    assert Gemm("e4m3", "tn", arch=90, m=1024, n=4544, k=4544).config.tile[1] % 64 == 0


def test_a_long_k_over_several_waves_takes_wide_cooperative_tiles() -> None:
    """From SPLIT_K_LONG_K_TILES k tiles with more 128x128 tiles than SMs (a vocabulary head's dX at 4096 tokens) the
    wave count no longer decides: cooperative tiles of at least 128x192 only. One wave (1024 x 2048) keeps its pick."""
    for m, n, k in ((4096, 3584, 152064), (8192, 3584, 152064), (4096, 2048, 102400)):
        cfg = Gemm("bf16", "tt", arch=90, m=m, n=n, k=k).config
        assert cfg.schedule == "cooperative" and cfg.tile[0] * cfg.tile[1] >= 128 * 192, (m, n, k, cfg.name)
    assert Gemm("bf16", "tt", arch=90, m=1024, n=2048, k=102400).config.schedule == "pingpong"
    fixed = Gemm("bf16", "tt", arch=90, m=4096, n=3584, k=152064, schedule="pingpong").config
    assert fixed.schedule == "pingpong"   # a schedule the user fixed is kept


def test_a_long_k_split_takes_a_2x1_cluster_over_two_tile_rows() -> None:
    """A vocabulary head's dX at 256 tokens: split-K in a 2x1 cluster (B multicast to both tile rows); one tile row
    keeps 1x1 (a second block would compute zeros)."""
    cfg = Gemm("bf16", "tt", arch=90, m=256, n=3584, k=152064).config
    assert cfg.stream_k and cfg.cluster == (2, 1) and cfg.schedule == "cooperative", cfg.name
    one_row = Gemm("bf16", "tt", arch=90, m=128, n=4096, k=128256).config
    assert one_row.stream_k and one_row.cluster == (1, 1), one_row.name


def test_odd_width_tiles_stage_the_epilogue_in_the_ring() -> None:
    """ring_staged: a 16-bit pingpong pick of an odd-width tile stages D in the ring slot of its tile's last k tile,
    with the stages its buffers' bytes free, and says so; cooperative tiles, widths of a multiple of 64, a
    column-major D, fixed stages, fp8 and split-K picks keep the buffers."""
    hints = dict(m=384, n=4096, k=3584, arch=90, tile_shape=(128, 96, 64), schedule="pingpong")
    staged = plan(**hints)
    cfg = staged.config
    assert cfg.tile[1] % 64 != 0 and cfg.staging_in_ring and "_sr_" in cfg.name
    assert cfg.schedule == "pingpong" and cfg.stages == sm90_max_stages_that_fit(cfg) == sm90_max_stages_that_fit(
        replace(cfg, staging_in_ring=False)) + 2
    assert "D staged in the ring slot of each tile's last k tile" in staged.why
    assert "the epilogue stages D in its tile's last slot" in str(staged)
    assert sm90_smem_bytes(cfg) == cfg.stages * cfg.stage_bytes + 1024
    assert not plan(**hints, stages=4).config.staging_in_ring                    # stages fixed by the user
    assert not plan(**hints, layout_c="col").config.staging_in_ring              # a column-major D
    cooperative = plan(m=1024, n=4544, k=4544, arch=90).config                    # 128x144 cooperative
    assert cooperative.tile[1] == 144 and not cooperative.staging_in_ring
    assert not plan(arch=90, m=4096, n=4096, k=4096).config.staging_in_ring     # 128x256
    assert not plan(dtype="e4m3", arch=90, m=1024, n=4544, k=4544, fast_accum=True).config.staging_in_ring
    split = plan(arch=90, m=128, n=4096, k=14336).config
    assert split.stream_k and not split.staging_in_ring


@pytest.mark.parametrize("request_, why", [
    (dict(arch=90, tile_shape=(128, 128, 64), schedule="pingpong", m=128, n=4096, k=14336), "stream-K's partial tiles"),
    (dict(dtype="e4m3", arch=90, tile_shape=(128, 128, 128), schedule="pingpong"), "promoted fp8"),
    (dict(arch=90, tile_shape=(64, 128, 64), schedule="cooperative"), "smaller than the 32768 bytes of its staging"),
    (dict(dtype="fp32", layout="nn", arch=90, tile_shape=(128, 128, 32), schedule="pingpong"), "tf32 in layout 'nn'"),
    (dict(arch=90, tile_shape=(128, 128, 64), schedule="pingpong", beta=0.5), "the epilogue's source"),
    (dict(arch=80), "this config is sm80"),
])
def test_staging_in_ring_refused_with_the_reason(request_: dict, why: str) -> None:
    cfg = plan(**request_).config
    check_config(replace(cfg, staging_in_ring=False))
    with pytest.raises(ValueError, match=f"staging_in_ring is not built here \\(.*{why}.*leave staging_in_ring off"):
        check_config(replace(cfg, staging_in_ring=True))


def test_an_fp8_64_row_pingpong_pick_takes_the_filling_odd_width() -> None:
    """filling_promoted_tile (rule 21): a promoted fp8 64-row pingpong pick whose tiles leave SMs idle takes the odd
    width that fills the waves FILLING_PROMOTED_MIN_GAIN times better (96 tiles of 64x128 -> 128 of 64x96 at 256 x
    3072 x 8192), its cluster and raster kept, per tensor, per row and unscaled, on any part; not with block scales
    (measured slower), fast accumulation (nothing promoted), a fixed tile, schedule or cluster, a 128-row pick, or
    tiles that fill the waves already."""
    for scale in ("tensor", "row", None):
        moved = plan(m=256, n=3072, k=8192, arch=90, dtype="e4m3", **({"scale": scale} if scale else {}))
        model, cfg = moved.estimate.model_config, moved.config
        assert model.tile[:2] == (64, 128) and model.schedule == "pingpong" and cfg.tile[:2] == (64, 96), scale
        assert (cfg.cluster, cfg.raster, cfg.raster_group) == (model.cluster, model.raster, model.raster_group)
        assert "64x96 by rule: its tiles fill the SMs' waves 1.1x or more better than 64x128's" in moved.why
    hints = dict(m=256, n=3072, k=8192, arch=90, dtype="e4m3")
    for other in (dict(scale="block"), dict(fast_accum=True), dict(tile_shape=(64, 128, 128)),
                  dict(schedule="pingpong"), dict(cluster_shape=(2, 1))):
        cfg = plan(**hints, **other).config
        assert cfg.schedule != "pingpong" or cfg.tile[1] % 64 == 0, other
    assert plan(m=128, n=6144, k=4096, arch=90, dtype="e4m3", scale="tensor").config.schedule == "cooperative"
    assert plan(m=256, n=4096, k=4096, arch=90, dtype="e4m3", scale="tensor").config.tile[:2] == (64, 128)


def test_a_promoted_one_wave_pick_takes_the_interleaved_k_tile_with_more_tiles() -> None:
    """interleaved_promoted_tile (rule 22): a promoted fp8 pick of one wave of 64-row pingpong or 128x64 cooperative
    tiles over at least INTERLEAVED_MIN_K_TILES k tiles takes the 64-row cooperative tile with K interleaved whose
    width gives the most tiles that still fit one wave, where those are more than the pick's, its cluster kept; not
    with fast accumulation, a short K, a fixed tile, schedule or cluster, a column-major D, a pick of more than one
    wave, or where no width adds tiles."""
    for scale in ("tensor", "row", "block", None):
        moved = plan(m=128, n=4096, k=4096, arch=90, dtype="e4m3", **({"scale": scale} if scale else {}))
        model, cfg = moved.estimate.model_config, moved.config
        assert model.tile[:2] == (128, 64) and model.schedule == "cooperative", scale
        assert cfg.tile[:2] == (64, 64) and cfg.schedule == "cooperative" and cfg.interleave_k, scale
        assert "_coop_ik_" in cfg.name and "64x64 cooperative with K interleaved by rule" in moved.why
        assert "take alternate k tiles" in describe(cfg)
    block = plan(m=256, n=3072, k=8192, arch=90, dtype="e4m3", scale="block").config   # 96 tiles of 64x128 -> 128
    assert block.tile[:2] == (64, 96) and block.interleave_k and block.cluster == (2, 1)
    hints = dict(m=128, n=4096, k=4096, arch=90, dtype="e4m3", scale="tensor")
    for other in (dict(fast_accum=True), dict(k=1024), dict(tile_shape=(128, 64, 128)), dict(schedule="cooperative"),
                  dict(cluster_shape=(1, 1)), dict(layout_c="col"), dict(m=512, k=7168)):
        assert not plan(**{**hints, **other}).config.interleave_k, other
    assert not plan(m=256, n=4096, k=4096, arch=90, dtype="e4m3", scale="tensor").config.interleave_k   # 128 tiles
    assert not plan(m=128, n=4096, k=4096, arch=90).config.interleave_k                                # bf16
    # the knob: False keeps the rule off, True asks for it where the planner would not (a 64-row cooperative tile)
    assert not plan(**hints, interleave_k=False).config.interleave_k
    asked = plan(m=256, n=4096, k=4096, arch=90, dtype="e4m3", scale="tensor", interleave_k=True)
    assert asked.interleave_k and asked.config.tile[0] == 64 and asked.config.schedule == "cooperative"
    asked.interleave_k = False
    assert not asked.config.interleave_k
    with pytest.raises(ValueError, match="promotes none.*leave interleave_k off"):
        plan(m=256, n=4096, k=4096, arch=90, interleave_k=True)


def test_interleave_k_refusals_name_the_fix() -> None:
    """check_interleave_k: a 64-row cooperative tile of promoted fp8 whose fp32 sums fit the staging buffers, no
    source operand, stream-K or staging in the ring; each refusal says why and to leave interleave_k off."""
    base = plan(m=128, n=4096, k=4096, arch=90, dtype="e4m3", scale="tensor").config
    check_config(base)
    for change, why in ((dict(schedule="pingpong"), "64-row sm90 cooperative"),
                        (dict(tile=(128, 64, 128)), "64-row sm90 cooperative"),
                        (dict(fast_accum=True), "promotes none"),
                        (dict(tile=(64, 256, 128)), "do not fit"),
                        (dict(stream_k=True), "stream-K")):
        with pytest.raises(ValueError, match=f"(?s){why}.*leave interleave_k off"):
            check_config(replace(base, stages=4, **change))
    sourced = plan(m=128, n=4096, k=4096, arch=90, dtype="e4m3", scale="tensor", beta=1.0, tile_shape=(64, 64, 128),
                   schedule="pingpong").config
    with pytest.raises(ValueError, match="source .C. comes into the staging buffers"):
        check_config(replace(sourced, schedule="cooperative", interleave_k=True))
    with pytest.raises(ValueError, match="quantized D .* leave interleave_k off"):
        plan(arch=90, dtype="e4m3", scale="block", out_dtype="e4m3", tile_shape=(64, 128, 128), interleave_k=True)


def test_a_128x128_pingpong_pick_takes_the_filling_odd_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """filling_pingpong_tile (rule 19), on the H200: where the model picks 128x128 pingpong and an odd width fills the
    SMs' waves FILLING_PINGPONG_MIN_GAIN times better, that width, the pick's cluster and raster kept, and
    Estimate.model keeps the model's pick; not for an H100 (arch=90's typical part), with the tile, schedule or
    cluster fixed, fp8, a column-major D, or a smaller gain."""
    assert plan(m=384, n=3072, k=2048, arch=90).config.tile[:2] == (128, 128)      # an H100
    visible_h200(monkeypatch)
    hints = dict(m=384, n=3072, k=2048, arch=None)
    moved = plan(**hints)
    model, cfg = moved.estimate.model_config, moved.config
    assert model.tile[:2] == (128, 128) and model.schedule == "pingpong" and cfg.tile[:2] == (128, 80)
    assert (cfg.cluster, cfg.raster, cfg.raster_group) == (model.cluster, model.raster, model.raster_group)
    assert "128x80 by rule: its tiles fill the SMs' waves 1.3x or more better than 128x128's" in moved.why
    for fixed in (dict(tile_shape=(128, 128, 64)), dict(schedule="pingpong"), dict(cluster_shape=(1, 1)),
                  dict(layout_c="col")):
        assert plan(**hints, **fixed).config.tile[1] % 64 == 0, fixed
    assert plan(**hints, dtype="e4m3", fast_accum=True).config.tile[1] % 64 == 0
    unmoved = plan(m=512, n=4096, k=4096, arch=None)        # 128 tiles of 128x128 fill the waves already
    assert unmoved.config.tile[:2] == (128, 128) and unmoved.estimate.model is None
    many_rows = plan(m=2048, n=576, k=2048, arch=None)       # more rows than FILLING_PINGPONG_MAX_ROWS
    assert many_rows.config.tile[:2] == (128, 128) and many_rows.estimate.model is None
