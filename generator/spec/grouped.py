"""Which plans take which form of grouped call, and why not, with the fix: the refusals the op checks
(generator/runtime/op_checks.py), its C++ twin (templates/torch/gemm_op.h), the backward formulas and emitted packages
say in the same words. A form a plan refuses has no kernel for it: the rules follow the sm90 templates' walks
(templates/sm90/gemm_kernel.cuh: grouped rows, a list of problems, groups along K)."""
from __future__ import annotations

from .config import KernelConfig, quantizes_out, reads_a_into_registers, transposes_in_smem
from .epilogue import IDENTITY, Epilogue, with_scales
from .types import Order


#: Why an op with a fused epilogue takes no grouped call (GemmOp.grouped; such an op has no .grouped overload).
GROUPED_EPILOGUE_REFUSAL = ("grouped calls take plans without a fused epilogue: plan without epilogue=, activation=, "
                            "bias=, alpha=, beta= and scale= (and apply the epilogue to D with torch); fp8 plans "
                            "with scale='block' or scale='row' alone take grouped calls of rows with their scales, "
                            "op.grouped(A, B, offsets, scale_a, scale_b)")

#: The epilogue of an fp8 plan with DeepSeek's per-block scales and nothing else: the scales are applied in the main
#: loop, per group (templates/sm90/gemm_kernel.cuh Kernel::block_scales).
BLOCK_SCALED = with_scales(IDENTITY, "block")
#: The epilogue of an fp8 plan with per-row scales and nothing else (torch._scaled_grouped_mm's rowwise form):
#: scale_a per row of A (every group's rows), scale_b per column of each group's B, (E, N), which the kernel reads at
#: the tile's group (reads_cols_per_group: Epilogue::kColsPerGroup in templates/common/epilogue_functor.cuh.j2).
ROW_SCALED = with_scales(IDENTITY, "row")


#: The epilogue of an fp8 plan with one scale per operand and nothing else: no grouped kernel of its own (a per-tensor
#: scale is a per-row one of equal values: grouped_epilogue_refusal names the per-row plan and the expanded scales).
TENSOR_SCALED = with_scales(IDENTITY, "tensor")


def grouped_epilogue_refusal(cfg: KernelConfig) -> str:
    """Why an op with a fused epilogue (not the scaled grouped ones) takes no grouped call, with the fix: for an fp8
    plan with per-tensor scales alone, the per-row plan and the scales expanded to it; else GROUPED_EPILOGUE_REFUSAL."""
    if cfg.epilogue == TENSOR_SCALED:
        return ("grouped calls take an fp8 plan's scales per row or per block, not per tensor; a per-tensor scale is a "
                "per-row one of equal values: plan scale='row' and call op.grouped(A, B, offsets, "
                "scale_a.expand(A.shape[0]).contiguous(), scale_b.expand(E, N).contiguous()) (a scale per expert's "
                "weight, scale_b of shape (E,): scale_b[:, None].expand(E, N).contiguous())")
    return GROUPED_EPILOGUE_REFUSAL


#: The tallest tile whose kernel walks grouped rows with per-block scales (templates/sm90/gemm.cu.j2 kWalksGroups).
SCALED_GROUPS_MAX_BLOCK_M = 128


def takes_scaled_groups(cfg: KernelConfig) -> bool:
    """Whether ``cfg``'s op has the scaled grouped overloads (``.grouped_scaled``, ``.masked_scaled``: grouped calls
    of rows with their scales, ``op.grouped(A, B, offsets, scale_a, scale_b)``): an fp8 plan with scale='block' or
    scale='row' and no other epilogue. Whether its kernel takes them is ``grouped_refusal``'s to say."""
    return cfg.epilogue in (BLOCK_SCALED, ROW_SCALED)


def reads_cols_per_group(ep: Epilogue) -> bool:
    """Whether a grouped call of an epilogue ``ep`` reads its per-column operands per group (each group's N values
    after the previous group's): per-row scales, whose scale_b is (E, N)."""
    return ep == ROW_SCALED


