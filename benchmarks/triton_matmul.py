"""The reference Triton kernel of our benchmark table: a blocked matmul with grouped program ordering,
fp32 accumulation and a small autotuned set of block shapes, in the manner of Triton's matmul tutorial.

The same kernel is also built a second time with Triton's mma.sync path (``DISABLE_MMA_V3=1``: on Hopper
``tl.dot`` then lowers to mma.sync, ldmatrix and cp.async instead of wgmma and TMA). That is the
reference for our sm80 family on Hopper: what a mature compiler's mma.sync GEMM reaches on the same GPU.
"""
from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

AUTOTUNE_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=4),
]


# The mma.sync build also tries the block shapes that suit mma.sync (BK = 32, four stages, 8 warps).
MMA_SYNC_CONFIGS = AUTOTUNE_CONFIGS + [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=8),
    triton.Config({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=8),
]
DISABLE_WGMMA_ENV = "DISABLE_MMA_V3"  # read by Triton's AccelerateMatmul pass; part of its compile cache key


def _matmul_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(axis=0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    group = pid // per_group
    first_m = group * GROUP_M
    rows = min(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % rows
    tile_n = (pid % per_group) // rows

    offs_m = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c = acc.to(c_ptr.dtype.element_ty)
    rows_c = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols_c = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + rows_c[:, None] * stride_cm + cols_c[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(rows_c[:, None] < M) & (cols_c[None, :] < N))


# Two JIT objects of one body: each keeps its own in-memory kernel cache, so the mma.sync build is never
# served the wgmma kernel (or the reverse) whatever the environment at a later call.
_matmul_kernel = triton.autotune(configs=AUTOTUNE_CONFIGS, key=["M", "N", "K"])(triton.jit(_matmul_body))
_matmul_kernel_mma_sync = triton.autotune(configs=MMA_SYNC_CONFIGS, key=["M", "N", "K"])(triton.jit(_matmul_body))


@contextlib.contextmanager
def _wgmma_disabled():
    before = os.environ.get(DISABLE_WGMMA_ENV)
    os.environ[DISABLE_WGMMA_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[DISABLE_WGMMA_ENV]
        else:
            os.environ[DISABLE_WGMMA_ENV] = before


def triton_matmul(a: torch.Tensor, b: torch.Tensor, mma_sync: bool = False) -> torch.Tensor:
    """A @ B by the tutorial kernel; ``mma_sync=True`` builds it with mma.sync instead of wgmma on Hopper."""
    m, k = a.shape
    _, n = b.shape
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    kernel = _matmul_kernel_mma_sync if mma_sync else _matmul_kernel
    # The variable matters only while a call compiles (autotuning a new shape); it is set around every
    # mma.sync call because which call compiles is the autotuner's business.
    with _wgmma_disabled() if mma_sync else contextlib.nullcontext():
        kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    return c


def mma_sync_build_instructions() -> set[str]:
    """The tensor-core instructions ("wgmma", "mma.sync") in the PTX of every kernel the mma.sync build has
    made so far: the proof that its column ran mma.sync. Empty if this Triton keeps its caches elsewhere."""
    jit_fn = _matmul_kernel_mma_sync.fn
    found = set()
    for caches in getattr(jit_fn, "device_caches", {}).values():
        for compiled in caches[0].values():
            ptx = getattr(compiled, "asm", {}).get("ptx", "")
            found |= {name for name in ("wgmma", "mma.sync") if name in ptx}
    return found
