"""Which kernels cuBLAS runs for the corpus' GEMMs: name, grid, block and time of every kernel torch.matmul
launches, read from a torch.profiler trace. cuBLAS's nvjet kernel names carry the tile, stages and cluster it chose
(e.g. ``nvjet_sm90_tst_192x128_64x5_2x1_v_bz_coopA_TNT``), and a split-K run shows as a second (reduce) kernel or
as a grid larger than the tile count: the map of what wins where, for the planner's candidate space.

    python3 gpu/cublas_kernels.py [--tokens 64,256,1024] [--passes fwd,dX,dW] [--json $OUT/cublas_kernels.json]
    python3 gpu/cublas_kernels.py --scaled 2048x7168x2048,256x3072x8192   # torch._scaled_mm's fp8 kernels instead
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import torch  # noqa: E402

import corpus  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


NVJET = re.compile(r"nvjet_sm90_\w+?_(\d+)x(\d+)_(\d+)x(\d+)_(\d+)x(\d+)_")


def parse_nvjet(name: str) -> dict | None:
    """What an nvjet kernel name says, in our terms: ``nvjet_sm90_tst_<BN>x<BM>_<BK>x<stages>_<cluster N>x<cluster M>``
    (cuBLAS computes D^T = B^T A^T column-major, so its first tile side is our N and its cluster's first side our N
    too), and whether it splits K (a ``splitKreduce`` kernel follows it). None for any other kernel."""
    match = NVJET.search(name)
    if match is None:
        return None
    bn, bm, bk, stages, cluster_n, cluster_m = map(int, match.groups())
    return {"tile": [bm, bn, bk], "stages": stages, "cluster": [cluster_m, cluster_n], "split_k": "splitK" in name}


def theirs(pass_: str, tokens: int, n: int, k: int, dtype: torch.dtype):
    """torch's product for one pass of y = x @ W.t(), called as autograd calls it."""
    X = torch.randn(tokens, k, device="cuda", dtype=dtype)
    W = torch.randn(n, k, device="cuda", dtype=dtype)
    dY = torch.randn(tokens, n, device="cuda", dtype=dtype)
    return lambda: corpus.pass_product(pass_, X, W, dY)


def scaled(m: int, n: int, k: int, mode: str):
    """torch._scaled_mm on e4m3 operands (layout tn, bf16 out) with one scale per operand (``tensor``, and
    ``tensor_fast`` with use_fast_accum) or per row of A and column of B (``row``)."""
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    if mode == "row":
        sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
    else:
        sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(2.0, device="cuda")
    fast = mode == "tensor_fast"
    return lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)


def scaled_rows(shapes: str, repeats: int) -> list[dict]:
    rows = []
    for shape in shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        for mode in ("tensor", "tensor_fast", "row"):
            kernels = kernels_of(scaled(m, n, k, mode), repeats)
            rows.append({"mode": mode, "m": m, "n": n, "k": k, "kernels": kernels})
            names = " + ".join(f"{x['name'][:90]} grid{tuple(x['grid'] or ())} {x['us']:.1f}us" for x in kernels)
            print(f"fp8 {mode:11s} {m:6d} {n:6d} {k:6d}  {names}", flush=True)
    return rows


def kernels_of(fn, repeats: int) -> list[dict]:
    """The kernels of one call of ``fn`` (its last of ``repeats`` profiled calls), with their median duration."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text())["traceEvents"]
    launched = [e for e in events if e.get("cat") == "kernel"]
    per_call = len(launched) // repeats
    if per_call == 0:
        return []
    out = []
    for i in range(per_call):
        same = sorted(e["dur"] for e in launched[i::per_call])
        e = launched[i]
        out.append({"name": e["name"], "grid": e["args"].get("grid"), "block": e["args"].get("block"),
                    "us": same[len(same) // 2], "parsed": parse_nvjet(e["name"])})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="16,64,128,256,512,1024")
    ap.add_argument("--passes", default="fwd,dX,dW")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--scaled", default="", help="MxNxK,...: torch._scaled_mm's fp8 kernels on these shapes (per "
                    "tensor, with fast accumulation, rowwise) instead of the corpus' 16-bit GEMMs")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "cublas_kernels.json"))
    args = ap.parse_args()
    if args.scaled:
        rows = scaled_rows(args.scaled, args.repeats)
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                               "dtype": "e4m3", "rows": rows}, indent=1))
        print(f"wrote {args.json}")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = corpus.rows(tokens=[int(t) for t in args.tokens.split(",")], passes=args.passes.split(","))
    seen: dict[tuple, dict] = {}
    for row in rows:
        if row.gemm in seen:
            continue
        fn = theirs(row.pass_, row.tokens, row.out_features, row.in_features, DTYPES[args.dtype])
        kernels = kernels_of(fn, args.repeats)
        seen[row.gemm] = {"pass": row.pass_, "m": row.m, "n": row.n, "k": row.k, "layer": row.layer,
                          "kernels": kernels}
        names = " + ".join(f"{k['name'][:70]} grid{tuple(k['grid'] or ())} {k['us']:.1f}us" for k in kernels)
        print(f"{row.pass_:3s} {row.m:6d} {row.n:6d} {row.k:6d}  {names}", flush=True)
    Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                           "dtype": args.dtype, "rows": list(seen.values())}, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
