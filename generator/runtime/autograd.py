"""Autograd for the generated ops: dA = dD @ B^T and dB = A^T @ dD, each computed by a kernel of this
generator, planned from the forward op's config and built on the first backward.

Which kernels (their layouts for a row- or column-major dD, and why) is pure planning, shared with
emitted packages: see ``generator.planner.backward`` (``backward_layouts``, ``backward_configs``, re-exported
here). A gradient stored in neither order (an expanded ``sum()`` gradient has strides (0, 0)) is made
contiguous first. Strided operands whose order matches are taken as they are: the ops accept any
leading dimension, and unaligned ones are repacked or run the unaligned kernel (``op.path``). A gradient
of another dtype than the inputs' (an op with ``out_dtype=fp32``) is cast to the input dtype, because the
kernels take fp16/bf16 operands.

The backward ops are planned and registered together with the forward op (both gradient orders:
planning is pure Python and cheap), so that a compiled backward graph loaded from torch.compile's
cache in a new process finds them; their kernels are built lazily, on their first launch (the build
cache makes that a load in later processes). Their dtype, architecture and family are the forward op's;
their output dtype is the input dtype; they are registered ops with this same formula, so double
backward works too (the layouts of dA, dB, their dA and dB, ... form a small closed set, at most
eight per dtype and architecture, all registered at once).

A batched call (3-D A or B) has no formula yet: one that needs a gradient is refused when it runs
(``refuse_batched_grad``, as templates/torch/gemm_autograd.h's C++ formula).

Grouped calls (the ``.grouped`` and ``.grouped_list`` overloads of a plain op) take the formulas of
``generator.runtime.grouped_formula`` in Python, whether the default overload's formula is the C++ one or not (the JIT
runtime registers no Autograd kernel for them), on the same dA and dB ops (``grad_ops``), with
``torch.library.register_autograd`` (which takes ``Tensor[]`` arguments and returns). That module imports only torch,
because emitted packages carry a copy of it and register the same formulas on their own backward ops; this one hands
it the op (``_formula``: name, dtype, and per gradient order the dA and dB ops with their refusal tests,
``grouped_call_refusal`` and ``list_problem_refusal`` below, from the plans' ``grouped_refusal`` and
``grouped_list_refusal`` and the 16-byte rule). In short:

* ``.grouped(A, B, offsets)``: dA is one grouped call of the dA op on dD (T, N), made row-major, and
  B.transpose(1, 2); dB one list call of the dB op with a problem (A[rows of g].t(), dD[rows of g]) per group with
  rows (the group ends read with one copy to the host, ``offsets.tolist()``), stacked into (E, K, N) in B's order, an
  empty group's dB[g] zeros. offsets has no gradient.
* ``.grouped_list(As, Bs)``: one list call on the dA op and one on the dB op per storage order of the gradients, for the
  problems whose input requires grad and whose output has a gradient (else None).
* Where the dA or dB op takes no grouped (list) call (an sm80 plan, the ws schedule, stream-K), every group (problem)
  is one plain call of it instead; where one problem's operands break the 16-byte rule of grouped calls, that problem
  alone is a plain call (which repacks or runs the unaligned kernel).
* Double backward works as for the plain formula: the dA and dB ops' grouped overloads have these formulas too.
* A traced backward (torch.compile's AOTAutograd, fake or meta tensors) is refused with the workaround
  (``grouped_formula.refuse_traced_grouped_backward``): the formulas read the group ends and the operands' addresses
  on the host.
* fp8 and int8 ops refuse grad at the call, as their default overload does (``_register_quantized_grouped_refusal``).
  Packages emitted without autograd (and their fp8 and int8 ops) refuse it in C++ (templates/torch/gemm_op.h's
  GroupedAutogradKernel, the words of ``grouped_grad_refusal``); packages emitted with autograd register
  ``grouped_formula``'s formulas from their ``__init__.py``.
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from ..planner import plan
from ..planner.backward import (PlanGradient, accumulator_config, backward_configs, backward_layouts,
                                computes_transpose, saving_config)
from ..spec.config import KernelConfig, quantizes_out
from ..spec.epilogue import BiasActivation
from ..spec.grouped import grouped_list_refusal, grouped_refusal, takes_scaled_groups
from ..spec.types import DType, Order
from . import grouped_formula, jit_runtime
from .evaluate import evaluate, operand_values
from .handle import OpHandle

__all__ = ["backward_configs", "backward_layouts", "grad_ops", "register_autograd"]

# (namespace, forward op name, gradient order) -> (dA op, dB op)
_GRAD_OPS: dict[tuple[str, str, Order], tuple[OpHandle, OpHandle]] = {}
_GRAD_OPS_LOCK = threading.RLock()  # re-entered: registering a backward op registers its backward ops


def grad_ops(op: OpHandle, grad_order: Order = Order.row,
             configs: tuple[KernelConfig, KernelConfig] | None = None) -> tuple[OpHandle, OpHandle]:
    """The ops computing dA and dB for ``op`` with a gradient stored in ``grad_order``.

    Registered on first request (``register_autograd`` asks for both orders, passing the ``configs``
    it planned already); each builds its kernel on its first launch."""
    key = (op.namespace, op.name, grad_order)
    ops = _GRAD_OPS.get(key)
    if ops is None:
        with _GRAD_OPS_LOCK:
            ops = _GRAD_OPS.get(key)
            if ops is None:
                planned = configs if configs is not None else backward_configs(op.config, grad_order, op_problem(op),
                                                                               op_plan_gradient(op))
                grad_a, grad_b = op.derived(list(planned))
                ops = _GRAD_OPS[key] = (grad_a, grad_b)
    return ops


def op_problem(op: OpHandle):
    """The forward problem ``op``'s backward kernels are planned for (GemmOp.problem), None for an unhinted op (and
    for handles that have none: emitted packages plan their backward at emit time)."""
    return getattr(op, "problem", None)


def op_plan_gradient(op: OpHandle) -> PlanGradient:
    """How ``op``'s backward kernels are chosen (GemmOp.plan_gradient); the planner's estimate for handles that
    have none."""
    return getattr(op, "plan_gradient", plan)


def _in_order(t: torch.Tensor, order: Order) -> torch.Tensor:
    """``t`` itself when it (each matrix of a 3-D ``t``) is stored in ``order`` (any leading dimension), else a
    copy that is."""
    return grouped_formula.in_order(t, order is Order.row)


def _gradient(op: OpHandle, grad: torch.Tensor) -> tuple[torch.Tensor, Order]:
    """dD as the backward ops take it: in the inputs' dtype (an fp32 output's gradient is cast), in the order it is
    stored (row-major, copied, where neither)."""
    grad, row = grouped_formula.gradient(op.dtype, grad)
    return grad, Order.row if row else Order.col


def register_autograd(op: OpHandle, lib: torch.library.Library) -> None:
    """Register dA/dB for the default overload of ``op``, and for ``.out`` a refusal of grad (not
    differentiable, as in aten). The JIT runtime's C++ formula (templates/torch/gemm_autograd.h) where it is
    built, so that calls needing no gradient skip Python; else this module's, in Python. An op with a fused
    epilogue takes the C++ closed form where it is a Linear layer's, activation(acc + bias)
    (``_register_cpp_epilogue_formula``), else the Python formula (``_register_epilogue_formula``)."""
    grouped = op.config.epilogue.is_identity   # the ops with .grouped overloads (registration.has_grouped)
    if op.config.dtype.is_quantized or quantizes_out(op.config):
        _register_quantized_refusal(op, lib)
        _register_out_refusal(op, lib)
        if grouped:
            _register_quantized_grouped_refusal(op, lib)
            _register_masked_refusal(op, lib)
        if takes_scaled_groups(op.config):
            _register_scaled_grouped_refusal(op, lib)
        return
    # Planned once here for both the formula and the backward ops' registration (planning is most of the
    # time it takes to load a cached op: an op and its backward closure plan 32 configs).
    configs = {order: backward_configs(op.config, order, op_problem(op), op_plan_gradient(op)) for order in Order}
    if not op.config.epilogue.is_identity:
        op.cpp_autograd = _register_cpp_epilogue_formula(op, configs)
        if not op.cpp_autograd:
            _register_epilogue_formula(op, lib)
        _register_out_refusal(op, lib)   # (an epilogue's .out schema varies: its refusal stays Python's)
    elif op.config.dtype is DType.tf32:
        _register_python_formula(op, lib)   # the C++ formula passes the gradient as it is stored
        _register_out_refusal(op, lib)
    else:
        op.cpp_autograd = jit_runtime.RUNTIME.register_autograd(op, configs)
        if not op.cpp_autograd:   # (the C++ formula registers its own refusal of .out)
            _register_python_formula(op, lib)
            _register_out_refusal(op, lib)
    if grouped:   # Python's, with either formula: the JIT runtime registers no Autograd kernel for them
        _register_grouped_formulas(op, lib)
        _register_masked_refusal(op, lib)
    for order in Order:
        grad_ops(op, order, configs[order])


def _product_grads(op: OpHandle, A: torch.Tensor, B: torch.Tensor, grad: torch.Tensor, need_a: bool,
                   need_b: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """dA = grad @ B.t() and dB = A.t() @ grad, on this generator's kernels."""
    grad, order = _gradient(op, grad)
    grad_a_op, grad_b_op = grad_ops(op, order)
    layout = op.config.layout
    grad_a = _product(grad_a_op, grad, B.t(), layout.a) if need_a else None
    grad_b = _product(grad_b_op, A.t(), grad, layout.b) if need_b else None
    return grad_a, grad_b


