"""Calibrating the planner's estimate against measurement (issue 22, part 3).

    python benchmarks/calibrate.py [--families sm90,sm80] [--dtypes bf16,fp16] [--sets llm,square]
        [--max-candidates 16] [--json $OUT/calibrate.json]             (on the GPU machine)
    python benchmarks/calibrate.py --fit calibrate_sm90.json,calibrate_sm80.json [--fit-json fit.json]   (no GPU)

Sweep (GPU): every shape of benchmarks/shapes.json's sets, for each family and 16-bit dtype (layout tn), is tuned
(generator.tune: the candidates around the planner's pick built in parallel, timed side by side with the L2
flushed, medians of interleaved rounds); then the estimate's pick and the winner are timed again, side by side on
fresh operands (``--verify-rounds``), for an unbiased tuned-against-untuned ratio (the tuning run's own minimum
favours the winner by its noise). Per shape the JSON records the pick, the measured best, whether the pick is
within 3 % of it, the verified ratio, and every candidate's config and time; the summary prints, per family and
dtype, how often the pick is within 3 % and the geomean tuned/untuned speed-up. ``GEMMGEN_TUNED=0`` is set while
planning, so the pick is the estimate's even where the tuning cache has a winner; every shape is measured afresh
(and its winner recorded) unless ``--use-cache``. Shapes of M <= 16 have one candidate (their calls take the small-M
kernel whatever the config) and are counted apart.

Fit (CPU): reads such a JSON and searches the cost model's efficiency constants (sm90: L2_HALF_REUSE,
SMEM_HALF_REUSE, ISSUE_EFFICIENCY[1], CLUSTER_COUPLING, OVERHEAD_K["cooperative"]; sm80: SM80_TILES' relative
efficiencies, HOPPER_TILE_EFFICIENCY's where it overrides them) by coordinate search, for the model's choice among
each shape's measured candidates to land within 3 % of the best as often as possible (then the smallest loss). It
prints the proposed values and the fraction before and after. In-sample: check a proposal on shapes it was not fitted
on before committing it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from generator.planner import Problem, estimate  # noqa: E402
from generator.planner import sm80 as planner_sm80  # noqa: E402
from generator.planner import sm90 as planner_sm90  # noqa: E402
from generator.spec.arch import arch_spec  # noqa: E402
from generator.spec.config import KernelConfig  # noqa: E402
from generator.spec.types import DType, parse_layout  # noqa: E402
from generator.tune.cache import apply_fields, config_fields  # noqa: E402

#: A pick within this much of the measured best counts as right.
WITHIN = 1.03
LAYOUT = "tn"


# -- the sweep (GPU) ------------------------------------------------------------------------------------------

def load_shapes(sets: list[str]) -> list[tuple[int, int, int]]:
    data = json.loads((HERE / "shapes.json").read_text())
    shapes: list[tuple[int, int, int]] = []
    for name in sets:
        if name not in data or not isinstance(data[name], list):
            raise SystemExit(f"error: shapes.json has no set {name!r}")
        shapes += [tuple(s) for s in data[name] if len(s) == 3 and tuple(s) not in shapes]
    return shapes


def verify(pick: KernelConfig, winner: KernelConfig, m: int, n: int, k: int, rounds: int) -> tuple[float, float]:
    """The pick's and the winner's medians, timed again side by side on fresh operands (L2 flushed)."""
    from generator.runtime import compile_many
    from generator.tune.timing import (L2Flush, TimingSettings, calls_for, interleaved, make_operands, warm_up)

    settings = TimingSettings(rounds=rounds)
    pick_op, winner_op = compile_many([pick, winner], namespace="gemmgen")
    A, B, _ = make_operands(pick, Problem(m, n, k))
    flush = L2Flush(A.device)
    fns = [lambda: pick_op(A, B), lambda: winner_op(A, B)]
    calls = [calls_for(warm_up(fn, settings, flush), settings) for fn in fns]
    samples, _ = interleaved(fns, calls, settings, flush)
    return statistics.median(samples[0]), statistics.median(samples[1])


def sweep_one(family: str, dtype: str, shape: tuple[int, int, int], args: argparse.Namespace) -> dict[str, Any]:
    from generator import Gemm

    m, n, k = shape
    plan = Gemm(dtype, LAYOUT, family=family, m=m, n=n, k=k)
    pick = plan.estimate.config
    # measured afresh unless --use-cache: a cached answer keeps only the pick's and the winner's rows
    result = plan.tune(max_candidates=args.max_candidates, progress=not args.quiet, force=not args.use_cache)
    timed = [row for row in result.table if row.ms is not None]
    best = min(timed, key=lambda row: row.ms) if timed else None
    pick_ms = result.pick_ms
    best_name, best_ms = (best.config.name, best.ms) if best is not None else (result.winner.name, result.ms)
    if result.winner != pick and args.verify_rounds > 0:
        verified_pick, verified_winner = verify(pick, result.winner, m, n, k, args.verify_rounds)
    else:
        verified_pick = verified_winner = pick_ms
    return {
        "family": family, "dtype": dtype, "layout": LAYOUT, "m": m, "n": n, "k": k,
        "gpu": result.device.gpu, "sm_count": result.device.sm_count,
        "pick": pick.name, "pick_ms": pick_ms, "best": best_name, "best_ms": best_ms,
        "within_3pct": within(pick_ms, best_ms), "winner": result.winner.name, "tuned_gain": pick_ms / result.ms,
        "verified_pick_ms": verified_pick, "verified_best_ms": verified_winner,
        "verified_gain": verified_pick / verified_winner,
        "verified_within_3pct": within(verified_pick, verified_winner),
        "from_cache": result.from_cache,
        "candidates": [{"name": row.config.name, "config": config_fields(row.config), "ms": row.ms,
                        "note": row.note} for row in result.table],
    }


def within(pick_ms: float, best_ms: float) -> bool:
    """Whether the pick is within WITHIN of the best. Counted twice per shape: on the tuning run's times, and on the
    second, side-by-side timing of pick and winner. The first is biased: the fastest of 16 noisy medians is faster
    than that config's typical time, so a pick and a winner that re-time equal can read several per cent apart there."""
    return pick_ms <= WITHIN * best_ms


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def summarize(records: list[dict[str, Any]]) -> list[str]:
    lines = []
    groups = sorted({(r["family"], r["dtype"]) for r in records})
    for family, dtype in groups + [("all", "all")]:
        group = [r for r in records if family == "all" or (r["family"], r["dtype"]) == (family, dtype)]
        rows = [r for r in group if len(r["candidates"]) > 1]
        if not rows:
            continue
        by_run = sum(r["within_3pct"] for r in rows)
        retimed = sum(within(r["verified_pick_ms"], r["verified_best_ms"]) for r in rows)
        gains = [r["verified_gain"] for r in rows]
        worst = min(rows, key=lambda r: r["verified_gain"])
        lines.append(f"{family:5s} {dtype:5s}: pick within 3 % of the measured best in {by_run}/{len(rows)} "
                     f"({by_run / len(rows):.0%}) by the tuning run's times, {retimed}/{len(rows)} "
                     f"({retimed / len(rows):.0%}) re-timed side by side; tuned/untuned geomean {geomean(gains):.3f}x "
                     f"(tuning run "
                     f"{geomean([r['tuned_gain'] for r in rows]):.3f}x), slowest {worst['verified_gain']:.3f}x at "
                     f"{worst['m']}x{worst['n']}x{worst['k']}"
                     + (f" ({len(group) - len(rows)} shape(s) of one candidate apart)" if len(group) > len(rows)
                        else ""))
    return lines


