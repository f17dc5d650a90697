"""The fused epilogue: what a GEMM does to its fp32 accumulator before D is stored.

Users describe it with knobs (``from_knobs``) or with a Python function that ``trace`` runs on symbolic
stand-ins; both give one frozen, hashable ``Epilogue``: the extra operands (in the op's positional order)
and an expression DAG over the accumulator, those operands and constants. The user-facing documentation
is in ``generator/epilogue.py``; this module holds the machinery. No torch, and nothing of this package
but ``spec.types``.

Note: the module defines ``max``, ``min`` and ``abs`` (the epilogue functions), which shadow the builtins
for the code below; where a builtin is meant it is spelled ``builtins.max`` etc.
"""
from __future__ import annotations

import builtins
import dis
import hashlib
import inspect
import json
import math
import numbers
import os
import types
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

from .types import OUTPUT_DTYPES, DType, Order, parse_dtype, parse_order

__all__ = [
    "ACC", "ACTIVATIONS", "IDENTITY", "KINDS", "KNOB_NAMES", "MAINLOOP_KINDS", "OPS", "RESERVED_NAMES", "SCALE_BLOCK",
    "SCALE_MODES", "SCALE_NAMES", "SHAPES", "Col", "Epilogue", "EpilogueError", "Expr", "Matrix", "Operand",
    "OperandKind", "Row", "Scalar", "ScalarTensor", "Value", "abs", "activation_name", "clamp", "epilogue_from_json",
    "epilogue_to_json", "from_knobs", "gelu", "gelu_tanh", "leaky_relu", "max", "min", "relu", "sigmoid", "silu",
    "tanh", "trace", "with_scales",
]


class EpilogueError(ValueError):
    """An epilogue that cannot be described or generated; the message says why and how to fix it."""


class _Refusal(EpilogueError):
    """Raised while a traced function runs; ``trace`` prefixes the function's name and line."""


# -- operands ---------------------------------------------------------------------------------------

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

# -- the expression DAG -----------------------------------------------------------------------------

