"""The extra operands of a fused epilogue at the op: its schema, binding a call's arguments to them, and the
checks each gets before a launch (device, dtype, shape, strides), with errors that name the fix.

Operand i of the plan's epilogue goes to slot i of the launch arguments (templates/common/gemm_args.h): a
tensor's address (and a matrix's leading dimension), or a scalar's value.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..spec.epilogue import Epilogue, Operand
from ..spec.types import Order
from .checks import TORCH_DTYPES, leading_dim, order_of

_SHAPES = {"row": "(M,)", "col": "(N,)", "matrix": "(M, N)"}


def schema_arguments(ep: Epilogue) -> str:
    """The operands' part of the op's schema, e.g. ", Tensor bias, float alpha"."""
    return "".join(f", {'float' if op.kind == 'scalar' else 'Tensor'} {op.name}" for op in ep.operands)


def schema_returns(ep: Epilogue) -> str:
    return "(Tensor, Tensor)" if ep.aux is not None else "Tensor"


def signature(ep: Epilogue) -> str:
    """How a user calls the op, for messages: ``op(A, B, bias, C, alpha, beta)``."""
    return "op(" + ", ".join(["A", "B", *(op.name for op in ep.operands)]) + ")"


def bind(ep: Epilogue, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The operands' values in the plan's order, from positional (after A and B) and keyword arguments."""
    names = [op.name for op in ep.operands]
    if len(args) > len(names):
        raise TypeError(f"the op takes {2 + len(names)} operands, {signature(ep)}; got {2 + len(args)} positional")
    values = dict(zip(names, args))
    for name, value in kwargs.items():
        if name not in names:
            hint = f"its operands are {', '.join(names)}" if names else "its epilogue takes no operands"
            raise TypeError(f"the op has no operand {name!r}: {hint} ({signature(ep)})")
        if name in values:
            # With the signature, as the other binding errors: it shows which position the name took.
            raise TypeError(f"operand {name!r} given twice (positionally and by keyword): call {signature(ep)}")
        values[name] = value
    missing = [n for n in names if n not in values]
    if missing:
        raise TypeError(f"missing epilogue operand(s) {', '.join(missing)}: call {signature(ep)}")
    return tuple(values[n] for n in names)


def check_scalar(op: Operand, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.SymFloat, torch.SymInt)):
        raise TypeError(f"{op.name} is a runtime scalar of the epilogue: pass a Python number, got "
                        f"{type(value).__name__}" + (" (use float(t) for a one-element tensor)"
                                                     if isinstance(value, torch.Tensor) else ""))
    return value  # type: ignore[return-value]


def check_type(op: Operand, value: object) -> None:
    """A number for a scalar, a tensor for the rest: what ``GemmOp.__call__`` checks before dispatch, since the
    dispatcher would refuse a wrong type with a message about the schema (or turn a one-element tensor into a
    float). The rest of ``check_static`` is the kernels' (C++ and Python), whose messages are the same."""
    if op.kind == "scalar":
        check_scalar(op, value)
    elif not isinstance(value, torch.Tensor):
        raise TypeError(f"{op.name} must be a torch.Tensor of shape {_SHAPES[op.kind]}, got {type(value).__name__}")


def check_static(op: Operand, value: object, A: torch.Tensor) -> None:
    """What holds whatever the sizes: type, rank, dtype, device (safe under torch.compile's fake tensors)."""
    check_type(op, value)
    if op.kind == "scalar":
        return
    rank = 2 if op.kind == "matrix" else 1
    if value.dim() != rank:
        raise ValueError(f"{op.name} must be {rank}-D {_SHAPES[op.kind]}; got shape {tuple(value.shape)}")
    want = TORCH_DTYPES[op.dtype]
    if value.dtype != want:
        # Declaring the operand's dtype is a fix only for a dtype an operand may have (fp16, bf16, fp32):
        # not for float64, say.
        declare = (f" or declare it with dtype={str(value.dtype).removeprefix('torch.')!r}"
                   if value.dtype in TORCH_DTYPES.values() else "")
        raise TypeError(f"{op.name} is {value.dtype}; this plan's epilogue reads it as {op.dtype.value}: pass "
                        f"{op.name}.to({want}){declare}")
    # Exactly A's device. (A meta operand used to pass beside real A and B: the launch then read its
    # data_ptr(), 0, as the operand's address. Shape inference on meta tensors has A on meta too.)
    if value.device != A.device:
        raise ValueError(f"{op.name} is on {value.device} but A and B on {A.device}: pass {op.name}.to('{A.device}')")


