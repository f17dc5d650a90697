"""Quantize-on-store against the two-step way: one kernel writing D in fp8 with its 1x128 block scales
(``Gemm(..., out_dtype="e4m3")``) beside our same kernel writing bf16, that bf16 GEMM followed by
``generator.quantize(D, "e4m3", scale="block")``, and torch.matmul (cuBLAS) followed by the same quantize: the
issue's targets are >= 1.3x the two-step time and within 5 % of the bf16 GEMM. Each row also checks that the fused
result equals quantize() of the bf16 one bit for bit. The same kernel with ``amax=True`` (the amax of D too) is
timed beside it, its amax checked against the bf16 result's. do_bench medians over --rounds interleaved rounds.

    python3 benchmarks/bench_quantized_out.py [--shapes 4096x14336x4096,...] [--rounds 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import parse_shapes  # noqa: E402
from generator import Gemm, quantize  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from generator.spec.types import DType  # noqa: E402

#: A Llama MLP's up (and gate) projection at 4096 and 512 tokens, its down projection, a square one, a DeepSeek-V3
#: shaped one (the fp8 MLP's layers): the activation the next fp8 GEMM reads.
SHAPES = "4096x14336x4096,512x14336x4096,4096x4096x14336,8192x8192x8192,4096x7168x2048,2048x4096x4096"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    shapes = parse_shapes(args.shapes)
    fused = [Gemm("bf16", "tn", out_dtype="e4m3", m=m, n=n, k=k).config for m, n, k in shapes]
    plain = [dataclasses.replace(cfg, out_dtype=DType.bf16) for cfg in fused]   # the same kernel writing bf16
    with_amax = [dataclasses.replace(cfg, amax=True) for cfg in fused]          # and the amax of D too
    ops = compile_many(fused + plain + with_amax, namespace="gemmgen_bench_quantized_out")
    rows, ok = [], True
    for i, (m, n, k) in enumerate(shapes):
        op, op_bf16, op_amax = ops[i], ops[len(shapes) + i], ops[2 * len(shapes) + i]
        a = torch.randn(m, k, device="cuda").bfloat16()
        b = torch.randn(n, k, device="cuda").bfloat16().t()
        q, s = op(a, b)
        d_bf16 = op_bf16(a, b)
        want_q, want_s = quantize(d_bf16, "e4m3", scale="block")
        exact = torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s)
        exact &= op_amax(a, b)[2].item() == d_bf16.float().abs().amax().item()
        ok &= exact
        calls = {"fused": lambda: op(a, b), "fused+amax": lambda: op_amax(a, b), "bf16": lambda: op_bf16(a, b),
                 "bf16+quantize": lambda: quantize(op_bf16(a, b), "e4m3", scale="block"),
                 "cublas+quantize": lambda: quantize(a @ b, "e4m3", scale="block")}
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                times[name].append(do_bench(call, warmup=25, rep=100))
        ms = {name: statistics.median(t) for name, t in times.items()}
        row = {"m": m, "n": n, "k": k, "ms": ms, "kernel": op.name, "bit_exact": exact,
               "speedup_over_two_step": ms["bf16+quantize"] / ms["fused"],
               "speedup_over_cublas_two_step": ms["cublas+quantize"] / ms["fused"],
               "time_over_bf16_gemm": ms["fused"] / ms["bf16"],
               "amax_time_over_fused": ms["fused+amax"] / ms["fused"],
               "tflops_fused": 2.0 * m * n * k / ms["fused"] / 1e9}
        rows.append(row)
        print(f"{m}x{n}x{k:<6d} fused {ms['fused']:.4f} ms ({row['tflops_fused']:.0f} TFLOP/s)  bf16 {ms['bf16']:.4f}  "
              f"bf16+quantize {ms['bf16+quantize']:.4f}  cuBLAS+quantize {ms['cublas+quantize']:.4f}  "
              f"-> {row['speedup_over_two_step']:.2f}x two-step, {row['speedup_over_cublas_two_step']:.2f}x cuBLAS "
              f"two-step, {row['time_over_bf16_gemm']:.3f}x bf16 time, amax {row['amax_time_over_fused']:.3f}x fused "
              f"time  exact {exact}  {op.name}", flush=True)
    if args.json:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": args.rounds}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    if not ok:
        print("some rows are not bit for bit quantize() of the bf16 result (or their amax not the bf16 result's)",
              file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
