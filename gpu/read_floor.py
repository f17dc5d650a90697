"""How fast can any kernel read a decode weight? A bound for the small-M kernel (docs/small_m.md).

Times, under the same do_bench (L2 flushed before each call) as the GEMM benchmark: an empty launch (the fixed cost
the harness itself adds), Triton kernels that only read W (N x K bf16) and reduce it, over a range of grid sizes and
block sizes, torch's own reduction, and the GEMMs at M = 1 (ours, the small-M kernel, and cuBLAS). If the best pure
read is no faster than our GEMM, the small-M kernel sits at the memory system's floor for one call of that size.
Writes $OUT/read_floor.json.

    python3 gpu/read_floor.py [--sizes 4096x4096,8192x8192] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench import bench_ms, warm_up_gpu  # noqa: E402
from generator import Gemm  # noqa: E402

OUT = Path(os.environ.get("OUT", "."))


@triton.jit
def _empty(out_ptr):
    pass


@triton.jit
def _read_chunks(x_ptr, out_ptr, n_elem, BLOCK: tl.constexpr):
    """One program per BLOCK elements: the whole read in flight at once, as the hardware schedules it."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n_elem, other=0.0, eviction_policy="evict_first")
    tl.store(out_ptr + tl.program_id(0), tl.sum(x.to(tl.float32)))


@triton.jit
def _read_strided(x_ptr, out_ptr, n_elem, BLOCK: tl.constexpr):
    """A fixed grid striding over W (a persistent read)."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    for start in range(tl.program_id(0).to(tl.int64) * BLOCK, n_elem, step):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n_elem, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc))


def median_of_rounds(fn, rounds: int) -> float:
    return statistics.median(bench_ms(fn) for _ in range(rounds))


def probe_size(n: int, k: int, rounds: int, sms: int) -> list[dict]:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    numel, nbytes = w.numel(), w.numel() * w.element_size()
    out = torch.empty(max(numel // 512, sms * 64), device="cuda", dtype=torch.float32)
    cases: dict[str, callable] = {"empty launch": lambda: _empty[(1,)](out)}
    for block, warps in ((2048, 4), (4096, 4), (8192, 8), (16384, 8)):
        grid = (triton.cdiv(numel, block),)
        cases[f"read, one program per {block} elements, {warps} warps"] = (
            lambda g=grid, b=block, wp=warps: _read_chunks[g](w, out, numel, BLOCK=b, num_warps=wp))
    for per_sm, block, warps in ((2, 4096, 8), (4, 4096, 8), (8, 2048, 4), (16, 1024, 4)):
        grid = (sms * per_sm,)
        cases[f"read, {per_sm} programs per SM striding, {block} elements, {warps} warps"] = (
            lambda g=grid, b=block, wp=warps: _read_strided[g](w, out, numel, BLOCK=b, num_warps=wp))
    cases["torch.sum(W, dtype=float32)"] = lambda: torch.sum(w, dtype=torch.float32)
    op = Gemm(dtype=torch.bfloat16, layout="tn").compile()
    cases["GEMM M=1, ours (small-M kernel)"] = lambda: op(x, w.t())
    cases["GEMM M=1, cuBLAS"] = lambda: torch.matmul(x, w.t())
    for fn in cases.values():   # compile and warm every case before any timing
        fn()
    torch.cuda.synchronize()
    warm_up_gpu()
    rows = []
    for label, fn in cases.items():
        ms = median_of_rounds(fn, rounds)
        rows.append({"n": n, "k": k, "case": label, "us": ms * 1e3,
                     "GBps": nbytes / (ms * 1e-3) / 1e9 if label != "empty launch" else None})
        gb = f"{rows[-1]['GBps']:7.0f} GB/s" if rows[-1]["GBps"] else ""
        print(f"{n}x{k}  {label:62s} {ms * 1e3:8.2f} us  {gb}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4096x4096,8192x8192", help="N x K of W, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for size in args.sizes.split(","):
        n, k = (int(v) for v in size.split("x"))
        rows += probe_size(n, k, args.rounds, sms)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "read_floor.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