_UNARY = ("neg", "abs", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")
_BINARY = ("add", "sub", "mul", "div", "max", "min")
#: op -> number of args. leaky_relu is (x, const slope); clamp (x, lo, hi); clamp_min (x, lo); clamp_max (x, hi).
_ARITY = {"acc": 0, "operand": 0, "const": 0, **{op: 1 for op in _UNARY}, **{op: 2 for op in _BINARY},
          "leaky_relu": 2, "clamp": 3, "clamp_min": 2, "clamp_max": 2}
OPS = tuple(_ARITY)
_LEAVES = ("acc", "operand", "const")

# Larger expressions are refused: the canonical text expands shared nodes, and hashing recurses.
_MAX_TREE_NODES = 256


@dataclass(frozen=True)
class Expr:
    """A node of the epilogue expression. Leaves: ``acc``, ``operand`` (``name``), ``const`` (``value``).
    Equality is structural, so equal subexpressions are one node of the DAG."""

    op: str
    args: tuple[Expr, ...] = ()
    value: float | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.op not in _ARITY:
            raise EpilogueError(f"unknown epilogue op {self.op!r}; known: {', '.join(OPS)}")
        args = tuple(self.args)
        if len(args) != _ARITY[self.op] or not all(isinstance(a, Expr) for a in args):
            raise EpilogueError(f"op {self.op!r} takes {_ARITY[self.op]} expression argument(s), got {args!r}")
        object.__setattr__(self, "args", args)
        if (self.op == "const") != (self.value is not None) or (self.op == "operand") != (self.name is not None):
            raise EpilogueError(f"{self.op!r} node: only 'const' has a value and only 'operand' a name")
        if self.value is not None:
            # + 0.0 folds -0.0 into 0.0, so that equal values also print (and hash into digests) alike.
            object.__setattr__(self, "value", _finite(self.value) + 0.0)
        if self.op == "leaky_relu" and args[1].op != "const":
            raise EpilogueError("leaky_relu's slope must be a constant")

    @property
    def is_leaf(self) -> bool:
        return self.op in _LEAVES


ACC = Expr("acc")


def _finite(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _Refusal(f"{value!r} is not a number constant (bool constants are not supported either)")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise _Refusal(f"constant {value!r} is not finite; use ep.clamp with one side left out instead of inf")
    return number


def _walk(*roots: Expr | None) -> Iterator[Expr]:
    """Every distinct node object below the roots, children before parents, without recursion."""
    done: set[int] = set()
    for root in roots:
        stack = [root] if root is not None else []
        while stack:
            node = stack[-1]
            if id(node) in done:
                stack.pop()
                continue
            pending = [a for a in node.args if id(a) not in done]
            if pending:
                stack.extend(reversed(pending))
                continue
            stack.pop()
            done.add(id(node))
            yield node


def _tree_nodes(root: Expr) -> int:
    """The node count with shared nodes counted at each use (the size of the canonical text)."""
    size: dict[int, int] = {}
    for node in _walk(root):
        size[id(node)] = 1 + sum(size[id(a)] for a in node.args)
    return size[id(root)]


def _uses(root: Expr) -> tuple[bool, set[str]]:
    """(does the expression read the accumulator, the operand names it reads)."""
    nodes = list(_walk(root))
    return any(n.op == "acc" for n in nodes), {n.name for n in nodes if n.op == "operand"}


# Ops whose derivative jumps (Epilogue.smooth_in_acc).
_KINKED = frozenset({"relu", "leaky_relu", "abs", "max", "min", "clamp", "clamp_min", "clamp_max"})


def _affine_in_acc(root: Expr, scalars: set[str]) -> bool:
    """Whether ``root`` is c * acc + (terms without acc) with c free of acc and of tensor operands (operands
    not in ``scalars``); see Epilogue.backward_reads_acc."""
    def reads(node: Expr, what: Callable[[Expr], bool]) -> bool:
        return any(what(n) for n in _walk(node))

    def constant(node: Expr) -> bool:   # free of acc and of tensor operands: constants and scalars only
        return not reads(node, lambda n: n.op == "acc" or (n.op == "operand" and n.name not in scalars))

    def affine(node: Expr) -> bool:
        if not reads(node, lambda n: n.op == "acc"):
            return True
        if node.op == "acc":
            return True
        if node.op in ("add", "sub"):
            return all(affine(a) for a in node.args)
        if node.op == "neg":
            return affine(node.args[0])
        if node.op == "mul":
            a, b = node.args
            return (constant(a) and affine(b)) or (constant(b) and affine(a))
        if node.op == "div":
            return constant(node.args[1]) and affine(node.args[0])
        return False

    return affine(root)


# -- rendering of expressions -----------------------------------------------------------------------

def _sexpr(e: Expr) -> str:
    """Canonical S-expression: ``(add (mul alpha acc) bias)``; constants by repr(float), operands by name."""
    if e.op == "acc":
        return "acc"
    if e.op == "operand":
        return e.name
    if e.op == "const":
        return repr(e.value)
    return "(" + " ".join([e.op, *(_sexpr(a) for a in e.args)]) + ")"


_PREC_ADD, _PREC_MUL, _PREC_UNARY, _PREC_ATOM = 1, 2, 3, 4
_INFIX = {"add": ("+", _PREC_ADD), "sub": ("-", _PREC_ADD), "mul": ("*", _PREC_MUL), "div": ("/", _PREC_MUL)}


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() and builtins.abs(value) < 1e16 else repr(value)


def _infix(e: Expr) -> tuple[str, int]:
    """(text, precedence). Left-associative: a same-precedence right operand keeps its parentheses."""
    if e.op == "acc":
        return "acc", _PREC_ATOM
    if e.op == "operand":
        return e.name, _PREC_ATOM
    if e.op == "const":
        return _number(e.value), (_PREC_UNARY if e.value < 0 else _PREC_ATOM)
    if e.op in _INFIX:
        symbol, prec = _INFIX[e.op]
        return f"{_wrap(e.args[0], prec)} {symbol} {_wrap(e.args[1], prec + 1)}", prec
    if e.op == "neg":
        return "-" + _wrap(e.args[0], _PREC_ATOM), _PREC_UNARY
    if e.op in ("clamp_min", "clamp_max"):
        side = "lo" if e.op == "clamp_min" else "hi"
        return f"clamp({_infix(e.args[0])[0]}, {side}={_infix(e.args[1])[0]})", _PREC_ATOM
    return f"{e.op}({', '.join(_infix(a)[0] for a in e.args)})", _PREC_ATOM


def _wrap(e: Expr, min_prec: int) -> str:
    text, prec = _infix(e)
    return text if prec >= min_prec else f"({text})"


# -- tracing: symbolic values and the functions on them ---------------------------------------------

_FUNCTIONS = ("relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "clamp", "max", "min", "abs")
_SUPPORTED = ("the supported functions are " + ", ".join(f"ep.{f}" for f in _FUNCTIONS)
              + "; the operators + - * /, unary -, abs() and x ** 2")
_NO_LOGIC = ("comparisons, if/and/or/not and the builtins max()/min() cannot be traced (a traced value has no "
             "truth value): use ep.max, ep.min, ep.clamp or ep.relu")


class Value:
    """A symbolic stand-in for a tile of values during ``trace``: operators build ``Expr`` nodes."""

    __slots__ = ("expr",)
    __array_ufunc__ = None  # numpy scalars then defer to our reflected operators; numpy functions refuse

    def __init__(self, expr: Expr) -> None:
        self.expr = expr

    def __repr__(self) -> str:
        return f"<traced epilogue value {_infix(self.expr)[0]}>"

    def __add__(self, other: object) -> Value:
        return _binary("add", self, other)

    def __radd__(self, other: object) -> Value:
        return _binary("add", other, self)

    def __sub__(self, other: object) -> Value:
        return _binary("sub", self, other)

    def __rsub__(self, other: object) -> Value:
        return _binary("sub", other, self)

    def __mul__(self, other: object) -> Value:
        return _binary("mul", self, other)

    def __rmul__(self, other: object) -> Value:
        return _binary("mul", other, self)

    def __truediv__(self, other: object) -> Value:
        return _binary("div", self, other)

    def __rtruediv__(self, other: object) -> Value:
        return _binary("div", other, self)

    def __neg__(self) -> Value:
        return Value(Expr("neg", (self.expr,)))

    def __pos__(self) -> Value:
        return self

    def __abs__(self) -> Value:
        return Value(Expr("abs", (self.expr,)))

    def __pow__(self, power: object) -> Value:
        if not isinstance(power, numbers.Real) or isinstance(power, bool) or power != 2:
            raise _Refusal(f"x ** {power!r} is not supported: only x ** 2 (traced as x * x); write other "
                           "powers as products")
        return Value(Expr("mul", (self.expr, self.expr)))

    def __rpow__(self, base: object) -> Value:
        raise _Refusal("a traced value cannot be an exponent")

    def _no_logic(self, *_: object) -> Any:
        raise _Refusal(_NO_LOGIC)

    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = __bool__ = _no_logic
    __hash__ = None  # type: ignore[assignment]  # == is refused, so values are not hashable either

    def _no_number(self, *_: object) -> Any:
        raise _Refusal("math.exp/torch.exp, float(), int(), round() and other library functions cannot take a "
                       f"traced value; {_SUPPORTED}")

    __float__ = __int__ = __index__ = __complex__ = __round__ = __trunc__ = __floor__ = __ceil__ = _no_number

    @classmethod
    def __torch_function__(cls, func: Any, kinds: Any, args: Any = (), kwargs: Any = None) -> Any:
        # torch looks this up on every non-tensor argument, so torch.exp(acc) lands here with a clear message.
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
        name = name.replace("_VariableFunctionsClass.", "").replace("TensorBase.", "Tensor.")
        module = getattr(func, "__module__", None) or "torch"
        module = "torch" if module.startswith("torch._") else module
        raise _Refusal(f"{module}.{name} cannot take a traced value; {_SUPPORTED}")


def _as_expr(x: object, where: str) -> Expr:
    if isinstance(x, Value):
        return x.expr
    if isinstance(x, bool):
        raise _Refusal(f"{where}: bool constants are not supported (a traced value has no truth value)")
    if isinstance(x, numbers.Real):
        return Expr("const", value=_finite(x))
    raise _Refusal(f"{where} takes a traced value or a number, not {type(x).__name__}")


def _binary(op: str, a: object, b: object) -> Value:
    # Anything but a Value or a plain number: NotImplemented lets Python try the other side, then TypeError.
    if not all(isinstance(x, (Value, numbers.Real)) for x in (a, b)):
        return NotImplemented
    left, right = _as_expr(a, op), _as_expr(b, op)
    if op == "div" and right.op == "const" and right.value == 0:
        raise _Refusal("division by the constant 0")
    return Value(Expr(op, (left, right)))


def _apply(op: str, *args: object) -> Value:
    return Value(Expr(op, tuple(_as_expr(a, f"ep.{op}") for a in args)))


def relu(x: Value) -> Value:
    """max(x, 0)."""
    return _apply("relu", x)


def leaky_relu(x: Value, slope: float = 0.01) -> Value:
    """x if x > 0 else slope * x; the slope is a constant."""
    if isinstance(slope, Value):
        raise _Refusal("ep.leaky_relu's slope must be a number, not a traced value")
    return _apply("leaky_relu", x, slope)


def gelu(x: Value) -> Value:
    """x * Phi(x), the exact (erf) form, as torch.nn.functional.gelu(x)."""
    return _apply("gelu", x)


def gelu_tanh(x: Value) -> Value:
    """The tanh approximation of gelu, as torch.nn.functional.gelu(x, approximate="tanh")."""
    return _apply("gelu_tanh", x)


def silu(x: Value) -> Value:
    """x * sigmoid(x) (swish)."""
    return _apply("silu", x)


def sigmoid(x: Value) -> Value:
    return _apply("sigmoid", x)


def tanh(x: Value) -> Value:
    return _apply("tanh", x)


def clamp(x: Value, lo: Value | float | None = None, hi: Value | float | None = None) -> Value:
    """Clamp into [lo, hi]; a side given as None is left out (op clamp_min / clamp_max)."""
    if lo is None and hi is None:
        raise _Refusal("ep.clamp needs lo, hi or both")
    if lo is None:
        return _apply("clamp_max", x, hi)
    if hi is None:
        return _apply("clamp_min", x, lo)
    if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (lo, hi)) and lo > hi:
        raise _Refusal(f"ep.clamp(x, {lo!r}, {hi!r}): lo is above hi")
    return _apply("clamp", x, lo, hi)


def max(a: Value | float, b: Value | float) -> Value:  # noqa: A001  (ep.max is the point)
    """The larger of a and b, elementwise."""
    return _apply("max", a, b)


def min(a: Value | float, b: Value | float) -> Value:  # noqa: A001
    """The smaller of a and b, elementwise."""
    return _apply("min", a, b)


def abs(x: Value | float) -> Value:  # noqa: A001
    return _apply("abs", x)


# -- the description --------------------------------------------------------------------------------

# Token of each function op in kernel names; arithmetic is left out (the operands say most of it).
_TAG_TOKENS = {"relu": "relu", "leaky_relu": "lrelu", "gelu": "gelu", "gelu_tanh": "gelutanh", "silu": "silu",
               "sigmoid": "sigmoid", "tanh": "tanh", "clamp": "clamp", "clamp_min": "clamp", "clamp_max": "clamp",
               "max": "max", "min": "min", "abs": "abs"}
_TAG_MAX = 40


@dataclass(frozen=True)
class Epilogue:
    """D = result(acc, operands), and optionally a second M x N output ``aux`` (same dtype and order as D).

    ``operands`` are in the op's positional order (after A and B). Equal descriptions are equal and hash
    alike however they were written (knobs or function)."""

    operands: tuple[Operand, ...]
    result: Expr
    aux: Expr | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "operands", tuple(self.operands))
        for problem in _problems(self):
            raise EpilogueError(problem)

    # -- queries ------------------------------------------------------------------------------------

    @property
    def is_identity(self) -> bool:
        return self == IDENTITY

    def operand(self, name: str) -> Operand:
        for op in self.operands:
            if op.name == name:
                return op
        raise KeyError(f"no operand {name!r}; operands: {', '.join(o.name for o in self.operands) or 'none'}")

    def operands_of_kind(self, kind: str) -> tuple[Operand, ...]:
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
        return tuple(op for op in self.operands if op.kind == kind)

    def nodes(self) -> tuple[Expr, ...]:
        """Distinct non-leaf nodes of D then aux, children first (each once even if shared): one C++
        temporary each, in this order."""
        seen: dict[Expr, None] = {}
        for node in _walk(self.result, self.aux):
            if not node.is_leaf:
                seen.setdefault(node)
        return tuple(seen)

    @property
    def backward_reads_acc(self) -> bool:
        """Whether the gradients of D (and aux) need acc's value: False when each is c * acc plus terms without
        acc, c made of constants and scalars only (``acc + bias``, ``alpha * acc + beta * C``): the gradient
        with respect to acc is then c times D's, and no operand's gradient reads acc."""
        scalars = {op.name for op in self.operands if op.kind == "scalar"}
        return not all(_affine_in_acc(root, scalars) for root in (self.result, self.aux) if root is not None)

    @property
    def smooth_in_acc(self) -> bool:
        """Whether D and aux have continuous derivatives in acc: no relu, leaky_relu, abs, max, min or clamp of
        an expression that reads acc. Their gradients may then be taken at acc rounded to D's dtype (an error of
        that rounding's size); at a kink the rounding would flip the derivative of the elements next to it."""
        return not any(n.op in _KINKED and any(a.op == "acc" for a in _walk(n))
                       for n in _walk(self.result, self.aux))

    def resolved(self, out_dtype: DType | str) -> Epilogue:
        """Operands whose dtype is None ("like the output") get ``out_dtype``."""
        dtype = parse_dtype(out_dtype, what="out_dtype", allowed=(*OUTPUT_DTYPES, DType.int32))
        if all(op.dtype is not None for op in self.operands):
            return self
        if dtype not in OUTPUT_DTYPES:
            raise EpilogueError(f"out_dtype={dtype.value!r} (int8's exact sums) takes no epilogue operand of the "
                                "output's dtype: give the operands a dtype, or plan out_dtype='fp32' or 'bf16'")
        return replace(self, operands=tuple(op if op.dtype is not None else replace(op, dtype=dtype)
                                            for op in self.operands))

    # -- names and text -----------------------------------------------------------------------------

    @property
    def canonical(self) -> str:
        """Deterministic serialization (no hash seed, no ids):
        ``(epilogue (operands (bias col out -) ...) (D <sexpr>) (aux <sexpr>|none))``."""
        ops = " ".join(f"({o.name} {o.kind} {o.dtype.value if o.dtype else 'out'} "
                       f"{o.order.value if o.order else '-'})" for o in self.operands)
        aux = _sexpr(self.aux) if self.aux is not None else "none"
        return f"(epilogue (operands{' ' + ops if ops else ''}) (D {_sexpr(self.result)}) (aux {aux}))"

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical.encode()).hexdigest()[:8]

    @property
    def scale_mode(self) -> str:
        """The fp8 scale mode (SCALE_MODES) that ``with_scales`` gave this epilogue, "none" if it gave none:
        recognised from the leading operands scale_a and scale_b, their kinds and the expression."""
        split = _unscaled(self)
        return split[0] if split is not None else "none"

    @property
    def tag(self) -> str:
        """Readable kernel-name token: ``scale_<mode>`` for a scaled epilogue, then the functions used, the
        operands (kind letter + name) and 'aux' of the epilogue without its scales."""
        split = _unscaled(self)
        if split is not None:
            mode, base = split
            tokens = [f"scale_{mode}"] + ([] if base.is_identity else [base.tag])
            return "_".join(tokens)[:_TAG_MAX].rstrip("_")
        if self.is_identity:
            return "identity"
        tokens = list(dict.fromkeys(_TAG_TOKENS[n.op] for n in self.nodes() if n.op in _TAG_TOKENS))
        tokens += [_KINDS[o.kind].tag + o.name for o in self.operands]
        tokens += ["aux"] if self.aux is not None else []
        return ("_".join(tokens) or "expr")[:_TAG_MAX].rstrip("_")

    @property
    def name_suffix(self) -> str:
        return "" if self.is_identity else f"_ep_{self.tag}_{self.digest}"

    @property
    def text(self) -> str:
        """Readable infix formula, e.g. ``silu(alpha * acc + bias) + beta * C``."""
        d = _infix(self.result)[0]
        return d if self.aux is None else f"D = {d}, aux = {_infix(self.aux)[0]}"

    def describe(self) -> list[str]:
        lines = [f"D = {_infix(self.result)[0]}"]
        if self.aux is not None:
            lines.append(f"aux = {_infix(self.aux)[0]}  (second output, M x N, dtype and order of D)")
        return lines + [op.describe() for op in self.operands]

    def __str__(self) -> str:
        return self.text


