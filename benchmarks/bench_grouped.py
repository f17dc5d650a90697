"""Benchmark: grouped GEMM (the mixture-of-experts form) next to torch._grouped_mm and a loop of torch.mm, side by side.

    python benchmarks/bench_grouped.py [--shapes 8x2048x14336x4096,...] [--ragged [--seed 0]] [--dtype bf16]
        [--rounds 3] [--order balanced] [--json $OUT/bench_grouped.json]

Each shape is E x T x N x K: E experts of T tokens each (total_M = E*T rows of A, sorted by expert), N and K of
every expert's weight. Layout tn, as a MoE layer holds it: A (total_M, K) row-major, W (E, N, K) contiguous and
B = W.transpose(1, 2) (E, K, N) K-major; offsets the int32 cumulative group ends on the GPU. Equal group sizes by
default; --ragged draws uneven sizes (zeros possible) with the same total, seeded (--seed), printed in the JSON.

Columns, measured on the same tensors in interleaved rounds (bench.py's timed_rounds: the median over --rounds of
triton.testing.do_bench medians):
  ours        op.grouped(A, B, offsets), the op planned by Gemm(dtype, "tn", m=T, n=N, k=K, batch=E) for this GPU (the
              batch hint makes the planner count every group's tiles)
  _grouped_mm torch._grouped_mm(A, B, offs=offsets) (cuBLAS/CUTLASS grouped GEMM inside torch); '-' where this torch
              refuses the operands (the reason is in the JSON)
  loop        torch.mm per non-empty group into row slices of one preallocated D (what a model without a grouped
              kernel does; host offsets, so no device->host copy is timed)
TFLOP/s = 2 * total_M * N * K / time; ours/gmm and ours/loop are time ratios (theirs / ours: above 1 is ours faster);
rel.err = ||D - ref|| / ||ref|| with ref the float32 product group by group (TF32 off); anchor = torch._grouped_mm's
TFLOP/s in shared/bench/h100_anchors_features.json (another run on an H100: orientation only). A row whose rel.err
is above 1e-2 is marked WRONG and the script exits 1.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import DTYPES, ORDERS, geomean, parse_shapes, timed_rounds, warm_up_gpu  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

#: Issue 21's MoE shapes (experts, tokens per expert, N, K).
SHAPES = [(8, 2048, 14336, 4096), (8, 2048, 4096, 14336), (64, 256, 2048, 7168), (128, 64, 768, 2048)]
#: torch._grouped_mm's TFLOP/s on those shapes in /work/shared/bench/h100_anchors_features.json ("grouped"; H100 80GB
#: HBM3, torch 2.11), equal group sizes: orientation only, not measured in this run.
ANCHOR_GROUPED_MM = {(8, 2048, 14336, 4096): 693.6, (8, 2048, 4096, 14336): 703.0, (64, 256, 2048, 7168): 562.4,
                     (128, 64, 768, 2048): 145.0}
WRONG = 1e-2


def group_sizes(experts: int, tokens: int, ragged: bool = False, seed: int = 0) -> list[int]:
    """The rows of each of `experts` groups, experts * tokens in all: equal, or (ragged) drawn from a log-normal
    router load (sigma 1: some experts several times the mean, some few or none), seeded by (seed, experts, tokens),
    rounded so that the sum is exact."""
    total = experts * tokens
    if not ragged:
        return [tokens] * experts
    rng = random.Random(f"{seed}:{experts}:{tokens}")
    weights = [rng.lognormvariate(0.0, 1.0) for _ in range(experts)]
    scale = total / sum(weights)
    exact = [w * scale for w in weights]
    sizes = [int(x) for x in exact]
    # the rows rounding left over, to the largest remainders (ties: the lower index)
    by_remainder = sorted(range(experts), key=lambda i: (sizes[i] - exact[i], i))
    for i in by_remainder[:total - sum(sizes)]:
        sizes[i] += 1
    return sizes


def parse_grouped_shapes(text: str) -> list[tuple[int, int, int, int]]:
    """"8x2048x14336x4096,..." -> [(8, 2048, 14336, 4096), ...]: experts x tokens per expert x N x K."""
    shapes = parse_shapes(text, batched=True)
    for s in shapes:
        if len(s) != 4:
            raise ValueError(f"shape {'x'.join(map(str, s))}: expected ExTxNxK (experts x tokens per expert x N x K)")
    return shapes


def ends(sizes: list[int]) -> list[int]:
    """Cumulative group ends (the offsets)."""
    out, total = [], 0
    for s in sizes:
        total += s
        out.append(total)
    return out


@dataclass
class Row:
    experts: int
    tokens_per_expert: int
    n: int
    k: int
    total_m: int
    dtype: str
    kernel: str
    path: str
    ours_ms: float
    grouped_mm_ms: float | None
    loop_ms: float
    ours_tflops: float
    grouped_mm_tflops: float | None
    loop_tflops: float
    vs_grouped_mm: float | None
    vs_loop: float
    rel_error: float
    grouped_mm_rel_error: float | None
    loop_rel_error: float
    anchor_grouped_mm_tflops: float | None
    ragged: bool = False
    sizes: list[int] = field(default_factory=list)
    grouped_mm_note: str = ""


def tflops(total_m: int, n: int, k: int, ms: float) -> float:
    return 2.0 * total_m * n * k / (ms * 1e-3) / 1e12


def rel_error(d: torch.Tensor, ref: torch.Tensor) -> float:
    return ((d.float() - ref).norm() / ref.norm()).item()


def plans(shapes, dtype: str) -> dict:
    """{shape: op}: each shape's planned op (Gemm's batch hint counts every group's tiles); one parallel build."""
    planned = {s: Gemm(dtype, "tn", arch=None, m=s[1], n=s[2], k=s[3], batch=s[0]) for s in shapes}
    configs = list(dict.fromkeys(p.config for p in planned.values()))
    start = time.perf_counter()
    built = dict(zip(configs, compile_many(configs, namespace="gemmgen")))
    print(f"built {len(configs)} kernels in {time.perf_counter() - start:.1f} s", flush=True)
    return {s: built[p.config] for s, p in planned.items()}