def _product(grad_op: OpHandle, left: torch.Tensor, right: torch.Tensor, stored: Order) -> torch.Tensor:
    """left @ right on ``grad_op``, a gradient stored in ``stored``: each operand in the order its kernel reads (as they
    are stored: the gradient kernels are planned for their layouts); a kernel that computes the
    transpose (planner.backward.computes_transpose: a row-major write of a column-major gradient) takes right.t() and
    left.t(), and its result's transpose is the gradient (grouped_formula.kernel_product)."""
    lay = grad_op.config.layout
    return grouped_formula.kernel_product(grad_op, left, right, lay.a is Order.row, lay.b is Order.row,
                                          computes_transpose(grad_op.config, stored))


def refuse_batched_grad(op: OpHandle, A: torch.Tensor, B: torch.Tensor, wanting: list[str]) -> None:
    """A batched call (3-D A or B) that would need a gradient is refused when it runs (the formulas below are
    A @ B's for 2-D operands). ``wanting``: the names of the inputs that require grad. gemm_autograd.h's
    GemmAutogradKernel says the same."""
    if A.dim() == 3 or B.dim() == 3:
        raise RuntimeError(f"{op.name}: batched calls (3-D A or B) have no backward pass yet, but "
                           f"{', '.join(wanting)} require(s) grad: call it under torch.no_grad() or with detached "
                           "tensors, or call it once per problem with 2-D tensors")