def _problems(ep: Epilogue) -> Iterator[str]:
    """What makes a description unusable (checked on every construction, whoever builds it)."""
    if not all(isinstance(op, Operand) for op in ep.operands):
        yield "operands must be Operand objects"
        return
    names = [op.name for op in ep.operands]
    if len(set(names)) != len(names):
        yield f"operand names repeat: {', '.join(names)}"
    for label, root in (("D", ep.result), ("aux", ep.aux)):
        if root is None:
            continue
        if not isinstance(root, Expr):
            yield f"{label} must be an Expr, not {type(root).__name__}"
            return
        if _tree_nodes(root) > _MAX_TREE_NODES:
            yield (f"the expression of {label} is too large ({_tree_nodes(root)} nodes counting repeats; "
                   f"at most {_MAX_TREE_NODES})")
            return
        reads_acc, used = _uses(root)
        if not reads_acc:
            yield f"{label} does not use the accumulator: it would not depend on A @ B"
        if used - set(names):
            yield f"{label} reads undeclared operand(s) {', '.join(sorted(used - set(names)))}"
    if ep.aux is not None and ep.aux == ep.result:
        yield "aux is the same expression as D: return D alone"
    used = _uses(ep.result)[1] | (_uses(ep.aux)[1] if ep.aux is not None else set())
    for op in ep.operands:
        if op.kind in MAINLOOP_KINDS and op.name in used:
            yield (f"operand {op.name!r} holds per-block scales ({op.kind}), which the kernel's main loop applies to "
                   f"each K block of acc; the expression cannot read them: remove {op.name} from the expression")
        elif op.kind not in MAINLOOP_KINDS and op.name not in used:
            yield f"operand {op.name!r} is not used: remove it, or the op would require it for nothing"
    # The main loop applies one scale of A and one of B per K block: exactly one of each, or none.
    counts = [sum(op.kind == kind for op in ep.operands) for kind in MAINLOOP_KINDS]
    if counts not in ([0, 0], [1, 1]):
        yield (f"per-block scales come as one pair, a row_blocks operand (A's) and a col_blocks operand (B's); "
               f"this epilogue has {counts[0]} and {counts[1]}: build it with with_scales(epilogue, 'block')")


