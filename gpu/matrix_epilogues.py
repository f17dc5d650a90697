"""Epilogues that read an M x N operand element by element (one that is not the kernel's TMA-loaded source: a second
matrix, a column-major one), beside the plain GEMM on the same shape, each checked against a float32 reference.
For an A/B of the parts their epilogue runs in (GEMMGEN_SM90_EPILOGUE_MATRIX_PART), run it twice:

    python3 gpu/matrix_epilogues.py --json $OUT/matrix_epilogues_parts.json
    GEMMGEN_EXTRA_NVCC_FLAGS=-DGEMMGEN_SM90_EPILOGUE_MATRIX_PART=0 python3 gpu/matrix_epilogues.py \\
        --json $OUT/matrix_epilogues_elementwise.json

bf16, layout tn, the planner's kernel per shape (and a 128x128 pingpong one), do_bench medians of --rounds rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench import timed_rounds  # noqa: E402
from generator import Gemm  # noqa: E402
from generator import epilogue as ep  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

COL_FP32 = ep.Matrix(dtype="fp32", order="col")


def gate_plus_residual(acc, gate: ep.Matrix, res: ep.Matrix):
    """silu(acc) * gate + res: two row-major bf16 operands, the second not the kernel's source."""
    return ep.silu(acc) * gate + res


def gelu_plus_col_major(acc, R: COL_FP32):
    """gelu(acc) + R with R column-major fp32: no TMA source."""
    return ep.gelu(acc) + R


#: name -> (Gemm hints, epilogue or None)
VARIANTS = {
    "plain": ({}, None),
    "gate_plus_residual": ({}, gate_plus_residual),
    "gate_plus_residual_pp128": (dict(schedule="pingpong", tile_shape=(128, 128, 64), cluster_shape=(1, 1)),
                                 gate_plus_residual),
    "gelu_plus_col_major": ({}, gelu_plus_col_major),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4096x4096x4096,4096x14336x4096,1000x4104x4096")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "matrix_epilogues.json"))
    args = p.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    plans = {(s, name): Gemm("bf16", "tn", m=s[0], n=s[1], k=s[2], epilogue=fn, **hints)
             for s in shapes for name, (hints, fn) in VARIANTS.items()}
    built = dict(zip(plans, compile_many([g.config for g in plans.values()], namespace="gemmgen_matrix_ep")))
    rows, bad = [], []
    for m, n, k in shapes:
        x, w = torch.randn(m, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16()
        gate, res = torch.randn(m, n, device="cuda").bfloat16(), torch.randn(m, n, device="cuda").bfloat16()
        col = torch.randn(n, m, device="cuda").t()                     # (m, n), column-major fp32
        acc = x.float() @ w.float().t()
        refs = {"plain": acc, "gate_plus_residual": F.silu(acc) * gate.float() + res.float(),
                "gelu_plus_col_major": F.gelu(acc) + col}
        operands = {"plain": (), "gate_plus_residual": (gate, res), "gelu_plus_col_major": (col,)}
        calls = {}
        for name in VARIANTS:
            base = name.removesuffix("_pp128")
            op = built[((m, n, k), name)]
            calls[name] = (lambda op=op, extra=operands[base]: op(x, w.t(), *extra))
            out = calls[name]().float()
            err = ((out - refs[base]).norm() / refs[base].norm()).item()
            rows.append({"shape": [m, n, k], "name": name, "kernel": op.name, "rel_error": err})
            if not err < 1e-2:
                bad.append(f"{m}x{n}x{k} {name}: {err:.1e}")
        ms_of = timed_rounds(calls, args.rounds)
        for row in rows[-len(calls):]:
            row["ms"] = ms_of[row["name"]]
            row["tflops"] = 2 * m * n * k / row["ms"] / 1e9
            print(f"{m}x{n}x{k} {row['name']:<26} {row['ms']:.4f} ms {row['tflops']:7.1f} TFLOP/s "
                  f"rel.err {row['rel_error']:.1e}  {row['kernel']}", flush=True)
    Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                           "flags": os.environ.get("GEMMGEN_EXTRA_NVCC_FLAGS", ""),
                                           "rows": rows}, indent=1))
    if bad:
        print("WRONG: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
