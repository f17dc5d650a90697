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
