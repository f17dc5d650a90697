"""The extra operands of a fused epilogue at the op: its schema, binding a call's arguments to them, and the
checks each gets before a launch (device, dtype, shape, strides), with errors that name the fix.

Operand i of the plan's epilogue goes to slot i of the launch arguments (templates/common/gemm_args.h): a
tensor's address (and a matrix's or per-block scales' leading dimension), or a scalar's value.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..spec.config import KernelConfig, second_output
from ..spec.epilogue import MAINLOOP_KINDS, SCALE_BLOCK, SCALE_NAMES, Epilogue, Operand
from ..spec.types import Order
from .checks import TORCH_DTYPES, leading_dim, order_of

#: kind -> the ranks a tensor operand may have (a scalar tensor: shape (1,) or ()).
_RANKS = {"row": (1,), "col": (1,), "matrix": (2,), "scalar_tensor": (0, 1), "row_blocks": (2,), "col_blocks": (2,)}


def scale_blocks(size: Any) -> Any:
    """ceil(size / SCALE_BLOCK): the number of per-block scales along a dimension (an int or a SymInt)."""
    return (size + SCALE_BLOCK - 1) // SCALE_BLOCK


def _block_shape(op: Operand, m: Any, n: Any, k: Any) -> tuple[Any, Any]:
    """The shape of ``op``'s per-block scales for an m x n x k call (row_blocks: A's, col_blocks: B's)."""
    return (m, scale_blocks(k)) if op.kind == "row_blocks" else (scale_blocks(n), scale_blocks(k))


def _block_shape_message(op: Operand, shape: tuple[int, ...], wanted: tuple[Any, ...]) -> str:
    whose = "A" if op.kind == "row_blocks" else "B"
    return (f"{op.name} has shape {shape}; per-block scales of {whose} are {op.shape} = {tuple(wanted)} for "
            "this call")


def _scalar_tensor_message(op: Operand, shape: tuple[int, ...]) -> str:
    return (f"{op.name} has shape {shape}; a per-tensor scale is one element, shape (1,) or (): pass a "
            "one-element fp32 tensor")


def schema_arguments(ep: Epilogue) -> str:
    """The operands' part of the op's schema, e.g. ", Tensor bias, float alpha"."""
    return "".join(f", {'float' if op.kind == 'scalar' else 'Tensor'} {op.name}" for op in ep.operands)


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
        raise TypeError(f"{op.name} must be a torch.Tensor of shape {op.shape}, got {type(value).__name__}")


def _declarable(op: Operand, dtype: torch.dtype) -> bool:
    """Whether declaring the operand with ``dtype`` is a fix: only for a dtype an operand may have (fp16, bf16,
    fp32; not float64, say), of an operand whose dtype the user chose (not a scale's, always fp32)."""
    return (dtype in (torch.float16, torch.bfloat16, torch.float32) and op.kind in ("row", "col", "matrix")
            and op.name not in SCALE_NAMES)   # made by with_scales: fp32 by the plan, not by a declaration


def check_static(op: Operand, value: object, A: torch.Tensor) -> None:
    """What holds whatever the sizes: type, rank, dtype, device (safe under torch.compile's fake tensors)."""
    check_type(op, value)
    if op.kind == "scalar":
        return
    ranks = _RANKS[op.kind]
    if value.dim() not in ranks:
        if op.kind == "scalar_tensor":
            raise ValueError(_scalar_tensor_message(op, tuple(value.shape)))
        raise ValueError(f"{op.name} must be {ranks[0]}-D {op.shape}; got shape {tuple(value.shape)}")
    want = TORCH_DTYPES[op.dtype]
    if value.dtype != want:
        declare = (f" or declare it with dtype={str(value.dtype).removeprefix('torch.')!r}"
                   if _declarable(op, value.dtype) else "")
        raise TypeError(f"{op.name} is {value.dtype}; this plan's epilogue reads it as {op.dtype.value}: pass "
                        f"{op.name}.to({want}){declare}")
    # Exactly A's device. (A meta operand used to pass beside real A and B: the launch then read its
    # data_ptr(), 0, as the operand's address. Shape inference on meta tensors has A on meta too.)
    if value.device != A.device:
        raise ValueError(f"{op.name} is on {value.device} but A and B on {A.device}: pass {op.name}.to('{A.device}')")


def check_sizes_symbolic(op: Operand, value: object, m: object, n: object, k: object) -> None:
    """A vector's length and a matrix's or per-block scales' shape as ``torch._check``s: under torch.compile a
    size that may be symbolic (a dynamic M) is recorded as a run-time assertion instead of specializing the
    graph, so a wrong operand is refused at tracing when the sizes are static, and when the compiled graph runs
    otherwise. (A scalar tensor's one element: sizes 0 and 1 are never symbolic.)"""
    if op.kind == "scalar" or not isinstance(value, torch.Tensor):
        return
    shape = tuple(value.shape)
    if op.kind == "scalar_tensor":
        torch._check_with(ValueError, value.numel() == 1, lambda: _scalar_tensor_message(op, shape))
        return
    wanted = (_block_shape(op, m, n, k) if op.kind in MAINLOOP_KINDS else
              {"row": (m,), "col": (n,), "matrix": (m, n)}[op.kind])
    for got, want in zip(value.shape, wanted):
        torch._check_with(ValueError, got == want, lambda: (
            _block_shape_message(op, shape, wanted) if op.kind in MAINLOOP_KINDS else
            f"{op.name} has shape {shape}; it must be {op.shape} = {tuple(wanted)} for this call"))


