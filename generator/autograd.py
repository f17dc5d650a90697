"""Autograd for the generated ops: dA = dD @ B^T and dB = A^T @ dD, each computed by a kernel of this
generator, planned from the forward op's config and built on the first backward.

Layouts. The forward op computes D (M, N) = A (M, K) @ B (K, N) with A, B, D each stored row- or
column-major (``Layout``). Let dD be stored in ``grad_order``. Then

* dA (M, K) = dD (M, N) @ B.t() (N, K): the first operand is dD, in ``grad_order``; the second is
  B.t(), a view of B with the storage order flipped (B column-major -> B.t() row-major); dA is
  written in A's order, so that it lands in A's strides without a copy.
* dB (K, N) = A.t() (K, M) @ dD (M, N): A.t() flips A's order; dD as above; dB is written in B's
  order (for ``x @ W.t()`` that makes dB.t(), the weight's gradient, contiguous like W).

With a row-major dD (the usual contiguous gradient), in the two-letter names ('t' = row-major,
'n' = column-major, first A then B; ``_dcol`` for a column-major output):

=========  ===========  ===========
forward    dA           dB
=========  ===========  ===========
``tn``     ``tt``       ``nt_dcol``
``tt``     ``tn``       ``nt``
``nn``     ``tt_dcol``  ``tt_dcol``
``nt``     ``tn_dcol``  ``tt``
=========  ===========  ===========

A column-major dD (e.g. the gradient of a ``layout_c='col'`` output passed through elementwise ops)
gets its own pair of kernels (first letter of dA and second of dB become 'n'); a gradient stored in
neither order (an expanded ``sum()`` gradient has strides (0, 0)) is made contiguous first. Strided
operands whose order matches are taken as they are: the ops accept any leading dimension, and
unaligned ones run the slower unaligned kernel. A gradient of another dtype than the inputs' (an op
with ``out_dtype=fp32``) is cast to the input dtype, because the kernels take fp16/bf16 operands.

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
from typing import TYPE_CHECKING

import torch

from .config import KernelConfig
from .types import Layout, Order, parse_layout, parse_order

if TYPE_CHECKING:
    from .op import GemmOp

_FLIP = {Order.row: Order.col, Order.col: Order.row}


def backward_layouts(layout: object, grad_order: object = Order.row) -> tuple[Layout, Layout]:
    """The layouts of the kernels computing dA = dD @ B.t() and dB = A.t() @ dD.

    ``layout``: the forward op's layout (a ``Layout`` or a string such as ``"tn"``); ``grad_order``:
    the storage order of dD ("row" or "col"). See the module docstring for the derivation.
    """
    fwd = layout if isinstance(layout, Layout) else parse_layout(layout)
    g = parse_order(grad_order, what="grad_order")
    grad_a = Layout(a=g, b=_FLIP[fwd.b], c=fwd.a)
    grad_b = Layout(a=_FLIP[fwd.a], b=g, c=fwd.b)
    return grad_a, grad_b


def backward_configs(config: KernelConfig, grad_order: object = Order.row) -> tuple[KernelConfig, KernelConfig]:
    """Planned configs for dA and dB: the forward op's dtype, architecture and kernel family, output
    dtype = input dtype.

    Planned without problem hints (a large problem), like a forward plan without hints: the kernel
    is chosen once per forward op, not per call, so one compiled graph serves every M.
    """
    from .gemm import Gemm

    layouts = backward_layouts(config.layout, grad_order)
    grad_a, grad_b = (Gemm(dtype=config.dtype, layout=lay, arch=config.arch, family=config.family).config
                      for lay in layouts)
    return grad_a, grad_b


# (namespace, forward op name, gradient order) -> (dA op, dB op)
_GRAD_OPS: dict[tuple[str, str, Order], tuple[GemmOp, GemmOp]] = {}
_GRAD_OPS_LOCK = threading.RLock()  # re-entered: registering a backward op registers its backward ops


def grad_ops(op: GemmOp, grad_order: Order = Order.row) -> tuple[GemmOp, GemmOp]:
    """The ops computing dA and dB for ``op`` with a gradient stored in ``grad_order``.

    Registered on first request (``register_autograd`` asks for both orders); each builds its kernel
    on its first launch."""
    key = (op.namespace, op.name, grad_order)
    ops = _GRAD_OPS.get(key)
    if ops is None:
        with _GRAD_OPS_LOCK:
            ops = _GRAD_OPS.get(key)
            if ops is None:
                grad_a, grad_b = op.derived(list(backward_configs(op.config, grad_order)))
                ops = _GRAD_OPS[key] = (grad_a, grad_b)
    return ops


def _stored_order(t: torch.Tensor) -> Order | None:
    """Row or column, whichever the op can take ``t`` as without a copy; None for neither."""
    from .op import leading_dim

    if leading_dim(t, Order.row) is not None:
        return Order.row
    if leading_dim(t, Order.col) is not None:
        return Order.col
    return None


def _in_order(t: torch.Tensor, order: Order) -> torch.Tensor:
    """``t`` itself when it is stored in ``order`` (any leading dimension), else a copy that is."""
    from .op import leading_dim

    if leading_dim(t, order) is not None:
        return t
    return t.contiguous() if order is Order.row else t.t().contiguous().t()


def register_autograd(op: GemmOp, lib: torch.library.Library) -> None:
    """Register dA/dB for the default overload of ``op`` (``.out`` is not differentiable, as in aten)."""

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
    for order in Order:
        grad_ops(op, order)