def _grouped_plan_refusal(cfg: KernelConfig, stream_k_why: str) -> str | None:
    """Why ``cfg``'s kernel library takes no grouped call of either form, with the fix; None where it may. Only the
    sm90 family's persistent schedules (cooperative, pingpong) walk groups, not with stream-K (``stream_k_why``:
    the form's reason), and only with the identity epilogue."""
    if not cfg.epilogue.is_identity and not takes_scaled_groups(cfg):
        return GROUPED_EPILOGUE_REFUSAL
    if quantizes_out(cfg):
        return (f"grouped calls do not quantize D (out_dtype={cfg.out_dtype.value!r}: its scales are one matrix's): "
                "plan out_dtype='bf16' and quantize the result, generator.quantize(D, scale='block')")
    if cfg.family != "sm90":
        fix = "plan with arch=90" if cfg.arch != 90 else "plan with family='sm90' (or family=None)"
        return f"grouped calls run on the sm90 family's persistent kernels; this plan is {cfg.family}: {fix}"
    if any(transposes_in_smem(cfg)) or reads_a_into_registers(cfg):
        return (f"grouped calls with tf32 inputs take layout 'tn' only (the in-place transposes of M/N-major tiles "
                f"and the register reads of an M-major A are not enabled under the groups' walks); this plan is "
                f"layout {cfg.layout.blas!r}: plan with layout='tn' and pass A row-major, B column-major")
    if cfg.schedule not in ("cooperative", "pingpong"):
        return (f"grouped calls run on the persistent schedules; this plan's schedule is {cfg.schedule!r} (one tile "
                "per block, its grid sized on the host): plan with schedule='cooperative' or 'pingpong'")
    if cfg.stream_k:
        return (f"grouped calls do not split tiles by stream-K ({stream_k_why}); this config has stream_k=True: use "
                "one without it, schedule='cooperative' or 'pingpong'")
    return None


def grouped_refusal(cfg: KernelConfig) -> str | None:
    """Why ``cfg``'s kernel library takes no grouped call (a mixture of experts' rows, GemmArgs' group_ends), with
    the fix; None where it does. Only the sm90 family's persistent schedules (cooperative, pingpong) walk groups,
    and not with stream-K: the ws schedule's grid (one cluster per tile) and stream-K's shares are sized on the host
    from the tile count, which the groups' sizes (device data) do not give (templates/sm90/gemm.cu.j2,
    kWalksGroups). The op refuses such a call before any launch, in these words (generator/runtime/op_checks.py and
    templates/torch/gemm_op.h)."""
    reason = _grouped_plan_refusal(cfg, "its shares are cut on the host from the tile count, which the groups' sizes "
                                        "on the device do not give")
    if reason is None and takes_scaled_groups(cfg) and cfg.tile[0] > SCALED_GROUPS_MAX_BLOCK_M:
        bm, bn, bk = cfg.tile
        return (f"grouped calls with scales take tiles of at most {SCALED_GROUPS_MAX_BLOCK_M} rows (a {bm}-row tile's "
                f"consumers have no registers left for the groups' walk beside per-block scales; per-row scales were "
                f"not built taller); this plan's tile is {bm}x{bn}x{bk}: plan with "
                f"tile_shape=({SCALED_GROUPS_MAX_BLOCK_M}, {bn}, {bk})")
    if reason is None and not cfg.layout.a_k_major:
        other = "t" + cfg.layout.blas[1]
        return ("grouped calls take A row-major (K contiguous): a group may start at any row, and TMA cannot start a "
                f"load at such a row along A's contiguous dimension; this plan's A is column-major: plan with "
                f"layout={other!r} and pass A row-major (A.contiguous())")
    return reason


def grouped_list_refusal(cfg: KernelConfig) -> str | None:
    """Why ``cfg``'s kernel library takes no list call (CUTLASS's GroupedGemm: op([A0, A1, ...], [B0, B1, ...]),
    GemmArgs' list), with the fix; None where it does. ``grouped_refusal``'s rules but A's order: each problem's
    tensor maps start at its own matrices, so a column-major A is taken too. The op refuses such a call before any
    launch, in these words (generator/runtime/op_checks.py and templates/torch/gemm_op.h). Per-block scales are one
    problem's: an fp8 plan with scale='block' takes no list call."""
    if not cfg.epilogue.is_identity:
        return GROUPED_EPILOGUE_REFUSAL
    return _grouped_plan_refusal(cfg, "the list's walk takes each problem's tiles whole")


def grouped_k_refusal(cfg: KernelConfig) -> str | None:
    """Why ``cfg``'s kernel library takes no grouped call along K (``op.grouped(A, B, offsets)`` with B 2-D), with the
    fix; None where it does: the list kernel (``grouped_list_refusal``) with A column-major and B row-major, K the
    outer dimension of both. A group starts at any k, and a TMA load whose start along an operand's contiguous
    dimension is no multiple of 16 bytes faults (an illegal instruction on the H200). The op refuses such a call
    before any launch, in these words (generator/runtime/op_checks.py and templates/torch/gemm_op.h)."""
    reason = grouped_list_refusal(cfg)
    if reason is not None:
        return reason
    a_row, b_row = cfg.layout.a is Order.row, cfg.layout.b is Order.row
    if not a_row and b_row:
        return None
    which = " and ".join(part for part, wrong in (("A is row-major", a_row), ("B is column-major", not b_row)) if wrong)
    return ("grouped calls along K take A column-major and B row-major (M and N contiguous): a group may start at any "
            f"k, which a TMA load cannot start at along an operand's contiguous dimension; this plan's {which}: plan "
            "with layout='nt' (for a weight gradient dW = X.t() @ dY: A = X.t(), B = dY)")
