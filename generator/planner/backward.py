"""The backward pass's kernels, derived from a forward config: pure planning, no torch.

Both the JIT ops (``generator.runtime.autograd``, which registers the formula with torch) and emitted packages
(``generator.emit``, which must run without torch) take their dA and dB kernels from here.

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
gets its own pair of kernels (first letter of dA and second of dB become 'n'). The backward kernels
keep the forward op's dtype, architecture and family, and write the input dtype. Their own backward
kernels (double backward) are again of this kind, so the set is closed: at most the eight layouts
(4 operand layouts x 2 orders of D) per dtype, architecture and family (``backward_closure``).

Two refinements, both measured on the corpus of real models' layers (docs/corpus.md):

* Transposed gradients. On sm90 with 16-bit inputs a gradient whose D the table above writes column-major
  (``tn``'s dB ``nt_dcol``, for instance) is computed as its transpose into row-major storage, which the kernel
  writes by TMA (``writes_transposed``): dB.t() = dD.t() @ A on ``nt``; the formulas swap and transpose the operands
  and hand back the result's transpose (``computes_transpose``, ``autograd_form``). The sm90 16-bit closure is then
  the four row-major-D layouts.
* Swapped operands. dX = dY @ W of a linear layer at 129-384 tokens (sm90, 16-bit) is computed as its transpose
  into column-major storage, dX.t() = W.t() @ dY.t() (``swaps_operands``), where that puts the tokens along N in
  tiles of a width ``tt`` cannot take along them (80, 96, 112), whose one wave fills the SMs.
* Sizes. An op planned for a problem (its size hints, an M bucket's bound) plans dA and dB for their own sizes
  (``backward_problems``: dB's inner dimension is the token count), where that changes them (``backward_hint``).

Each gradient's kernel is chosen by a ``PlanGradient`` function: the planner's estimate (``plan``, the default here,
and what emitted packages take), or, handed in from above the planner, one that also takes the measured winner for
the gradient's own request and problem (``generator.tune.tuned_plan``: the user's tuning cache, then the dispatch
table shipped for the GPU), which the JIT ops (``Gemm.compile``, ``compile_buckets``, ``nn.Linear``) use.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Iterable, Protocol

from ..spec.arch import arch_spec
from ..spec.config import KernelConfig
from ..spec.epilogue import ACC, IDENTITY
from ..spec.types import DType, Layout, Order, parse_layout, parse_order
from . import plan
from .common import Knobs, Problem
from .sm90 import few_columns_fill_tile

_FLIP = {Order.row: Order.col, Order.col: Order.row}


class PlanGradient(Protocol):
    """Chooses one gradient's kernel from its request, as ``plan`` does (``plan`` is one)."""

    def __call__(self, dtype: DType, layout: Layout, arch: int, *, family: str | None = None,
                 out_dtype: DType | None = None, problem: Problem | None = None) -> KernelConfig: ...


@dataclass(frozen=True)
class GradientRequest:
    """What one gradient's kernel is planned for: its layout (row-major D where it is computed as its transpose),
    output dtype (None: the input dtype) and problem (None: unhinted)."""

    layout: Layout
    out_dtype: DType | None
    problem: Problem | None


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


def backward_problems(problem: Problem) -> tuple[Problem, Problem]:
    """The sizes of dA and dB for a forward problem M x N x K: dA (M, K) = dD (M, N) @ B.t() is M x K x N, and
    dB (K, N) = A.t() @ dD is K x N x M, whose inner dimension is the forward's M (a linear layer's weight gradient
    sums over the tokens)."""
    return Problem(problem.m, problem.k, problem.n), Problem(problem.k, problem.n, problem.m)


def gradient_requests(config: KernelConfig, grad_order: object = Order.row,
                      problem: Problem | None = None) -> tuple[GradientRequest, GradientRequest]:
    """The requests of dA's and dB's kernels for ``config`` (see ``backward_configs``): what their kernels are planned
    for, and what a tuning run measures to choose them (benchmarks/tune_corpus.py)."""
    layouts = backward_layouts(config.layout, grad_order)
    out_dtype = None
    if config.dtype is DType.tf32:
        out_dtype = DType.fp32   # tf32 inputs are fp32 tensors: so are their gradients
    problems = backward_problems(problem) if problem is not None else (None, None)
    requests = []
    for index, (lay, p) in enumerate(zip(layouts, problems)):
        if writes_transposed(config, lay) or (index == 0 and swaps_operands(config, lay, p)):
            lay, p = transposed_layout(lay), (Problem(p.n, p.m, p.k) if p is not None else None)
        requests.append(GradientRequest(lay, out_dtype, p))
    return requests[0], requests[1]


