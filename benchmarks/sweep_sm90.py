"""Sweep sm90 configs on a few shapes next to torch.matmul: the measurements behind the sm90 planner's
model (generator/planner/sm90.py). By default each shape gets the planner's best candidates per
(tile, schedule), plus its own choice.

    python benchmarks/sweep_sm90.py --shapes 512x6144x4096,128x4096x4096 [--dtype bf16] [--top 10]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import DTYPES, bench_ms, operands, parse_shapes, tflops, warm_up_gpu  # noqa: E402

from generator import Gemm  # noqa: E402
from generator.spec.arch import ARCHS  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from generator.planner import Knobs, Problem  # noqa: E402
from generator.planner.sm90 import candidates, estimate  # noqa: E402
from generator.spec.types import DType, parse_layout  # noqa: E402


def ranked_candidates(dtype: str, layout: str, shape: tuple[int, int, int], top: int):
    """The planner's candidates for ``shape``, cheapest first, one per (tile, schedule, cluster)."""
    spec, problem = ARCHS[90], Problem(*shape)
    configs = candidates(DType(dtype), DType(dtype), parse_layout(layout), spec, Knobs(), problem, spec.sm_count)
    ranked = sorted((estimate(c, spec, spec.sm_count, problem) for c in configs), key=lambda e: e.cost)
    return [(e.config, e.cost) for e in ranked[:top]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="512x6144x4096,128x4096x4096,1024x1024x1024")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--layout", default="tn")
    parser.add_argument("--top", type=int, default=10, help="candidates per shape, by the model's cost")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per config (median)")
    parser.add_argument("--json", default=str(Path(os.environ.get("OUT", ".")) / "sweep_sm90.json"))
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    shapes = parse_shapes(args.shapes)
    per_shape = {s: ranked_candidates(args.dtype, args.layout, s, args.top) for s in shapes}
    chosen = {s: Gemm(dtype=args.dtype, layout=args.layout, arch=90, m=s[0], n=s[1], k=s[2]).name for s in shapes}
    configs = {c.name: c for ranked in per_shape.values() for c, _ in ranked}
    ops = dict(zip(configs, compile_many(list(configs.values()), namespace="gemmgen")))
    warm_up_gpu()
    rows = []
    for shape, ranked in per_shape.items():
        m, n, k = shape
        a, b = operands(args.layout, m, n, k, DTYPES[args.dtype])
        ref = a.float() @ b.float()
        cublas = tflops(m, n, k, statistics.median([bench_ms(lambda: torch.matmul(a, b)) for _ in range(args.rounds)]))
        print(f"{m}x{n}x{k} {args.dtype} {args.layout}: cuBLAS {cublas:.1f} TFLOP/s; planner: {chosen[shape]}")
        # Rounds in rotated order, median per config: single do_bench medians of one config move by
        # 10-20 % between neighbouring measurements on small shapes, which is the size of the differences.
        times: dict[str, list[float]] = {cfg.name: [] for cfg, _ in ranked}
        for r in range(args.rounds):
            for cfg, _ in ranked[r % len(ranked):] + ranked[:r % len(ranked)]:
                op = ops[cfg.name]
                times[cfg.name].append(bench_ms(lambda: op(a, b)))
        for cfg, cost in ranked:
            op = ops[cfg.name]
            d = op(a, b)
            err = ((d.float() - ref).norm() / ref.norm()).item()
            ours = tflops(m, n, k, statistics.median(times[cfg.name]))
            rows.append({"shape": list(shape), "kernel": cfg.name, "model_cost": cost, "tflops": ours,
                         "cublas_tflops": cublas, "ratio": ours / cublas, "rel_error": err,
                         "planner_choice": cfg.name == chosen[shape]})
            mark = "*" if cfg.name == chosen[shape] else " "
            print(f" {mark}{cfg.name:45s} model {cost / 1e9:7.3f}  {ours:7.1f} TFLOP/s  {ours / cublas:6.3f}x  "
                  f"err {err:.1e}", flush=True)
    Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
