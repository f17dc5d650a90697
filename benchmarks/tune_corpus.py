"""Tune the corpus' forward GEMMs on this GPU and write the winners as a dispatch table to ship
(generator/tune/shipped.py): per layer (N, K) of every corpus model and per M bucket bound, the fastest correct
kernel that plan.tune() finds around the planner's pick. An entry measured at m rows answers M in (m/2, m].

    python3 benchmarks/tune_corpus.py --out generator/tune/tables/h100.json
    python3 benchmarks/tune_corpus.py --tokens 128,256 --models llama3-8b --max-candidates 8 --out /tmp/t.json

bf16, layout tn (y = x @ W.t()), the M buckets' bounds of Gemm.compile_buckets by default, tuned token count by token
count in the order given. Each tuning run is also recorded in the user's tuning cache as usual; --out gets this run's
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
    ap.add_argument("--max-candidates", type=int, default=12)
    ap.add_argument("--budget-s", type=float, default=30.0, help="per GEMM, builds included")
    ap.add_argument("--out", required=True, help="the table file to write (JSON, the tuning export format)")
    ap.add_argument("--time-limit-s", type=float, default=None,
                    help="start no GEMM after this many seconds; the table then holds the GEMMs tuned so far")
    args = ap.parse_args(argv)

    import torch
    from generator import Gemm
    from generator.tune import Table, current_device
    from generator.tune.cache import bundle_json
    from generator.build import write_atomically

    if not torch.cuda.is_available():
        print("tune_corpus: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
        models = args.models.split(",") if args.models else None
        shapes = [s for t in tokens for s in corpus.forward_shapes(models, [t])]
    except ValueError as err:
        ap.error(str(err))
    device = current_device()
    print(f"{device.describe()}: {len(shapes)} GEMMs", flush=True)
    entries = {}
    start = time.perf_counter()
    for i, (m, n, k) in enumerate(shapes):
        if args.time_limit_s is not None and time.perf_counter() - start > args.time_limit_s:
            print(f"time limit: {len(shapes) - i} GEMMs left untuned (run the command again to go on)", flush=True)
            break
        plan = Gemm(args.dtype, "tn", m=m, n=n, k=k)
        result = plan.tune(max_candidates=args.max_candidates, budget_s=args.budget_s, progress=False)
        entry = replace(result.entry, table=())
        entries[entry.key.text] = entry
        print(f"[{i + 1}/{len(shapes)}] {m}x{n}x{k}: {result.winner.name} {result.ms * 1e3:.1f} us, pick "
              f"{result.pick.name} {result.pick_ms * 1e3:.1f} us ({100 * (result.pick_ms / result.ms - 1):+.1f} %)"
              f"{' (cached)' if result.from_cache else ''}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, json.dumps(bundle_json([Table(device, entries)]), indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(entries)} entries to {out} in {time.perf_counter() - start:.0f} s")
    return 0 if len(entries) == len(shapes) else 3


if __name__ == "__main__":
    sys.exit(main())
