"""Quickstart: plan a bf16 "tn" GEMM (torch's x @ W.t()), build it, run it, check it, time it.

    pip install -e . && python examples/quickstart.py

With a CUDA GPU: plans for that GPU, builds the kernel (cached after the first time), runs a
4096 x 4096 x 4096 bf16 GEMM, checks it against torch.matmul in float32 and prints TFLOP/s next to
torch.matmul (cuBLAS). Without one: plans for sm_90 (H100), renders the kernel, compiles it with nvcc
and prints ptxas's register and spill report, then says what it skipped and why.
Exit status: 0 on success (also when steps were skipped), 1 when the GPU result is wrong.
"""
from __future__ import annotations

import statistics
import sys
import time

try:
    import torch
except ImportError:  # planning and rendering do not need torch
    torch = None

from generator import Gemm

M = N = K = 4096
REL_ERROR_BOUND = 1e-2  # bf16 inputs, fp32 accumulation


def median_ms(fn, warmup: int = 5, iters: int = 20) -> float:
    """Median time of fn() in milliseconds, each call timed with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_on_gpu() -> int:
    plan = Gemm(dtype=torch.bfloat16, layout="tn", m=M, n=N, k=K)  # arch=None: this GPU
    print(plan, "\n")
    t0 = time.perf_counter()
    op = plan.compile()
    print(f"compiled in {time.perf_counter() - t0:.1f} s: {op}  (also torch.ops.gemmgen.{plan.name})\n")

    # layout "tn": A (M, K) row-major; B (K, N) column-major, i.e. the transpose of a contiguous (N, K) W.
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    W = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    B = W.t()
    D = op(A, B)
    ref = torch.matmul(A.float(), B.float())
    rel = ((D.float() - ref).norm() / ref.norm()).item()
    ok = rel < REL_ERROR_BOUND
    print(f"relative error vs torch.matmul in float32: {rel:.2e} (bound {REL_ERROR_BOUND:.0e}) "
          f"{'OK' if ok else 'FAILED'}")

    flops = 2.0 * M * N * K
    ours = median_ms(lambda: op(A, B))
    cublas = median_ms(lambda: torch.matmul(A, B))
    print(f"\n{M}x{N}x{K} bf16, median of 20 after warmup ({torch.cuda.get_device_name()}):")
    print(f"  {'gemmgen':<24} {ours:8.3f} ms  {flops / ours / 1e9:7.1f} TFLOP/s")
    print(f"  {'torch.matmul (cuBLAS)':<24} {cublas:8.3f} ms  {flops / cublas / 1e9:7.1f} TFLOP/s")
    print(f"  gemmgen / cuBLAS: {cublas / ours:.2f}x")
    return 0 if ok else 1


def plan_render_compile_without_gpu() -> int:
    plan = Gemm(dtype=torch.bfloat16 if torch else "bf16", layout="tn", arch=90)
    print(plan, "\n")
    sources = plan.render()
    for name, text in sources.items():
        print(f"rendered {name}: {len(text.splitlines())} lines")
    skipped = ["running the kernel and comparing with torch.matmul — no CUDA GPU visible"]

    from generator.toolchain import BuildError, build, nvcc_path, spill_report

    try:
        nvcc = nvcc_path()
    except BuildError as err:
        nvcc = None
        skipped.insert(0, f"compiling the kernel with nvcc — {err}")
    if nvcc and torch is None:
        nvcc = None
        skipped.insert(0, "compiling the kernel with nvcc — torch is not installed (pip install -e .)")
    if nvcc:
        from generator.runtime import build_request

        print(f"\ncompiling for sm_90a with {nvcc} (cached after the first time) ...", flush=True)
        result = build(build_request(plan.config, target=90))
        how = "from the cache" if result.cached else f"in {result.seconds:.1f} s"
        print(f"built {result.library} {how}")
        report = spill_report(result.ptxas_log)
        if not report:
            print("ptxas report: (none recorded)")
        for entry, info in report.items():
            print(f"ptxas: {info.get('registers', '?')} registers, {info.get('stack', 0)} bytes stack, "
                  f"{info.get('spill_stores', 0)} bytes spill stores, {info.get('spill_loads', 0)} bytes spill "
                  f"loads  ({entry})")
    print()
    for what in skipped:
        print(f"SKIPPED: {what}")
    return 0


def main() -> int:
    if torch is not None and torch.cuda.is_available():
        return run_on_gpu()
    return plan_render_compile_without_gpu()


if __name__ == "__main__":
    sys.exit(main())
