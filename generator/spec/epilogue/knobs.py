"""The simple knobs: ``from_knobs`` builds act(alpha * acc + beta * C + bias) with the same functions a traced
function calls; ACTIVATIONS, ``activation_name`` and KNOB_NAMES say what the knobs accept."""
from __future__ import annotations

import math
import numbers
import types
from typing import Any, Callable

from ..types import Order
from .description import Epilogue
from .expr import ACC, Expr
from .operands import Operand, Scalar, _operand_dtype, _order
from .values import Value, gelu, gelu_tanh, leaky_relu, relu, sigmoid, silu, tanh


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
