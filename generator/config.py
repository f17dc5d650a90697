"""KernelConfig: everything that changes a kernel's binary, frozen, hashable, with a name that spells it.

The legality rules live here, next to the config they judge, so that the planner, the CLI and a
user's override all hear the same sentence when a combination cannot run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .arch import ArchSpec, arch_spec
from .types import DType, Layout

# mma.sync m16n8k16 is the instruction shape; a warp loads B two n8 blocks at a time (ldmatrix.x4).
MMA_M, MMA_N, MMA_K = 16, 8, 16
WARP_N_STEP = 16
# Accumulators per thread = warp_m * warp_n / 32 floats; past 64x64 a warp runs out of registers.
MAX_WARP_TILE_ELEMS = 64 * 64
CHUNK_BYTES = 16          # one cp.async / ldmatrix row
SM80_BLOCK_M = (64, 128, 256)
SM80_BLOCK_N = (64, 128, 256)
SM80_BLOCK_K = (32, 64)
SM80_WARP_COUNTS = (4, 8)
MIN_STAGES, MAX_STAGES = 2, 8
RASTER_GROUPS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class KernelConfig:
    """One kernel of the sm80 family (cp.async multistage, ldmatrix, mma.sync), fully specified."""

    arch: int                        # the compute capability the binary targets (80, 86, 89, 90)
    dtype: DType                     # A and B element type
    out_dtype: DType                 # D element type
    layout: Layout
    tile: tuple[int, int, int]       # (BM, BN, BK): one thread block's tile
    warps: tuple[int, int]           # (WM, WN): warps along M and N; each owns (BM/WM) x (BN/WN)
    stages: int                      # shared-memory pipeline depth
    raster_group: int                # block rows walked together for L2 reuse (Triton's GROUP_M)
    family: str = field(default="sm80")

    @property
    def name(self) -> str:
        bm, bn, bk = self.tile
        out = "" if self.out_dtype == self.dtype else f"_o{self.out_dtype.value}"
        return (f"{self.family}_{self.dtype.value}_{self.layout.tag}_{bm}x{bn}x{bk}"
                f"_w{self.warps[0]}x{self.warps[1]}_s{self.stages}_g{self.raster_group}{out}")

    @property
    def threads(self) -> int:
        return self.warps[0] * self.warps[1] * 32

    @property
    def warp_tile(self) -> tuple[int, int]:
        return self.tile[0] // self.warps[0], self.tile[1] // self.warps[1]

    @property
    def stage_bytes(self) -> int:
        bm, bn, bk = self.tile
        return (bm + bn) * bk * self.dtype.bytes

    @property
    def smem_bytes(self) -> int:
        return self.stages * self.stage_bytes

    def describe(self) -> str:
        """Several readable lines: what every knob is set to."""
        bm, bn, bk = self.tile
        wm, wn = self.warp_tile
        lines = [
            f"name:         {self.name}",
            f"family:       {self.family} (cp.async multistage, ldmatrix, mma.sync m16n8k16, fp32 accumulate)",
            f"arch:         sm_{self.arch}",
            f"dtype:        {self.dtype.value} -> {self.out_dtype.value}",
            f"layout:       {self.layout.blas} (A {self.layout.a.value}-major, B {self.layout.b.value}-major,"
            f" D {self.layout.c.value}-major)",
            f"tile:         {bm}x{bn}x{bk}",
            f"warps:        {self.warps[0]}x{self.warps[1]} ({self.threads} threads, warp tile {wm}x{wn})",
            f"stages:       {self.stages} ({self.smem_bytes} bytes of shared memory)",
            f"raster_group: {self.raster_group}",
        ]
        return "\n".join(lines)


def max_stages_that_fit(tile: tuple[int, int, int], dtype: DType, spec: ArchSpec) -> int:
    bm, bn, bk = tile
    return spec.smem_per_block // ((bm + bn) * bk * dtype.bytes)


def check_config(cfg: KernelConfig) -> None:
    """Raise ValueError with the reason and what would work if the sm80 template cannot run ``cfg``."""
    spec = arch_spec(cfg.arch)
    bm, bn, bk = cfg.tile
    if bm not in SM80_BLOCK_M or bn not in SM80_BLOCK_N or bk not in SM80_BLOCK_K:
        raise ValueError(
            f"tile {bm}x{bn}x{bk} is not one the {cfg.family} template builds: BM in {SM80_BLOCK_M}, "
            f"BN in {SM80_BLOCK_N}, BK in {SM80_BLOCK_K} (e.g. 128x128x32 or 128x256x64)")
    if bm * bn > 128 * 256:
        raise ValueError(
            f"tile {bm}x{bn}x{bk} needs more accumulator registers than 8 warps have: the largest tiles are "
            f"128x256 and 256x128")
    wm, wn = cfg.warps
    if wm * wn not in SM80_WARP_COUNTS or bm % wm or bn % wn:
        raise ValueError(
            f"warps {wm}x{wn} cannot split tile {bm}x{bn}: use 4 or 8 warps that divide it, "
            f"e.g. warps=(2, 2) for 128x128 or (2, 4) for 128x256")
    warp_m, warp_n = cfg.warp_tile
    if warp_m % MMA_M or warp_n % WARP_N_STEP:
        raise ValueError(
            f"warps {wm}x{wn} give a {warp_m}x{warp_n} warp tile for tile {bm}x{bn}; each warp needs a multiple "
            f"of {MMA_M} rows and {WARP_N_STEP} columns: use fewer warps along the short side")
    if warp_m * warp_n > MAX_WARP_TILE_ELEMS:
        raise ValueError(
            f"warps {wm}x{wn} give a {warp_m}x{warp_n} warp tile for tile {bm}x{bn}, which needs "
            f"{warp_m * warp_n // 32} accumulator registers per thread; at most 64x64 fits: use more warps "
            f"(e.g. warps=({bm // 64}, {bn // 64}) if that is 4 or 8) or a smaller tile")
    chunks_per_operand = min(bm, bn) * bk * cfg.dtype.bytes // CHUNK_BYTES
    if chunks_per_operand % cfg.threads:
        raise ValueError(
            f"tile {bm}x{bn}x{bk} with {cfg.threads} threads: the smaller operand tile has {chunks_per_operand} "
            f"16-byte chunks, not a multiple of the thread count; use 4 warps or a larger tile")
    if cfg.stages < MIN_STAGES or cfg.stages > MAX_STAGES:
        raise ValueError(f"stages={cfg.stages}: the multistage pipeline takes {MIN_STAGES} to {MAX_STAGES} stages")
    if cfg.smem_bytes > spec.smem_per_block:
        fit = max_stages_that_fit(cfg.tile, cfg.dtype, spec)
        smaller = (bm, bn // 2 if bn > 64 else bn, bk) if bn >= bm else (bm // 2, bn, bk)
        advice = f"use stages<={fit} or " if fit >= MIN_STAGES else "use "
        raise ValueError(
            f"stages={cfg.stages} with tile {bm}x{bn}x{bk} {cfg.dtype.value} needs {cfg.smem_bytes} bytes of shared "
            f"memory; sm{spec.cc} allows {spec.smem_per_block}: {advice}tile {smaller[0]}x{smaller[1]}x{smaller[2]}")
    if cfg.raster_group not in RASTER_GROUPS:
        raise ValueError(f"raster_group={cfg.raster_group}: use one of {RASTER_GROUPS}")
    if cfg.out_dtype not in (DType.fp16, DType.bf16, DType.fp32):
        raise ValueError(f"out_dtype={cfg.out_dtype.value}: use fp16, bf16 or fp32")
