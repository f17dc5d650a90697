"""plan.tune() on GEMMs the shipped dispatch table does not cover (Mistral-NeMo-12B's layers, a model outside the corpus:
hidden 5120, 32 query heads and 8 kv heads of 128, MLP 14336), against torch.matmul side by side: whether tune() finds
a kernel at or above cuBLAS where its candidates hold one (issue 34's tune() target; docs/tuning.md). For each
shape: the estimate's pick, tune()'s winner (a fresh measurement, force=True) and every candidate it timed, then the
pick, the winner and torch.matmul timed again in interleaved rounds. Writes $OUT/tune_uncovered.json.

    python3 gpu/tune_uncovered.py [--max-candidates 12] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench import operands, timed_rounds  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

#: (M, N, K) of y = x @ W.t() for Mistral-NeMo-12B's projections at a few token counts: q, k (= v), o, MLP up, down.
SHAPES = [(384, 4096, 5120), (768, 1024, 5120), (256, 5120, 4096), (384, 14336, 5120), (640, 5120, 14336)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-candidates", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for m, n, k in SHAPES:
        plan = Gemm("bf16", "tn", arch=90, m=m, n=n, k=k)
        pick = plan.config
        source = "table" if plan.tuned is not None else "estimate"
        result = plan.tune(max_candidates=args.max_candidates, progress=False, force=True)
        a, b = operands("tn", m, n, k, torch.bfloat16)
        pick_op, winner_op = compile_many([pick, result.winner], namespace="gemmgen_tune_uncovered")
        fns = {"pick": lambda: pick_op(a, b), "winner": lambda: winner_op(a, b), "cublas": lambda: torch.matmul(a, b)}
        ms = timed_rounds(fns, args.rounds)
        candidates = sorted((c.ms, c.config.name) for c in result.table if c.ms is not None)
        row = {"shape": [m, n, k], "pick": pick.name, "pick_source": source, "winner": result.winner.name,
               "tune_ms": result.ms, "tune_pick_ms": result.pick_ms, "candidates": candidates,
               "winner_ms": ms["winner"], "cublas_ms": ms["cublas"], "pick_ms": ms["pick"],
               "winner_vs_cublas": ms["cublas"] / ms["winner"]}
        rows.append(row)
        print(f"{m}x{n}x{k}: pick {pick.name} ({source}); tune -> {result.winner.name} "
              f"({result.pick_ms / result.ms:.3f}x the pick in tune); again: winner / cuBLAS {row['winner_vs_cublas']:.3f}, "
              f"pick / cuBLAS {ms['cublas'] / ms['pick']:.3f}", flush=True)
    out = Path(os.environ.get("OUT", ".")) / "tune_uncovered.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                              indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
