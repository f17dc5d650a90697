"""The sm90 kernels around the planner's pick for M = 17-1024 (few tiles along M), data-parallel against stream-K,
timed beside cuBLAS in one run: which decomposition fills the GPU when M x N gives fewer tiles than SMs
(docs/sm90.md, "Fewer tiles than SMs").

    python3 gpu/midm_tiles.py [--shapes 64x8192x8192,512x4096x14336] [--json $OUT/midm_tiles.json]
    GEMMGEN_TUNED=0 python3 gpu/midm_tiles.py --corpus-tokens 256,512,1024 --candidates "" \
        --variants raster=n,raster_group=4      (the estimate's pick against the pick with those fields changed)

bf16, x @ W.t() (layout tn), or with --layout tt dY @ W (the dX of a linear layer: B N-major), or with --layout nn
that dX swapped, W.t() @ dY.t() (its transpose; a shape is then in_features x tokens x out_features), beside
cuBLAS's dY @ W. Each row: the kernel, its TFLOP/s, the ratio to torch.matmul measured in the same interleaved
rounds, and its error against float32.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import replace
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import torch  # noqa: E402

from bench import Candidate, parse_candidates, parse_shapes, parse_variants, timed_rounds, variant_of  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.spec.config import KernelConfig  # noqa: E402
from generator.runtime.op import compile_many  # noqa: E402

SHAPES = ("32x8192x8192,64x8192x8192,128x8192x8192,128x4096x4096,128x4096x14336,128x14336x4096,"
          "512x4096x14336,512x4096x4096,128x8192x28672")
# (tile, cluster, schedule, stream-K)
CANDIDATES = [Candidate((128, 64, 64), (1, 1), "cooperative", True),
              Candidate((128, 128, 64), (1, 1), "cooperative", True),
              Candidate((128, 256, 64), (1, 1), "cooperative", True),
              Candidate((128, 128, 64), (1, 2), "cooperative", True),
              Candidate((128, 64, 64), (1, 1), "cooperative", False),
              Candidate((128, 128, 64), (1, 1), "pingpong", False),
              Candidate((128, 256, 64), (1, 1), "cooperative", False),
              Candidate((128, 192, 64), (1, 1), "cooperative", False),
              Candidate((128, 192, 64), (2, 1), "cooperative", False),
              Candidate((64, 128, 64), (1, 1), "pingpong", False),
              Candidate((128, 192, 64), (1, 1), "cooperative", True)]


def configs_for(m: int, n: int, k: int, candidates=CANDIDATES, layout: str = "tn",
                variants: list[dict[str, object]] = (), layout_c: str = "row",
                beside_model: bool = False, arch: int | None = 90) -> list[KernelConfig]:
    """The planner's config first, then (``beside_model``) the model's pick before the rules layered on it, then the
    pick with each variant's fields changed (where legal), then the candidates (stream-K is a config field the planner
    does not set). ``arch`` None: planned for the visible GPU, with the rules of its part (an H200's own)."""
    planned = Gemm("bf16", layout, arch=arch, m=m, n=n, k=k, layout_c=layout_c)
    pick = planned.config
    configs = [pick] + ([planned.estimate.model_config] if beside_model else [])
    for fields in variants:
        try:
            configs.append(variant_of(pick, fields))
        except ValueError as refused:   # not legal here: say so and go on
            print(f"  skip {fields}: {refused}")
    for candidate in candidates:
        try:
            plan = Gemm("bf16", layout, arch=arch, m=m, n=n, k=k, layout_c=layout_c, **candidate.hints())
        except ValueError as refused:   # not legal here: say so and go on
            print(f"  skip {candidate.tile} {candidate.cluster} {candidate.schedule}: {refused}")
            continue
        configs.append(replace(plan.config, stream_k=True) if candidate.stream_k else plan.config)
    unique = {c.name: c for c in configs}
    return list(unique.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--candidates", default=None,
                    help="time these instead of the default candidates: TILE:CLUSTER:pp|coop[:sk][:sN],... "
                         "(e.g. 128x128x64:2x1:pp,256x128x64:1x2:coop)")
    ap.add_argument("--variants", default="", help="the pick with fields changed: FIELD=VALUE[+FIELD=VALUE],... "
                    "(e.g. raster=n,raster_group=4 or stream_k=true or cluster=2x1; staging_in_ring=true|false moves "
                    "the stages with it)")
    ap.add_argument("--corpus-tokens", default=None,
                    help="the corpus' forward GEMMs at these token counts (benchmarks/corpus.py) instead of --shapes")
    ap.add_argument("--layout", default="tn", choices=["tn", "tt", "nn", "nt"],
                    help="tn: x @ W.t() (the forward); tt: dY @ W (dX, B N-major); nn: dX swapped, W.t() @ dY.t() "
                         "= dX.t() (a shape MxNxK is then in x tokens x out), beside cuBLAS's dY @ W; nt: X.t() @ dY "
                         "(dW's transpose: a shape is then in x out x tokens)")
    ap.add_argument("--beside-model", action="store_true",
                    help="time the model's pick before the rules layered on it (the filling width, the ring's staging)")
    ap.add_argument("--only-moved", action="store_true", help="with --beside-model: only the shapes those rules moved")
    ap.add_argument("--dcol", action="store_true", help="D column-major (the swapped dX's nn kernels write dX.t())")
    ap.add_argument("--arch", default="visible",
                    help="plan for this compute capability (90: an H100's rules), or 'visible' (the default): for the "
                         "GPU the run is on, with its part's rules (rule 19 is the H200's)")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "midm_tiles.json"))
    args = ap.parse_args()
    arch = None if args.arch == "visible" else int(args.arch)
    if args.corpus_tokens:
        import corpus
        shapes = corpus.forward_shapes(None, [int(t) for t in args.corpus_tokens.split(",")])
    else:
        shapes = parse_shapes(args.shapes)
    candidates = parse_candidates(args.candidates) if args.candidates is not None else CANDIDATES
    variants = parse_variants(args.variants)
    per_shape = {s: configs_for(*s, candidates, args.layout, variants, "col" if args.dcol else "row", args.beside_model,
                                arch) for s in shapes}
    if args.only_moved:   # the shapes whose pick the layered rules moved
        per_shape = {s: c for s, c in per_shape.items() if len(c) > 1}
    configs = {c.name: c for shape_configs in per_shape.values() for c in shape_configs}
    ops = {op.name: op for op in compile_many(list(configs.values()), namespace="gemmgen_midm_tiles")}
    rows = []
    for (m, n, k), shape_configs in per_shape.items():
        x = torch.randn(m, k, device="cuda").bfloat16()
        # B (k x n): W.t() of an (n x k) weight (tn), or a (k x n) weight itself, N-major (tt)
        b = torch.randn(n, k, device="cuda").bfloat16().t() if args.layout == "tn" else \
            torch.randn(k, n, device="cuda").bfloat16()
        if args.layout == "nn":   # A = W.t() (W: out x in, row-major), B = dY.t() (dY: tokens x out, row-major)
            x = torch.randn(k, m, device="cuda").bfloat16().t()
            b = torch.randn(n, k, device="cuda").bfloat16().t()
        if args.layout == "nt":   # A = X.t() (X: tokens x in, row-major), B = dY (tokens x out, row-major)
            x = torch.randn(k, m, device="cuda").bfloat16().t()
        ref = x.float() @ b.float()
        # nn: cuBLAS times the gradient as autograd asks for it, dY @ W (the same product, transposed)
        fns = {"cublas": (lambda: torch.matmul(b.t(), x.t())) if args.layout == "nn" else (lambda: torch.matmul(x, b))}
        fns.update({c.name: (lambda op=ops[c.name]: op(x, b)) for c in shape_configs})
        times = timed_rounds(fns, args.rounds)
        flops = 2.0 * m * n * k
        print(f"{m}x{n}x{k}: cuBLAS {flops / times['cublas'] / 1e9:.1f} TFLOP/s")
        for i, c in enumerate(shape_configs):
            name = c.name
            err = ((ops[name](x, b).float() - ref).norm() / ref.norm()).item()
            ratio = times["cublas"] / times[name]
            pick = " (planner's pick)" if i == 0 else ""
            print(f"  {name:52s} {flops / times[name] / 1e9:7.1f}  x{ratio:.3f} cuBLAS  err {err:.1e}{pick}")
            rows.append(dict(m=m, n=n, k=k, kernel=name, picked=i == 0, ms=times[name], cublas_ms=times["cublas"],
                             vs_cublas=ratio, err=err))
    fits = k_fits(rows)
    for (m, n, kernel), fit in fits.items():
        print(f"{m}x{n}xK {kernel:52s} {fit['fixed_us']:6.2f} us + {fit['us_per_1024_k']:5.2f} us per 1024 of K "
              f"({len(fit['k'])} K values)")
    Path(args.json).write_text(json.dumps({"rows": rows, "k_fits": [dict(m=m, n=n, kernel=kernel, **fit)
                                                                     for (m, n, kernel), fit in fits.items()]}, indent=1))
    print(f"wrote {args.json}")


def k_fits(rows: list[dict]) -> dict[tuple[int, int, str], dict]:
    """Where --shapes sweep K at a fixed M x N: each kernel's time (and cuBLAS's) as a least-squares line in K, fixed
    cost plus cost per 1024 of K, over the K values it ran (at least three): what a block pays per k tile, apart from
    the launch and the epilogue (docs/corpus.md, "N tiles under 64 columns")."""
    points: dict[tuple[int, int, str], dict[int, float]] = {}
    for r in rows:
        points.setdefault((r["m"], r["n"], r["kernel"]), {})[r["k"]] = r["ms"] * 1e3
        points.setdefault((r["m"], r["n"], "cuBLAS"), {})[r["k"]] = r["cublas_ms"] * 1e3
    fits = {}
    for key, by_k in points.items():
        if len(by_k) < 3:
            continue
        ks = [k / 1024 for k in by_k]
        slope, fixed = statistics.linear_regression(ks, list(by_k.values()))
        fits[key] = {"fixed_us": fixed, "us_per_1024_k": slope, "k": sorted(by_k)}
    return fits


if __name__ == "__main__":
    main()
