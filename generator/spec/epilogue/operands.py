"""The extra inputs of an epilogue: the operand kinds (KINDS, their shapes and lines, the per-block scales the
main loop reads), ``Operand``, the annotation objects ``Scalar``, ``ScalarTensor``, ``Row``, ``Col``,
``Matrix``, and the checks of an operand's name, dtype and order."""
from __future__ import annotations

import types
from dataclasses import dataclass

from ..types import OUTPUT_DTYPES, DType, Order, parse_dtype, parse_order
from .errors import EpilogueError


#: The K extent of one per-block scale (GEMMGEN_SCALE_BLOCK_K in templates/common/gemm_args.h, which the
#: kernels and the op's C++ checks read): A's scales are per row and 128-wide K block, B's per 128 x 128 block.
SCALE_BLOCK = 128


@dataclass(frozen=True)
class _Kind:
    """What the description knows of one operand kind."""

    shape: str                 # as the op takes it, in M, N, K of the call
    line: str                  # its line in a plan after "<name>: " (``Operand.describe``; {dtype}, {order})
    tag: str                   # its letters before the operand's name in kernel-name tags (``Epilogue.tag``)
    title: str | None = None   # its annotation ep.<title>; None: made by ``with_scales`` only
    fp32: bool = False         # always fp32: no dtype option
    main_loop: bool = False    # read by the kernel's main loop (per-block scales), never by the expression


_BLOCKS_A, _BLOCKS_B = f"(M, ceil(K/{SCALE_BLOCK}))", f"(ceil(N/{SCALE_BLOCK}), ceil(K/{SCALE_BLOCK}))"
# In this order: gemmgen::OperandKind (templates/torch/gemm_op.h) numbers the kinds by their index here.
_KINDS = {
    "scalar": _Kind("()", "runtime scalar (fp32)", "s", "Scalar", fp32=True),
    "row": _Kind("(M,)", "per-row vector (M,), {dtype}", "r", "Row"),
    "col": _Kind("(N,)", "per-column vector (N,), {dtype}", "c", "Col"),
    "matrix": _Kind("(M, N)", "matrix (M, N), {order}, {dtype}", "m", "Matrix"),
    "scalar_tensor": _Kind("(1,)", "one-element tensor (1,), fp32, read on the device", "t", "ScalarTensor",
                           fp32=True),
    "row_blocks": _Kind(_BLOCKS_A, f"per-block scales of A {_BLOCKS_A}, fp32, row-major (main loop)", "rb",
                        fp32=True, main_loop=True),
    "col_blocks": _Kind(_BLOCKS_B, f"per-block scales of B {_BLOCKS_B}, fp32, row-major (main loop)", "cb",
                        fp32=True, main_loop=True),
}
KINDS = tuple(_KINDS)
#: kind -> the operand's shape as the op takes it (M, N, K of the call).
SHAPES = types.MappingProxyType({kind: k.shape for kind, k in _KINDS.items()})
#: Kinds the kernel's main loop reads (per-block scales of A and B, applied to each K block's partial
#: product), never the epilogue expression: it may not reference them, and they need not appear in it.
MAINLOOP_KINDS = tuple(kind for kind, k in _KINDS.items() if k.main_loop)
#: The kinds a user annotates with (ep.<title>).
_KIND_TITLE = {kind: k.title for kind, k in _KINDS.items() if k.title is not None}

#: Names an operand may not take: the op's own arguments (A, B, out) and the names the description
#: itself prints for the accumulator and the two outputs (acc, D, aux).
RESERVED_NAMES = ("A", "B", "out", "acc", "D", "aux")


def _check_name(name: object) -> str:
    # Operand names become C++ identifiers, kernel-name tokens and keyword names of the op: plain ASCII.
    if not isinstance(name, str) or not name.isascii() or not name.isidentifier():
        raise EpilogueError(f"operand name {name!r} is not an ASCII identifier")
    if name in RESERVED_NAMES:
        what = "the op's own argument" if name in ("A", "B", "out") else "a name the epilogue itself uses"
        raise EpilogueError(f"operand name {name!r} is {what} (reserved: {', '.join(RESERVED_NAMES)}); rename it")
    return name


