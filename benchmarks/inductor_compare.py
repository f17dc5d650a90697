"""Our planned kernel next to torch.matmul (cuBLAS) and torch.compile(mode="max-autotune-no-cudagraphs"),
measured side by side in one run; also prints which kernel Inductor's autotuning picked and why.

    python benchmarks/inductor_compare.py [--shapes 4096x4096x4096,8192x8192x8192] [--dtypes bf16,fp16]
                                          [--rounds 3] [--json out.json]

Issue 5's goal is to beat max-autotune on the squares (1.03-1.06x torch.matmul on the H100,
../shared/bench/h100_inductor_max_autotune_anchor.json); this script shows where we stand against it and
what it runs. Layout "tn" (x @ W.t(), nn.Linear's), times are do_bench medians over interleaved rounds.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import DTYPES, operands, parse_shapes, tflops, timed_rounds, warm_up_gpu  # noqa: E402
from generator import Gemm  # noqa: E402


def compiled_matmul():
    import torch._inductor.config as inductor_config

    inductor_config.max_autotune_gemm_backends = "ATEN,TRITON"
    return torch.compile(lambda a, b: a @ b, mode="max-autotune-no-cudagraphs", dynamic=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x4096x4096,8192x8192x8192")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    rows = []
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        for m, n, k in shapes:
            op = Gemm(dtype=dtype, layout="tn", m=m, n=n, k=k).compile()
            a, b = operands("tn", m, n, k, dtype)
            inductor = compiled_matmul()
            start = time.perf_counter()
            d_inductor = inductor(a, b)  # compiles and autotunes; Inductor prints its AUTOTUNE table
            compile_s = time.perf_counter() - start
            ref = a.float() @ b.float()
            errors = {name: ((d.float() - ref).norm() / ref.norm()).item()
                      for name, d in (("ours", op(a, b)), ("inductor", d_inductor))}
            warm_up_gpu()
            ms = timed_rounds({"ours": lambda: op(a, b), "cublas": lambda: torch.matmul(a, b),
                               "inductor": lambda: inductor(a, b)}, args.rounds)
            row = {"shape": [m, n, k], "dtype": dname, "kernel": op.name, "compile_s": round(compile_s, 1),
                   **{f"{name}_tflops": round(tflops(m, n, k, t), 1) for name, t in ms.items()},
                   "ours_vs_cublas": round(ms["cublas"] / ms["ours"], 3),
                   "inductor_vs_cublas": round(ms["cublas"] / ms["inductor"], 3),
                   "ours_vs_inductor": round(ms["inductor"] / ms["ours"], 3), "rel_err": errors}
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch._dynamo.reset()
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