IDENTITY = Epilogue((), ACC)

# -- fp8 scales -------------------------------------------------------------------------------------

#: How an fp8 GEMM's scales (D = epilogue((A @ B) * scale_a * scale_b)) are given; see ``with_scales``.
SCALE_MODES = ("none", "tensor", "row", "block")
#: The operands of the scales of A and B, first among a scaled epilogue's operands.
SCALE_NAMES = ("scale_a", "scale_b")
#: mode -> the operands scale_a (of A) and scale_b (of B) that ``with_scales`` puts first, all fp32.
_SCALE_OPERANDS = {
    "tensor": (Operand("scale_a", "scalar_tensor"), Operand("scale_b", "scalar_tensor")),
    "row": (Operand("scale_a", "row", DType.fp32), Operand("scale_b", "col", DType.fp32)),
    "block": (Operand("scale_a", "row_blocks"), Operand("scale_b", "col_blocks")),
}
#: What each acc of the expression becomes where the epilogue applies the scales (not where the main loop
#: does): one node, so that the functor computes it once per element.
_SCALED_ACC = Expr("mul", (Expr("mul", (ACC, Expr("operand", name="scale_a"))), Expr("operand", name="scale_b")))


def _substitute(root: Expr | None, old: Expr, new: Expr) -> Expr | None:
    """``root`` with every node equal to ``old`` replaced by ``new`` (children first, without recursion)."""
    if root is None:
        return None
    done: dict[int, Expr] = {}
    for node in _walk(root):
        if node == old:
            done[id(node)] = new
        elif node.args:
            done[id(node)] = Expr(node.op, tuple(done[id(a)] for a in node.args), node.value, node.name)
        else:
            done[id(node)] = node
    return done[id(root)]


