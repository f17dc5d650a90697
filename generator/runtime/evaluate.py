"""An Epilogue evaluated with torch operations: the reference the GPU tests compare the kernels with (in
float64), and the elementwise part of the backward pass (torch.autograd differentiates it).

The formulas are torch's own (``F.gelu``, ``F.silu``, ...), the same functions the kernels implement.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..spec.epilogue import MAINLOOP_KINDS, Epilogue, Expr

_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}
_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
    "min": torch.minimum, "clamp_min": torch.maximum, "clamp_max": torch.minimum,
}


def _as_tensor(x: Any, like: torch.Tensor) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=like.dtype, device=like.device)


# kind -> the operand as it broadcasts against an M x N accumulator, in a dtype (render/epilogue_python.py's
# _SHAPED says the same in Python source).
_SHAPED = {
    "scalar": lambda value, dtype: float(value),
    "scalar_tensor": lambda value, dtype: value.to(dtype).reshape(()),
    "row": lambda value, dtype: value.to(dtype)[:, None],
    "col": lambda value, dtype: value.to(dtype)[None, :],
    "matrix": lambda value, dtype: value.to(dtype),
}


def operand_values(ep: Epilogue, values: Sequence[Any], dtype: torch.dtype) -> dict[str, Any]:
    """Each operand the expression reads as it broadcasts against an M x N accumulator, in ``dtype``: a row
    vector as (M, 1), a column vector as (1, N), a scalar tensor as a 0-dim tensor, a scalar as a Python number.
    Per-block scales are left out: the kernel's main loop applies them to acc, the expression cannot read them."""
    return {op.name: _SHAPED[op.kind](value, dtype) for op, value in zip(ep.operands, values)
            if op.kind not in MAINLOOP_KINDS}


def evaluate(ep: Epilogue, acc: torch.Tensor, operands: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(D, aux) of ``ep`` for the accumulator ``acc`` and ``operands`` (see ``operand_values``), in acc's
    dtype; aux None when the epilogue has no second output."""
    memo: dict[Expr, Any] = {}

    def value(node: Expr) -> Any:
        if node in memo:
            return memo[node]
        if node.op == "acc":
            out = acc
        elif node.op == "const":
            out = node.value
        elif node.op == "operand":
            out = operands[node.name]
        else:
            args = [value(a) for a in node.args]
            if node.op in _UNARY:
                out = _UNARY[node.op](_as_tensor(args[0], acc))
            elif node.op in _BINARY:
                out = _BINARY[node.op](_as_tensor(args[0], acc), _as_tensor(args[1], acc))
            elif node.op == "leaky_relu":
                out = F.leaky_relu(_as_tensor(args[0], acc), float(args[1]))
            elif node.op == "clamp":
                x = _as_tensor(args[0], acc)
                out = torch.minimum(torch.maximum(x, _as_tensor(args[1], acc)), _as_tensor(args[2], acc))
            else:
                raise ValueError(f"no torch formula for epilogue op {node.op!r}")
        memo[node] = out
        return out

    d = _as_tensor(value(ep.result), acc).expand_as(acc)
    aux = _as_tensor(value(ep.aux), acc).expand_as(acc) if ep.aux is not None else None
    return d, aux
