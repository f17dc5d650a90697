"""An op that holds one kernel per bucket of M (rows of A) and picks one per call on the host.

The best tile depends on M as much as on N and K: at N = K = 4096 the planner picks 128x64 cooperative tiles
for M = 128 (64 tiles fill half the H100), 128x128 pingpong for M = 512 and 128x256 for large M (both in a 2x1
cluster). A layer that sees prefill and decode batches of one model gets each size's kernel from one op; within a
kernel's library the launch still picks the small-M, repacked or unaligned path per call (op.path says which).
``Gemm.compile_buckets()`` makes one; ``generator.nn.Linear`` uses it when no M is given. Under torch.compile
the large-M kernel serves every M (see ``__call__``): bucketing inside one registered op is the next step.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch


@dataclass(frozen=True)
class MBucket:
    """Calls with M <= max_m (None: any larger M) take ``op``."""

    max_m: int | None
    op: Any    # a GemmOp (or anything callable as one: tests use reference ops)

    @property
    def label(self) -> str:
        return f"M <= {self.max_m}" if self.max_m is not None else "larger M"


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

    @classmethod
    def from_built(cls, bounded_configs: Sequence[tuple[int | None, Any]], built: Mapping[Any, Any]) -> BucketedOp:
        """The op of ``Gemm.bucket_plans``' (bound, config) pairs, each config's op taken from ``built`` (the
        callers build every kernel of several bucketed ops in one parallel run)."""
        return cls([MBucket(bound, built[config]) for bound, config in bounded_configs])

    @property
    def name(self) -> str:
        return " | ".join(f"{b.label}: {b.op.name}" for b in self.buckets)

    def select(self, m: int) -> Any:
        """The op of the bucket that takes ``m`` rows."""
        return self.buckets[bisect_left(self._bounds, m)].op

    @staticmethod
    def rows(A: torch.Tensor, B: torch.Tensor) -> int:
        """The rows a call's bucket is chosen by: M, or for a batched call (3-D A or B) M times the number of
        problems, which is what the kernel's grid fills (and what a batch folded into one problem has: common/
        batch.cuh); not the batch size that a 3-D A's first dimension holds."""
        if A.dim() < 3 and B.dim() < 3:
            return A.shape[0]
        problems = max(A.shape[0] if A.dim() == 3 else 1, B.shape[0] if B.dim() == 3 else 1)
        return A.shape[-2] * problems

    def __call__(self, A: torch.Tensor, B: torch.Tensor, *operands: Any, out: torch.Tensor | None = None,
                 **named: Any) -> Any:
        return self.op_for_rows(self.rows(A, B))(A, B, *operands, out=out, **named)

    def op_for_rows(self, m: int) -> Any:
        """The op a call of ``m`` rows (``rows``) takes: its bucket's, or under torch.compile the large-M one."""
        # Under torch.compile a branch on M would guard the graph on M's bucket and recompile per bucket (and a
        # dynamic M marked with mark_dynamic would be constrained): the large-M kernel serves every M there, one
        # graph for all, as a single op does. Eager calls (and CUDA graphs of them) pick per bucket.
        if torch.compiler.is_compiling():
            return self.buckets[-1].op
        return self.select(m)

    def path(self, A: torch.Tensor, B: torch.Tensor, *operands: Any, **named: Any) -> str:
        """The kernel a call takes: its bucket's op's name and, after a colon, the path within its library
        ('fast', 'small_m', 'repacked' or 'unaligned')."""
        op = self.select(self.rows(A, B))
        return f"{op.name}: {op.path(A, B, *operands, **named)}"

    def __repr__(self) -> str:
        return f"BucketedOp({self.name})"
