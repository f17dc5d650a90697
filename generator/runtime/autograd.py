"""Autograd for the generated ops: dA = dD @ B^T and dB = A^T @ dD, each computed by a kernel of this
generator, planned from the forward op's config and built on the first backward.

Which kernels (their layouts for a row- or column-major dD, and why) is pure planning, shared with
emitted packages: see ``generator.planner.backward`` (``backward_layouts``, ``backward_configs``, re-exported
here). A gradient stored in neither order (an expanded ``sum()`` gradient has strides (0, 0)) is made
contiguous first. Strided operands whose order matches are taken as they are: the ops accept any
leading dimension, and unaligned ones run the slower unaligned kernel. A gradient of another dtype
than the inputs' (an op with ``out_dtype=fp32``) is cast to the input dtype, because the kernels take
fp16/bf16 operands.

The backward ops are planned and registered together with the forward op (both gradient orders:
planning is pure Python and cheap), so that a compiled backward graph loaded from torch.compile's
cache in a new process finds them; their kernels are built lazily, on their first launch (the build
cache makes that a load in later processes). Their dtype, architecture and family are the forward op's;
their output dtype is the input dtype; they are registered ops with this same formula, so double
backward works too (the layouts of dA, dB, their dA and dB, ... form a small closed set, at most
eight per dtype and architecture, all registered at once).
"""
from __future__ import annotations

import threading

import torch

from ..planner.backward import backward_configs, backward_layouts
from ..spec.config import KernelConfig
from ..spec.types import Order
from . import jit_runtime
from .checks import leading_dim
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
    """``t`` itself when it is stored in ``order`` (any leading dimension), else a copy that is."""
    if leading_dim(t, order) is not None:
        return t
    return t.contiguous() if order is Order.row else t.t().contiguous().t()


def register_autograd(op: OpHandle, lib: torch.library.Library) -> None:
    """Register dA/dB for the default overload of ``op``, and for ``.out`` a refusal of grad (not
    differentiable, as in aten). The JIT runtime's C++ formula (templates/torch/gemm_autograd.h) where it is
    built, so that calls needing no gradient skip Python; else this module's, in Python."""
    # Planned once here for both the formula and the backward ops' registration (planning is most of the
    # time it takes to load a cached op: an op and its backward closure plan 32 configs).
    configs = {order: backward_configs(op.config, order) for order in Order}
    op.cpp_autograd = jit_runtime.RUNTIME.register_autograd(op, configs)
    if not op.cpp_autograd:
        _register_python_formula(op, lib)
    for order in Order:
        grad_ops(op, order, configs[order])


def _register_python_formula(op: OpHandle, lib: torch.library.Library) -> None:
    def setup_context(ctx, inputs, output) -> None:
        A, B = inputs
        ctx.save_for_backward(A, B)

    def backward(ctx, grad: torch.Tensor):
        A, B = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if grad.dtype != op.dtype:
            grad = grad.to(op.dtype)
        order = _stored_order(grad)
        if order is None:
            grad, order = grad.contiguous(), Order.row
        grad_a_op, grad_b_op = grad_ops(op, order)
        grad_a = grad_a_op(grad, _in_order(B.t(), grad_a_op.config.layout.b)) if need_a else None
        grad_b = grad_b_op(_in_order(A.t(), grad_b_op.config.layout.a), grad) if need_b else None
        return grad_a, grad_b

    torch.library.register_autograd(f"{op.namespace}::{op.name}", backward, setup_context=setup_context, lib=lib)

    def out_autograd(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        # As aten's out= ops: not differentiable, and said so at the call rather than at backward().
        if torch.is_grad_enabled() and any(t.requires_grad for t in (A, B, out) if isinstance(t, torch.Tensor)):
            raise RuntimeError(f"{op.name}.out: functions with out=... arguments don't support automatic "
                               "differentiation, but one of the arguments requires grad: call the op without "
                               "out= (its backward is registered)")
        with torch._C._AutoDispatchBelowAutograd():
            return getattr(getattr(torch.ops, op.namespace), op.name).out(A, B, out=out)

    lib.impl(f"{op.name}.out", out_autograd, "Autograd")
