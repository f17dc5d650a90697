"""``print(plan)``'s account of a kernel config: every knob in a readable line, and what it means for a call (the
other kernels a call may take, how a batch runs, the schedule, cluster and raster in words). Reads the config and
its rules (``config``); nothing imports this but the stages that show a plan (``gemm``, ``render``)."""
from __future__ import annotations

from .config import (QUANT_BLOCK, REPACK_MIN_VOLUME, SM90_THREADS, SMALL_M_MAX_ROWS, SMALL_M_N_MAJOR_MAX_BYTES,
                     SMALL_M_N_MAJOR_STRIP, SMALL_M_N_MAJOR_TWO_GROUPS_MIN_K, KernelConfig,
                     has_small_m_kernel, quantizes_out, reads_a_into_registers, sm80_mma_shape, sm90_smem_parts,
                     transposed_product, transposes_in_smem)
from .epilogue import Epilogue
from .types import DType


def describe(cfg: KernelConfig) -> str:
    """Several readable lines: what every knob of ``cfg`` is set to."""
    if cfg.family == "sm90":
        return _describe_sm90(cfg)
    bm, bn, bk = cfg.tile
    wm, wn = cfg.warp_tile
    lines = [
        f"name:         {cfg.name}",
        f"family:       {cfg.family} (cp.async multistage, ldmatrix, mma.sync {sm80_mma_shape(cfg.dtype)}, "
        "fp32 accumulate)",
        *_common_lines(cfg),
        f"warps:        {cfg.warps[0]}x{cfg.warps[1]} ({cfg.threads} threads, warp tile {wm}x{wn})",
        f"stages:       {cfg.stages} ({cfg.smem_bytes} bytes of shared memory)",
        f"raster_group: {cfg.raster_group}",
    ]
    return "\n".join(lines)


def _common_lines(cfg: KernelConfig) -> list[str]:
    bm, bn, bk = cfg.tile
    return [
        f"arch:         sm_{cfg.arch}",
        f"dtype:        {cfg.dtype_tag.replace('x', ' x ')} -> {cfg.out_dtype.value}",
        *_quantized_out_lines(cfg),
        f"layout:       {cfg.layout.blas} (A {cfg.layout.a.value}-major, B {cfg.layout.b.value}-major,"
        f" D {cfg.layout.c.value}-major)",
        *_transpose_lines(cfg),
        f"tile:         {bm}x{bn}x{bk}",
        *_epilogue_lines(cfg.epilogue),
        *_path_lines(cfg),
        *_batch_lines(cfg),
    ]


def _transpose_lines(cfg: KernelConfig) -> list[str]:
    swapped = transposed_product(cfg)
    names = [name for name, transposed in zip("AB", transposes_in_smem(cfg)) if transposed and swapped is None]
    lines = [f"transposed:   {' and '.join(names)} tiles in shared memory, 32x32 chunks in place by the producer "
             "warpgroup (wgmma reads tf32 K-major only)"] if names else []
    if swapped is not None:
        sbm, sbn, _ = swapped.tile
        lines.append(f"transposed:   runs as D^T = B^T A^T ({sbm}x{sbn} tiles, cluster {swapped.cluster[0]}x"
                     f"{swapped.cluster[1]}): B^T's M-major tiles read into wgmma's register fragments, nothing "
                     "transposed in shared memory (wgmma reads tf32 from shared memory K-major only)")
    if reads_a_into_registers(cfg):
        lines.append("registers:    A's M-major tiles read from shared memory into wgmma's register fragments by the "
                     "consumers (wgmma reads tf32 from shared memory K-major only)")
    return lines


def _quantized_out_lines(cfg: KernelConfig) -> list[str]:
    if not quantizes_out(cfg):
        return []
    return [f"quantized:    D's values rounded to bf16, then per row and {QUANT_BLOCK}-column block scaled by s = amax / "
            f"{448 if cfg.out_dtype is DType.e4m3 else 57344} into {cfg.out_dtype.value};",
            f"              returns (D, scales{', amax' if cfg.amax else ''}), scales (M, ceil(N/{QUANT_BLOCK})) fp32: "
            f"quantize(D_bf16, '{cfg.out_dtype.value}', scale='block') bit for bit",
            *(["              amax: a 0-dim fp32, D_bf16.abs().amax() (the blocks' amaxes, reduced by atomic max)"]
              if cfg.amax else [])]


