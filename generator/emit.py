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
"""
from __future__ import annotations

import json
import keyword
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, Sequence

import jinja2

from .planner.backward import accumulator_config, autograd_form, backward_closure, backward_configs
from .planner.common import Problem
from .render import included_headers, render, templates_dir
from .render.epilogue_python import python_function
from .spec.config import KernelConfig, check_config, grouped_list_refusal, grouped_refusal
from .spec.epilogue import KINDS, KNOB_NAMES, Epilogue, epilogue_to_json, from_knobs
from .spec.types import DType, Order
from .tune.cache import EntryKey, Table, apply_fields, bundle_json, load_tables


class Plan(Protocol):
    """What emit reads of a plan (a ``generator.Gemm``): its config."""

    @property
    def config(self) -> KernelConfig: ...


#: The rule for the package name and every op name (also a C++/Python-safe token).
IDENTIFIER_RULE = r"^[a-z_][a-z0-9_]*$"
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")  # used with fullmatch: "$" alone would let "x\n" through
#: The version written into every emitted package.
PACKAGE_VERSION = "0.1.0"
#: Marks a folder as written by emit, so that emitting again may replace it (and nothing else).
MARKER = {"emitted_by": "gemmgen", "format": 1}
PLANS_FILE = "plans.json"

#: Package names that would shadow a module the package needs, or a torch.ops attribute / namespace.
RESERVED_PACKAGE_NAMES = frozenset({
    "torch", "generator", "gemmgen", "gemmgen_templates", "setuptools", "pip", "wheel", "ninja", "pkg_resources",
    "aten", "prim", "prims", "quantized", "higher_order", "inductor", "profiler", "mkl", "mkldnn", "onednn",
    "loaded_libraries", "load_library", "import_module", "c10", "c10d", "_c10d_functional",
})
#: Op names that torch.ops.<namespace> already uses for itself.
RESERVED_OP_NAMES = frozenset({"name"})

#: nvcc targets per planned architecture. sm_80/86/89 also carry PTX, so newer GPUs can JIT it;
#: sm_90a (wgmma, setmaxnreg) has no forward-compatible PTX.
GENCODE = {
    80: "-gencode=arch=compute_80,code=[sm_80,compute_80]",
    86: "-gencode=arch=compute_86,code=[sm_86,compute_86]",
    89: "-gencode=arch=compute_89,code=[sm_89,compute_89]",
    90: "-gencode=arch=compute_90a,code=sm_90a",
}

# C++ spellings of the element types (c10::ScalarType) and their torch names.
_SCALAR_TYPE = {DType.fp16: "c10::ScalarType::Half", DType.bf16: "c10::ScalarType::BFloat16",
                DType.fp32: "c10::ScalarType::Float", DType.tf32: "c10::ScalarType::Float",
                DType.e4m3: "c10::ScalarType::Float8_e4m3fn", DType.e5m2: "c10::ScalarType::Float8_e5m2",
                DType.int8: "c10::ScalarType::Char", DType.int32: "c10::ScalarType::Int"}


_GPU_DOC = {90: "built as sm_90a, it runs on GPUs of compute capability 9.0 (H100, H200)"}

# C++ spellings of the epilogue operands' kinds (gemmgen::OperandKind in templates/torch/gemm_op.h): the kind in
# CamelCase, "row_blocks" -> gemmgen::OperandKind::RowBlocks.
_OPERAND_KIND = {kind: "gemmgen::OperandKind::" + kind.title().replace("_", "") for kind in KINDS}

# How each operand is stored, for the docstrings: (operand, order) -> text.
_OPERAND_DOC = {
    ("A", Order.row): "row-major, strides (lda, 1) with lda >= K; e.g. a contiguous x of shape (M, K)",
    ("A", Order.col): "column-major, strides (1, lda) with lda >= M; e.g. X.t() for a contiguous X of shape (K, M)",
    ("B", Order.row): "row-major, strides (ldb, 1) with ldb >= N; e.g. a contiguous y of shape (K, N)",
    ("B", Order.col): "column-major, strides (1, ldb) with ldb >= K; e.g. W.t() for a contiguous W of shape (N, K) "
                      "(an nn.Linear weight)",
    ("D", Order.row): "row-major, strides (N, 1): torch.empty(M, N)",
    ("D", Order.col): "column-major, strides (1, M): torch.empty(N, M).t()",
}

#: The operands of a grouped call (op.grouped: a mixture of experts' rows), per storage order, for docstrings.
_GROUPED_DOC = {
    ("A", Order.row): "row-major, strides (lda, 1) with lda >= K: every group's rows, sorted by group",
    ("A", Order.col): "column-major, strides (1, lda) with lda >= total_M: every group's rows, sorted by group",
    ("B", Order.row): "each matrix row-major, strides (stride, ldb, 1) with ldb >= N",
    ("B", Order.col): "each matrix column-major, strides (stride, 1, ldb) with ldb >= K: W.transpose(1, 2) for "
                      "experts' weights W (E, N, K)",
    ("D", Order.row): "row-major: torch.empty(total_M, N)",
    ("D", Order.col): "column-major: torch.empty(N, total_M).t()",
}


# -- names --------------------------------------------------------------------------------------------

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
    """``gemm_<dtype>_<layout>``, ``_o<out dtype>`` when D's dtype differs, ``_dcol`` for a column-major D, ``_fa``
    for fp8's fast accumulation, and the epilogue's tag (lowercase) for a fused epilogue:
    ``gemm_bf16_tn_gelu_cbias``; ``<dtype>`` names both inputs where they differ (``e5m2xe4m3``)."""
    out = "" if config.out_dtype == config.dtype else f"_o{config.out_dtype.value}"
    dcol = "_dcol" if config.layout.c is Order.col else ""
    fast = "_fa" if config.fast_accum else ""
    epilogue = "" if config.epilogue.is_identity else f"_{config.epilogue.tag.lower()}"
    return f"gemm_{config.dtype_tag}_{config.layout.blas}{out}{dcol}{fast}{epilogue}"


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


# -- what gets emitted --------------------------------------------------------------------------------

@dataclass(frozen=True)
class EmittedOp:
    """One op of the package: its name and the kernel config behind it; ``knobs``: the epilogue knobs the plan
    was made with ((name, value) pairs; empty for a function epilogue, a KernelConfig, or none)."""

    name: str
    config: KernelConfig
    knobs: tuple[tuple[str, Any], ...] = ()
    # The plan's size hints ((name, value) pairs: m, n, k, batch), where it had any: the planner's split-K choice
    # (config.stream_k) depends on them, so plans.json has to give them back for the same kernel to be planned.
    hints: tuple[tuple[str, int], ...] = ()

    @property
    def problem(self) -> Problem | None:
        """The forward problem of the plan's size hints, which its backward kernels are planned for
        (planner.backward.backward_configs); None without hints, or for a batch (which has no backward)."""
        hints = dict(self.hints)
        if not hints or hints.get("batch", 1) != 1:
            return None
        return Problem(hints["m"], hints["n"], hints["k"])

    @property
    def differentiable(self) -> bool:
        """Whether a package emitted with autograd differentiates it: every op of a float type does (A @ B by
        gemm_autograd.h's C++ formula, a fused epilogue by the Python formula of the package's __init__.py);
        fp8 and int8 ops are forward only, and refuse arguments that require grad."""
        return not self.config.dtype.is_quantized

    def context(self, package: str, autograd: bool) -> dict[str, Any]:
        cfg = self.config
        layout = cfg.layout
        flip = {"t": "n", "n": "t"}
        autograd = autograd and self.differentiable
        return {
            "name": self.name,
            "autograd": autograd,
            "quantized": cfg.dtype.is_quantized,
            # per storage order of dD: the ops computing dA and dB, for binding.cpp's autograd specs (A @ B) and
            # __init__.py's formula (a fused epilogue: dacc in place of dD)
            "grads": _grads(cfg, self.problem) if autograd else None,
            "qualname": f"torch.ops.{package}.{self.name}",
            "kernel": cfg.name,
            "arch": cfg.arch,
            "gpu_doc": _GPU_DOC.get(cfg.arch, f"runs on GPUs of compute capability {cfg.arch // 10}.{cfg.arch % 10} "
                                               "or newer (newer ones JIT its PTX)"),
            "dtype": cfg.dtype.value,
            "out_dtype": cfg.out_dtype.value,
            "torch_dtype": f"torch.{cfg.dtype.torch_name}",
            "torch_dtype_b": f"torch.{cfg.b_dtype.torch_name}",
            "inputs": cfg.dtype_tag.replace("x", " x "),                           # "bf16", "e5m2 x e4m3"
            "inputs_doc": (f"{cfg.dtype.value} (torch.{cfg.dtype.torch_name})" if cfg.dtype_b is None else
                           f"A {cfg.dtype.value} (torch.{cfg.dtype.torch_name}) and B {cfg.dtype_b.value} "
                           f"(torch.{cfg.dtype_b.torch_name})"),
            "accumulation": "int32" if cfg.dtype is DType.int8 else "fp32",
            "torch_out_dtype": f"torch.{cfg.out_dtype.torch_name}",
            # torch's names of the dtypes (getattr(torch, name)), for __init__.py's grouped formulas
            "torch_name": cfg.dtype.torch_name,
            "out_torch_name": cfg.out_dtype.torch_name,
            "scalar_type": _SCALAR_TYPE[cfg.dtype],
            "dtype_b": cfg.dtype_b.value if cfg.dtype_b is not None else None,   # fp8 e4m3 x e5m2
            "scalar_type_b": _SCALAR_TYPE[cfg.b_dtype],
            "out_scalar_type": _SCALAR_TYPE[cfg.out_dtype],
            "layout": layout.blas,
            "layout_tag": layout.tag,
            "layout_a": layout.a.value,
            "layout_b": layout.b.value,
            "layout_c": layout.c.value,
            "a_row": layout.a is Order.row,
            "b_row": layout.b is Order.row,
            "d_row": layout.c is Order.row,
            # the layout that would take A (or B) as it is, for the stride error's advice
            "layout_a_flipped": flip[layout.blas[0]] + layout.blas[1],
            "layout_b_flipped": layout.blas[0] + flip[layout.blas[1]],
            "a_doc": _OPERAND_DOC["A", layout.a],
            "b_doc": _OPERAND_DOC["B", layout.b],
            "d_doc": _OPERAND_DOC["D", layout.c],
            "knobs": _knobs_doc(cfg),
            # what its function calls: the op itself, or the measured winner of the call's sizes (see _routes)
            "call": f"_OPS.{self.name}",
            "routes": [],
            **_epilogue_context(cfg.epilogue, boxed=cfg.dtype.is_quantized),
            **self._epilogue_formula(autograd),
            **_grouped_context(cfg),
        }

    def _epilogue_formula(self, autograd: bool) -> dict[str, Any]:
        """What __init__.py needs for an epilogue op's autograd formula: the private op recomputing acc in fp32,
        and the epilogue as a Python function of torch operations (all None for a plain op, or without autograd)."""
        ep = self.config.epilogue
        if not autograd or ep.is_identity:
            return {"acc_op": None, "epilogue_fn": None, "epilogue_source": None}
        fn = f"_epilogue_{self.name}"   # op names have no leading '_': no clash with a public function
        return {"acc_op": grad_op_name(accumulator_config(self.config)), "epilogue_fn": fn,
                "epilogue_source": python_function(ep, fn, torch_module="_torch", functional_module="_F")}

    def plan_record(self) -> dict[str, Any]:
        """Gemm keyword arguments that plan exactly this config again, plus the op and kernel names."""
        cfg = self.config
        record: dict[str, Any] = {
            "op_name": self.name,
            "kernel": cfg.name,
            "dtype": cfg.dtype.value,
            "out_dtype": cfg.out_dtype.value,
            "layout": cfg.layout.blas,
            "layout_c": cfg.layout.c.value,
            "arch": cfg.arch,
            "family": cfg.family,
            "tile_shape": "x".join(map(str, cfg.tile)),
        }
        if cfg.family == "sm90":
            record.update(schedule=cfg.schedule, cluster_shape="x".join(map(str, cfg.cluster)), raster=cfg.raster)
            if cfg.fast_accum:
                record["fast_accum"] = True
            if cfg.dtype_b is not None:
                record["dtype_b"] = cfg.dtype_b.value
        else:
            record["warps"] = "x".join(map(str, cfg.warps))
        record.update(stages=cfg.stages, raster_group=cfg.raster_group)
        record.update(self.hints)
        ep = cfg.epilogue
        if self.knobs:
            record.update(self.knobs)
        elif not ep.is_identity:
            # a function epilogue: its structure, which --plans rebuilds (generator.spec.epilogue_from_json)
            record["epilogue"] = epilogue_to_json(ep)
        if not ep.is_identity:
            record["epilogue_text"] = ep.text
        return record


def _epilogue_context(ep: Epilogue, boxed: bool = False) -> dict[str, Any]:
    """What the templates say and register of an op's fused epilogue (nothing of it for a plain op)."""
    operands = [{
        "name": o.name,
        "kind": o.kind,
        "cpp_kind": _OPERAND_KIND[o.kind],
        "scalar_type": _SCALAR_TYPE[o.dtype],
        "dtype": o.dtype.value,
        "torch_dtype": f"torch.{o.dtype.torch_name}",
        "row": o.order is not Order.col,
        "schema_type": "float" if o.kind == "scalar" else "Tensor",
        "shape": o.shape,
        "doc": o.describe(),
    } for o in ep.operands]
    return {
        "epilogue": not ep.is_identity,
        # operands or a second output: a schema of its own, so gemm_op.h's boxed kernels
        # (and every fp8 or int8 op, ``boxed``: the boxed Autograd kernel refuses grad where no formula exists)
        "boxed": boxed or bool(ep.operands) or ep.aux is not None,
        "operands": operands,
        "aux": ep.aux is not None,
        "epilogue_text": ep.text,
        "expression": ep.describe()[: 2 if ep.aux is not None else 1],
        "schema_arguments": "".join(f", {o['schema_type']} {o['name']}" for o in operands),
        "schema_returns": "(Tensor, Tensor)" if ep.aux is not None else "Tensor",
    }