def backward_configs(config: KernelConfig, grad_order: object = Order.row, problem: Problem | None = None,
                     plan_gradient: PlanGradient = plan) -> tuple[KernelConfig, KernelConfig]:
    """Planned configs for dA and dB: the forward op's dtype, architecture and kernel family, output
    dtype = input dtype.

    ``problem``: the forward problem the op was planned for (an M bucket's bound and the layer's N and K); dA and
    dB are then planned for their own sizes (``backward_problems``), not the forward's tile: at 256 tokens dB's
    inner dimension is 256, a problem of its own. None: planned without hints (a large square problem), as a
    forward plan without hints is. ``plan_gradient``: how each is chosen (the module docstring).
    """
    grad_a, grad_b = (plan_gradient(config.dtype, r.layout, config.arch, family=config.family,
                                    out_dtype=r.out_dtype, problem=r.problem)
                      for r in gradient_requests(config, grad_order, problem))
    return grad_a, grad_b


def writes_transposed(config: KernelConfig, gradient: Layout) -> bool:
    """Whether the gradient of layout ``gradient`` (a column-major D) is computed as its transpose into row-major
    storage (``transposed_layout``) on ``config``'s family: sm90 16-bit and tf32 plans. The sm90 kernel stores a
    column-major D from the accumulators element by element, while a row-major one goes out by TMA: dW of a linear
    layer (``nt`` with a column-major D for a ``tn`` forward) read 0.79 TB/s against cuBLAS's 2.5 TB/s at 16 tokens,
    the store being the whole kernel (docs/corpus.md); tf32's dW of a 4096 x 14336 layer 0.67x cuBLAS column-major
    against 1.26x as its transpose at 16 tokens, 0.91x against 1.18x at 256 (docs/dtypes.md). The formulas call such
    a kernel on the transposed operands and hand back the transpose of its result (``computes_transpose``), the bytes
    of the column-major gradient."""
    return (config.family == "sm90" and (config.dtype.bytes == 2 or config.dtype is DType.tf32)
            and gradient.c is Order.col)


#: The rows (tokens) of dA = dD @ B.t() (``tt``: a linear layer's dX = dY @ W) that may compute it as its
#: transpose (``swaps_operands``): more than the first, at most the second.
SWAPPED_GRAD_A_ROWS = (128, 384)
_ROW_MAJOR = Layout(a=Order.row, b=Order.row, c=Order.row)


def swaps_operands(config: KernelConfig, gradient: Layout, problem: Problem | None) -> bool:
    """Whether dA, of layout ``gradient`` and size ``problem`` (M x K x N), is computed as its transpose into
    column-major storage, dA.t() = B @ dD.t() (``transposed_layout``: ``nn`` with a column-major D, whose bytes are
    the row-major dA; the sm90 kernel stages such a D transposed and stores it by TMA): sm90 16-bit plans, dA of
    layout ``tt`` (dX = dY @ W with W row-major), one problem of SWAPPED_GRAD_A_ROWS rows, where the swapped problem
    takes a tile of planner.sm90.FEW_COLUMNS_FILL_N's rule: a 128-row tile as wide as no ``tt`` tile along the tokens
    can be (80, 96, 112 columns), whose one wave fills the SMs. Measured on the corpus' dX (H200, bf16,
    bench_corpus.py --passes dX, h200_corpus_dx_swapped_odd.json beside h200_corpus_dx_tt_odd.json), docs/corpus.md."""
    low, high = SWAPPED_GRAD_A_ROWS
    if not (config.family == "sm90" and config.dtype.bytes == 2 and gradient == _ROW_MAJOR and problem is not None
            and problem.batch == 1 and low < problem.m <= high):
        return False
    swapped = transposed_layout(gradient)
    swapped_problem = Problem(problem.n, problem.m, problem.k)
    return few_columns_fill_tile(config.dtype, config.dtype, swapped, Knobs(), swapped_problem,
                                 arch_spec(config.arch).sm_count) is not None


def transposed_layout(layout: Layout) -> Layout:
    """The layout of P.t() = R.t() @ L.t() for a product P = L @ R of ``layout`` (``Layout.transposed``)."""
    return layout.transposed()


@dataclass(frozen=True)
class AutogradForm:
    """How the C++ formula (templates/torch/gemm_autograd.h, AutogradSpec) calls one order's dA and dB ops: the order
    in which dA's op takes B.t() (B where it computes dA.t()), dB's op A.t() (A where it computes dB.t()), and
    whether each computes the transpose (``computes_transpose``). True = row-major."""

    a_b_row: bool
    b_a_row: bool
    a_transposed: bool
    b_transposed: bool


def autograd_form(config: KernelConfig, grad_a: KernelConfig, grad_b: KernelConfig) -> AutogradForm:
    """The ``AutogradForm`` of ``config``'s backward kernels ``grad_a`` and ``grad_b`` (``backward_configs``)."""
    a_t = computes_transpose(grad_a, config.layout.a)
    b_t = computes_transpose(grad_b, config.layout.b)
    return AutogradForm(a_b_row=(grad_a.layout.a if a_t else grad_a.layout.b) is Order.row,
                        b_a_row=(grad_b.layout.b if b_t else grad_b.layout.a) is Order.row,
                        a_transposed=a_t, b_transposed=b_t)


