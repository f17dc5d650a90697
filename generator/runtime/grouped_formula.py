"""The backward of grouped calls (``.grouped(A, B, offsets)`` and ``.grouped_list(As, Bs)``), in torch alone.

This one file serves two homes, so it imports only torch and the standard library: gemmgen's JIT ops use it
(``generator.runtime.autograd``, with their op handles), and ``python -m generator emit`` copies it byte for byte into
every package emitted with autograd (``<package>/_grouped_formula.py``), whose ``__init__.py`` registers the same
formulas on the package's own ops. The argument checks of gemmgen (``generator.runtime.checks``) take the 16-byte rule
of grouped calls and the check of the group ends from here, so that each exists once.

What the formulas take of an op is small (``Formula``, ``GradOp``): its name and input dtype, and per storage order of
the gradient the ops computing dA and dB, each as its three calls (plain, grouped, list), its operands' storage orders,
D's dtype, and its two refusal tests (its plan's, decided where the plan is known, then the operands' 16-byte rule).

* ``.grouped(A, B, offsets)``, dD (T, N) made row-major (a copy where it is not; the grouped dA kernel walks a
  row-major A): dA = ``grad_a.grouped(dD, B.transpose(1, 2), offsets)``, one launch (B.transpose(1, 2) (E, N, K) is
  B's memory with each matrix in B's order flipped, which the dA op takes); dB[g] = A[rows of g].t() @ dD[rows of g],
  the reduction over the group's rows, as one grouped call along K on the dB op (``grad_b.grouped(A.t(), dD,
  offsets)``, B 2-D: the library builds each group's tensor maps on the device, so nothing is read on the host; an
  empty group's dB[g] is zeros). Where the dB op would refuse that call, one list call (a problem per group with rows;
  the group ends read with one copy to the host, ``offsets.tolist()``, and checked) stacked into (E, K, N) in B's
  order (``torch.stack``: one copy). offsets has no gradient.
* ``.grouped(A, B, offsets)`` with B 2-D (groups along K), dD (E, M, N) made row-major: dB (K, N) = dB-op.grouped(
  A.t(), dD, offsets) and dA (M, K) = dA-op.grouped(B, dD.transpose(1, 2), offsets).t() (the dA op computes its
  gradient's transpose), groups of rows both (``grouped_k_backward``); one plain call per group where refused.
* ``.grouped_list(As, Bs)``: dA_i = dD_i @ B_i.t() and dB_i = A_i.t() @ dD_i, one list call each per storage order of
  the gradients (normally one), for the problems whose input requires grad and whose output has a gradient (else
  None, torch's zero).
* Where the dA or dB op takes no grouped (list) call (its plan: an sm80 plan, the ws schedule, stream-K), every group
  (problem) is one plain call of it instead; where one problem's operands break the 16-byte rule of grouped calls
  (``alignment_refusal``), that problem alone is a plain call (which repacks or runs the unaligned kernel).
* A traced backward (fake or meta tensors: torch.compile's AOTAutograd) is refused with the workaround
  (``refuse_traced_grouped_backward``): the formulas read the group ends and the operands' addresses on the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

#: The 16-byte rule of the kernels' TMA loads (kFastAlignBytes, templates/common/alignment.cuh).
FAST_ALIGN_BYTES = 16


# -- storage orders (``row``: True for row-major, False for column-major) --------------------------------------------

def leading_dim(t: torch.Tensor, row: bool) -> int | None:
    """The leading dimension of a 2-D tensor stored row-major (``row``) or column-major (of a 3-D one: of each of its
    matrices, the last two dimensions), or None if it is not stored so.

    A dimension of size 1 has no meaningful stride; its leading dimension is then the other size, which keeps the
    16-byte alignment test honest for vectors."""
    rows, cols = t.shape[-2:]
    if row:
        inner_ok = cols <= 1 or t.stride(-1) == 1
        ld = t.stride(-2) if rows > 1 else max(cols, 1)
        return ld if inner_ok and ld >= max(cols, 1) else None
    inner_ok = rows <= 1 or t.stride(-2) == 1
    ld = t.stride(-1) if cols > 1 else max(rows, 1)
    return ld if inner_ok and ld >= max(rows, 1) else None


def batch_stride(t: torch.Tensor) -> int:
    """The elements between the matrices of a 3-D tensor (GemmArgs' batch strides): 0 for a 2-D tensor or a batch of
    one, whose one matrix every problem reads (or writes)."""
    return t.stride(0) if t.dim() == 3 and t.shape[0] > 1 else 0


def empty_in_order(shape: tuple[int, ...], row: bool, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized tensor of ``shape`` (2-D or 3-D) whose matrices are stored row- (``row``) or column-major,
    packed."""
    if row:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.empty((*shape[:-2], shape[-1], shape[-2]), dtype=dtype, device=device).transpose(-1, -2)


def in_order(t: torch.Tensor, row: bool) -> torch.Tensor:
    """``t`` itself when it (each matrix of a 3-D ``t``) is stored in that order (any leading dimension), else a copy
    that is."""
    if leading_dim(t, row) is not None:
        return t
    if t.numel() == 0:   # (contiguous() keeps an empty tensor's strides, an expanded one's (0, 0) too)
        return empty_in_order(tuple(t.shape), row, t.dtype, t.device)
    return t.contiguous() if row else t.transpose(-1, -2).contiguous().transpose(-1, -2)


def stored_row(t: torch.Tensor) -> bool | None:
    """True (row-major) or False (column-major), whichever ``t`` can be taken as without a copy; None for neither."""
    if leading_dim(t, True) is not None:
        return True
    if leading_dim(t, False) is not None:
        return False
    return None


def gradient(dtype: torch.dtype, grad: torch.Tensor, row: bool | None = None) -> tuple[torch.Tensor, bool]:
    """dD as the backward ops take it, with its order: in the inputs' ``dtype`` (an fp32 output's gradient is cast, the
    kernels take the input dtype), and in ``row``'s order (a copy where it is not), or with ``row`` None in the order
    it is stored (row-major, copied, where neither: an expanded gradient's strides are (0, 0))."""
    if grad.dtype != dtype:
        grad = grad.to(dtype)
    if row is not None:
        return in_order(grad, row), row
    stored = stored_row(grad)
    return (in_order(grad, True), True) if stored is None else (grad, stored)


# -- the checks of grouped calls (gemmgen's op and templates/torch/gemm_op.h say the same) -------------------------

def check_group_ends(ends: list[int], rows: int, along_k: bool = False) -> None:
    """The values of a grouped call's offsets (read on the host): nondecreasing group ends from 0, the last one at
    A's last row (``along_k``: at K, A's last column)."""
    previous = 0
    for g, end in enumerate(ends):
        if end < previous:
            if g == 0:
                raise ValueError(f"offsets must be nondecreasing group ends (cumulative row counts) from 0: "
                                 f"offsets[0] = {end} < 0")
            raise ValueError(f"offsets must be nondecreasing group ends (cumulative row counts): offsets[{g}] = "
                             f"{end} < offsets[{g - 1}] = {previous}")
        previous = end
    if ends and ends[-1] != rows:
        if along_k:
            raise ValueError(f"offsets[-1] = {ends[-1]} but K is {rows} (A's columns, B's rows): the last group must "
                             "end at K")
        raise ValueError(f"offsets[-1] = {ends[-1]} but A has {rows} rows: the last group must end at A's last row")


def _aligned_copy(what: str, row: bool, dim: int) -> str:
    """A copy of a grouped call's A (2-D) or B (3-D) in its order at a fresh, 16-byte aligned address."""
    fresh = ".clone(memory_format=torch.contiguous_format)"
    if row:
        return f"{what}{fresh}"
    swap = ".t()" if dim == 2 else ".transpose(1, 2)"
    return f"{what}{swap}{fresh}{swap}"


def _padded_view(what: str, row: bool, t: torch.Tensor, multiple: int) -> str:
    """A view of a padded buffer holding a grouped call's A (M, K) or B (E, K, N) in its order, whose leading
    dimension is a multiple of ``multiple`` elements."""
    def up(size: int) -> int:
        return -(-max(size, 1) // multiple) * multiple

    like = f"dtype={t.dtype}, device='{t.device}'"
    rows, cols = t.shape[-2:]
    batch = f"{t.shape[0]}, " if t.dim() == 3 else ""
    lead = ":, " if t.dim() == 3 else ""
    if row:
        return f"torch.empty({batch}{rows}, {up(cols)}, {like})[{lead}:, :{cols}]"
    swap = ".t()" if t.dim() == 2 else ".transpose(1, 2)"
    return f"torch.empty({batch}{cols}, {up(rows)}, {like})[{lead}:, :{rows}]{swap}"


def alignment_refusal(what: str, t: torch.Tensor, row: bool, ld: int, stride: int) -> str | None:
    """Why a grouped call's A or B breaks the 16-byte rule of the grouped kernel's TMA loads (base address, leading
    dimension, B's stride between its matrices: the library's choose_grouped_path, templates/common/launch.cuh),
    with the fix; None if it keeps it. ``row``: its storage order; ``ld`` and ``stride``: the launch's (``stride`` 0
    for A, and for a B of one matrix)."""
    size = t.element_size()
    address = t.data_ptr()
    if address % FAST_ALIGN_BYTES:
        detail = f"its base address is {address % FAST_ALIGN_BYTES} bytes past a multiple of 16"
        fix = f"pass a copy, {_aligned_copy(what, row, t.dim())}"
    elif ld * size % FAST_ALIGN_BYTES:
        multiple = FAST_ALIGN_BYTES // size
        detail = f"its leading dimension is {ld} elements ({ld * size} bytes)"
        fix = (f"make its leading dimension a multiple of {multiple} elements: pass a view of a padded buffer, e.g. "
               f"{_padded_view(what, row, t, multiple)}")
    elif stride * size % FAST_ALIGN_BYTES:
        detail = f"its matrices are {stride} elements ({stride * size} bytes) apart"
        fix = f"pass a copy, {_aligned_copy(what, row, t.dim())}"
    else:
        return None
    return (f"{what} breaks the 16-byte rule of grouped calls: {detail}; the grouped kernel loads A and B by TMA, "
            f"which needs the base address, the leading dimension and the stride between B's matrices to be "
            f"multiples of 16 bytes: {fix}")


def has_work(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether x @ y launches a kernel (M, N and K all nonzero): the 16-byte rule holds only there."""
    return x.shape[-2] > 0 and y.shape[-1] > 0 and x.shape[-1] > 0


def _call_refusal(plan_reason: str | None, x: torch.Tensor, y: torch.Tensor, rows: tuple[bool, bool],
                  names: tuple[str, str], matrix_strides: tuple[int, int]) -> str | None:
    """``plan_reason`` (the plan's refusal of the call's form), else, where x @ y has work, the first of x and y (stored
    in ``rows``' orders, named ``names``, ``matrix_strides`` apart between their matrices) off the 16-byte rule; None:
    taken."""
    if plan_reason is not None or not has_work(x, y):
        return plan_reason
    for what, t, row, stride in zip(names, (x, y), rows, matrix_strides):
        reason = alignment_refusal(what, t, row, leading_dim(t, row), stride)
        if reason is not None:
            return reason
    return None


def grouped_call_refusal(plan_reason: str | None, a_row: bool, b_row: bool, x: torch.Tensor,
                         y: torch.Tensor) -> str | None:
    """Why a backward op's ``.grouped(x, y, offsets)`` would be refused: ``plan_reason`` (its plan's refusal of grouped
    calls, None where it takes them), or x or y off the 16-byte rule; None where it takes the call. x and y in the op's
    orders (``a_row``, ``b_row``)."""
    return _call_refusal(plan_reason, x, y, (a_row, b_row), ("A", "B"), (batch_stride(x), batch_stride(y)))


def list_problem_refusal(plan_reason: str | None, a_row: bool, b_row: bool, i: int, x: torch.Tensor,
                         y: torch.Tensor) -> str | None:
    """Why problem ``i`` = (x, y) of a backward op's ``.grouped_list`` would be refused: ``plan_reason`` (its plan's
    refusal of list calls), or x or y off the 16-byte rule where the problem has work; None where the list call takes
    it. (The list call checks the rule at each problem's own addresses: one problem off it takes a plain call, the
    others stay.)"""
    return _call_refusal(plan_reason, x, y, (a_row, b_row), (f"A[{i}]", f"B[{i}]"), (0, 0))


# -- what the formulas take of an op ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class GradOp:
    """An op computing dA or dB, as the formulas call it."""

    call: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]   # x @ y, a plain call (any strides, any alignment)
    grouped: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]   # .grouped(x, y, offsets)
    grouped_list: Callable[[list[torch.Tensor], list[torch.Tensor]], list[torch.Tensor]]   # .grouped_list(xs, ys)
    a_row: bool   # the orders it takes x and y in, and writes D in: True for row-major
    b_row: bool
    d_row: bool
    out_dtype: torch.dtype
    # Why it would refuse .grouped(x, y, ...), or problem i = (x, y) of .grouped_list; None where it takes it
    # (``grouped_call_refusal``, ``list_problem_refusal`` with its plan's refusals).
    grouped_call_refusal: Callable[[torch.Tensor, torch.Tensor], str | None]
    list_problem_refusal: Callable[[int, torch.Tensor, torch.Tensor], str | None]
    # Whether it computes its gradient's transpose into row-major storage (generator/planner/backward.py
    # writes_transposed): x @ y is then taken as (y.t() @ x.t()).t(), the bytes of a column-major result.
    transposed: bool = False

    @property
    def result_row(self) -> bool:
        """The order the gradients it gives are stored in (True: row-major)."""
        return self.d_row != self.transposed


@dataclass(frozen=True)
class Formula:
    """What the backward of an op's grouped calls takes of the op."""

    name: str            # the op's name, for the messages
    dtype: torch.dtype   # its inputs' dtype (a gradient of another dtype is cast to it)
    # The ops computing dA and dB for a gradient stored row-major (True) or column-major (False).
    grad_ops: Callable[[bool], tuple[GradOp, GradOp]]


# -- the formulas ----------------------------------------------------------------------------------------------------

def refuse_traced_grouped_backward(name: str, overload: str, tensors: Sequence[Any]) -> None:
    """The backward of a grouped call reads the group ends (.grouped) and the operands' addresses (both forms: the
    16-byte rule decides between the grouped call and plain ones) on the host, which a trace with fake or meta
    tensors (torch.compile's AOTAutograd tracing the backward, opcheck's AOT tests) cannot: refused with the
    workaround rather than failing on a data-dependent guard."""
    from torch._subclasses.fake_tensor import is_fake

    if any(isinstance(t, torch.Tensor) and (t.device.type == "meta" or is_fake(t)) for t in tensors):
        raise RuntimeError(
            f"{name}.{overload}: the backward of a grouped call reads the group sizes and the operands' addresses "
            "on the host, which a traced backward (torch.compile, fake or meta tensors) cannot do yet: keep the "
            "grouped call out of the compiled region (call it in a function decorated with torch.compiler.disable), "
            "or compile without training through it")


def list_products(grad_op: GradOp, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> list[torch.Tensor]:
    """[x @ y for x, y in zip(xs, ys)] on ``grad_op`` (each pair in its orders, the results in its order of D): one
    list call for the problems with work that it takes, one plain call for each other problem with work
    (``grad_op.list_problem_refusal``: all of them where its plan takes no list call); a problem without work (an
    empty group's K = 0, an empty matrix) launches nothing: zeros."""
    outs = [None if has_work(x, y) else
            empty_in_order((x.shape[0], y.shape[1]), grad_op.d_row, grad_op.out_dtype, x.device).zero_()
            for x, y in zip(xs, ys)]
    listed = [i for i, (x, y) in enumerate(zip(xs, ys))
              if outs[i] is None and grad_op.list_problem_refusal(i, x, y) is None]
    if listed:
        for i, d in zip(listed, grad_op.grouped_list([xs[i] for i in listed], [ys[i] for i in listed])):
            outs[i] = d
    for i, (x, y) in enumerate(zip(xs, ys)):
        if outs[i] is None:
            outs[i] = grad_op.call(x, y)
    return outs


def stack_in_order(matrices: list[torch.Tensor], shape: tuple[int, ...], row: bool, dtype: torch.dtype,
                   device: torch.device) -> torch.Tensor:
    """The matrices (each of shape[1:]) as one tensor of ``shape``, each matrix stored row- (``row``) or column-major,
    packed (one copy: torch.stack)."""
    if not matrices:
        return empty_in_order(shape, row, dtype, device)
    if row:
        return torch.stack(matrices)
    return torch.stack([m.t() for m in matrices]).transpose(1, 2)


def host_groups(offsets: torch.Tensor, total: int, along_k: bool = False) -> Callable[[], list[tuple[int, int]]]:
    """The groups' bounds [start, end) (rows, or ``along_k`` values of K), read on the host (one copy, a sync) and
    checked the first time the returned function is called: only the fallbacks that need them pay the sync. (The
    forward checked them, unless it was captured in a CUDA graph.)"""
    bounds: list[tuple[int, int]] | None = None

    def groups() -> list[tuple[int, int]]:
        nonlocal bounds
        if bounds is None:
            ends = offsets.tolist()
            check_group_ends(ends, total, along_k)
            bounds = list(zip([0, *ends[:-1]], ends))
        return bounds

    return groups


def grouped_backward(op: Formula, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor,
                     need_a: bool, need_b: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """dA (T, K) and dB (E, K, N) of ``op.grouped(A, B, offsets)`` for its gradient ``grad`` (T, N), on the dA and dB
    ops of a row-major gradient (see the module docstring; None where not needed). The group ends are read on the
    host (one copy)."""
    refuse_traced_grouped_backward(op.name, "grouped", (A, B, offsets, grad))
    grad, row = gradient(op.dtype, grad, True)   # the grouped dA kernel walks the groups over a row-major A
    grad_a_op, grad_b_op = op.grad_ops(row)
    groups = host_groups(offsets, A.shape[0])
    grad_a = _grouped_grad_a(grad_a_op, A, B, offsets, grad, groups) if need_a else None
    grad_b = _grouped_grad_b(grad_b_op, A, B, offsets, grad, groups) if need_b else None
    return grad_a, grad_b


def grouped_k_backward(op: Formula, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor,
                       need_a: bool, need_b: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """dA (M, K) and dB (K, N) of a grouped call along K, ``op.grouped(A, B, offsets)`` with B 2-D, for its gradient
    ``grad`` (E, M, N): dA[:, group g] = dD[g] @ B[group g].t() and dB[group g] = A[:, group g].t() @ dD[g], both
    groups of rows of the results' transposes or of dB, so grouped calls of rows on the dA and dB ops of a row-major
    gradient: dB = dB-op.grouped(A.t(), dD, offsets) and, where the dA op computes its gradient's transpose (as it
    does for the layout these calls take, nt), dA = dA-op.grouped(B, dD.transpose(1, 2), offsets).t(). Where either
    is refused, one plain call per group with values of K (the group ends read on the host, once)."""
    refuse_traced_grouped_backward(op.name, "grouped", (A, B, offsets, grad))
    grad, row = gradient(op.dtype, grad, True)   # each matrix row-major: the grouped calls' B for dB, dA's transposed
    grad_a_op, grad_b_op = op.grad_ops(row)
    groups = host_groups(offsets, A.shape[1], along_k=True)
    grad_a = grad_b = None
    if need_a:
        grad_a = _rows_of_groups(grad_a_op, A.shape, offsets, groups, B, grad.transpose(1, 2), transposed=True,
                                 plain=lambda g, s, e: _plain_product(grad_a_op, grad[g], B[s:e].t()), columns=True)
    if need_b:
        grad_b = _rows_of_groups(grad_b_op, B.shape, offsets, groups, A.t(), grad, transposed=False,
                                 plain=lambda g, s, e: _plain_product(grad_b_op, A[:, s:e].t(), grad[g]), columns=False)
    return grad_a, grad_b


def _rows_of_groups(grad_op: GradOp, shape: torch.Size, offsets: torch.Tensor,
                    groups: Callable[[], list[tuple[int, int]]], rows: torch.Tensor, matrices: torch.Tensor,
                    transposed: bool, plain: Callable[[int, int, int], torch.Tensor],
                    columns: bool) -> torch.Tensor:
    """A gradient of ``shape`` whose groups of K are groups of rows (``columns``: of its transpose): rows[group g] @
    matrices[g] in one grouped call of ``grad_op`` where it takes it and its ``transposed`` flag is this (True: the
    op computes its gradient's transpose, which that product is), else ``plain(g, start, end)`` per group with values
    of K into the gradient's rows (columns)."""
    if grad_op.transposed == transposed:
        x, y = in_order(rows, grad_op.a_row), in_order(matrices, grad_op.b_row)
        if grad_op.grouped_call_refusal(x, y) is None:
            d = grad_op.grouped(x, y, offsets)
            return d.t() if columns else d
    out = empty_in_order(tuple(shape), grad_op.result_row, grad_op.out_dtype, rows.device)
    for g, (start, end) in enumerate(groups()):
        if end > start:
            if columns:
                out[:, start:end] = plain(g, start, end)
            else:
                out[start:end] = plain(g, start, end)
    return out


def _grouped_grad_b(grad_b_op: GradOp, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor,
                    groups: Callable[[], list[tuple[int, int]]]) -> torch.Tensor:
    """dB (E, K, N), dB[g] = A[rows of g].t() @ grad[rows of g]: one grouped call along K (the groups split the
    reduction; nothing read on the host), or where it would be refused one list call (a problem per group with rows)
    stacked into B's shape."""
    x, y = kernel_operands(A.t(), grad, grad_b_op.a_row, grad_b_op.b_row, grad_b_op.transposed)
    along_k = not grad_b_op.a_row and grad_b_op.b_row   # (K the outer dimension of both: grouped_k_refusal)
    if has_work(x, y) and along_k and grad_b_op.list_problem_refusal(0, x, y) is None:
        d = grad_b_op.grouped(x, y, offsets)   # (E, M, N) of the kernel's product, one matrix per group
        return d.transpose(1, 2) if grad_b_op.transposed else d
    products = gradient_products(grad_b_op, [A[start:end].t() for start, end in groups()],
                                 [grad[start:end] for start, end in groups()])
    return stack_in_order(products, tuple(B.shape), grad_b_op.result_row, grad_b_op.out_dtype, B.device)


def kernel_operands(left: torch.Tensor, right: torch.Tensor, a_row: bool, b_row: bool,
                    transposed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The operands with which a kernel taking A and B in the orders ``a_row`` and ``b_row`` computes left @ right,
    each in its order (a copy only where it is stored otherwise); where it computes the transpose (``transposed``:
    generator/planner/backward.py writes_transposed) right.t() and left.t(), and the caller transposes the result."""
    if transposed:
        left, right = right.t(), left.t()
    return in_order(left, a_row), in_order(right, b_row)


def gradient_products(grad_op: GradOp, lefts: list[torch.Tensor], rights: list[torch.Tensor]) -> list[torch.Tensor]:
    """[left @ right for each pair] on ``grad_op`` (one list call, ``list_products``; ``kernel_operands``). The
    results are stored in ``grad_op.result_row``'s order."""
    pairs = [kernel_operands(left, right, grad_op.a_row, grad_op.b_row, grad_op.transposed)
             for left, right in zip(lefts, rights)]
    products = list_products(grad_op, [x for x, _ in pairs], [y for _, y in pairs])
    return [d.t() for d in products] if grad_op.transposed else products


def _grouped_grad_a(grad_a_op: GradOp, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor,
                    groups: Callable[[], list[tuple[int, int]]]) -> torch.Tensor:
    """dA = grad @ B[g].t() per group's rows: one grouped call, or where it would be refused one plain call per group
    with rows, into rows of dA."""
    if not grad_a_op.transposed:   # (a grouped call walks rows of D: a transposed dA has none to walk)
        x, y = in_order(grad, grad_a_op.a_row), in_order(B.transpose(1, 2), grad_a_op.b_row)
        if grad_a_op.grouped_call_refusal(x, y) is None:
            return grad_a_op.grouped(x, y, offsets)
    grad_a = empty_in_order((A.shape[0], A.shape[1]), grad_a_op.result_row, grad_a_op.out_dtype, A.device)
    for g, (start, end) in enumerate(groups()):
        if end > start:
            grad_a[start:end] = _plain_product(grad_a_op, grad[start:end], B[g].t())
    return grad_a


def _plain_product(grad_op: GradOp, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """left @ right as one plain call of ``grad_op``."""
    return kernel_product(grad_op.call, left, right, grad_op.a_row, grad_op.b_row, grad_op.transposed)


def kernel_product(call: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], left: torch.Tensor,
                   right: torch.Tensor, a_row: bool, b_row: bool, transposed: bool) -> torch.Tensor:
    """left @ right from one ``call`` of a kernel (``kernel_operands``); where it computes the transpose, the
    transpose of its result."""
    d = call(*kernel_operands(left, right, a_row, b_row, transposed))
    return d.t() if transposed else d


def list_backward(op: Formula, A: list[torch.Tensor], B: list[torch.Tensor], grads: list[torch.Tensor | None],
                  need_a: list[bool], need_b: list[bool]
                  ) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
    """[dA_i] and [dB_i] of ``op.grouped_list(A, B)`` for its outputs' gradients ``grads`` (None: that output has
    none): dA_i = dD_i @ B_i.t() where ``need_a[i]``, dB_i = A_i.t() @ dD_i where ``need_b[i]``, else None; one
    list call on the dA op and one on the dB op per storage order of the gradients (see the module docstring)."""
    refuse_traced_grouped_backward(op.name, "grouped_list", (*A, *B, *grads))
    count = len(A)
    grad_a: list[torch.Tensor | None] = [None] * count
    grad_b: list[torch.Tensor | None] = [None] * count
    prepared = [None if g is None else gradient(op.dtype, g) for g in grads]
    for row in (True, False):
        found = [i for i, p in enumerate(prepared) if p is not None and p[1] == row]
        if not found:
            continue
        grad_a_op, grad_b_op = op.grad_ops(row)
        dd = {i: prepared[i][0] for i in found}
        _products_into(grad_a, grad_a_op, [i for i in found if need_a[i]], lambda i: (dd[i], B[i].t()))
        _products_into(grad_b, grad_b_op, [i for i in found if need_b[i]], lambda i: (A[i].t(), dd[i]))
    return grad_a, grad_b


def _products_into(out: list[torch.Tensor | None], grad_op: GradOp, chosen: list[int],
                   pair: Callable[[int], tuple[torch.Tensor, torch.Tensor]]) -> None:
    """out[i] = x @ y for each chosen problem i, (x, y) = pair(i): one list call (``gradient_products``)."""
    pairs = [pair(i) for i in chosen]
    for i, d in zip(chosen, gradient_products(grad_op, [x for x, _ in pairs], [y for _, y in pairs])):
        out[i] = d


def register_formulas(qualname: str, op: Formula, lib: torch.library.Library | None = None) -> None:
    """The Autograd kernels of ``qualname``'s .grouped and .grouped_list (``qualname``: "namespace::op"):
    ``grouped_backward`` and ``list_backward``, through ``torch.library.register_autograd`` (a list overload's
    gradients are lists, one entry per matrix, None where there is none). Calls that need no gradient go below
    autograd (torch.library's layer, in Python)."""
    def grouped_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        A, B, offsets = inputs
        ctx.save_for_backward(A, B, offsets)

    def grouped_formula(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        A, B, offsets = ctx.saved_tensors
        backward = grouped_k_backward if B.dim() == 2 else grouped_backward   # B 2-D: groups along K
        return (*backward(op, A, B, offsets, grad, ctx.needs_input_grad[0], ctx.needs_input_grad[1]), None)

    def list_setup(ctx: Any, inputs: tuple, output: list[torch.Tensor]) -> None:
        A, B = inputs
        ctx.count = len(A)
        ctx.set_materialize_grads(False)   # an output without a gradient: None, its problem skipped
        ctx.save_for_backward(*A, *B)

    def list_formula(ctx: Any, grads: list[torch.Tensor | None]) -> tuple[list, list]:
        saved = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad   # (a list per argument: one flag per matrix)
        return list_backward(op, saved[:ctx.count], saved[ctx.count:], grads, need_a, need_b)

    torch.library.register_autograd(f"{qualname}.grouped", grouped_formula, setup_context=grouped_setup, lib=lib)
    torch.library.register_autograd(f"{qualname}.grouped_list", list_formula, setup_context=list_setup, lib=lib)
