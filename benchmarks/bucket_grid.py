"""How much an M-bucket grid costs, by the planner's cost model (no GPU): for each forward layer (N, K) of the corpus
of real models' layers and every ``--step``-th M up to ``--max-m``, the cost of the kernel a bucketed op runs (the plan
for the top of M's bucket; above the last bound, the plan for 4096 rows, as ``generator.nn.Linear`` plans a layer)
over the cost of the plan for that exact M. Also the distinct forward kernels a layer's op then holds.

    python3 benchmarks/bucket_grid.py                                   (the current grid against the old one)
    python3 benchmarks/bucket_grid.py --grid x2=64,128,256,512,1024,2048 --grid x1.5=64,128,192,256,384,512,768,1024

The model is the planner's, so this says where a grid leaves the planner's own picks behind, not what a GPU measures:
use it to choose the bounds, then measure the corpus on both grids (bench_corpus.py --buckets).
"""
from __future__ import annotations

import argparse
import math
import sys
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import corpus  # noqa: E402
from generator.gemm import M_BUCKETS  # noqa: E402
from generator.planner import Problem, estimate, plan  # noqa: E402
from generator.spec.arch import arch_spec  # noqa: E402
from generator.spec.types import parse_input_dtype, parse_layout  # noqa: E402

#: The rows nn.Linear's plan assumes without a hint: the kernel of every M above the last bound.
LARGE_M = 4096
OLD_GRID = (64, 128, 256, 512, 1024, 2048)


def grid_loss(bounds: tuple[int, ...], layers: list[tuple[int, int]], ms: list[int], *, dtype: str = "bf16",
              arch: int = 90) -> dict[str, float]:
    """The bucket's kernel against the exact plan over ``layers`` x ``ms``: geomean, p90 and max of the cost ratio,
    and the mean and max number of distinct forward kernels per layer."""
    spec, dt, layout = arch_spec(arch), parse_input_dtype(dtype), parse_layout("tn")

    @lru_cache(maxsize=None)
    def planned(m: int, n: int, k: int):
        return plan(dt, layout, arch, problem=Problem(m, n, k))

    def cost(cfg, m: int, n: int, k: int) -> float:
        return estimate(cfg, spec, spec.sm_count, Problem(m, n, k)).cost

    losses, kernels = [], []
    for n, k in layers:
        names = set()
        for m in ms:
            top = next((b for b in bounds if m <= b), LARGE_M)
            cfg = planned(top, n, k)
            names.add(cfg.name)
            losses.append(cost(cfg, m, n, k) / cost(planned(m, n, k), m, n, k))
        kernels.append(len(names))
    ordered = sorted(losses)
    return {"geomean": math.exp(sum(map(math.log, losses)) / len(losses)),
            "p90": ordered[int(0.9 * (len(ordered) - 1))], "max": ordered[-1],
            "kernels_mean": sum(kernels) / len(kernels), "kernels_max": max(kernels)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", action="append", default=[], metavar="NAME=B1,B2,...",
                    help="a grid to score (default: the old 2x grid and gemm.M_BUCKETS)")
    ap.add_argument("--step", type=int, default=32, help="score every step-th M")
    ap.add_argument("--max-m", type=int, default=4096)
    ap.add_argument("--models", default=None, help="comma list of corpus models (default: all)")
    args = ap.parse_args(argv)
    grids = {"old": OLD_GRID, "current": M_BUCKETS}
    if args.grid:
        grids = {}
        for text in args.grid:
            name, _, bounds = text.partition("=")
            grids[name] = tuple(int(b) for b in bounds.split(","))
    models = args.models.split(",") if args.models else None
    layers = sorted({(n, k) for _, n, k in corpus.forward_shapes(models, [args.step])})
    ms = list(range(args.step, args.max_m + 1, args.step))
    print(f"{len(layers)} layers x {len(ms)} row counts ({args.step}..{args.max_m}); cost of the bucket's kernel over "
          "the exact plan's, by the planner's model")
    for name, bounds in grids.items():
        r = grid_loss(bounds, layers, ms)
        print(f"{name:>10}: geomean {r['geomean']:.3f}  p90 {r['p90']:.3f}  max {r['max']:.3f}  "
              f"kernels/layer {r['kernels_mean']:.1f} (max {r['kernels_max']})  bounds {','.join(map(str, bounds))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
