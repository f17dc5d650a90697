"""``trace``: run a user's epilogue function on symbolic values and return its ``Epilogue``; the operands come
from the function's annotated signature, and every refusal names the function and the line."""
from __future__ import annotations

import dis
import inspect
import os
import types
from typing import Any, Callable

from .description import Epilogue
from .errors import EpilogueError
from .expr import _MAX_TREE_NODES, ACC, Expr, _tree_nodes, _uses
from .operands import _KIND_TITLE, Operand, OperandKind
from .values import _SUPPORTED, Value


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