def _wanting(op: OpHandle, inputs: tuple[Any, ...]) -> list[str]:
    """The names of the op's inputs (A, B, the epilogue's operands) that require grad."""
    names = ("A", "B", *(o.name for o in op.config.epilogue.operands))
    return [name for name, t in zip(names, inputs) if isinstance(t, torch.Tensor) and t.requires_grad]


def _forward_only_reason(op: OpHandle) -> str:
    """Why an op has no backward pass, as its refusals say it: its fp8 or int8 operands, or its quantized D."""
    if op.config.dtype.is_quantized:
        return f"multiplies {op.config.dtype.value} operands"
    return f"writes a quantized ({op.config.out_dtype.value}) D"


def _register_quantized_refusal(op: OpHandle, lib: torch.library.Library) -> None:
    """fp8 and int8 ops, and ops writing a quantized D, are forward only: a call that would need a gradient is refused when it runs (torch calls
    setup_context only when grad mode is on and an input requires grad), not answered with a wrong one later."""
    what = _forward_only_reason(op)

    def setup_context(ctx, inputs, output) -> None:
        wanting = _wanting(op, inputs)
        raise RuntimeError(f"{op.name} {what} and has no backward pass, but {', '.join(wanting)} require(s) grad: "
                           f"call it under torch.no_grad(), or pass {wanting[0]}.detach(); train through a bf16 or "
                           "tf32 plan")

    def backward(ctx, grad: torch.Tensor):  # never reached: setup_context refuses first
        raise RuntimeError(f"{op.name} has no backward pass")

    torch.library.register_autograd(f"{op.namespace}::{op.name}", backward, setup_context=setup_context, lib=lib)


