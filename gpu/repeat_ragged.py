"""The same ragged call many times over, for errors that move (a race): every sm90 cluster shape that shares an
operand tile across 2-4 blocks, in all four layouts, at shapes whose tiles lie mostly past M or N, each call on
fresh operands against float64. Prints one line per (kernel, shape) that went wrong, and the first shape's line
for each kernel whatever it read.

    python3 gpu/repeat_ragged.py                    (REPS=30 calls per kernel and shape)
    REPS=400 SHAPES=1x1x4097,1x1x16384 python3 gpu/repeat_ragged.py
    REPS=200 GEMMGEN_EXTRA_NVCC_FLAGS=-DGEMMGEN_SM90_SKIP_OOB_LOADS=0 python3 gpu/repeat_ragged.py

Each line also gives the worst error against the products' magnitudes, ||D - AB|| / ||(|A| |B|)||, which a sum that
cancels does not inflate (docs/defects.md, "A single dot product's relative error: the sum cancels, not a race").
"""
from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

# (schedule, tile, cluster)
VARIANTS = [("pingpong", (128, 128, 64), (4, 1)), ("pingpong", (128, 128, 64), (2, 1)),
            ("cooperative", (128, 256, 64), (2, 1)), ("ws", (128, 128, 64), (1, 4))]
LAYOUTS = ["nt", "tn", "nn", "tt"]
SHAPES = [(1, 1, 4097), (1, 1, 4096), (1, 1, 65), (1, 1, 1000), (1, 64, 4097), (7, 1, 4097), (1, 1, 16384),
          (129, 1, 4097), (1000, 1000, 4097), (600, 129, 4097)]
if os.environ.get("SHAPES"):   # e.g. SHAPES=1x1x4097,1x1x16384
    SHAPES = [tuple(int(v) for v in s.split("x")) for s in os.environ["SHAPES"].split(",")]
BOUND = 0.01   # bf16 (tests/gpu/gpu_cases.py)


def operand(rows: int, cols: int, order: str) -> torch.Tensor:
    """Random bf16 (rows, cols) stored row- or column-major, the leading dimension padded to 16 bytes (the TMA path),
    as test_sm90's operands."""
    if order == "row":
        return torch.randn(rows, -(-cols // 8) * 8, device="cuda").bfloat16()[:, :cols]
    return torch.randn(cols, -(-rows // 8) * 8, device="cuda").bfloat16()[:, :rows].t()


def main() -> None:
    reps = int(os.environ.get("REPS", "30"))
    flags = os.environ.get("GEMMGEN_EXTRA_NVCC_FLAGS", "")
    keys = list(itertools.product(VARIANTS, LAYOUTS))
    configs = [Gemm(dtype="bf16", layout=layout, arch=90, schedule=schedule, tile_shape=tile,
                    cluster_shape=cluster).config for (schedule, tile, cluster), layout in keys]
    for (_, layout), op in zip(keys, compile_many(configs, namespace="gemmgen_repeat_ragged")):
        for shape in SHAPES:
            m, n, k = shape
            wrong, worst, worst_scaled = 0, 0.0, 0.0
            for _ in range(reps):
                a = operand(m, k, "row" if layout[0] == "t" else "col")
                b = operand(k, n, "row" if layout[1] == "t" else "col")
                ref = a.double() @ b.double()
                diff = (op(a, b).double() - ref).norm()
                err = (diff / ref.norm()).item()
                # against the products' magnitudes, ||(|A| |B|)||: what rounding can reach whatever the sums cancel
                scaled = (diff / (a.double().abs() @ b.double().abs()).norm()).item()
                worst = max(worst, err if err == err else float("inf"))
                worst_scaled = max(worst_scaled, scaled if scaled == scaled else float("inf"))
                wrong += not err <= BOUND
            if wrong or shape == SHAPES[0]:
                print(f"[{flags}] {op.name} {m}x{n}x{k} path={op.path(a, b)}: {wrong}/{reps} wrong, worst {worst:.3g}; "
                      f"against |A| |B|: worst {worst_scaled:.3g}", flush=True)
    print("done", flags)


if __name__ == "__main__":
    main()