def _grouped_context(cfg: KernelConfig) -> dict[str, Any]:
    """An op without a fused epilogue has the .grouped and .grouped_list overloads (grouped GEMM: a mixture of
    experts' rows; a list of problems), as the JIT ops (generator.runtime.registration: has_grouped); its OpSpec says
    why the plan takes no such call, if it does not (generator.spec.config.grouped_refusal, grouped_list_refusal: the
    op refuses such a call with these words)."""
    grouped = cfg.epilogue.is_identity
    refusal = grouped_refusal(cfg) if grouped else None
    list_refusal = grouped_list_refusal(cfg) if grouped else None
    docs = {f"grouped_{what.lower()}_doc": _GROUPED_DOC[what, order]
            for what, order in (("A", cfg.layout.a), ("B", cfg.layout.b), ("D", cfg.layout.c))}
    return {"grouped": grouped, "grouped_refusal": refusal, "grouped_list_refusal": list_refusal, **docs,
            # as a backward op: whether the grouped formulas may call it grouped (listed), recorded at emit time
            "takes_grouped": grouped and refusal is None, "takes_list": grouped and list_refusal is None,
            # as C string literals (the sentences are the generator's own, but escaped all the same)
            "grouped_refusal_c": None if refusal is None else json.dumps(refusal, ensure_ascii=True),
            "grouped_list_refusal_c": None if list_refusal is None else json.dumps(list_refusal, ensure_ascii=True)}


