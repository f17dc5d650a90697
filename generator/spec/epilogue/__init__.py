"""The fused epilogue: what a GEMM does to its fp32 accumulator before D is stored.

Users describe it with knobs (``from_knobs``) or with a Python function that ``trace`` runs on symbolic
stand-ins; both give one frozen, hashable ``Epilogue``: the extra operands (in the op's positional order)
and an expression DAG over the accumulator, those operands and constants. The user-facing documentation
is in ``generator/epilogue.py``; this package holds the machinery. No torch, and nothing of ``generator``
but ``spec.types``.

Its modules, each importing only those above it:

    errors       EpilogueError (and _Refusal, a traced function's refused step)
    operands     the operand kinds, Operand, the annotations Scalar, ScalarTensor, Row, Col, Matrix
    expr         the expression DAG (Expr, ACC, OPS), its walkers and its texts (S-expression, infix)
    values       Value, the symbolic stand-in, and the functions on it (relu, gelu, ..., max, min, abs)
    description  Epilogue, IDENTITY, the fp8 scales (SCALE_MODES, with_scales)
    trace        trace(fn): a user's function -> Epilogue
    knobs        from_knobs, ACTIVATIONS, activation_name, KNOB_NAMES
    json_form    epilogue_to_json, epilogue_from_json

This module re-exports their public names; ``from generator.spec.epilogue import X`` is the way in.
"""
from __future__ import annotations

from .description import BIAS_ACTIVATIONS, IDENTITY, SCALE_MODES, SCALE_NAMES, BiasActivation, Epilogue, with_scales
from .errors import EpilogueError
from .expr import ACC, OPS, Expr
from .json_form import epilogue_from_json, epilogue_to_json
from .knobs import ACTIVATIONS, KNOB_NAMES, activation_name, from_knobs
from .operands import (KINDS, MAINLOOP_KINDS, RESERVED_NAMES, SCALE_BLOCK, SHAPES, Col, Matrix, Operand, OperandKind,
                       Row, Scalar, ScalarTensor)
from .trace import trace
from .values import Value, abs, clamp, gelu, gelu_tanh, leaky_relu, max, min, relu, sigmoid, silu, tanh

__all__ = [
    "ACC", "ACTIVATIONS", "BIAS_ACTIVATIONS", "IDENTITY", "KINDS", "KNOB_NAMES", "MAINLOOP_KINDS", "OPS", "RESERVED_NAMES", "SCALE_BLOCK",
    "SCALE_MODES", "SCALE_NAMES", "SHAPES", "BiasActivation", "Col", "Epilogue", "EpilogueError", "Expr", "Matrix", "Operand",
    "OperandKind", "Row", "Scalar", "ScalarTensor", "Value", "abs", "activation_name", "clamp", "epilogue_from_json",
    "epilogue_to_json", "from_knobs", "gelu", "gelu_tanh", "leaky_relu", "max", "min", "relu", "sigmoid", "silu",
    "tanh", "trace", "with_scales",
]
