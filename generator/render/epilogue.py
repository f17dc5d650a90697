"""An Epilogue (generator.spec.epilogue) as C++: the ``Epilogue`` functor every kernel of a config calls.

The functor computes D's value of one element from its fp32 accumulator, in fp32, and stores the second
output (aux) when the plan has one. Per-row and per-column vectors are read apart, once per row or column
(``load_row``, ``load_col``), so that the kernels do not read them again for every element::

    struct Epilogue {
      static constexpr bool kIdentity = false;
      struct Row { float ep_<name>; ... };   // the per-row vectors' values of one row (Col: of one column)
      __device__ static Row load_row(const GemmArgs& args, int64_t row);
      __device__ static Col load_col(const GemmArgs& args, int64_t col);
      __device__ static float apply(const GemmArgs& args, float acc, int64_t row, int64_t col, const Row& r,
                                    const Col& c);
    };

Operand i of the plan is slot i of the launch arguments (templates/common/gemm_args.h): ``args.ep_ptr[i]``
(vectors, matrices, scalar tensors, per-block scales), ``args.ep_ld[i]`` (matrices, per-block scales),
``args.ep_scalar[i]`` (scalars). A scalar tensor (one fp32 element in device memory) is read with the per-row
vectors, once per row: the kernels' load_row calls pick it up. Per-block scales (spec.epilogue.MAINLOOP_KINDS)
are the main loop's: the functor only names their slots (``kRowBlocksSlot``, ``kColBlocksSlot``, -1 when
absent) and the block's K extent (``kScaleBlockK``). Each node of the expression DAG becomes one ``const
float`` temporary, in the DAG's order, so a shared subexpression is computed once. The kernels call ``apply``
only for elements inside M x N. Pure: no torch, no files.
"""
from __future__ import annotations

import math

from ..spec.epilogue import ACC, MAINLOOP_KINDS, Epilogue, Expr, Operand
from ..spec.grouped import reads_cols_per_group
from ..spec.types import Order

#: kind -> the values struct its operands are read into: "row" (``Row``, by load_row, once per row of D) or
#: "col" (``Col``, by load_col, once per column). A scalar tensor's one element goes with the rows: read once
#: per row rather than per element, and without a kernel of its own to call.
_VALUES_STRUCT = {"row": "row", "col": "col", "scalar_tensor": "row"}

# op -> C++ of its arguments (already C++ expressions). "FAST" is the functor's kFast: the activations'
# hardware approximations for 16-bit outputs (templates/common/epilogue.cuh says why that is accurate enough).
_CALLS = {
    "add": "{0} + {1}",
    "sub": "{0} - {1}",
    "mul": "{0} * {1}",
    "div": "{0} / {1}",
    "neg": "-{0}",
    "abs": "fabsf({0})",
    "max": "fmaxf({0}, {1})",
    "min": "fminf({0}, {1})",
    "relu": "gemmgen::epi::relu({0})",
    "leaky_relu": "gemmgen::epi::leaky_relu({0}, {1})",
    "gelu": "gemmgen::epi::gelu({0})",
    "gelu_tanh": "gemmgen::epi::gelu_tanh<kFast>({0})",
    "silu": "gemmgen::epi::silu<kFast>({0})",
    "sigmoid": "gemmgen::epi::sigmoid<kFast>({0})",
    "tanh": "gemmgen::epi::tanh<kFast>({0})",
    "clamp": "fminf(fmaxf({0}, {1}), {2})",
    "clamp_min": "fmaxf({0}, {1})",
    "clamp_max": "fminf({0}, {1})",
}


def float_literal(value: float) -> str:
    """A C++ float literal for a finite constant: the shortest text that reads back as the same double, then
    rounded to float by the compiler as the kernel's fp32 arithmetic would."""
    if not math.isfinite(value):
        raise ValueError(f"epilogue constant {value!r} is not finite")
    text = repr(float(value))
    return f"{text}f" if ("." in text or "e" in text) else f"{text}.0f"


def operand_variable(op: Operand) -> str:
    """The C++ name of an operand's value (prefixed: an operand may be named like a C++ keyword)."""
    return f"ep_{op.name}"


def operand_load(slot: int, op: Operand) -> str:
    """The C++ expression that reads operand ``op`` (slot ``slot``) for the element (row, col)."""
    if op.kind == "scalar":
        return f"args.ep_scalar[{slot}]"
    if op.kind in MAINLOOP_KINDS:
        raise ValueError(f"{op.name} ({op.kind}) is read by the kernel's main loop, not by the epilogue functor")
    ctype = op.dtype.cuda_type
    if op.kind == "scalar_tensor":
        index = "0"
    elif op.kind == "row":
        index = "row"
    elif op.kind == "col":
        index = "col"
    elif op.order is Order.row:
        index = f"row * args.ep_ld[{slot}] + col"
    else:
        index = f"col * args.ep_ld[{slot}] + row"
    return f"gemmgen::epi::load<{ctype}>(args.ep_ptr[{slot}], {index})"


def _leaf(node: Expr) -> str:
    if node.op == "acc":
        return "acc"
    if node.op == "const":
        return float_literal(node.value)
    return f"ep_{node.name}"