def check_sizes_symbolic(op: Operand, value: object, m: object, n: object) -> None:
    """A vector's length and a matrix's shape as ``torch._check``s: under torch.compile a size that may be
    symbolic (a dynamic M) is recorded as a run-time assertion instead of specializing the graph, so a wrong
    operand is refused at tracing when the sizes are static, and when the compiled graph runs otherwise."""
    if op.kind == "scalar" or not isinstance(value, torch.Tensor):
        return
    wanted = {"row": (m,), "col": (n,), "matrix": (m, n)}[op.kind]
    for got, want in zip(value.shape, wanted):
        torch._check_with(ValueError, got == want, lambda: f"{op.name} has shape {tuple(value.shape)}; it must be "
                          f"{_SHAPES[op.kind]} = {tuple(wanted)} for this call")


def check_operand(op: Operand, value: object, A: torch.Tensor, m: int, n: int) -> tuple[int, int, float]:
    """Validate one operand for a launch; returns its slot's (address, leading dimension, scalar value)."""
    check_static(op, value, A)
    if op.kind == "scalar":
        return 0, 0, float(value)  # type: ignore[arg-type]
    t: torch.Tensor = value  # type: ignore[assignment]
    if op.kind in ("row", "col"):
        length = m if op.kind == "row" else n
        if t.shape[0] != length:
            what = "M (A's rows)" if op.kind == "row" else "N (B's columns)"
            raise ValueError(f"{op.name} has length {t.shape[0]}; a per-{op.kind} vector has one value per "
                             f"{'row' if op.kind == 'row' else 'column'} of D: length {what} = {length}")
        if length > 1 and t.stride(0) != 1:
            raise ValueError(f"{op.name} has stride {t.stride(0)}; the kernel reads vectors contiguous: pass "
                             f"{op.name}.contiguous()")
        return t.data_ptr(), 0, 0.0
    if tuple(t.shape) != (m, n):
        raise ValueError(f"{op.name} has shape {tuple(t.shape)}; it is an M x N operand of D: ({m}, {n})")
    ld = leading_dim(t, op.order)
    if ld is None:
        fix = f"{op.name}.contiguous()" if op.order is Order.row else f"{op.name}.t().contiguous().t()"
        other = Order.col if op.order is Order.row else Order.row
        # The other order is a fix only for a matrix stored in it (not for one in neither order).
        declare = f" or declare it ep.Matrix(order={other.value!r})" if leading_dim(t, other) is not None else ""
        raise ValueError(f"{op.name} has strides {tuple(t.stride())} ({order_of(t)}); this plan reads it "
                         f"{op.order.value}-major: pass {fix}{declare}")
    return t.data_ptr(), ld, 0.0


def check_operands(ep: Epilogue, values: Sequence[Any], A: torch.Tensor, m: int, n: int
                   ) -> list[tuple[int, int, float]]:
    return [check_operand(op, v, A, m, n) for op, v in zip(ep.operands, values)]


def check_out_aliasing(ep: Epilogue, values: Sequence[Any], out: torch.Tensor, d_order: Order,
                       A: torch.Tensor, B: torch.Tensor) -> None:
    """out may be a matrix operand itself (``D += A @ B`` in place): each element of the operand is read by
    the thread that writes the same element of D, before it writes it. Any other overlap is refused."""
    def span(t: torch.Tensor) -> tuple[int, int]:
        """The bytes [first, last + 1) that t's elements lie in (torch strides are never negative)."""
        last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
        return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()

    def overlaps(t: torch.Tensor) -> bool:
        # By address range, not by storage: slices of one buffer (an arena) that do not overlap are fine,
        # and two storages over the same memory (from_blob, DLPack) overlap. Interleaved rows of one
        # buffer count as an overlap: conservative, and cheap.
        if t.numel() == 0 or out.numel() == 0 or t.device != out.device:
            return False
        (first, end), (out_first, out_end) = span(t), span(out)
        return first < out_end and out_first < end

    for what, t in (("A", A), ("B", B)):
        if overlaps(t):
            raise ValueError(f"out shares memory with {what}: the kernel reads {what} while it writes D; pass a "
                             f"separate out")
    for op, value in zip(ep.operands, values):
        if op.kind == "scalar" or not overlaps(value):
            continue
        same = (op.kind == "matrix" and value.data_ptr() == out.data_ptr() and value.stride() == out.stride()
                and value.dtype == out.dtype and op.order is d_order)
        if not same:
            raise ValueError(f"out shares memory with {op.name} without being the same tensor: each element of D "
                             f"may overwrite an element of {op.name} that another thread still reads; pass out="
                             f"{op.name} itself (same strides and dtype) or a separate out")