def _path_lines(cfg: KernelConfig) -> list[str]:
    """The kernels other than the config's own that a call may take (the launch chooses per call)."""
    if quantizes_out(cfg):   # (templates/common/launch.cuh choose_folded_path)
        return ["other paths:  A or B not 16-byte aligned (base or leading dimension): copied into an aligned "
                "workspace", "              whatever the size (only the config's own kernel quantizes D)"]
    unaligned = ["A or B not 16-byte aligned (base or leading dimension): copied into an aligned workspace (its",
                 f"rows padded to 16 bytes) when M*N*K >= 2^{REPACK_MIN_VOLUME.bit_length() - 1}, else the unaligned "
                 "kernel"]
    small = ([f"M <= {SMALL_M_MAX_ROWS}: the small-M kernel (streams B once from HBM: D^T = B^T A^T on mma.sync, K "
              "split between warps)"] if has_small_m_kernel(cfg) else [])
    if small and not cfg.layout.b_k_major:
        small.append(f"  (B N-major, transposed in registers: while its {SMALL_M_N_MAJOR_STRIP}-column strips fit one "
                     f"per SM, B <= {SMALL_M_N_MAJOR_MAX_BYTES >> 20} MiB and,")
        small.append(f"  past 8 rows, K >= {SMALL_M_N_MAJOR_TWO_GROUPS_MIN_K})")
    first, *rest = small + unaligned
    return [f"other paths:  {first}", *(f"              {line}" for line in rest)]


def _batch_lines(cfg: KernelConfig) -> list[str]:
    """How a batched call (3-D A or B) runs: every problem in one launch (common/batch.cuh), and when a batch is
    one larger problem (fold_batch there), as that problem."""
    if quantizes_out(cfg):
        return ["batched:      refused (the scales are one matrix's): reshape a batch of row-major A to (batch*M, K)"]
    first = "batched:      3-D A or B (batch, ., .): every problem in one launch"
    if cfg.layout.a_k_major and cfg.layout.c.value == "row":
        return [first, "              a 2-D B with A's matrices back to back (no per-row operand): one batch*M-row "
                       "problem"]
    if cfg.layout.b_k_major and cfg.layout.c.value == "col":
        return [first, "              a 2-D A with B's matrices back to back (no per-column operand): one "
                       "batch*N-column problem"]
    return [first]


def _epilogue_lines(epilogue: Epilogue) -> list[str]:
    if epilogue.is_identity:
        return []
    first, *rest = epilogue.describe()
    return [f"epilogue:     {first}", *(f"              {line}" for line in rest)]


def describe_schedule(cfg: KernelConfig) -> str:
    rows, bn = cfg.consumer_rows, cfg.tile[1]
    if cfg.schedule == "pingpong":
        return (f"pingpong (persistent: the two consumer warpgroups take alternate tiles, {rows}x{bn} each, "
                f"one's epilogue overlapping the other's math)")
    if cfg.interleave_k:
        return (f"cooperative with K interleaved (persistent: the two consumer warpgroups take alternate k tiles of "
                f"each {rows}x{bn} tile, one promoting while the other's wgmmas run; the second hands its sums to "
                f"the first, which runs the epilogue)")
    if cfg.schedule == "cooperative":
        along, cols = ("N", cfg.consumer_cols) if cfg.splits_n else ("M", bn)
        return f"cooperative (persistent: two consumer warpgroups split each tile along {along}, {rows}x{cols} each)"
    return f"ws (one tile per block: two consumer warpgroups split it along M, {rows}x{bn} each)"


def describe_cluster(cluster: tuple[int, int]) -> str:
    cm, cn = cluster
    if cm * cn == 1:
        return f"{cm}x{cn} (no cluster: each block loads its own A and B tiles)"
    if cm > 1 and cn > 1:
        return (f"{cm}x{cn} ({cm} blocks along M share each B tile, {cn} along N each A tile: TMA multicasts each "
                f"operand to the blocks that share it)")
    count, along, op = (cm, "M", "B") if cm > 1 else (cn, "N", "A")
    whom = "both" if count == 2 else f"all {count}"
    return f"{cm}x{cn} ({count} blocks along {along} share each {op} tile: TMA multicasts {op} to {whom})"


