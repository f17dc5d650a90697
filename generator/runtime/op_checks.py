"""The argument checks of a GemmOp (``OpChecks``, the base class of ``op.GemmOp``): A and B, out=, a grouped call's
offsets and a list call's matrices, each refusal with its fix (templates/torch/gemm_op.h's C++ checks say the same
sentences), the checks its fakes make without guarding on sizes, and the outputs the calls and the fakes allocate.
Built on ``checks`` (storage orders, leading dimensions) and ``operands`` (a fused epilogue's operands)."""
from __future__ import annotations

from typing import Any, Literal, NamedTuple, Sequence

import torch

try:   # torch's broadcasting's test for a size of 1 (older torch: guard_size_oblivious, deprecated since)
    from torch.fx.experimental.symbolic_shapes import guard_or_false
except ImportError:   # pragma: no cover
    from torch.fx.experimental.symbolic_shapes import guard_size_oblivious as guard_or_false

from ..spec.config import QUANT_BLOCK, KernelConfig, second_output
from ..spec.grouped import grouped_k_refusal, grouped_list_refusal, grouped_refusal
from ..spec.types import PLANNABLE_INPUT_DTYPES, Order
from .checks import (INT32_MAX, TORCH_DTYPES, batch_stride, grouped_alignment_refusal, leading_dim, order_of,
                     other_layout)
from .operands import check_batchable, check_sizes_symbolic, check_static

#: A's and B's shapes, as one problem and as a batch of them (for messages).
_SHAPES = {"A": ("(M, K)", "(batch, M, K)"), "B": ("(K, N)", "(batch, K, N)")}
#: A grouped call's A and B: their rank and what it holds (for messages).
_GROUPED_SHAPES = {"A": (2, "2-D (total_M, K) for a grouped call: every group's rows, sorted by group"),
                   "B": (3, "3-D (E, K, N) for a grouped call: one matrix per group (expert)")}
#: A list call's A[i] and B[i] (for messages).
_LIST_SHAPES = {"A": "2-D (M, K) for a list call: one matrix per problem",
                "B": "2-D (K, N) for a list call: one matrix per problem"}

#: The form of a call, for the rank its A and B must have (gemm_op.h's CallForm): plain (2-D, or 3-D for a batch),
#: grouped rows (A 2-D, B 3-D), a list call (each A[i] and B[i] 2-D), or groups along K (A and B 2-D).
Form = Literal["plain", "grouped", "masked", "list", "k_grouped"]


class Problem(NamedTuple):
    """A call's GEMM as its checked A and B describe it: GemmArgs' sizes and leading dimensions, and for a
    batched call (3-D A or B) the number of problems and A's and B's batch strides (elements; 0: one matrix
    for every problem)."""

    m: int
    n: int
    k: int
    lda: int
    ldb: int
    batch: int | None = None   # None: one problem (2-D A and B)
    batch_stride_a: int = 0
    batch_stride_b: int = 0


def _check_rank(t: torch.Tensor, what: str, form: Form = "plain") -> None:
    """``what``: "A" or "B", or a list call's "A[i]" or "B[i]"."""
    if form == "masked" and what == "A":
        if t.dim() != 3:
            raise ValueError(f"A has shape {tuple(t.shape)}; a masked call takes A 3-D (E, max_m, K): each group's "
                             "rows in a slab of max_m rows, the first counts[g] of them valid")
    elif form in ("grouped", "masked"):
        rank, shape = _GROUPED_SHAPES[what]
        if t.dim() != rank:
            raise ValueError(f"{what} must be {shape}; got shape {tuple(t.shape)}")
    elif form == "list":
        if t.dim() != 2:
            raise ValueError(f"{what} must be {_LIST_SHAPES[what[0]]}; got shape {tuple(t.shape)}")
    elif form == "k_grouped":
        if t.dim() != 2:
            raise ValueError(f"{what} must be 2-D {_SHAPES[what][0]} for a grouped call along K (B 2-D): offsets "
                             f"split K; got shape {tuple(t.shape)}")
    elif t.dim() not in (2, 3):
        one, batched = _SHAPES[what]
        raise ValueError(f"{what} must be 2-D {one} or 3-D {batched}; got shape {tuple(t.shape)}")


