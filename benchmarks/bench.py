"""Benchmark: our planned kernel next to torch.matmul (cuBLAS) and a Triton matmul, side by side in one run.

    python benchmarks/bench.py [--set square,llm,ragged | --shapes 1x4096x4096,...] [--dtypes bf16,fp16]
        [--layout tn] [--family sm80] [--json out.json]
    python benchmarks/bench.py --set bmm --dtypes bf16         (batched: ours on 3-D operands next to torch.bmm)
    python -m generator bench ...   (the same)

Times are triton.testing.do_bench medians (ms) on fresh random data, measured --rounds times per row in
interleaved column order (--order; the table has the median of the rounds); TFLOP/s = 2*M*N*K / time; GB/s = the
bytes of A, B and D / time (what small-M shapes are bound by); the path is the kernel our call took (op.path).
Each shape is also checked against a float32 reference, so a fast wrong kernel cannot hide here.

Batched shapes (--set bmm, or BxMxNxK in --shapes): the op planned for the batch of M x N x K problems, called on
(batch, M, K) and (batch, K, N) operands (default layout tt: both row-major, torch.bmm's usual operands), next to
torch.bmm on the same tensors (its column is the cuBLAS one); TFLOP/s = 2*batch*M*N*K / time; rel.err is the largest
per-problem error. The Triton column is not measured for them (triton_matmul.py has no batched kernel).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import NamedTuple

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # triton_matmul beside this file, also under runpy

from generator import Gemm  # noqa: E402
from generator.gemm import M_BUCKETS, op_key  # noqa: E402
from generator.runtime import BucketedOp, compile_many  # noqa: E402
from generator.planner.sm90 import with_staging_in_ring  # noqa: E402
from generator.spec.config import KernelConfig, check_config  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: Issue 21's batched shapes (batch, M, N, K): attention-like (K or N = 128), a large square batch, many small ones.
BMM_SHAPES = [(32, 2048, 2048, 128), (32, 2048, 128, 2048), (8, 4096, 4096, 4096), (512, 256, 256, 256)]
#: Sets of batched shapes, which --set takes like the sets of shapes.json (whose shapes are M x N x K).
BATCHED_SETS = {"bmm": BMM_SHAPES}


@dataclass
class Row:
    m: int
    n: int
    k: int
    dtype: str
    layout: str
    kernel: str
    ours_ms: float
    cublas_ms: float
    triton_ms: float | None
    ours_tflops: float
    cublas_tflops: float
    triton_tflops: float | None
    vs_cublas: float
    vs_triton: float | None
    rel_error: float
    # --triton-mma-sync: the Triton kernel built with mma.sync instead of wgmma (the sm80 family's peer)
    triton_mma_sync_ms: float | None = None
    triton_mma_sync_tflops: float | None = None
    vs_triton_mma_sync: float | None = None
    # The kernel the call took (op.path: fast, small_m, unaligned) and the bytes of A, B and D over the time,
    # GB/s: what a decode shape (small M) is bound by.
    path: str = "fast"
    ours_gbps: float = 0.0
    cublas_gbps: float = 0.0
    # Batched rows: the number of problems (m, n, k are each one's), and what the cuBLAS column timed (torch.bmm).
    # Left out of the JSON of 2-D rows (row_json), whose rows keep the keys they had.
    batch: int | None = None
    baseline: str = "torch.matmul"


def row_json(r: Row) -> dict:
    """A row as the JSON has it: 2-D rows without the batched rows' keys."""
    d = asdict(r)
    if r.batch is None:
        del d["batch"], d["baseline"]
    return d


def parse_shapes(text: str, batched: bool = False) -> list[tuple[int, ...]]:
    """"4096x4096x4096,8192x8192x8192" -> [(4096, 4096, 4096), (8192, 8192, 8192)] (the scripts' --shapes); with
    ``batched``, BxMxNxK entries too ("32x2048x2048x128" -> (32, 2048, 2048, 128)), as bench.py's --shapes takes."""
    shapes = []
    for item in text.split(","):
        values = tuple(int(v) for v in item.lower().split("x"))
        if len(values) != 3 and not (batched and len(values) == 4):
            raise ValueError(f"shape {item!r}: expected MxNxK{' or BxMxNxK' if batched else ''}")
        shapes.append(values)
    return shapes