def computes_transpose(grad: KernelConfig, stored: Order) -> bool:
    """Whether the backward kernel ``grad`` computes its gradient's transpose (``writes_transposed``): it writes
    row-major where the gradient is stored in ``stored`` (A's order for dA, B's for dB) column-major."""
    return grad.layout.c is not stored


def backward_hint(config: KernelConfig, problem: Problem | None, plan_gradient: PlanGradient = plan) -> Problem | None:
    """``problem`` where choosing the backward kernels for it (``backward_configs``) changes them from the
    unhinted ones, for either order of dD; else None (the op then shares the unhinted op's registration). Quantized
    plans have no backward."""
    if problem is None or config.dtype.is_quantized or problem.batch != 1:
        return None
    for order in Order:
        if backward_configs(config, order, problem, plan_gradient) != backward_configs(config, order):
            return problem
    return None


def same_backward(config: KernelConfig, first: Problem | None, second: Problem | None,
                  plan_gradient: PlanGradient = plan) -> bool:
    """Whether ``config``'s backward kernels are the same chosen for the forward problems ``first`` and ``second``
    (two M buckets of one kernel may merge only then: the merged bucket's op plans its backward for one of them)."""
    return config.dtype.is_quantized or all(
        backward_configs(config, order, first, plan_gradient) == backward_configs(config, order, second, plan_gradient)
        for order in Order)


def hinted_op_name(config: KernelConfig, problem: Problem | None, plan_gradient: PlanGradient = plan) -> str:
    """The registered name of ``config``'s op whose backward is planned for ``problem`` (``backward_hint``): the
    kernel name, and after ``_bwd_`` the forward problem the backward kernels were planned for. Where
    ``plan_gradient`` chooses other kernels than the planner would (measured winners), a digest of their names
    follows (``_tuned<hex>``): one registered op holds one backward, and another process, or this one after a
    ``tune()``, may choose differently for the same problem."""
    if problem is None:
        return config.name
    name = f"{config.name}_bwd_{problem.m}x{problem.n}x{problem.k}"
    if plan_gradient is plan:
        return name
    chosen = [backward_configs(config, order, problem, plan_gradient) for order in Order]
    if chosen == [backward_configs(config, order, problem) for order in Order]:
        return name
    digest = hashlib.sha1(" ".join(c.name for pair in chosen for c in pair).encode()).hexdigest()[:8]
    return f"{name}_tuned{digest}"


def accumulator_config(config: KernelConfig) -> KernelConfig:
    """The plain kernel that recomputes a fused-epilogue op's accumulator acc = A @ B in fp32 for its backward
    (the forward config without the epilogue, writing fp32): its backward differentiates the epilogue at acc, so
    the forward saves nothing beyond its inputs and runs no differently when a gradient is required. Its own
    dA and dB kernels are the forward config's (``backward_configs`` reads neither epilogue nor output dtype)."""
    return replace(config, epilogue=IDENTITY, out_dtype=DType.fp32)


def saving_config(config: KernelConfig) -> KernelConfig | None:
    """The forward kernel a fused-epilogue op runs instead when a gradient is required: the same kernel, also
    storing acc as its second output (in D's dtype and order), which the backward differentiates the epilogue at
    instead of recomputing acc (one GEMM fewer; the memory of one M x N output, as torch's Linear + GELU saves its
    pre-activation). None when the gradients do not read acc (``Epilogue.backward_reads_acc``), and where the
    backward recomputes acc in fp32 (``accumulator_config``): an epilogue with a second output of its own, or with
    a kink (relu, max, clamp, ...: ``Epilogue.smooth_in_acc``), whose derivative the rounding of acc would flip
    for the elements next to it."""
    ep = config.epilogue
    if ep.is_identity or ep.aux is not None or not ep.backward_reads_acc or not ep.smooth_in_acc:
        return None
    return replace(config, epilogue=replace(ep, aux=ACC))


def backward_closure(configs: Iterable[KernelConfig], problems: Iterable[Problem | None] | None = None,
                     plan_gradient: PlanGradient = plan) -> dict[str, KernelConfig]:
    """Every config that the backward of ``configs`` needs, for both orders of dD, and the backward of
    those (double backward, and so on): {kernel name: config}, sorted by name. ``problems``: the forward problem of
    each config (``backward_configs``' hint; None, or no list: unhinted), whose kernels ``plan_gradient`` chooses;
    the backward kernels' own backward is planned without hints, as their ops are registered.

    The given configs are not in it unless some backward reaches them. Deduplicated by kernel name,
    which spells the whole config.
    """
    configs = list(configs)
    hints = list(problems) if problems is not None else [None] * len(configs)
    found: dict[str, KernelConfig] = {}
    todo = [grad for cfg, problem in zip(configs, hints) for order in Order
            for grad in backward_configs(cfg, order, problem, plan_gradient)]
    while todo:
        cfg = todo.pop()
        if cfg.name not in found:
            found[cfg.name] = cfg
            todo.extend(grad for order in Order for grad in backward_configs(cfg, order))
    return dict(sorted(found.items()))