def run_sweep(args: argparse.Namespace) -> int:
    os.environ["GEMMGEN_TUNED"] = "0"   # plans by the estimate; plan.tune() still tunes and records
    shapes = load_shapes(args.sets.split(",")) if not args.shapes else [
        tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    records: list[dict[str, Any]] = []
    start = time.monotonic()
    for family in args.families.split(","):
        for dtype in args.dtypes.split(","):
            for shape in shapes:
                record = sweep_one(family, dtype, shape, args)
                records.append(record)
                print(f"{family} {dtype} {shape[0]}x{shape[1]}x{shape[2]}: pick {record['pick']} "
                      f"{record['pick_ms']:.4f} ms, best {record['best']} {record['best_ms']:.4f} ms "
                      f"({'within' if record['within_3pct'] else 'NOT within'} 3 %), verified "
                      f"{record['verified_gain']:.3f}x", flush=True)
                write_json(args.json, records, start)   # after every shape: a cut-off run keeps what it measured
    for line in summarize(records):
        print(line)
    return 0


def write_json(path: str, records: list[dict[str, Any]], start: float) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"about": "benchmarks/calibrate.py: the estimate's pick against the measured "
                                               "best per shape (layout tn)", "within": WITHIN,
                                      "seconds": round(time.monotonic() - start, 1), "records": records}, indent=1))