def _plan_knobs(item: object, config: KernelConfig) -> tuple[tuple[str, Any], ...]:
    """The epilogue knobs of a Gemm plan, when they are what made its epilogue; () otherwise."""
    knobs = tuple((k, getattr(item, k, None)) for k in KNOB_NAMES if getattr(item, k, None) is not None)
    if not knobs or config.epilogue != from_knobs(**dict(knobs)).resolved(config.out_dtype):
        return ()
    return knobs


def _grads(cfg: KernelConfig, problem: Problem | None = None) -> dict[str, dict[str, Any]]:
    """{"row" | "col": the op computing dA ("a") and dB ("b") for a dD stored in that order, the storage orders in
    which they take B.t() ("a_b_row") and A.t() ("b_a_row"; B and A where they compute the transpose), True =
    row-major, and whether they do ("a_transposed", "b_transposed"): planner.backward.autograd_form}. ``problem``:
    the plan's forward problem, which dA and dB are planned for (EmittedOp.problem)."""
    grads: dict[str, dict[str, Any]] = {}
    for order in Order:
        grad_a, grad_b = backward_configs(cfg, order, problem)
        form = autograd_form(cfg, grad_a, grad_b)
        grads[order.value] = {"a": grad_op_name(grad_a), "b": grad_op_name(grad_b), "a_b_row": form.a_b_row,
                              "b_a_row": form.b_a_row, "a_transposed": form.a_transposed,
                              "b_transposed": form.b_transposed}
    return grads


