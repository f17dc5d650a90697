"""The torch.library registration of a GemmOp as ``torch.ops.<namespace>.<kernel name>``: its overloads' schemas and
tags, kernels, fakes and autograd formulas (``_register``, which ``op.GemmOp`` calls when it is made), and the table of
the registered ops (``_LIBRARIES``). The op is handed in, so that this module sits below ``op`` in the imports.

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
  ``list_backward``; fp8 and int8 ops refuse inputs which require grad). ``.masked`` (plain ops; emitted packages: binding.cpp.j2): the
  kernel (the JIT runtime adds a C++ one for CUDA) and a fake likewise, and an Autograd kernel that refuses inputs
  which require grad (no formula yet).
* DTensor operands (tensor parallelism): the default overload's sharding strategy, each rank running the kernel on its
  local shards, and refusals for the grouped overloads (``generator.runtime.sharding.register_rules``; ``.out``
  decomposes into the default overload).
* all: tagged ``needs_fixed_stride_order`` (Inductor hands the operands over in the stride order they
  had when traced, i.e. the planned layout) and ``pt2_compliant_tag`` (opcheck passes).
"""
from __future__ import annotations

from typing import Any

import torch

from ..spec.config import KernelConfig, output_schema, second_output
from ..spec.grouped import takes_scaled_groups
from .autograd import register_autograd
from .library import KernelLibrary
from .operands import schema_arguments
from .sharding import register_rules


# The torch.library registrations must outlive the call that made them; keyed by qualified name.
# With the build cache, this is the only process-wide state the package keeps.
_LIBRARIES: dict[str, tuple[torch.library.Library, Any]] = {}   # (the ops: GemmOps)


def _define(lib: torch.library.Library, schema: str) -> None:
    # needs_fixed_stride_order: under Inductor the operands keep the stride order they had when traced
    # (a column-major B stays column-major), so the planned layout holds in compiled graphs too.
    lib.define(schema, tags=(torch.Tag.needs_fixed_stride_order, torch.Tag.pt2_compliant_tag))


def _register_grouped_scaled(op: Any, lib: torch.library.Library, qualname: str) -> None:
    """.grouped_scaled(A, B, offsets, scale_a, scale_b) and .masked_scaled(A, B, counts, scale_a, scale_b): the kernel
    under CompositeExplicitAutograd (the JIT runtime's C++ one replaces it for CUDA where built) and fakes."""
    _define(lib, f"{op.name}.grouped_scaled(Tensor A, Tensor B, Tensor offsets, Tensor scale_a, Tensor scale_b) -> Tensor")
    lib.impl(f"{op.name}.grouped_scaled", op.run_grouped_scaled, "CompositeExplicitAutograd")

    def fake_grouped_scaled(A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor, scale_a: torch.Tensor,
                            scale_b: torch.Tensor) -> torch.Tensor:
        op._check_grouped_meta(A, B, offsets)
        op._check_grouped_scales_meta(scale_a, scale_b, A)
        return op._empty_grouped_out(A, B)

    torch.library.register_fake(f"{qualname}.grouped_scaled", fake_grouped_scaled, lib=lib)
    _define(lib, f"{op.name}.masked_scaled(Tensor A, Tensor B, Tensor counts, Tensor scale_a, Tensor scale_b) -> Tensor")
    lib.impl(f"{op.name}.masked_scaled", op.run_masked_scaled, "CompositeExplicitAutograd")

    def fake_masked_scaled(A: torch.Tensor, B: torch.Tensor, counts: torch.Tensor, scale_a: torch.Tensor,
                           scale_b: torch.Tensor) -> torch.Tensor:
        op._check_masked_meta(A, B, counts)
        op._check_grouped_scales_meta(scale_a, scale_b, A)
        return op._empty_masked_out(A, B)

    torch.library.register_fake(f"{qualname}.masked_scaled", fake_masked_scaled, lib=lib)


