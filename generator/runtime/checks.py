"""Argument checks shared by the op, its autograd formula and the JIT runtime's registration: storage
orders, leading dimensions, and the advice a refusal gives (the C++ checks in templates/torch/gemm_op.h
say the same sentences)."""
from __future__ import annotations

import torch

from ..spec.types import DType, Order

TORCH_DTYPES = {DType.fp16: torch.float16, DType.bf16: torch.bfloat16, DType.fp32: torch.float32,
                DType.tf32: torch.float32,   # tf32: fp32 tensors, multiplied in tf32
                DType.e4m3: torch.float8_e4m3fn, DType.e5m2: torch.float8_e5m2, DType.int8: torch.int8,
                DType.int32: torch.int32}
INT32_MAX = 2**31 - 1


def order_of(t: torch.Tensor) -> str:
    """The storage order of a matrix, or of each matrix of a 3-D tensor (its last two dimensions)."""
    if t.dim() in (2, 3) and t.stride(-1) == 1:
        return "row-major"
    if t.dim() in (2, 3) and t.stride(-2) == 1:
        return "column-major"
    return "neither row- nor column-major"


def leading_dim(t: torch.Tensor, order: Order) -> int | None:
    """The leading dimension of a 2-D tensor stored in ``order`` (of a 3-D one: of each of its matrices, the
    last two dimensions), or None if it is not stored so.

    A dimension of size 1 has no meaningful stride; its leading dimension is then the other size,
    which keeps the 16-byte alignment test honest for vectors.
    """
    rows, cols = t.shape[-2:]
    if order is Order.row:
        inner_ok = cols <= 1 or t.stride(-1) == 1
        ld = t.stride(-2) if rows > 1 else max(cols, 1)
        return ld if inner_ok and ld >= max(cols, 1) else None
    inner_ok = rows <= 1 or t.stride(-2) == 1
    ld = t.stride(-1) if cols > 1 else max(rows, 1)
    return ld if inner_ok and ld >= max(rows, 1) else None


def batch_stride(t: torch.Tensor) -> int:
    """The elements between the matrices of a 3-D tensor (GemmArgs' batch strides): 0 for a 2-D tensor or a
    batch of one, whose one matrix every problem reads (or writes)."""
    return t.stride(0) if t.dim() == 3 and t.shape[0] > 1 else 0


def other_layout(blas: str, operand: str) -> str:
    """The two-letter layout with one operand's letter flipped."""
    flip = {"t": "n", "n": "t"}
    return flip[blas[0]] + blas[1] if operand == "A" else blas[0] + flip[blas[1]]


# -- grouped calls (GemmOp.grouped: a mixture of experts' rows, templates/torch/gemm_op.h says the same) -----------

#: The 16-byte rule of the kernels' TMA loads (kFastAlignBytes, templates/common/alignment.cuh).
FAST_ALIGN_BYTES = 16


def check_group_ends(ends: list[int], rows: int) -> None:
    """The values of a grouped call's offsets (read on the host): nondecreasing group ends from 0, the last one at
    A's last row."""
    previous = 0
    for g, end in enumerate(ends):
        if end < previous:
            if g == 0:
                raise ValueError(f"offsets must be nondecreasing group ends (cumulative row counts) from 0: "
                                 f"offsets[0] = {end} < 0")
            raise ValueError(f"offsets must be nondecreasing group ends (cumulative row counts): offsets[{g}] = "
                             f"{end} < offsets[{g - 1}] = {previous}")
        previous = end
    if ends and ends[-1] != rows:
        raise ValueError(f"offsets[-1] = {ends[-1]} but A has {rows} rows: the last group must end at A's last row")


def _aligned_copy(what: str, order: Order, dim: int) -> str:
    """A copy of a grouped call's A (2-D) or B (3-D) in ``order`` at a fresh, 16-byte aligned address."""
    fresh = ".clone(memory_format=torch.contiguous_format)"
    if order is Order.row:
        return f"{what}{fresh}"
    swap = ".t()" if dim == 2 else ".transpose(1, 2)"
    return f"{what}{swap}{fresh}{swap}"


def _padded_view(what: str, order: Order, t: torch.Tensor, multiple: int) -> str:
    """A view of a padded buffer holding a grouped call's A (M, K) or B (E, K, N) in ``order``, whose leading
    dimension is a multiple of ``multiple`` elements."""
    def up(size: int) -> int:
        return -(-max(size, 1) // multiple) * multiple

    like = f"dtype={t.dtype}, device='{t.device}'"
    rows, cols = t.shape[-2:]
    batch = f"{t.shape[0]}, " if t.dim() == 3 else ""
    lead = ":, " if t.dim() == 3 else ""
    if order is Order.row:
        return f"torch.empty({batch}{rows}, {up(cols)}, {like})[{lead}:, :{cols}]"
    swap = ".t()" if t.dim() == 2 else ".transpose(1, 2)"
    return f"torch.empty({batch}{cols}, {up(rows)}, {like})[{lead}:, :{rows}]{swap}"


def grouped_alignment_refusal(what: str, t: torch.Tensor, order: Order, ld: int, stride: int) -> str | None:
    """Why a grouped call's A or B breaks the 16-byte rule of the grouped kernel's TMA loads (base address, leading
    dimension, B's stride between its matrices: the library's choose_grouped_path, templates/common/launch.cuh),
    with the fix; None if it keeps it. ``ld`` and ``stride``: the launch's (``stride`` 0 for A, and for a B of one
    matrix)."""
    size = t.element_size()
    address = t.data_ptr()
    if address % FAST_ALIGN_BYTES:
        detail = f"its base address is {address % FAST_ALIGN_BYTES} bytes past a multiple of 16"
        fix = f"pass a copy, {_aligned_copy(what, order, t.dim())}"
    elif ld * size % FAST_ALIGN_BYTES:
        multiple = FAST_ALIGN_BYTES // size
        detail = f"its leading dimension is {ld} elements ({ld * size} bytes)"
        fix = (f"make its leading dimension a multiple of {multiple} elements: pass a view of a padded buffer, e.g. "
               f"{_padded_view(what, order, t, multiple)}")
    elif stride * size % FAST_ALIGN_BYTES:
        detail = f"its matrices are {stride} elements ({stride * size} bytes) apart"
        fix = f"pass a copy, {_aligned_copy(what, order, t.dim())}"
    else:
        return None
    return (f"{what} breaks the 16-byte rule of grouped calls: {detail}; the grouped kernel loads A and B by TMA, "
            f"which needs the base address, the leading dimension and the stride between B's matrices to be "
            f"multiples of 16 bytes: {fix}")
