"""The sm90 kernels around the planner's pick on batched shapes, timed beside torch.bmm in one run: which tile,
cluster and schedule a batch of problems wants (docs/batched.md).

    python3 gpu/bmm_tiles.py [--shapes 32x2048x2048x128,512x256x256x256] [--json $OUT/bmm_tiles.json]

Shapes are batch x M x N x K, bf16, A and B row-major (layout tt, torch.bmm's operands). Each row: the kernel,
its TFLOP/s, the ratio to torch.bmm measured in the same interleaved rounds, and its error against float32.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import torch  # noqa: E402

from bench import parse_shapes, timed_rounds  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime.op import compile_many  # noqa: E402

# (tile, cluster, schedule, stages or None for the planner's depth)
CANDIDATES = [((128, 128, 64), (1, 1), "pingpong", None), ((128, 128, 64), (2, 1), "pingpong", None),
              ((128, 128, 64), (1, 2), "pingpong", None), ((128, 256, 64), (1, 1), "cooperative", None),
              ((128, 256, 64), (2, 1), "cooperative", None), ((256, 128, 64), (1, 1), "cooperative", None),
              ((256, 128, 64), (1, 2), "cooperative", None), ((128, 128, 64), (1, 1), "cooperative", None),
              ((64, 256, 64), (1, 1), "pingpong", None), ((64, 128, 64), (1, 1), "pingpong", None),
              ((128, 192, 64), (1, 1), "cooperative", None), ((128, 256, 64), (2, 1), "cooperative", 3),
              ((128, 128, 64), (2, 1), "pingpong", 4), ((256, 128, 64), (1, 2), "cooperative", 3)]


def plans_for(batch: int, m: int, n: int, k: int) -> list[Gemm]:
    plans = [Gemm("bf16", "tt", arch=90, m=m, n=n, k=k, batch=batch)]
    for tile, cluster, schedule, stages in CANDIDATES:
        knobs = dict(tile_shape=tile, cluster_shape=cluster, schedule=schedule)
        if stages is not None:
            knobs["stages"] = stages
        try:
            plans.append(Gemm("bf16", "tt", arch=90, m=m, n=n, k=k, batch=batch, **knobs))
        except ValueError as refused:   # not legal for this dtype or layout: say so and go on
            print(f"  skip {tile} {cluster} {schedule}: {refused}")
    unique = {p.config.name: p for p in plans}
    return list(unique.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="32x2048x2048x128,512x256x256x256")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "bmm_tiles.json"))
    args = ap.parse_args()
    rows = []
    for batch, m, n, k in parse_shapes(args.shapes, batched=True):
        plans = plans_for(batch, m, n, k)
        ops = compile_many([p.config for p in plans], namespace="gemmgen_bmm_tiles")
        a = torch.randn(batch, m, k, device="cuda").bfloat16()
        b = torch.randn(batch, k, n, device="cuda").bfloat16()
        ref = torch.bmm(a.float(), b.float())
        fns = {"torch.bmm": lambda: torch.bmm(a, b)}
        fns.update({op.name: (lambda op=op: op(a, b)) for op in ops})
        times = timed_rounds(fns, args.rounds)
        flops = 2.0 * batch * m * n * k
        print(f"{batch}x{m}x{n}x{k}: torch.bmm {flops / times['torch.bmm'] / 1e9:.1f} TFLOP/s")
        for i, op in enumerate(ops):
            err = ((op(a, b).float() - ref).norm() / ref.norm()).item()
            ratio = times["torch.bmm"] / times[op.name]
            pick = " (planner's pick)" if i == 0 else ""
            print(f"  {op.name:48s} {flops / times[op.name] / 1e9:7.1f}  x{ratio:.3f} torch.bmm  err {err:.1e}{pick}")
            rows.append(dict(batch=batch, m=m, n=n, k=k, kernel=op.name, picked=i == 0, ms=times[op.name],
                             bmm_ms=times["torch.bmm"], vs_bmm=ratio, err=err))
    Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