def batch_size(A: torch.Tensor, B: torch.Tensor) -> Any:
    """The number of problems of a call to A and B of checked ranks: None for one (2-D A and B); for a batched
    call (3-D A or B), the batch of the 3-D operand(s), where a batch of 1 broadcasts against the other's, as in
    torch.matmul. Sizes may be symbolic (torch.compile): the tests for 1 are torch's own broadcasting's (a dynamic
    batch, whose size is at least 2, is not 1, without a guard), and equal batches a torch._check (a run-time
    assertion rather than a specialization)."""
    if A.dim() != 3 and B.dim() != 3:
        return None
    if B.dim() != 3:
        return A.shape[0]
    if A.dim() != 3:
        return B.shape[0]
    a, b = A.shape[0], B.shape[0]
    if guard_or_false(a == 1):
        return b
    if guard_or_false(b == 1):
        return a
    torch._check_with(ValueError, a == b, lambda: f"A is {tuple(A.shape)} and B is {tuple(B.shape)}: their batch "
                                                  "sizes must agree, or one be 1 (broadcast, as torch.matmul)")
    return a


def _check_index(**sizes: int) -> None:
    """Each size (by name: M=, N=, K=, batch=) within the kernels' int32 index."""
    for what, size in sizes.items():
        if size > INT32_MAX:
            raise ValueError(f"{what}={size} is larger than the kernels index (2**31 - 1): split the problem")


def _check_offsets_contiguous(offsets: torch.Tensor) -> None:
    if offsets.shape[0] > 1 and offsets.stride(0) != 1:
        raise ValueError(f"offsets has stride {offsets.stride(0)}; the kernel reads group ends contiguous: pass "
                         "offsets.contiguous()")