CANDIDATE_SCHEDULES = {"pp": "pingpong", "coop": "cooperative"}


class Candidate(NamedTuple):
    """An sm90 kernel timed beside the planner's pick (``--candidates``): the hints it fixes."""

    tile: tuple[int, ...]
    cluster: tuple[int, ...]
    schedule: str
    stream_k: bool = False
    stages: int | None = None          # None: as many as fit
    raster: tuple[str, int] | None = None   # (order "m" / "n", group); None: the planner's

    def hints(self) -> dict:
        """Gemm's keyword arguments for the fixed fields (stream-K is a config field, set on the plan's config)."""
        raster = dict(raster=self.raster[0], raster_group=self.raster[1]) if self.raster else {}
        return dict(tile_shape=self.tile, cluster_shape=self.cluster, schedule=self.schedule, stages=self.stages,
                    **raster)


def parse_candidates(text: str) -> list[Candidate]:
    """``--candidates 128x128x64:2x1:pp,256x128x64:1x2:coop:sk,64x64x64:2x1:pp:s8,128x192x64:1x2:coop:g8m`` (sm90
    kernels beside the planner's pick: gpu/midm_tiles.py, bench_moe.py): TILE:CLUSTER:pp|coop, then optionally sk
    (stream-K), sN (N stages) and gGm / gGn (raster group G along M or N, as kernel names write it)."""
    parsed = []
    for item in filter(None, text.split(",")):
        tile, cluster, schedule, *rest = item.split(":")
        sk = "sk" in rest
        stages = [r for r in rest if r.startswith("s") and r[1:].isdigit()]
        rasters = [r for r in rest if len(r) > 2 and r[0] == "g" and r[1:-1].isdigit() and r[-1] in "mn"]
        if (schedule not in CANDIDATE_SCHEDULES or len(rest) != sk + len(stages) + len(rasters) or len(stages) > 1
                or len(rasters) > 1):
            raise SystemExit(f"--candidates {item!r}: write TILE:CLUSTER:pp|coop[:sk][:sN][:gGm|gGn], "
                             "e.g. 128x128x64:2x1:pp")
        parsed.append(Candidate(tuple(map(int, tile.split("x"))), tuple(map(int, cluster.split("x"))),
                                CANDIDATE_SCHEDULES[schedule], sk, int(stages[0][1:]) if stages else None,
                                (rasters[0][-1], int(rasters[0][1:-1])) if rasters else None))
    return parsed


def parse_variants(text: str) -> list[dict[str, object]]:
    """``--variants raster=n,raster_group=4+raster=m`` as field changes to the pick (gpu/midm_tiles.py, bench_moe.py):
    one dict per comma item, its ``+``-joined field=value pairs (integers where they parse, true and false as
    booleans)."""
    variants = []
    for item in filter(None, text.split(",")):
        fields = {}
        for pair in item.split("+"):
            name, eq, value = pair.partition("=")
            if not eq or name not in KernelConfig.__dataclass_fields__:
                raise SystemExit(f"--variants {item!r}: write FIELD=VALUE[+FIELD=VALUE], FIELD a KernelConfig field")
            pair_of_ints = "x" in value and all(v.isdigit() for v in value.split("x"))
            fields[name] = (int(value) if value.isdigit() else tuple(map(int, value.split("x"))) if pair_of_ints else
                            {"true": True, "false": False}.get(value.lower(), value))
        variants.append(fields)
    return variants


def variant_of(pick: KernelConfig, fields: dict[str, object]) -> KernelConfig:
    """``pick`` with one of parse_variants' field changes; staging_in_ring without stages moves the stages its staging
    buffers' bytes free or take (with_staging_in_ring). Raises check_config's ValueError where it is not legal."""
    if "staging_in_ring" in fields and "stages" not in fields:
        variant = with_staging_in_ring(pick, bool(fields["staging_in_ring"]))
    else:
        variant = replace(pick, **fields)
    check_config(variant)
    return variant


def load_shapes(sets: list[str]) -> list[tuple[int, ...]]:
    """The shapes of shapes.json's sets (M, N, K) and of BATCHED_SETS (batch, M, N, K), in the order named."""
    data = json.loads((HERE / "shapes.json").read_text())
    shapes: list[tuple[int, ...]] = []
    for name in sets:
        shapes += [tuple(s) for s in (data[name] if name in data or name not in BATCHED_SETS else BATCHED_SETS[name])]
    return shapes