def backward_ops(ops: Sequence[EmittedOp]) -> list[EmittedOp]:
    """The package's private backward ops: one per kernel that the backward of ``ops`` needs, double
    backward included (``backward_closure``), and for an op with a fused epilogue the kernel recomputing its
    acc (``accumulator_config``; its dA and dB kernels, and theirs, are the closure of the op's own config);
    sorted and deduplicated by kernel name."""
    ops = [op for op in ops if op.differentiable]
    configs = backward_closure([op.config for op in ops], [op.problem for op in ops])
    for op in ops:
        if not op.config.epilogue.is_identity:
            acc = accumulator_config(op.config)
            configs[acc.name] = acc
    return [EmittedOp(grad_op_name(cfg), cfg) for _, cfg in sorted(configs.items())]


def _knobs_doc(cfg: KernelConfig) -> str:
    """The knobs that shape the kernel, for its op's docstring: 'tile ..., warps ..., N stages'."""
    tile = "x".join(map(str, cfg.tile))
    if cfg.family == "sm90":
        cluster = "x".join(map(str, cfg.cluster))
        return f"tile {tile}, {cfg.schedule} schedule, cluster {cluster}, {cfg.stages} stages"
    return f"tile {tile}, warps {'x'.join(map(str, cfg.warps))}, {cfg.stages} stages"


