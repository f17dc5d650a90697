"""What gets emitted: the package's ops (``EmittedOp``: an op name and the kernel config behind it) paired from the
plans (``resolve_ops``), the private ops of their backward pass (``backward_ops``), and what the templates are told of
each op (``EmittedOp.context``) and write of it into plans.json (``EmittedOp.plan_record``)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from ..planner.backward import accumulator_config, autograd_form, backward_closure, backward_configs
from ..planner.common import Problem
from ..render.epilogue_python import python_function
from ..spec.config import QUANT_BLOCK, KernelConfig, output_schema, quantizes_out, second_output
from ..spec.grouped import ROW_SCALED, grouped_list_refusal, grouped_refusal, takes_scaled_groups
from ..spec.epilogue import KINDS, KNOB_NAMES, epilogue_to_json, from_knobs
from ..spec.types import DType, Order, unquantized
from .names import check_op_name, check_operand_names, default_op_name, grad_op_name

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
        fp8 and int8 ops, and ops writing a quantized D, are forward only, and refuse arguments that require grad."""
        return not (self.config.dtype.is_quantized or quantizes_out(self.config))

    def context(self, package: str, autograd: bool) -> dict[str, Any]:
        cfg = self.config
        layout = cfg.layout
        flip = {"t": "n", "n": "t"}
        autograd = autograd and self.differentiable
        return {
            "name": self.name,
            "autograd": autograd,
            "quantized": not self.differentiable,
            "forward_only_reason": (f"{cfg.dtype.value} GEMMs are forward only" if cfg.dtype.is_quantized else
                                    f"a quantized ({cfg.out_dtype.value}) D has no gradient"),
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
            # what its function calls: the op itself, or the measured winner of the call's sizes (see tuned.routes)
            "call": f"_OPS.{self.name}",
            "routes": [],
            **_epilogue_context(cfg),
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
            if cfg.amax:
                record["amax"] = True
            if cfg.interleave_k:
                record["interleave_k"] = True
            if cfg.dtype_b is not None:
                record["dtype_b"] = cfg.dtype_b.value
        else:
            record["warps"] = "x".join(map(str, cfg.warps))
        # (a config staged in the ring, rule 18, took the stages its staging freed: fixed here they would keep the rule
        # from applying again and no longer fit beside staging buffers of their own)
        record.update({} if cfg.staging_in_ring else {"stages": cfg.stages}, raster_group=cfg.raster_group)
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


def _epilogue_context(cfg: KernelConfig) -> dict[str, Any]:
    """What the templates say and register of an op's fused epilogue or second output (nothing of it for a plain
    op). An op writing a quantized D takes the epilogue ops' form (boxed kernels, its scales a second output)."""
    ep = cfg.epilogue
    second = second_output(cfg)
    quantized_out = quantizes_out(cfg)
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
    expression = ep.describe()[: 2 if ep.aux is not None else 1]
    if quantized_out:
        expression.append(f"D quantized to {cfg.out_dtype.value} per row and {QUANT_BLOCK} columns, scales "
                          f"(M, ceil(N/{QUANT_BLOCK})) fp32 (generator.quantize(D_bf16, scale='block'))"
                          + (", and amax, D_bf16.abs().amax() as a 0-dim fp32" if cfg.amax else ""))
    return {
        "epilogue": not ep.is_identity or quantized_out,
        # operands or a second output: a schema of its own, so gemm_op.h's boxed kernels
        # (and every fp8 or int8 op, ``boxed``: the boxed Autograd kernel refuses grad where no formula exists)
        "boxed": cfg.dtype.is_quantized or bool(ep.operands) or second is not None,
        "operands": operands,
        "aux": second is not None,
        "second_output": second,                              # "aux" | "scales" | None
        "quant_block": QUANT_BLOCK if quantized_out else 0,   # OpSpec::quant_block
        "amax": cfg.amax,                                     # OpSpec::amax: the amax of D, a third output
        "epilogue_text": ep.text,
        "expression": expression,
        "schema_arguments": "".join(f", {o['schema_type']} {o['name']}" for o in operands),
        "schema_returns": output_schema(cfg),
    }


def _grouped_context(cfg: KernelConfig) -> dict[str, Any]:
    """An op without a fused epilogue has the .grouped and .grouped_list overloads (grouped GEMM: a mixture of
    experts' rows; a list of problems), as the JIT ops (generator.runtime.registration: has_grouped); its OpSpec says
    why the plan takes no such call, if it does not (generator.spec.grouped.grouped_refusal, grouped_list_refusal: the
    op refuses such a call with these words). An fp8 op with per-block scales has .grouped_scaled and .masked_scaled
    instead (registration.has_grouped_scaled), with the same refusal where its kernel takes no grouped call."""
    grouped = cfg.epilogue.is_identity and not quantizes_out(cfg)   # (a quantized D's op: the epilogue ops' form)
    scaled = takes_scaled_groups(cfg)
    refusal = grouped_refusal(cfg) if grouped or scaled else None
    list_refusal = grouped_list_refusal(cfg) if grouped else None
    docs = {f"grouped_{what.lower()}_doc": _GROUPED_DOC[what, order]
            for what, order in (("A", cfg.layout.a), ("B", cfg.layout.b), ("D", cfg.layout.c))}
    return {"grouped": grouped, "grouped_scaled": scaled, "grouped_row_scaled": scaled and cfg.epilogue == ROW_SCALED,
            "grouped_refusal": refusal, "grouped_list_refusal": list_refusal, **docs,
            # as a backward op: whether the grouped formulas may call it grouped (listed), recorded at emit time
            "takes_grouped": grouped and refusal is None, "takes_list": grouped and list_refusal is None,
            # as C string literals (the sentences are the generator's own, but escaped all the same)
            "grouped_refusal_c": None if refusal is None else json.dumps(refusal, ensure_ascii=True),
            "grouped_list_refusal_c": None if list_refusal is None else json.dumps(list_refusal, ensure_ascii=True)}


def _plan_knobs(item: object, config: KernelConfig) -> tuple[tuple[str, Any], ...]:
    """The epilogue knobs of a Gemm plan, when they are what made its epilogue; () otherwise."""
    knobs = tuple((k, getattr(item, k, None)) for k in KNOB_NAMES if getattr(item, k, None) is not None)
    if not knobs or config.epilogue != from_knobs(**dict(knobs)).resolved(unquantized(config.out_dtype)):
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