def _order(value: object, what: str) -> Order:
    try:
        return parse_order(value, what=what)
    except ValueError as err:
        raise EpilogueError(str(err)) from None


def _operand_dtype(value: object, name: str) -> DType | None:
    if value is None:
        return None
    try:
        return parse_dtype(value, what=f"dtype of {name}", allowed=OUTPUT_DTYPES)
    except ValueError as err:
        raise EpilogueError(str(err)) from None


@dataclass(frozen=True)
class Operand:
    """One extra input of the epilogue. ``dtype`` None means "the GEMM's output dtype" (see Epilogue.resolved);
    scalars, scalar tensors and per-block scales are always fp32; only a matrix has an order (row-major by
    default)."""

    name: str
    kind: str  # one of KINDS
    dtype: DType | None = None
    order: Order | None = None

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.kind not in KINDS:
            raise EpilogueError(f"operand kind {self.kind!r} is not one of {', '.join(KINDS)}")
        dtype, order = _operand_dtype(self.dtype, self.name), self.order
        if _KINDS[self.kind].fp32 and dtype not in (None, DType.fp32):
            raise EpilogueError(f"{self.kind} operand {self.name!r} is fp32; it cannot be {dtype.value}")
        if _KINDS[self.kind].fp32:
            dtype = DType.fp32
        if self.kind == "matrix":
            order = _order(order if order is not None else "row", f"order of {self.name}")
        elif order is not None:
            raise EpilogueError(f"operand {self.name!r} is a {self.kind}: only a matrix has a storage order")
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "order", order)

    @property
    def shape(self) -> str:
        return SHAPES[self.kind]

    def describe(self) -> str:
        """One line for a plan, e.g. ``bias: per-column vector (N,), bf16``."""
        dtype = self.dtype.value if self.dtype is not None else "output dtype"
        order = "row-major" if self.order is Order.row else "column-major"
        return f"{self.name}: " + _KINDS[self.kind].line.format(dtype=dtype, order=order)


@dataclass(frozen=True)
class OperandKind:
    """The annotation objects ``Scalar``, ``ScalarTensor``, ``Row``, ``Col``, ``Matrix``; call one for options:
    ``Matrix(dtype="fp32", order="col")``, ``Col(dtype="bf16")``."""

    kind: str
    dtype: DType | None = None
    order: Order | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KIND_TITLE:
            raise EpilogueError(f"operand annotation kind {self.kind!r} is not one of {', '.join(_KIND_TITLE)}")

    def __call__(self, *, dtype: object = None, order: object = None) -> OperandKind:
        title = f"ep.{_KIND_TITLE[self.kind]}"
        if _KINDS[self.kind].fp32 and (dtype is not None or order is not None):
            raise EpilogueError(f"{title} takes no options: it is always fp32")
        if order is not None and self.kind != "matrix":
            raise EpilogueError(f"{title} has no order: only ep.Matrix takes order='row' or 'col'")
        new_order = _order(order, f"{title} order") if order is not None else self.order
        new_dtype = _operand_dtype(dtype, title) if dtype is not None else self.dtype
        return OperandKind(self.kind, new_dtype, new_order)

    def operand(self, name: str) -> Operand:
        return Operand(name, self.kind, self.dtype, self.order)

    def __repr__(self) -> str:
        options = [f"dtype={self.dtype.value!r}"] if self.dtype is not None else []
        if self.order is not None and self.order is not Order.row:
            options.append(f"order={self.order.value!r}")
        return f"ep.{_KIND_TITLE[self.kind]}" + (f"({', '.join(options)})" if options else "")


Scalar = OperandKind("scalar")
ScalarTensor = OperandKind("scalar_tensor")
Row = OperandKind("row")
Col = OperandKind("col")
Matrix = OperandKind("matrix", order=Order.row)