def has_grouped(config: KernelConfig) -> bool:
    """Whether the op of ``config`` has the .grouped and .grouped_list overloads: every op without a fused epilogue
    (whether its kernel takes such calls or not: a plan that does not is refused with the fix, by the overload)."""
    return config.epilogue.is_identity


def has_grouped_scaled(config: KernelConfig) -> bool:
    """Whether the op of ``config`` has the .grouped_scaled and .masked_scaled overloads (grouped calls of rows with
    their per-block scales): an fp8 plan with scale='block' and no other epilogue (spec.grouped.takes_scaled_groups)."""
    return takes_scaled_groups(config)


def _register(op: Any, library: KernelLibrary | None) -> None:   # (op: a GemmOp)
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
        _define(lib, f"{op.name}(Tensor A, Tensor B{operands}) -> {output_schema(op.config)}")
        _define(lib, f"{op.name}.out(Tensor A, Tensor B{operands}, *, Tensor(a!) out) -> Tensor(a!)")
        # CompositeExplicitAutograd: one implementation for every backend, so that CPU tensors reach our
        # checks (and a clear message) instead of the dispatcher's "no kernel for CPU".
        lib.impl(op.name, lambda A, B, *values: op.run(A, B, values, None), "CompositeExplicitAutograd")

        def refuse_aux() -> None:
            second = second_output(op.config)
            if second is not None:
                raise ValueError(f"{op.name}.out: the plan has a second output ({second}), which out= cannot "
                                 "receive: call the op without out=")

        def run_out(A: torch.Tensor, B: torch.Tensor, *values: Any, out: torch.Tensor) -> torch.Tensor:
            refuse_aux()
            if not isinstance(out, torch.Tensor):  # None would make run() allocate: not what .out promises
                raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
            return op.run(A, B, values, out)

        lib.impl(f"{op.name}.out", run_out, "CompositeExplicitAutograd")

        def fake(A: torch.Tensor, B: torch.Tensor, *values: Any) -> torch.Tensor | tuple[torch.Tensor, ...]:
            op._check_meta(A, B, None, values)
            # the real output's strides: row-major D, or (1, M) for layout_c='col'
            return op._outputs(op._empty_out(A, B), op._second_out(A, B), op._zeroed_amax(A))

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
                if isinstance(B, torch.Tensor) and B.dim() == 2:   # groups along K: (E, M, N)
                    op._check_grouped_k_meta(A, B, offsets)
                    return op._empty_grouped_k_out(A, B, offsets)
                op._check_grouped_meta(A, B, offsets)
                return op._empty_grouped_out(A, B)   # (total_M, N): no size depends on the offsets' values

            torch.library.register_fake(f"{qualname}.grouped", fake_grouped, lib=lib)
            _define(lib, f"{op.name}.grouped_list(Tensor[] A, Tensor[] B) -> Tensor[]")
            lib.impl(f"{op.name}.grouped_list", op.run_grouped_list, "CompositeExplicitAutograd")

            def fake_grouped_list(A: list[torch.Tensor], B: list[torch.Tensor]) -> list[torch.Tensor]:
                op._check_list_meta(A, B)
                return op._empty_list_out(A, B)

            torch.library.register_fake(f"{qualname}.grouped_list", fake_grouped_list, lib=lib)
            _define(lib, f"{op.name}.masked(Tensor A, Tensor B, Tensor counts) -> Tensor")
            lib.impl(f"{op.name}.masked", op.run_masked, "CompositeExplicitAutograd")

            def fake_masked(A: torch.Tensor, B: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
                op._check_masked_meta(A, B, counts)
                return op._empty_masked_out(A, B)   # (E, max_m, N): no size depends on the counts' values

            torch.library.register_fake(f"{qualname}.masked", fake_masked, lib=lib)

        if has_grouped_scaled(op.config):
            _register_grouped_scaled(op, lib, qualname)

        # DTensor operands: each rank's local GEMM, placements by the rules of generator.runtime.sharding
        register_rules(op, has_grouped(op.config))
        register_autograd(op, lib)
        if library is not None:
            op._attach(library)
    except BaseException:
        del _LIBRARIES[qualname]
        raise
