"""Tune the corpus' forward GEMMs on this GPU and write the winners as a dispatch table to ship
(generator/tune/shipped.py): per layer (N, K) of every corpus model and per M bucket bound, the fastest correct
kernel that plan.tune() finds around the planner's pick. An entry measured at m rows answers M in (m/2, m].

    python3 benchmarks/tune_corpus.py --out generator/tune/tables/h100.json
    python3 benchmarks/tune_corpus.py --tokens 128,256 --models llama3-8b --max-candidates 8 --out /tmp/t.json
    python3 benchmarks/tune_corpus.py --passes dX,dW --tokens 256,512 --out /tmp/bwd.json

--passes dX,dW tunes the backward GEMMs the JIT ops choose for those rows (``planner.backward.gradient_requests``: dX
is M x K x N in layout tt, dW its transpose N x K x M in layout tn on the sm90 16-bit kernels): an op whose
forward is planned for m rows plans its backward for m rows (an M bucket's bound), and ``tune.tuned_plan`` looks
these entries up by the gradient's own request and problem.

bf16, layout tn (y = x @ W.t()), the M buckets' bounds of Gemm.compile_buckets by default, tuned token count by token
count in the order given.

An entry answers a band of rows, but is measured at its top: a winner at 512 rows (4 rows of 128-row tiles) can lose at
384 (3 rows), where the waves differ. So a winner other than the planner's pick is timed again beside the pick inside
its band (at 5/8 and 3/4 of its rows, --interior) and goes into the table only where it is no slower there than the pick
by more than --interior-tolerance; else the band keeps the estimate. --report records every such check (JSON).

Each tuning run is also recorded in the user's tuning cache as usual; --out gets this run's
winners only, without the per-candidate rows. --time-limit-s stops starting new GEMMs after that many seconds and writes
what was tuned: run the same command again (the same tuning cache) and the tuned GEMMs come from the cache at once.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import corpus  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from generator.gemm import M_BUCKETS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help="comma list (default: all)")
    ap.add_argument("--tokens", default=",".join(map(str, M_BUCKETS)), help="the rows each layer is tuned at")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--passes", default="fwd", help="comma list of fwd, dX, dW: the GEMMs tuned for each row")
    ap.add_argument("--max-candidates", type=int, default=12)
    ap.add_argument("--budget-s", type=float, default=30.0, help="per GEMM, builds included")
    ap.add_argument("--out", required=True, help="the table file to write (JSON, the tuning export format)")
    ap.add_argument("--interior", default="0.625,0.75",
                    help="fractions of an entry's rows where a winner other than the pick is checked against it")
    ap.add_argument("--interior-tolerance", type=float, default=0.01,
                    help="how much slower than the pick a winner may be at an interior row count and be kept")
    ap.add_argument("--report", default=None, help="JSON of the interior checks (read first: a rerun reuses them)")
    ap.add_argument("--time-limit-s", type=float, default=None,
                    help="start no GEMM after this many seconds; the table then holds the GEMMs tuned so far")
    args = ap.parse_args(argv)

    import torch
    from generator import Gemm
    from generator.tune import Table, current_device
    from generator.tune.cache import bundle_json
    from generator.toolchain import write_atomically

    if not torch.cuda.is_available():
        print("tune_corpus: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
        models = args.models.split(",") if args.models else None
        shapes = [s for t in tokens for s in corpus.forward_shapes(models, [t])]
        passes = [x for x in args.passes.split(",") if x]
        if not passes or set(passes) - set(PASSES):
            raise ValueError(f"--passes {args.passes!r}: give a comma list of {', '.join(PASSES)}")
    except ValueError as err:
        ap.error(str(err))
    device = current_device()
    gemms = pass_plans(shapes, passes, args.dtype)
    print(f"{device.describe()}: {len(gemms)} GEMMs", flush=True)
    fractions = [float(f) for f in args.interior.split(",") if f]
    report_path = Path(args.report) if args.report else None
    checks = json.loads(report_path.read_text()) if report_path and report_path.exists() else {}
    entries = {}
    tuned = 0
    start = time.perf_counter()
    prebuild([plan for _, plan in gemms], args.max_candidates)
    for i, (what, plan) in enumerate(gemms):
        if args.time_limit_s is not None and time.perf_counter() - start > args.time_limit_s:
            print(f"time limit: {len(gemms) - i} GEMMs left untuned (run the command again to go on)", flush=True)
            break
        m, n, k = plan.problem.m, plan.problem.n, plan.problem.k
        result = plan.tune(max_candidates=args.max_candidates, budget_s=args.budget_s, progress=False)
        entry = replace(result.entry, table=())
        tuned += 1
        print(f"[{i + 1}/{len(gemms)}] {what}{m}x{n}x{k}: {result.winner.name} {result.ms * 1e3:.1f} us, pick "
              f"{result.pick.name} {result.pick_ms * 1e3:.1f} us ({100 * (result.pick_ms / result.ms - 1):+.1f} %)"
              f"{' (cached)' if result.from_cache else ''}", flush=True)
        if result.winner.name != result.pick.name:
            check = checks.get(entry.key.text) or interior_check(result, fractions, args.interior_tolerance)
            checks[entry.key.text] = check
            print(f"    inside the band: {check['summary']}", flush=True)
            if not check["kept"]:
                continue
        entries[entry.key.text] = entry
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, json.dumps(bundle_json([Table(device, entries)]), indent=1, sort_keys=True) + "\n")
    if report_path:
        write_atomically(report_path, json.dumps(checks, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(entries)} entries to {out} in {time.perf_counter() - start:.0f} s "
          f"({sum(not c['kept'] for c in checks.values())} winners dropped for losing inside their band)")
    return 0 if tuned == len(gemms) else 3


PASSES = ("fwd", "dX", "dW")


def pass_plans(shapes: list[tuple[int, int, int]], passes: list[str], dtype: str,
               arch: int | None = None) -> list[tuple[str, object]]:
    """(label, plan) of each distinct GEMM to tune: the forward y = x @ W.t() of each shape, and the gradients' GEMMs
    the op of that forward chooses its backward kernels for (``gradient_requests`` with a row-major dY). The label
    prefixes the log line ("" for the forward, "dX tt " for instance). ``arch`` None: the visible GPU's."""
    from generator import Gemm
    from generator.planner.backward import gradient_requests
    from generator.spec.types import Order

    gemms: dict[tuple, tuple[str, object]] = {}
    for m, n, k in shapes:
        forward = Gemm(dtype, "tn", arch=arch, m=m, n=n, k=k)
        if "fwd" in passes:
            gemms.setdefault(("tn", m, n, k), ("", forward))
        for what, request in zip(("dX", "dW"), gradient_requests(forward.config, Order.row, forward.problem)):
            if what in passes:
                p, layout = request.problem, request.layout
                gemms.setdefault((layout.tag, p.m, p.n, p.k), (
                    f"{what} {layout.tag} ", Gemm(dtype, layout, arch=arch, m=p.m, n=p.n, k=p.k, out_dtype=request.out_dtype)))
    return list(gemms.values())