def _configs(plans: object) -> list[tuple[KernelConfig, tuple[tuple[str, Any], ...], tuple[tuple[str, int], ...]]]:
    """(config, epilogue knobs, size hints) per plan."""
    items = list(plans) if isinstance(plans, (list, tuple)) else [plans]
    if not items:
        raise ValueError("emit needs at least one plan, e.g. emit([Gemm('bf16', 'tn', arch=90)], name=..., out=...)")
    configs = []
    for i, item in enumerate(items):
        config = item if isinstance(item, KernelConfig) else getattr(item, "config", None)
        if not isinstance(config, KernelConfig):
            raise TypeError(f"plans[{i}] is a {type(item).__name__}; pass Gemm plans (or KernelConfigs)")
        check_operand_names(config)
        if config.dtype is DType.tf32 and config.family == "sm90":
            # The package's C++ autograd formula takes the gradient as it is stored, which sm90's tf32 kernels
            # (K-major only) cannot always read; the JIT op (Gemm(...).compile()) has the formula that copies it.
            # sm80's tf32 kernels take every layout.
            raise ValueError(f"plans[{i}] is an sm90 tf32 plan: emitted packages carry tf32 ops of the sm80 family "
                             "only; plan it with family='sm80', or use Gemm(...).compile() for it")
        if isinstance(item, KernelConfig):
            configs.append((config, (), ()))
        else:
            configs.append((config, _plan_knobs(item, config), _plan_hints(item)))
    return configs


