"""What an epilogue function computes with while ``trace`` runs it: ``Value``, the symbolic stand-in whose
operators build ``Expr`` nodes, and the functions on it (ep.relu, ep.gelu, ..., ep.clamp, ep.max, ep.min,
ep.abs).

Note: the module defines ``max``, ``min`` and ``abs`` (the epilogue functions), which shadow the builtins
for the code below; where a builtin is meant it is spelled ``builtins.max`` etc.
"""
from __future__ import annotations

import numbers
from typing import Any

from .errors import _Refusal
from .expr import Expr, _finite, _infix


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