def _check_group_vector(t: object, A: torch.Tensor, name: str, values: str, entries: str) -> None:
    """A grouped call's int32 vector of one entry per group (offsets, counts): its type, dtype, rank and device, in
    words naming ``values`` (what its int32s are) and ``entries`` (what each entry holds); gemm_op.h's
    check_offsets_static and check_counts_static say the same."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} is {t.dtype}; {values} are int32: pass {name}.to(torch.int32)")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D (E,), {entries}; got shape {tuple(t.shape)}")
    if t.device != A.device:
        raise ValueError(f"{name} is on {t.device} but A and B on {A.device}: pass {name}.to('{A.device}')")


def _devices_message(A: torch.Tensor, B: torch.Tensor) -> str:
    """A and B on two devices (cuda:0 and cuda:1 are two): the launch runs on A's, where B's memory is not."""
    return f"A is on {A.device} and B on {B.device}: put both on one GPU, e.g. pass B.to('{A.device}')"


def _shape_str(sizes: Sequence[Any]) -> str:
    # (2, 3): as a tuple prints, for sizes that may be symbolic (str(s0), not repr)
    return "(" + ", ".join(str(s) for s in sizes) + ")"


def _has_work(p: Problem) -> bool:
    """Whether a list call launches problem ``p``: one with no rows, columns or K has nothing for the kernel."""
    return p.m > 0 and p.n > 0 and p.k > 0


class OpChecks:
    """The checks of a call's arguments before a launch, and its outputs' allocation, for ``op.GemmOp`` (a
    subclass sets the attributes below)."""

    config: KernelConfig
    name: str
    dtype: torch.dtype
    dtype_b: torch.dtype
    out_dtype: torch.dtype
    device_type: str

    # -- checks -----------------------------------------------------------------------------------

    def _expected_dtype(self, what: str) -> torch.dtype:
        return self.dtype if what[0] == "A" else self.dtype_b

    def _wrong_dtype(self, t: torch.Tensor, what: str) -> TypeError:
        """``what``: "A" or "B", or a list call's "A[i]" or "B[i]" (the first letter says which operand)."""
        # Planning with the tensor's dtype is a fix only where a plan can take it (fp32 as tf32, fp8, int8).
        name = str(t.dtype).removeprefix("torch.")
        plannable = {TORCH_DTYPES[d] for d in PLANNABLE_INPUT_DTYPES}   # fp32 tensors: tf32 plans
        # (B of the other fp8 format: a mixed plan, dtype_b; any other B: a plan of B's dtype)
        fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
        knob = "dtype_b" if what[0] == "B" and t.dtype in fp8 and self.dtype in fp8 else "dtype"
        replan = f" or plan with {knob}={name!r}" if t.dtype in plannable else ""
        computes = self.config.dtype if what[0] == "A" else self.config.b_dtype
        return TypeError(f"{what} is {t.dtype}; this plan computes {computes.value}: pass "
                         f"{what}.to({self._expected_dtype(what)}){replan}")

    def _check_operand(self, t: object, what: str, order: Order, form: Form = "plain") -> int:
        """Validate A or B (2-D, or 3-D: a batch of matrices, each stored in ``order``, any batch stride; a grouped
        call's A 2-D and B 3-D; a list call's A[i] and B[i] 2-D); returns its leading dimension."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        _check_rank(t, what, form)
        if t.dtype != self._expected_dtype(what):
            raise self._wrong_dtype(t, what)
        if t.device.type != self.device_type:
            raise ValueError(f"{what} is on {t.device}; this op runs on CUDA tensors: pass {what}.cuda()")
        ld = leading_dim(t, order)
        if ld is None:
            letter = "a" if what[0] == "A" else "b"
            other = other_layout(self.config.layout.blas, what[0])
            if order is Order.row:
                copy = f"{what}.contiguous()"
            else:   # (.t() takes 2-D tensors only)
                swap = ".t()" if t.dim() == 2 else ".transpose(-1, -2)"
                copy = f"{what}{swap}.contiguous(){swap} (a column-major copy)"
            raise ValueError(
                f"{what} has strides {tuple(t.stride())} ({order_of(t)}); this plan was made for "
                f"layout_{letter}={order.value!r}: plan with layout={other!r} or pass {copy}")
        return ld

    def _check(self, A: object, B: object) -> Problem:
        """Validate A and B (each 2-D, or 3-D for a batch of problems); returns the problem they describe."""
        lda = self._check_operand(A, "A", self.config.layout.a)
        ldb = self._check_operand(B, "B", self.config.layout.b)
        if A.device != B.device:
            raise ValueError(_devices_message(A, B))
        if A.shape[-1] != B.shape[-2]:
            raise ValueError(f"A is {tuple(A.shape)} and B is {tuple(B.shape)}: K must agree (A's columns "
                             f"= B's rows); for x @ W.t() pass B = W.t()")
        batch = batch_size(A, B)
        m, n, k = A.shape[-2], B.shape[-1], A.shape[-1]
        _check_index(M=m, N=n, K=k, **({"batch": batch} if batch is not None else {}))
        return Problem(m, n, k, lda, ldb, batch, batch_stride(A), batch_stride(B))

    def _refuse_grouped_plan(self) -> None:
        """A plan whose kernel library takes no grouped call is refused before any other check (the fake too)."""
        reason = grouped_refusal(self.config)
        if reason is not None:
            raise ValueError(f"{self.name}: {reason}")

    def _check_offsets_static(self, offsets: object, A: torch.Tensor) -> None:
        """A grouped call's offsets: what holds whatever the sizes (the fake checks it too)."""
        _check_group_vector(offsets, A, "offsets", "group ends", "the groups' ends (cumulative row counts)")

    @staticmethod
    def _offsets_count_message(offsets: torch.Tensor, B: torch.Tensor) -> str:
        return (f"offsets has {offsets.shape[0]} group ends but B has {B.shape[0]} matrices (B.size(0)): pass one "
                "end per group")

    def _check_grouped(self, A: object, B: object, offsets: object) -> Problem:
        """Validate a grouped call's A (2-D), B (3-D) and offsets but for the offsets' values; returns its problem:
        total_M x N x K, the batch the groups (E), B's stride between its matrices (0 for one), A's stride 0."""
        lda, ldb = self._grouped_leading_dims(A, B)
        if A.shape[1] != B.shape[1]:
            raise ValueError(f"A is {tuple(A.shape)} and B is {tuple(B.shape)}: K must agree (A's columns = the rows "
                             "of B's matrices); for experts' weights W (E, N, K) pass B = W.transpose(1, 2)")
        self._check_offsets_static(offsets, A)
        if offsets.shape[0] != B.shape[0]:
            raise ValueError(self._offsets_count_message(offsets, B))
        _check_offsets_contiguous(offsets)
        return self._grouped_problem(A, B, lda, ldb)

    def _grouped_leading_dims(self, A: object, B: object) -> tuple[int, int]:
        """A grouped call's A (2-D, every group's rows) and B (3-D), on one device; their leading dimensions."""
        lda = self._check_operand(A, "A", self.config.layout.a, form="grouped")
        ldb = self._check_operand(B, "B", self.config.layout.b, form="grouped")
        if A.device != B.device:
            raise ValueError(_devices_message(A, B))
        return lda, ldb

    @staticmethod
    def _grouped_problem(A: torch.Tensor, B: torch.Tensor, lda: int, ldb: int) -> Problem:
        m, n, k, groups = A.shape[0], B.shape[2], A.shape[1], B.shape[0]
        if groups == 0 and m > 0:
            raise ValueError(f"B has no matrices (E = 0) but A has {m} rows: with no groups, A must have no rows")
        _check_index(M=m, N=n, K=k)
        return Problem(m, n, k, lda, ldb, groups, 0, batch_stride(B))

    # -- grouped calls along K (B 2-D: gemm_op.h's gemm_grouped_k checks the same, in this order) ---------------------

    def _refuse_grouped_k_plan(self) -> None:
        """A plan whose kernel library takes no grouped call along K (``grouped_k_refusal``) is refused before any
        other check (the fake too)."""
        reason = grouped_k_refusal(self.config)
        if reason is not None:
            raise ValueError(f"{self.name}: {reason}")

    @staticmethod
    def _k_grouped_k_message(A: torch.Tensor, B: torch.Tensor) -> str:
        return (f"A is {_shape_str(A.shape)} and B is {_shape_str(B.shape)}: K must agree (A's columns = B's rows), "
                "the dimension offsets splits")

    def _check_grouped_k(self, A: object, B: object, offsets: object) -> Problem:
        """Validate a grouped call along K: A (M, K), B (K, N) and offsets but for the offsets' values; returns its
        problem: M x N x K, the batch the groups (E), A's and B's strides between matrices 0."""
        lda = self._check_operand(A, "A", self.config.layout.a, form="k_grouped")
        ldb = self._check_operand(B, "B", self.config.layout.b, form="k_grouped")
        if A.device != B.device:
            raise ValueError(_devices_message(A, B))
        if A.shape[1] != B.shape[0]:
            raise ValueError(self._k_grouped_k_message(A, B))
        self._check_offsets_static(offsets, A)
        _check_offsets_contiguous(offsets)
        m, n, k, groups = A.shape[0], B.shape[1], A.shape[1], offsets.shape[0]
        if groups == 0 and k > 0:
            raise ValueError(f"offsets has no group ends (E = 0) but K is {k}: with no groups, K must be 0")
        _check_index(M=m, N=n, K=k)
        return Problem(m, n, k, lda, ldb, groups, 0, 0)

    def _check_grouped_k_meta(self, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor) -> None:
        """The checks of a grouped call along K that a fake implementation can make without guarding on sizes."""
        self._refuse_grouped_k_plan()
        self._check_static_operands(A, B, form="k_grouped")
        torch._check_with(ValueError, A.shape[1] == B.shape[0], lambda: self._k_grouped_k_message(A, B))
        self._check_offsets_static(offsets, A)

    def _empty_grouped_k_out(self, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """D of a grouped call along K: (E, M, N), each matrix in the plan's order of D."""
        like = dict(dtype=self.out_dtype, device=A.device)
        groups, m, n = offsets.shape[0], A.shape[0], B.shape[1]
        if self.config.layout.c is Order.row:
            return torch.empty((groups, m, n), **like)
        return torch.empty((groups, n, m), **like).transpose(1, 2)

    def _check_counts_static(self, counts: object, A: torch.Tensor) -> None:
        """A masked call's counts: what holds whatever the sizes (the fake checks it too)."""
        _check_group_vector(counts, A, "counts", "the groups' row counts", "each group's valid rows")

    def _check_masked_shapes(self, A: torch.Tensor, B: torch.Tensor) -> None:
        """A (E, max_m, K) against B (E, K, N): ranks, the same E and K (``torch._check``s: the fake makes them)."""
        _check_rank(A, "A", "masked")
        _check_rank(B, "B", "masked")
        torch._check_with(ValueError, A.shape[0] == B.shape[0],
                          lambda: f"A has {A.shape[0]} slabs (A.size(0)) but B has {B.shape[0]} matrices: pass one "
                                  "slab of rows per group")
        torch._check_with(ValueError, A.shape[2] == B.shape[1],
                          lambda: f"A is {_shape_str(A.shape)} and B is {_shape_str(B.shape)}: K must agree (A's "
                                  "columns = the rows of B's matrices); for experts' weights W (E, N, K) pass "
                                  "B = W.transpose(1, 2)")

    def _check_masked(self, A: object, B: object, counts: object) -> tuple[Problem, torch.Tensor]:
        """Validate a masked call's A (E, max_m, K), B (E, K, N) and counts but for the counts' values; returns the
        problem of A's slabs as one matrix (E * max_m rows: a grouped call whose groups start at g * max_m) and that
        matrix, a view of A."""
        if not isinstance(A, torch.Tensor):
            raise TypeError(f"A must be a torch.Tensor, got {type(A).__name__}")
        if not isinstance(B, torch.Tensor):
            raise TypeError(f"B must be a torch.Tensor, got {type(B).__name__}")
        self._check_masked_shapes(A, B)
        groups, slab, k = A.shape
        if groups > 1 and slab > 0 and k > 0 and A.stride(0) != slab * A.stride(1):
            raise ValueError(f"A has strides {tuple(A.stride())}: the kernel reads A's slabs as one matrix of "
                             f"{groups} x {slab} rows, so a slab must follow the one before it: pass A.contiguous()")
        rows = A.reshape(groups * slab, k)   # (a view where the check above holds)
        problem = self._grouped_problem(rows, B, *self._grouped_leading_dims(rows, B))
        self._check_counts_static(counts, A)
        if counts.shape[0] != groups:
            raise ValueError(f"counts has {counts.shape[0]} entries but B has {groups} matrices (B.size(0)): pass one "
                             "count per group")
        if counts.shape[0] > 1 and counts.stride(0) != 1:
            raise ValueError(f"counts has stride {counts.stride(0)}; the kernel reads the counts contiguous: pass "
                             "counts.contiguous()")
        return problem, rows

    def _check_masked_meta(self, A: torch.Tensor, B: torch.Tensor, counts: torch.Tensor) -> None:
        """The checks of a masked call that a fake implementation can make without guarding on sizes or strides."""
        self._refuse_grouped_plan()
        self._check_static_operands(A, B, form="masked")
        self._check_masked_shapes(A, B)
        self._check_counts_static(counts, A)
        torch._check_with(ValueError, counts.shape[0] == B.shape[0],
                          lambda: f"counts has {counts.shape[0]} entries but B has {B.shape[0]} matrices")

    def _empty_masked_out(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """D of a masked call: (E, max_m, N), the slabs of one (E * max_m, N) matrix in the plan's order of D."""
        groups, slab = A.shape[0], A.shape[1]
        return self._empty_matrix(groups * slab, B.shape[-1], A.device).view(groups, slab, B.shape[-1])

    def _out_fix(self, batched: bool) -> str:
        """An out in the plan's order of D, for messages."""
        row = self.config.layout.c is Order.row
        if not batched:
            return "torch.empty(M, N)" if row else "torch.empty(N, M).t()"
        return "torch.empty(batch, M, N)" if row else "torch.empty(batch, N, M).transpose(1, 2)"

    def _check_out(self, out: object, A: torch.Tensor, B: torch.Tensor) -> tuple[int, int]:
        """Validate out= for A and B (checked); returns its leading dimension and batch stride (elements, 0 for a
        2-D call)."""
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        batch = batch_size(A, B)
        shape = (A.shape[-2], B.shape[-1]) if batch is None else (batch, A.shape[-2], B.shape[-1])
        if tuple(out.shape) != shape:
            raise ValueError(f"out has shape {tuple(out.shape)}; D = A @ B is {shape}: pass "
                             f"torch.empty({', '.join(map(str, shape))}, dtype={self.out_dtype}, device='{A.device}')")
        if out.dtype != self.out_dtype:
            raise TypeError(f"out is {out.dtype}; this plan writes {self.config.out_dtype.value}: pass an out of "
                            f"dtype {self.out_dtype} or plan with out_dtype={str(out.dtype).removeprefix('torch.')!r}")
        if out.device != A.device:
            raise ValueError(f"out is on {out.device} but A and B on {A.device}: allocate out on {A.device}")
        order = self.config.layout.c
        ld = leading_dim(out, order)
        if ld is None:
            other = "col" if order is Order.row else "row"
            raise ValueError(f"out has strides {tuple(out.stride())} ({order_of(out)}); this plan writes D "
                             f"{order.value}-major: pass out={self._out_fix(batch is not None)} or plan with "
                             f"layout_c={other!r}")
        stride = batch_stride(out)
        # (an expanded tensor) every problem would write one D; an empty out is written by none: any strides
        if batch is not None and batch > 1 and stride == 0 and out.numel() > 0:
            raise ValueError(f"out has strides {tuple(out.stride())}: with a batch stride of 0, all {batch} problems "
                             f"would write the same D; pass out={self._out_fix(True)}")
        return ld, stride

    def _check_static_operand(self, t: torch.Tensor, what: str, form: Form = "plain") -> None:
        """Rank, dtype and device type of A or B: what a fake implementation checks of it (meta tensors pass)."""
        _check_rank(t, what, form)
        if t.dtype != self._expected_dtype(what):
            raise self._wrong_dtype(t, what)
        if t.device.type not in (self.device_type, "meta"):   # meta tensors: shape inference
            raise ValueError(f"{what} is on {t.device}; this op runs on CUDA tensors: pass {what}.cuda()")

    def _check_static_operands(self, A: torch.Tensor, B: torch.Tensor, form: Form = "plain") -> None:
        """Ranks, dtypes and devices of A and B: what a fake implementation checks of them (meta tensors pass)."""
        for t, what in ((A, "A"), (B, "B")):
            self._check_static_operand(t, what, form)
        if A.device != B.device:
            raise ValueError(_devices_message(A, B))

    def _check_meta(self, A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None,
                    operands: Sequence[Any] = ()) -> None:
        """The checks a fake implementation can make without guarding on sizes or strides.

        Types, ranks, dtypes and devices are static under torch.compile; K and the batch sizes must agree
        (``torch._check``s, so a symbolic size adds a run-time assertion rather than failing; see
        ``batch_size``). A batched call's refusal of some epilogues depends on ranks only. Strides and the
        int32 size limit are left to the real call: checking them here would specialize a dynamic M.
        """
        self._check_static_operands(A, B)
        torch._check_with(ValueError, A.shape[-1] == B.shape[-2],
                          lambda: f"A is {tuple(A.shape)} and B is {tuple(B.shape)}: K must agree")
        batch = batch_size(A, B)
        if batch is not None:
            check_batchable(self.config)
        m, n, k = A.shape[-2], B.shape[-1], A.shape[-1]
        for op, value in zip(self.config.epilogue.operands, operands):
            check_static(op, value, A)
            check_sizes_symbolic(op, value, m, n, k)
        if out is not None:
            if out.dtype != self.out_dtype:
                raise TypeError(f"out is {out.dtype}; this plan writes {self.config.out_dtype.value}")
            if out.device != A.device:
                raise ValueError(f"out is on {out.device} but A and B on {A.device}: allocate out on {A.device}")
            shape = (m, n) if batch is None else (batch, m, n)
            if out.dim() != len(shape):
                rank = "2-D (M, N)" if batch is None else "3-D (batch, M, N)"
                raise ValueError(f"out has shape {tuple(out.shape)}; D = A @ B is {rank}")
            for got, want in zip(out.shape, shape):
                torch._check_with(ValueError, got == want,
                                  lambda: f"out has shape {tuple(out.shape)}; D = A @ B is {_shape_str(shape)}")

    def _check_grouped_meta(self, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor) -> None:
        """The checks of a grouped call that a fake implementation can make without guarding on sizes or strides
        (``_check_meta``'s, with K and the number of group ends as ``torch._check``s)."""
        self._refuse_grouped_plan()
        self._check_static_operands(A, B, form="grouped")
        torch._check_with(ValueError, A.shape[1] == B.shape[1],
                          lambda: f"A is {_shape_str(A.shape)} and B is {_shape_str(B.shape)}: K must agree")
        self._check_offsets_static(offsets, A)
        torch._check_with(ValueError, offsets.shape[0] == B.shape[0],
                          lambda: self._offsets_count_message(offsets, B))

    def _empty_matrix(self, m: Any, n: Any, device: torch.device) -> torch.Tensor:
        """An m x n D in the plan's order of D (sizes may be symbolic: the fakes share it)."""
        like = dict(dtype=self.out_dtype, device=device)
        return torch.empty((m, n), **like) if self.config.layout.c is Order.row else torch.empty((n, m), **like).t()

    def _empty_grouped_out(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """D of a grouped call: (total_M, N) in the plan's order of D."""
        return self._empty_matrix(A.shape[0], B.shape[-1], A.device)

    # -- list calls (.grouped_list; templates/torch/gemm_op.h's gemm_grouped_list checks the same, in this order) ----

    @staticmethod
    def _check_list_types(A: object, B: object) -> None:
        """A list call's A and B are lists (or tuples) of tensors: what the dispatcher would refuse in its own words
        (the emitted packages' _check_list_tensors say the same)."""
        for value, what in ((A, "A"), (B, "B")):
            if not isinstance(value, (list, tuple)):
                raise TypeError(f"{what} must be a list (or tuple) of torch.Tensors, one matrix per problem, got "
                                f"{type(value).__name__}")
        for values, what in ((A, "A"), (B, "B")):
            for i, t in enumerate(values):
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"{what}[{i}] must be a torch.Tensor, got {type(t).__name__}")

    def _refuse_grouped_list_plan(self) -> None:
        """A plan whose kernel library takes no list call is refused before any other check (the fakes too; a
        grouped call along K runs the list kernel, so it is refused likewise)."""
        reason = grouped_list_refusal(self.config)
        if reason is not None:
            raise ValueError(f"{self.name}: {reason}")

    @staticmethod
    def _check_list_lengths(A: Sequence[torch.Tensor], B: Sequence[torch.Tensor]) -> None:
        if len(A) != len(B):
            raise ValueError(f"A has {len(A)} matrices but B has {len(B)}: pass one B per A")

    @staticmethod
    def _list_k_message(i: int, a: torch.Tensor, b: torch.Tensor) -> str:
        return (f"A[{i}] is {_shape_str(a.shape)} and B[{i}] is {_shape_str(b.shape)}: K must agree (A[{i}]'s "
                f"columns = B[{i}]'s rows); for x @ W.t() pass B[{i}] = W.t()")

    @staticmethod
    def _check_list_device(t: torch.Tensor, what: str, first: torch.Tensor) -> None:
        if t.device != first.device:
            raise ValueError(f"{what} is on {t.device} but A[0] on {first.device}: put every matrix of A and B on one "
                             f"GPU, e.g. pass {what}.to('{first.device}')")

    def _check_list_pair(self, i: int, a: object, b: object, first: torch.Tensor) -> Problem:
        """Problem i of a list call: A[i], then B[i], their device (A[0]'s), K, the int32 limit."""
        lda = self._check_operand(a, f"A[{i}]", self.config.layout.a, form="list")
        ldb = self._check_operand(b, f"B[{i}]", self.config.layout.b, form="list")
        self._check_list_device(a, f"A[{i}]", first)
        self._check_list_device(b, f"B[{i}]", first)
        if a.shape[1] != b.shape[0]:
            raise ValueError(self._list_k_message(i, a, b))
        m, n, k = a.shape[0], b.shape[1], a.shape[1]
        for size, what in ((m, "M"), (n, "N"), (k, "K")):
            if size > INT32_MAX:
                raise ValueError(f"{what}[{i}]={size} is larger than the kernels index (2**31 - 1): split the problem")
        return Problem(m, n, k, lda, ldb)

    def _check_list(self, A: Sequence[torch.Tensor], B: Sequence[torch.Tensor]) -> list[Problem]:
        """The lists' lengths, then each pair in order; the problems they describe."""
        self._check_list_lengths(A, B)
        return [self._check_list_pair(i, a, b, A[0]) for i, (a, b) in enumerate(zip(A, B))]

    def _check_list_alignment(self, A: Sequence[torch.Tensor], B: Sequence[torch.Tensor],
                              problems: Sequence[Problem]) -> None:
        """The 16-byte rule of the list kernel's TMA loads, for the problems with work (the others are not launched):
        A[0], B[0], A[1], ..."""
        for i, (a, b, p) in enumerate(zip(A, B, problems)):
            if not _has_work(p):
                continue
            for what, t, order, ld in ((f"A[{i}]", a, self.config.layout.a, p.lda),
                                       (f"B[{i}]", b, self.config.layout.b, p.ldb)):
                refusal = grouped_alignment_refusal(what, t, order, ld, 0)
                if refusal is not None:
                    raise ValueError(refusal)

    def _check_list_meta(self, A: Sequence[torch.Tensor], B: Sequence[torch.Tensor]) -> None:
        """The checks of a list call that a fake implementation can make without guarding on sizes or strides (K as a
        ``torch._check``)."""
        self._refuse_grouped_list_plan()
        self._check_list_lengths(A, B)
        for i, (a, b) in enumerate(zip(A, B)):
            self._check_static_operand(a, f"A[{i}]", form="list")
            self._check_static_operand(b, f"B[{i}]", form="list")
            self._check_list_device(a, f"A[{i}]", A[0])
            self._check_list_device(b, f"B[{i}]", A[0])
            torch._check_with(ValueError, a.shape[1] == b.shape[0],
                              lambda i=i, a=a, b=b: self._list_k_message(i, a, b))

    def _empty_list_out(self, A: Sequence[torch.Tensor], B: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """D[i] (M_i, N_i) of a list call, each in the plan's order of D."""
        return [self._empty_matrix(a.shape[0], b.shape[1], a.device) for a, b in zip(A, B)]

    def _second_out(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor | None:
        """The op's second output for A and B (of a 2-D call: a batched one with a second output is refused): a
        quantized D's scales (M, ceil(N / QUANT_BLOCK)) fp32, the epilogue's aux (like D), or None."""
        second = second_output(self.config)
        if second == "scales":
            return torch.empty((A.shape[-2], -(-B.shape[-1] // QUANT_BLOCK)), dtype=torch.float32, device=A.device)
        return self._empty_out(A, B) if second == "aux" else None

    def _zeroed_amax(self, A: torch.Tensor) -> torch.Tensor | None:
        """The op's third output with ``amax=True``: a 0-dim fp32 zero that the kernel raises to the amax of its
        quantized D; None for other plans."""
        return torch.zeros((), dtype=torch.float32, device=A.device) if self.config.amax else None

    def _empty_out(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """D for A and B (of checked ranks), in the plan's order of D: (M, N), or for a batched call
        (batch, M, N) with its matrices one after another (batch stride M * N)."""
        m, n, batch = A.shape[-2], B.shape[-1], batch_size(A, B)
        row = self.config.layout.c is Order.row
        like = dict(dtype=self.out_dtype, device=A.device)
        if batch is None:
            return torch.empty((m, n), **like) if row else torch.empty((n, m), **like).t()
        return torch.empty((batch, m, n), **like) if row else torch.empty((batch, n, m), **like).transpose(1, 2)