def _plan_hints(item: object) -> tuple[tuple[str, int], ...]:
    """A Gemm plan's size hints as (name, value) pairs (batch only where it is not 1); () for a plan without."""
    problem = getattr(item, "problem", None)
    if problem is None:
        return ()
    hints = (("m", problem.m), ("n", problem.n), ("k", problem.k))
    return hints + ((("batch", problem.batch),) if problem.batch != 1 else ())


def resolve_ops(plans: object, op_names: Sequence[str | None] | None = None) -> list[EmittedOp]:
    """Pair every plan with its op name (given, or the default where None), refusing bad and duplicate
    names; sorted by op name."""
    planned = _configs(plans)
    configs = [config for config, _, _ in planned]
    if op_names is None:
        op_names = [None] * len(configs)
    if isinstance(op_names, str) or len(op_names) != len(configs):
        raise ValueError(f"op_names must be a list with one name per plan ({len(configs)}), got {op_names!r}")
    names = [default_op_name(c) if n is None else check_op_name(n) for n, c in zip(op_names, configs)]
    seen: dict[str, int] = {}
    for i, op_name in enumerate(names):
        if op_name in seen:
            j = seen[op_name]
            clashing = [k for k, n in enumerate(names) if n == op_name]
            by_arch = len({configs[k].arch for k in clashing}) == len(clashing)
            suggestion = [(f"{n}_sm{c.arch}" if by_arch else f"{n}_{clashing.index(k) + 1}") if n == op_name else n
                          for k, (n, c) in enumerate(zip(names, configs))]
            raise ValueError(
                f"plans {j} ({configs[j].name}, sm_{configs[j].arch}) and {i} ({configs[i].name}, "
                f"sm_{configs[i].arch}) both map to the op name {op_name!r}: give one distinct op name per plan, "
                f"e.g. op_names={suggestion!r} (on the command line: --op-name, or op_name= in a --plan)")
        seen[op_name] = i
    return sorted((EmittedOp(n, c, knobs, hints) for n, (c, knobs, hints) in zip(names, planned)),
                  key=lambda op: op.name)


# -- rendering ----------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir() / "emit")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def _render(template: str, **context: Any) -> str:
    return _environment().get_template(template).render(**context)


# -- measured winners (emit --tuning) --------------------------------------------------------------------------

def tuned_op_name(config: KernelConfig) -> str:
    """The private op that runs a measured winner's kernel: ``_tuned_<kernel name>``."""
    return check_identifier(f"_tuned_{config.name}", "tuned op name", "_tuned_sm90_bf16_tn_128x128x64_c1x1_s6_pp_g8m")


@dataclass(frozen=True)
class Route:
    """A call of exactly M x N x K by an op, on one GPU, that takes a measured winner's kernel instead of the op's."""

    gpu: str
    sm_count: int
    m: int
    n: int
    k: int
    config: KernelConfig
    ms: float
    estimate_ms: float


def _matches(entry_key: EntryKey, cfg: KernelConfig) -> bool:
    """Whether a tuning entry was measured for ``cfg``'s request (arch, family, dtypes, layout, epilogue) on a single
    problem, whatever its sizes."""
    return (entry_key.arch == cfg.arch and entry_key.family == cfg.family and entry_key.dtype == cfg.dtype_tag
            and entry_key.out_dtype == cfg.out_dtype.value and entry_key.layout == cfg.layout.tag
            and entry_key.epilogue == cfg.epilogue.name_suffix and entry_key.batch == 1)


def routes(op: EmittedOp, tables: Sequence[Table]) -> list[Route]:
    """The calls of ``op`` that a measured winner of ``tables`` takes: per GPU and exact size, the fastest entry
    measured for the op's request whose winner is another kernel than the op's (rebuilt on the op's config and
    checked: an entry that no longer names the same kernel is left out). Sorted, so the package is deterministic."""
    best: dict[tuple[str, int, int, int, int], Route] = {}
    for table in tables:
        for entry in table.entries.values():
            if not _matches(entry.key, op.config):
                continue
            try:
                winner = apply_fields(op.config, entry.config)
                check_config(winner)
            except (TypeError, ValueError):
                continue
            if winner.name != entry.kernel or winner.name == op.config.name:
                continue
            where = (table.device.gpu, table.device.sm_count, entry.key.m, entry.key.n, entry.key.k)
            if where not in best or entry.ms < best[where].ms:
                best[where] = Route(*where, winner, entry.ms, entry.estimate_ms)
    return [best[where] for where in sorted(best)]


