"""Probe: where a decode step's grouped call spends its time. The same routed rows (one row in each of 8 groups) in
calls of 8, 128 and 512 groups, the rows in the first, the last or spread groups; each timed by do_bench (stream
launches: the host's time per call shows where it exceeds the GPU's) and by do_bench_cudagraph (graph replays: the
GPU's time alone), ours beside torch._grouped_mm.

    python gpu/grouped_overhead_probe.py [--n 1536] [--k 2048] [--json $OUT/grouped_overhead_probe.json]

What it separates: a cost that grows with the groups walked before a tile's group (the kernel's walk over the
ends: "last" against "first"), with the groups in the call (E), or with the host (do_bench against the graph).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_grouped import ends  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

ACTIVE = 8   # groups with a row: a token's top-8 experts


def layouts(groups: int) -> dict[str, list[int]]:
    """{name: groups holding one row each} for a call of ``groups`` groups."""
    spread = list(range(0, groups, groups // ACTIVE))[:ACTIVE]
    return {"first": list(range(ACTIVE)), "last": list(range(groups - ACTIVE, groups)), "spread": spread}


def ends_of(groups: int, active: list[int]) -> torch.Tensor:
    """The offsets of ``groups`` groups, one row in each of ``active``."""
    return torch.tensor(ends([1 if g in active else 0 for g in range(groups)]), dtype=torch.int32, device="cuda")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1536)
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--groups", default="8,128,512")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("grouped_overhead_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench, do_bench_cudagraph

    plan = Gemm("bf16", "tn", m=1, n=args.n, k=args.k, batch=128, ragged=True)
    (op,) = compile_many([plan.config], namespace="gemmgen")
    print(f"{torch.cuda.get_device_name()}: {plan.name}, N {args.n}, K {args.k}, {ACTIVE} groups of one row")
    a = torch.randn(ACTIVE, args.k, device="cuda").to(torch.bfloat16)
    rows = []
    for groups in (int(g) for g in args.groups.split(",")):
        w = torch.randn(groups, args.n, args.k, device="cuda").to(torch.bfloat16)
        b = w.transpose(1, 2)
        for name, active in layouts(groups).items():
            if groups == ACTIVE and name != "first":
                continue
            offsets = ends_of(groups, active)
            ref = torch.cat([a[i:i + 1].float() @ b[g].float() for i, g in enumerate(active)])
            err = ((op.grouped(a, b, offsets).float() - ref).norm() / ref.norm()).item()
            calls = {"ours": lambda: op.grouped(a, b, offsets),
                     "grouped_mm": lambda: torch._grouped_mm(a, b, offs=offsets)}
            row = {"groups": groups, "active": name, "rel_error": err}
            for who, fn in calls.items():
                fn()
                torch.cuda.synchronize()
                row[f"{who}_stream_us"] = do_bench(fn, rep=100) * 1e3
                row[f"{who}_graph_us"] = do_bench_cudagraph(fn, rep=100) * 1e3
            rows.append(row)
            print(f"E {groups:4} rows in {name:6} groups: ours {row['ours_stream_us']:6.1f} us stream, "
                  f"{row['ours_graph_us']:6.1f} us graph | _grouped_mm {row['grouped_mm_stream_us']:6.1f} / "
                  f"{row['grouped_mm_graph_us']:6.1f} | rel.err {err:.1e}", flush=True)
        del w, b
    out = Path(args.json) if args.json else Path(os.environ.get("OUT", ".")) / "grouped_overhead_probe.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "kernel": plan.name, "n": args.n,
                               "k": args.k, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
