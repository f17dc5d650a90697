"""The expression DAG of an epilogue: ``Expr`` and its ops (OPS), the accumulator leaf ``ACC``, the walkers
over a DAG (nodes, size, what it reads, whether it is affine in acc) and its two texts, the canonical
S-expression and the readable infix formula."""
from __future__ import annotations

import builtins
import math
import numbers
from dataclasses import dataclass
from typing import Callable, Iterator

from .errors import EpilogueError, _Refusal


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