def _in_main_loop(mode: str) -> bool:
    return all(op.kind in MAINLOOP_KINDS for op in _SCALE_OPERANDS[mode])


def with_scales(ep: Epilogue, mode: str) -> Epilogue:
    """``ep`` for an fp8 GEMM with scales, D = ep((A @ B) * scale_a * scale_b), by scale mode:

    * ``"none"``: ep itself;
    * ``"tensor"``: scale_a and scale_b are one-element fp32 tensors (``ScalarTensor``), read on the device;
    * ``"row"``: scale_a one fp32 value per row of A (a Row), scale_b one per column of B (a Col);
    * ``"block"``: scale_a per row of A and 128-wide K block, (M, ceil(K/128)); scale_b per 128 x 128 block of
      B, (ceil(N/128), ceil(K/128)); the kernel's main loop applies them, the expression stays as it is.

    The two operands come first (the op takes A, B, scale_a, scale_b, then ep's operands); for "tensor" and
    "row" every acc of D and aux becomes ``acc * scale_a * scale_b``."""
    if mode not in SCALE_MODES:
        raise EpilogueError(f"scale mode {mode!r} is not one of {', '.join(map(repr, SCALE_MODES))}")
    if mode == "none":
        return ep
    names = {op.name for op in ep.operands}
    taken = [op.name for op in _SCALE_OPERANDS[mode] if op.name in names]
    if taken and ep.scale_mode != "none":
        raise EpilogueError(f"the epilogue is already scaled (scale mode {ep.scale_mode!r}): apply with_scales "
                            "once, to the epilogue without scales")
    if taken:
        raise EpilogueError(f"the epilogue has an operand named {taken[0]!r}, which the scales of A and B take "
                            "(scale_a, scale_b): rename the epilogue's operand")
    operands = _SCALE_OPERANDS[mode] + ep.operands
    if _in_main_loop(mode):
        return Epilogue(operands, ep.result, ep.aux)
    return Epilogue(operands, _substitute(ep.result, ACC, _SCALED_ACC), _substitute(ep.aux, ACC, _SCALED_ACC))


def _unscaled(ep: Epilogue) -> tuple[str, Epilogue] | None:
    """(scale mode, the epilogue without its scales) of an epilogue that ``with_scales`` made, else None."""
    for mode, scales in _SCALE_OPERANDS.items():
        if ep.operands[:2] != scales:
            continue
        result, aux = ep.result, ep.aux
        if not _in_main_loop(mode):
            result, aux = _substitute(result, _SCALED_ACC, ACC), _substitute(aux, _SCALED_ACC, ACC)
        try:
            base = Epilogue(ep.operands[2:], result, aux)
        except EpilogueError:   # scale_a or scale_b read elsewhere too: not with_scales' doing
            return None
        return (mode, base) if with_scales(base, mode) == ep else None
    return None

# -- trace ------------------------------------------------------------------------------------------


def _code(fn: Callable[..., Any]) -> types.CodeType | None:
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return code if isinstance(code, types.CodeType) else None


def _where(fn: Callable[..., Any], line: int | None) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    code = _code(fn)
    if code is None:
        return f"epilogue {name}()"
    return f"epilogue {name}() line {line or code.co_firstlineno} ({os.path.basename(code.co_filename)})"


def _return_line(fn: Callable[..., Any]) -> int | None:
    """The line of the function's return statement when it has exactly one, else its first line."""
    code = _code(fn)
    if code is None:
        return None
    lines = {ins.positions.lineno for ins in dis.get_instructions(code)
             if ins.opname in ("RETURN_VALUE", "RETURN_CONST") and ins.positions and ins.positions.lineno}
    return lines.pop() if len(lines) == 1 else code.co_firstlineno