def _routes_context(found: list[Route]) -> list[dict[str, Any]]:
    """TUNED's entries of one op in __init__.py: per GPU (its name as a Python string literal), its shapes."""
    devices: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in found:
        devices.setdefault((r.gpu, r.sm_count), []).append(
            {"m": r.m, "n": r.n, "k": r.k, "op": tuned_op_name(r.config), "ms": f"{r.ms:.4g}",
             "estimate_ms": f"{r.estimate_ms:.4g}"})
    # json.dumps of a str is a valid Python string literal: a GPU name read from a table cannot break the code
    return [{"gpu": json.dumps(gpu, ensure_ascii=True), "sm_count": int(sms), "shapes": shapes}
            for (gpu, sms), shapes in devices.items()]


def package_files(ops: Sequence[EmittedOp], name: str, autograd: bool = True,
                  tuning: Sequence[Table] = ()) -> dict[str, bytes]:
    """{relative path: content} of the package; pure (reads only the shipped templates and headers).

    ``ops`` are the public ops; with ``autograd``, their backward ops join them in the binding. ``tuning``: tuning
    tables whose winners the package embeds (``routes``): private ops of the winning kernels, which an op's function
    calls for a 2-D call of exactly the sizes they won on, on the GPU they won on."""
    check_package_name(name)
    for op in ops:
        check_op_name(op.name)
        check_operand_names(op.config)
    found = {op.name: routes(op, tuning) for op in ops}
    tuned = {tuned_op_name(r.config): r.config for rs in found.values() for r in rs}
    tuned_ops = [EmittedOp(n, c) for n, c in sorted(tuned.items())]
    grads = backward_ops([*ops, *tuned_ops]) if autograd else []
    files: dict[str, bytes] = {}
    kernels: dict[str, KernelConfig] = {}
    for op in [*ops, *tuned_ops, *grads]:
        kernels.setdefault(op.config.name, op.config)
    for kernel in sorted(kernels):
        for filename, text in render(kernels[kernel]).items():
            files[f"csrc/{filename}"] = text.encode()
    root = templates_dir()
    for header in included_headers():
        files[f"csrc/{header.relative_to(root).as_posix()}"] = header.read_bytes()
    archs = sorted({op.config.arch for op in ops})
    context = {
        "name": name,
        "version": PACKAGE_VERSION,
        "autograd": autograd,
        "ops": [op.context(name, autograd) for op in ops],            # public: functions of __init__.py
        "backward_ops": [op.context(name, autograd) for op in grads],  # private: torch.ops.<name>._grad_*
        "tuned_ops": [op.context(name, autograd) for op in tuned_ops],  # private: torch.ops.<name>._tuned_*
        "kernels": sorted(kernels),
        "archs": archs,
        "gencodes": [GENCODE[a] for a in archs],
        "sources": ["csrc/binding.cpp", *(f"csrc/{k}.cu" for k in sorted(kernels))],
    }
    for op in context["ops"]:
        if found[op["name"]]:
            op.update(routes=_routes_context(found[op["name"]]), call=f'_routed("{op["name"]}", A, B)')
    context["any_routes"] = any(found.values())
    context["all_ops"] = context["ops"] + context["backward_ops"] + context["tuned_ops"]
    context["any_epilogue"] = any(op["epilogue"] for op in context["ops"])
    # __init__.py registers the formulas of the differentiable epilogue ops (a tuned op's too: a call may take it)
    context["formula_ops"] = context["ops"] + context["tuned_ops"]
    context["epilogue_autograd"] = any(op["epilogue"] and op["autograd"] for op in context["formula_ops"])
    context["any_boxed"] = any(op["boxed"] for op in context["ops"])
    context["any_grouped"] = any(op["grouped"] for op in context["all_ops"])
    context.update(_grouped_formula_context(context["all_ops"]))
    if context["grouped_formula_ops"]:
        files[f"{name}/{GROUPED_FORMULA_MODULE}.py"] = grouped_formula_source()
    for template, path in _PACKAGE_TEMPLATES:
        files[path.format(name=name)] = _render(template, **context).encode()
    record = {**MARKER, "name": name, "autograd": autograd, "plans": [op.plan_record() for op in ops],
              "backward_kernels": [op.config.name for op in grads]}
    if tuned_ops:   # the tables it embeds, as an export: emit --tuning <package>/plans.json takes them again
        record["tuning"] = bundle_json(list(tuning))
    files[PLANS_FILE] = (json.dumps(record, indent=2) + "\n").encode()
    return dict(sorted(files.items()))