def vector_loads(ep: Epilogue, kind: str) -> list[str]:
    """Statements that read the values of one row or column (``kind`` "row"/"col": the per-row vectors and
    scalar tensors, or the per-column vectors) into a ``Row``/``Col`` value ``v``: the kernels read them once
    per row or column, not once per element."""
    return [f"v.{operand_variable(op)} = {operand_load(i, op)};" for i, op in enumerate(ep.operands)
            if _VALUES_STRUCT.get(op.kind) == kind]


def vector_fields(ep: Epilogue, kind: str) -> list[str]:
    return [f"float {operand_variable(op)};" for op in ep.operands if _VALUES_STRUCT.get(op.kind) == kind]


def block_scale_slot(ep: Epilogue, kind: str) -> int:
    """The slot of the ``kind`` (row_blocks / col_blocks) per-block scales, or -1 (spec allows one of each)."""
    return next((i for i, op in enumerate(ep.operands) if op.kind == kind), -1)


def functor_is_identity(ep: Epilogue) -> bool:
    """Whether the functor leaves acc as the main loop made it: the identity, or per-block scales alone (which
    the main loop applies), so that the kernels skip the epilogue at compile time."""
    return ep.result == ACC and ep.aux is None and all(op.kind in MAINLOOP_KINDS for op in ep.operands)


def prefetch_calls(ep: Epilogue) -> list[str]:
    """Statements that ask L2 for a tile's part of every M x N operand (``prefetch``; see
    templates/common/epilogue.cuh prefetch_tile_l2)."""
    calls = []
    for i, op in enumerate(ep.operands):
        if op.kind == "matrix":
            calls.append(f"gemmgen::epi::prefetch_tile_l2<{op.dtype.cuda_type}, {str(op.order is Order.row).lower()}>(")
            calls.append(f"    args.ep_ptr[{i}], args.ep_ld[{i}], row0, rows, col0, cols, args.m, args.n, thread, "
                         "threads);")
    return calls


def functor_body(ep: Epilogue, d_row_major: bool, source_slot: int | None = None) -> list[str]:
    """The statements of ``apply``: the element's matrix and scalar operands, one temporary per node, the
    aux store, the return. Vector operands come in ``r`` (per row) and ``c`` (per column); with
    ``source_slot``, that M x N operand's value comes in ``source`` (the kernel read it from shared memory).
    Per-block scales are not read here: the main loop applied them to acc."""
    lines = []
    for i, op in enumerate(ep.operands):
        if op.kind in MAINLOOP_KINDS:
            continue
        if op.kind in _VALUES_STRUCT:
            lines.append(f"const float {operand_variable(op)} = {_VALUES_STRUCT[op.kind][0]}.{operand_variable(op)};")
        elif i == source_slot:
            lines.append(f"const float {operand_variable(op)} = source;")
        else:
            lines.append(f"const float {operand_variable(op)} = {operand_load(i, op)};")
    names: dict[Expr, str] = {}

    def ref(node: Expr) -> str:
        return names[node] if node in names else _leaf(node)

    for i, node in enumerate(ep.nodes()):
        names[node] = f"t{i}"
        lines.append(f"const float t{i} = {_CALLS[node.op].format(*(ref(a) for a in node.args))};")
    if ep.aux is not None:
        index = "row * args.ldaux + col" if d_row_major else "col * args.ldaux + row"
        lines.append(f"gemmgen::epi::store<Out>(args.aux, {index}, {ref(ep.aux)});")
    lines.append(f"return {ref(ep.result)};")
    return lines


def functor_context(ep: Epilogue, d_row_major: bool, source_slot: int | None = None) -> dict[str, object]:
    """What the family templates substitute for the Epilogue functor. ``source_slot``: the M x N operand the
    kernel loads into shared memory itself (spec.config.source_operand), or None."""
    body = functor_body(ep, d_row_major)
    matrices = [i for i, op in enumerate(ep.operands) if op.kind == "matrix"]
    context: dict[str, object] = {
        "epilogue_identity": functor_is_identity(ep),
        "epilogue_text": ep.text,
        "epilogue_operands": [f"slot {i}: {line}" for i, line in
                              enumerate(ep.describe()[len(ep.describe()) - len(ep.operands):])],
        "epilogue_body": body,
        "epilogue_uses_fast_math": any("kFast" in line for line in body),
        "epilogue_has_matrix": bool(matrices),
        "epilogue_prefetch": prefetch_calls(ep),
        "epilogue_row_fields": vector_fields(ep, "row"),
        "epilogue_col_fields": vector_fields(ep, "col"),
        "epilogue_row_loads": vector_loads(ep, "row"),
        "epilogue_col_loads": vector_loads(ep, "col"),
        "epilogue_cols_per_group": reads_cols_per_group(ep),
        "epilogue_source_slot": -1 if source_slot is None else source_slot,
        "epilogue_row_blocks_slot": block_scale_slot(ep, "row_blocks"),
        "epilogue_col_blocks_slot": block_scale_slot(ep, "col_blocks"),
        "epilogue_source_cuda": "float",
        "epilogue_sourced_body": [],
        "epilogue_sourced_straight_line": False,
    }
    if source_slot is not None:
        context.update({
            "epilogue_source_cuda": ep.operands[source_slot].dtype.cuda_type,
            "epilogue_sourced_body": functor_body(ep, d_row_major, source_slot),
            # Straight-line parts are safe once no M x N operand is read from global memory.
            "epilogue_sourced_straight_line": matrices == [source_slot],
        })
    return context
