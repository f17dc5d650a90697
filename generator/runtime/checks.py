"""Argument checks shared by the op, its autograd formula and the JIT runtime's registration: storage
orders, leading dimensions, and the advice a refusal gives (the C++ checks in templates/torch/gemm_op.h
say the same sentences)."""
from __future__ import annotations

import torch

from ..spec.types import DType, Order
from . import grouped_formula
# The group ends' check and the 16-byte rule of grouped calls live in grouped_formula (torch only), which emitted
# packages carry too: one copy of each for the op, its backward and the packages.
from .grouped_formula import FAST_ALIGN_BYTES, batch_stride, check_group_ends  # noqa: F401  (re-exported)

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
    last two dimensions), or None if it is not stored so (``grouped_formula.leading_dim``).

    A dimension of size 1 has no meaningful stride; its leading dimension is then the other size,
    which keeps the 16-byte alignment test honest for vectors.
    """
    return grouped_formula.leading_dim(t, order is Order.row)


def other_layout(blas: str, operand: str) -> str:
    """The two-letter layout with one operand's letter flipped."""
    flip = {"t": "n", "n": "t"}
    return flip[blas[0]] + blas[1] if operand == "A" else blas[0] + flip[blas[1]]


# -- grouped calls (GemmOp.grouped: a mixture of experts' rows, templates/torch/gemm_op.h says the same) -----------

def grouped_alignment_refusal(what: str, t: torch.Tensor, order: Order, ld: int, stride: int) -> str | None:
    """Why a grouped call's A or B, stored in ``order``, breaks the 16-byte rule of the grouped kernel's TMA loads
    (base address, leading dimension, B's stride between its matrices), with the fix; None if it keeps it
    (``grouped_formula.alignment_refusal``). ``ld`` and ``stride``: the launch's (``stride`` 0 for A, and for a B of
    one matrix)."""
    return grouped_formula.alignment_refusal(what, t, order is Order.row, ld, stride)


def check_group_counts(counts: list[int], slab: int) -> None:
    """The values of a masked call's counts (read on the host): each group's valid rows, in [0, max_m]."""
    for g, count in enumerate(counts):
        if not 0 <= count <= slab:
            raise ValueError(f"counts[{g}] = {count} is outside [0, {slab}]: each count is the number of valid rows "
                             f"at the top of its group's slab of A (E, max_m={slab}, K)")