def describe_raster(cfg: KernelConfig) -> str:
    """The walk over the tile grid (templates/sm90 Raster; planner_sm90.raster_coords is its Python twin).

    The walk steps over cluster-sized units of tiles: cm x cn tiles of a cm x cn cluster."""
    group, (cm, cn) = cfg.raster_group, cfg.cluster
    if cfg.raster == "m":
        clusters = f"{cm}x{cn} clusters"
        one, many = ("tile row", "tile rows") if cm == 1 else (f"row of {clusters}", f"rows of {clusters}")
        if group == 1:
            return f"m, group 1 (one {one} at a time, along N)"
        return f"m, group {group} (bands of {group} {many}, each walked down M then along N: Triton's GROUP_M order)"
    clusters = f"{cm}x{cn} clusters"
    one, many = ("tile column", "tile columns") if cn == 1 else (f"column of {clusters}", f"columns of {clusters}")
    if group == 1:
        return f"n, group 1 (one {one} at a time, down M)"
    return f"n, group {group} (bands of {group} {many}, each walked along N then down M)"


def takes_block_order(cfg: KernelConfig) -> bool:
    """Whether the launch orders this kernel's grid by the SMs its blocks land on (templates/sm90/launch.cuh: 1x1,
    persistent, not stream-K; at run time, when it has more tiles than half the SMs)."""
    return cfg.cluster == (1, 1) and cfg.schedule != "ws" and not cfg.stream_k


def describe_block_order(cfg: KernelConfig) -> str:
    """Which SM takes which tile (templates/sm90/block_order.cuh): a 1x1 persistent grid of more tiles than half the
    SMs, not stream-K, runs a block on every SM and hands out the raster's tiles in the order of the SMs' indices."""
    if not takes_block_order(cfg):
        return ""
    return "; with more tiles than half the SMs, a block per SM, tiles taken in the order of the SMs' indices"


def describe_launch(cfg: KernelConfig) -> str:
    """How a launch overlaps its neighbours in the stream (templates/sm90/launch.cuh, GEMMGEN_SM90_PDL): every sm90 GEMM
    starts its blocks under the previous kernel's tail, except a grid taken in the SMs' order (describe_block_order),
    which must land where the order was recorded."""
    ordered = " (a grid taken in the SMs' order: in stream order)" if takes_block_order(cfg) else ""
    return ("blocks start under the stream's previous kernel, touching memory once it has ended; the next GEMM may "
            f"start once this one's loads are issued (programmatic dependent launch){ordered}")


def _accumulation(cfg: KernelConfig) -> str:
    if cfg.dtype is DType.int8:
        return "int32 accumulate (exact)"
    if cfg.promoted:
        return "fp32 accumulate: each k tile summed in wgmma, then promoted into fp32 registers"
    if cfg.fast_accum:
        return "fast accumulation: all of K summed inside wgmma"
    return "fp32 accumulate"


def _describe_sm90(cfg: KernelConfig) -> str:
    lines = [
        f"name:         {cfg.name}",
        f"family:       sm90 (TMA, mbarrier pipeline, wgmma m64nNk{32 // cfg.dtype.bytes}, warp-specialized, "
        f"{_accumulation(cfg)})",
        *_common_lines(cfg),
        f"schedule:     {describe_schedule(cfg)}",
        f"cluster:      {describe_cluster(cfg.cluster)}",
        f"stages:       {cfg.stages} ({cfg.smem_bytes} bytes of shared memory: {sm90_smem_parts(cfg)})",
        f"raster:       {describe_raster(cfg)}{describe_block_order(cfg)}",
        f"threads:      {SM90_THREADS} (1 producer warpgroup + 2 consumer warpgroups)",
        f"launch:       {describe_launch(cfg)}",
    ]
    if cfg.stream_k:
        lines.append("stream-K:     the last partial wave of tiles cut into equal shares of k tiles; with fewer tiles "
                     "than SMs every tile in the same number of equal k parts (split-K); partial sums added in a "
                     "fixed order" + ("; the consumer warpgroups take alternate parts" if cfg.schedule == "pingpong"
                                      else ""))
    return "\n".join(lines)
