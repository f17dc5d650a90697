"""Benchmark: grouped GEMM (the mixture-of-experts form) next to torch._grouped_mm and a loop of torch.mm, side by side.

    python benchmarks/bench_grouped.py [--shapes 8x2048x14336x4096,...] [--ragged [--seed 0]] [--dtype bf16]
        [--rounds 3] [--order balanced] [--no-list | --list-only] [--list-count 16] [--list-seed 0]
        [--json $OUT/bench_grouped.json]

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

The list form (a second table, on by default; --no-list leaves it out, --list-only runs only it): a list of problems
D_i = A_i @ B_i, each A_i (M_i, K_i) row-major, B_i = W_i.t() for a row-major W_i (N_i, K_i) (layout tn), separate
tensors. Lists: each --shapes entry as E problems of (T, N, K), and a ragged list like CUTLASS's grouped example
(--list-count problems, M, N and K drawn from the multiples of 8 in [128, 4096], seeded by --list-seed). Columns:
  ours        op.grouped_list(As, Bs), one launch, the op planned by Gemm(dtype, "tn", m, n, k, batch=count) with m, n,
              k the list's mean sizes (the E x T x N x K entries: the same op as the table above)
  loop        torch.mm(A_i, B_i, out=D_i) per problem into preallocated D_i
  _grouped_mm torch._grouped_mm on torch.cat(As) and the stacked weights (E, K, N) with the int32 offsets, where every
              problem has the same N and K; the concatenation and stacking are done once before timing, NOT timed
  offsets     ours in the offsets form, op.grouped, on the same concatenated operands (not timed either)
TFLOP/s = sum of 2 * M_i * N_i * K_i / time; ours/loop, ours/gmm and ours/offs are time ratios (theirs / ours: above
1 is the list form faster); rel.err the largest per-problem ||D_i - ref_i|| / ||ref_i|| (float32 reference).
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
    extra_ms: dict[str, float] = field(default_factory=dict)          # (the ``extra`` kernels: name -> ms)
    extra_rel_error: dict[str, float] = field(default_factory=dict)


def tflops(total_m: int, n: int, k: int, ms: float) -> float:
    return 2.0 * total_m * n * k / (ms * 1e-3) / 1e12


def rel_error(d: torch.Tensor, ref: torch.Tensor) -> float:
    if ref.numel() == 0:   # no rows at all: right when the result has the reference's (empty) shape
        return 0.0 if d.shape == ref.shape else float("inf")
    return ((d.float() - ref).norm() / ref.norm()).item()


def plans(shapes, dtype: str, lists: dict | None = None) -> dict:
    """{shape: op}: each shape's planned op (Gemm's batch hint counts every group's tiles); and with ``lists``
    ({label: [(M, N, K)]}) each list's op too, keyed by its label (``list_plan``); one parallel build."""
    planned = {s: Gemm(dtype, "tn", arch=None, m=s[1], n=s[2], k=s[3], batch=s[0]) for s in shapes}
    planned.update({label: list_plan(problems, dtype) for label, problems in (lists or {}).items()})
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
    experts, tokens, _, _ = shape
    anchor = ANCHOR_GROUPED_MM.get(tuple(shape)) if not ragged and dname == "bf16" else None
    return measure_sizes(shape, group_sizes(experts, tokens, ragged, seed), op, dname, rounds, order, anchor, ragged)


def measure_sizes(shape, sizes: list[int], op, dname: str, rounds: int, order: str, anchor: float | None = None,
                  ragged: bool = True, extra: dict | None = None) -> Row:
    """One row: the E x T x N x K entry ``shape`` with the groups of ``sizes`` rows (T: the mean the op is planned
    for), ours, torch._grouped_mm and the torch.mm loop on the same tensors; and the ``extra`` ops ({name: op}, other
    kernels of the same call) timed in the same rounds, each checked against the same reference."""
    experts, tokens, n, k = shape
    dtype = DTYPES[dname]
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
    extra_errors = {}
    for name, other in (extra or {}).items():
        extra_errors[name] = rel_error(other.grouped(a, b, offsets), ref)
        timed[f"extra:{name}"] = lambda other=other: other.grouped(a, b, offsets)
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
               err, gmm_err, loop_err, anchor, ragged, sizes, note,
               {name: ms[f"extra:{name}"] for name in extra_errors}, extra_errors)


# -- the list form (op.grouped_list: a list of independent problems, CUTLASS's GroupedGemm) -----------------------

