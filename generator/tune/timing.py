"""Timing candidates side by side on the GPU, without Triton: CUDA events around each call, an L2 flush (a buffer
larger than L2 written) before every call, a warm-up, interleaved rounds over the candidates (each round in another
order, so a clock or temperature drift hits every candidate alike), the median of every call's time.

The events time the GPU, not the host: after the flush the GPU spins (``torch.cuda._sleep``) for longer than the host
takes to enqueue the start event, the call and the end event, so a call whose kernel is shorter than its host
overhead (a 10 us GEMM behind 20 us of Python) is not timed as the host's gap. Every candidate of a problem pays the
same host overhead in use, so only the GPU's time tells them apart.

Also what a measurement needs around it: fresh random operands in the plan's storage orders, and the check that a
candidate computes the right thing, so a wrong kernel can never win.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..planner import Problem
from ..runtime.checks import TORCH_DTYPES
from ..spec.config import KernelConfig
from ..spec.epilogue import SCALE_BLOCK, Operand
from ..spec.types import DType, Order

#: ||D - reference|| / ||reference|| a candidate may reach, by D's type: the output's rounding, with room. Against a
#: float32 torch reference on the same (rounded) inputs, or against the estimate's pick where torch has no reference
#: (fused epilogues, fp8, int8); int32 (int8's exact sums) must match exactly.
TOLERANCE = {DType.bf16: 1.6e-2, DType.fp16: 4e-3, DType.fp32: 1e-3, DType.int32: 0.0}
#: tf32 inputs lose bits against the float32 reference.
TF32_TOLERANCE = 5e-3


@dataclass(frozen=True)
class TimingSettings:
    """How long each candidate is measured."""

    rounds: int = 5            # interleaved rounds over the candidates
    round_ms: float = 20.0     # GPU time per candidate and round: the calls per round follow from a first estimate
    min_calls: int = 3
    max_calls: int = 50
    warmup: int = 3            # untimed calls first (clocks, caches, lazy loading)
    confirm_rounds: int = 6    # the fastest against the pick once more, side by side on fresh operands


# -- operands -------------------------------------------------------------------------------------------------

def _matrix(rows: int, cols: int, order: Order, dtype: torch.dtype, batch: int | None,
            gen: torch.Generator) -> torch.Tensor:
    """A (batch of) rows x cols matrix stored in ``order``, random."""
    lead = () if batch is None else (batch,)
    shape = (*lead, rows, cols) if order is Order.row else (*lead, cols, rows)
    if dtype == torch.int8:
        t = torch.randint(-8, 8, shape, dtype=torch.int8, device="cuda", generator=gen)
    else:
        t = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    return t if order is Order.row else t.transpose(-1, -2)


def _operand(op: Operand, m: int, n: int, k: int, gen: torch.Generator) -> Any:
    dtype = TORCH_DTYPES[op.dtype]
    blocks = math.ceil(k / SCALE_BLOCK)
    if op.kind == "scalar":
        return 0.5
    if op.kind == "scalar_tensor":
        return torch.ones(1, dtype=dtype, device="cuda")
    if op.kind == "row":
        return torch.randn(m, device="cuda", generator=gen).to(dtype)
    if op.kind == "col":
        return torch.randn(n, device="cuda", generator=gen).to(dtype)
    if op.kind == "row_blocks":
        return torch.rand(m, blocks, device="cuda", generator=gen) + 0.5
    if op.kind == "col_blocks":
        return torch.rand(math.ceil(n / SCALE_BLOCK), blocks, device="cuda", generator=gen) + 0.5
    return _matrix(m, n, op.order, dtype, None, gen)   # "matrix"


def make_operands(cfg: KernelConfig, problem: Problem, seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor,
                                                                                          list[Any]]:
    """Fresh random A, B and epilogue operands for ``problem`` in ``cfg``'s storage orders (3-D A and B for a
    batch); ``seed`` None draws a new seed."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed if seed is not None else int(time.time_ns() % (2**63)))
    m, n, k = problem.m, problem.n, problem.k
    batch = problem.batch if problem.batch > 1 else None
    A = _matrix(m, k, cfg.layout.a, TORCH_DTYPES[cfg.dtype], batch, gen)
    B = _matrix(k, n, cfg.layout.b, TORCH_DTYPES[cfg.b_dtype], batch, gen)
    return A, B, [_operand(op, m, n, k, gen) for op in cfg.epilogue.operands]


# -- correctness ----------------------------------------------------------------------------------------------

