"""An op that holds one kernel per bucket of M (rows of A) and picks one per call on the host.

The best tile depends on M as much as on N and K: at N = K = 4096 the planner picks 128x64 cooperative tiles
for M = 128 (64 tiles fill half the H100), 128x128 pingpong for M = 512 and 128x256 for large M (both in a 2x1
cluster). A layer that sees prefill and decode batches of one model gets each size's kernel from one op; within a
kernel's library the launch still picks the small-M, repacked or unaligned path per call (op.path says which).
``Gemm.compile_buckets()`` makes one; ``generator.nn.Linear`` uses it when no M is given. Eager calls pick the bucket
in Python and call its op; under torch.compile a branch on M would guard the graph per bucket, so compiled graphs
call one registered op over all the buckets' kernels (``BucketSetOp``), which picks per call in C++ from the
call's rows.
"""
from __future__ import annotations

import hashlib
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from .library import GemmArgsStruct, KernelLibrary
from .op import GemmOp


@dataclass(frozen=True)
class MBucket:
    """Calls with M <= max_m (None: any larger M) take ``op``."""

    max_m: int | None
    op: Any    # a GemmOp (or anything callable as one: tests use reference ops)

    @property
    def label(self) -> str:
        return f"M <= {self.max_m}" if self.max_m is not None else "larger M"


def call_rows(A: torch.Tensor, B: torch.Tensor) -> int:
    """The rows a call's bucket is chosen by: M, or for a batched call (3-D A or B) M times the number of problems,
    which is what the kernel's grid fills (and what a batch folded into one problem has: common/batch.cuh); not the
    batch size that a 3-D A's first dimension holds."""
    if A.dim() < 3 and B.dim() < 3:
        return A.shape[0]
    problems = max(A.shape[0] if A.dim() == 3 else 1, B.shape[0] if B.dim() == 3 else 1)
    return A.shape[-2] * problems


def bucket_index(bounds: Sequence[int], rows: int) -> int:
    """The index of the bucket that takes ``rows``: the first whose bound is at least ``rows``, len(bounds) (the
    last, unbounded one) above them all. templates/torch/gemm_op.h bucket_of chooses the same in C++."""
    return bisect_left(bounds, rows)


class BucketSetOp(GemmOp):
    """One registered op over the kernels of an M-bucketed op: a call of at most ``bound`` rows (``call_rows``) takes
    that bucket's kernel, larger ones the last bucket's, chosen per call where the launch is made (the JIT runtime's
    C++ kernel, templates/torch/gemm_op.h ``bucket_of``; the Python path's ``_launch``). What torch.compile'd graphs
    call: one op for every M, no guard on M. Schema, checks, fake and autograd formula are the last bucket's plan's
    (every bucket shares dtype, layout and epilogue); grouped and list calls take the last bucket's kernel."""

    def __init__(self, buckets: Sequence[tuple[int | None, GemmOp]], namespace: str) -> None:
        self._bounds = [bound for bound, _ in buckets[:-1]]
        self._ops = [op for _, op in buckets]
        self._largest = self._ops[-1]
        names = "|".join(f"{bound}:{op.name}" for bound, op in buckets)
        digest = hashlib.sha1(names.encode()).hexdigest()[:10]
        super().__init__(self._largest.config, None, namespace, name=f"{self._largest.name}_buckets_{digest}",
                         problem=self._largest.problem)   # (the backward of the largest bucket's op)
        self._attach(self._largest.library)

    def _register_cpp_kernel(self, library: KernelLibrary) -> bool:
        from . import jit_runtime   # (as op.py: the runtime is loaded on first use)

        smaller = [(bound, op.name, op.library) for bound, op in zip(self._bounds, self._ops)]
        return jit_runtime.RUNTIME.register(self, library, smaller)

    def op_for_rows(self, rows: int) -> GemmOp:
        return self._ops[bucket_index(self._bounds, rows)]

    def _launch(self, args: GemmArgsStruct, device: torch.device) -> None:
        if args.group_ends or args.list:   # grouped and list calls: the last bucket's kernel walks them
            return self._largest._launch(args, device)
        return self.op_for_rows(args.m * max(args.batch, 1))._launch(args, device)

    def path(self, A: Any, B: Any, *operands: Any, offsets: torch.Tensor | None = None, **named: Any) -> str:
        """The bucket's kernel's name and, after a colon, the path within its library, as ``BucketedOp.path``."""
        if offsets is not None or not isinstance(A, torch.Tensor) or not isinstance(B, torch.Tensor):
            return f"{self._largest.name}: {self._largest.path(A, B, *operands, offsets=offsets, **named)}"
        op = self.op_for_rows(call_rows(A, B))
        return f"{op.name}: {op.path(A, B, *operands, **named)}"

    def __reduce__(self) -> tuple:
        # Pickled as its buckets' ops (each pickled as its config): unpickling registers the same op again.
        return (BucketSetOp, ([*zip(self._bounds, self._ops), (None, self._largest)], self.namespace))