def path_of(op, a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> str:
    """The kernel path the op reports for a grouped call (op.path(A, B, offsets=...)), or '?' where it has no such
    report."""
    grouped_path = getattr(op, "grouped_path", None)
    if callable(grouped_path):
        return grouped_path(a, b, offsets)
    try:
        return op.path(a, b, offsets=offsets)
    except TypeError:
        return "?"


def measure(shape, op, dname: str, ragged: bool, seed: int, rounds: int, order: str) -> Row:
    experts, tokens, n, k = shape
    dtype = DTYPES[dname]
    sizes = group_sizes(experts, tokens, ragged, seed)
    total = sum(sizes)
    a = torch.randn(total, k, device="cuda").to(dtype)
    w = torch.randn(experts, n, k, device="cuda").to(dtype)
    b = w.transpose(1, 2)                                     # (E, K, N), each B[g] K-major
    offsets = torch.tensor(ends(sizes), dtype=torch.int32, device="cuda")
    bounds = [(e - s, e) for s, e in zip(sizes, ends(sizes))]

    d_loop = torch.empty(total, n, dtype=dtype, device="cuda")
    pieces = [(a[s:e], b[g], d_loop[s:e]) for g, (s, e) in enumerate(bounds) if e > s]

    def loop() -> torch.Tensor:
        for x, wt, out in pieces:
            torch.mm(x, wt, out=out)
        return d_loop

    ref = torch.empty(total, n, dtype=torch.float32, device="cuda")
    for g, (s, e) in enumerate(bounds):
        if e > s:
            torch.mm(a[s:e].float(), b[g].float(), out=ref[s:e])
    ours = op.grouped(a, b, offsets)
    err = rel_error(ours, ref)
    del ours
    loop_err = rel_error(loop(), ref)
    timed = {"ours": lambda: op.grouped(a, b, offsets)}
    gmm_err, note = None, ""
    grouped_mm = getattr(torch, "_grouped_mm", None)
    if grouped_mm is None:
        note = "this torch has no torch._grouped_mm"
    else:
        try:
            theirs = grouped_mm(a, b, offs=offsets)
            torch.cuda.synchronize()
            gmm_err = rel_error(theirs, ref)
            del theirs
            timed["grouped_mm"] = lambda: grouped_mm(a, b, offs=offsets)
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as refused:
            note = f"torch._grouped_mm refused: {str(refused).splitlines()[0][:300]}"
    del ref
    timed["loop"] = loop
    for fn in timed.values():   # one untimed call each (first-call costs out of do_bench's run-count estimate)
        fn()
    torch.cuda.synchronize()
    ms = timed_rounds(timed, rounds, order)
    gmm_ms = ms.get("grouped_mm")
    path = path_of(op, a, b, offsets)
    return Row(experts, tokens, n, k, total, dname, op.name, path, ms["ours"], gmm_ms, ms["loop"],
               tflops(total, n, k, ms["ours"]), tflops(total, n, k, gmm_ms) if gmm_ms else None,
               tflops(total, n, k, ms["loop"]), (gmm_ms / ms["ours"]) if gmm_ms else None, ms["loop"] / ms["ours"],
               err, gmm_err, loop_err, ANCHOR_GROUPED_MM.get(tuple(shape)) if not ragged and dname == "bf16" else None,
               ragged, sizes, note)


def header() -> str:
    return (f"{'E':>4} {'T':>5} {'N':>6} {'K':>6} {'ours':>7} {'_gr_mm':>7} {'loop':>7} {'ours/gmm':>8} "
            f"{'ours/loop':>9} {'rel.err':>8} {'anchor':>7}  kernel (path)")


def format_row(r: Row) -> str:
    def opt(x: float | None, width: int, fmt: str) -> str:
        return f"{x:{width}{fmt}}" if x is not None else f"{'-':>{width}}"

    flag = "  WRONG" if not r.rel_error <= WRONG else ""
    return (f"{r.experts:>4} {r.tokens_per_expert:>5} {r.n:>6} {r.k:>6} {r.ours_tflops:7.1f} "
            f"{opt(r.grouped_mm_tflops, 7, '.1f')} {r.loop_tflops:7.1f} {opt(r.vs_grouped_mm, 8, '.3f')} "
            f"{r.vs_loop:9.3f} {r.rel_error:8.1e} {opt(r.anchor_grouped_mm_tflops, 7, '.1f')}  "
            f"{r.kernel} ({r.path}){flag}")


def summarize(rows: list[Row]) -> dict[str, float]:
    summary = {}
    vs_gmm = [r.vs_grouped_mm for r in rows if r.vs_grouped_mm]
    if vs_gmm:
        summary["geomean ours/torch._grouped_mm"] = round(geomean(vs_gmm), 4)
    if rows:
        summary["geomean ours/loop"] = round(geomean([r.vs_loop for r in rows]), 4)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES),
                        help="ExTxNxK,...: experts x tokens per expert x N x K (default: issue 21's MoE shapes)")
    parser.add_argument("--ragged", action="store_true",
                        help="uneven group sizes with the same total (log-normal router load, seeded)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of --ragged's group sizes")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--rounds", type=int, default=3,
                        help="do_bench medians per column and row, interleaved; the table has their median")
    parser.add_argument("--order", choices=sorted(ORDERS), default="balanced",
                        help="how the columns' windows interleave (bench.py's orders)")
    parser.add_argument("--json", default=None,
                        help="where to write the JSON (default $OUT/bench_grouped.json or ./bench_grouped.json)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        shapes = parse_grouped_shapes(args.shapes)
    except ValueError as err:
        parser.error(f"--shapes: {err}")
    if not torch.cuda.is_available():
        print("bench_grouped: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"TFLOP/s (do_bench median of {args.rounds} interleaved rounds, random data), {args.dtype}, layout tn, "
          + (f"ragged group sizes (seed {args.seed})" if args.ragged else "equal group sizes"))
    ops = plans(shapes, args.dtype)
    warm_up_gpu()
    print(header())
    rows = []
    for shape, op in ops.items():
        row = measure(shape, op, args.dtype, args.ragged, args.seed, args.rounds, args.order)
        rows.append(row)
        print(format_row(row), flush=True)
        if row.grouped_mm_note:
            print(f"     {row.grouped_mm_note}", flush=True)
    print("\n" + header())
    for r in rows:
        print(format_row(r))
    summary = summarize(rows)
    for key, value in summary.items():
        print(f"{key}: {value}")
    out = Path(args.json) if args.json else Path(os.environ.get("OUT", ".")) / "bench_grouped.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "dtype": args.dtype, "ragged": args.ragged, "seed": args.seed if args.ragged else None,
                               "rows": [asdict(r) for r in rows], "summary": summary}, indent=1))
    print(f"wrote {out}")
    wrong = [r for r in rows if not r.rel_error <= WRONG]
    if wrong:
        print(f"{len(wrong)} row(s) WRONG (rel.err > {WRONG}): " + ", ".join(
            f"{r.experts}x{r.tokens_per_expert}x{r.n}x{r.k}" for r in wrong), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