def _fail_line(fn: Callable[..., Any], err: BaseException) -> int | None:
    """The innermost traceback line that runs in fn itself (a helper's failure points at its call in fn)."""
    code, line, tb = _code(fn), None, err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _explain(err: Exception) -> str:
    if isinstance(err, EpilogueError):
        return str(err)
    if isinstance(err, AttributeError) and isinstance(getattr(err, "obj", None), Value):
        return f"a traced value has no attribute {err.name!r} (it is not a tensor); {_SUPPORTED}"
    if isinstance(err, TypeError):
        return f"{err} (math.exp/torch.exp and other library functions cannot take a traced value; {_SUPPORTED})"
    return f"raised {type(err).__name__}: {err}"


def _annotation(fn: Callable[..., Any], param: inspect.Parameter) -> object:
    """The parameter's annotation, a string one (``from __future__ import annotations``) evaluated where
    fn was defined: its module globals and the closure variables it captured."""
    raw = param.annotation
    if not isinstance(raw, str):
        return raw
    target = inspect.unwrap(fn)
    closure = getattr(target, "__closure__", None) or ()
    freevars = getattr(getattr(target, "__code__", None), "co_freevars", ())
    scope = {}
    for name, cell in zip(freevars, closure):
        try:
            scope[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    value: object = raw
    for _ in range(2):  # twice: a quoted annotation under the __future__ import is a string of a string
        if isinstance(value, str):
            value = eval(value, getattr(target, "__globals__", {}), scope)  # noqa: S307  (annotations are code)
    return value


def _operands_from_signature(fn: Callable[..., Any]) -> tuple[Operand, ...]:
    where = _where(fn, None)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as err:
        raise EpilogueError(f"{where}: cannot read the signature ({err})") from None
    if not params:
        raise EpilogueError(f"{where}: the function needs a first parameter, the accumulator")
    for p in params:
        problem = _parameter_problem(p)
        if problem:
            raise EpilogueError(f"{where}: {problem}")
    try:
        first_kind = _annotation(fn, params[0])
    except Exception:  # the accumulator's annotation (e.g. "Tensor") is not ours to judge
        first_kind = None
    if isinstance(first_kind, OperandKind):
        raise EpilogueError(f"{where}: the first parameter {params[0].name!r} is the accumulator (the fp32 "
                            "A @ B tile) and takes no operand annotation; put the operands after it")
    return tuple(_operand_of(fn, p, where) for p in params[1:])


def _parameter_problem(p: inspect.Parameter) -> str | None:
    if p.kind is p.VAR_POSITIONAL:
        return f"*{p.name} is not supported: name each operand as its own annotated parameter"
    if p.kind is p.VAR_KEYWORD:
        return f"**{p.name} is not supported: name each operand as its own annotated parameter"
    if p.kind is p.KEYWORD_ONLY:
        return f"keyword-only parameter {p.name!r} is not supported: operands are positional (drop the *)"
    if p.default is not p.empty:
        return f"parameter {p.name!r} has a default value: every operand is required, remove the default"
    if p.name in ("A", "B", "out"):
        return (f"parameter {p.name!r} clashes with the op's own argument {p.name} (the op is called "
                f"op(A, B, <operands>..., out=...)): rename it")
    return None


def _operand_of(fn: Callable[..., Any], p: inspect.Parameter, where: str) -> Operand:
    *first, last = (f"ep.{title}" for title in _KIND_TITLE.values())
    kinds = f"{', '.join(first)} or {last}"
    if p.annotation is p.empty:
        raise EpilogueError(f"{where}: parameter {p.name!r} has no annotation: annotate it with {kinds}")
    try:
        kind = _annotation(fn, p)
    except Exception as err:
        raise EpilogueError(f"{where}: the annotation {p.annotation!r} of parameter {p.name!r} cannot be "
                            f"resolved ({type(err).__name__}: {err}); import ep at module level") from None
    if not isinstance(kind, OperandKind):
        raise EpilogueError(f"{where}: parameter {p.name!r} is annotated {kind!r}, which is not an operand "
                            f"kind: use {kinds}")
    try:
        return kind.operand(p.name)
    except EpilogueError as err:
        raise EpilogueError(f"{where}: parameter {p.name!r}: {err}") from None


def _split_result(out: object) -> tuple[Expr, Expr | None]:
    aux: object = None
    if isinstance(out, (tuple, list)):
        if len(out) != 2:
            raise EpilogueError(f"returned {len(out)} values: return D, or (D, aux)")
        out, aux = out
    if not isinstance(out, Value):
        raise EpilogueError(f"returned {type(out).__name__} for D, not a traced value computed from the "
                            "accumulator: return D, or (D, aux)")
    if aux is not None and not isinstance(aux, Value):
        raise EpilogueError(f"returned {type(aux).__name__} for aux, not a traced value: return D, or (D, aux)")
    return out.expr, aux.expr if aux is not None else None


def _check_result(result: Expr, aux: Expr | None, acc_name: str) -> None:
    for label, root in (("D", result), ("aux", aux)):
        if root is not None and _tree_nodes(root) > _MAX_TREE_NODES:
            raise EpilogueError(f"the expression of {label} is too large (at most {_MAX_TREE_NODES} nodes)")
        if root is not None and not _uses(root)[0]:
            what = "the result" if label == "D" else "aux (the second output)"
            raise EpilogueError(f"{what} does not use the accumulator {acc_name!r} (the first parameter): "
                                "it would not depend on A @ B")


def trace(fn: Callable[..., Any]) -> Epilogue:
    """Run ``fn(acc, *operands)`` on symbolic values and return its description (see generator/epilogue.py)."""
    if not callable(fn):
        raise EpilogueError(f"ep.trace needs a function, not {type(fn).__name__}")
    operands = _operands_from_signature(fn)
    acc_name = next(iter(inspect.signature(fn).parameters))
    try:
        out = fn(Value(ACC), *(Value(Expr("operand", name=op.name)) for op in operands))
    except Exception as err:
        raise EpilogueError(f"{_where(fn, _fail_line(fn, err))}: {_explain(err)}") from (
            None if isinstance(err, EpilogueError) else err)
    try:
        result, aux = _split_result(out)
        _check_result(result, aux, acc_name)
        if aux is not None and aux == result:
            raise EpilogueError("aux is the same expression as D: return D alone")
    except EpilogueError as err:
        raise EpilogueError(f"{_where(fn, _return_line(fn))}: {err}") from None
    used = _uses(result)[1] | (_uses(aux)[1] if aux is not None else set())
    for op in operands:
        if op.name not in used:
            raise EpilogueError(f"{_where(fn, None)}: parameter {op.name!r} is not used: remove it, or the op "
                                "would require it for nothing")
    return Epilogue(operands, result, aux)


# -- knobs ------------------------------------------------------------------------------------------

#: Every value the ``activation`` knob accepts -> the op it applies (None: none).
ACTIVATIONS = types.MappingProxyType({
    None: None, "identity": None, "none": None,
    "relu": "relu", "leaky_relu": "leaky_relu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "silu": "silu",
    "sigmoid": "sigmoid", "tanh": "tanh",
    "gelu_erf": "gelu", "swish": "silu",  # aliases
})
_ACTIVATION_FUNCTIONS = {"relu": relu, "leaky_relu": leaky_relu, "gelu": gelu, "gelu_tanh": gelu_tanh,
                         "silu": silu, "sigmoid": sigmoid, "tanh": tanh}


def _choices(values: tuple[object, ...]) -> str:
    return ", ".join(repr(v) for v in values)


def _coefficient(knob: str, value: object) -> float | str | None:
    """None, 'scalar' (a runtime fp32 argument), or a finite number (a constant of the kernel)."""
    if value is None or (isinstance(value, str) and value.lower() == "scalar"):
        return None if value is None else "scalar"
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value)):
        if value == 0:
            raise ValueError(f"{knob}=0 is not supported: " + (
                "D would not depend on A @ B" if knob == "alpha" else "leave beta=None (no C)"))
        return float(value)
    raise ValueError(f"{knob}={value!r}: use None, a finite number (compiled in) or 'scalar' (a runtime fp32 "
                     "argument)")


