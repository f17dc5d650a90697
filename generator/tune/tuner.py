"""tune(problem): enumerate the candidates around the planner's pick, build them in parallel, time them on the GPU
side by side, check each one's result, keep the fastest correct one in the tuning cache; and the cheap lookup of
a recorded winner that a plan makes when it is created (DESIGN.md: measured tuning replaces the estimate where a
tuned result exists, never the legality rules)."""
from __future__ import annotations

import os
import time
from dataclasses import fields, replace
from datetime import datetime, timezone
from typing import Any

from ..planner import Knobs, Problem, choose
from ..planner.common import default_family
from ..planner.sm90 import ring_staged
from ..spec.arch import arch_spec
from ..spec.config import SMALL_M_MAX_ROWS, KernelConfig, is_legal, takes_small_m
from ..spec.types import DType, Layout
from .cache import Entry, EntryKey, apply_fields, config_fields, lookup, record, table_files
from .candidates import DEFAULT_MAX_CANDIDATES, Space, candidates
from .device import DeviceKey, current_device
from .result import Candidate, TunedChoice, TuneResult
from .shipped import shipped_answer, shipped_tables

#: Set to 0 to plan by the estimate alone (benchmarks of the untuned pick); plan.tune() still tunes.
TUNED_ENV = "GEMMGEN_TUNED"
#: A candidate replaces the estimate's pick only when it is faster by more than this: a smaller gain is within the
#: run-to-run spread of the medians, and switching on it could as well make the shape slower in the next run.
KEEP_PICK_WITHIN = 0.01


class NoGpuError(RuntimeError):
    """Tuning measures on a GPU, and there is none (or no torch)."""


# -- keys -----------------------------------------------------------------------------------------------------

def _knob_text(value: object) -> str:
    return "x".join(map(str, value)) if isinstance(value, tuple) else str(value)


def fixed_knobs(knobs: Knobs) -> str:
    """The knobs the user fixed, as the key spells them: "schedule=pingpong,stages=4" ("" for none)."""
    fixed = sorted((f.name, getattr(knobs, f.name)) for f in fields(knobs) if getattr(knobs, f.name) is not None)
    return ",".join(f"{name}={_knob_text(value)}" for name, value in fixed)


def entry_key(space: Space, problem: Problem, pick: KernelConfig) -> EntryKey:
    """What a measured winner for this request and problem is filed under (besides the device)."""
    return EntryKey(arch=space.spec.cc, family=pick.family, dtype=pick.dtype_tag, out_dtype=pick.out_dtype.value,
                    layout=pick.layout.tag, epilogue=pick.epilogue.name_suffix, knobs=fixed_knobs(space.knobs),
                    m=problem.m, n=problem.n, k=problem.k, batch=problem.batch)


def choice_from_entry(entry: Entry, pick: KernelConfig, device: DeviceKey, source: str = "") -> TunedChoice | None:
    """The recorded winner rebuilt on ``pick``'s request; None where it no longer is that kernel or is illegal
    (a stale record: the config space changed without its version). ``source``: a shipped table's label."""
    try:
        cfg = apply_fields(pick, entry.config)
    except (TypeError, ValueError):
        return None
    if cfg.name != entry.kernel or not is_legal(cfg):
        return None
    return TunedChoice(cfg, entry, device, source)


