"""How often a kernel promotes fp8 wgmma sums into fp32, read from its error: fp8 wgmma keeps fewer bits than fp32
in its additions (PTX ISA 9.7.15), so the longer a run of k values summed inside the tensor core, the larger the error
of an fp32 output against float64. Our promoted kernel sums 128 k values at a time (one k tile) and fast accumulation
all of K; cuBLAS' `_scaled_mm` without `use_fast_accum` promotes at an interval it does not document. Equal errors at
every K say equal intervals.

    python3 gpu/fp8_accumulation_probe.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from generator import Gemm, dequantize, quantize


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).norm() / ref.norm()).item()


def probe(m: int, n: int, k: int) -> dict[str, float]:
    x, w = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
    a, sa = quantize(x, "e4m3", scale="tensor")
    q, sw = quantize(w, "e4m3", scale="tensor")
    ref = dequantize(a, sa, scale="tensor").double() @ dequantize(q, sw, scale="tensor").double().t()
    b = q.t()
    errors = {}
    for fast in (False, True):
        plan = Gemm("e4m3", "tn", out_dtype="fp32", scale="tensor", fast_accum=fast, arch=90, m=m, n=n, k=k)
        errors["ours_fast" if fast else "ours_promoted"] = rel_error(plan.compile()(a, b, sa, sw), ref)
        theirs = torch._scaled_mm(a, b, sa, sw, out_dtype=torch.float32, use_fast_accum=fast)
        errors["scaled_mm_fast" if fast else "scaled_mm"] = rel_error(theirs, ref)
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, default=512)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--ks", default="512,1024,2048,4096,8192,16384,32768")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    for k in (int(v) for v in args.ks.split(",")):
        errors = probe(args.m, args.n, k)
        rows.append({"m": args.m, "n": args.n, "k": k, **errors})
        print(f"K={k:6d}  " + "  ".join(f"{name} {value:.2e}" for name, value in errors.items()), flush=True)
    if args.json:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