def torch_reference(cfg: KernelConfig, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor | None:
    """D in float32 by torch, where torch computes what ``cfg`` does (no fused epilogue, 16-bit or tf32 inputs);
    None elsewhere (the estimate's pick is then the reference)."""
    if not cfg.epilogue.is_identity or cfg.dtype not in (DType.fp16, DType.bf16, DType.tf32):
        return None
    return torch.matmul(A.float(), B.float())


def tolerance(cfg: KernelConfig, against_torch: bool) -> float:
    if cfg.out_dtype is DType.int32:
        return 0.0
    tol = TOLERANCE.get(cfg.out_dtype, 1.6e-2)
    return max(tol, TF32_TOLERANCE) if against_torch and cfg.dtype is DType.tf32 else tol


def _tensors(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def relative_error(out: Any, ref: Any) -> float:
    """max over the outputs (D, and aux where there is one) of ||out - ref|| / ||ref||; inf for a non-finite output
    or a mismatch of shapes."""
    worst = 0.0
    for o, r in zip(_tensors(out), _tensors(ref)):
        if o.shape != r.shape:
            return math.inf
        o, r = o.float(), r.float()   # float32 sums of the norms: enough for a bound of 1e-3 and up
        if not torch.isfinite(o).all():
            return math.inf
        diff = (o - r).norm().item()
        scale = r.norm().item()
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


# -- the timer ------------------------------------------------------------------------------------------------

class L2Flush:
    """Writes a buffer larger than the L2 cache, so that the next call finds none of its operands there; then holds
    the GPU for ``lead_s`` (a spin kernel), so that the host has enqueued the timed call before the GPU reaches it."""

    MIN_BYTES = 64 << 20
    #: The hold covers this multiple of the slowest host enqueue seen (``cover``), plus MIN_LEAD_S.
    LEAD_FACTOR = 2.0
    MIN_LEAD_S = 20e-6
    MAX_LEAD_S = 2e-3
    #: Spin cycles timed once to learn the spin kernel's rate on this GPU.
    CALIBRATION_CYCLES = 1_000_000

    def __init__(self, device: torch.device | None = None) -> None:
        l2 = getattr(torch.cuda.get_device_properties(device or torch.cuda.current_device()), "L2_cache_size", 0)
        self.buffer = torch.empty(max(2 * l2, self.MIN_BYTES) // 4, dtype=torch.int32, device="cuda")
        self.cycles_per_s = self._spin_rate()
        self.lead_s = self.MIN_LEAD_S

    def _spin_rate(self) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(self.CALIBRATION_CYCLES)   # first launch: not timed
        start.record()
        torch.cuda._sleep(self.CALIBRATION_CYCLES)
        end.record()
        end.synchronize()
        return self.CALIBRATION_CYCLES / max(start.elapsed_time(end) * 1e-3, 1e-6)

    def cover(self, host_s: float) -> None:
        """Hold the GPU long enough for a call whose host side takes ``host_s`` seconds to enqueue."""
        self.lead_s = min(self.MAX_LEAD_S, max(self.lead_s, self.LEAD_FACTOR * host_s + self.MIN_LEAD_S))

    def __call__(self) -> None:
        self.buffer.zero_()
        torch.cuda._sleep(int(self.lead_s * self.cycles_per_s))


def time_calls(fn: Callable[[], Any], calls: int, flush: L2Flush) -> list[float]:
    """Milliseconds of each of ``calls`` calls of ``fn``, each after an L2 flush (which is outside the events)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    for start, end in zip(starts, ends):
        flush()
        start.record()
        fn()
        end.record()
    ends[-1].synchronize()
    return [start.elapsed_time(end) for start, end in zip(starts, ends)]


def round_order(count: int, round_index: int) -> list[int]:
    """The candidates' order in one round: rotated by the round, reversed every other round, so that each candidate
    follows a different one from round to round (a call's clock depends on the power drawn just before it)."""
    order = [(i + round_index) % count for i in range(count)]
    return order[::-1] if round_index % 2 else order


@dataclass
class Samples:
    """One candidate's measurement."""

    calls_per_round: int
    ms: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.ms)


def calls_for(estimate_ms: float, settings: TimingSettings) -> int:
    """Calls per round that fill ``settings.round_ms`` of GPU time."""
    wanted = math.ceil(settings.round_ms / max(estimate_ms, 1e-3))
    return max(settings.min_calls, min(settings.max_calls, wanted))


def warm_up(fn: Callable[[], Any], settings: TimingSettings, flush: L2Flush) -> float:
    """Untimed calls (their host time sets how long the flush holds the GPU), then a short timed run: the estimate
    of one call's time (ms) that sets the calls per round."""
    host_s = []
    for _ in range(max(settings.warmup, 1)):
        t0 = time.perf_counter()
        fn()
        host_s.append(time.perf_counter() - t0)
    flush.cover(max(host_s[1:] or host_s))   # the first call may load and check more than a steady call does
    return statistics.median(time_calls(fn, settings.min_calls, flush))


def interleaved(fns: Sequence[Callable[[], Any]], calls: Sequence[int], settings: TimingSettings, flush: L2Flush,
                deadline: float | None = None,
                on_round: Callable[[], None] | None = None) -> tuple[list[list[float]], int]:
    """Every function's call times over ``settings.rounds`` interleaved rounds, fewer where ``deadline``
    (time.monotonic()) has passed after a round (one round at least); ``on_round`` after each function's turn.
    Returns the times per function and the rounds done."""
    samples: list[list[float]] = [[] for _ in fns]
    done = 0
    for r in range(settings.rounds):
        if r > 0 and deadline is not None and time.monotonic() > deadline:
            break
        for i in round_order(len(fns), r):
            samples[i].extend(time_calls(fns[i], calls[i], flush))
            if on_round is not None:
                on_round()
        done += 1
    return samples, done
