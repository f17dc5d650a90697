"""An Epilogue (generator.spec.epilogue) as Python source: one function that computes (D, aux) with torch
operations, for the autograd formula of an emitted package's epilogue op (the package cannot import gemmgen,
so it carries its expression as code; torch.autograd differentiates the function in the backward pass)::

    def _epilogue_fused(acc, ep_bias, ep_C, ep_alpha, ep_beta):
        \"\"\"D = silu(alpha * acc + bias) + beta * C, with torch operations: returns (D, aux or None).\"\"\"
        like = dict(dtype=acc.dtype, device=acc.device)
        ep_bias = ep_bias.to(acc.dtype)[None, :]
        ep_C = ep_C.to(acc.dtype)
        ep_alpha = float(ep_alpha)
        ep_beta = float(ep_beta)
        t0 = torch.tensor(ep_alpha, **like) * acc
        ...
        return t4.expand_as(acc), None

It computes what ``generator.runtime.evaluate`` computes (the JIT ops' formula and the GPU tests' reference),
with the same torch functions on the same arguments: the operands shaped as ``operand_values`` shapes them, in
acc's dtype; a number (constant or runtime scalar) that is an argument of an operation becomes a 0-dim tensor
of acc's dtype (evaluate's ``_as_tensor``), except leaky_relu's slope, a float; every node is an operation on
tensors, so ``+ - * /`` and unary ``-`` are torch.add, sub, mul, div and neg. Each node of the DAG is one
local (``t0``, ``t1``, ... in ``Epilogue.nodes()`` order), as the C++ functor's temporaries. The parameters
are the operands in their order, prefixed (``ep_<name>``: an operand may be named ``torch``, ``F``, ``float``
or a Python keyword). Nothing but validated operand names, op names and finite numbers reaches the code.
Pure: no torch here, no files.
"""
from __future__ import annotations

import keyword
import math

from ..spec.epilogue import MAINLOOP_KINDS, Epilogue, Expr, Operand

# op -> Python of its arguments (Python expressions already); {T}: the torch module, {F}: torch.nn.functional.
_CALLS = {
    "add": "{0} + {1}",
    "sub": "{0} - {1}",
    "mul": "{0} * {1}",
    "div": "{0} / {1}",
    "neg": "-{0}",
    "abs": "{T}.abs({0})",
    "relu": "{T}.relu({0})",
    "gelu": "{F}.gelu({0})",
    "gelu_tanh": '{F}.gelu({0}, approximate="tanh")',
    "silu": "{F}.silu({0})",
    "sigmoid": "{T}.sigmoid({0})",
    "tanh": "{T}.tanh({0})",
    "max": "{T}.maximum({0}, {1})",
    "min": "{T}.minimum({0}, {1})",
    "clamp_min": "{T}.maximum({0}, {1})",
    "clamp_max": "{T}.minimum({0}, {1})",
    "clamp": "{T}.minimum({T}.maximum({0}, {1}), {2})",
    "leaky_relu": "{F}.leaky_relu({0}, {1})",
}

# How each kind of operand is shaped against the M x N accumulator (as evaluate's operand_values). Per-block
# scales are the kernel's main loop's: a parameter of the function (the op's operands keep their positions),
# never read by it.
_SHAPED = {
    "scalar": "float({0})",
    "scalar_tensor": "{0}.to(acc.dtype).reshape(())",
    "row": "{0}.to(acc.dtype)[:, None]",
    "col": "{0}.to(acc.dtype)[None, :]",
    "matrix": "{0}.to(acc.dtype)",
}


def _check_name(value: str, what: str) -> str:
    if not (isinstance(value, str) and value.isascii() and value.isidentifier() and not keyword.iskeyword(value)):
        raise ValueError(f"{what}={value!r} must be an ASCII Python identifier (and not a keyword)")
    return value


def float_literal(value: float) -> str:
    """A Python literal for a finite constant: the shortest text that reads back as the same float."""
    if not math.isfinite(value):
        raise ValueError(f"epilogue constant {value!r} is not finite")
    return repr(float(value))


def parameter(op: Operand) -> str:
    """The function's parameter (and local) holding operand ``op``."""
    return f"ep_{op.name}"


def python_function(ep: Epilogue, fn_name: str, *, torch_module: str = "torch", functional_module: str = "F") -> str:
    """Source of ``def <fn_name>(acc, <one parameter per operand, in ep.operands' order>)`` returning
    ``(D, aux)`` (aux None without a second output), computed as ``generator.runtime.evaluate(ep, acc,
    operand_values(ep, operands, acc.dtype))``; see the module docstring. ``torch_module`` and
    ``functional_module`` name torch and torch.nn.functional where the function is defined."""
    names = {"T": _check_name(torch_module, "torch_module"), "F": _check_name(functional_module, "functional_module")}
    _check_name(fn_name, "fn_name")
    locals_: dict[Expr, str] = {}
    wraps = False

    def ref(node: Expr) -> str:
        """A node as an argument of an operation: a tensor, or a number as a 0-dim tensor of acc's dtype."""
        nonlocal wraps
        if node in locals_:
            return locals_[node]
        if node.op == "acc":
            return "acc"
        if node.op == "operand" and ep.operand(node.name).kind != "scalar":
            return f"ep_{node.name}"
        wraps = True
        number = f"ep_{node.name}" if node.op == "operand" else float_literal(node.value)
        return f"{names['T']}.tensor({number}, **like)"

    body = []
    for i, node in enumerate(ep.nodes()):
        if node.op == "leaky_relu":   # the slope is a constant, passed as a float (as evaluate does)
            args = [ref(node.args[0]), float_literal(node.args[1].value)]
        else:
            args = [ref(a) for a in node.args]
        body.append(f"t{i} = {_CALLS[node.op].format(*args, **names)}")
        locals_[node] = f"t{i}"
    aux = "None" if ep.aux is None else f"{ref(ep.aux)}.expand_as(acc)"
    body.append(f"return {ref(ep.result)}.expand_as(acc), {aux}")
    head = ["like = dict(dtype=acc.dtype, device=acc.device)"] if wraps else []
    head += [f"{parameter(op)} = {_SHAPED[op.kind].format(parameter(op))}" for op in ep.operands
             if op.kind not in MAINLOOP_KINDS]
    params = "".join(f", {parameter(op)}" for op in ep.operands)
    text = ep.text if ep.aux is not None else f"D = {ep.text}"
    doc = f'"""{text}, with torch operations: returns (D, aux or None)."""'
    return "\n".join([f"def {fn_name}(acc{params}):", *(f"    {line}" for line in [doc, *head, *body])]) + "\n"
