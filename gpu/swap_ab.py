"""Swap-AB for few rows, measured before it is built in: D^T = W . x^T on the sm90 kernels, timed beside cuBLAS and
the planner's kernel for D = x . W^T in one run.

    python3 gpu/swap_ab.py [--shapes 32x8192x8192,64x8192x8192] [--json $OUT/swap_ab.json]

For x (M x K) and an nn.Linear weight W (N x K), x @ W.t() with M = 17-128 gives too few tiles along M: 8192 / 128
= 64 tiles of 64x128 leave half of the 132 SMs idle while W streams through the other half. The swapped problem
has N rows (W's), M columns (x's rows): W is A (K-major: layout 't'), x.t() is B (K-major too: 'n'), and D^T comes
out column-major, i.e. D row-major. Its 64-row tiles put W on twice the SMs. The candidates here are the planner's
pick for the swapped problem and a few fixed tiles; each result is checked against float32.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import torch  # noqa: E402

from bench import parse_shapes, timed_rounds  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime.op import compile_many  # noqa: E402

SHAPES = "32x8192x8192,64x8192x8192,128x8192x8192,32x4096x4096,64x4096x4096,128x4096x4096,128x4096x14336"
# (tile, schedule, cluster) for the swapped problem (N, M, K); None: the planner's choice
SWAPPED = [(None, None, None), ((64, 64, 64), "pingpong", (1, 1)), ((64, 128, 64), "pingpong", (1, 1)),
           ((64, 128, 64), "pingpong", (2, 1)), ((64, 64, 64), "pingpong", (2, 1)),
           ((128, 64, 64), "cooperative", (1, 1)), ((128, 128, 64), "cooperative", (1, 1))]


def swapped_plans(m: int, n: int, k: int) -> list[Gemm]:
    plans = []
    for tile, schedule, cluster in SWAPPED:
        try:
            plans.append(Gemm("bf16", "tn", layout_c="col", arch=90, m=n, n=m, k=k, tile_shape=tile,
                              schedule=schedule, cluster_shape=cluster))
        except ValueError as refused:
            print(f"  skip {tile} {schedule} {cluster} for {n}x{m}x{k}: {refused}")
    return list({p.name: p for p in plans}.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "swap_ab.json"))
    args = ap.parse_args()
    shapes = parse_shapes(args.shapes)
    direct = {s: Gemm("bf16", "tn", arch=90, m=s[0], n=s[1], k=s[2]) for s in shapes}
    swapped = {s: swapped_plans(*s) for s in shapes}
    configs = {p.config for p in direct.values()} | {p.config for plans in swapped.values() for p in plans}
    ops = {op.name: op for op in compile_many(list(configs), namespace="gemmgen_swap_ab")}
    rows = []
    for (m, n, k) in shapes:
        x = torch.randn(m, k, device="cuda").bfloat16()
        w = torch.randn(n, k, device="cuda").bfloat16()
        ref = x.float() @ w.float().t()
        calls = {"cublas": lambda: torch.matmul(x, w.t()),
                 "direct " + direct[(m, n, k)].name: (lambda op=ops[direct[(m, n, k)].name]: op(x, w.t()))}
        # the swapped op returns D^T (N x M, column-major): its .t() is D, row-major, no copy
        calls.update({"swapped " + p.name: (lambda op=ops[p.name]: op(w, x.t()).t()) for p in swapped[(m, n, k)]})
        times = timed_rounds(calls, args.rounds)
        flops = 2.0 * m * n * k
        print(f"{m}x{n}x{k}: cuBLAS {flops / times['cublas'] / 1e9:.1f} TFLOP/s")
        for name, fn in calls.items():
            out = fn()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert out.shape == (m, n) and out.is_contiguous(), (name, out.shape, out.stride())
            ratio = times["cublas"] / times[name]
            print(f"  {name:60s} {flops / times[name] / 1e9:7.1f}  x{ratio:.3f} cuBLAS  err {err:.1e}")
            rows.append(dict(m=m, n=n, k=k, kernel=name, ms=times[name], cublas_ms=times["cublas"],
                             vs_cublas=ratio, err=err))
    Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