def _register_python_formula(op: OpHandle, lib: torch.library.Library) -> None:
    def setup_context(ctx, inputs, output) -> None:
        A, B = inputs
        refuse_batched_grad(op, A, B, _wanting(op, inputs))   # (torch calls it only when a gradient is wanted)
        ctx.save_for_backward(A, B)

    def backward(ctx, grad: torch.Tensor):
        A, B = ctx.saved_tensors
        return _product_grads(op, A, B, grad, ctx.needs_input_grad[0], ctx.needs_input_grad[1])

    torch.library.register_autograd(f"{op.namespace}::{op.name}", backward, setup_context=setup_context, lib=lib)


def _register_cpp_epilogue_formula(op: OpHandle, configs: dict[Order, tuple[KernelConfig, KernelConfig]]) -> bool:
    """gemm_autograd.h's closed form for an op computing activation(acc + bias) (``Epilogue.bias_activation``), where
    the JIT runtime is built: ``_register_epilogue_formula``'s forward and ``_bias_activation_backward``'s values
    without the Python autograd.Function (an MLP stack's training step went from 0.68x to 0.91x stock with it,
    docs/epilogue.md). False (the caller registers the Python formula) for any other epilogue, and for tf32, whose C++
    formula would pass the gradient as it is stored."""
    form = op.config.epilogue.bias_activation
    if form is None or op.config.dtype is DType.tf32:
        return False
    saving = saving_config(op.config)
    accumulator = accumulator_config(op.config) if form.activation is not None else None
    # Registered now (their kernels build on their first launch), so that the C++ formula and a traced graph find them.
    saving_op, accumulator_op = (op.derived([c])[0].name if c is not None else None for c in (saving, accumulator))
    return jit_runtime.RUNTIME.register_autograd(
        op, configs, epilogue=jit_runtime.LinearEpilogueOps(form, saving_op, accumulator_op))


