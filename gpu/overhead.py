"""Where the time of a small GEMM goes: the JIT op (the JIT runtime's C++ checks and autograd kernel, also
recording a graph node, and its Python path: checks + ctypes), the emitted op (the same C++ checks), the
kernel library called directly, the M-bucketed op (runtime.BucketedOp, as generator.nn.Linear holds), and the
kernel alone (CUDA graph replay), next to torch.matmul. Writes
$OUT/overhead.json.

    python3 gpu/overhead.py
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench, do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from generator import Gemm, emit  # noqa: E402
from generator.runtime import leading_dim  # noqa: E402
from generator.runtime.op import Problem  # noqa: E402

OUT = Path(os.environ.get("OUT", "."))
SHAPES = [(128, 128, 64), (1024, 1024, 1024), (128, 4096, 4096), (512, 4096, 4096), (2048, 2048, 2048)]


def host_us(fn, n=2000) -> float:
    """Host time per call without waiting for the GPU (the launch path's own cost)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def main() -> None:
    plans = [Gemm(dtype="bf16", layout="tn", m=m, n=n, k=k) for m, n, k in SHAPES]
    root = Path("/tmp/overhead_pkg")
    names = [f"g{i}" for i in range(len(plans))]
    pkg = emit(plans, name="gg_overhead", out=root / "src", op_names=names)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--target",
                        str(root / "site"), str(pkg)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    sys.path.insert(0, str(root / "site"))
    import gg_overhead

    # The M-bucketed op generator.nn.Linear holds (a kernel per bucket of M, picked per call on the host).
    bucketed = {(n, k): Gemm(dtype="bf16", layout="tn", n=n, k=k).compile_buckets() for _, n, k in SHAPES}
    rows = []
    for (m, n, k), plan, name in zip(SHAPES, plans, names):
        op = plan.compile()
        emitted = getattr(gg_overhead, name)
        a = torch.randn(m, k, device="cuda").bfloat16()
        b = torch.randn(n, k, device="cuda").bfloat16().t()
        d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        problem = Problem(m, n, k, leading_dim(a, plan.layout.a), leading_dim(b, plan.layout.b))
        args = op._args(a, b, d, problem, n)
        launch = op.library.launch
        # The stream is looked up per call: do_bench_cudagraph captures on a stream of its own, and a
        # launch on a stream fixed beforehand would run outside the graph (and time nothing).
        raw = lambda: launch(ctypes.byref(args), torch.cuda.current_stream().cuda_stream)  # noqa: E731
        assert torch.equal(op(a, b), emitted(a, b))
        assert op.cpp_kernel and op.cpp_autograd, "the JIT runtime did not load: the jit op column would time Python"
        a_grad = a.detach().requires_grad_()
        calls = {"torch.matmul": lambda: torch.matmul(a, b), "jit op": lambda: op(a, b),
                 # a forward that records the autograd node (training)
                 "jit op, A requires grad": lambda: op(a_grad, b),
                 # the Python path that serves when the JIT runtime is missing (checks + ctypes, no dispatcher)
                 "jit python path": lambda: op.run(a, b, (), None),
                 "emitted op": lambda: emitted(a, b), "emitted .out": lambda: emitted(a, b, out=d),
                 "bucketed op": lambda: bucketed[(n, k)](a, b),
                 # the op the bucketed op picks for this M, called directly: the bucketing layer's own cost is the
                 # difference
                 "bucket's op": lambda: bucketed[(n, k)].select(m)(a, b),
                 "library launch": raw}
        picked = bucketed[(n, k)].select(m)
        row = {"m": m, "n": n, "k": k, "kernel": plan.name, "bucket kernel": picked.name,
               "bucket cpp_kernel": picked.cpp_kernel}
        for label, fn in calls.items():
            row[f"{label} ms"] = do_bench(fn, warmup=25, rep=100, return_mode="median")
            row[f"{label} host us"] = host_us(fn)
        row["kernel alone (graph) ms"] = do_bench_cudagraph(raw, rep=100, return_mode="median")
        row["cuBLAS alone (graph) ms"] = do_bench_cudagraph(lambda: torch.matmul(a, b), rep=100, return_mode="median")
        rows.append(row)
        print(json.dumps(row), flush=True)
    (OUT / "overhead.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