# -- the fit (CPU) ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    """One constant of the cost model, read and written in place (the planner's modules hold them)."""

    name: str
    get: Callable[[], float]
    put: Callable[[float], None]
    low: float
    high: float


def _item(mapping: dict, key: Any, index: int | None = None) -> tuple[Callable[[], float], Callable[[float], None]]:
    def get() -> float:
        value = mapping[key]
        return value if index is None else value[index]

    def put(value: float) -> None:
        if index is None:
            mapping[key] = value
        else:
            old = mapping[key]
            mapping[key] = old[:index] + (value,) + old[index + 1:]
    return get, put


def _attr(module: Any, name: str) -> tuple[Callable[[], float], Callable[[float], None]]:
    return (lambda: getattr(module, name)), (lambda value: setattr(module, name, value))


def params(family: str) -> list[Param]:
    """The efficiencies the fit may move, with their bounds."""
    if family == "sm90":
        return [Param("sm90.L2_HALF_REUSE", *_attr(planner_sm90, "L2_HALF_REUSE"), 1.0, 256.0),
                Param("sm90.SMEM_HALF_REUSE", *_attr(planner_sm90, "SMEM_HALF_REUSE"), 0.5, 128.0),
                Param("sm90.ISSUE_EFFICIENCY[1]", *_item(planner_sm90.ISSUE_EFFICIENCY, 1), 0.1, 1.0),
                Param("sm90.CLUSTER_COUPLING", *_attr(planner_sm90, "CLUSTER_COUPLING"), 0.5, 1.0),
                Param("sm90.OVERHEAD_K['cooperative']", *_item(planner_sm90.OVERHEAD_K, "cooperative"), 0.0, 1024.0)]
    reference = (128, 256)   # 1.00 by definition: the others are relative to it
    hopper = planner_sm80.HOPPER_TILE_EFFICIENCY   # the sweeps ran on Hopper, where these override the table
    return [Param(f"sm80.HOPPER_TILE_EFFICIENCY[{bm}x{bn}]", *_item(hopper, (bm, bn)), 0.05, 1.5) if (bm, bn) in hopper
            else Param(f"sm80.SM80_TILES[{bm}x{bn}]", *_item(planner_sm80.SM80_TILES, (bm, bn), 2), 0.05, 1.5)
            for (bm, bn) in planner_sm80.SM80_TILES if (bm, bn) != reference]


@contextlib.contextmanager
def restored(ps: list[Param]) -> Iterator[None]:
    """The constants as they were, whatever the fit tried."""
    saved = [p.get() for p in ps]
    try:
        yield
    finally:
        for p, value in zip(ps, saved):
            p.put(value)


@dataclass
class Shape:
    """A record of the sweep as the fit needs it: its problem and its timed candidates' configs and times."""

    problem: Problem
    sm_count: int
    configs: list[KernelConfig]
    ms: list[float]

    @property
    def best(self) -> float:
        return min(self.ms)


def shapes_of(records: list[dict[str, Any]], family: str) -> list[Shape]:
    out = []
    for r in records:
        if r["family"] != family:
            continue
        base = KernelConfig(arch=90, dtype=DType(r["dtype"]), out_dtype=DType(r["dtype"]),
                            layout=parse_layout(r.get("layout", LAYOUT)), tile=(128, 128, 64), warps=None, stages=4,
                            raster_group=8)
        timed = [c for c in r["candidates"] if c.get("ms") is not None]
        if len(timed) < 2:
            continue
        configs = [apply_fields(base, c["config"]) for c in timed]
        out.append(Shape(Problem(r["m"], r["n"], r["k"]), int(r.get("sm_count", 132)), configs,
                         [float(c["ms"]) for c in timed]))
    return out


