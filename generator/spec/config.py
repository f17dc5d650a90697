"""KernelConfig: everything that changes a kernel's binary, frozen, hashable, with a name that spells it.

The legality rules live here, next to the config they judge, so that the planner, the CLI and a
user's override all hear the same sentence when a combination cannot run (``describe`` puts a config into
words for ``print(plan)``). Two kernel families:

* ``sm80`` (cp.async multistage, ldmatrix, mma.sync): Ampere and newer, a warp grid per tile;
* ``sm90`` (TMA, mbarrier pipeline, wgmma, warp-specialized): Hopper only (sm_90a), a fixed 384 threads
  (one producer warpgroup, two consumer warpgroups), a schedule, a thread-block cluster, a raster order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .arch import ArchSpec, arch_spec
from .epilogue import IDENTITY, Epilogue
from .epilogue.operands import SCALE_BLOCK
from .types import PLAN_OUTPUT_DTYPES, QUANTIZED_OUTPUT_DTYPES, DType, Layout, Order, unquantized

FAMILIES = ("sm80", "sm90")

# -- sm80 ---------------------------------------------------------------------------------------------
# mma.sync m16n8k16 is the instruction shape (m16n8k8 for tf32: every shape reads 32 bytes of k per row); a warp
# loads B two n8 blocks at a time (ldmatrix.x4).
MMA_M, MMA_N, MMA_K = 16, 8, 16
MMA_K_BYTES = 32
WARP_N_STEP = 16
# Accumulators per thread = warp_m * warp_n / 32 floats; past 64x64 a warp runs out of registers.
MAX_WARP_TILE_ELEMS = 64 * 64
CHUNK_BYTES = 16          # one cp.async / ldmatrix row
SM80_BLOCK_M = (64, 128, 256)
SM80_BLOCK_N = (64, 128, 256)
SM80_BLOCK_K = (32, 64)    # 16-bit inputs; every input type: sm80_block_k
# A k tile's row of a K-major operand: 64 or 128 bytes (BK 32 or 64 for 16-bit inputs, 16 or 32 for tf32), so that a
# stage holds the same bytes whatever the input type, and the swizzle and 16-byte copies work alike.
SM80_BLOCK_K_BYTES = (64, 128)
SM80_WARP_COUNTS = (4, 8)
MIN_STAGES, MAX_STAGES = 2, 8
# sm90's TMA ring may run deeper: the small tiles' stages are cheap (64x64 bf16: 16 KB), and cuBLAS runs its 64x64
# tiles 13 stages deep (its nvjet kernel names, gpu/cublas_kernels.py). Only the 64x64 tiles fit more than 8.
SM90_MAX_STAGES = 16
RASTER_GROUPS = (1, 2, 4, 8, 16)

# -- sm90 ---------------------------------------------------------------------------------------------
# BK is one 128-byte swizzle row of 16-bit elements: TMA's 128-byte swizzle and wgmma's descriptors
# are built around it.
SM90_BLOCK_K = 64
SM90_BLOCK_N = (64, 128, 192, 256, 320)     # wgmma m64nNk16 takes N up to 256 in steps of 8; these are built
# (320: two wgmmas per m64 block and k step, n256 and n64, as cuBLAS's 128x320 kernel at 8192^3; cooperative
# only, and never the planner's choice: measured no faster than 128x256, docs/sm90.md "The 128x320 tile")
SM90_WIDE_BN = 320
# N tiles between those, in steps of 16 (cuBLAS runs 80-, 112-, 144-wide tiles where their count fills the SMs:
# gpu/cublas_kernels.py): 16-bit and fp8 inputs and a K-major B only (an M/N-major B tile loads whole 64-column chunks);
# D goes out by TMA in whole subtiles and the columns past them directly.
SM90_ODD_BLOCK_N = (80, 96, 112, 144, 160, 176, 208, 224, 240)
# N tiles narrower than 64 (16-bit inputs, K-major B): a layer of 512-1024 columns at 256-512 tokens has 32-64 tiles
# of 64x64 for 132 SMs; 64 x 16-48 tiles fill them (cuBLAS runs 64x16, 64x24, 64x32 and 64x48 kernels there:
# gpu/cublas_kernels.py). D goes out directly (no whole 64-column epilogue subtile).
SM90_NARROW_BLOCK_N = (16, 32, 48)
SM90_SWIZZLE_ATOM_ROWS = 8   # rows of 128 bytes in one 128-byte swizzle pattern: a TMA box of a swizzled tile spans whole ones
# ws / cooperative: two consumer warpgroups split the tile along M (each owns BM/2 rows, whole m64
# blocks); pingpong: one consumer warpgroup owns the whole tile (the other computes the next one).
SM90_SCHEDULES = ("ws", "cooperative", "pingpong")
SM90_SCHEDULE_TAGS = {"ws": "ws", "cooperative": "coop", "pingpong": "pp"}
SM90_BLOCK_M = {"ws": (128, 256), "cooperative": (64, 128, 192, 256), "pingpong": (64, 128)}
# A 64-row cooperative tile is split along N between its two consumer warpgroups (64 x BN/2 each, as cuBLAS runs its
# 64-row tiles with two consumer warpgroups): each half is whole 64-column epilogue subtiles and B chunks. So is a
# 192-row one (three m64 blocks per warpgroup, 192 x BN/2 each: cuBLAS's 192x128 dW kernels), which the accumulator
# limit keeps at BN = 128.
SM90_SPLIT_N_BLOCK_M = (64, 192)
SM90_SPLIT_N_BLOCK_N = (128, 256)
# A consumer thread holds its warpgroup's fp32 accumulators: (rows * BN / 128) registers; with
# setmaxnreg's 232 registers per consumer thread, 160 accumulators (a 64x320 share) leave ~70 for
# addresses and the epilogue.
SM90_MAX_ACCUMULATORS = 160
SM90_WARPGROUP_THREADS = 128
WGMMA_ROWS = 64  # wgmma's m64: one warpgroup's block of rows
SM90_MAX_BOX_ROWS = 256                     # cuTensorMapEncodeTiled: each box dimension at most 256 elements
SM90_THREADS = 3 * SM90_WARPGROUP_THREADS   # 1 producer warpgroup + 2 consumer warpgroups
# (cluster_m, cluster_n): 2x1 = two CTAs on neighbouring M tiles share (multicast) the B tile; 1x2 share A;
# 2x2 share both, each with one neighbour; 4x1 / 1x4 share B / A four ways.
SM90_CLUSTERS = ((1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4))
# mbarriers, and the slack that rounds dynamic shared memory up to the 1024-byte atom of the 128-byte swizzle.
SM90_RESERVED_SMEM_BYTES = 1024
# The epilogue's staging for the TMA store of D: per consumer warpgroup, double-buffered 64 x 128-byte subtiles.
SM90_CONSUMER_WARPGROUPS = 2
SM90_EPILOGUE_BUFFERS = 2
SM90_EPILOGUE_SUBTILE_BYTES = 64 * 128
# "m": tiles run down M through raster_group tile rows, then step along N (Triton's GROUP_M order);
# "n": tiles run along N through raster_group tile columns, then step down M.
RASTERS = ("m", "n")
# Extra operands of a fused epilogue one kernel takes (GEMMGEN_MAX_EPILOGUE_OPERANDS in
# templates/common/gemm_args.h: the slots of the launch arguments).
MAX_EPILOGUE_OPERANDS = 8
#: The version of the config space: bump it when a KernelConfig field changes meaning, or a kernel of the same name
#: would now be built differently enough that measured timings no longer hold; tuned results measured under another
#: version are not used (generator/tune/cache.py, docs/tuning.md).
CONFIG_SPACE_VERSION = 1


@dataclass(frozen=True)
class KernelConfig:
    """One kernel, fully specified. ``family`` picks the template and the rules that judge the rest.

    sm80 configs have ``warps`` and keep the sm90 fields at their defaults; sm90 configs have
    ``warps=None`` (their thread layout is fixed) and a ``schedule``.
    """

    arch: int                        # the compute capability the binary targets (80, 86, 89, 90)
    dtype: DType                     # A and B element type
    out_dtype: DType                 # D element type
    layout: Layout
    tile: tuple[int, int, int]       # (BM, BN, BK): one thread block's tile
    warps: tuple[int, int] | None    # sm80: (WM, WN) warps along M and N; sm90: None
    stages: int                      # shared-memory pipeline depth
    raster_group: int                # tile rows (or columns) walked together for L2 reuse (Triton's GROUP_M)
    family: str = field(default="sm80")
    cluster: tuple[int, int] = (1, 1)  # sm90: thread-block cluster (along M, along N)
    schedule: str = ""               # sm90: "ws", "cooperative" or "pingpong"
    raster: str = "m"                # sm90: "m" or "n", see RASTERS
    epilogue: Epilogue = IDENTITY    # what is done to the fp32 accumulator before D is stored (resolved dtypes)
    fast_accum: bool = False         # fp8: sum all of K inside wgmma (torch's use_fast_accum), no promotion
    dtype_b: DType | None = None     # B's element type where it differs from A's (fp8: e4m3 x e5m2); None: dtype
    # sm90 cooperative: stream-K, the (tile, k tile) iterations of the last partial wave of tiles, or of all of
    # them when there are fewer tiles than SMs, cut into equal shares, partial sums added in a fixed order. Not
    # planned and not a Gemm knob yet (not measured on a GPU): set on a config for experiments (bench_dtypes).
    stream_k: bool = False
    # A quantized D (out_dtype e4m3 / e5m2): also the amax of D (the largest |value| the epilogue gave, before
    # quantization), one fp32 reduced over every block, the op's third output: delayed scaling's record.
    amax: bool = False
    # sm90: the epilogue stages D in the ring slot of the tile's last k tile (held from the producer until the TMA
    # stores have read it) instead of buffers of its own, so that their 16-32 KB of shared memory go to the ring as
    # stages (check_staging_in_ring says where it applies).
    staging_in_ring: bool = False
    # sm90, a 64-row cooperative tile of promoted fp8: its two consumer warpgroups take alternate k tiles (each sums
    # and promotes its own over the whole tile, one promoting while the other's wgmmas run; the second hands its sums
    # to the first at the tile's end) instead of half the columns each (check_interleave_k says where it applies).
    interleave_k: bool = False

    @property
    def b_dtype(self) -> DType:
        return self.dtype if self.dtype_b is None else self.dtype_b

    @property
    def dtype_tag(self) -> str:
        """The input types in kernel names: 'bf16', or 'e4m3xe5m2' for A e4m3 and B e5m2."""
        return self.dtype.value if self.dtype_b is None else f"{self.dtype.value}x{self.dtype_b.value}"

    @property
    def promoted(self) -> bool:
        """fp8 sums each k tile inside wgmma, whose additions keep fewer bits than fp32, and adds it into fp32
        accumulators of its own ("promotion"), unless fast_accum: as cuBLAS does without use_fast_accum."""
        return self.dtype.is_fp8 and not self.fast_accum

    @property
    def name(self) -> str:
        bm, bn, bk = self.tile
        out = "" if self.out_dtype == self.dtype and not quantizes_out(self) else f"_o{self.out_dtype.value}"
        out += "_amax" if self.amax else ""
        if self.family == "sm90":
            cm, cn = self.cluster
            sched = SM90_SCHEDULE_TAGS.get(self.schedule, self.schedule)
            tags = ("_fa" if self.fast_accum else "") + ("_sk" if self.stream_k else "")
            tags += ("_sr" if self.staging_in_ring else "") + ("_ik" if self.interleave_k else "")
            return (f"sm90_{self.dtype_tag}_{self.layout.tag}_{bm}x{bn}x{bk}_c{cm}x{cn}_s{self.stages}_{sched}{tags}"
                    f"_g{self.raster_group}{self.raster}{out}{self.epilogue.name_suffix}")
        warps = "x".join(map(str, self.warps)) if self.warps else "None"
        return (f"{self.family}_{self.dtype_tag}_{self.layout.tag}_{bm}x{bn}x{bk}"
                f"_w{warps}_s{self.stages}_g{self.raster_group}{out}{self.epilogue.name_suffix}")

    @property
    def threads(self) -> int:
        if self.family == "sm90":
            return SM90_THREADS
        return self.warps[0] * self.warps[1] * 32

    @property
    def warp_tile(self) -> tuple[int, int]:
        """sm80: the (rows, columns) of D one warp owns."""
        if self.warps is None:
            raise ValueError(f"{self.name} has no warp grid: warp tiles belong to the sm80 family")
        return self.tile[0] // self.warps[0], self.tile[1] // self.warps[1]

    @property
    def consumer_rows(self) -> int:
        """sm90: the rows of a tile one consumer warpgroup owns (ws/cooperative split the tile along M, except a
        64- or 192-row cooperative tile, which they split along N, or interleave along K: interleave_k)."""
        whole = self.schedule == "pingpong" or self.splits_n or self.interleave_k
        return self.tile[0] if whole else self.tile[0] // 2

    @property
    def consumer_cols(self) -> int:
        """sm90: the columns of a tile one consumer warpgroup owns."""
        return self.tile[1] // 2 if self.splits_n else self.tile[1]

    @property
    def splits_n(self) -> bool:
        """sm90: whether the two consumer warpgroups split each tile along N (a 64- or 192-row cooperative tile)."""
        return (self.family == "sm90" and self.schedule != "pingpong" and self.tile[0] in SM90_SPLIT_N_BLOCK_M
                and not self.interleave_k)

    @property
    def accumulators_per_thread(self) -> int:
        """sm90: fp32 accumulator registers of one consumer thread."""
        return self.consumer_rows * self.consumer_cols // SM90_WARPGROUP_THREADS

    @property
    def stage_bytes(self) -> int:
        bm, bn, bk = self.tile
        return (bm + bn) * bk * self.dtype.bytes

    @property
    def smem_bytes(self) -> int:
        if self.family == "sm90":
            return sm90_smem_bytes(self)
        return self.stages * self.stage_bytes


#: The most rows of A a call may have to take the small-M kernel (small_m::kMaxRows, common/gemm_small_m.cuh).
SMALL_M_MAX_ROWS = 16
#: An N-major B takes it while its strips of SMALL_M_N_MAJOR_STRIP columns fit one per SM, B is at most this many
#: bytes and, with more than 8 rows, K is at least SMALL_M_N_MAJOR_TWO_GROUPS_MIN_K (takes_small_m in
#: templates/common/launch.cuh): beyond, the tiled kernels run faster (docs/small_m.md).
SMALL_M_N_MAJOR_STRIP = 32
SMALL_M_N_MAJOR_MAX_BYTES = 192 << 20
SMALL_M_N_MAJOR_TWO_GROUPS_MIN_K = 2560


def has_small_m_kernel(cfg: KernelConfig) -> bool:
    """Whether calls with at most SMALL_M_MAX_ROWS rows take the small-M kernel (small_m::kAvailable of
    templates/common/gemm_small_m.cuh): 16-bit A and B, A K-major (B either), no per-block scales, a 16- or 32-bit
    float D."""
    return (cfg.dtype in (DType.fp16, DType.bf16) and cfg.b_dtype is cfg.dtype and cfg.layout.a_k_major
            and cfg.epilogue.scale_mode != "block"
            and cfg.out_dtype in (DType.fp16, DType.bf16, DType.fp32))


def takes_small_m(cfg: KernelConfig, m: int, n: int, k: int, sm_count: int) -> bool:
    """Whether an aligned call of m x n x k on a GPU of ``sm_count`` SMs takes the small-M kernel (takes_small_m in
    templates/common/launch.cuh)."""
    if m > SMALL_M_MAX_ROWS or not has_small_m_kernel(cfg):
        return False
    return cfg.layout.b_k_major or (math.ceil(n / SMALL_M_N_MAJOR_STRIP) <= sm_count
                                    and n * k * cfg.dtype.bytes <= SMALL_M_N_MAJOR_MAX_BYTES
                                    and (m <= 8 or k >= SMALL_M_N_MAJOR_TWO_GROUPS_MIN_K))


#: M x N x K from which an operand off the 16-byte rule is copied into an aligned workspace rather than run on the
#: unaligned kernel (kRepackMinVolume, templates/common/workspace.cuh).
REPACK_MIN_VOLUME = 1 << 26


# -- shared memory --------------------------------------------------------------------------------------

def max_stages_that_fit(tile: tuple[int, int, int], dtype: DType, spec: ArchSpec) -> int:
    """sm80: the deepest pipeline of ``tile`` that one block's shared memory holds."""
    bm, bn, bk = tile
    return spec.smem_per_block // ((bm + bn) * bk * dtype.bytes)