def _register_epilogue_formula(op: OpHandle, lib: torch.library.Library) -> None:
    """D = epilogue(acc, operands) with acc = A @ B, as the op's Autograd kernel. Where no input requires grad
    it runs the op below autograd. Else the forward runs the saving kernel (``saving_config``: D and acc, acc
    saved for the backward) when the gradients read acc, or the op's own kernel when they do not
    (``acc + bias``: the backward then needs no accumulator at all) or when the epilogue has a second output of
    its own (the backward then recomputes acc in fp32 with this generator's plain kernel). The backward
    differentiates the elementwise part with torch (``evaluate``) at acc, and runs dA and dB on this
    generator's kernels."""
    saving = saving_config(op.config)
    ops = getattr(torch.ops, op.namespace)
    below = getattr(ops, op.name).default
    # Registered now (its kernel builds on its first launch), so that a traced graph finds it.
    saving_op = getattr(ops, op.derived([saving])[0].name).default if saving is not None else None
    form = op.config.epilogue.bias_activation   # a Linear layer's epilogue: the closed-form backward where it applies

    class Formula(torch.autograd.Function):
        @staticmethod
        def forward(ctx, A: torch.Tensor, B: torch.Tensor, *values: Any) -> Any:
            ctx.set_materialize_grads(False)
            ctx.scalars = [None if isinstance(v, torch.Tensor) else v for v in values]
            tensors = [v for v in values if isinstance(v, torch.Tensor)]
            if saving_op is None:
                with torch._C._AutoDispatchBelowAutograd():
                    out = below(A, B, *values)
                ctx.save_for_backward(A, B, *tensors)
                return out
            out, acc = saving_op(A, B, *values)   # grad mode is off in forward: its own Autograd kernel passes
            ctx.save_for_backward(A, B, acc, *tensors)
            return out

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
            A, B, *tensors = ctx.saved_tensors
            saved_acc = tensors.pop(0) if saving_op is not None else None
            found = iter(tensors)
            values = [next(found) if v is None else v for v in ctx.scalars]
            if form is not None and not torch.is_grad_enabled() and (form.activation is None or saved_acc is not None):
                return _bias_activation_backward(op, form, A, B, values, saved_acc, grads[0], ctx.needs_input_grad)
            return _epilogue_backward(op, A, B, values, saved_acc, grads, ctx.needs_input_grad)

    def autograd_kernel(A: torch.Tensor, B: torch.Tensor, *values: Any) -> Any:
        tensors = (A, B, *(v for v in values if isinstance(v, torch.Tensor)))
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            refuse_batched_grad(op, A, B, _wanting(op, (A, B, *values)))
            return Formula.apply(A, B, *values)
        with torch._C._AutoDispatchBelowAutograd():
            return below(A, B, *values)

    lib.impl(op.name, autograd_kernel, "Autograd")


