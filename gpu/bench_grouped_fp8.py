"""fp8 grouped GEMM with DeepSeek's per-block scales against DeepGEMM's published H800 figures (issue 35's targets) and
against our dense block-scaled kernel on the same rows: TFLOP/s of ``op.grouped(A, B, offsets, scale_a, scale_b)``
(contiguous: 4 groups of 8192 rows at N 4096, K 7168 and at N 7168, K 2048) and of ``op.masked`` (4 groups of 256
rows in slabs of 256, N 4096, K 7168), each op planned for its groups (Gemm("e4m3", "tn", scale="block", m=rows per
group, n=, k=, batch=E)); the dense column is one GEMM of all the rows times one expert's weight. do_bench medians of three rounds.
Writes $OUT/bench_grouped_fp8.json.

    python3 gpu/bench_grouped_fp8.py
    python3 gpu/bench_grouped_fp8.py --candidates   (also each case on the tiles and clusters of CANDIDATES)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch
from triton.testing import do_bench

from generator import Gemm, quantize
from generator.runtime import compile_many

#: (form, groups, rows per group, N, K, DeepGEMM's H800 TFLOP/s)
CASES = [("contiguous", 4, 8192, 4096, 7168, 1297), ("contiguous", 4, 8192, 7168, 2048, 1099),
         ("masked", 4, 256, 4096, 7168, 932)]


#: (tile, cluster) tried beside the planner's pick with --candidates; those a plan refuses are left out
CANDIDATES = [((128, 256, 128), (1, 1)), ((128, 256, 128), (2, 1)), ((128, 256, 128), (1, 2)),
              ((128, 128, 128), (1, 1)), ((128, 128, 128), (2, 1)), ((128, 192, 128), (2, 1)),
              ((128, 160, 128), (2, 1)), ((128, 112, 128), (2, 1)), ((64, 256, 128), (2, 1))]


def candidate_plans(groups: int, per_group: int, n: int, k: int) -> list[Gemm]:
    plans = []
    for tile, cluster in CANDIDATES:
        try:
            plans.append(Gemm("e4m3", "tn", arch=90, scale="block", m=per_group, n=n, k=k, batch=groups,
                              tile_shape=tile, cluster_shape=cluster))
        except (ValueError, NotImplementedError) as err:
            print(f"  candidate {tile} {cluster} refused: {str(err).splitlines()[0]}")
    return plans


def tflops(flop: float, ms: float) -> float:
    return flop / ms / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", action="store_true", help="also time the CANDIDATES tiles and clusters")
    args = parser.parse_args()
    plans = [(Gemm("e4m3", "tn", arch=90, scale="block", m=per_group, n=n, k=k, batch=groups),
              Gemm("e4m3", "tn", arch=90, scale="block", m=groups * per_group, n=n, k=k))
             for _, groups, per_group, n, k, _ in CASES]
    built = compile_many([p.config for pair in plans for p in pair], namespace="gemmgen_bench_grouped_fp8")
    extra = [candidate_plans(groups, per_group, n, k) if args.candidates else [] for _, groups, per_group, n, k, _
             in CASES]
    extra_built = compile_many([p.config for ps in extra for p in ps], namespace="gemmgen_bench_grouped_fp8_c") \
        if args.candidates else []
    rows = []
    for i, (form, groups, per_group, n, k, deepgemm) in enumerate(CASES):
        total = groups * per_group
        grouped, dense = built[2 * i], built[2 * i + 1]
        a, scale_a = quantize(torch.randn(total, k, device="cuda"), "e4m3", scale="block")
        q, scale_b = quantize(torch.randn(groups, n, k, device="cuda"), "e4m3", scale="block", block=(128, 128))
        b = q.transpose(1, 2)
        offsets = torch.full((groups,), per_group, device="cuda").cumsum(0).to(torch.int32)
        counts = torch.full((groups,), per_group, dtype=torch.int32, device="cuda")
        a3, sa3 = a.view(groups, per_group, k), scale_a.view(groups, per_group, -1)

        def call(op):
            if form == "contiguous":
                return lambda: op.grouped(a, b, offsets, scale_a, scale_b)
            return lambda: op.masked(a3, b, counts, sa3, scale_b)
        run = call(grouped)
        run_dense = lambda: dense(a, b[0], scale_a, scale_b[0])  # noqa: E731
        times = {"grouped": [], "dense": []}
        for _ in range(3):
            times["grouped"].append(do_bench(run, warmup=25, rep=100))
            times["dense"].append(do_bench(run_dense, warmup=25, rep=100))
        flop = 2.0 * total * n * k
        row = {"form": form, "groups": groups, "rows_per_group": per_group, "n": n, "k": k,
               "grouped_tflops": tflops(flop, statistics.median(times["grouped"])),
               "dense_tflops": tflops(flop, statistics.median(times["dense"])), "deepgemm_h800_tflops": deepgemm,
               "kernel": grouped.name}
        rows.append(row)
        print(f"{form:10s} {groups} x {per_group:5d}, N {n}, K {k}: grouped {row['grouped_tflops']:7.1f} TFLOP/s, "
              f"dense {row['dense_tflops']:7.1f}, DeepGEMM (H800) {deepgemm}  [{grouped.name}]", flush=True)
        start = sum(len(ps) for ps in extra[:i])
        row["candidates"] = {}
        for op in extra_built[start:start + len(extra[i])]:
            ms = statistics.median(do_bench(call(op), warmup=25, rep=100) for _ in range(3))
            row["candidates"][op.name] = tflops(flop, ms)
            print(f"    {op.name}: {tflops(flop, ms):7.1f}", flush=True)
    out = Path(os.environ.get("OUT", ".")) / "bench_grouped_fp8.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                              indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
