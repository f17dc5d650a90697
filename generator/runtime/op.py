"""GemmOp: a built kernel library behind a torch op, with every argument checked before a launch.

The kernel library is plain CUDA (no torch headers: a new kernel costs one nvcc run); it is loaded
with ctypes and called with raw pointers on the operands' current stream. The op is registered as
``torch.ops.<namespace>.<kernel name>`` (default namespace ``gemmgen``) with two overloads,
``(A, B) -> D`` and ``.out(A, B, *, out) -> out``. A and B are 2-D, or either or both 3-D for a batch of
problems (``Problem``, ``batch_size``): D[b] = epilogue(A[b] @ B[b]), GemmArgs' batch fields. An op without a
fused epilogue has a third, ``.grouped(A, B, offsets) -> D`` (``GemmOp.grouped``): a mixture of experts' rows,
A (total_M, K) sorted by group, B (E, K, N), D[rows of group g] = A[rows of group g] @ B[g], GemmArgs' group_ends;
and a fourth, ``.grouped_list(A[], B[]) -> D[]`` (``GemmOp.grouped_list``, or ``op(As, Bs)`` with lists): problems of
their own sizes (CUTLASS's GroupedGemm), D[i] = A[i] @ B[i] in one launch, GemmArgs' list; and a fifth,
``.masked(A, B, counts) -> D`` (``GemmOp.masked``): DeepGEMM's masked layout, each group's rows in a slab of A
(E, max_m, K), the grouped kernel over the slabs (GemmArgs' group_rows).

Its argument checks are ``op_checks``' (``OpChecks``, its base class); its registration as a torch op, and what
each overload has so that it behaves like a native op, ``registration``'s.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Sequence

import torch

from ..planner import plan
from ..planner.backward import PlanGradient, backward_hint, hinted_op_name
from ..planner.common import Problem as PlannedProblem
from ..spec.config import KernelConfig, second_output
from ..spec.grouped import (GROUPED_EPILOGUE_REFUSAL, grouped_epilogue_refusal, grouped_list_refusal,
                             takes_scaled_groups)
from . import jit_runtime
from .checks import (TORCH_DTYPES, batch_stride, check_group_counts, check_group_ends, grouped_alignment_refusal,
                     leading_dim)
from .library import PATHS, GemmArgsStruct, GemmListProblemStruct, KernelLibrary
from .loader import build_libraries, load_library
from .op_checks import OpChecks, Problem, _has_work
from .operands import (bind, check_batchable, check_grouped_scale_b, check_operand, check_operands, check_out_aliasing,
                       check_type)
from .registration import _LIBRARIES, _register, has_grouped

#: What a list call hears while its stream is being captured into a CUDA graph (after "<op name>: "; gemm_op.h's
#: kListCaptureRefusal): the library copies the problems' addresses and sizes from the host at each call.
LIST_CAPTURE_REFUSAL = ("a list call copies its problems' addresses and sizes from the host to the device at each "
                        "call, which a CUDA graph capture cannot hold: call it outside the capture, or use the offsets "
                        "form op.grouped(A, B, offsets), whose launch is capturable")


def stream_capturing(device: torch.device) -> bool:
    """Whether ``device``'s current stream is being captured into a CUDA graph: a grouped call then skips the value
    checks of its offsets (a copy to the host, which a capture cannot hold); the kernel clamps ends out of order or
    past A's rows, so its memory accesses stay in bounds."""
    if device.type != "cuda":
        return False
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def _needs_autograd(*tensors: torch.Tensor | list[torch.Tensor]) -> bool:
    """Whether a grouped call must go through its overload's Autograd kernel: grad mode on and some input requiring
    grad, a trace (torch.compile records the overload as the user called it), or forward-mode AD under way (a dual
    tensor does not require grad, and below autograd its tangent would be dropped without a word; the kernel refuses
    it)."""
    if torch.compiler.is_compiling() or torch.autograd.forward_ad._current_level >= 0:
        return True
    return torch.is_grad_enabled() and torch._C._any_requires_grad(*tensors)