class BucketedOp:
    """``op(A, B, *operands, out=None, **named)`` as a GemmOp, run by the kernel of A's row count's bucket."""

    def __init__(self, buckets: Sequence[MBucket]) -> None:
        if not buckets or buckets[-1].max_m is not None:
            raise ValueError("a BucketedOp needs its buckets in increasing max_m, the last one for any larger M "
                             "(max_m=None)")
        bounds = [b.max_m for b in buckets[:-1]]
        if any(b is None for b in bounds) or bounds != sorted(set(bounds)):
            raise ValueError(f"bucket bounds {bounds} must be distinct, increasing integers")
        self.buckets = tuple(buckets)
        self._bounds = bounds
        largest = buckets[-1].op
        # What callers read from a single op (nn.Linear, checks): the large-M kernel's, shared by every bucket.
        self.config = largest.config
        self.dtype = largest.dtype
        self.out_dtype = largest.out_dtype
        self.device_type = largest.device_type
        # Made here, not on a compiled graph's first call: dynamo cannot trace an op's registration. Only over
        # built GemmOps (compile_buckets builds every bucket; the tests' reference ops have no library).
        ops = [b.op for b in self.buckets]
        self._set_op = (BucketSetOp([(b.max_m, b.op) for b in self.buckets], largest.namespace)
                        if len(ops) > 1 and all(isinstance(op, GemmOp) and op.built for op in ops) else None)

    @classmethod
    def from_built(cls, bounded_keys: Sequence[tuple[int | None, Any]], built: Mapping[Any, Any]) -> BucketedOp:
        """The op of (bound, key) pairs, each key's op taken from ``built`` (the callers build every kernel of several
        bucketed ops in one parallel run). A key is what tells the ops apart: ``generator.gemm.op_key`` of each of
        ``Gemm.bucket_plans``' plans (its kernel, and the problem its backward is planned for), or a config."""
        return cls([MBucket(bound, built[key]) for bound, key in bounded_keys])

    @property
    def name(self) -> str:
        return " | ".join(f"{b.label}: {b.op.name}" for b in self.buckets)

    def select(self, m: int) -> Any:
        """The op of the bucket that takes ``m`` rows."""
        return self.buckets[bucket_index(self._bounds, m)].op

    rows = staticmethod(call_rows)

    def __call__(self, A: torch.Tensor, B: torch.Tensor, *operands: Any, out: torch.Tensor | None = None,
                 **named: Any) -> Any:
        return self.op_for_rows(self.rows(A, B))(A, B, *operands, out=out, **named)

    def op_for_rows(self, m: int) -> Any:
        """The op a call of ``m`` rows (``rows``) takes: its bucket's, or under torch.compile the op over every
        bucket (``set_op``)."""
        # Under torch.compile a branch on M would guard the graph on M's bucket and recompile per bucket (and a
        # dynamic M marked with mark_dynamic would be constrained): the graph calls one op for every M, which picks
        # the bucket when it runs. Eager calls (and CUDA graphs of them) pick here, in Python.
        if torch.compiler.is_compiling():
            return self.set_op()
        return self.select(m)

    def set_op(self) -> Any:
        """The registered op over every bucket's kernel (``BucketSetOp``); the last bucket's op where there is one
        bucket or a bucket's op is not a built GemmOp (the tests' reference ops)."""
        return self._set_op if self._set_op is not None else self.buckets[-1].op

    def path(self, A: torch.Tensor, B: torch.Tensor, *operands: Any, **named: Any) -> str:
        """The kernel a call takes: its bucket's op's name and, after a colon, the path within its library
        ('fast', 'small_m', 'repacked' or 'unaligned')."""
        op = self.select(self.rows(A, B))
        return f"{op.name}: {op.path(A, B, *operands, **named)}"

    def __repr__(self) -> str:
        return f"BucketedOp({self.name})"
