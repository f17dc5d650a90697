"""emit: one or more plans -> a standalone, pip-installable torch extension package.

    from generator import Gemm, emit
    emit([Gemm("bf16", "tn", arch=90), Gemm("fp16", "nn", arch=80)], name="my_gemms", out="emitted/my_gemms")
    # shell: pip install --no-build-isolation ./emitted/my_gemms
    # python: import my_gemms; D = my_gemms.gemm_bf16_tn(A, B)     (also torch.ops.my_gemms.gemm_bf16_tn)

The package folder holds everything its build needs and nothing of this generator:

    pyproject.toml, setup.py    torch.utils.cpp_extension (CUDAExtension, BuildExtension with ninja)
    csrc/<kernel>.cu            the rendered kernels (plain CUDA, C interface), one per distinct config,
                                the backward pass's kernels included
    csrc/common/..., ptx/, ...  every header the kernels may include, copied with its relative path
    csrc/binding.cpp            the one file compiled with torch headers: TORCH_LIBRARY(<name>); its checks,
                                launch and Meta kernels are csrc/torch/gemm_op.h, its Autograd kernels
                                csrc/torch/gemm_autograd.h (as the JIT runtime's)
    <name>/__init__.py          loads the extension; one Python function per op, with a docstring
    <name>/_grouped_formula.py  with autograd: the backward of grouped calls, a copy of
                                generator/runtime/grouped_formula.py (torch only), registered by __init__.py
    plans.json                  the plans, pinned (feed it to ``python -m generator emit --plans``): every knob,
                                and a plan's size hints (its split-K follows from them)
    README.md, MANIFEST.in, .gitignore

Fused epilogues (``Gemm(..., activation="gelu", bias="col")``, ``Gemm(..., epilogue=fn)``): the op takes the
epilogue's operands after A and B (schema ``(Tensor A, Tensor B, Tensor bias, float alpha, ...)``, returning
``(D, aux)`` when the epilogue has a second output), checked and launched by gemm_op.h's boxed kernels (the
JIT ops' code). Its function's docstring states the expression and each operand (``D = gelu(acc + bias)``,
``bias: per-column vector (N,), bf16``). plans.json records the knobs of a plan made with knobs
(activation, bias, alpha, beta), and the structure of a function epilogue (``epilogue_to_json``), from which
``--plans`` rebuilds it. With autograd, such an op is differentiable with the JIT op's formula
(``generator.runtime.autograd``), in Python: ``<name>/__init__.py`` holds the epilogue as a function of torch
operations (``generator.render.epilogue_python``) and registers (``torch.library.register_autograd``) a
backward that recomputes acc = A @ B in fp32 by a private op of the package (``accumulator_config``: the plain
kernel of the plan, writing fp32), differentiates the function at acc with torch.autograd, and runs
dA = dacc @ B.t() and dB = A.t() @ dacc on the same backward ops as a plain op of the plan; binding.cpp
gives its default overload no Autograd kernel of its own. Without autograd, its Autograd kernel refuses
arguments that require grad; ``.out`` refuses them either way.

Autograd (``autograd=True``, the default) is gemmgen's formula (``generator.runtime.autograd``; in C++ in
gemm_autograd.h, registered by binding.cpp for every op without a fused epilogue): dA = dD @ B.t() and
dB = A.t() @ dD by kernels of the package, with the layouts ``generator.planner.backward`` derives for a
row-major and a column-major dD, planned for the backward problems of the plan's size hints where it has them
(``EmittedOp.problem``). Those kernels are private ops of the package (``_grad_<kernel>``), and so are the kernels
of their own backward (double backward, planned without hints): ``backward_closure``, at most eight kernels per
dtype, architecture and family beside each hinted plan's own dA and dB, and one per fused epilogue's acc kernel;
deduplicated by kernel name.

Grouped calls (``.grouped``, ``.grouped_list``) are differentiable with the JIT ops' formulas too: the package
carries ``generator/runtime/grouped_formula.py`` byte for byte (it imports only torch), and ``__init__.py``
registers its formulas (``torch.library.register_autograd``) on the grouped overloads of every differentiable op,
the backward ops included (double backward), calling the same backward ops. Which of those take grouped and list
calls (``grouped_refusal``, ``grouped_list_refusal``) is decided here, from their plans, and recorded in
``__init__.py``; the 16-byte rule is tested at the call. binding.cpp registers no Autograd kernel for those
overloads; packages without autograd, and fp8 and int8 ops, keep gemm_op.h's GroupedAutogradKernel, which refuses
arguments that require grad.

Emitting is pure text generation: no torch, no GPU, no compiler. It is deterministic (the same plans
give byte-identical files: sorted, no timestamps, no absolute paths), and no string from the user
reaches generated code: the package name and op names must be plain lowercase identifiers, and
everything else comes from validated configs.

The code, one idea a module, each importing only the ones above it:

    names.py      the package name and the op names: checked (check_package_name, check_op_name, ...) and defaulted
                  (default_op_name, default_package_name)
    ops.py        what gets emitted: EmittedOp (an op and its template context), resolve_ops (plans -> ops),
                  backward_ops (the private ops of the backward pass)
    tuned.py      measured winners (``tuning``): routes, Route, tuned_op_name
    files.py      package_files: ops -> {path in the package: bytes}, rendered from templates/emit (GENCODE,
                  plans.json)
    write.py      write_package: those files -> the folder ``out``
    __init__.py   emit(): all of the above, in that order; and every name above that is not private
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, Sequence

from ..spec.config import KernelConfig
from ..tune.cache import Table, load_tables
from .files import (GENCODE, GROUPED_FORMULA_MODULE, MARKER, PACKAGE_VERSION, PLANS_FILE, grouped_formula_source,
                    package_files)
from .names import (IDENTIFIER_RULE, RESERVED_OP_NAMES, RESERVED_PACKAGE_NAMES, check_identifier, check_op_name,
                    check_operand_names, check_package_name, default_op_name, default_package_name, grad_op_name)
from .ops import EmittedOp, backward_ops, resolve_ops
from .tuned import Route, routes, tuned_op_name
from .write import write_package

__all__ = ["GENCODE", "GROUPED_FORMULA_MODULE", "IDENTIFIER_RULE", "MARKER", "PACKAGE_VERSION", "PLANS_FILE",
           "RESERVED_OP_NAMES", "RESERVED_PACKAGE_NAMES", "EmittedOp", "Plan", "Route", "backward_ops",
           "check_identifier", "check_op_name", "check_operand_names", "check_package_name", "default_op_name",
           "default_package_name", "emit", "grad_op_name", "grouped_formula_source", "package_files", "resolve_ops",
           "routes", "tuned_op_name", "write_package"]


class Plan(Protocol):
    """What emit reads of a plan (a ``generator.Gemm``): its config."""

    @property
    def config(self) -> KernelConfig: ...


def emit(plans: Plan | KernelConfig | Sequence[Plan | KernelConfig], name: str, out: str | os.PathLike[str], *,
         op_names: Sequence[str | None] | None = None, autograd: bool = True,
         tuning: str | os.PathLike[str] | Sequence[Table] | None = None) -> Path:
    """Write a pip-installable package ``name`` with one torch op per plan into the folder ``out``.

    ``op_names`` (one per plan, in order; None for the default) default to ``gemm_<dtype>_<layout>``
    (+ ``_o<out dtype>``, + ``_dcol``). ``autograd`` (default True) makes the ops differentiable, with
    the backward kernels in the package (up to 8 per dtype and architecture: a longer build); False
    leaves them out. A folder emitted before is replaced; any other non-empty folder is refused.
    ``tuning``: a tuning table file (``tune --export``'s, a cache table, or an emitted package's plans.json) or
    tables: the package also holds the kernels measured fastest for the ops' requests, and an op's function calls
    one for a 2-D call of exactly the sizes it won on, on the GPU it was measured on (docs/tuning.md).
    Returns ``out``. Needs neither torch nor a GPU; install the result with
    ``pip install --no-build-isolation <out>`` (torch and nvcc needed there).
    """
    check_package_name(name)
    if not isinstance(autograd, bool):
        raise TypeError(f"autograd={autograd!r} must be True or False")
    ops = resolve_ops(plans, op_names)
    tables = load_tables(tuning) if isinstance(tuning, (str, os.PathLike)) else list(tuning or ())
    return write_package(package_files(ops, name, autograd, tables), out)