def sm90_epilogue_bytes(cfg: KernelConfig) -> int:
    """Shared memory of the sm90 epilogue (EPILOGUE_BYTES in templates/sm90/gemm_kernel.cuh): D goes out
    by TMA store through per-consumer staging, two buffers of one 64-row x 128-byte subtile each (whatever
    the tile and the output dtype; reserved even when a column-major D is stored directly); none when they are in the
    ring (KernelConfig.staging_in_ring)."""
    if cfg.staging_in_ring:
        return 0
    return SM90_CONSUMER_WARPGROUPS * SM90_EPILOGUE_BUFFERS * SM90_EPILOGUE_SUBTILE_BYTES


def slot_staging_bytes(cfg: KernelConfig) -> int:
    """staging_in_ring: the staging buffers one ring slot holds, its tile's warpgroups' (a pingpong tile has one)."""
    warpgroups = 1 if cfg.schedule == "pingpong" else SM90_CONSUMER_WARPGROUPS
    return warpgroups * SM90_EPILOGUE_BUFFERS * SM90_EPILOGUE_SUBTILE_BYTES


def source_operand(cfg: KernelConfig) -> int | None:
    """The slot of the M x N operand the kernel reads itself, in bulk, instead of element by element through the
    epilogue functor (the "source", C in ``alpha * acc + beta * C``), or None: the first row-major M x N operand
    that the family can take so. sm90 loads it by TMA into its epilogue's staging buffers while the main loop
    runs; the buffers are D's (each subtile of C is read from the buffer its subtile of D is then staged in), so
    there the source has D's element width and D is row-major. sm80 reads it in pairs of neighbouring columns.
    Any other M x N operand is read element by element."""
    if cfg.family == "sm90" and cfg.layout.c.value != "row":
        return None
    for slot, op in enumerate(cfg.epilogue.operands):
        if op.kind != "matrix" or op.order is not Order.row:
            continue
        if cfg.family == "sm80" or op.dtype.bytes == cfg.out_dtype.bytes:
            return slot
    return None


