"""GemmOp: a built kernel library behind a torch op, with every argument checked before a launch.

The kernel library is plain CUDA (no torch headers: a new kernel costs one nvcc run); it is loaded
with ctypes and called with raw pointers on the operands' current stream. The op is registered as
``torch.ops.<namespace>.<kernel name>`` (default namespace ``gemmgen``) with two overloads,
``(A, B) -> D`` and ``.out(A, B, *, out) -> out``. A and B are 2-D, or either or both 3-D for a batch of
problems (``Problem``, ``batch_size``): D[b] = epilogue(A[b] @ B[b]), GemmArgs' batch fields. An op without a
fused epilogue has a third, ``.grouped(A, B, offsets) -> D`` (``GemmOp.grouped``): a mixture of experts' rows,
A (total_M, K) sorted by group, B (E, K, N), D[rows of group g] = A[rows of group g] @ B[g], GemmArgs' group_ends;
and a fourth, ``.grouped_list(A[], B[]) -> D[]`` (``GemmOp.grouped_list``, or ``op(As, Bs)`` with lists): problems of
their own sizes (CUTLASS's GroupedGemm), D[i] = A[i] @ B[i] in one launch, GemmArgs' list.

What each overload has, so that it behaves like a native op (see ``_register``):

* default: the kernel under CompositeExplicitAutograd (every backend reaches our checks), a fake
  (meta) implementation for FakeTensor / torch.compile, and an autograd formula whose dA and dB run
  kernels from this generator (``generator.runtime.autograd``).
* ``.out``: the kernel under CompositeExplicitAutograd (eager calls write straight into ``out``), a
  CompositeImplicitAutograd decomposition (checks, the default overload, ``out.copy_``) that FakeTensor
  and functionalization (torch.compile, AOTAutograd) use, since torch functionalizes a custom op whose
  return aliases ``out`` only by decomposing it; and, like aten's out= ops, an Autograd kernel that
  refuses inputs which require grad.
* ``.grouped`` and ``.grouped_list`` (plain ops): the kernel under CompositeExplicitAutograd, a fake, and an
  autograd formula on this generator's kernels (``generator.runtime.grouped_formula``: ``grouped_backward``,
  ``list_backward``; fp8 and int8 ops refuse inputs which require grad).
* all: tagged ``needs_fixed_stride_order`` (Inductor hands the operands over in the stride order they
  had when traced, i.e. the planned layout) and ``pt2_compliant_tag`` (opcheck passes).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Literal, NamedTuple, Sequence

import torch

try:   # torch's broadcasting's test for a size of 1 (older torch: guard_size_oblivious, deprecated since)
    from torch.fx.experimental.symbolic_shapes import guard_or_false
except ImportError:   # pragma: no cover
    from torch.fx.experimental.symbolic_shapes import guard_size_oblivious as guard_or_false

from ..planner.backward import backward_hint, hinted_op_name
from ..planner.common import Problem as PlannedProblem
from ..spec.config import GROUPED_EPILOGUE_REFUSAL, KernelConfig, grouped_list_refusal, grouped_refusal
from ..spec.types import PLANNABLE_INPUT_DTYPES, Order
from . import jit_runtime
from .autograd import register_autograd
from .checks import (INT32_MAX, TORCH_DTYPES, batch_stride, check_group_ends, grouped_alignment_refusal,
                     leading_dim, order_of, other_layout)
from .library import PATHS, GemmArgsStruct, GemmListProblemStruct, KernelLibrary
from .loader import build_libraries, load_library
from .operands import (bind, check_batchable, check_operands, check_out_aliasing, check_sizes_symbolic,
                       check_static, check_type, schema_arguments, schema_returns)

#: A's and B's shapes, as one problem and as a batch of them (for messages).
_SHAPES = {"A": ("(M, K)", "(batch, M, K)"), "B": ("(K, N)", "(batch, K, N)")}
#: A grouped call's A and B: their rank and what it holds (for messages).
_GROUPED_SHAPES = {"A": (2, "2-D (total_M, K) for a grouped call: every group's rows, sorted by group"),
                   "B": (3, "3-D (E, K, N) for a grouped call: one matrix per group (expert)")}
#: A list call's A[i] and B[i] (for messages).
_LIST_SHAPES = {"A": "2-D (M, K) for a list call: one matrix per problem",
                "B": "2-D (K, N) for a list call: one matrix per problem"}
#: What a list call hears while its stream is being captured into a CUDA graph (after "<op name>: "; gemm_op.h's
#: kListCaptureRefusal): the library builds each problem's tensor maps on the host and copies them at each call.
LIST_CAPTURE_REFUSAL = ("a list call builds its problems' tensor maps on the host and copies them to the device at "
                        "each call, which a CUDA graph capture cannot hold: call it outside the capture, or use the "
                        "offsets form op.grouped(A, B, offsets), whose launch is capturable")

#: The form of a call, for the rank its A and B must have (gemm_op.h's CallForm): plain (2-D, or 3-D for a batch),
#: grouped rows (A 2-D, B 3-D), or a list call (each A[i] and B[i] 2-D).
Form = Literal["plain", "grouped", "list"]


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
    if form == "grouped":
        rank, shape = _GROUPED_SHAPES[what]
        if t.dim() != rank:
            raise ValueError(f"{what} must be {shape}; got shape {tuple(t.shape)}")
    elif form == "list":
        if t.dim() != 2:
            raise ValueError(f"{what} must be {_LIST_SHAPES[what[0]]}; got shape {tuple(t.shape)}")
    elif t.dim() not in (2, 3):
        one, batched = _SHAPES[what]
        raise ValueError(f"{what} must be 2-D {one} or 3-D {batched}; got shape {tuple(t.shape)}")


def stream_capturing(device: torch.device) -> bool:
    """Whether ``device``'s current stream is being captured into a CUDA graph: a grouped call then skips the value
    checks of its offsets (a copy to the host, which a capture cannot hold); the kernel clamps ends out of order or
    past A's rows, so its memory accesses stay in bounds."""
    if device.type != "cuda":
        return False
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


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


