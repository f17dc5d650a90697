"""Run one planned kernel a few times on one shape, for ncu:
    ncu --launch-skip 3 --launch-count 1 -k regex:sm90 python3 gpu/ncu_kernel.py --schedule pingpong --cluster 1x1
    ncu --launch-skip 3 --launch-count 1 -k regex:sm80 python3 gpu/ncu_kernel.py --family sm80 --tile 128x256x32
    ncu --launch-skip 3 --launch-count 1 -k regex:nvjet python3 gpu/ncu_kernel.py --cublas   (torch.matmul, same data)
    ncu --launch-skip 3 --launch-count 1 -k regex:sm90 python3 gpu/ncu_kernel.py --dtype e4m3 --scale block
    ncu --launch-skip 3 --launch-count 1 -k regex:nvjet python3 gpu/ncu_kernel.py --scale tensor --cublas   (_scaled_mm)
    ncu --launch-skip 3 --launch-count 1 -k regex:sm90 python3 gpu/ncu_kernel.py --dtype fp32 --layout nt   (tf32)
    ncu --launch-skip 3 --launch-count 1 -k regex:sm90 python3 gpu/ncu_kernel.py --shape 256x512x7168 \
        --tile 128x64x64 --cluster 1x1 --stream-k   (split-K)
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench import DTYPES, operands, parse_shapes  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="4096x4096x4096")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--layout", default="tn")
    parser.add_argument("--tile", default=None)
    parser.add_argument("--warps", default=None)
    parser.add_argument("--stages", type=int, default=None)
    parser.add_argument("--family", default=None, choices=["sm80", "sm90"])
    parser.add_argument("--schedule", default=None)
    parser.add_argument("--cluster", default=None)
    parser.add_argument("--raster", default=None)
    parser.add_argument("--activation", default=None, help="a fused epilogue activation (no operands), e.g. gelu_tanh")
    parser.add_argument("--stream-k", action="store_true", help="the plan with stream-K / split-K on")
    parser.add_argument("--cublas", action="store_true", help="run torch.matmul on the same operands instead")
    parser.add_argument("--scale", default=None, choices=["tensor", "row", "block"],
                        help="fp8 (--dtype e4m3, layout tn): quantized operands with scales of this mode")
    args = parser.parse_args()
    (m, n, k), = parse_shapes(args.shape)
    if args.scale:
        run_fp8(args, m, n, k)
        return
    # bench.py's operands: strided as --layout says (the plan refuses others), so --cublas sees the same.
    a, b = operands(args.layout, m, n, k, {"fp32": torch.float32, **DTYPES}[args.dtype])
    torch.backends.cuda.matmul.allow_tf32 = True   # fp32: cuBLAS in tf32, as the plan (dtype fp32 plans tf32)
    if args.cublas:
        for _ in range(5):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        print("torch.matmul")
        return
    plan = Gemm(dtype=args.dtype, layout=args.layout, m=m, n=n, k=k, tile_shape=args.tile, warps=args.warps,
                stages=args.stages, family=args.family, schedule=args.schedule, cluster_shape=args.cluster,
                raster=args.raster, activation=args.activation)
    if args.stream_k:
        op = compile_many([replace(plan.config, stream_k=True)], namespace="gemmgen_ncu")[0]
    else:
        op = plan.compile()
    for _ in range(5):
        op(a, b)
    torch.cuda.synchronize()
    print(op.name)


def run_fp8(args: argparse.Namespace, m: int, n: int, k: int) -> None:
    """The planned fp8 kernel with scales (bench_dtypes' operands: quantized x and W, their scales); with --cublas
    torch._scaled_mm on the same operands (per tensor, per row, or blockwise 1x128 x 128x128 on cuBLAS >= 12.9)."""
    from bench_dtypes import fp8_case
    plan = Gemm("e4m3", "tn", out_dtype="bf16", scale=args.scale, m=m, n=n, k=k, tile_shape=args.tile,
                stages=args.stages, schedule=args.schedule, cluster_shape=args.cluster)
    case = fp8_case(f"fp8_{args.scale}", plan, m, n, k)
    if args.cublas:
        if not case.baselines:
            raise SystemExit(f"--cublas: torch has no fp8 kernel with {args.scale} scales")
        name, theirs = next(iter(case.baselines.items()))   # (per tensor: without use_fast_accum)
        for _ in range(5):
            theirs()
        torch.cuda.synchronize()
        print(name)
        return
    op = plan.compile()
    for _ in range(5):
        op(*case.args)
    torch.cuda.synchronize()
    print(plan.name)


if __name__ == "__main__":
    main()