def activation_name(value: str | Callable[..., Any] | None) -> str | None:
    """The canonical activation (a key of ``_ACTIVATION_FUNCTIONS``, or None) of an ``activation`` knob value:
    a name or alias of ``ACTIVATIONS`` (any case), or one of the functions themselves (``ep.relu``, ...), as
    the CUTLASS Python interface writes ``plan.activation = cutlass.epilogue.relu``.

    Every entry point of the knob (``from_knobs``, ``Gemm(activation=)``, ``plan.activation``, ``nn.Linear``)
    goes through here, so a function and its name make one Epilogue, one config, and read back as the same
    name. ``ep.leaky_relu`` takes its default slope, as the name does. Any other callable (``torch.relu``, a
    lambda, ``ep.clamp``) is refused: the knob names an activation, and arbitrary code belongs in an
    epilogue function, which is traced."""
    functions = ", ".join(f"ep.{name}" for name in _ACTIVATION_FUNCTIONS)
    if callable(value):
        for name, fn in _ACTIVATION_FUNCTIONS.items():
            if fn is value:
                return name
        what = getattr(value, "__name__", None)
        what = f"{getattr(value, '__module__', None) or '?'}.{what}" if what else repr(value)
        raise ValueError(
            f"activation={what} is not one of the activation functions {functions} (generator.epilogue) nor of "
            f"the names {_choices(tuple(ACTIVATIONS))}; for any other function write the epilogue as a function of "
            "the accumulator and pass it as epilogue=: plan.epilogue = fn or Gemm(..., epilogue=fn), e.g. "
            "def fn(acc): return ep.clamp(acc, 0, 6) (see generator.epilogue)")
    key = value.lower() if isinstance(value, str) else value
    if not (key is None or isinstance(key, str)) or key not in ACTIVATIONS:
        raise ValueError(f"activation={value!r} is not one of {_choices(tuple(ACTIVATIONS))} or the functions "
                         f"{functions}")
    return ACTIVATIONS[key]


#: The simple knobs of ``from_knobs``, as Gemm, the CLI and plans files name them.
KNOB_NAMES = ("activation", "bias", "alpha", "beta")