#: The module of a package emitted with autograd that holds the formulas of its grouped calls: a copy of
#: generator/runtime/grouped_formula.py (torch only), which gemmgen's JIT ops use too.
GROUPED_FORMULA_MODULE = "_grouped_formula"


def grouped_formula_source() -> bytes:
    """generator/runtime/grouped_formula.py, byte for byte: read as a file, not imported (emitting needs no torch)."""
    return (Path(__file__).resolve().parent / "runtime" / "grouped_formula.py").read_bytes()


def _grouped_formula_context(all_ops: list[dict[str, Any]]) -> dict[str, Any]:
    """What __init__.py needs to register the grouped formulas: the differentiable ops with grouped overloads (the
    backward ops too: double backward), and the backward ops those formulas call (each op's ``grads``), sorted. The
    others (fp8, int8, every op of a package without autograd) keep binding.cpp's refusal of grad."""
    formula_ops = [op for op in all_ops if op["grouped"] and op["autograd"]]
    by_name = {op["name"]: op for op in all_ops}
    called = sorted({op["grads"][order][which] for op in formula_ops for order in ("row", "col") for which in "ab"})
    return {"grouped_formula_ops": formula_ops, "grouped_grad_ops": [by_name[name] for name in called],
            "grouped_formula_module": GROUPED_FORMULA_MODULE,
            # grouped ops that keep binding.cpp's refusal of grad beside the formulas (fp8 and int8 ones)
            "any_grouped_refusing": any(op["grouped"] and not op["autograd"] for op in all_ops)}


#: (template in templates/emit, path in the package) of the files rendered from the package's context.
_PACKAGE_TEMPLATES = (
    ("binding.cpp.j2", "csrc/binding.cpp"),
    ("__init__.py.j2", "{name}/__init__.py"),
    ("setup.py.j2", "setup.py"),
    ("pyproject.toml.j2", "pyproject.toml"),
    ("README.md.j2", "README.md"),
    ("MANIFEST.in.j2", "MANIFEST.in"),
    ("gitignore.j2", ".gitignore"),
)


# -- writing ------------------------------------------------------------------------------------------

def _is_emitted_package(folder: Path) -> bool:
    try:
        record = json.loads((folder / PLANS_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and all(record.get(k) == v for k, v in MARKER.items())


def write_package(files: dict[str, bytes], out: str | os.PathLike[str]) -> Path:
    """Write ``files`` as the folder ``out``: built beside it, then moved into place.

    ``out`` may be missing, an empty folder, or a package emitted before (replaced whole, build
    outputs included); anything else is refused, so a typo cannot delete someone's folder.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out={str(out)!r} is a file: give a folder to write the package into")
    if out.is_dir() and any(out.iterdir()) and not _is_emitted_package(out):
        raise ValueError(f"out={str(out)!r} is a folder that emit did not write (no {PLANS_FILE} from gemmgen): "
                         f"give a new or empty folder, e.g. emitted/<name>")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.emit-", dir=out.parent))
    try:
        for rel, data in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            os.chmod(path, 0o644)
        os.chmod(staging, 0o755)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


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