def split_shape(shape: tuple[int, ...]) -> tuple[int | None, int, int, int]:
    """(batch, M, N, K) of a shape: batch None for an M x N x K one."""
    return (None, *shape) if len(shape) == 3 else tuple(shape)


def operands(layout: str, m: int, n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(m, k, device="cuda").to(dtype) if layout[0] == "t" else torch.randn(k, m, device="cuda").to(dtype).t()
    b = torch.randn(k, n, device="cuda").to(dtype) if layout[1] == "t" else torch.randn(n, k, device="cuda").to(dtype).t()
    return a, b


def batched_operands(layout: str, batch: int, m: int, n: int, k: int, dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """A (batch, M, K) and B (batch, K, N), packed, each matrix in the layout's order (tt: both contiguous)."""
    def stack(rows: int, cols: int, row_major: bool) -> torch.Tensor:
        if row_major:
            return torch.randn(batch, rows, cols, device="cuda").to(dtype)
        return torch.randn(batch, cols, rows, device="cuda").to(dtype).transpose(1, 2)
    return stack(m, k, layout[0] == "t"), stack(k, n, layout[1] == "t")


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def gbps(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, ms: float) -> float:
    """The operands' and the result's bytes over the time: each read or written once at least."""
    return sum(t.numel() * t.element_size() for t in (a, b, d)) / (ms * 1e-3) / 1e9


def bench_ms(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def warm_up_gpu(seconds: float = 2.0) -> None:
    """Big matmuls until the clocks have ramped up: the GPU idles while kernels build, and the first rows
    measured on an idle GPU read slow (1024^3 at 0.41x cuBLAS in one run, 0.85x in the next)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def balanced_order(names: list[str], per_name: int) -> list[str]:
    """The order in which ``per_name`` windows of each name are measured: no name twice in a row, and every
    name preceded by every other name as often as the run length allows (for A B C: A B C A C B A B C ...).

    Under the 700 W cap a window's clock depends on the power of the window before it. The old order
    (A B C, then C B A) gave the middle column, cuBLAS in bench.py, a different neighbour in every round,
    while the first and last columns ran two windows back to back, the second one hotter."""
    counts = {name: 0 for name in names}
    follows = {(a, b): 0 for a in names for b in names}
    order: list[str] = []
    for _ in range(per_name * len(names)):
        prev = order[-1] if order else None
        open_names = [n for n in names if counts[n] < per_name]
        candidates = [n for n in open_names if n != prev] or open_names
        # the least-used transition from prev, then the least-measured name, then the caller's order
        pick = min(candidates, key=lambda n: (follows.get((prev, n), 0), counts[n], names.index(n)))
        if prev is not None:
            follows[(prev, pick)] += 1
        counts[pick] += 1
        order.append(pick)
    return order


def alternating_order(names: list[str], per_name: int) -> list[str]:
    """The order used until 2026-11-23 (A B C, then C B A, ...), kept to compare against ``balanced_order``."""
    return [n for r in range(per_name) for n in (names if r % 2 == 0 else list(reversed(names)))]


ORDERS = {"balanced": balanced_order, "alternating": alternating_order}


def interleaved_rounds(fns: dict, rounds: int, measure, order: str = "balanced") -> dict[str, list]:
    """``measure(fn)`` of every function ``rounds`` times, interleaved (``ORDERS[order]``) so that a clock
    or temperature drift during the run hits every column alike; the results per name."""
    results: dict[str, list] = {name: [] for name in fns}
    for name in ORDERS[order](list(fns), rounds):
        results[name].append(measure(fns[name]))
    return results


def timed_rounds(fns: dict, rounds: int, order: str = "balanced") -> dict[str, float]:
    """The median over ``rounds`` of each function's do_bench median, measured in interleaved order."""
    return {name: statistics.median(t) for name, t in interleaved_rounds(fns, rounds, bench_ms, order).items()}


def planned_ops(shapes, dtypes, layout, family_arg: dict, buckets: tuple[int, ...] | None,
                batched_layout: str | None = None) -> dict:
    """{(shape, dtype): op}: the op planned for each shape, or (buckets given) the M-bucketed op of its N and K, as
    generator.nn.Linear holds one (Gemm.compile_buckets); all kernels built in one parallel run. A batched shape
    (batch, M, N, K) gets the op planned for its problems (Gemm's m, n, k and batch: the planner counts every
    problem's tiles) in ``batched_layout`` (default: ``layout``)."""
    def layout_of(s: tuple[int, ...]) -> str:
        return layout if len(s) == 3 else (batched_layout or layout)

    if buckets is not None:
        if any(len(s) != 3 for s in shapes):
            raise ValueError("bucketed ops pick their kernel by A's rows: time batched shapes without --bucketed")
        plans = {(s, d): Gemm(dtype=d, layout=layout, n=s[1], k=s[2], **family_arg).bucket_plans(buckets) for s in shapes
                 for d in dtypes}
    else:
        plans = {}
        for s in shapes:
            batch, m, n, k = split_shape(s)
            hints = dict(m=m, n=n, k=k, **({"batch": batch} if batch is not None else {}))
            for d in dtypes:
                plans[(s, d)] = [(None, Gemm(dtype=d, layout=layout_of(s), **hints, **family_arg))]
    # An op is its kernel and the problem its backward is planned for (op_key), as generator.nn.Linear builds them.
    keys = list(dict.fromkeys(op_key(p) for pairs in plans.values() for _, p in pairs))
    start = time.perf_counter()
    built = dict(zip(keys, compile_many([c for c, _ in keys], namespace="gemmgen", problems=[p for _, p in keys])))
    print(f"built {len({c for c, _ in keys})} kernels in {time.perf_counter() - start:.1f} s", flush=True)
    if buckets is None:
        return {key: built[op_key(pairs[0][1])] for key, pairs in plans.items()}
    return {key: BucketedOp.from_built([(bound, op_key(p)) for bound, p in pairs], built)
            for key, pairs in plans.items()}


def run(shapes, dtypes, layout, with_triton: bool, rounds: int = 2, family: str | None = None,
        order: str = "balanced", with_triton_mma_sync: bool = False, buckets: tuple[int, ...] | None = None,
        batched_layout: str | None = None) -> list[Row]:
    family_arg = {"family": family} if family else {}
    ops = planned_ops(shapes, dtypes, layout, family_arg, buckets, batched_layout)
    warm_up_gpu()
    if with_triton or with_triton_mma_sync:
        from triton_matmul import mma_sync_build_instructions, triton_matmul
    rows = []
    batch_column = any(len(s) == 4 for s in shapes)
    for (shape, dname), op in ops.items():
        if len(shape) == 4:
            row = run_batched(shape, dname, op, batched_layout or layout, rounds, order)
            rows.append(row)
            print(format_row(row, batch_column), flush=True)
            continue
        m, n, k = shape
        dtype = DTYPES[dname]
        kernel = op.select(m) if buckets is not None else op   # the kernel this M's calls take
        a, b = operands(layout, m, n, k, dtype)
        d = op(a, b)
        ref = a.float() @ b.float()
        err = ((d.float() - ref).norm() / ref.norm()).item()
        timed = {"ours": lambda: op(a, b), "cublas": lambda: torch.matmul(a, b)}
        if with_triton:
            timed["triton"] = lambda: triton_matmul(a, b)
        if with_triton_mma_sync:
            timed["triton_mma_sync"] = lambda: triton_matmul(a, b, mma_sync=True)
        # One untimed call each first: Triton autotunes on its first call for a new shape, and inside
        # do_bench that call skews the run-count estimate (the first row of a run read 0.2-0.4x).
        for fn in timed.values():
            fn()
        torch.cuda.synchronize()
        if with_triton_mma_sync:
            check_mma_sync_build(mma_sync_build_instructions())
        ms = timed_rounds(timed, rounds, order)
        ours, cublas, tri, tri_v2 = ms["ours"], ms["cublas"], ms.get("triton"), ms.get("triton_mma_sync")
        row = Row(m, n, k, dname, layout, kernel.name, ours, cublas, tri, tflops(m, n, k, ours), tflops(m, n, k, cublas),
                  tflops(m, n, k, tri) if tri else None, cublas / ours, (tri / ours) if tri else None, err,
                  tri_v2, tflops(m, n, k, tri_v2) if tri_v2 else None, (tri_v2 / ours) if tri_v2 else None,
                  kernel.path(a, b), gbps(a, b, d, ours), gbps(a, b, d, cublas))
        rows.append(row)
        print(format_row(row, batch_column), flush=True)
    return rows


def run_batched(shape: tuple[int, int, int, int], dname: str, op, layout: str, rounds: int, order: str) -> Row:
    """One batched row: our op on (batch, M, K) and (batch, K, N) next to torch.bmm on the same tensors; no Triton
    column (triton_matmul.py has no batched kernel)."""
    batch, m, n, k = shape
    a, b = batched_operands(layout, batch, m, n, k, DTYPES[dname])
    d = op(a, b)
    ref = torch.bmm(a.float(), b.float())
    err = ((d.float() - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)).max().item()
    timed = {"ours": lambda: op(a, b), "cublas": lambda: torch.bmm(a, b)}
    for fn in timed.values():
        fn()
    torch.cuda.synchronize()
    ms = timed_rounds(timed, rounds, order)
    ours, cublas = ms["ours"], ms["cublas"]
    return Row(m, n, k, dname, layout, op.name, ours, cublas, None, tflops(batch * m, n, k, ours),
               tflops(batch * m, n, k, cublas), None, cublas / ours, None, err, path=op.path(a, b),
               ours_gbps=gbps(a, b, d, ours), cublas_gbps=gbps(a, b, d, cublas), batch=batch, baseline="torch.bmm")


def check_mma_sync_build(found: set[str]) -> None:
    """The mma.sync column must have run mma.sync; a Triton that ignored DISABLE_MMA_V3 would build wgmma."""
    if "wgmma" in found:
        raise RuntimeError("the Triton mma.sync column was built with wgmma: this Triton ignores DISABLE_MMA_V3")
    if not found:
        print("note: could not read the Triton mma.sync build's PTX; its instructions are unchecked", flush=True)


def header(mma_sync_column: bool = False, batch_column: bool = False) -> str:
    """The table's column names; ``batch_column`` (a run with batched shapes) puts the batch size first."""
    extra = f" {'Tri.mma':>8} {'ours/T.mma':>10}" if mma_sync_column else ""
    first = f"{'batch':>5} " if batch_column else ""
    return (f"{first}{'M':>6} {'N':>6} {'K':>6} {'dtype':>5} {'ours':>8} {'cuBLAS':>8} {'Triton':>8} "
            f"{'ours/cuBLAS':>11} {'ours/Triton':>11}{extra} {'GB/s':>6} {'cuBLAS':>6} {'rel.err':>8}  kernel (path)")


def format_row(r: Row, batch_column: bool = False) -> str:
    tri = f"{r.triton_tflops:8.1f}" if r.triton_tflops else f"{'-':>8}"
    vs_tri = f"{r.vs_triton:11.3f}" if r.vs_triton else f"{'-':>11}"
    extra = f" {r.triton_mma_sync_tflops:8.1f} {r.vs_triton_mma_sync:10.3f}" if r.triton_mma_sync_tflops else ""
    first = f"{r.batch if r.batch is not None else '-':>5} " if batch_column else ""
    return (f"{first}{r.m:>6} {r.n:>6} {r.k:>6} {r.dtype:>5} {r.ours_tflops:8.1f} {r.cublas_tflops:8.1f} {tri} "
            f"{r.vs_cublas:11.3f} {vs_tri}{extra} {r.ours_gbps:6.0f} {r.cublas_gbps:6.0f} {r.rel_error:8.1e}  "
            f"{r.kernel} ({r.path})")


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


BATCHED_LEGEND = ("batched rows (batch column): M, N, K per problem, TFLOP/s = 2*batch*M*N*K / time; the cuBLAS "
                  "column is torch.bmm on the same 3-D tensors; Triton not measured (benchmarks/triton_matmul.py has "
                  "no batched kernel); rel.err the largest per problem")


def summarize(rows: list[Row], dtypes: list[str]) -> dict[str, float]:
    """Geomeans of ours/cuBLAS: the issue's three targets (big squares; the LLM shapes with M >= 1024; with M = 128),
    2-D rows only, and the batched rows' ours/torch.bmm."""
    summary = {}
    llm = set(load_shapes(["llm"]))
    flat = [r for r in rows if r.batch is None]
    for d in dtypes:
        for label, pick in (("square 4096/8192", lambda r: r.m == r.n == r.k and r.m >= 4096),
                            ("llm M>=1024", lambda r: (r.m, r.n, r.k) in llm and r.m >= 1024),
                            ("llm M=128", lambda r: (r.m, r.n, r.k) in llm and r.m == 128)):
            ratios = [r.vs_cublas for r in flat if r.dtype == d and pick(r)]
            if ratios:
                summary[f"{d} {label} geomean ours/cuBLAS"] = round(geomean(ratios), 4)
    for d in dtypes:
        ratios = [r.vs_cublas for r in rows if r.batch is not None and r.dtype == d]
        if ratios:
            summary[f"{d} batched geomean ours/torch.bmm"] = round(geomean(ratios), 4)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", default="square,llm,ragged",
                        help="comma list of shapes.json sets, and bmm (batched: " +
                             ", ".join("x".join(map(str, s)) for s in BMM_SHAPES) + ", batch x M x N x K)")
    parser.add_argument("--shapes", default=None,
                        help="MxNxK,... instead of --set (e.g. the decode shapes 1x4096x4096,16x8192x8192); BxMxNxK "
                             "for a batch of B problems (e.g. 32x2048x2048x128)")
    parser.add_argument("--dtypes", default="bf16,fp16", help="comma list of bf16, fp16")
    parser.add_argument("--bucketed", action="store_true",
                        help="time the M-bucketed op of each N and K (Gemm.compile_buckets, as generator.nn.Linear "
                             "holds) instead of a kernel planned for each shape's M")
    parser.add_argument("--buckets", default=None,
                        help="with --bucketed: the buckets' bounds, e.g. 64,128,512,1024 (default: "
                             f"{','.join(map(str, M_BUCKETS))}, as Gemm.compile_buckets)")
    parser.add_argument("--layout", default=None, choices=["nn", "nt", "tn", "tt"],
                        help="the operands' storage (README, Layouts); default tn, and tt (A and B row-major, as "
                             "torch.bmm's usual operands) for batched shapes")
    parser.add_argument("--family", choices=["sm80", "sm90"], default=None,
                        help="kernel family to plan (default: the planner's choice for the GPU, sm90 on Hopper)")
    parser.add_argument("--no-triton", action="store_true", help="skip the Triton column")
    parser.add_argument("--triton-mma-sync", action="store_true",
                        help="add a column: the Triton kernel built with mma.sync instead of wgmma (DISABLE_MMA_V3=1), "
                             "the peer of the sm80 family on Hopper")
    parser.add_argument("--rounds", type=int, default=2,
                        help="do_bench medians per column and row, interleaved; the table has their median")
    parser.add_argument("--order", choices=sorted(ORDERS), default="balanced",
                        help="how the columns' windows interleave (balanced: every column follows every other "
                             "alike; alternating: the order used until 2026-11-23, kept for comparison)")
    parser.add_argument("--json", default=None, help="where to write the JSON (default $OUT/bench.json or ./bench.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    dtypes = [d for d in args.dtypes.split(",") if d]
    for d in dtypes:
        if d not in DTYPES:
            parser.error(f"--dtypes: {d!r} is not one of {', '.join(DTYPES)}")
    shapes = (parse_shapes(args.shapes, batched=True) if args.shapes
              else load_shapes([s for s in args.set.split(",") if s]))
    batched = any(len(s) == 4 for s in shapes)
    if args.buckets and not args.bucketed:
        parser.error("--buckets sets the bounds of --bucketed ops: add --bucketed")
    buckets = (tuple(int(b) for b in args.buckets.split(",")) if args.buckets else M_BUCKETS) if args.bucketed else None
    if batched and args.bucketed:
        parser.error("--bucketed picks a kernel by A's rows: leave it out for batched shapes (BxMxNxK, --set bmm)")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("TFLOP/s (do_bench median, random data)")
    if batched:
        print(BATCHED_LEGEND)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    print(header(args.triton_mma_sync, batched))
    rows = run(shapes, dtypes, args.layout or "tn", not args.no_triton, args.rounds, args.family, args.order,
               args.triton_mma_sync, buckets, args.layout or "tt")
    print("\n" + header(args.triton_mma_sync, batched))
    for r in rows:
        print(format_row(r, batched))
    summary = summarize(rows, dtypes)
    for key, value in summary.items():
        print(f"{key}: {value}")
    out = Path(args.json) if args.json else Path(os.environ.get("OUT", ".")) / "bench.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "rows": [row_json(r) for r in rows], "summary": summary}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