# The name the CUDA side's contract uses for it.
SM90_EPILOGUE_BYTES = sm90_epilogue_bytes


def sm90_smem_bytes(cfg: KernelConfig) -> int:
    """Dynamic shared memory of an sm90 kernel: the ring of stages, the epilogue, barriers and alignment."""
    return cfg.stages * cfg.stage_bytes + sm90_epilogue_bytes(cfg) + SM90_RESERVED_SMEM_BYTES


def sm90_smem_parts(cfg: KernelConfig) -> str:
    """What a config's shared memory holds, in words (the stages' error, and print(plan))."""
    parts = [f"{cfg.stages} x {cfg.stage_bytes} operand tiles"]
    if sm90_epilogue_bytes(cfg):
        parts.append(f"{sm90_epilogue_bytes(cfg)} epilogue")
    elif cfg.staging_in_ring:
        parts[0] += " (the epilogue stages D in its tile's last slot)"
    parts.append(f"{SM90_RESERVED_SMEM_BYTES} barriers and alignment")
    return " + ".join(parts)


def sm90_max_stages_that_fit(cfg: KernelConfig) -> int:
    """sm90: the deepest pipeline of ``cfg``'s tile (its own stages ignored) that fits, at most SM90_MAX_STAGES."""
    spare = arch_spec(cfg.arch).smem_per_block - sm90_epilogue_bytes(cfg) - SM90_RESERVED_SMEM_BYTES
    return min(SM90_MAX_STAGES, spare // cfg.stage_bytes)


def max_stages(family: str) -> int:
    """The deepest pipeline a family's template takes ("sm90" or "sm80")."""
    return SM90_MAX_STAGES if family == "sm90" else MAX_STAGES


# -- legality -------------------------------------------------------------------------------------------

def sm90_block_k(dtype: DType) -> int:
    """The sm90 family's BK: one 128-byte swizzle row of k values (64 16-bit, 32 tf32, 128 8-bit elements)."""
    return 128 // dtype.bytes


def runs_transposed_product(dtype: DType, layout: Layout, epilogue: Epilogue, out_dtype: DType) -> bool:
    """Whether an sm90 library of this request computes D as D^T = B^T A^T (transposed_product): tf32 with a K-major A
    and an N-major B (layout tt), whose B the plain kernel would transpose in shared memory, and an identity epilogue
    writing D as it is (no operands or quantization to exchange)."""
    return (dtype is DType.tf32 and layout.a_k_major and not layout.b_k_major and epilogue.is_identity
            and out_dtype not in QUANTIZED_OUTPUT_DTYPES)


def exchanged_operands(cfg: KernelConfig) -> KernelConfig:
    """``cfg`` as the kernel of the transposed product D^T = B^T A^T: M and N, tile, cluster and raster exchanged; A
    is B^T, in B's storage read the other way (a row-major B is a column-major B^T), B is A^T, D is D^T. Its own
    inverse."""
    bm, bn, bk = cfg.tile
    return replace(cfg, tile=(bn, bm, bk), cluster=cfg.cluster[::-1], raster="n" if cfg.raster == "m" else "m",
                   layout=cfg.layout.transposed())


def transposed_product(cfg: KernelConfig) -> KernelConfig | None:
    """The config that computes ``cfg``'s product as D^T = B^T A^T, where the sm90 library runs that instead
    (templates/sm90/launch.cuh takes_swapped; runs_transposed_product): B^T is an M-major A, read into registers
    (reads_a_into_registers), A^T a K-major B and D^T a column-major D, so nothing is transposed in shared memory.
    None for every other config, and where the exchanged tile is not one the family builds."""
    if cfg.family != "sm90" or not runs_transposed_product(cfg.dtype, cfg.layout, cfg.epilogue, cfg.out_dtype):
        return None
    swapped = exchanged_operands(cfg)
    return swapped if is_legal(swapped) else None


def transposes_in_smem(cfg: KernelConfig) -> tuple[bool, bool]:
    """Whether the sm90 kernel transposes A's (B's) tiles in shared memory: tf32 operands that are M/N-major in global
    memory, which wgmma reads K-major only; the producer warpgroup transposes them in place (gemm_kernel.cuh
    transpose_slots). An M-major A is read into registers instead (reads_a_into_registers), so only B is. (Where the
    library also runs the transposed product, transposed_product, its fast path transposes nothing; this kernel still
    serves the other paths and the grouped walks, which spec/grouped.py refuses.)"""
    if cfg.family != "sm90" or cfg.dtype is not DType.tf32:
        return False, False
    return False, not cfg.layout.b_k_major


def reads_a_into_registers(cfg: KernelConfig) -> bool:
    """Whether the sm90 kernel's consumers read A's wgmma fragments from shared memory into registers (gemm_kernel.cuh
    RegisterFragmentA): a tf32 A that is M-major in global memory, which wgmma reads from shared memory K-major only
    but from registers in any order."""
    return cfg.family == "sm90" and cfg.dtype is DType.tf32 and not cfg.layout.a_k_major


def check_tf32(cfg: KernelConfig) -> None:
    """tf32 inputs (fp32 tensors) take every layout in both families: mma.sync's fragments come from registers, and
    the sm90 kernel reads an M-major A into registers (reads_a_into_registers) and transposes an N-major B in shared
    memory (transposes_in_smem)."""
    if cfg.out_dtype is DType.tf32:
        raise ValueError("out_dtype='tf32' is not an output type: use out_dtype='fp32' (the default for tf32)")


def _check_k_major(cfg: KernelConfig, like: str) -> None:
    """8-bit inputs: A and B K-major, the only order wgmma and mma.sync read bytes in (``like``: the torch op that
    has the same rule, for the message)."""
    if not (cfg.layout.a_k_major and cfg.layout.b_k_major):
        raise ValueError(f"dtype={cfg.dtype.value!r} needs A and B K-major (layout 'tn': A row-major, B column-major, "
                         f"i.e. x @ W.t() of row-major x and W), as {like} does; this plan is layout "
                         f"{cfg.layout.blas!r}: pass A.contiguous() and B.t().contiguous().t() and plan with "
                         "layout='tn'")


def check_fp8(cfg: KernelConfig) -> None:
    """fp8 inputs (e4m3, e5m2): the sm90 family (wgmma's fp8; sm80's mma.sync has none before sm89), A and B
    K-major (wgmma reads 8-bit operands from shared memory K-major only), a 16- or 32-bit float output."""
    name = cfg.dtype.value
    if cfg.family != "sm90":
        raise ValueError(f"dtype={name!r} (fp8) runs on the sm90 family only (wgmma, Hopper): plan with arch=90 and "
                         "family='sm90'")
    _check_k_major(cfg, "torch._scaled_mm")
    if cfg.out_dtype not in (DType.bf16, DType.fp16, DType.fp32, *QUANTIZED_OUTPUT_DTYPES):
        raise ValueError(f"out_dtype={cfg.out_dtype.value!r} is not an output of an fp8 GEMM: use 'bf16' (the "
                         "default), 'fp16', 'fp32', or 'e4m3' / 'e5m2' (quantized with per-block scales)")
    bm, bn, bk = cfg.tile
    if cfg.promoted and promoted_accumulators(cfg) > 2 * SM90_PROMOTED_MAX_ACCUMULATORS:
        raise ValueError(f"tile {bm}x{bn}x{bk} with schedule '{cfg.schedule}' needs {promoted_accumulators(cfg)} "
                         f"accumulators per consumer thread under fp8's promotion (the tile's fp32 sums and the "
                         f"current k tile's, {cfg.accumulators_per_thread} each, or half of them in two slices); at "
                         f"most {2 * SM90_PROMOTED_MAX_ACCUMULATORS} fit: use tile 128x256x{bk}, 128x192x{bk} or "
                         f"128x128x{bk} (schedule='cooperative'), or fast_accum=True (all of K summed inside wgmma, "
                         "as torch's use_fast_accum)")


def check_int8(cfg: KernelConfig) -> None:
    """int8 inputs: both families (wgmma .s32.s8.s8, mma.sync m16n8k32 .s32.s8.s8), A and B K-major (neither
    transposes bytes); D int32 (the exact sums, no epilogue) or a float type (the sums in fp32, then any epilogue:
    scales for a dequantized output)."""
    _check_k_major(cfg, "torch._int_mm")
    if cfg.out_dtype is DType.int32 and not cfg.epilogue.is_identity:
        raise ValueError("out_dtype='int32' stores int8's exact sums as they are, with no epilogue: for scales, "
                         "an activation or a bias plan out_dtype='bf16' (or 'fp16', 'fp32')")
    if cfg.out_dtype not in (DType.int32, DType.bf16, DType.fp16, DType.fp32):
        raise ValueError(f"out_dtype={cfg.out_dtype.value!r} is not an output of an int8 GEMM: use 'int32' (the "
                         "default) or 'bf16', 'fp16', 'fp32'")


def check_fast_accum(cfg: KernelConfig) -> None:
    if cfg.fast_accum and not cfg.dtype.is_fp8:
        raise ValueError(f"fast_accum=True is a knob of fp8 plans (e4m3, e5m2); this plan is {cfg.dtype.value}, "
                         "whose wgmma sums in fp32 anyway: drop fast_accum")


#: Promotion (fp8 without fast_accum) holds the current k tile's accumulators beside the tile's: up to this many
#: per consumer thread the whole tile's, beyond it the k tile is summed in two column halves, one after the other
#: (the kernel's PROMOTE_N). Both sets stay within twice this (the 232 registers, with room for scales and
#: addresses; ptxas reports no spills at 128x192 and 128x256).
SM90_PROMOTED_MAX_ACCUMULATORS = 96


def promote_slices(cfg: KernelConfig) -> int:
    """The column slices a promoted k tile is summed in, one after the other (the kernel's BN / PROMOTE_N)."""
    return 1 if cfg.accumulators_per_thread <= SM90_PROMOTED_MAX_ACCUMULATORS else 2


def promoted_accumulators(cfg: KernelConfig) -> int:
    """Accumulator registers of one consumer thread under promotion: the tile's sums and one slice's."""
    return cfg.accumulators_per_thread + cfg.accumulators_per_thread // promote_slices(cfg)


def _promote_slice_built(cfg: KernelConfig) -> bool:
    """Whether promotion's column slice (a consumer warpgroup's columns / promote_slices) is a width the wgmma
    wrappers are built for."""
    return cfg.consumer_cols // promote_slices(cfg) in SM90_BLOCK_N + SM90_ODD_BLOCK_N


def spans_two_scale_blocks(bn: int) -> bool:
    """Whether every tile of BN columns (starting at a multiple of BN) lies within two 128-column scale blocks: the
    latest a tile starts inside a block is 128 - gcd(BN, 128) columns in."""
    return SCALE_BLOCK - math.gcd(bn, SCALE_BLOCK) + bn <= 2 * SCALE_BLOCK


def check_block_scales(cfg: KernelConfig) -> None:
    """scale='block' (1x128 scales of A, 128x128 of B): fp8 on sm90, where the main loop applies them per k tile."""
    if not cfg.dtype.is_fp8:
        raise ValueError(f"scale='block' is for fp8 inputs (e4m3, e5m2), whose k tile is one 128-wide scale block; "
                         f"this plan is {cfg.dtype.value}: use scale='row' or scale='tensor'")
    # (Promotion's register limit keeps BN <= 256, so a tile spans at most two 128-column blocks of B, which the
    # kernel's BlockScales assumes.)
    if cfg.fast_accum:
        raise ValueError("scale='block' applies the scales where each k tile is promoted into fp32, which "
                         "fast_accum=True leaves out: drop fast_accum (or use scale='row' with fast_accum=True)")


#: The columns of one scale of a quantized D (kQuantBlock, templates/sm90/gemm_kernel.cuh): DeepSeek's 1x128
#: activation blocks, what ``generator.quantize(x, "e4m3", scale="block")`` gives.
QUANT_BLOCK = 128


def quantizes_out(cfg: KernelConfig) -> bool:
    """Whether D is quantized on the way out: fp8 values with one fp32 scale per row and QUANT_BLOCK columns."""
    return cfg.out_dtype in QUANTIZED_OUTPUT_DTYPES


def outputs(cfg: KernelConfig) -> int:
    """How many tensors the op returns: D, its second output (second_output) and, with amax, the amax of D."""
    return 1 + (second_output(cfg) is not None) + cfg.amax


def output_schema(cfg: KernelConfig) -> str:
    """The returns of the op's schema: "Tensor", "(Tensor, Tensor)" or "(Tensor, Tensor, Tensor)" (outputs)."""
    count = outputs(cfg)
    return "Tensor" if count == 1 else "(" + ", ".join(["Tensor"] * count) + ")"


def second_output(cfg: KernelConfig) -> str | None:
    """What the op returns beside D: 'scales' (a quantized D's, (M, ceil(N / QUANT_BLOCK)) fp32), 'aux' (the
    epilogue's second M x N output, like D), or None."""
    if quantizes_out(cfg):
        return "scales"
    return "aux" if cfg.epilogue.aux is not None else None


def check_quantized_out(cfg: KernelConfig) -> None:
    """An fp8 D (out_dtype 'e4m3' or 'e5m2'): the sm90 family's epilogue quantizes each consumer warpgroup's rows in
    whole 128-column blocks (a block's amax is one quad of lanes' registers), stores D row-major and its scales as
    a second output. Not with stream-K (a tile's parts are added after the epilogue would have scaled them), a
    second output of the epilogue's own (aux) or int8's int32 sums."""
    bm, bn, bk = cfg.tile
    out = cfg.out_dtype.value
    if cfg.family != "sm90":
        raise ValueError(f"out_dtype={out!r} (D quantized with per-block scales) is built for the sm90 family only: "
                         "plan with arch=90, or out_dtype='bf16' and generator.quantize(D, scale='block')")
    if cfg.layout.c is not Order.row:
        raise ValueError(f"out_dtype={out!r}: a quantized D is row-major (its scales run along the rows, as "
                         "quantize(x, scale='block') lays them out): plan with layout_c='row'")
    wg_n = cfg.consumer_cols
    if wg_n % QUANT_BLOCK:
        raise ValueError(f"out_dtype={out!r} with tile {bm}x{bn}x{bk}: each consumer warpgroup quantizes whole "
                         f"{QUANT_BLOCK}-column blocks, and this tile gives one {wg_n} columns: use BN = 128 or 256 "
                         "(BN = 256 for a 64-row cooperative tile)")
    if cfg.stream_k:
        raise ValueError(f"out_dtype={out!r} cannot take stream-K: a tile's partial sums would be added after its "
                         "epilogue had quantized them; plan without stream_k")
    if cfg.epilogue.aux is not None:
        raise ValueError(f"out_dtype={out!r}: the quantized D's scales are the plan's second output, so the epilogue "
                         "cannot have one of its own (aux): drop aux, or plan out_dtype='bf16'")
    # (An M x N operand is never the kernel's TMA source here: source_operand takes only one of D's width, and
    # operands are 16- or 32-bit; the kernel asserts it, kQuantizesOut with !kSourced.)


def check_mixed_inputs(cfg: KernelConfig) -> None:
    """A and B of different types: fp8's e4m3 x e5m2 (wgmma takes each combination), nothing else."""
    if cfg.dtype_b is None:
        return
    if cfg.dtype_b is cfg.dtype:
        raise ValueError(f"dtype_b={cfg.dtype_b.value!r} is A's dtype: leave dtype_b out (KernelConfig.dtype_b=None)")
    if not (cfg.dtype.is_fp8 and cfg.dtype_b.is_fp8):
        raise ValueError(f"dtype={cfg.dtype.value!r} with dtype_b={cfg.dtype_b.value!r}: A and B may differ only as "
                         "fp8's e4m3 and e5m2 (e.g. an e5m2 gradient times an e4m3 weight); convert one of them, "
                         f"e.g. B.to(A.dtype), and leave dtype_b out")


def check_config(cfg: KernelConfig) -> None:
    """Raise ValueError with the reason and what would work if ``cfg``'s template cannot run it."""
    check_mixed_inputs(cfg)
    if cfg.dtype is DType.tf32:
        check_tf32(cfg)
    check_fast_accum(cfg)
    if cfg.dtype.is_fp8:
        check_fp8(cfg)
    if cfg.dtype is DType.int8:
        check_int8(cfg)
    elif cfg.out_dtype is DType.int32:
        raise ValueError(f"out_dtype='int32' is the output of int8 GEMMs; this plan is {cfg.dtype.value}: use "
                         "out_dtype='fp32', 'bf16' or 'fp16'")
    if cfg.family == "sm90":
        check_sm90(cfg)
    elif cfg.family == "sm80":
        check_sm80(cfg)
    else:
        raise ValueError(f"family={cfg.family!r}: use 'sm80' (cp.async + mma.sync, arch 80 and newer) or 'sm90' "
                         f"(TMA + wgmma, arch 90)")
    if cfg.epilogue.scale_mode == "block":
        check_block_scales(cfg)
    if quantizes_out(cfg):
        check_quantized_out(cfg)
    elif cfg.amax:
        raise ValueError(f"amax=True records the amax of a quantized D (out_dtype 'e4m3' or 'e5m2'); this plan writes "
                         f"{cfg.out_dtype.value}: plan out_dtype='e4m3', or take D.abs().amax() of its result")
    if cfg.stream_k:
        check_stream_k(cfg)
    if cfg.staging_in_ring:
        check_staging_in_ring(cfg)
    if cfg.interleave_k:
        check_interleave_k(cfg)


def check_interleave_k(cfg: KernelConfig) -> None:
    """interleave_k (templates/sm90/gemm_kernel.cuh INTERLEAVE_K): a 64-row cooperative tile of promoted fp8, whose
    second consumer warpgroup hands its sums of the whole tile over through the epilogue's staging buffers."""
    bm, bn, bk = cfg.tile
    why = None
    if cfg.family != "sm90" or cfg.schedule != "cooperative" or bm != WGMMA_ROWS:
        why = f"it is built for 64-row sm90 cooperative tiles; this one is {bm}x{bn}x{bk} {cfg.schedule or cfg.family}"
    elif not cfg.promoted:
        why = ("it overlaps one warpgroup's promotion of fp8 k tiles with the other's wgmmas, and this plan promotes "
               "none")
    elif cfg.stream_k or cfg.staging_in_ring:
        why = "stream-K's and staging in the ring's tiles end elsewhere than in the staging buffers"
    elif source_operand(cfg) is not None:
        why = "the epilogue's source (C) comes into the staging buffers while the main loop still runs"
    elif quantizes_out(cfg) or cfg.epilogue.aux is not None:
        why = "a quantized D and an epilogue's second output (aux) are not built and tested with it"
    elif bm * bn * 4 > sm90_epilogue_bytes(cfg):
        why = f"the tile's fp32 sums ({bm * bn * 4} bytes) do not fit the {sm90_epilogue_bytes(cfg)} bytes of staging"
    if why is not None:
        raise ValueError(f"interleave_k is not built here ({why}): leave interleave_k off")


def check_staging_in_ring(cfg: KernelConfig) -> None:
    """staging_in_ring (templates/sm90/gemm_kernel.cuh kStagingInRing): the sm90 main loop's whole tiles, whose last
    k tile's slot holds the tile's staging buffers."""
    why = None
    if cfg.family != "sm90":
        why = f"this config is {cfg.family}, whose epilogue stages nothing in shared memory"
    elif cfg.stream_k:
        why = "stream-K's partial tiles end their parts elsewhere than a whole tile's last slot: leave stream_k off"
    elif cfg.promoted:
        why = "promoted fp8 (without fast_accum) runs a main loop of its own"
    elif any(transposes_in_smem(cfg)) or reads_a_into_registers(cfg):
        why = f"tf32 in layout {cfg.layout.blas!r} runs a main loop of its own (transposes or A in registers)"
    elif source_operand(cfg) is not None:
        why = "the epilogue's source (C) comes into the staging buffers while the main loop still runs"
    elif cfg.stage_bytes < slot_staging_bytes(cfg):
        why = (f"a stage of tile {'x'.join(map(str, cfg.tile))} ({cfg.stage_bytes} bytes) is smaller than the "
               f"{slot_staging_bytes(cfg)} bytes of its staging buffers")
    if why is not None:
        raise ValueError(f"staging_in_ring is not built here ({why}): leave staging_in_ring off")


def is_legal(cfg: KernelConfig) -> bool:
    """Whether check_config accepts ``cfg``."""
    try:
        check_config(cfg)
    except ValueError:
        return False
    return True


def check_stream_k(cfg: KernelConfig) -> None:
    """Stream-K (KernelConfig.stream_k): the sm90 persistent schedules (cooperative, pingpong), whose partial
    tiles are added as fp32."""
    if cfg.family != "sm90" or cfg.schedule not in ("cooperative", "pingpong"):
        this = " ".join(filter(None, (cfg.family, cfg.schedule)))
        raise ValueError(f"stream_k is built for the sm90 persistent schedules; this config is {this}: use "
                         "family='sm90', schedule='cooperative' or 'pingpong'")
    if cfg.dtype is DType.int8:
        raise ValueError("stream_k adds partial tiles as fp32, which int8's int32 sums are not: leave stream_k off")


def sm90_knob_sentence(knob: str, arch: int) -> str:
    """The refusal of an sm90-only knob on an sm80 plan."""
    fix = "plan with arch=90" if arch != 90 else "plan with family='sm90' (or family=None)"
    return f"{knob}= is a knob of the sm90 family (Hopper, arch=90); this plan is sm80: {fix}"


def sm80_knob_sentence(knob: str) -> str:
    """The refusal of an sm80-only knob on an sm90 plan."""
    return (f"{knob}= is a knob of the sm80 family (cp.async + mma.sync, arch=80 and newer); this plan is sm90, "
            f"whose {SM90_THREADS} threads are fixed (1 producer + 2 consumer warpgroups): plan with family='sm80'")


def sm80_block_k(dtype: DType) -> tuple[int, ...]:
    """The sm80 family's BK choices for ``dtype``, in elements: rows of 64 or 128 bytes (SM80_BLOCK_K_BYTES)."""
    return tuple(row_bytes // dtype.bytes for row_bytes in SM80_BLOCK_K_BYTES)


def sm80_mma_shape(dtype: DType) -> str:
    """The mma.sync shape of the sm80 family for ``dtype``: 32 bytes of k per row (k16 of 16-bit, k8 of tf32)."""
    return f"m{MMA_M}n{MMA_N}k{MMA_K_BYTES // dtype.bytes}"


def check_sm80(cfg: KernelConfig) -> None:
    """The sm80 template's rules (cp.async multistage, ldmatrix, mma.sync)."""
    spec = arch_spec(cfg.arch)
    for knob, value, default in (("schedule", cfg.schedule, ""), ("cluster_shape", cfg.cluster, (1, 1)),
                                 ("raster", cfg.raster, "m")):
        if value != default:
            raise ValueError(sm90_knob_sentence(knob, cfg.arch))
    if cfg.warps is None:
        raise ValueError("the sm80 family needs warps=(WM, WN), e.g. warps=(2, 4) for tile 128x256")
    bm, bn, bk = cfg.tile
    block_k = sm80_block_k(cfg.dtype)
    if bm not in SM80_BLOCK_M or bn not in SM80_BLOCK_N or bk not in block_k:
        for_dtype = "" if block_k == SM80_BLOCK_K else f" for {cfg.dtype.value}"
        raise ValueError(
            f"tile {bm}x{bn}x{bk} is not one the {cfg.family} template builds: BM in {SM80_BLOCK_M}, "
            f"BN in {SM80_BLOCK_N}, BK in {block_k}{for_dtype} (e.g. 128x128x{block_k[0]} or 128x256x{block_k[1]})")
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
    _check_raster_group_and_out(cfg)


def _check_raster_group_and_out(cfg: KernelConfig) -> None:
    if cfg.raster_group not in RASTER_GROUPS:
        raise ValueError(f"raster_group={cfg.raster_group}: use one of {RASTER_GROUPS}")
    if cfg.out_dtype not in PLAN_OUTPUT_DTYPES:
        raise ValueError(f"out_dtype={cfg.out_dtype.value}: use fp16, bf16 or fp32 (int32: int8 inputs; e4m3, e5m2: "
                         "quantized with per-block scales)")
    _check_epilogue(cfg)


def _check_epilogue(cfg: KernelConfig) -> None:
    if cfg.epilogue != cfg.epilogue.resolved(unquantized(cfg.out_dtype)):
        raise ValueError("the epilogue has operands whose dtype is still 'the output dtype': pass "
                         f"epilogue.resolved({unquantized(cfg.out_dtype).value!r}) (Gemm does this for you)")
    if len(cfg.epilogue.operands) > MAX_EPILOGUE_OPERANDS:
        raise ValueError(f"the epilogue takes {len(cfg.epilogue.operands)} operands; a kernel takes at most "
                         f"{MAX_EPILOGUE_OPERANDS}: combine operands (e.g. fold scalars into one constant)")


def check_sm90(cfg: KernelConfig) -> None:
    """The sm90 template's rules (TMA, mbarriers, wgmma, warp specialization).

    The order matters to the planner: the rules that do not depend on the schedule come first, so that
    a tile or stage count that no schedule can run is refused with one sentence, not one per schedule.
    """
    if cfg.arch != 90:
        raise ValueError(f"arch={cfg.arch}: the sm90 family uses wgmma and TMA, which exist only on sm_90a: "
                         f"plan with arch=90, or family='sm80'")
    if cfg.warps is not None:
        raise ValueError(sm80_knob_sentence("warps"))
    bm, bn, bk = cfg.tile
    all_bm = tuple(sorted({m for ms in SM90_BLOCK_M.values() for m in ms}))
    block_k = sm90_block_k(cfg.dtype)
    if bk != block_k:
        raise ValueError(f"tile {bm}x{bn}x{bk}: the sm90 family needs BK={block_k} for {cfg.dtype.value} (one 128-byte "
                         f"swizzle row of k values): use tile {bm}x{bn}x{block_k}")
    if bm not in all_bm or bn not in SM90_BLOCK_N + SM90_ODD_BLOCK_N + SM90_NARROW_BLOCK_N:
        raise ValueError(f"tile {bm}x{bn}x{bk} is not one the sm90 template builds: BM in {all_bm} (64 with "
                         f"schedule 'pingpong' or a cooperative split along N, 192 a cooperative split along N, 256 "
                         f"with 'cooperative' or 'ws' only), "
                         f"BN in {SM90_BLOCK_N} or, for 16-bit and fp8 inputs with a K-major B, {SM90_ODD_BLOCK_N}, "
                         f"or for 16-bit inputs with a K-major B {SM90_NARROW_BLOCK_N}, "
                         f"BK = {block_k} (e.g. 128x256x{block_k} or 128x128x{block_k})")
    _check_sm90_odd_block_n(cfg)
    _check_sm90_narrow_block_n(cfg)
    if bm * bn > 2 * SM90_MAX_ACCUMULATORS * SM90_WARPGROUP_THREADS:
        raise ValueError(f"tile {bm}x{bn}x{bk} needs more accumulator registers than two consumer warpgroups have "
                         f"({bm * bn // (2 * SM90_WARPGROUP_THREADS)} per thread, at most "
                         f"{SM90_MAX_ACCUMULATORS}): the largest sm90 tiles are 128x320, 128x256 and 256x128")
    _check_sm90_stages(cfg)
    _check_sm90_schedule(cfg)
    if cfg.cluster not in SM90_CLUSTERS:
        cm, cn = cfg.cluster
        raise ValueError(f"cluster {cm}x{cn} is not one the sm90 template launches: use (1, 1), (2, 1) (two blocks "
                         f"along M share B), (1, 2) (two blocks along N share A), (2, 2), (4, 1) or (1, 4)")
    _check_sm90_tma_box(cfg)
    if cfg.raster not in RASTERS:
        raise ValueError(f"raster={cfg.raster!r}: use 'm' (tiles run down M through raster_group tile rows, then "
                         f"along N) or 'n' (along N through raster_group tile columns, then down M)")
    _check_raster_group_and_out(cfg)


#: Odd N tiles whose promoted rowwise pingpong kernel spills (ptxas -v, nvcc 13.0: 64x224 8 bytes; per tensor and the
#: multiples of 64 do not): refused rather than planned (rule 21's widths) or built on request.
ROWWISE_SPILLING_BN = (224,)


def _check_sm90_odd_block_n(cfg: KernelConfig) -> None:
    """A BN that is no multiple of 64 (SM90_ODD_BLOCK_N): wgmma wrappers for the 16-bit and fp8 types, and a B tile
    loaded as whole rows along K (an M/N-major B tile comes in 64-column chunks). Promoted fp8 sums a k tile in slices
    of a width that has a wrapper too, and per-block scales need every tile to span at most two 128-column blocks."""
    bm, bn, bk = cfg.tile
    if bn not in SM90_ODD_BLOCK_N:
        return
    if cfg.dtype.bytes != 2 and not cfg.dtype.is_fp8:
        raise ValueError(f"tile {bm}x{bn}x{bk}: N tiles that are no multiple of 64 are built for bf16, fp16 and fp8 "
                         f"inputs; {cfg.dtype.value} takes BN in {SM90_BLOCK_N}")
    if cfg.promoted and not _promote_slice_built(cfg):
        fitting = tuple(n for n in SM90_ODD_BLOCK_N if _promote_slice_built(replace(cfg, tile=(bm, n, bk))))
        raise ValueError(f"tile {bm}x{bn}x{bk}: promoted fp8 sums each k tile in {promote_slices(cfg)} column slices "
                         f"of {bn // promote_slices(cfg)}, a width no wgmma wrapper is built for: use BN in {fitting} "
                         "or a multiple of 64")
    if cfg.promoted and cfg.schedule == "pingpong" and cfg.epilogue.scale_mode == "row" and bn in ROWWISE_SPILLING_BN:
        narrower = tuple(n for n in SM90_ODD_BLOCK_N if n < bn and _promote_slice_built(replace(cfg, tile=(bm, n, bk))))
        raise ValueError(f"tile {bm}x{bn}x{bk} pingpong with scale='row': the promoted kernel spills registers at this "
                         f"width (ptxas: 8 bytes); use BN in {narrower}, "
                         "a multiple of 64, or scale='tensor'")
    if cfg.epilogue.scale_mode == "block" and not spans_two_scale_blocks(bn):
        fitting = tuple(n for n in SM90_ODD_BLOCK_N if spans_two_scale_blocks(n))
        raise ValueError(f"tile {bm}x{bn}x{bk} with scale='block': a tile starting at a multiple of {bn} can reach into "
                         f"three 128-column scale blocks of B, and the kernel reads two per tile: use BN in {fitting} "
                         "or a multiple of 64")
    if not cfg.layout.b_k_major:
        raise ValueError(f"tile {bm}x{bn}x{bk} with layout '{cfg.layout.tag}': B is N-major here and loads in "
                         f"64-column chunks, so BN must be a multiple of 64 (one of {SM90_BLOCK_N}); BN={bn} needs a "
                         f"K-major B (layout '{cfg.layout.tag[0]}n')")


def _check_sm90_narrow_block_n(cfg: KernelConfig) -> None:
    """A BN under 64 (SM90_NARROW_BLOCK_N): wgmma wrappers for the 16-bit types, a K-major B (whole rows along K), D
    stored directly (a quantized D's subtile is one 128-column block), at least 8 rows of B per block of a cluster
    column (one 128-byte swizzle atom), and the schedules the GPU tests cover (pingpong, cooperative, no stream-K)."""
    bm, bn, bk = cfg.tile
    if bn not in SM90_NARROW_BLOCK_N:
        return
    if cfg.dtype.bytes != 2 or cfg.b_dtype.bytes != 2:
        raise ValueError(f"tile {bm}x{bn}x{bk}: N tiles under 64 are built for bf16 and fp16 inputs; "
                         f"{cfg.dtype.value} takes BN in {SM90_BLOCK_N}")
    if not cfg.layout.b_k_major:
        raise ValueError(f"tile {bm}x{bn}x{bk} with layout '{cfg.layout.tag}': B is N-major here and loads in "
                         f"64-column chunks, so BN must be a multiple of 64; BN={bn} needs a K-major B (layout "
                         f"'{cfg.layout.tag[0]}n')")
    if cfg.out_dtype.is_fp8:
        raise ValueError(f"tile {bm}x{bn}x{bk}: a quantized D is written in 128-column blocks; use BN >= 128")
    if cfg.schedule == "ws":
        raise ValueError(f"tile {bm}x{bn}x{bk} with schedule 'ws': N tiles under 64 are built and tested for the "
                         "pingpong and cooperative schedules: use one of those, or BN >= 64")
    if cfg.stream_k:
        raise ValueError(f"tile {bm}x{bn}x{bk} with stream_k: N tiles under 64 are built and tested without stream-K: "
                         "leave stream_k off, or use BN >= 64")
    if bn // cfg.cluster[0] < SM90_SWIZZLE_ATOM_ROWS:
        raise ValueError(f"tile {bm}x{bn}x{bk} with cluster {cfg.cluster[0]}x{cfg.cluster[1]}: each block of a cluster "
                         f"column loads {bn // cfg.cluster[0]} rows of B, fewer than a swizzle atom's "
                         f"{SM90_SWIZZLE_ATOM_ROWS}: use cluster (1, {cfg.cluster[1]}) or a wider tile")


def _check_sm90_tma_box(cfg: KernelConfig) -> None:
    """A TMA box spans at most 256 rows. A K-major B tile of BN rows is loaded in CM slices (one per CTA
    of a cluster column, multicast to the others), so BN = 320 needs CM >= 2; M/N-major B tiles load
    64-row chunks and never hit the limit."""
    bm, bn, bk = cfg.tile
    cm, cn = cfg.cluster
    if cfg.layout.b_k_major and bn // cm > SM90_MAX_BOX_ROWS:
        raise ValueError(f"tile {bm}x{bn}x{bk} with cluster {cm}x{cn}: a K-major B tile is loaded in {cm} slice(s) "
                         f"of {bn // cm} rows, and a TMA box holds at most {SM90_MAX_BOX_ROWS}: use cluster "
                         f"(2, 1) (two blocks each load half of B) or a tile with BN <= {SM90_MAX_BOX_ROWS}")


def _check_sm90_stages(cfg: KernelConfig) -> None:
    if cfg.stages < MIN_STAGES or cfg.stages > SM90_MAX_STAGES:
        raise ValueError(f"stages={cfg.stages}: the TMA pipeline takes {MIN_STAGES} to {SM90_MAX_STAGES} stages")
    spec = arch_spec(cfg.arch)
    need = sm90_smem_bytes(cfg)
    if need > spec.smem_per_block:
        bm, bn, bk = cfg.tile
        fit = sm90_max_stages_that_fit(cfg)
        smaller = (bm, {256: 128, 192: 128}.get(bn, 64), bk) if bn >= bm else ({192: 128}.get(bm, bm // 2), bn, bk)
        advice = f"use stages<={fit} or " if fit >= MIN_STAGES else "use "
        raise ValueError(
            f"stages={cfg.stages} with tile {bm}x{bn}x{bk} {cfg.dtype.value} needs {need} bytes of shared memory "
            f"({sm90_smem_parts(cfg)}); sm{spec.cc} allows {spec.smem_per_block}: "
            f"{advice}tile {smaller[0]}x{smaller[1]}x{smaller[2]}")


def _check_sm90_schedule(cfg: KernelConfig) -> None:
    if cfg.schedule not in SM90_SCHEDULES:
        raise ValueError(f"schedule={cfg.schedule!r} is not an sm90 schedule: use 'ws' (one tile per block), "
                         f"'cooperative' (persistent, two warpgroups per tile) or 'pingpong' (persistent, "
                         f"warpgroups on alternate tiles)")
    bm, bn, bk = cfg.tile
    if bn == SM90_WIDE_BN and cfg.schedule != "cooperative":
        raise ValueError(f"tile {bm}x{bn}x{bk} with schedule '{cfg.schedule}': BN={SM90_WIDE_BN} (two wgmmas per k "
                         f"step) is built and tested for schedule='cooperative' only: use it, or BN <= 256")
    allowed = SM90_BLOCK_M[cfg.schedule]
    if bm not in allowed:
        if cfg.schedule == "pingpong":
            why = "one consumer warpgroup holds the whole tile"
            fix = f"use schedule='cooperative' for BM={bm}, or tile 128x{bn}x{bk}"
        else:
            why = "its two consumer warpgroups split the tile along M into whole 64-row wgmma blocks"
            fix = f"use schedule='pingpong' for BM={bm}, or tile 128x{bn}x{bk}"
        raise ValueError(f"tile {bm}x{bn}x{bk} with schedule '{cfg.schedule}': BM must be one of {allowed} "
                         f"({why}): {fix}")
    if cfg.splits_n and bn not in SM90_SPLIT_N_BLOCK_N:
        # (the widths whose half fits the accumulators too; pingpong takes 64 rows, not 192)
        widths = tuple(b for b in SM90_SPLIT_N_BLOCK_N if bm * b // 2 // SM90_WARPGROUP_THREADS <= SM90_MAX_ACCUMULATORS)
        other = "schedule='pingpong'" if bm in SM90_BLOCK_M["pingpong"] else f"tile 128x{bn}x{bk}"
        raise ValueError(f"tile {bm}x{bn}x{bk} with schedule '{cfg.schedule}': a {bm}-row cooperative tile splits "
                         f"along N between its two consumer warpgroups, which rules out BN={bn} (each warpgroup's "
                         f"half must be whole 64-column epilogue subtiles): use "
                         f"{f'BN={widths[0]}' if len(widths) == 1 else f'BN in {widths}'}, or {other}")
    if cfg.accumulators_per_thread > SM90_MAX_ACCUMULATORS:
        rows = cfg.consumer_rows
        if cfg.schedule == "pingpong":
            fix = f"use schedule='cooperative' (two warpgroups split it) or tile {bm // 2}x{bn}x{bk}"
            if bn > 128:
                fix += f" or {bm}x128x{bk}"
        else:
            fix = f"use tile {bm}x{bn // 2}x{bk} or {bm // 2}x{bn}x{bk}"
        raise ValueError(f"tile {bm}x{bn}x{bk} with schedule '{cfg.schedule}' needs {cfg.accumulators_per_thread} "
                         f"fp32 accumulators per consumer thread (a warpgroup holds {rows}x{bn}); at most "
                         f"{SM90_MAX_ACCUMULATORS} fit in registers: {fix}")