#: The ragged list's sizes: M, N and K each a multiple of 8 in [LIST_LOW, LIST_HIGH] (as CUTLASS's grouped example
#: draws its problems).
LIST_LOW, LIST_HIGH = 128, 4096
LIST_NOTE = ("list form: ours = op.grouped_list(As, Bs), one launch; loop = torch.mm per problem into preallocated "
             "outputs; _grouped_mm and offsets (ours, op.grouped) run on torch.cat(As) and the stacked weights, made "
             "once before timing: the concatenation is not timed (only where every problem has the same N and K)")


def moe_list(shape, ragged: bool = False, seed: int = 0) -> list[tuple[int, int, int]]:
    """An E x T x N x K entry as a list of E problems (M_g, N, K), M_g the group sizes (equal, or --ragged's)."""
    experts, tokens, n, k = shape
    return [(m, n, k) for m in group_sizes(experts, tokens, ragged, seed)]


def moe_label(shape, ragged: bool = False) -> str:
    experts, tokens, n, k = shape
    return f"{experts}x({tokens},{n},{k})" + (" ragged" if ragged else "")


def ragged_list(count: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """``count`` problems, M, N and K each drawn from the multiples of 8 in [LIST_LOW, LIST_HIGH], seeded."""
    rng = random.Random(f"list:{seed}:{count}")
    return [tuple(rng.randrange(LIST_LOW, LIST_HIGH + 1, 8) for _ in range(3)) for _ in range(count)]


def ragged_label(count: int, seed: int) -> str:
    return f"ragged {count} (seed {seed})"


def list_plan(problems: list[tuple[int, int, int]], dtype: str) -> Gemm:
    """The plan of a list: its mean M, N and K (rounded to multiples of 8) and the problem count as the batch hint
    (for an E x T x N x K entry with equal groups: the same plan as its offsets row)."""
    def mean(i: int) -> int:
        return max(8, round(sum(p[i] for p in problems) / len(problems) / 8) * 8)

    return Gemm(dtype, "tn", arch=None, m=mean(0), n=mean(1), k=mean(2), batch=len(problems))


@dataclass
class ListRow:
    label: str
    problems: int
    dtype: str
    kernel: str
    path: str
    gflop: float
    ours_ms: float
    loop_ms: float
    grouped_mm_ms: float | None
    offsets_ms: float | None
    ours_tflops: float
    loop_tflops: float
    grouped_mm_tflops: float | None
    offsets_tflops: float | None
    vs_loop: float
    vs_grouped_mm: float | None
    vs_offsets: float | None
    rel_error: float
    loop_rel_error: float
    grouped_mm_rel_error: float | None
    offsets_rel_error: float | None
    shapes: list[list[int]] = field(default_factory=list)
    note: str = ""


def list_path_of(op, As, Bs) -> str:
    """The path the op reports for a list call (op.path(As, Bs)), or '?' where it gives none."""
    try:
        return op.path(As, Bs)
    except (TypeError, ValueError, AttributeError):
        return "?"


def measure_list(label: str, problems: list[tuple[int, int, int]], op, dname: str, rounds: int,
                 order: str) -> ListRow:
    dtype = DTYPES[dname]
    As = [torch.randn(m, k, device="cuda").to(dtype) for m, n, k in problems]
    Ws = [torch.randn(n, k, device="cuda").to(dtype) for m, n, k in problems]
    Bs = [w.t() for w in Ws]                                  # (K, N), K-major: layout tn
    refs = [a.float() @ b.float() for a, b in zip(As, Bs)]

    def worst(Ds) -> float:
        return max((rel_error(d, r) for d, r in zip(Ds, refs) if r.numel()), default=0.0)

    ours = op.grouped_list(As, Bs)
    torch.cuda.synchronize()
    err = worst(ours)
    del ours
    outs = [torch.empty(m, n, dtype=dtype, device="cuda") for m, n, k in problems]

    def loop() -> list[torch.Tensor]:
        for a, b, out in zip(As, Bs, outs):
            torch.mm(a, b, out=out)
        return outs

    loop_err = worst(loop())
    timed = {"ours": lambda: op.grouped_list(As, Bs), "loop": loop}
    gmm_err = offs_err = None
    notes = []
    if len({(n, k) for _, n, k in problems}) == 1:
        sizes = [m for m, _, _ in problems]
        a_cat = torch.cat(As)                                  # made once, not timed
        b_stack = torch.stack(Ws).transpose(1, 2)              # (E, K, N), each K-major
        offsets = torch.tensor(ends(sizes), dtype=torch.int32, device="cuda")
        others = {"offsets": lambda: op.grouped(a_cat, b_stack, offsets)}
        grouped_mm = getattr(torch, "_grouped_mm", None)
        if grouped_mm is None:
            notes.append("this torch has no torch._grouped_mm")
        else:
            others["grouped_mm"] = lambda: grouped_mm(a_cat, b_stack, offs=offsets)
        for name, fn in others.items():
            try:
                d = fn()
                torch.cuda.synchronize()
            except (RuntimeError, NotImplementedError, TypeError, ValueError) as refused:
                notes.append(f"{name} refused: {str(refused).splitlines()[0][:300]}")
                continue
            e = worst(d.split(sizes))
            del d
            if name == "offsets":
                offs_err = e
            else:
                gmm_err = e
            timed[name] = fn
    else:
        notes.append("problems differ in N or K: no _grouped_mm or offsets column")
    del refs
    for fn in timed.values():   # one untimed call each (first-call costs out of do_bench's run-count estimate)
        fn()
    torch.cuda.synchronize()
    ms = timed_rounds(timed, rounds, order)
    flop = sum(2.0 * m * n * k for m, n, k in problems)

    def tf(name: str) -> float | None:
        return flop / (ms[name] * 1e-3) / 1e12 if name in ms else None

    def vs(name: str) -> float | None:
        return ms[name] / ms["ours"] if name in ms else None

    return ListRow(label, len(problems), dname, op.name, list_path_of(op, As, Bs), flop / 1e9, ms["ours"], ms["loop"],
                   ms.get("grouped_mm"), ms.get("offsets"), tf("ours"), tf("loop"), tf("grouped_mm"), tf("offsets"),
                   vs("loop"), vs("grouped_mm"), vs("offsets"), err, loop_err, gmm_err, offs_err,
                   [list(p) for p in problems], "; ".join(notes))


def _optional(x: float | None, width: int, fmt: str) -> str:
    """A table cell that may be missing (a baseline this torch does not have): '-' then."""
    return f"{x:{width}{fmt}}" if x is not None else f"{'-':>{width}}"


def list_header() -> str:
    return (f"{'list':<26} {'GFLOP':>8} {'ours':>7} {'loop':>7} {'_gr_mm':>7} {'offsets':>7} {'ours/loop':>9} "
            f"{'ours/gmm':>8} {'ours/offs':>9} {'rel.err':>8}  kernel (path)")


def format_list_row(r: ListRow) -> str:
    flag = "  WRONG" if not r.rel_error <= WRONG else ""
    return (f"{r.label:<26} {r.gflop:8.1f} {r.ours_tflops:7.1f} {r.loop_tflops:7.1f} "
            f"{_optional(r.grouped_mm_tflops, 7, '.1f')} {_optional(r.offsets_tflops, 7, '.1f')} {r.vs_loop:9.3f} "
            f"{_optional(r.vs_grouped_mm, 8, '.3f')} {_optional(r.vs_offsets, 9, '.3f')} {r.rel_error:8.1e}  "
            f"{r.kernel} ({r.path}){flag}")


def summarize_list(rows: list[ListRow]) -> dict[str, float]:
    summary = {}
    for key, values in (("list geomean ours/loop", [r.vs_loop for r in rows]),
                        ("list geomean ours/torch._grouped_mm", [r.vs_grouped_mm for r in rows if r.vs_grouped_mm]),
                        ("list geomean ours list/ours offsets", [r.vs_offsets for r in rows if r.vs_offsets])):
        if values:
            summary[key] = round(geomean(values), 4)
    return summary


def header() -> str:
    return (f"{'E':>4} {'T':>5} {'N':>6} {'K':>6} {'ours':>7} {'_gr_mm':>7} {'loop':>7} {'ours/gmm':>8} "
            f"{'ours/loop':>9} {'rel.err':>8} {'anchor':>7}  kernel (path)")


def format_row(r: Row) -> str:
    flag = "  WRONG" if not r.rel_error <= WRONG else ""
    return (f"{r.experts:>4} {r.tokens_per_expert:>5} {r.n:>6} {r.k:>6} {r.ours_tflops:7.1f} "
            f"{_optional(r.grouped_mm_tflops, 7, '.1f')} {r.loop_tflops:7.1f} {_optional(r.vs_grouped_mm, 8, '.3f')} "
            f"{r.vs_loop:9.3f} {r.rel_error:8.1e} {_optional(r.anchor_grouped_mm_tflops, 7, '.1f')}  "
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
                        help="uneven group sizes with the same total (log-normal router load, seeded); the list "
                             "rows of --shapes take the same sizes")
    parser.add_argument("--seed", type=int, default=0, help="the seed of --ragged's group sizes")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--rounds", type=int, default=3,
                        help="do_bench medians per column and row, interleaved; the table has their median")
    parser.add_argument("--order", choices=sorted(ORDERS), default="balanced",
                        help="how the columns' windows interleave (bench.py's orders)")
    parser.add_argument("--list", action=argparse.BooleanOptionalAction, default=True,
                        help="the list form's table (op.grouped_list next to a torch.mm loop and torch._grouped_mm): "
                             "--shapes as lists and a ragged list (default: on)")
    parser.add_argument("--list-only", action="store_true", help="only the list form's table")
    parser.add_argument("--list-count", type=int, default=16,
                        help=f"problems in the ragged list (M, N, K multiples of 8 in [{LIST_LOW}, {LIST_HIGH}]); "
                             "0: none")
    parser.add_argument("--list-seed", type=int, default=0, help="the seed of the ragged list's sizes")
    parser.add_argument("--json", default=None,
                        help="where to write the JSON (default $OUT/bench_grouped.json or ./bench_grouped.json)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.list_only and not args.list:
        parser.error("--list-only and --no-list exclude each other")
    if args.list_count < 0:
        parser.error("--list-count must be at least 0")
    try:
        shapes = parse_grouped_shapes(args.shapes)
    except ValueError as err:
        parser.error(f"--shapes: {err}")
    if not torch.cuda.is_available():
        print("bench_grouped: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    lists: dict[str, list[tuple[int, int, int]]] = {}
    if args.list:
        lists = {moe_label(s, args.ragged): moe_list(s, args.ragged, args.seed) for s in shapes}
        if args.list_count:
            lists[ragged_label(args.list_count, args.list_seed)] = ragged_list(args.list_count, args.list_seed)
    offset_shapes = [] if args.list_only else shapes
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"TFLOP/s (do_bench median of {args.rounds} interleaved rounds, random data), {args.dtype}, layout tn, "
          + (f"ragged group sizes (seed {args.seed})" if args.ragged else "equal group sizes"))
    ops = plans(offset_shapes, args.dtype, lists)
    warm_up_gpu()
    rows = []
    if offset_shapes:
        print(header())
    for shape in offset_shapes:
        row = measure(shape, ops[shape], args.dtype, args.ragged, args.seed, args.rounds, args.order)
        rows.append(row)
        print(format_row(row), flush=True)
        if row.grouped_mm_note:
            print(f"     {row.grouped_mm_note}", flush=True)
    list_rows = []
    if lists:
        print("\n" + LIST_NOTE)
        print(list_header())
    for label, problems in lists.items():
        row = measure_list(label, problems, ops[label], args.dtype, args.rounds, args.order)
        list_rows.append(row)
        print(format_list_row(row), flush=True)
        if row.note:
            print(f"     {row.note}", flush=True)
    if rows:
        print("\n" + header())
        for r in rows:
            print(format_row(r))
    if list_rows:
        print("\n" + list_header())
        for r in list_rows:
            print(format_list_row(r))
    summary = {**summarize(rows), **summarize_list(list_rows)}
    for key, value in summary.items():
        print(f"{key}: {value}")
    out = Path(args.json) if args.json else Path(os.environ.get("OUT", ".")) / "bench_grouped.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "dtype": args.dtype, "ragged": args.ragged, "seed": args.seed if args.ragged else None,
                               "rows": [asdict(r) for r in rows],
                               "list_seed": args.list_seed if args.list and args.list_count else None,
                               "list_note": LIST_NOTE if list_rows else None,
                               "list_rows": [asdict(r) for r in list_rows], "summary": summary}, indent=1))
    print(f"wrote {out}")
    wrong = [f"{r.experts}x{r.tokens_per_expert}x{r.n}x{r.k}" for r in rows if not r.rel_error <= WRONG]
    wrong += [f"list {r.label}" for r in list_rows if not r.rel_error <= WRONG]
    if wrong:
        print(f"{len(wrong)} row(s) WRONG (rel.err > {WRONG}): " + ", ".join(wrong), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