def _check_block_scales(op: Operand, t: torch.Tensor, m: int, n: int, k: int) -> int:
    """Per-block scales' shape and row-major storage; returns their leading dimension."""
    wanted = _block_shape(op, m, n, k)
    if tuple(t.shape) != wanted:
        raise ValueError(_block_shape_message(op, tuple(t.shape), wanted))
    ld = leading_dim(t, Order.row)
    if ld is None:
        raise ValueError(f"{op.name} has strides {tuple(t.stride())} ({order_of(t)}); the kernel reads per-block "
                         f"scales row-major: pass {op.name}.contiguous()")
    return ld


def check_operand(op: Operand, value: object, A: torch.Tensor, m: int, n: int, k: int) -> tuple[int, int, float]:
    """Validate one operand for a launch; returns its slot's (address, leading dimension, scalar value)."""
    check_static(op, value, A)
    if op.kind == "scalar":
        return 0, 0, float(value)  # type: ignore[arg-type]
    t: torch.Tensor = value  # type: ignore[assignment]
    if op.kind == "scalar_tensor":   # any strides: the kernel reads its one element
        if t.numel() != 1:
            raise ValueError(_scalar_tensor_message(op, tuple(t.shape)))
        return t.data_ptr(), 0, 0.0
    if op.kind in MAINLOOP_KINDS:
        return t.data_ptr(), _check_block_scales(op, t, m, n, k), 0.0
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


def check_operands(ep: Epilogue, values: Sequence[Any], A: torch.Tensor, m: int, n: int, k: int
                   ) -> list[tuple[int, int, float]]:
    return [check_operand(op, v, A, m, n, k) for op, v in zip(ep.operands, values)]


def check_grouped_scale_b(op: Operand, value: object, A: torch.Tensor, groups: int, n: int, k: int) -> tuple[int, int, float]:
    """A scaled grouped call's scale_b (``op``, the plan's col_blocks or col operand): one (ceil(N/128), ceil(K/128))
    matrix of 128 x 128 block scales per group, (E, ceil(N/128), ceil(K/128)), or one vector of N per-column scales per
    group, (E, N); fp32, contiguous, on A's device. Returns its slot (the kernel reads group g's block scales at the
    address + g * ceil(N/128) * ceil(K/128), ceil(K/128) the slot's leading dimension; its per-column ones at the
    address + g * N: Epilogue::kColsPerGroup). templates/torch/gemm_op.h's check_grouped_scales and
    check_grouped_row_scales say the same, in this order."""
    per_col = op.kind == "col"
    if not isinstance(value, torch.Tensor):
        shape = "(E, N)" if per_col else "(E, ceil(N/128), ceil(K/128))"
        raise TypeError(f"{op.name} must be a torch.Tensor of shape {shape}, got {type(value).__name__}")
    wanted = (groups, n) if per_col else (groups, -(-n // SCALE_BLOCK), -(-k // SCALE_BLOCK))
    if tuple(value.shape) != wanted:
        layout = ("per-column scales of B are one vector of N per group: (E, N)" if per_col else
                  "per-block scales of B are one (ceil(N/128), ceil(K/128)) matrix per group: (E, ceil(N/128), "
                  "ceil(K/128))")
        quantized = "scale='row'" if per_col else "scale='block', block=(128, 128)"
        raise ValueError(f"{op.name} has shape {tuple(value.shape)}; a grouped call's {layout} = {wanted} "
                         f"(torch.stack of each expert's quantize(W[e], {quantized}) scales)")
    want = TORCH_DTYPES[op.dtype]
    if value.dtype != want:
        raise TypeError(f"{op.name} is {value.dtype}; this plan's epilogue reads it as {op.dtype.value}: pass "
                        f"{op.name}.to({want})")
    if value.device != A.device:
        raise ValueError(f"{op.name} is on {value.device} but A and B on {A.device}: pass {op.name}.to('{A.device}')")
    if not value.is_contiguous():
        raise ValueError(f"{op.name} has strides {tuple(value.stride())}; the kernel reads each group's scales of B "
                         f"back to back: pass {op.name}.contiguous()")
    return value.data_ptr(), 0 if per_col else wanted[2], 0.0


#: The fix every refusal of ``check_batchable`` starts with.
_PER_PROBLEM = "call the op once per problem with 2-D tensors"


def check_batchable(cfg: KernelConfig) -> None:
    """A batched call (3-D A or B) gives every problem the same epilogue operands (templates/common/gemm_args.h):
    scalars, one-element scales and vectors of length M or N serve them all, but a matrix operand or per-block
    scales are one problem's, and the second output (aux, or a quantized D's scales) has no batch stride. Refused
    before any operand's own check, in the operands' order, then the second output (templates/torch/gemm_op.h's
    check_batched_epilogue says the same)."""
    ep = cfg.epilogue
    for op in ep.operands:
        if op.kind == "matrix":
            raise ValueError(f"a batched call (3-D A or B) takes no matrix operand {op.name!r}: {_PER_PROBLEM}, "
                             "or plan without it")
        if op.kind in MAINLOOP_KINDS:
            raise ValueError(f"a batched call (3-D A or B) takes no per-block scales {op.name!r}: {_PER_PROBLEM}, "
                             "or plan with scale='tensor' or scale='row'")
    second = second_output(cfg)
    if second is not None:
        raise ValueError(f"a batched call (3-D A or B) cannot store the plan's second output ({second}): "
                         f"{_PER_PROBLEM}, or plan without it")


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