def _epilogue_backward(op: OpHandle, A: torch.Tensor, B: torch.Tensor, values: list[Any],
                       saved_acc: torch.Tensor | None, grads: tuple[torch.Tensor | None, ...],
                       needs: tuple[bool, ...]) -> tuple[torch.Tensor | None, ...]:
    """The gradients of A, B and each operand: the epilogue differentiated with torch at acc (the saved one,
    zeros where the gradients do not read it, else recomputed), then dA and dB from d(acc)."""
    ep = op.config.epilogue
    # Grad mode is on here only for backward(create_graph=True): then acc (recomputed) and the operands stay
    # connected to A, B and the operands (acc's op has its own formula), and the gradients are taken with
    # create_graph, so that the returned gradients are differentiable in turn.
    create_graph = torch.is_grad_enabled()
    m, n = A.shape[0], B.shape[1]
    if create_graph or (saved_acc is None and ep.backward_reads_acc):
        (acc_op,) = op.derived([accumulator_config(op.config)])
        acc = acc_op(A, B)
    elif saved_acc is not None:
        acc = saved_acc.float()
    else:   # the gradients do not read acc's value, only its shape
        acc = A.new_zeros((), dtype=torch.float32).expand(m, n)   # (new_zeros: a DTensor A gives a DTensor)
    with torch.enable_grad():
        if not (create_graph and acc.requires_grad):
            acc = acc.detach().requires_grad_(needs[0] or needs[1])
        leaves = [(v.float() if create_graph and v.requires_grad else
                   v.detach().float().requires_grad_(needs[2 + i])) if isinstance(v, torch.Tensor) else v
                  for i, v in enumerate(values)]
        d, aux = evaluate(ep, acc, operand_values(ep, leaves, torch.float32))
        pairs = [(t, g) for t, g in zip((d, aux), grads) if t is not None and g is not None]
        wanted = [acc] + [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
        wanted = [t for t in wanted if t.requires_grad]
        found_grads = iter(torch.autograd.grad([t for t, _ in pairs], wanted, [g.float() for _, g in pairs],
                                               allow_unused=True, create_graph=create_graph)
                           if pairs and wanted else [None] * len(wanted))
    grad_acc = next(found_grads) if acc.requires_grad else None
    operand_grads = []
    for value, leaf in zip(values, leaves):
        grad = next(found_grads) if isinstance(leaf, torch.Tensor) and leaf.requires_grad else None
        operand_grads.append(None if grad is None else grad.to(value.dtype))
    grad_a = grad_b = None
    if grad_acc is not None:
        grad_a, grad_b = _product_grads(op, A, B, grad_acc, needs[0], needs[1])
    return (grad_a, grad_b, *operand_grads)


#: torch's one-kernel derivative of each of Epilogue.bias_activation's activations, at the activation's input.
_ACTIVATION_BACKWARD = {
    "relu": lambda grad, x: torch.ops.aten.threshold_backward(grad, x, 0),
    "gelu": lambda grad, x: torch.ops.aten.gelu_backward(grad, x),
    "gelu_tanh": lambda grad, x: torch.ops.aten.gelu_backward(grad, x, approximate="tanh"),
    "silu": lambda grad, x: torch.ops.aten.silu_backward(grad, x),
}


def _bias_activation_backward(op: OpHandle, form: BiasActivation, A: torch.Tensor, B: torch.Tensor,
                              values: list[Any], saved_acc: torch.Tensor | None, grad: torch.Tensor | None,
                              needs: tuple[bool, ...]) -> tuple[torch.Tensor | None, ...]:
    """``_epilogue_backward``'s gradients of D = activation(acc + bias) in closed form (not under create_graph, and
    with acc saved where the activation reads it), without tracing and differentiating the epilogue per call, which
    cost a Linear layer about 0.5 ms of host time per backward on the H200 machines (gpu/train_step_profile.py). The
    activation's derivative is taken at acc + bias in the saved acc's dtype, D's, as torch's autograd of Linear + GELU
    takes it at the Linear's output (the general path takes it in fp32: three passes over M x N fp32 more, 0.2 ms of
    an MLP stack's step); the bias's gradient is the fp32 sum of the columns. gemm_autograd.h's
    LinearEpilogueFunction computes the same, in C++."""
    bias = values[0] if form.bias is not None else None
    if grad is None:
        return (None, None, *(None for _ in values))
    if form.activation is None:
        grad_acc = grad
    else:
        pre = saved_acc if bias is None else saved_acc + bias.to(saved_acc.dtype)
        grad_acc = _ACTIVATION_BACKWARD[form.activation](grad.to(pre.dtype), pre)
    grad_bias = None
    if bias is not None and needs[2]:
        grad_bias = grad_acc.sum(0, dtype=torch.float32).to(bias.dtype)
    grad_a = grad_b = None
    if needs[0] or needs[1]:
        grad_a, grad_b = _product_grads(op, A, B, grad_acc, needs[0], needs[1])
    return (grad_a, grad_b, *((grad_bias,) if bias is not None else ()))


def _register_out_refusal(op: OpHandle, lib: torch.library.Library) -> None:
    def out_autograd(A: torch.Tensor, B: torch.Tensor, *values: object, out: torch.Tensor) -> torch.Tensor:
        # As aten's out= ops: not differentiable, and said so at the call rather than at backward().
        tensors = (A, B, out, *values)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors if isinstance(t, torch.Tensor)):
            raise RuntimeError(f"{op.name}.out: functions with out=... arguments don't support automatic "
                               "differentiation, but one of the arguments requires grad: call the op without "
                               "out= (its backward is registered)")
        with torch._C._AutoDispatchBelowAutograd():
            return getattr(getattr(torch.ops, op.namespace), op.name).out(A, B, *values, out=out)

    lib.impl(f"{op.name}.out", out_autograd, "Autograd")


def grouped_grad_refusal(name: str, wanting: list[str], overload: str = "grouped") -> str:
    """What a grouped call of a package emitted without autograd hears where it would need a gradient
    (templates/torch/gemm_op.h's GroupedAutogradKernel: such a package has no formula): ``wanting`` the inputs that
    require grad ("A", "B"; a list call's "A[0]", "B[2]"), of ``overload``. JIT ops, and packages emitted with
    autograd, differentiate grouped calls (``grouped_formula``)."""
    return (f"{name}.{overload}: grouped calls have no backward pass yet, but {', '.join(wanting)} require(s) grad: "
            "call it under torch.no_grad() or with detached tensors")


