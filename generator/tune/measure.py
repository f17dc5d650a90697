"""The measuring half of a tuning run (torch and a GPU): build every candidate in one parallel ninja run (every
core), load them as ops, check each one's result on fresh random operands, time the correct ones side by side
(generator.tune.timing), with progress bars for both."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from ..toolchain import BuildError, BuildRequest, build_many
from ..planner import Problem
from ..runtime import compile_many, jit_runtime
from ..runtime.loader import build_request
from ..spec.config import KernelConfig
from .progress import Bar
from .timing import (L2Flush, TimingSettings, calls_for, interleaved, make_operands, relative_error, tolerance,
                     torch_reference, warm_up)
from .result import Candidate


def build_all(configs: list[KernelConfig], progress: bool) -> tuple[list[KernelConfig], str | None]:
    """Build the candidates' libraries (and the JIT runtime, where it is still to be built) in one parallel run,
    or find them in the build cache. Returns those that built and the build error of the others (or None)."""
    requests = [build_request(cfg) for cfg in configs]
    runtime = [jit_runtime.runtime_request()] if jit_runtime.RUNTIME.wanted() else []
    ready: set[str] = set()
    with Bar(len(requests) + len(runtime), "build", "kernel", progress) as bar:
        def on_ready(req: BuildRequest, ok: bool) -> None:
            if ok:
                ready.add(req.name)
            bar.update(note=req.name if ok else f"{req.name} FAILED")

        try:
            build_many(requests + runtime, progress=on_ready)
            error = None
        except BuildError as err:   # -k 0: every other kernel was built all the same
            error = str(err)
    if runtime and runtime[0].name not in ready:   # ops are then called through ctypes; not built a second time
        jit_runtime.RUNTIME.fail(error or "the JIT runtime did not build")
    return [cfg for cfg in configs if cfg.name in ready], error


def _check(out: Any, reference: Any, cfg: KernelConfig, against_torch: bool) -> tuple[float, str]:
    error = relative_error(out, reference)
    bound = tolerance(cfg, against_torch)
    if error > bound:
        what = "torch's float32 result" if against_torch else "the estimate's pick's result"
        return error, f"wrong result: error {error:.2e} against {what} (bound {bound:.0e}); not timed"
    return error, ""


@dataclass(frozen=True)
class Confirmation:
    """The fastest candidate against the estimate's pick, timed again side by side on fresh operands: a winner by
    a few per cent in the main rounds can be the noise of one run (H200: a 2.7 % winner read 2.3 % slower when timed
    again, benchmarks/results/h200_calibrate_sm90_bf16.json), so it has to win twice."""

    kernel: str
    ms: float
    pick_ms: float


def measure(configs: list[KernelConfig], problem: Problem, *, namespace: str, deadline: float | None,
            progress: bool, settings: TimingSettings | None = None,
            confirm_above: float = 0.0) -> tuple[list[Candidate], list[str], Confirmation | None]:
    """Every candidate's row (``configs[0]``, the estimate's pick, first), notes for the result, and the second
    timing of the fastest candidate against the pick where the first one has it faster by more than
    ``confirm_above`` (a fraction; None otherwise)."""
    settings = settings or TimingSettings()
    notes: list[str] = []
    built, build_error = build_all(configs, progress)
    if build_error is not None:
        failed = len(configs) - len(built)
        notes.append(f"{failed} candidate(s) failed to build; the first error:\n    "
                     + "\n    ".join(build_error.splitlines()[:6]))
    ops = dict(zip((c.name for c in built), compile_many(built, namespace=namespace)))
    pick = configs[0]
    A, B, operands = make_operands(pick, problem)
    reference = torch_reference(pick, A, B)
    against_torch = reference is not None
    flush = L2Flush(A.device)
    rows: dict[str, Candidate] = {c.name: Candidate(c, None, note="build failed") for c in configs
                                  if c.name not in ops}
    timed: list[tuple[KernelConfig, Callable[[], Any], int]] = []
    with Bar(len(ops) * (1 + settings.rounds), "timing", "run", progress) as bar:
        for cfg in configs:
            op = ops.get(cfg.name)
            if op is None:
                continue
            if deadline is not None and timed and time.monotonic() > deadline:
                rows[cfg.name] = Candidate(cfg, None, note="not timed: the budget was spent")
                bar.set_total(bar.total - 1 - settings.rounds)
                continue
            fn = (lambda op=op: op(A, B, *operands))
            out = fn()
            if reference is None:   # no torch reference: the estimate's pick is it (it is checked by the GPU tests)
                reference = out
            error, wrong = _check(out, reference, cfg, against_torch)
            del out
            if wrong:
                rows[cfg.name] = Candidate(cfg, None, error, wrong)
                bar.set_total(bar.total - 1 - settings.rounds)
                continue
            calls = calls_for(warm_up(fn, settings, flush), settings)
            timed.append((cfg, fn, calls))
            rows[cfg.name] = Candidate(cfg, None, error)
            bar.update(note=cfg.name)
        skipped = sum(1 for r in rows.values() if r.note.startswith("not timed: the budget"))
        if skipped:
            notes.append(f"the budget was spent: {skipped} candidate(s) not timed (the cheapest by estimate were)")
        samples, rounds = interleaved([fn for _, fn, _ in timed], [calls for _, _, calls in timed], settings, flush,
                                      deadline, on_round=bar.update)
    if rounds < settings.rounds:
        notes.append(f"the budget was spent: {rounds} of {settings.rounds} timing rounds")
    for (cfg, _, _), ms in zip(timed, samples):
        row = rows[cfg.name]
        rows[cfg.name] = Candidate(cfg, statistics.median(ms), row.error, row.note)
    confirmation = _confirm(pick, timed, rows, ops, problem, settings, flush, confirm_above)
    torch.cuda.synchronize()
    return [rows[c.name] for c in configs], notes, confirmation


def _confirm(pick_cfg: KernelConfig, timed: list[tuple[KernelConfig, Callable[[], Any], int]],
             rows: dict[str, Candidate], ops: dict, problem: Problem, settings: TimingSettings, flush: L2Flush,
             above: float) -> Confirmation | None:
    """The fastest timed candidate and the pick (timed first, when it was) in ``settings.confirm_rounds`` more
    interleaved rounds on fresh operands, where the main rounds have the fastest ahead by more than ``above``."""
    if len(timed) < 2 or timed[0][0] is not pick_cfg or settings.confirm_rounds < 1:
        return None
    best_cfg = min((cfg for cfg, _, _ in timed), key=lambda c: rows[c.name].ms)
    if best_cfg is pick_cfg or rows[best_cfg.name].ms * (1 + above) > rows[pick_cfg.name].ms:
        return None
    A, B, operands = make_operands(pick_cfg, problem)
    fns = [(lambda op=ops[cfg.name]: op(A, B, *operands)) for cfg in (pick_cfg, best_cfg)]
    calls = [calls for cfg, _, calls in timed if cfg in (pick_cfg, best_cfg)]
    again, _ = interleaved(fns, calls, replace(settings, rounds=settings.confirm_rounds), flush)
    return Confirmation(best_cfg.name, statistics.median(again[1]), statistics.median(again[0]))