def score(shapes: list[Shape]) -> tuple[float, float]:
    """(fraction of shapes whose cheapest measured candidate by estimate is within 3 % of the best, minus the mean
    log of its time over the best): larger is better."""
    spec = arch_spec(90)
    hits, loss = 0, 0.0
    for s in shapes:
        costs = [estimate(cfg, spec, s.sm_count, s.problem).cost for cfg in s.configs]
        chosen = s.ms[costs.index(min(costs))]   # the first of equal costs: the planner's order of preference
        hits += chosen <= WITHIN * s.best
        loss += math.log(chosen / s.best)
    return (hits / len(shapes), -loss / len(shapes)) if shapes else (math.nan, math.nan)


STEPS = (0.25, 0.5, 0.67, 0.8, 0.9, 0.95, 1.05, 1.1, 1.25, 1.5, 2.0, 4.0)


def fit(shapes: list[Shape], ps: list[Param], sweeps: int = 6) -> tuple[dict[str, float], tuple[float, float],
                                                                      tuple[float, float]]:
    """Coordinate search over ``ps`` (multiplicative steps within the bounds, a change kept only where it improves
    the score). Returns the proposed values, the score before and after. The constants are restored."""
    with restored(ps):
        before = best = score(shapes)
        for _ in range(sweeps):
            improved = False
            for p in ps:
                current = p.get()
                for step in STEPS:
                    value = min(p.high, max(p.low, current * step if current else step - 1.0))
                    p.put(value)
                    trial = score(shapes)
                    if trial > best:
                        best, current, improved = trial, value, True
                    p.put(current)
            if not improved:
                break
        proposal = {p.name: p.get() for p in ps}
    return proposal, before, best


def run_fit(args: argparse.Namespace) -> int:
    records = [r for path in args.fit.split(",") for r in json.loads(Path(path).read_text())["records"]]
    report: dict[str, Any] = {}
    picked = [r for r in records if r.get("within_3pct") is not None]
    if picked:
        print(f"the planner's own pick within 3 % of the measured best: {sum(r['within_3pct'] for r in picked)}/"
              f"{len(picked)}")
    for family in sorted({r["family"] for r in records}):
        shapes = shapes_of(records, family)
        if not shapes:
            continue
        ps = params(family)
        current = {p.name: p.get() for p in ps}
        proposal, before, after = fit(shapes, ps, args.sweeps)
        print(f"{family}: the model's choice among the measured candidates within 3 % in {before[0]:.0%} of "
              f"{len(shapes)} shapes before the fit, {after[0]:.0%} after (mean loss {-before[1]:.2%} -> "
              f"{-after[1]:.2%}; in-sample)")
        for name, value in proposal.items():
            mark = "" if math.isclose(value, current[name]) else "   <- proposed"
            print(f"  {name}: {current[name]:.4g} -> {value:.4g}{mark}")
        report[family] = {"shapes": len(shapes), "before": before[0], "after": after[0], "loss_before": -before[1],
                          "loss_after": -after[1], "current": current, "proposed": proposal}
    if args.fit_json:
        Path(args.fit_json).write_text(json.dumps(report, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="sm90,sm80")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--sets", default="llm,square", help="sets of benchmarks/shapes.json (default: %(default)s)")
    ap.add_argument("--shapes", default=None, help="MxNxK,... instead of --sets")
    ap.add_argument("--max-candidates", type=int, default=16)
    ap.add_argument("--verify-rounds", type=int, default=5, help="0: no second, side-by-side timing of pick and winner")
    ap.add_argument("--use-cache", action="store_true",
                    help="take the tuning cache's winners where it has them (their other candidates are not kept)")
    ap.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "calibrate.json"))
    ap.add_argument("--fit", default=None, metavar="JSON[,JSON...]",
                    help="fit the model to the JSON of one or more sweeps instead (CPU)")
    ap.add_argument("--fit-json", default=None, metavar="FILE", help="write the fit's proposal here")
    ap.add_argument("--sweeps", type=int, default=6, help="coordinate-search passes of the fit")
    args = ap.parse_args(argv)
    return run_fit(args) if args.fit else run_sweep(args)


if __name__ == "__main__":
    sys.exit(main())
