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

Grouped calls (the ``.grouped`` and ``.grouped_list`` overloads of a plain op) take this module's formulas in Python,
whether the default overload's formula is the C++ one or not (the JIT runtime registers no Autograd kernel for them),
on the same dA and dB ops (``grad_ops``), with ``torch.library.register_autograd`` (which takes ``Tensor[]`` arguments
and returns):

* ``.grouped(A, B, offsets)``, dD (T, N) made row-major (a copy where it is not): dA = ``grad_a.grouped(dD,
  B.transpose(1, 2), offsets)`` (one launch; B.transpose(1, 2) (E, N, K) stores each matrix in B's order flipped,
  which the dA op takes); dB[g] = A[rows of g].t() @ dD[rows of g], the reduction over the group's rows, as one list
  call on the dB op (``grad_b.grouped_list``, a problem per group with rows; the group ends read with one copy to the
  host, ``offsets.tolist()``; an empty group launches nothing, its dB[g] is zeros), stacked into (E, K, N) in B's
  order (``torch.stack``: one copy). offsets has no gradient.
* ``.grouped_list(As, Bs)``: dA_i = dD_i @ B_i.t() and dB_i = A_i.t() @ dD_i, one list call each per storage order of
  the gradients (normally one), for the problems whose input requires grad and whose output has a gradient (else
  None, torch's zero).
* Where the dA or dB op takes no grouped (list) call (``grouped_refusal``, ``grouped_list_refusal``: an sm80 plan, the
  ws schedule, stream-K), every group (problem) is one plain call of it instead; where one problem's operands break
  the 16-byte rule of grouped calls (``grouped_alignment_refusal``: a group's rows starting at an unaligned address,
  a leading dimension off it), that problem alone is a plain call (which repacks or runs the unaligned kernel).
* Double backward works as for the plain formula: the dA and dB ops' grouped overloads have these formulas too.
* A traced backward (torch.compile's AOTAutograd, fake or meta tensors) is refused with the workaround
  (``refuse_traced_grouped_backward``): the formulas read the group ends and the operands' addresses on the host.
* fp8 and int8 ops refuse grad at the call, as their default overload does (``_register_quantized_grouped_refusal``).
  Emitted packages have no grouped formula: their C++ Autograd kernel refuses grad (templates/torch/gemm_op.h's
  GroupedAutogradKernel, the words of ``grouped_grad_refusal``).
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from ..planner.backward import accumulator_config, backward_configs, backward_layouts, saving_config
from ..spec.config import KernelConfig, grouped_list_refusal, grouped_refusal
from ..spec.types import DType, Order
from . import jit_runtime
from .checks import batch_stride, check_group_ends, grouped_alignment_refusal, leading_dim
from .evaluate import evaluate, operand_values
from .handle import OpHandle

__all__ = ["backward_configs", "backward_layouts", "grad_ops", "grouped_backward", "list_backward",
           "register_autograd"]

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
                planned = configs if configs is not None else backward_configs(op.config, grad_order)
                grad_a, grad_b = op.derived(list(planned))
                ops = _GRAD_OPS[key] = (grad_a, grad_b)
    return ops


def _stored_order(t: torch.Tensor) -> Order | None:
    """Row or column, whichever the op can take ``t`` as without a copy; None for neither."""
    if leading_dim(t, Order.row) is not None:
        return Order.row
    if leading_dim(t, Order.col) is not None:
        return Order.col
    return None


def _in_order(t: torch.Tensor, order: Order) -> torch.Tensor:
    """``t`` itself when it (each matrix of a 3-D ``t``) is stored in ``order`` (any leading dimension), else a
    copy that is."""
    if leading_dim(t, order) is not None:
        return t
    if t.numel() == 0:   # (contiguous() keeps an empty tensor's strides, an expanded one's (0, 0) too)
        return _empty_in_order(tuple(t.shape), order, t.dtype, t.device)
    return t.contiguous() if order is Order.row else t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _gradient(op: OpHandle, grad: torch.Tensor, order: Order | None = None) -> tuple[torch.Tensor, Order]:
    """dD as the backward ops take it: in the inputs' dtype (an fp32 output's gradient is cast), and in ``order``
    (a copy where it is not), or with ``order`` None in the order it is stored (row-major, copied, where neither)."""
    if grad.dtype != op.dtype:
        grad = grad.to(op.dtype)
    if order is not None:
        return _in_order(grad, order), order
    stored = _stored_order(grad)
    return (_in_order(grad, Order.row), Order.row) if stored is None else (grad, stored)


def register_autograd(op: OpHandle, lib: torch.library.Library) -> None:
    """Register dA/dB for the default overload of ``op``, and for ``.out`` a refusal of grad (not
    differentiable, as in aten). The JIT runtime's C++ formula (templates/torch/gemm_autograd.h) where it is
    built, so that calls needing no gradient skip Python; else this module's, in Python. An op with a fused
    epilogue always takes the Python formula (``_register_epilogue_formula``)."""
    grouped = op.config.epilogue.is_identity   # the ops with .grouped overloads (generator.runtime.op: has_grouped)
    if op.config.dtype.is_quantized:
        _register_quantized_refusal(op, lib)
        _register_out_refusal(op, lib)
        if grouped:
            _register_quantized_grouped_refusal(op, lib)
        return
    # Planned once here for both the formula and the backward ops' registration (planning is most of the
    # time it takes to load a cached op: an op and its backward closure plan 32 configs).
    configs = {order: backward_configs(op.config, order) for order in Order}
    if not op.config.epilogue.is_identity:
        _register_epilogue_formula(op, lib)
    elif op.config.dtype is DType.tf32:
        _register_python_formula(op, lib)   # the C++ formula passes the gradient as it is stored
    else:
        op.cpp_autograd = jit_runtime.RUNTIME.register_autograd(op, configs)
        if not op.cpp_autograd:
            _register_python_formula(op, lib)
    if not op.cpp_autograd:  # the C++ formula registers its own refusal of .out
        _register_out_refusal(op, lib)
    if grouped:   # Python's, with either formula: the JIT runtime registers no Autograd kernel for them
        _register_grouped_formulas(op, lib)
    for order in Order:
        grad_ops(op, order, configs[order])


def _product_grads(op: OpHandle, A: torch.Tensor, B: torch.Tensor, grad: torch.Tensor, need_a: bool,
                   need_b: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """dA = grad @ B.t() and dB = A.t() @ grad, on this generator's kernels."""
    grad, order = _gradient(op, grad)
    grad_a_op, grad_b_op = grad_ops(op, order)
    # Each operand in the order its kernel reads (the gradient already is, but for tf32, whose kernels read
    # both operands K-major only).
    a_layout, b_layout = grad_a_op.config.layout, grad_b_op.config.layout
    grad_a = grad_a_op(_in_order(grad, a_layout.a), _in_order(B.t(), a_layout.b)) if need_a else None
    grad_b = grad_b_op(_in_order(A.t(), b_layout.a), _in_order(grad, b_layout.b)) if need_b else None
    return grad_a, grad_b


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


def _register_quantized_refusal(op: OpHandle, lib: torch.library.Library) -> None:
    """fp8 and int8 ops are forward only: a call that would need a gradient is refused when it runs (torch calls
    setup_context only when grad mode is on and an input requires grad), not answered with a wrong one later."""
    def setup_context(ctx, inputs, output) -> None:
        wanting = _wanting(op, inputs)
        raise RuntimeError(f"{op.name} multiplies {op.config.dtype.value} operands and has no backward pass, but "
                           f"{', '.join(wanting)} require(s) grad: call it under torch.no_grad(), or pass "
                           f"{wanting[0]}.detach(); train through a bf16 or tf32 plan")

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
        acc = torch.zeros((), dtype=torch.float32, device=A.device).expand(m, n)
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
    """What an emitted package's grouped call that would need a gradient hears (templates/torch/gemm_op.h's
    GroupedAutogradKernel, the words of the emitted packages: they have no grouped formula): ``wanting`` the inputs
    that require grad ("A", "B"; a list call's "A[0]", "B[2]"), of ``overload``. JIT ops differentiate grouped calls
    (``_register_grouped_formulas``)."""
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
                raise RuntimeError(f"{op.name}.{overload} multiplies {op.config.dtype.value} operands and has no "
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


# -- grouped calls: the formulas of .grouped and .grouped_list (see the module docstring) -----------------------------

def _register_grouped_formulas(op: OpHandle, lib: torch.library.Library) -> None:
    """The Autograd kernels of ``op``'s .grouped and .grouped_list: ``grouped_backward`` and ``list_backward``, through
    ``torch.library.register_autograd`` (a list overload's gradients are lists, one entry per matrix, None where
    there is none). Calls that need no gradient go below autograd (torch.library's layer, in Python)."""
    def grouped_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        A, B, offsets = inputs
        ctx.save_for_backward(A, B, offsets)

    def grouped_formula(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        A, B, offsets = ctx.saved_tensors
        return (*grouped_backward(op, A, B, offsets, grad, ctx.needs_input_grad[0], ctx.needs_input_grad[1]), None)

    def list_setup(ctx: Any, inputs: tuple, output: list[torch.Tensor]) -> None:
        A, B = inputs
        ctx.count = len(A)
        ctx.set_materialize_grads(False)   # an output without a gradient: None, its problem skipped
        ctx.save_for_backward(*A, *B)

    def list_formula(ctx: Any, grads: list[torch.Tensor | None]) -> tuple[list, list]:
        saved = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad   # (a list per argument: one flag per matrix)
        return list_backward(op, saved[:ctx.count], saved[ctx.count:], grads, need_a, need_b)

    qualname = f"{op.namespace}::{op.name}"
    torch.library.register_autograd(f"{qualname}.grouped", grouped_formula, setup_context=grouped_setup, lib=lib)
    torch.library.register_autograd(f"{qualname}.grouped_list", list_formula, setup_context=list_setup, lib=lib)


def _empty_in_order(shape: tuple[int, ...], order: Order, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized tensor of ``shape`` (2-D or 3-D) whose matrices are stored in ``order``, packed."""
    if order is Order.row:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.empty((*shape[:-2], shape[-1], shape[-2]), dtype=dtype, device=device).transpose(-1, -2)


def _has_work(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether x @ y launches a kernel (M, N and K all nonzero): the 16-byte rule holds only there."""
    return x.shape[-2] > 0 and y.shape[-1] > 0 and x.shape[-1] > 0


def _call_refusal(plan_reason: str | None, grad_op: OpHandle, x: torch.Tensor, y: torch.Tensor,
                  names: tuple[str, str], matrix_strides: tuple[int, int]) -> str | None:
    """``plan_reason`` (the plan's refusal of the call's form), else, where x @ y has work, the first of x and y
    (named ``names``, ``matrix_strides`` apart between their matrices) off the 16-byte rule; None: taken."""
    if plan_reason is not None or not _has_work(x, y):
        return plan_reason
    layout = grad_op.config.layout
    for what, t, order, stride in zip(names, (x, y), (layout.a, layout.b), matrix_strides):
        reason = grouped_alignment_refusal(what, t, order, leading_dim(t, order), stride)
        if reason is not None:
            return reason
    return None


def grouped_call_refusal(grad_op: OpHandle, x: torch.Tensor, y: torch.Tensor) -> str | None:
    """Why ``grad_op.grouped(x, y, offsets)`` would be refused (its plan, or x or y off the 16-byte rule), None
    where it takes the call; x and y in its orders."""
    return _call_refusal(grouped_refusal(grad_op.config), grad_op, x, y, ("A", "B"), (batch_stride(x), batch_stride(y)))


def list_problem_refusal(grad_op: OpHandle, i: int, x: torch.Tensor, y: torch.Tensor) -> str | None:
    """Why problem ``i`` = (x, y) of ``grad_op.grouped_list`` would be refused (its plan, or x or y off the 16-byte
    rule where the problem has work), None where the list call takes it; x and y in its orders. (The list call
    checks the rule at each problem's own addresses: one problem off it takes a plain call, the others stay.)"""
    return _call_refusal(grouped_list_refusal(grad_op.config), grad_op, x, y, (f"A[{i}]", f"B[{i}]"), (0, 0))


def _list_products(grad_op: OpHandle, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> list[torch.Tensor]:
    """[x @ y for x, y in zip(xs, ys)] on ``grad_op`` (each pair in its orders, the results in its order of D): one
    list call for the problems with work that it takes, one plain call for each other problem with work
    (``list_problem_refusal``: all of them where the plan takes no list call); a problem without work (an empty
    group's K = 0, an empty matrix) launches nothing: zeros."""
    order = grad_op.config.layout.c
    outs = [None if _has_work(x, y) else
            _empty_in_order((x.shape[0], y.shape[1]), order, grad_op.out_dtype, x.device).zero_()
            for x, y in zip(xs, ys)]
    listed = [i for i, (x, y) in enumerate(zip(xs, ys))
              if outs[i] is None and list_problem_refusal(grad_op, i, x, y) is None]
    if listed:
        for i, d in zip(listed, grad_op.grouped_list([xs[i] for i in listed], [ys[i] for i in listed])):
            outs[i] = d
    for i, (x, y) in enumerate(zip(xs, ys)):
        if outs[i] is None:
            outs[i] = grad_op(x, y)
    return outs


def refuse_traced_grouped_backward(op: OpHandle, overload: str, tensors: Any) -> None:
    """The backward of a grouped call reads the group ends (.grouped) and the operands' addresses (both forms: the
    16-byte rule decides between the grouped call and plain ones) on the host, which a trace with fake or meta
    tensors (torch.compile's AOTAutograd tracing the backward, opcheck's AOT tests) cannot: refused with the
    workaround rather than failing on a data-dependent guard."""
    from torch._subclasses.fake_tensor import is_fake

    if any(isinstance(t, torch.Tensor) and (t.device.type == "meta" or is_fake(t)) for t in tensors):
        raise RuntimeError(
            f"{op.name}.{overload}: the backward of a grouped call reads the group sizes and the operands' addresses "
            "on the host, which a traced backward (torch.compile, fake or meta tensors) cannot do yet: keep the "
            "grouped call out of the compiled region (call it in a function decorated with torch.compiler.disable), "
            "or compile without training through it")


def grouped_backward(op: OpHandle, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor,
                     need_a: bool, need_b: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """dA (T, K) and dB (E, K, N) of ``op.grouped(A, B, offsets)`` for its gradient ``grad`` (T, N), on the dA and dB
    ops of a row-major gradient (see the module docstring; None where not needed). The group ends are read on the
    host (one copy)."""
    refuse_traced_grouped_backward(op, "grouped", (A, B, offsets, grad))
    grad, order = _gradient(op, grad, Order.row)   # the grouped dA kernel walks the groups over a row-major A
    grad_a_op, grad_b_op = grad_ops(op, order)
    ends = offsets.tolist()
    check_group_ends(ends, A.shape[0])   # (the forward checked them, unless it was captured in a CUDA graph)
    groups = list(zip([0, *ends[:-1]], ends))
    grad_a = grad_b = None
    if need_a:
        lay = grad_a_op.config.layout
        x, y = _in_order(grad, lay.a), _in_order(B.transpose(1, 2), lay.b)
        if grouped_call_refusal(grad_a_op, x, y) is None:
            grad_a = grad_a_op.grouped(x, y, offsets)
        else:   # one plain call per group, into rows of dA
            grad_a = _empty_in_order((A.shape[0], A.shape[1]), lay.c, grad_a_op.out_dtype, A.device)
            for g, (start, end) in enumerate(groups):
                if end > start:
                    grad_a[start:end] = grad_a_op(x[start:end], y[g])
    if need_b:
        lay = grad_b_op.config.layout
        xs = [_in_order(A[start:end].t(), lay.a) for start, end in groups]
        ys = [_in_order(grad[start:end], lay.b) for start, end in groups]
        grad_b = _stack_in_order(_list_products(grad_b_op, xs, ys), tuple(B.shape), lay.c, grad_b_op.out_dtype,
                                 B.device)
    return grad_a, grad_b


def _stack_in_order(matrices: list[torch.Tensor], shape: tuple[int, ...], order: Order, dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor:
    """The matrices (each of shape[1:]) as one tensor of ``shape``, each matrix stored in ``order``, packed (one
    copy: torch.stack)."""
    if not matrices:
        return _empty_in_order(shape, order, dtype, device)
    if order is Order.row:
        return torch.stack(matrices)
    return torch.stack([m.t() for m in matrices]).transpose(1, 2)


def list_backward(op: OpHandle, A: list[torch.Tensor], B: list[torch.Tensor], grads: list[torch.Tensor | None],
                  need_a: list[bool], need_b: list[bool]
                  ) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
    """[dA_i] and [dB_i] of ``op.grouped_list(A, B)`` for its outputs' gradients ``grads`` (None: that output has
    none): dA_i = dD_i @ B_i.t() where ``need_a[i]``, dB_i = A_i.t() @ dD_i where ``need_b[i]``, else None; one
    list call on the dA op and one on the dB op per storage order of the gradients (see the module docstring)."""
    refuse_traced_grouped_backward(op, "grouped_list", (*A, *B, *grads))
    count = len(A)
    grad_a: list[torch.Tensor | None] = [None] * count
    grad_b: list[torch.Tensor | None] = [None] * count
    prepared = [None if g is None else _gradient(op, g) for g in grads]
    for order in Order:
        found = [i for i, p in enumerate(prepared) if p is not None and p[1] is order]
        grad_a_op, grad_b_op = grad_ops(op, order) if found else (None, None)
        for wanted, grad_op, out, operand in ((need_a, grad_a_op, grad_a, "a"), (need_b, grad_b_op, grad_b, "b")):
            chosen = [i for i in found if wanted[i]]
            if not chosen:
                continue
            lay = grad_op.config.layout
            if operand == "a":   # dA_i = dD_i @ B_i.t()
                xs = [_in_order(prepared[i][0], lay.a) for i in chosen]
                ys = [_in_order(B[i].t(), lay.b) for i in chosen]
            else:                # dB_i = A_i.t() @ dD_i
                xs = [_in_order(A[i].t(), lay.a) for i in chosen]
                ys = [_in_order(prepared[i][0], lay.b) for i in chosen]
            for i, d in zip(chosen, _list_products(grad_op, xs, ys)):
                out[i] = d
    return grad_a, grad_b