def _devices_message(A: torch.Tensor, B: torch.Tensor) -> str:
    """A and B on two devices (cuda:0 and cuda:1 are two): the launch runs on A's, where B's memory is not."""
    return f"A is on {A.device} and B on {B.device}: put both on one GPU, e.g. pass B.to('{A.device}')"


def _shape_str(sizes: Sequence[Any]) -> str:
    # (2, 3): as a tuple prints, for sizes that may be symbolic (str(s0), not repr)
    return "(" + ", ".join(str(s) for s in sizes) + ")"


class GemmOp:
    """Callable op: ``op(A, B)`` or ``op(A, B, out=D)``; the same as ``torch.ops.<namespace>.<name>``."""

    #: The device type whose tensors the kernel library takes.
    device_type = "cuda"

    def __init__(self, config: KernelConfig, library: KernelLibrary | None, namespace: str,
                 name: str | None = None, problem: PlannedProblem | None = None) -> None:
        self.config = config
        #: The forward problem its backward kernels are planned for (planner.backward.backward_hint), where that
        #: changes them; such an op is registered under a name of its own (``hinted_op_name``), since one op's
        #: autograd formula holds one pair of backward kernels per order of dD.
        self.problem = backward_hint(config, problem)
        self._library: KernelLibrary | None = None
        self._library_lock = threading.Lock()
        #: Whether CUDA calls reach the C++ kernel of the JIT runtime (else this class's Python path).
        self.cpp_kernel = False
        #: Whether its autograd formula is the JIT runtime's C++ one (else generator.runtime.autograd's Python one).
        self.cpp_autograd = False
        self.namespace = namespace
        self.name = hinted_op_name(config, self.problem) if name is None else name   # (buckets.BucketSetOp's own)
        self.dtype = TORCH_DTYPES[config.dtype]
        self.dtype_b = TORCH_DTYPES[config.b_dtype]   # B's (fp8: e4m3 x e5m2 plans differ)
        self.out_dtype = TORCH_DTYPES[config.out_dtype]
        _register(self, library)
        self.op = getattr(getattr(torch.ops, namespace), self.name)
        self.__doc__ = (f"D = A @ B with {config.dtype.value} inputs and {config.out_dtype.value} output; "
                        f"A (M, K) {config.layout.a.value}-major, B (K, N) {config.layout.b.value}-major, "
                        f"D (M, N) {config.layout.c.value}-major. A batched call takes a 3-D A (batch, M, K) "
                        "or B (batch, K, N), or both, and gives D (batch, M, N): a 2-D operand, or a batch of 1, "
                        f"serves every problem, as in torch.matmul. Kernel {self.name}. Operands whose base "
                        "address or leading dimension is not 16-byte aligned are copied into an aligned workspace "
                        "(large problems) or run on a slower unaligned kernel; op.path(A, B) says which."
                        + (" Grouped calls (a mixture of experts' rows): op.grouped(A, B, offsets); a list of "
                           "problems of their own sizes: op([A0, A1, ...], [B0, B1, ...]) -> [D0, D1, ...]."
                           if has_grouped(config) else ""))

    def __call__(self, A: torch.Tensor | Sequence[torch.Tensor], B: torch.Tensor | Sequence[torch.Tensor],
                 *operands: Any, out: torch.Tensor | None = None,
                 **named: Any) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | list[torch.Tensor]:
        """``op(A, B, *epilogue operands, out=None)``; the operands also by name (``bias=b``). A plan whose
        epilogue has a second output returns ``(D, aux)``. Two lists (or tuples) of matrices, ``op(As, Bs)``, are a
        list call (``grouped_list``)."""
        if isinstance(A, (list, tuple)) and isinstance(B, (list, tuple)):
            return self._call_list(A, B, bool(operands or named) or out is not None)
        # The dispatcher would reject a non-tensor with a RuntimeError about the schema; say it plainly.
        # Trace-safe: under torch.compile these are isinstance checks on FakeTensors, no graph break.
        for value, what in ((A, "A"), (B, "B"), (out, "out")):
            if value is not None and not isinstance(value, torch.Tensor):
                raise TypeError(f"{what} must be a torch.Tensor, got {type(value).__name__}")
        ep = self.config.epilogue
        values = bind(ep, operands, named)
        for op, value in zip(ep.operands, values):
            check_type(op, value)
        if out is None:
            return self.op.default(A, B, *values)
        if ep.aux is not None:
            raise ValueError(f"{self.name} has a second output (aux), which out= cannot receive: call it without "
                             "out= (it returns (D, aux))")
        return self.op.out(A, B, *values, out=out)

    def grouped(self, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Grouped GEMM, the mixture-of-experts form (as ``torch._grouped_mm``): A (total_M, K) holds every group's
        rows, sorted by group; ``offsets`` (E,) int32 on A's device the groups' ends (cumulative row counts: group g
        is rows offsets[g - 1] to offsets[g] of A and D, group 0 from row 0, offsets[-1] = total_M; a group may be
        empty); B (E, K, N) one matrix per group, each stored as the plan's B (for experts' weights W (E, N, K) and
        layout 'tn', B = W.transpose(1, 2)). Returns D (total_M, N) in the plan's order of D, with
        D[rows of group g] = A[rows of group g] @ B[g]. One launch for all groups, on the sm90 family's persistent
        kernels (schedule 'cooperative' or 'pingpong'), with A and B on the 16-byte rule; other plans and operands
        are refused with the fix. The offsets' values are checked with one copy to the host, except while a CUDA
        graph is being captured. Also ``torch.ops.<namespace>.<name>.grouped(A, B, offsets)``. Differentiable in A and
        B (docs/grouped.md, "Backward"; not through a torch.compile'd backward yet)."""
        for value, what in ((A, "A"), (B, "B"), (offsets, "offsets")):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{what} must be a torch.Tensor, got {type(value).__name__}")
        if not self.config.epilogue.is_identity:   # (such an op has no .grouped overload)
            raise ValueError(f"{self.name}: {GROUPED_EPILOGUE_REFUSAL}")
        return self.op.grouped(A, B, offsets)

    def grouped_list(self, A: Sequence[torch.Tensor], B: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Grouped GEMM, the list form (CUTLASS's GroupedGemm): problems of their own sizes, A[i] (M_i, K_i) and B[i]
        (K_i, N_i) each stored as the plan's A and B, all on one CUDA device. Returns [D0, D1, ...], each D[i] =
        A[i] @ B[i] a new (M_i, N_i) tensor in the plan's order of D. One launch for all problems, on the sm90
        family's persistent kernels (schedule 'cooperative' or 'pingpong'; A in either order), with every A[i] and
        B[i] that has work on the 16-byte rule; other plans and operands are refused with the fix. An empty list
        gives []; problems with M_i, N_i or K_i of 0 are not launched (K_i = 0 gives zeros). The library builds each
        problem's tensor maps on the host at each call, so a CUDA graph cannot capture it (refused while capturing:
        op.grouped(A, B, offsets) can be). Also ``op(A, B)`` with lists, and
        ``torch.ops.<namespace>.<name>.grouped_list(A, B)``. Differentiable in every A[i] and B[i] (docs/grouped.md,
        "Backward"; not through a torch.compile'd backward yet)."""
        self._check_list_types(A, B)
        if not self.config.epilogue.is_identity:   # (such an op has no .grouped_list overload)
            raise ValueError(f"{self.name}: {GROUPED_EPILOGUE_REFUSAL}")
        return self.op.grouped_list(list(A), list(B))

    def _call_list(self, A: object, B: object, extra: bool) -> list[torch.Tensor]:
        """``op(As, Bs)``: the list call; ``extra``: operands or out= were given too, which it does not take."""
        if extra and self.config.epilogue.is_identity:
            raise ValueError(f"{self.name}: a list call, op(As, Bs), returns a new D per problem and takes no out= or "
                             "epilogue operands: call it with the two lists alone")
        return self.grouped_list(A, B)

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

    def __repr__(self) -> str:
        return f"GemmOp(torch.ops.{self.namespace}.{self.name})"

    @property
    def library(self) -> KernelLibrary:
        """The loaded kernel library. An op registered without one (the backward pass's ops, see
        ``generator.runtime.autograd``) builds it, or loads it from the build cache, on its first launch."""
        if self._library is None:
            with self._library_lock:
                if self._library is None:
                    self._attach(load_library(self.config))
        return self._library

    def _attach(self, library: KernelLibrary) -> None:
        """Take ``library`` as this op's kernels: the ctypes path, and the C++ CUDA kernel of the JIT
        runtime where there is one (``generator.runtime.jit_runtime``). Once per registered op."""
        self._library = library
        first = _LIBRARIES.get(f"{self.namespace}::{self.name}", (None, None))[1]
        if first is not None and first is not self:
            # A second handle of a registered op (GemmOp built again for the same kernel): the dispatcher
            # has one CUDA kernel per op, registered through the first handle.
            with first._library_lock:
                if first._library is None:
                    first._attach(library)
            self.cpp_kernel = first.cpp_kernel
            return
        # Every op, plain (unboxed kernels) or with a fused epilogue (boxed ones, told its operands); run() is
        # the fallback without the runtime, and the reference of the C++ checks' messages.
        if self.device_type == "cuda":
            self.cpp_kernel = self._register_cpp_kernel(library)

    def _register_cpp_kernel(self, library: KernelLibrary) -> bool:
        """Register the JIT runtime's C++ kernels for this op, launching ``library``; False if there is no runtime."""
        return jit_runtime.RUNTIME.register(self, library)

    @property
    def built(self) -> bool:
        """Whether the kernel library is loaded (False for a registered op not launched yet)."""
        return self._library is not None

    def __deepcopy__(self, memo: dict) -> GemmOp:
        # A handle to a registered op and a loaded library: copies of a model (EMA, checkpoints) share it.
        return self

    def __reduce__(self) -> tuple:
        # Pickled as its config: unpickling builds (or loads from the cache) and registers the same op.
        return (_load_op, (self.config, self.namespace, self.problem))

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
        sizes = [(m, "M"), (n, "N"), (k, "K")] + ([(batch, "batch")] if batch is not None else [])
        for size, what in sizes:
            if size > INT32_MAX:
                raise ValueError(f"{what}={size} is larger than the kernels index (2**31 - 1): split the problem")
        return Problem(m, n, k, lda, ldb, batch, batch_stride(A), batch_stride(B))

    def _refuse_grouped_plan(self) -> None:
        """A plan whose kernel library takes no grouped call is refused before any other check (the fake too)."""
        reason = grouped_refusal(self.config)
        if reason is not None:
            raise ValueError(f"{self.name}: {reason}")

    def _check_offsets_static(self, offsets: object, A: torch.Tensor) -> None:
        """A grouped call's offsets: what holds whatever the sizes (the fake checks it too)."""
        if not isinstance(offsets, torch.Tensor):
            raise TypeError(f"offsets must be a torch.Tensor, got {type(offsets).__name__}")
        if offsets.dtype != torch.int32:
            raise TypeError(f"offsets is {offsets.dtype}; group ends are int32: pass offsets.to(torch.int32)")
        if offsets.dim() != 1:
            raise ValueError(f"offsets must be 1-D (E,), the groups' ends (cumulative row counts); got shape "
                             f"{tuple(offsets.shape)}")
        if offsets.device != A.device:
            raise ValueError(f"offsets is on {offsets.device} but A and B on {A.device}: pass "
                             f"offsets.to('{A.device}')")

    @staticmethod
    def _offsets_count_message(offsets: torch.Tensor, B: torch.Tensor) -> str:
        return (f"offsets has {offsets.shape[0]} group ends but B has {B.shape[0]} matrices (B.size(0)): pass one "
                "end per group")

    def _check_grouped(self, A: object, B: object, offsets: object) -> Problem:
        """Validate a grouped call's A (2-D), B (3-D) and offsets but for the offsets' values; returns its problem:
        total_M x N x K, the batch the groups (E), B's stride between its matrices (0 for one), A's stride 0."""
        lda = self._check_operand(A, "A", self.config.layout.a, form="grouped")
        ldb = self._check_operand(B, "B", self.config.layout.b, form="grouped")
        if A.device != B.device:
            raise ValueError(_devices_message(A, B))
        if A.shape[1] != B.shape[1]:
            raise ValueError(f"A is {tuple(A.shape)} and B is {tuple(B.shape)}: K must agree (A's columns = the rows "
                             "of B's matrices); for experts' weights W (E, N, K) pass B = W.transpose(1, 2)")
        self._check_offsets_static(offsets, A)
        if offsets.shape[0] != B.shape[0]:
            raise ValueError(self._offsets_count_message(offsets, B))
        if offsets.shape[0] > 1 and offsets.stride(0) != 1:
            raise ValueError(f"offsets has stride {offsets.stride(0)}; the kernel reads group ends contiguous: pass "
                             "offsets.contiguous()")
        m, n, k, groups = A.shape[0], B.shape[2], A.shape[1], B.shape[0]
        if groups == 0 and m > 0:
            raise ValueError(f"B has no matrices (E = 0) but A has {m} rows: with no groups, A must have no rows")
        for size, what in ((m, "M"), (n, "N"), (k, "K")):
            if size > INT32_MAX:
                raise ValueError(f"{what}={size} is larger than the kernels index (2**31 - 1): split the problem")
        return Problem(m, n, k, lda, ldb, groups, 0, batch_stride(B))

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
            check_batchable(self.config.epilogue)
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

    def _refuse_grouped_list_plan(self) -> None:
        """A plan whose kernel library takes no list call is refused before any other check (the fake too)."""
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

    def derived(self, configs: list[KernelConfig]) -> list[GemmOp]:
        """Other ops of this generator in this op's namespace, registered now and built on their first
        launch (the backward pass's dA and dB kernels, see ``generator.runtime.autograd``)."""
        return [registered_op(c, self.namespace) for c in configs]

    def _empty_out(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """D for A and B (of checked ranks), in the plan's order of D: (M, N), or for a batched call
        (batch, M, N) with its matrices one after another (batch stride M * N)."""
        m, n, batch = A.shape[-2], B.shape[-1], batch_size(A, B)
        row = self.config.layout.c is Order.row
        like = dict(dtype=self.out_dtype, device=A.device)
        if batch is None:
            return torch.empty((m, n), **like) if row else torch.empty((n, m), **like).t()
        return torch.empty((batch, m, n), **like) if row else torch.empty((batch, n, m), **like).transpose(1, 2)

    # -- launch -----------------------------------------------------------------------------------

    def _args(self, A: torch.Tensor, B: torch.Tensor, D: torch.Tensor, problem: Problem, ldd: int,
              batch_stride_d: int = 0, slots: Sequence[tuple[int, int, float]] = (),
              aux: torch.Tensor | None = None, group_ends: int = 0) -> GemmArgsStruct:
        """The launch's GemmArgs; ``group_ends``: a grouped call's offsets (its address; 0: not grouped)."""
        p = problem
        args = GemmArgsStruct(A.data_ptr(), B.data_ptr(), D.data_ptr(), p.m, p.n, p.k, p.lda, p.ldb, ldd)
        if p.batch is not None:   # a 2-D call leaves them 0: one problem, the launch of before batching
            args.batch, args.batch_stride_a, args.batch_stride_b = p.batch, p.batch_stride_a, p.batch_stride_b
            args.batch_stride_d = batch_stride_d
        args.group_ends = group_ends or None
        for i, (ptr, ld, scalar) in enumerate(slots):
            args.ep_ptr[i], args.ep_ld[i], args.ep_scalar[i] = ptr, ld, scalar
        if aux is not None:
            args.aux, args.ldaux = aux.data_ptr(), ldd
        return args

    def path(self, A: torch.Tensor | Sequence[torch.Tensor], B: torch.Tensor | Sequence[torch.Tensor], *operands: Any,
             offsets: torch.Tensor | None = None, **named: Any) -> str:
        """Which kernel ``op(A, B, ...)`` takes: 'fast'; 'small_m' (at most 16 rows of A, where the plan has that
        kernel); 'repacked' (A or B off the 16-byte rule, copied into an aligned workspace, then the fast or small-M
        kernel) or 'unaligned' (the same operands in a problem too small to repay the copy). ``print(plan)`` lists
        the paths; the epilogue's operands do not decide. With ``offsets``, of ``op.grouped(A, B, offsets)``:
        'grouped' (the plan's kernel walking the groups) or 'none' (no kernel of the plan takes the call: the call
        says why). With two lists (or tuples) of matrices, of ``op.grouped_list(A, B)``: 'grouped' or 'none' likewise
        (a list with no problem to launch: 'grouped' where the plan takes list calls)."""
        if isinstance(A, (list, tuple)) and isinstance(B, (list, tuple)):
            return self._list_path(A, B)
        if offsets is not None:
            if not self.config.epilogue.is_identity:
                raise ValueError(f"{self.name}: {GROUPED_EPILOGUE_REFUSAL}")
            problem = self._check_grouped(A, B, offsets)
            D = self._empty_grouped_out(A, B)
            args = self._args(A, B, D, problem, leading_dim(D, self.config.layout.c), 0,
                              group_ends=offsets.data_ptr())
            return PATHS[self.library.choose_path(ctypes.byref(args))]
        bind(self.config.epilogue, operands, named)
        problem = self._check(A, B)
        D = self._empty_out(A, B)
        args = self._args(A, B, D, problem, leading_dim(D, self.config.layout.c), batch_stride(D))
        return PATHS[self.library.choose_path(ctypes.byref(args))]

    def _list_path(self, A: Sequence[torch.Tensor], B: Sequence[torch.Tensor]) -> str:
        """op.path of a list call: the library's answer to the GemmArgs of its launch."""
        self._check_list_types(A, B)
        if not self.config.epilogue.is_identity:
            raise ValueError(f"{self.name}: {GROUPED_EPILOGUE_REFUSAL}")
        problems = self._check_list(A, B)
        entries = self._list_entries(A, B, self._empty_list_out(A, B), problems)
        if not entries:   # nothing to launch: no arguments to ask with
            return "grouped" if grouped_list_refusal(self.config) is None else "none"
        return PATHS[self.library.choose_path(ctypes.byref(self._list_args(entries)))]

    def _outputs(self, D: torch.Tensor, aux: torch.Tensor | None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return D if aux is None else (D, aux)

    def run(self, A: torch.Tensor, B: torch.Tensor, operands: Sequence[Any], out: torch.Tensor | None
            ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        ep = self.config.epilogue
        if isinstance(A, torch.Tensor) and A.device.type == "meta":
            # Shape inference on meta tensors: .out reaches here (the default overload has its fake as
            # its Meta kernel, but .out's CompositeImplicitAutograd decomposition rules out a Meta kernel).
            self._check_meta(A, B, out, operands)
            D = self._empty_out(A, B) if out is None else out
            return self._outputs(D, self._empty_out(A, B) if ep.aux is not None else None)
        problem = self._check(A, B)
        if problem.batch is not None:
            check_batchable(ep)
        slots = check_operands(ep, operands, A, problem.m, problem.n, problem.k)
        D = self._empty_out(A, B) if out is None else out
        if out is not None:
            ldd, stride_d = self._check_out(D, A, B)
            check_out_aliasing(ep, operands, out, self.config.layout.c, A, B)
        else:
            ldd, stride_d = leading_dim(D, self.config.layout.c), batch_stride(D)
        aux = self._empty_out(A, B) if ep.aux is not None else None   # (a batched call has none: refused)
        if D.numel() == 0:
            return self._outputs(D, aux)
        self._launch(self._args(A, B, D, problem, ldd, stride_d, slots, aux), A.device)
        return self._outputs(D, aux)

    def _launch(self, args: GemmArgsStruct, device: torch.device) -> None:
        """Launch on ``device``'s current stream; a failure's code as the library words it."""
        if torch.cuda.current_device() != device.index:
            with torch.cuda.device(device):
                code = self.library.launch(ctypes.byref(args), torch.cuda.current_stream(device).cuda_stream)
        else:
            code = self.library.launch(ctypes.byref(args), torch.cuda.current_stream(device).cuda_stream)
        if code != 0:
            message = self.library.error_string(code).decode()
            raise RuntimeError(f"{self.name}: launch failed: {message}")

    def run_grouped(self, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """The .grouped overload (``grouped``): the plan, then A, B and offsets, A's and B's 16-byte rule where the
        call launches, the offsets' values (one copy to the host; skipped while a CUDA graph is captured), then
        the launch. templates/torch/gemm_op.h's gemm_grouped checks the same, in this order, with these words."""
        self._refuse_grouped_plan()
        problem = self._check_grouped(A, B, offsets)
        if problem.m > 0 and problem.n > 0 and problem.k > 0:
            for what, t, order, ld, stride in (("A", A, self.config.layout.a, problem.lda, 0),
                                               ("B", B, self.config.layout.b, problem.ldb, problem.batch_stride_b)):
                refusal = grouped_alignment_refusal(what, t, order, ld, stride)
                if refusal is not None:
                    raise ValueError(refusal)
        if not stream_capturing(A.device):
            check_group_ends(offsets.tolist(), problem.m)
        D = self._empty_grouped_out(A, B)
        if D.numel() == 0:
            return D
        if problem.k == 0:   # every row of every group is a sum of nothing (the kernels need a k tile)
            return D.zero_()
        self._launch(self._args(A, B, D, problem, leading_dim(D, self.config.layout.c), 0,
                                group_ends=offsets.data_ptr()), A.device)
        return D

    def run_grouped_list(self, A: list[torch.Tensor], B: list[torch.Tensor]) -> list[torch.Tensor]:
        """The .grouped_list overload (``grouped_list``): the plan, then the lists and each pair, the 16-byte rule of
        the problems with work, a capture of the stream; then D and one launch for the problems with work.
        templates/torch/gemm_op.h's gemm_grouped_list checks the same, in this order, with these words."""
        self._refuse_grouped_list_plan()
        problems = self._check_list(A, B)
        self._check_list_alignment(A, B, problems)
        if not A:
            return []
        if stream_capturing(A[0].device):
            raise ValueError(f"{self.name}: {LIST_CAPTURE_REFUSAL}")
        D = self._empty_list_out(A, B)
        for d, p in zip(D, problems):
            if p.k == 0:   # a sum of nothing; the kernel does not see this problem
                d.zero_()
        entries = self._list_entries(A, B, D, problems)
        if entries:
            self._launch(self._list_args(entries), A[0].device)
        return D

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

    def _list_entries(self, A: Sequence[torch.Tensor], B: Sequence[torch.Tensor], D: Sequence[torch.Tensor],
                      problems: Sequence[Problem]) -> list[GemmListProblemStruct]:
        """The GemmListProblems of the problems with work, in order (M_i, N_i or K_i of 0: nothing to launch)."""
        return [GemmListProblemStruct(a.data_ptr(), b.data_ptr(), d.data_ptr(), p.m, p.n, p.k, p.lda, p.ldb,
                                      leading_dim(d, self.config.layout.c))
                for a, b, d, p in zip(A, B, D, problems) if _has_work(p)]

    @staticmethod
    def _list_args(entries: Sequence[GemmListProblemStruct]) -> GemmArgsStruct:
        """A list call's GemmArgs: zeroed but for the problems' count and the host array (which the struct keeps
        alive: ctypes holds the array it was assigned)."""
        args = GemmArgsStruct()
        args.batch = len(entries)
        args.list = (GemmListProblemStruct * len(entries))(*entries)
        return args


def _has_work(p: Problem) -> bool:
    """Whether a list call launches problem ``p``: one with no rows, columns or K has nothing for the kernel."""
    return p.m > 0 and p.n > 0 and p.k > 0


# The torch.library registrations must outlive the call that made them; keyed by qualified name.
# With the build cache, this is the only process-wide state the package keeps.
_LIBRARIES: dict[str, tuple[torch.library.Library, GemmOp]] = {}


def _define(lib: torch.library.Library, schema: str) -> None:
    # needs_fixed_stride_order: under Inductor the operands keep the stride order they had when traced
    # (a column-major B stays column-major), so the planned layout holds in compiled graphs too.
    lib.define(schema, tags=(torch.Tag.needs_fixed_stride_order, torch.Tag.pt2_compliant_tag))


def has_grouped(config: KernelConfig) -> bool:
    """Whether the op of ``config`` has the .grouped and .grouped_list overloads: every op without a fused epilogue
    (whether its kernel takes such calls or not: a plan that does not is refused with the fix, by the overload)."""
    return config.epilogue.is_identity


def registered_op(config: KernelConfig, namespace: str) -> GemmOp:
    """The op registered for ``config`` (its backward unhinted) in ``namespace``; registered now, unbuilt, if there
    is none."""
    entry = _LIBRARIES.get(f"{namespace}::{config.name}")
    return entry[1] if entry is not None else GemmOp(config, None, namespace)


def _register(op: GemmOp, library: KernelLibrary | None) -> None:
    qualname = f"{op.namespace}::{op.name}"
    if qualname in _LIBRARIES:  # the same kernel compiled again: the first registration serves it
        op.cpp_autograd = _LIBRARIES[qualname][1].cpp_autograd
        if library is not None:
            op._attach(library)   # and the first handle, if it was registered unbuilt (a backward op)
        return
    lib = torch.library.Library(op.namespace, "FRAGMENT")
    # Recorded first: registering the autograd formula registers the backward ops, whose own formulas
    # may come back to this op (the layouts of dA and dB of dA ... form a small closed set).
    _LIBRARIES[qualname] = (lib, op)
    try:
        ep = op.config.epilogue
        operands = schema_arguments(ep)
        _define(lib, f"{op.name}(Tensor A, Tensor B{operands}) -> {schema_returns(ep)}")
        _define(lib, f"{op.name}.out(Tensor A, Tensor B{operands}, *, Tensor(a!) out) -> Tensor(a!)")
        # CompositeExplicitAutograd: one implementation for every backend, so that CPU tensors reach our
        # checks (and a clear message) instead of the dispatcher's "no kernel for CPU".
        lib.impl(op.name, lambda A, B, *values: op.run(A, B, values, None), "CompositeExplicitAutograd")

        def refuse_aux() -> None:
            if ep.aux is not None:
                raise ValueError(f"{op.name}.out: the plan has a second output (aux), which out= cannot receive: "
                                 "call the op without out=")

        def run_out(A: torch.Tensor, B: torch.Tensor, *values: Any, out: torch.Tensor) -> torch.Tensor:
            refuse_aux()
            if not isinstance(out, torch.Tensor):  # None would make run() allocate: not what .out promises
                raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
            return op.run(A, B, values, out)

        lib.impl(f"{op.name}.out", run_out, "CompositeExplicitAutograd")

        def fake(A: torch.Tensor, B: torch.Tensor, *values: Any) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
            op._check_meta(A, B, None, values)
            # the real output's strides: row-major D, or (1, M) for layout_c='col'
            return op._outputs(op._empty_out(A, B), op._empty_out(A, B) if ep.aux is not None else None)

        torch.library.register_fake(qualname, fake, lib=lib)

        # .out: eager calls take the CompositeExplicitAutograd kernel above (the dispatcher prefers it for
        # the CPU/CUDA keys). FakeTensor and functionalization decompose through this kernel instead: torch
        # cannot functionalize a custom op whose return aliases a mutated argument, and refuses a separate
        # fake for an op that has a CompositeImplicitAutograd kernel (the decomposition is its fake).
        default = getattr(getattr(torch.ops, op.namespace), op.name).default

        def out_decomposition(A: torch.Tensor, B: torch.Tensor, *values: Any, out: torch.Tensor) -> torch.Tensor:
            # The same refusal as the eager kernel's: without it, fake tensors (torch.compile) got to
            # out.copy_((D, aux)) and a TypeError about copy_'s argument.
            refuse_aux()
            op._check_meta(A, B, out, values)
            return out.copy_(default(A, B, *values))

        lib.impl(f"{op.name}.out", out_decomposition, "CompositeImplicitAutograd")

        if has_grouped(op.config):
            _define(lib, f"{op.name}.grouped(Tensor A, Tensor B, Tensor offsets) -> Tensor")
            lib.impl(f"{op.name}.grouped", op.run_grouped, "CompositeExplicitAutograd")

            def fake_grouped(A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
                op._check_grouped_meta(A, B, offsets)
                return op._empty_grouped_out(A, B)   # (total_M, N): no size depends on the offsets' values

            torch.library.register_fake(f"{qualname}.grouped", fake_grouped, lib=lib)
            _define(lib, f"{op.name}.grouped_list(Tensor[] A, Tensor[] B) -> Tensor[]")
            lib.impl(f"{op.name}.grouped_list", op.run_grouped_list, "CompositeExplicitAutograd")

            def fake_grouped_list(A: list[torch.Tensor], B: list[torch.Tensor]) -> list[torch.Tensor]:
                op._check_list_meta(A, B)
                return op._empty_list_out(A, B)

            torch.library.register_fake(f"{qualname}.grouped_list", fake_grouped_list, lib=lib)

        register_autograd(op, lib)
        if library is not None:
            op._attach(library)
    except BaseException:
        del _LIBRARIES[qualname]
        raise


def compile_op(config: KernelConfig, *, namespace: str, verbose: bool = False,
               problem: PlannedProblem | None = None) -> GemmOp:
    """The built op of ``config``; ``problem``: the forward problem its backward kernels are planned for (the
    plan's size hints; None: unhinted)."""
    return GemmOp(config, load_library(config, verbose=verbose), namespace, problem=problem)


def _load_op(config: KernelConfig, namespace: str, problem: PlannedProblem | None = None) -> GemmOp:
    return compile_op(config, namespace=namespace, problem=problem)


def compile_many(configs: list[KernelConfig], *, namespace: str, verbose: bool = False,
                 problems: Sequence[PlannedProblem | None] | None = None) -> list[GemmOp]:
    """Build several kernels in one parallel ninja run; ops in the order of ``configs``, each with its backward
    planned for the matching entry of ``problems`` (as ``compile_op``'s ``problem``)."""
    hints = list(problems) if problems is not None else [None] * len(configs)
    if len(hints) != len(configs):   # (before the build, which takes minutes)
        raise ValueError(f"compile_many: {len(configs)} configs but {len(hints)} problems: give one problem (or None) "
                         "per config")
    libraries = build_libraries(list(dict.fromkeys(configs)), verbose=verbose)
    by_config = dict(zip(dict.fromkeys(configs), libraries))
    return [GemmOp(c, by_config[c], namespace, problem=p) for c, p in zip(configs, hints)]