def tuning_enabled() -> bool:
    return os.environ.get(TUNED_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def lookup_wanted() -> bool:
    """Whether a plan should look for a recorded winner at all: one directory listing, and none with
    GEMMGEN_TUNED=0."""
    return tuning_enabled() and bool(table_files())


def lookup_choice(space: Space, problem: Problem, pick: KernelConfig,
                  model: KernelConfig | None = None) -> TunedChoice | None:
    """The recorded winner for this request and problem on the current GPU, or None: the user's tuning cache first,
    then the dispatch table shipped for this GPU model (``shipped``: its entry for the problem's band of rows). Costs
    one directory listing where neither exists (and nothing with GEMMGEN_TUNED=0); else the GPU's identity (once
    per process; the shipped tables alone do not import torch for it) and a dictionary lookup in parsed tables."""
    if not tuning_enabled():
        return None
    cached = lookup_wanted()
    if not cached and not shipped_tables():
        return None
    device = current_device(import_torch=cached)
    if device is None:
        return None
    key = entry_key(space, problem, pick)
    entry = lookup(device, key) if cached else None
    choice = None if entry is None else choice_from_entry(entry, pick, device)
    if choice is not None:
        return choice
    answer = shipped_answer(device, key)
    if answer is None or answer[0].estimate_kernel not in (pick.name, (model or pick).name):
        return None   # measured against another pick: whether its winner beats this one is not known
    choice = choice_from_entry(answer[0], pick, device, source=answer[1])
    return choice and replace(choice, config=ring_staged(choice.config, space.knobs))


def tuned_plan(dtype: DType, layout: Layout, arch: int, *, family: str | None = None, out_dtype: DType | None = None,
               problem: Problem | None = None) -> KernelConfig:
    """``planner.plan``'s config, or where a measurement answers its request and problem on this GPU (``lookup_choice``:
    the user's tuning cache, then the shipped table) the measured winner: how the JIT ops choose their backward
    kernels (``planner.backward.PlanGradient``). Looked up under the key of ``Gemm(dtype, layout, arch=arch, m=, n=,
    k=)``, with the family a fixed knob only where it is not the architecture's default: a user's ``tune()`` of the
    gradient's GEMM answers it too."""
    spec = arch_spec(arch)
    best, _ = choose(dtype, out_dtype or dtype, layout, spec, knobs=Knobs(family=family), problem=problem,
                     sm_count=spec.sm_count)   # (planner.plan's pick, with the model's before the layered rules)
    if problem is None:
        return best.config
    knobs = Knobs() if family in (None, default_family(spec)) else Knobs(family=family)
    space = Space(dtype=dtype, out_dtype=out_dtype or dtype, layout=layout, spec=spec, sm_count=spec.sm_count,
                  knobs=knobs)
    choice = lookup_choice(space, problem, best.config, best.model)
    return best.config if choice is None else choice.config


def _result_from_entry(entry: Entry, choice: TunedChoice, pick: KernelConfig, problem: Problem,
                       seconds: float) -> TuneResult:
    by_name = {pick.name: pick, choice.config.name: choice.config}
    rows = tuple(Candidate(by_name[name], ms, note=note) for name, ms, note in entry.table if name in by_name)
    return TuneResult(winner=choice.config, pick=pick, problem=problem, ms=entry.ms, pick_ms=entry.estimate_ms,
                      table=rows or (Candidate(choice.config, entry.ms),), from_cache=True, seconds=seconds,
                      device=choice.device, entry=entry)


# -- the tuning run -------------------------------------------------------------------------------------------

def tune(space: Space, problem: Problem, pick: KernelConfig, *, namespace: str = "gemmgen",
         budget_s: float | None = None, max_candidates: int = DEFAULT_MAX_CANDIDATES, progress: bool = True,
         force: bool = False, settings: Any = None) -> TuneResult:
    """Tune ``problem`` for the request ``space`` whose estimate picks ``pick``: the recorded winner from the
    tuning cache when there is one (unless ``force``), else measure up to ``max_candidates`` candidates and record
    the winner. ``budget_s``: after this many seconds (builds included) no further candidate starts its timing,
    and no further round starts (the pick is always timed). ``settings``: a timing.TimingSettings."""
    t0 = time.monotonic()
    device = current_device()
    if device is None:
        raise NoGpuError("tuning times kernels on a CUDA GPU, and torch sees none here: run it on the GPU machine "
                         "(tables move between machines with tune --export / --import)")
    key = entry_key(space, problem, pick)
    if not force:
        entry = lookup(device, key)
        choice = None if entry is None else choice_from_entry(entry, pick, device)
        if choice is not None:
            return _result_from_entry(entry, choice, pick, problem, time.monotonic() - t0)
    if budget_s is not None and budget_s <= 0:
        raise ValueError(f"budget_s={budget_s}: give a positive number of seconds, or None for no budget")
    small_m = problem.batch == 1 and takes_small_m(pick, problem.m, problem.n, problem.k, space.sm_count)
    configs = [pick] if small_m else candidates(space, problem, pick, max_candidates)
    from .measure import measure   # torch, the runtime: only for a run that measures

    rows, notes, confirmation = measure(configs, problem, namespace=namespace,
                                        deadline=None if budget_s is None else t0 + budget_s, progress=progress,
                                        settings=settings, confirm_above=KEEP_PICK_WITHIN)
    if small_m:
        notes.append(f"M = {problem.m} <= {SMALL_M_MAX_ROWS}: calls take the small-M kernel whatever the config, so "
                     "the estimate's pick is the only candidate")
    timed = [row for row in rows if row.ms is not None]
    if not timed:
        raise RuntimeError("no candidate could be timed:\n  " + "\n  ".join(f"{r.config.name}: {r.note}" for r in rows))
    winner = min(timed, key=lambda row: row.ms)
    pick_row = next(row for row in rows if row.config.name == pick.name)
    pick_ms = pick_row.ms if pick_row.ms is not None else winner.ms
    if pick_row.ms is None:
        notes.append(f"the estimate's pick was not timed ({pick_row.note}): the gain is counted as 0")
    elif winner is not pick_row and winner.ms * (1 + KEEP_PICK_WITHIN) > pick_ms:
        notes.append(f"the fastest, {winner.config.name}, is within {KEEP_PICK_WITHIN:.0%} of the estimate's pick: "
                     "the pick is kept (a gain that small is within the noise of a later run)")
        winner = pick_row
    elif confirmation is not None and confirmation.ms * (1 + KEEP_PICK_WITHIN) > confirmation.pick_ms:
        notes.append(f"the fastest, {winner.config.name}, was {pick_ms / winner.ms:.3f}x the estimate's pick but "
                     f"{confirmation.pick_ms / confirmation.ms:.3f}x when the two were timed again on fresh operands: "
                     "the pick is kept")
        winner = pick_row
    seconds = time.monotonic() - t0
    entry = Entry(key=key, kernel=winner.config.name, config=config_fields(winner.config), ms=winner.ms,
                  estimate_kernel=pick.name, estimate_ms=pick_ms, candidates=len(rows),
                  date=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), seconds=seconds,
                  table=tuple((r.config.name, None if r.ms is None else round(r.ms, 6), r.note) for r in rows))
    record(device, entry)
    return TuneResult(winner=winner.config, pick=pick, problem=problem, ms=winner.ms, pick_ms=pick_ms,
                      table=tuple(rows), from_cache=False, seconds=seconds, device=device, entry=entry,
                      notes=tuple(notes))