def _call_grouped(overload: Any, *args: torch.Tensor | list[torch.Tensor]) -> Any:
    """``overload(*args)``, below autograd where no gradient is wanted (``_needs_autograd``). The grouped overloads'
    Autograd kernels are Python functions (their formulas, or refusals of inputs that require grad): without a
    gradient to take they only redispatch below autograd, after the dispatcher has handed every tensor to Python and
    back, which costs host time that a decode step or a call of many small problems notices (docs/grouped.md, "The
    list form's kernel")."""
    if _needs_autograd(*args):
        return overload(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return overload(*args)


class GemmOp(OpChecks):
    """Callable op: ``op(A, B)`` or ``op(A, B, out=D)``; the same as ``torch.ops.<namespace>.<name>``."""

    #: The device type whose tensors the kernel library takes.
    device_type = "cuda"

    def __init__(self, config: KernelConfig, library: KernelLibrary | None, namespace: str,
                 name: str | None = None, problem: PlannedProblem | None = None,
                 plan_gradient: PlanGradient = plan) -> None:
        self.config = config
        #: How its backward kernels are chosen (planner.backward.PlanGradient: the estimate, or measured winners).
        self.plan_gradient = plan_gradient
        #: The forward problem its backward kernels are planned for (planner.backward.backward_hint), where that
        #: changes them; such an op is registered under a name of its own (``hinted_op_name``), since one op's
        #: autograd formula holds one pair of backward kernels per order of dD.
        self.problem = backward_hint(config, problem, plan_gradient)
        self._library: KernelLibrary | None = None
        self._library_lock = threading.Lock()
        #: Whether CUDA calls reach the C++ kernel of the JIT runtime (else this class's Python path).
        self.cpp_kernel = False
        #: Whether its autograd formula is the JIT runtime's C++ one (else generator.runtime.autograd's Python one).
        self.cpp_autograd = False
        self.namespace = namespace
        self.name = hinted_op_name(config, self.problem, plan_gradient) if name is None else name   # (buckets.BucketSetOp's own)
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
        epilogue has a second output returns ``(D, aux)``; one whose D is quantized (out_dtype 'e4m3' or 'e5m2')
        returns ``(D, scales)``, scales (M, ceil(N/128)) fp32 as ``generator.quantize(x, scale='block')`` gives them,
        and with ``amax=True`` ``(D, scales, amax)``, amax the 0-dim fp32 largest |value| of D before quantization.
        Two lists (or tuples) of matrices, ``op(As, Bs)``, are a list call (``grouped_list``)."""
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
        second = second_output(self.config)
        if second is not None:
            raise ValueError(f"{self.name} has a second output ({second}), which out= cannot receive: call it "
                             f"without out= (it returns (D, {second}))")
        return self.op.out(A, B, *values, out=out)

    def grouped(self, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor, scale_a: torch.Tensor | None = None,
                scale_b: torch.Tensor | None = None) -> torch.Tensor:
        """Grouped GEMM, the mixture-of-experts form (as ``torch._grouped_mm``): A (total_M, K) holds every group's
        rows, sorted by group; ``offsets`` (E,) int32 on A's device the groups' ends (cumulative row counts: group g
        is rows offsets[g - 1] to offsets[g] of A and D, group 0 from row 0, offsets[-1] = total_M; a group may be
        empty); B (E, K, N) one matrix per group, each stored as the plan's B (for experts' weights W (E, N, K) and
        layout 'tn', B = W.transpose(1, 2)). Returns D (total_M, N) in the plan's order of D, with
        D[rows of group g] = A[rows of group g] @ B[g]. One launch for all groups, on the sm90 family's persistent
        kernels (schedule 'cooperative' or 'pingpong'), with A and B on the 16-byte rule; other plans and operands
        are refused with the fix. The offsets' values are checked with one copy to the host (by the C++ kernel once
        while the tensor stays unchanged), except while a CUDA graph is being captured. Also ``torch.ops.<namespace>.<name>.grouped(A, B, offsets)``. Differentiable in A and
        B (docs/grouped.md, "Backward"; not through a torch.compile'd backward yet).

        With B 2-D, groups along K (``torch._grouped_mm``'s 2-D x 2-D form, the weight gradient of grouped rows):
        A (M, K) and B (K, N), offsets the groups' ends along K; returns D (E, M, N), D[g] = A[:, group g] @
        B[group g, :] (zeros for an empty group), on the plans that take list calls with A column-major and B
        row-major (layout 'nt': a group starts at any k, which TMA cannot start a load at along an operand's
        contiguous dimension; others are refused with the fix). The library builds each group's
        tensor maps on the device: one launch more, no value read on the host but the checks (skipped while a CUDA
        graph is captured). Differentiable in A and B: two grouped calls of rows (docs/grouped.md, "Backward").

        An fp8 plan with scale='block' (and no other epilogue) takes grouped calls of rows with its scales:
        ``op.grouped(A, B, offsets, scale_a, scale_b)``, scale_a (total_M, ceil(K/128)) the 1x128 block scales of A's
        rows (``quantize(x, "e4m3", scale="block")`` of the sorted rows), scale_b (E, ceil(N/128), ceil(K/128)) each
        expert's 128x128 block scales of its weight; D = (A @ B[g]) scaled per block, bf16 by default. An fp8 plan
        with scale='row' likewise (``torch._scaled_grouped_mm``'s rowwise form): scale_a (total_M,) one per row,
        scale_b (E, N) one per column of each expert's weight, D = (A @ B[g]) * scale_a[row] * scale_b[g, col]. Also
        ``torch.ops.<namespace>.<name>.grouped_scaled(A, B, offsets, scale_a, scale_b)``; forward only."""
        if takes_scaled_groups(self.config):
            self._refuse_grouped_arguments(A=A, B=B, offsets=offsets, scale_a=scale_a, scale_b=scale_b)
            return _call_grouped(self.op.grouped_scaled, A, B, offsets, scale_a, scale_b)
        self._refuse_grouped_arguments(A=A, B=B, offsets=offsets)
        self._refuse_scales(scale_a, scale_b)
        return _call_grouped(self.op.grouped, A, B, offsets)

    def _refuse_grouped_arguments(self, **tensors: Any) -> None:
        """Before the dispatcher's own words: an op with a fused epilogue (_refuse_grouped_epilogue), and arguments
        that are not tensors."""
        self._refuse_grouped_epilogue()
        for what, value in tensors.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{what} must be a torch.Tensor, got {type(value).__name__}")

    def _refuse_grouped_epilogue(self) -> None:
        """An op with a fused epilogue has no grouped overloads, but for fp8's scaled groups (the refusal names the fix
        where there is one: grouped_epilogue_refusal)."""
        if not self.config.epilogue.is_identity and not takes_scaled_groups(self.config):
            raise ValueError(f"{self.name}: {grouped_epilogue_refusal(self.config)}")

    def _refuse_scales(self, scale_a: object, scale_b: object) -> None:
        """Scales given to a grouped call of a plan without per-block scales."""
        if scale_a is not None or scale_b is not None:
            raise ValueError(f"{self.name}: this plan has no per-block scales; grouped calls take scale_a and "
                             "scale_b on fp8 plans with scale='block': call it with A, B and the offsets (counts) "
                             "alone, or plan Gemm('e4m3', 'tn', scale='block')")

    def masked(self, A: torch.Tensor, B: torch.Tensor, counts: torch.Tensor, scale_a: torch.Tensor | None = None,
               scale_b: torch.Tensor | None = None) -> torch.Tensor:
        """Grouped GEMM, the masked form (DeepGEMM's, for decode steps and CUDA graphs): A (E, max_m, K) holds each
        group's rows in a slab of its own, the first ``counts[g]`` of slab g valid; B (E, K, N) as for ``grouped``;
        counts int32 (E,) on the GPU. Returns D (E, max_m, N) with D[g, :counts[g]] = A[g, :counts[g]] @ B[g]; the
        rows of a slab past its count are not written (D is allocated, not zeroed). No value is read on the host while
        a CUDA graph is being captured (else the counts are checked to lie in [0, max_m]), so a captured call replays
        with new counts written in place. Also ``torch.ops.<namespace>.<name>.masked(A, B, counts)``. Not
        differentiable yet: inputs that require grad are refused (use ``grouped`` for training). An fp8 plan with
        scale='block' takes the scales after the counts, scale_a (E, max_m, ceil(K/128)) in A's slabs and scale_b as
        for ``grouped`` (``.masked_scaled``); with scale='row', scale_a (E, max_m) and scale_b (E, N)."""
        if takes_scaled_groups(self.config):
            self._refuse_grouped_arguments(A=A, B=B, counts=counts, scale_a=scale_a, scale_b=scale_b)
            return _call_grouped(self.op.masked_scaled, A, B, counts, scale_a, scale_b)
        self._refuse_grouped_arguments(A=A, B=B, counts=counts)
        self._refuse_scales(scale_a, scale_b)
        return _call_grouped(self.op.masked, A, B, counts)

    def grouped_list(self, A: Sequence[torch.Tensor], B: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Grouped GEMM, the list form (CUTLASS's GroupedGemm): problems of their own sizes, A[i] (M_i, K_i) and B[i]
        (K_i, N_i) each stored as the plan's A and B, all on one CUDA device. Returns [D0, D1, ...], each D[i] =
        A[i] @ B[i] a new (M_i, N_i) tensor in the plan's order of D. One launch for all problems, on the sm90
        family's persistent kernels (schedule 'cooperative' or 'pingpong'; A in either order), with every A[i] and
        B[i] that has work on the 16-byte rule; other plans and operands are refused with the fix. An empty list
        gives []; problems with M_i, N_i or K_i of 0 are not launched (K_i = 0 gives zeros). The library copies each
        problem's addresses and sizes to the device at each call (its tensor maps are built there), so a CUDA graph
        cannot capture it (refused while capturing: op.grouped(A, B, offsets) can be). Also ``op(A, B)`` with lists, and
        ``torch.ops.<namespace>.<name>.grouped_list(A, B)``. Differentiable in every A[i] and B[i] (docs/grouped.md,
        "Backward"; not through a torch.compile'd backward yet). On the GPU the D[i] share one allocation, each over
        its own bytes: it is freed with the last of them, and ``D[i].record_stream(s)`` has no effect on them (torch
        skips memory its allocator did not hand out): keep them alive until another stream is done with them."""
        self._check_list_types(A, B)
        if not self.config.epilogue.is_identity:   # (such an op has no .grouped_list overload)
            raise ValueError(f"{self.name}: {GROUPED_EPILOGUE_REFUSAL}")
        return _call_grouped(self.op.grouped_list, list(A), list(B))

    def _call_list(self, A: object, B: object, extra: bool) -> list[torch.Tensor]:
        """``op(As, Bs)``: the list call; ``extra``: operands or out= were given too, which it does not take."""
        if extra and self.config.epilogue.is_identity:
            raise ValueError(f"{self.name}: a list call, op(As, Bs), returns a new D per problem and takes no out= or "
                             "epilogue operands: call it with the two lists alone")
        return self.grouped_list(A, B)

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
        return (_load_op, (self.config, self.namespace, self.problem, self.plan_gradient))

    def derived(self, configs: list[KernelConfig]) -> list[GemmOp]:
        """Other ops of this generator in this op's namespace, registered now and built on their first
        launch (the backward pass's dA and dB kernels, see ``generator.runtime.autograd``)."""
        return [registered_op(c, self.namespace) for c in configs]

    # -- launch -----------------------------------------------------------------------------------

    def _args(self, A: torch.Tensor, B: torch.Tensor, D: torch.Tensor, problem: Problem, ldd: int,
              batch_stride_d: int = 0, slots: Sequence[tuple[int, int, float]] = (),
              aux: torch.Tensor | None = None, group_ends: int = 0, group_rows: int = 0) -> GemmArgsStruct:
        """The launch's GemmArgs; ``group_ends``: a grouped call's offsets (its address; 0: not grouped), or a masked
        call's counts with ``group_rows`` its slab of rows."""
        p = problem
        args = GemmArgsStruct(A.data_ptr(), B.data_ptr(), D.data_ptr(), p.m, p.n, p.k, p.lda, p.ldb, ldd)
        if p.batch is not None:   # a 2-D call leaves them 0: one problem, the launch of before batching
            args.batch, args.batch_stride_a, args.batch_stride_b = p.batch, p.batch_stride_a, p.batch_stride_b
            args.batch_stride_d = batch_stride_d
        args.group_ends, args.group_rows = group_ends or None, group_rows
        for i, (ptr, ld, scalar) in enumerate(slots):
            args.ep_ptr[i], args.ep_ld[i], args.ep_scalar[i] = ptr, ld, scalar
        if aux is not None:   # the second output: the epilogue's aux (like D) or a quantized D's scales
            args.aux, args.ldaux = aux.data_ptr(), leading_dim(aux, self.config.layout.c)
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
            self._refuse_grouped_epilogue()
            if isinstance(B, torch.Tensor) and B.dim() == 2:
                problem = self._check_grouped_k(A, B, offsets)
                D = self._empty_grouped_k_out(A, B, offsets)
                args = self._grouped_k_args(A, B, D, problem, offsets)
            else:
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

    def _outputs(self, D: torch.Tensor, aux: torch.Tensor | None, amax: torch.Tensor | None = None
                 ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """What the op returns: D, or (D, second output), or with the amax of a quantized D (D, scales, amax)."""
        return D if aux is None else (D, aux) if amax is None else (D, aux, amax)

    def run(self, A: torch.Tensor, B: torch.Tensor, operands: Sequence[Any], out: torch.Tensor | None
            ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        ep = self.config.epilogue
        if isinstance(A, torch.Tensor) and A.device.type == "meta":
            # Shape inference on meta tensors: .out reaches here (the default overload has its fake as
            # its Meta kernel, but .out's CompositeImplicitAutograd decomposition rules out a Meta kernel).
            self._check_meta(A, B, out, operands)
            D = self._empty_out(A, B) if out is None else out
            return self._outputs(D, self._second_out(A, B), self._zeroed_amax(A))
        problem = self._check(A, B)
        if problem.batch is not None:
            check_batchable(self.config)
        slots = check_operands(ep, operands, A, problem.m, problem.n, problem.k)
        D = self._empty_out(A, B) if out is None else out
        if out is not None:
            ldd, stride_d = self._check_out(D, A, B)
            check_out_aliasing(ep, operands, out, self.config.layout.c, A, B)
        else:
            ldd, stride_d = leading_dim(D, self.config.layout.c), batch_stride(D)
        aux = self._second_out(A, B)   # (a batched call has none: refused)
        amax = self._zeroed_amax(A)
        if D.numel() == 0:
            return self._outputs(D, aux, amax)
        args = self._args(A, B, D, problem, ldd, stride_d, slots, aux)
        if amax is not None:
            args.amax = amax.data_ptr()
        self._launch(args, A.device)
        return self._outputs(D, aux, amax)

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

    def run_grouped_k(self, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """The .grouped overload with B 2-D (groups along K): the plan (grouped_k_refusal), then A, B and offsets, the
        16-byte rule where the call launches, the offsets' values (not while a CUDA graph is captured), then the
        launch. templates/torch/gemm_op.h's gemm_grouped_k checks the same, in this order, with these words."""
        self._refuse_grouped_k_plan()
        problem = self._check_grouped_k(A, B, offsets)
        if problem.m > 0 and problem.n > 0 and problem.k > 0:
            self._check_grouped_alignment(A, B, problem)
        if not stream_capturing(A.device):
            check_group_ends(offsets.tolist(), problem.k, along_k=True)
        D = self._empty_grouped_k_out(A, B, offsets)
        if D.numel() == 0:
            return D
        if problem.k == 0:   # every group is a sum of nothing
            return D.zero_()
        self._launch(self._grouped_k_args(A, B, D, problem, offsets), A.device)
        return D

    def _grouped_k_args(self, A: torch.Tensor, B: torch.Tensor, D: torch.Tensor, problem: Problem,
                        offsets: torch.Tensor) -> GemmArgsStruct:
        """The GemmArgs of a grouped call along K: D's matrices one per group (batch stride D.stride(0))."""
        args = self._args(A, B, D, problem, leading_dim(D, self.config.layout.c), D.stride(0),
                          group_ends=offsets.data_ptr())
        args.groups_along_k = 1
        return args

    def run_grouped(self, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor,
                    scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The .grouped overload (``grouped``): the plan, then A, B and offsets (and ``scales``, .grouped_scaled's),
        A's and B's 16-byte rule where the call launches, the offsets' values (one copy to the host; skipped while a
        CUDA graph is captured), then the launch. templates/torch/gemm_op.h's gemm_grouped checks the same, in this
        order, with these words. B 2-D: groups along K (``run_grouped_k``)."""
        if isinstance(B, torch.Tensor) and B.dim() == 2 and scales is None:
            return self.run_grouped_k(A, B, offsets)
        self._refuse_grouped_plan()
        problem = self._check_grouped(A, B, offsets)
        slots = self._check_grouped_scales(scales, A, problem.m, B.shape[0], problem) if scales is not None else ()
        if problem.m > 0 and problem.n > 0 and problem.k > 0:
            self._check_grouped_alignment(A, B, problem)
        if not stream_capturing(A.device):
            check_group_ends(offsets.tolist(), problem.m)
        D = self._empty_grouped_out(A, B)
        if D.numel() == 0:
            return D
        if problem.k == 0:   # every row of every group is a sum of nothing (the kernels need a k tile)
            return D.zero_()
        self._launch(self._args(A, B, D, problem, leading_dim(D, self.config.layout.c), 0, slots,
                                group_ends=offsets.data_ptr()), A.device)
        return D

    def run_grouped_scaled(self, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor, scale_a: torch.Tensor,
                           scale_b: torch.Tensor) -> torch.Tensor:
        """The .grouped_scaled overload (fp8 with per-block scales): ``run_grouped`` with the scales."""
        return self.run_grouped(A, B, offsets, (scale_a, scale_b))

    def run_masked_scaled(self, A: torch.Tensor, B: torch.Tensor, counts: torch.Tensor, scale_a: torch.Tensor,
                          scale_b: torch.Tensor) -> torch.Tensor:
        """The .masked_scaled overload (fp8 with per-block scales): ``run_masked`` with the scales."""
        return self.run_masked(A, B, counts, (scale_a, scale_b))

    def _check_grouped_scales(self, scales: tuple[object, object], A: torch.Tensor, rows: int, groups: int,
                              problem: Problem) -> list[tuple[int, int, float]]:
        """A scaled grouped call's slots: scale_a as an operand of A's rows ((rows, ceil(K/128)) per block, (rows,)
        per row), scale_b (E, ceil(N/128), ceil(K/128)) or (E, N) (gemm_op.h's check_grouped_scales)."""
        op_a, op_b = self.config.epilogue.operands[:2]
        return [check_operand(op_a, scales[0], A, rows, problem.n, problem.k),
                check_grouped_scale_b(op_b, scales[1], A, groups, problem.n, problem.k)]

    def _check_grouped_scales_meta(self, scale_a: object, scale_b: object, A: torch.Tensor) -> None:
        """The fakes' checks of the scales: types, dtypes and devices (no size is read)."""
        op_a, op_b = self.config.epilogue.operands[:2]
        for op, value in ((op_a, scale_a), (op_b, scale_b)):
            check_type(op, value)
            if value.dtype != torch.float32 or value.device != A.device:
                raise TypeError(f"{op.name} is {value.dtype} on {value.device}; the scales are torch.float32 on "
                                f"A's device ({A.device})")

    def run_masked(self, A: torch.Tensor, B: torch.Tensor, counts: torch.Tensor,
                   scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The .masked overload (``masked``): the plan, then A, B and counts (and ``scales``, .masked_scaled's, scale_a
        in A's slabs), the 16-byte rule, the counts' values (one copy to the host; skipped while a CUDA graph is
        captured), then one launch of the grouped kernel over A's slabs as one matrix, group g starting at row
        g * max_m."""
        self._refuse_grouped_plan()
        problem, rows = self._check_masked(A, B, counts)
        slots: Sequence[tuple[int, int, float]] = ()
        if scales is not None:
            per_row = self.config.epilogue.operands[0].kind == "row"
            slots = self._check_grouped_scales((self._masked_scale_rows(scales[0], A, problem.m, per_row), scales[1]),
                                               rows, problem.m, A.shape[0], problem)
        if problem.m > 0 and problem.n > 0 and problem.k > 0:
            self._check_grouped_alignment(rows, B, problem)
        slab = A.shape[1]
        if not stream_capturing(A.device):
            check_group_counts(counts.tolist(), slab)
        D = self._empty_masked_out(A, B)
        if D.numel() == 0:
            return D
        if problem.k == 0:   # every valid row is a sum of nothing (the kernels need a k tile)
            return D.zero_()
        self._launch(self._args(rows, B, D, problem, leading_dim(D.view(problem.m, problem.n), self.config.layout.c),
                                0, slots, group_ends=counts.data_ptr(), group_rows=slab), A.device)
        return D

    @staticmethod
    def _masked_scale_rows(scale_a: object, A: torch.Tensor, rows: int, per_row: bool) -> object:
        """A masked call's scale_a, (E, max_m, ceil(K/128)) per block or (E, max_m) per row, as its slabs' rows
        (gemm_op.h's gemm_masked)."""
        if not isinstance(scale_a, torch.Tensor):
            return scale_a   # (check_operand names the type)
        if scale_a.dim() != (2 if per_row else 3) or tuple(scale_a.shape[:2]) != tuple(A.shape[:2]):
            shape = "per-row scales of A are (E, max_m)" if per_row else \
                "per-block scales of A are (E, max_m, ceil(K/128))"
            raise ValueError(f"scale_a has shape {tuple(scale_a.shape)}; a masked call's {shape}, one slab per group "
                             "as A's")
        if not scale_a.is_contiguous():
            raise ValueError(f"scale_a has strides {tuple(scale_a.stride())}; the kernel reads its slabs as one "
                             "matrix: pass scale_a.contiguous()")
        return scale_a.reshape(rows) if per_row else scale_a.reshape(rows, scale_a.shape[2])

    def _check_grouped_alignment(self, A: torch.Tensor, B: torch.Tensor, problem: Problem) -> None:
        """A grouped call's A (2-D) and B on the 16-byte rule of the kernel's TMA loads."""
        for what, t, order, ld, stride in (("A", A, self.config.layout.a, problem.lda, 0),
                                           ("B", B, self.config.layout.b, problem.ldb, problem.batch_stride_b)):
            refusal = grouped_alignment_refusal(what, t, order, ld, stride)
            if refusal is not None:
                raise ValueError(refusal)

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


def registered_op(config: KernelConfig, namespace: str) -> GemmOp:
    """The op registered for ``config`` (its backward unhinted) in ``namespace``; registered now, unbuilt, if there
    is none."""
    entry = _LIBRARIES.get(f"{namespace}::{config.name}")
    return entry[1] if entry is not None else GemmOp(config, None, namespace)


def compile_op(config: KernelConfig, *, namespace: str, verbose: bool = False,
               problem: PlannedProblem | None = None, plan_gradient: PlanGradient = plan) -> GemmOp:
    """The built op of ``config``; ``problem``: the forward problem its backward kernels are planned for (the
    plan's size hints; None: unhinted), ``plan_gradient`` how (planner.backward.PlanGradient)."""
    return GemmOp(config, load_library(config, verbose=verbose), namespace, problem=problem,
                  plan_gradient=plan_gradient)


def _load_op(config: KernelConfig, namespace: str, problem: PlannedProblem | None = None,
             plan_gradient: PlanGradient = plan) -> GemmOp:
    return compile_op(config, namespace=namespace, problem=problem, plan_gradient=plan_gradient)


def compile_many(configs: list[KernelConfig], *, namespace: str, verbose: bool = False,
                 problems: Sequence[PlannedProblem | None] | None = None,
                 plan_gradient: PlanGradient = plan, extra_flags: Sequence[str] = ()) -> list[GemmOp]:
    """Build several kernels in one parallel ninja run; ops in the order of ``configs``, each with its backward
    planned for the matching entry of ``problems`` (as ``compile_op``'s ``problem``) by ``plan_gradient``.
    ``extra_flags``: nvcc flags for these kernels (a template's switches, e.g. ``("-DGEMMGEN_...=1",)``: an A/B
    beside the plain build in one process, each in a namespace of its own; the backward's kernels take none)."""
    hints = list(problems) if problems is not None else [None] * len(configs)
    if len(hints) != len(configs):   # (before the build, which takes minutes)
        raise ValueError(f"compile_many: {len(configs)} configs but {len(hints)} problems: give one problem (or None) "
                         "per config")
    libraries = build_libraries(list(dict.fromkeys(configs)), verbose=verbose, extra_flags=extra_flags)
    by_config = dict(zip(dict.fromkeys(configs), libraries))
    return [GemmOp(c, by_config[c], namespace, problem=p, plan_gradient=plan_gradient) for c, p in zip(configs, hints)]
