"""Sweep explicit configs on a few shapes (the data behind the planner's tables), next to torch.matmul.

    python benchmarks/sweep.py [--shapes 4096x4096x4096,8192x8192x8192] [--dtype bf16] [--layout tn]
                               [--variants large|small]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import DTYPES, bench_ms, operands, parse_shapes, tflops  # noqa: E402

from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

# (tile, warps, stages, raster_group)
VARIANTS = [
    ((128, 256, 32), (2, 4), 3, 8),
    ((128, 256, 32), (2, 4), 4, 8),
    ((128, 256, 32), (2, 4), 5, 8),
    ((128, 256, 32), (2, 4), 4, 16),
    ((256, 128, 32), (4, 2), 4, 8),
    ((128, 256, 64), (2, 4), 3, 8),
    ((128, 256, 64), (2, 4), 4, 8),
    ((256, 128, 64), (4, 2), 3, 8),
    ((128, 128, 32), (2, 2), 4, 8),
    ((128, 128, 64), (2, 2), 3, 8),
    ((128, 128, 64), (2, 2), 4, 8),
    ((128, 128, 32), (2, 4), 4, 8),
]
# The tiles the planner weighs for small M or small problems (its SM80_TILES), BK 32 and 64.
SMALL_VARIANTS = [
    ((64, 64, 32), (2, 2), 4, 8),
    ((64, 64, 64), (2, 2), 4, 8),
    ((64, 128, 32), (2, 2), 4, 8),
    ((64, 128, 64), (2, 2), 3, 8),
    ((64, 128, 64), (2, 2), 4, 8),
    ((128, 64, 32), (2, 2), 4, 8),
    ((128, 64, 64), (2, 2), 4, 8),
    ((128, 128, 32), (2, 4), 4, 8),
    ((128, 128, 32), (2, 2), 4, 8),
    ((128, 256, 32), (2, 4), 4, 8),
    ((64, 256, 32), (1, 4), 4, 8),
]
VARIANT_SETS = {"large": VARIANTS, "small": SMALL_VARIANTS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="4096x4096x4096,8192x8192x8192")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--layout", default="tn")
    parser.add_argument("--variants", default="large", choices=sorted(VARIANT_SETS),
                        help="large: the big tiles of the square shapes; small: the tiles weighed for small M")
    parser.add_argument("--json", default=str(Path(os.environ.get("OUT", ".")) / "sweep.json"))
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    plans = []
    for tile, warps, stages, group in VARIANT_SETS[args.variants]:
        try:
            plans.append(Gemm(dtype=args.dtype, layout=args.layout, tile_shape=tile, warps=warps, stages=stages,
                              raster_group=group, family="sm80"))  # an sm80 sweep, also on Hopper
        except ValueError as err:
            print(f"skip {tile} {warps} s{stages}: {err}")
    ops = compile_many([p.config for p in plans], namespace="gemmgen")
    rows = []
    for m, n, k in parse_shapes(args.shapes):
        planned = Gemm(dtype=args.dtype, layout=args.layout, family="sm80", m=m, n=n, k=k).name
        print(f"planner's choice for {m}x{n}x{k}: {planned}")
        a, b = operands(args.layout, m, n, k, DTYPES[args.dtype])
        ref = a.float() @ b.float()
        cublas = tflops(m, n, k, bench_ms(lambda: torch.matmul(a, b)))
        print(f"{m}x{n}x{k} {args.dtype} {args.layout}: cuBLAS {cublas:.1f} TFLOP/s")
        for op in ops:
            d = op(a, b)
            err = ((d.float() - ref).norm() / ref.norm()).item()
            ours = tflops(m, n, k, bench_ms(lambda: op(a, b)))
            rows.append({"shape": [m, n, k], "kernel": op.name, "tflops": ours, "cublas_tflops": cublas,
                         "ratio": ours / cublas, "rel_error": err})
            print(f"  {op.name:45s} {ours:7.1f} TFLOP/s  {ours / cublas:6.3f}x  err {err:.1e}", flush=True)
    Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