def _grouped_wanting(A: Any, B: Any, overload: str) -> list[str]:
    """The inputs of a grouped call that require grad: "A", "B"; a list call's "A[0]", "B[2]", A's first."""
    if overload == "grouped":
        return [what for what, t in (("A", A), ("B", B)) if isinstance(t, torch.Tensor) and t.requires_grad]
    return [f"{what}[{i}]" for what, matrices in (("A", A), ("B", B)) for i, t in enumerate(matrices)
            if t.requires_grad]


def _register_quantized_grouped_refusal(op: OpHandle, lib: torch.library.Library) -> None:
    """The Autograd kernels of an fp8 or int8 op's .grouped and .grouped_list: refused at the call, in the words of
    its default overload's refusal (``_register_quantized_refusal``), rather than answered with a result that has no
    gradient; without grad mode (or with nothing requiring it) on to the kernel."""
    ops = getattr(torch.ops, op.namespace)

    def refuse(A: Any, B: Any, overload: str) -> None:
        if torch.is_grad_enabled():
            wanting = _grouped_wanting(A, B, overload)
            if wanting:
                raise RuntimeError(f"{op.name}.{overload} {_forward_only_reason(op)} and has no "
                                   f"backward pass, but {', '.join(wanting)} require(s) grad: call it under "
                                   f"torch.no_grad(), or pass {wanting[0]}.detach(); train through a bf16 or tf32 plan")

    def grouped_autograd(A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        refuse(A, B, "grouped")
        with torch._C._AutoDispatchBelowAutograd():
            return getattr(ops, op.name).grouped(A, B, offsets)

    def grouped_list_autograd(A: list[torch.Tensor], B: list[torch.Tensor]) -> list[torch.Tensor]:
        refuse(A, B, "grouped_list")
        with torch._C._AutoDispatchBelowAutograd():
            return getattr(ops, op.name).grouped_list(A, B)

    lib.impl(f"{op.name}.grouped", grouped_autograd, "Autograd")
    lib.impl(f"{op.name}.grouped_list", grouped_list_autograd, "Autograd")


def _register_scaled_grouped_refusal(op: OpHandle, lib: torch.library.Library) -> None:
    """The Autograd kernels of an fp8 op's .grouped_scaled and .masked_scaled (registration.has_grouped_scaled): fp8
    ops have no backward pass, so inputs that require grad are refused at the call, in the words of
    ``_register_quantized_grouped_refusal``; without grad mode on to the kernel."""
    ops = getattr(torch.ops, op.namespace)

    def refuse(A: Any, B: Any, overload: str) -> None:
        wanting = _grouped_wanting(A, B, "grouped") if torch.is_grad_enabled() else []
        if wanting:
            raise RuntimeError(f"{op.name}.{overload} multiplies {op.config.dtype.value} operands and has no "
                               f"backward pass, but {', '.join(wanting)} require(s) grad: call it under "
                               f"torch.no_grad(), or pass {wanting[0]}.detach(); train through a bf16 or tf32 plan")

    def grouped_scaled_autograd(A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor, scale_a: torch.Tensor,
                                scale_b: torch.Tensor) -> torch.Tensor:
        refuse(A, B, "grouped_scaled")
        with torch._C._AutoDispatchBelowAutograd():
            return getattr(ops, op.name).grouped_scaled(A, B, offsets, scale_a, scale_b)

    def masked_scaled_autograd(A: torch.Tensor, B: torch.Tensor, counts: torch.Tensor, scale_a: torch.Tensor,
                               scale_b: torch.Tensor) -> torch.Tensor:
        refuse(A, B, "masked_scaled")
        with torch._C._AutoDispatchBelowAutograd():
            return getattr(ops, op.name).masked_scaled(A, B, counts, scale_a, scale_b)

    lib.impl(f"{op.name}.grouped_scaled", grouped_scaled_autograd, "Autograd")
    lib.impl(f"{op.name}.masked_scaled", masked_scaled_autograd, "Autograd")


def _register_masked_refusal(op: OpHandle, lib: torch.library.Library) -> None:
    """The Autograd kernel of .masked: it has no backward formula yet, so inputs that require grad are refused at the
    call (rather than answered with a result that has no gradient); without grad mode on to the kernel."""
    ops = getattr(torch.ops, op.namespace)

    def masked_autograd(A: torch.Tensor, B: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        wanting = _grouped_wanting(A, B, "grouped") if torch.is_grad_enabled() else []
        if wanting:
            raise RuntimeError(f"{op.name}.masked: masked calls have no backward pass yet, but {', '.join(wanting)} "
                               "require(s) grad: call it under torch.no_grad() (inference), or train through "
                               "op.grouped(A, B, offsets), which is differentiable")
        with torch._C._AutoDispatchBelowAutograd():
            return getattr(ops, op.name).masked(A, B, counts)

    lib.impl(f"{op.name}.masked", masked_autograd, "Autograd")


# -- grouped calls: the formulas of .grouped and .grouped_list (see the module docstring) -----------------------------

def _register_grouped_formulas(op: OpHandle, lib: torch.library.Library) -> None:
    """The Autograd kernels of ``op``'s .grouped and .grouped_list: grouped_formula's ``grouped_backward`` and
    ``list_backward``, through ``torch.library.register_autograd`` (``register_formulas``, as emitted packages
    register them)."""
    grouped_formula.register_formulas(f"{op.namespace}::{op.name}", _formula(op), lib)


def _formula(op: OpHandle) -> grouped_formula.Formula:
    """What grouped_formula takes of ``op``: its name, dtype and backward ops (``grad_ops``: registered on first
    use)."""
    def ops(row: bool) -> tuple[grouped_formula.GradOp, grouped_formula.GradOp]:
        grad_a, grad_b = grad_ops(op, Order.row if row else Order.col)
        return _grad_op(grad_a, op.config.layout.a), _grad_op(grad_b, op.config.layout.b)

    return grouped_formula.Formula(op.name, op.dtype, ops)


def _grad_op(handle: OpHandle, stored: Order) -> grouped_formula.GradOp:
    """A backward op as grouped_formula calls it, for a gradient stored in ``stored``. Its refusal tests are this
    module's functions, looked up when they run (tests record the paths taken by replacing them)."""
    layout = handle.config.layout
    return grouped_formula.GradOp(
        call=handle, grouped=handle.grouped, grouped_list=handle.grouped_list, a_row=layout.a is Order.row,
        b_row=layout.b is Order.row, d_row=layout.c is Order.row, out_dtype=handle.out_dtype,
        grouped_call_refusal=lambda x, y: grouped_call_refusal(handle, x, y),
        list_problem_refusal=lambda i, x, y: list_problem_refusal(handle, i, x, y),
        transposed=computes_transpose(handle.config, stored))


def grouped_call_refusal(grad_op: OpHandle, x: torch.Tensor, y: torch.Tensor) -> str | None:
    """Why ``grad_op.grouped(x, y, offsets)`` would be refused (its plan, or x or y off the 16-byte rule), None
    where it takes the call; x and y in its orders."""
    layout = grad_op.config.layout
    return grouped_formula.grouped_call_refusal(grouped_refusal(grad_op.config), layout.a is Order.row,
                                                layout.b is Order.row, x, y)


def list_problem_refusal(grad_op: OpHandle, i: int, x: torch.Tensor, y: torch.Tensor) -> str | None:
    """Why problem ``i`` = (x, y) of ``grad_op.grouped_list`` would be refused (its plan, or x or y off the 16-byte
    rule where the problem has work), None where the list call takes it; x and y in its orders."""
    layout = grad_op.config.layout
    return grouped_formula.list_problem_refusal(grouped_list_refusal(grad_op.config), layout.a is Order.row,
                                                layout.b is Order.row, i, x, y)
