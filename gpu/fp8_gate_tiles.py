"""Where the fp8 MLP's gate GEMM loses its time: the gate kernel of examples/fp8_mlp.py (block-scaled e4m3,
epilogue silu(acc) * up, quantized on store to e4m3 with 1x128 scales) on other tiles and schedules, beside the
same kernel with parts of its epilogue left out (no `up` operand; bf16 out, no quantization) and the plain up GEMM,
all on the block's shapes, each checked against a float32 reference. do_bench medians over interleaved rounds.

    python3 gpu/fp8_gate_tiles.py [--tokens 4096] [--hidden 4096] [--intermediate 14336] [--rounds 3] [--json F]

Each variant is a name and Gemm hints; "pick" is what the planner chose for the example.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench import timed_rounds  # noqa: E402
from fp8_mlp import silu_times_up  # noqa: E402
from generator import Gemm, dequantize, quantize  # noqa: E402
from generator import epilogue as ep  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

#: (name, epilogue kind, Gemm hints): "gate" is silu(acc) * up quantized on store; "gate_bf16" the same epilogue
#: writing bf16; "silu_q" silu(acc) quantized on store (no operand); "up" the plain GEMM writing bf16.
VARIANTS = [
    ("pick", "gate", {}),
    ("256x128 coop 1x2", "gate", dict(tile_shape=(256, 128, 128), cluster_shape=(1, 2), schedule="cooperative")),
    ("128x128 coop 2x1", "gate", dict(tile_shape=(128, 128, 128), cluster_shape=(2, 1), schedule="cooperative")),
    ("128x128 pp 2x1", "gate", dict(tile_shape=(128, 128, 128), cluster_shape=(2, 1), schedule="pingpong")),
    ("64x256 pp 2x1", "gate", dict(tile_shape=(64, 256, 128), cluster_shape=(2, 1), schedule="pingpong")),
    ("64x128 pp 2x1", "gate", dict(tile_shape=(64, 128, 128), cluster_shape=(2, 1), schedule="pingpong")),
    ("pick, bf16 out", "gate_bf16", {}),
    ("pick, silu only", "silu_q", {}),
    ("up (pick)", "up", {}),
]


def silu_only(acc):
    return ep.silu(acc)


def plan(kind: str, hints: dict, m: int, n: int, k: int) -> Gemm:
    base = dict(layout="tn", scale="block", m=m, n=n, k=k, **hints)
    if kind == "gate":
        return Gemm("e4m3", epilogue=silu_times_up, out_dtype="e4m3", **base)
    if kind == "gate_bf16":
        return Gemm("e4m3", epilogue=silu_times_up, **base)
    if kind == "silu_q":
        return Gemm("e4m3", epilogue=silu_only, out_dtype="e4m3", **base)
    return Gemm("e4m3", **base)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "fp8_gate_tiles.json"))
    args = p.parse_args(argv)
    m, n, k = args.tokens, args.intermediate, args.hidden
    plans = [(name, kind, plan(kind, hints, m, n, k)) for name, kind, hints in VARIANTS]
    ops = compile_many([g.config for *_, g in plans], namespace="gemmgen_fp8_gate")
    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).bfloat16()
    up = torch.randn(m, n, device="cuda").bfloat16()
    x8, sx = quantize(x, "e4m3", scale="block")
    w8, sw = quantize(w, "e4m3", scale="block", block=(128, 128))
    # the reference: the fp8 operands dequantized, in float32
    acc = dequantize(x8, sx, scale="block") @ dequantize(w8, sw, scale="block", block=(128, 128)).t()
    refs = {"gate": torch.nn.functional.silu(acc) * up.float(), "silu_q": torch.nn.functional.silu(acc), "up": acc}
    refs["gate_bf16"] = refs["gate"]
    calls, rows = {}, []
    for (name, kind, g), op in zip(plans, ops):
        extra = (up,) if kind.startswith("gate") else ()
        call = (lambda op=op, extra=extra: op(x8, w8.t(), sx, sw, *extra))
        out = call()
        if isinstance(out, tuple):   # quantized: (e4m3 D, its 1x128 scales)
            out = dequantize(*out, scale="block")
        ref = refs[kind]
        err = ((out.float() - ref).norm() / ref.norm()).item()
        calls[name] = call
        rows.append({"name": name, "kernel": op.name, "rel_error": err})
    ms_of = timed_rounds(calls, args.rounds)
    flops = 2 * m * n * k
    print(f"{torch.cuda.get_device_name()}: gate GEMM {m}x{n}x{k} (e4m3, block scales), do_bench medians")
    for row in rows:
        ms = ms_of[row["name"]]
        row.update(ms=ms, tflops=flops / ms / 1e9)
        print(f"  {row['name']:<20} {ms:8.4f} ms {row['tflops']:7.1f} TFLOP/s  rel.err {row['rel_error']:.1e}  "
              f"{row['kernel']}")
    Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "m": m, "n": n, "k": k,
                                           "rows": rows}, indent=1))
    bad = [r["name"] for r in rows if not r["rel_error"] < 0.08]
    if bad:
        print("WRONG: " + ", ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