def prebuild(plans: list, max_candidates: int) -> None:
    """Build every candidate of every plan in one parallel run before any is timed: tune() builds each GEMM's
    candidates as a batch of its own, which waits for its slowest kernel while the other cores idle."""
    from generator.gemm import _space
    from generator.spec.config import SMALL_M_MAX_ROWS
    from generator.tune import candidates
    from generator.tune.measure import build_all

    t0 = time.perf_counter()
    configs = {}
    for plan in plans:
        problem = plan.problem
        if problem.m > SMALL_M_MAX_ROWS:   # at most 16 rows the pick is the only candidate
            for cfg in candidates(_space(plan._request), problem, plan.estimate.config, max_candidates):
                configs[cfg.name] = cfg
    built, error = build_all(list(configs.values()), progress=False)
    print(f"built {len(built)} of {len(configs)} candidate kernels in {time.perf_counter() - t0:.0f} s"
          + (f" (failed: {error.splitlines()[0]})" if error else ""), flush=True)


def interior_check(result, fractions: list[float], tolerance: float) -> dict:
    """The winner against the pick at row counts inside the entry's band, side by side: kept where the winner is no
    slower than the pick by more than ``tolerance`` at every one of them."""
    from generator.planner import Problem
    from generator.tune.measure import measure

    p = result.problem
    times = {}
    for fraction in fractions:
        m = max(1, round(p.m * fraction))
        rows, _, _ = measure([result.pick, result.winner], Problem(m, p.n, p.k, p.batch), namespace="gemmgen",
                             deadline=None, progress=False)
        pick_ms, winner_ms = (row.ms for row in rows)
        times[m] = (pick_ms, winner_ms)
    kept = all(w is not None and pk is not None and w <= pk * (1 + tolerance) for pk, w in times.values())
    summary = ", ".join(f"{m} rows {pk * 1e3:.1f} -> {w * 1e3:.1f} us" if pk and w else f"{m} rows: not timed"
                        for m, (pk, w) in times.items())
    return {"m": p.m, "n": p.n, "k": p.k, "pick": result.pick.name, "winner": result.winner.name,
            "gain_at_m": result.pick_ms / result.ms, "interior": {str(m): t for m, t in times.items()},
            "kept": kept, "summary": summary + ("" if kept else ": dropped")}


if __name__ == "__main__":
    sys.exit(main())
