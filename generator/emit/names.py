"""The names an emitted package is made of: the package name, its public op names and its private ``_grad_*`` ones,
each checked to be a plain lowercase identifier (no string from the user reaches generated code otherwise), and the
default names (``default_op_name``, ``default_package_name``)."""
from __future__ import annotations

import keyword
import os
import re
import sys
from pathlib import Path

from ..spec.config import KernelConfig
from ..spec.types import Order

#: The rule for the package name and every op name (also a C++/Python-safe token).
IDENTIFIER_RULE = r"^[a-z_][a-z0-9_]*$"
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")  # used with fullmatch: "$" alone would let "x\n" through

#: Package names that would shadow a module the package needs, or a torch.ops attribute / namespace.
RESERVED_PACKAGE_NAMES = frozenset({
    "torch", "generator", "gemmgen", "gemmgen_templates", "setuptools", "pip", "wheel", "ninja", "pkg_resources",
    "aten", "prim", "prims", "quantized", "higher_order", "inductor", "profiler", "mkl", "mkldnn", "onednn",
    "loaded_libraries", "load_library", "import_module", "c10", "c10d", "_c10d_functional",
})
#: Op names that torch.ops.<namespace> already uses for itself.
RESERVED_OP_NAMES = frozenset({"name"})


def check_identifier(value: object, what: str, example: str) -> str:
    """``value`` if it is a lowercase ASCII identifier (IDENTIFIER_RULE) and not a Python keyword."""
    rule = (f"a lowercase ASCII identifier: letters a-z, digits and '_', not starting with a digit "
            f"(regex {IDENTIFIER_RULE}), and not a Python keyword; e.g. {what}={example!r}")
    if not isinstance(value, str):
        raise ValueError(f"{what}={value!r} must be a string, {rule}")
    if not _IDENTIFIER.fullmatch(value):
        raise ValueError(f"{what}={value!r} is not allowed: it must be {rule}")
    if keyword.iskeyword(value):
        raise ValueError(f"{what}={value!r} is a Python keyword: it must be {rule}")
    return value


def check_package_name(name: object) -> str:
    check_identifier(name, "name", "my_gemms")
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    if name in RESERVED_PACKAGE_NAMES or name in stdlib or name.startswith("__"):
        raise ValueError(f"name={name!r} would shadow a module of that name (or a torch.ops namespace): "
                         f"pick another package name, e.g. name='my_gemms'")
    return name


def check_op_name(op_name: object) -> str:
    check_identifier(op_name, "op name", "gemm_bf16_tn")
    if op_name.startswith("_"):
        raise ValueError(f"op name {op_name!r} starts with '_': op names are the package's public functions "
                         f"(its private helpers use that prefix); e.g. 'gemm_bf16_tn'")
    if op_name in RESERVED_OP_NAMES:
        raise ValueError(f"op name {op_name!r} is an attribute of every torch.ops namespace: pick another, "
                         f"e.g. 'gemm_bf16_tn'")
    return op_name


def grad_op_name(config: KernelConfig) -> str:
    """The private op that runs ``config``'s kernel in the backward pass: ``_grad_<kernel name>``."""
    return check_identifier(f"_grad_{config.name}", "backward op name", "_grad_sm80_bf16_tt_128x128x32_w2x2_s4_g8")


def default_op_name(config: KernelConfig) -> str:
    """``gemm_<dtype>_<layout>``, ``_o<out dtype>`` when D's dtype differs (``_amax`` after it with the amax of D),
    ``_dcol`` for a column-major D, ``_fa``
    for fp8's fast accumulation, and the epilogue's tag (lowercase) for a fused epilogue:
    ``gemm_bf16_tn_gelu_cbias``; ``<dtype>`` names both inputs where they differ (``e5m2xe4m3``)."""
    out = "" if config.out_dtype == config.dtype else f"_o{config.out_dtype.value}"
    dcol = "_dcol" if config.layout.c is Order.col else ""
    fast = "_fa" if config.fast_accum else ""
    amax = "_amax" if config.amax else ""
    epilogue = "" if config.epilogue.is_identity else f"_{config.epilogue.tag.lower()}"
    return f"gemm_{config.dtype_tag}_{config.layout.blas}{out}{amax}{dcol}{fast}{epilogue}"


def check_operand_names(config: KernelConfig) -> None:
    """The epilogue's operand names become parameters of the package's Python function: no keyword, and no
    leading '_' (the module's own helpers, which the function calls, all have one)."""
    for op in config.epilogue.operands:
        if keyword.iskeyword(op.name) or op.name.startswith("_"):
            why = "a Python keyword" if keyword.iskeyword(op.name) else "a name starting with '_'"
            raise ValueError(f"the epilogue operand {op.name!r} of {config.name} is {why}, which cannot be a "
                             "parameter of the package's function: rename the operand")


def default_package_name(out: str | os.PathLike[str]) -> str:
    """The package name that ``plan.emit(out)`` uses: the folder's name, when it is a valid one."""
    folder = Path(out).name
    try:
        return check_package_name(folder)
    except ValueError as err:
        raise ValueError(f"the folder name {folder!r} is not a valid package name, so pass name=...: {err}") from None