def from_knobs(activation: str | Callable[..., Any] | None = None, bias: str | None = None,
               alpha: float | str | None = None, beta: float | str | None = None, c_dtype: object = None,
               c_order: object = None, bias_dtype: object = None) -> Epilogue:
    """``act(alpha * acc + beta * C + bias)``, built with the same functions a traced function would call, so
    the equivalent function traces to an equal Epilogue. Operands in the order bias, C, alpha, beta.
    ``activation`` is a name or one of the functions (``ep.gelu``): see ``activation_name``."""
    act = activation_name(activation)
    a, b = _coefficient("alpha", alpha), _coefficient("beta", beta)
    bias = bias.lower() if isinstance(bias, str) else bias
    if bias not in (None, "row", "col"):
        raise ValueError(f"bias={bias!r} is not one of {_choices((None, 'row', 'col'))} (row: one value per row "
                         "of D, length M; col: one per column, length N, as nn.Linear's bias)")
    if b is None and (c_dtype is not None or c_order is not None):
        raise ValueError("c_dtype/c_order describe C, which is only read when beta is given")
    if bias is None and bias_dtype is not None:
        raise ValueError("bias_dtype given without bias")
    operands: list[Operand] = []
    if bias is not None:
        operands.append(Operand("bias", bias, _operand_dtype(bias_dtype, "bias_dtype")))
    if b is not None:
        order = _order(c_order, "c_order") if c_order is not None else Order.row
        operands.append(Operand("C", "matrix", _operand_dtype(c_dtype, "c_dtype"), order))
    operands += [Scalar.operand(name) for name, k in (("alpha", a), ("beta", b)) if k == "scalar"]

    def term(coef: float | str, x: Value, name: str) -> Value:
        if coef == "scalar":
            return Value(Expr("operand", name=name)) * x
        return x if coef == 1 else coef * x

    x = Value(ACC) if a is None else term(a, Value(ACC), "alpha")
    if b is not None:
        x = x + term(b, Value(Expr("operand", name="C")), "beta")
    if bias is not None:
        x = x + Value(Expr("operand", name="bias"))
    if act is not None:
        x = _ACTIVATION_FUNCTIONS[act](x)
    return Epilogue(tuple(operands), x.expr)


# -- JSON -------------------------------------------------------------------------------------------

_JSON_KEYS = ("operands", "nodes", "D", "aux")
_OPERAND_KEYS = ("name", "kind", "dtype", "order")


def epilogue_to_json(ep: Epilogue) -> dict[str, Any]:
    """The description as JSON-compatible data (what an emitted package's plans.json records of a function
    epilogue): ``{"operands": [{"name", "kind", "dtype", "order"}, ...], "nodes": [...], "D": i, "aux": j}``.

    ``nodes`` lists every distinct node once, children before parents: ``{"op": "acc"}``, ``{"op": "operand",
    "name": n}``, ``{"op": "const", "value": x}`` or ``{"op": op, "args": [indices of earlier nodes]}``; ``D``
    and ``aux`` (None without a second output) are indices into it. Deterministic; ``epilogue_from_json``
    rebuilds an equal Epilogue (same canonical text, digest and kernel name)."""
    index: dict[Expr, int] = {}
    nodes: list[dict[str, Any]] = []
    for node in _walk(ep.result, ep.aux):
        if node in index:   # structurally equal to a node already listed
            continue
        entry: dict[str, Any] = {"op": node.op}
        if node.op == "operand":
            entry["name"] = node.name
        elif node.op == "const":
            entry["value"] = node.value
        elif node.args:
            entry["args"] = [index[a] for a in node.args]
        index[node] = len(nodes)
        nodes.append(entry)
    operands = [{"name": o.name, "kind": o.kind, "dtype": o.dtype.value if o.dtype is not None else None,
                 "order": o.order.value if o.order is not None else None} for o in ep.operands]
    return {"operands": operands, "nodes": nodes, "D": index[ep.result],
            "aux": index[ep.aux] if ep.aux is not None else None}


def _json_index(value: object, what: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise EpilogueError(f"epilogue JSON: {what} is {value!r}, not the index of an earlier node (0 to {limit - 1})")
    return value


def _json_object(value: object, what: str, keys: tuple[str, ...], required: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EpilogueError(f"epilogue JSON: {what} is {type(value).__name__}, not an object")
    unknown = sorted(set(value) - set(keys), key=str)
    missing = [k for k in required if k not in value]
    if unknown or missing:
        problem = f"unknown key(s) {', '.join(map(repr, unknown))}" if unknown else f"no {', '.join(missing)}"
        raise EpilogueError(f"epilogue JSON: {what} has {problem} (keys: {', '.join(keys)})")
    return value


def epilogue_from_json(data: object) -> Epilogue:
    """The Epilogue that ``epilogue_to_json`` described (a dict, or its JSON text); every part is checked, and a
    bad one raises EpilogueError saying which."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError as err:
            raise EpilogueError(f"epilogue JSON: not valid JSON ({err})") from None
    obj = _json_object(data, "the epilogue", _JSON_KEYS, _JSON_KEYS)
    raw_operands, raw_nodes = obj["operands"], obj["nodes"]
    if not isinstance(raw_operands, list) or not isinstance(raw_nodes, list) or not raw_nodes:
        raise EpilogueError("epilogue JSON: 'operands' must be a list and 'nodes' a non-empty list")
    operands = []
    for i, raw in enumerate(raw_operands):
        o = _json_object(raw, f"operand {i}", _OPERAND_KEYS, ("name", "kind"))
        operands.append(Operand(o["name"], o["kind"], o.get("dtype"), o.get("order")))
    nodes: list[Expr] = []
    for i, raw in enumerate(raw_nodes):
        n = _json_object(raw, f"node {i}", ("op", "args", "value", "name"), ("op",))
        if not isinstance(n["op"], str) or n["op"] not in _ARITY:
            raise EpilogueError(f"epilogue JSON: node {i} has op {n['op']!r}; known: {', '.join(OPS)}")
        args = n.get("args", [])
        if not isinstance(args, list):
            raise EpilogueError(f"epilogue JSON: node {i}'s args must be a list of node indices")
        value = n.get("value")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise EpilogueError(f"epilogue JSON: node {i}'s value {value!r} is not a number")
        nodes.append(Expr(n["op"], tuple(nodes[_json_index(a, f"an argument of node {i}", i)] for a in args),
                          value=value, name=n.get("name")))
    result = nodes[_json_index(obj["D"], "D", len(nodes))]
    aux = nodes[_json_index(obj["aux"], "aux", len(nodes))] if obj["aux"] is not None else None
    return Epilogue(tuple(operands), result, aux)
