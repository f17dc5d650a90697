"""Benchmark: the corpus of real models' layers (benchmarks/corpus.py), forward and backward, ours next to
torch.matmul (cuBLAS) side by side, summarised per pass and M band.

    python benchmarks/bench_corpus.py [--models llama3-8b,...] [--tokens 1,16,256,...] [--passes fwd,dX,dW]
        [--dtypes bf16] [--max-gflop 2000] [--rounds 2] [--exact] [--json out.json]
    python benchmarks/bench_corpus.py --merge a.json b.json --json all.json   (one summary over several runs)
    python -m generator plot out.json                                          (ours/cuBLAS against M per layer kind)

What "ours" is, per pass, is what a model whose layers were swapped by ``generator.nn.replace_linear`` runs:

* fwd: the M-bucketed op of the layer's N and K (``Gemm(dtype, "tn", n=N, k=K).compile_buckets()``, as
  ``generator.nn.Linear`` holds), called eagerly, so the bucket of the call's M serves it;
* dX and dW: the backward ops that the autograd formula of that bucket's op calls (``grad_ops``): dX = dY @ W on
  the dA op, dW on the dB op (which computes dW.t() = X.t() @ dY into column-major storage, the same bytes).

torch.matmul runs the same products on the same tensors: X @ W.t(), dY @ W and dY.t() @ X. With ``--exact`` a
column times the kernel planned for the row's exact size (the forward plan hinted with M, N and K; the backward
kernel planned for the exact forward problem): how much of a gap is dispatch (the bucket) and how much the kernel.
With ``--unhinted`` backward rows also time the backward kernel planned without hints (from a large square, as the
backward was planned before it took the forward problem).

Each distinct GEMM (pass, M, N, K, dtype) is timed once, however many models share it, and the summary counts it
once: geomean, p10 and min of ours/cuBLAS, and the rows below 0.95, per pass and M band (corpus.BANDS). Times are
``triton.testing.do_bench`` medians (``--warmup-ms``, ``--rep-ms``), --rounds per column in interleaved order, the
median of the rounds. Every GEMM is checked against a float32 reference (a wrong result fails the run).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
from corpus import BANDS, PASSES, CorpusRow, band_of  # noqa: E402

#: ‖ours − ref‖ / ‖ref‖ above which a row is wrong, per input dtype (fp32 accumulation, one rounding of D).
ERROR_BOUND = {"bf16": 2e-2, "fp16": 5e-3, "fp32": 2e-3}   # fp32: tf32 inputs (10-bit mantissas), fp32 D

SLOW = 0.95
CHECKPOINT_EVERY = 50


def torch_dtype(name: str):
    """The torch dtype of ``--dtypes``' name: bench.DTYPES' 16-bit types, and fp32 (multiplied in tf32 by both sides:
    our tf32 kernels and torch.matmul with TF32 allowed, as `torch.backends.cuda.matmul.allow_tf32 = True` runs it)."""
    import torch
    from bench import DTYPES
    return torch.float32 if name == "fp32" else DTYPES[name]


@dataclass
class Timing:
    """One distinct GEMM's measurement."""

    pass_: str
    m: int
    n: int
    k: int
    dtype: str
    ours_ms: float
    cublas_ms: float
    vs_cublas: float
    kernel: str
    rel_error: float
    exact_ms: float | None = None
    exact_kernel: str | None = None
    unhinted_ms: float | None = None
    unhinted_kernel: str | None = None
    path: str = "fast"   # which of the op's kernels the call took (op.path: 'fast', 'small_m', ...)
    alt_ms: float | None = None      # --alt-buckets: the same call on the op of the other grid of M buckets
    alt_kernel: str | None = None

    @property
    def key(self) -> tuple:
        return (self.pass_, self.m, self.n, self.k, self.dtype)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between the sorted values."""
    s = sorted(values)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def stats(ratios: list[float]) -> dict:
    return {"count": len(ratios), "geomean": round(geomean(ratios), 4), "p10": round(percentile(ratios, 0.1), 4),
            "min": round(min(ratios), 4) if ratios else float("nan"),
            "below_0.95": sum(r < SLOW for r in ratios), "below_0.92": sum(r < 0.92 for r in ratios)}


def summarize(timings: list[Timing], tokens_of: dict[tuple, int]) -> dict:
    """Per pass, overall and per M band: ``stats`` of ours/cuBLAS over the distinct GEMMs; and the rows below
    ``SLOW``, worst first. ``tokens_of``: each timing's token count (the forward GEMM's M)."""
    summary: dict = {}
    for p in PASSES:
        of_pass = [t for t in timings if t.pass_ == p]
        if not of_pass:
            continue
        entry = {"all": stats([t.vs_cublas for t in of_pass]), "bands": {}}
        for lo, hi in BANDS:
            ratios = [t.vs_cublas for t in of_pass if lo <= tokens_of[t.key] <= hi]
            if ratios:
                entry["bands"][f"{lo}-{hi}"] = stats(ratios)
        for column in EXTRA_COLUMNS:
            ratios = [t.cublas_ms / getattr(t, f"{column}_ms") for t in of_pass if getattr(t, f"{column}_ms")]
            if ratios:
                entry[f"{column}_plan"] = stats(ratios)
        entry["slow"] = [f"{t.m}x{t.n}x{t.k} {t.dtype} {t.vs_cublas:.3f} {t.kernel}"
                         for t in sorted(of_pass, key=lambda t: t.vs_cublas) if t.vs_cublas < SLOW]
        summary[p] = entry
    return summary


#: The optional columns beside ours: the exact-size plan, the unhinted backward plan, another grid of M buckets.
EXTRA_COLUMNS = ("exact", "unhinted", "alt")


def tokens_of_timing(pass_: str, m: int, n: int, k: int) -> int:
    """The forward M of a pass's GEMM (corpus.pass_shape inverted)."""
    return k if pass_ == "dW" else m


def print_summary(summary: dict) -> None:
    print(f"\n{'pass':>4} {'M band':>11} {'rows':>5} {'geomean':>8} {'p10':>6} {'min':>6} {'<0.95':>6} {'<0.92':>6}")
    for p, entry in summary.items():
        for band, s in [("all", entry["all"]), *entry["bands"].items()]:
            print(f"{p:>4} {band:>11} {s['count']:>5} {s['geomean']:8.3f} {s['p10']:6.3f} {s['min']:6.3f} "
                  f"{s['below_0.95']:>6} {s['below_0.92']:>6}")
        for column in EXTRA_COLUMNS:
            if f"{column}_plan" in entry:
                s = entry[f"{column}_plan"]
                print(f"{p:>4} {column + ' plan':>11} {s['count']:>5} {s['geomean']:8.3f} {s['p10']:6.3f} "
                      f"{s['min']:6.3f} {s['below_0.95']:>6} {s['below_0.92']:>6}")


# -- the GPU part -------------------------------------------------------------------------------------------------

def build_ops(rows: list[CorpusRow], dtypes: list[str], buckets: tuple[int, ...], columns: list[str],
              alt_buckets: tuple[int, ...] | None = None) -> tuple[dict, dict]:
    """{(out_features, in_features, dtype): BucketedOp} for every layer, and {(pass, m, n, k, dtype): {column: op}}
    for the extra ``columns``: "exact" (the kernel planned for the row's own size: the forward plan hinted with M, N
    and K, or the backward kernel planned for the exact forward problem) and "unhinted" (backward rows: the kernel
    planned without hints, as every backward was before backward_configs took the forward problem); with
    ``alt_buckets``, "alt": the op the row's call takes on the layer's op bucketed by that grid instead (its bucket's
    forward op, or that op's backward op). Every kernel, the backward ops' too, built in one parallel run."""
    from generator import Gemm
    from generator.gemm import op_key, plan_gradient
    from generator.planner import Problem
    from generator.planner.backward import backward_configs
    from generator.runtime import BucketedOp, compile_many
    from generator.runtime.autograd import grad_ops
    from generator.runtime.loader import build_libraries
    from generator.spec.types import Order

    weights = sorted({(r.out_features, r.in_features) for r in rows})
    plans = {(n, k, d): Gemm(dtype=torch_dtype(d), layout="tn", n=n, k=k).bucket_plans(buckets)
             for n, k in weights for d in dtypes}
    alt_plans = {key: Gemm(dtype=torch_dtype(key[2]), layout="tn", n=key[0], k=key[1]).bucket_plans(alt_buckets)
                 for key in plans} if alt_buckets else {}
    distinct = list({r.gemm: r for r in rows}.values())   # one row per GEMM
    extra_configs: dict[tuple, dict] = {}
    for r in distinct:
        for d in dtypes:
            fwd = Gemm(dtype=torch_dtype(d), layout="tn", m=r.tokens, n=r.out_features, k=r.in_features).config
            wanted = {}
            if "exact" in columns:
                wanted["exact"] = fwd if r.pass_ == "fwd" else backward_configs(
                    fwd, Order.row, Problem(r.tokens, r.out_features, r.in_features))[r.pass_ == "dW"]
            if "unhinted" in columns and r.pass_ != "fwd":
                wanted["unhinted"] = backward_configs(fwd, Order.row)[r.pass_ == "dW"]
            extra_configs[(*r.gemm, d)] = wanted
    keys = list(dict.fromkeys([op_key(p) for pairs in [*plans.values(), *alt_plans.values()] for _, p in pairs]
                              + [(c, None) for wanted in extra_configs.values() for c in wanted.values()]))
    start = time.perf_counter()
    # The backward kernels chosen as compile_buckets' ops choose them (the tuning cache, the shipped table).
    built = dict(zip(keys, compile_many([c for c, _ in keys], namespace="gemmgen", problems=[p for _, p in keys],
                                        plan_gradient=plan_gradient())))
    ops = {key: BucketedOp.from_built([(bound, op_key(p)) for bound, p in pairs], built) for key, pairs in plans.items()}
    alt_ops = {key: BucketedOp.from_built([(bound, op_key(p)) for bound, p in pairs], built)
               for key, pairs in alt_plans.items()}
    # The backward kernels autograd will launch, built now in parallel rather than one by one on first launch (none
    # for a forward-only run).
    backward = list(dict.fromkeys(g.config for op in [*ops.values(), *alt_ops.values()] for b in op.buckets
                                  for g in grad_ops(b.op, Order.row))) if any(r.pass_ != "fwd" for r in rows) else []
    build_libraries(backward, verbose=False)
    print(f"built {len({c for c, _ in keys})} kernels and {len(backward)} backward kernels in "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    extra = {key: {col: built[(c, None)] for col, c in wanted.items()} for key, wanted in extra_configs.items()}
    for r in distinct if alt_ops else ():
        for d in dtypes:
            alt = alt_ops[(r.out_features, r.in_features, d)].select(r.tokens)
            extra[(*r.gemm, d)]["alt"] = alt if r.pass_ == "fwd" else grad_ops(alt, Order.row)[r.pass_ == "dW"]
    return ops, extra


def measure_gemm(row: CorpusRow, dtype: str, op, extra: dict, rounds: int, warmup_ms: float,
                 rep_ms: float) -> Timing:
    """Time one distinct GEMM: ours (the bucket's op, or its backward op), torch.matmul, and the ``extra`` ops
    (build_ops' columns), each called as ours is."""
    import torch
    from bench import interleaved_rounds
    from triton.testing import do_bench
    from generator.planner.backward import computes_transpose
    from generator.runtime.autograd import grad_ops
    from generator.runtime.grouped_formula import kernel_operands
    from generator.spec.types import Order

    t = torch_dtype(dtype)
    tokens, n, k = row.tokens, row.out_features, row.in_features
    fwd = op.select(tokens)
    X = torch.randn(tokens, k, device="cuda").to(t)
    W = torch.randn(n, k, device="cuda").to(t)
    dY = torch.randn(tokens, n, device="cuda").to(t) if row.pass_ != "fwd" else None
    # The product each pass's kernel computes as the autograd formula states it (dW: dB = X.t() @ dY, the weight's
    # gradient as W.t() is stored), and torch's product.
    formula = {"fwd": (X, W.t()), "dX": (dY, W), "dW": (X.t(), dY)}[row.pass_]

    def kernel_args(f) -> tuple[tuple, bool]:
        """The operands ``f`` takes as the autograd formula hands them (gemm_autograd.h product_grads,
        grouped_formula.kernel_operands), and whether it computes the transpose of the formula's product: a dB kernel
        that writes its column-major gradient as the transpose (planner.backward.writes_transposed) takes dY.t() and
        X and writes dW itself; a swapped dX kernel (swaps_operands) takes W.t() and dY.t() and writes dX.t()."""
        stored = {"fwd": Order.row, "dX": Order.row, "dW": Order.col}[row.pass_]   # (the formula's D: W.t() for dW)
        transposed = row.pass_ != "fwd" and computes_transpose(f.config, stored)
        lay = f.config.layout
        if not transposed:
            return formula, False
        return kernel_operands(*formula, lay.a is Order.row, lay.b is Order.row, True), True

    def caller(f):
        """A call of ``f`` that returns the pass's product (dW = dY.t() @ X, the formula's dB transposed)."""
        args, transposed = kernel_args(f)
        if transposed != (row.pass_ == "dW"):
            return lambda: f(*args).t()
        return lambda: f(*args)

    def theirs():
        torch.backends.cuda.matmul.allow_tf32 = True   # (fp32: cuBLAS's TF32 kernels; no effect on 16-bit types)
        return corpus.pass_product(row.pass_, X, W, dY)

    mine = fwd if row.pass_ == "fwd" else grad_ops(fwd, Order.row)[row.pass_ == "dW"]
    path = mine.path(*kernel_args(mine)[0])
    fns = {"ours": caller(mine), "cublas": theirs}
    for col, extra_op in extra.items():
        fns[col] = caller(extra_op)
    got = fns["ours"]().float()
    exact = torch.float64 if t is torch.float32 else torch.float32   # (an fp32 reference would run in TF32 now)
    want = corpus.pass_product(row.pass_, X.to(exact), W.to(exact), dY.to(exact) if dY is not None else None)
    err = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    del want, got
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    measure = lambda fn: float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))  # noqa: E731
    ms = {name: statistics.median(v) for name, v in interleaved_rounds(fns, rounds, measure).items()}
    return Timing(row.pass_, row.m, row.n, row.k, dtype, ms["ours"], ms["cublas"], ms["cublas"] / ms["ours"],
                  mine.name, err, ms.get("exact"), extra["exact"].name if "exact" in extra else None,
                  ms.get("unhinted"), extra["unhinted"].name if "unhinted" in extra else None, path,
                  alt_ms=ms.get("alt"), alt_kernel=extra["alt"].name if "alt" in extra else None)


def run(rows: list[CorpusRow], dtypes: list[str], buckets: tuple[int, ...], rounds: int, columns: list[str],
        warmup_ms: float, rep_ms: float, checkpoint=None, alt_buckets: tuple[int, ...] | None = None) -> list[Timing]:
    """Every distinct GEMM's timing; ``checkpoint(timings)`` every CHECKPOINT_EVERY of them (a run cut off by a time
    limit keeps what it measured)."""
    import torch
    from bench import warm_up_gpu

    ops, extra = build_ops(rows, dtypes, buckets, columns, alt_buckets)
    distinct: dict[tuple, CorpusRow] = {}
    for r in rows:
        distinct.setdefault(r.gemm, r)
    warm_up_gpu()
    timings = []
    print(f"{'pass':>4} {'M':>6} {'N':>6} {'K':>6} {'dtype':>5} {'ours ms':>9} {'cuBLAS ms':>9} {'ratio':>6} "
          f"{'exact':>6} {'unhint':>6} {'alt':>6} {'rel.err':>8}  kernel", flush=True)
    for d in dtypes:
        for r in distinct.values():
            t = measure_gemm(r, d, ops[(r.out_features, r.in_features, d)], extra[(*r.gemm, d)], rounds, warmup_ms,
                             rep_ms)
            timings.append(t)
            ex = f"{t.cublas_ms / t.exact_ms:6.3f}" if t.exact_ms else f"{'-':>6}"
            un = f"{t.cublas_ms / t.unhinted_ms:6.3f}" if t.unhinted_ms else f"{'-':>6}"
            alt = f"{t.cublas_ms / t.alt_ms:6.3f}" if t.alt_ms else f"{'-':>6}"
            print(f"{t.pass_:>4} {t.m:>6} {t.n:>6} {t.k:>6} {d:>5} {t.ours_ms:9.4f} {t.cublas_ms:9.4f} "
                  f"{t.vs_cublas:6.3f} {ex} {un} {alt} {t.rel_error:8.1e}  {t.kernel}"
                  f"{'' if t.path == 'fast' else f' ({t.path} path)'}", flush=True)
            torch.cuda.empty_cache()
            if checkpoint is not None and len(timings) % CHECKPOINT_EVERY == 0:
                checkpoint(timings)
    return timings


# -- files ---------------------------------------------------------------------------------------------------------

def result_rows(rows: list[CorpusRow], timings: list[Timing]) -> list[dict]:
    """One JSON row per (model, layer, pass, tokens, dtype): the distinct GEMM's timing under each row naming it."""
    by_key = {t.key: t for t in timings}
    out = []
    for r in rows:
        for t in (by_key.get((*r.gemm, d)) for d in sorted({t.dtype for t in timings})):
            if t is None:
                continue
            flop = 2 * t.m * t.n * t.k
            out.append({"model": r.model, "layer": r.layer, "pass": r.pass_, "tokens": r.tokens, "m": t.m, "n": t.n,
                        "k": t.k, "dtype": t.dtype, "ours_ms": t.ours_ms, "cublas_ms": t.cublas_ms,
                        "vs_cublas": t.vs_cublas, "ours_tflops": flop / t.ours_ms / 1e9,
                        "cublas_tflops": flop / t.cublas_ms / 1e9, "kernel": t.kernel, "rel_error": t.rel_error,
                        "exact_ms": t.exact_ms, "exact_kernel": t.exact_kernel, "unhinted_ms": t.unhinted_ms,
                        "unhinted_kernel": t.unhinted_kernel, "path": t.path, "alt_ms": t.alt_ms,
                        "alt_kernel": t.alt_kernel})
    return out


def timings_of(result: dict) -> list[Timing]:
    """The distinct timings of a written file's rows (the inverse of ``result_rows``)."""
    seen: dict[tuple, Timing] = {}
    for r in result["rows"]:
        t = Timing(r["pass"], r["m"], r["n"], r["k"], r["dtype"], r["ours_ms"], r["cublas_ms"], r["vs_cublas"],
                   r["kernel"], r["rel_error"], r.get("exact_ms"), r.get("exact_kernel"), r.get("unhinted_ms"),
                   r.get("unhinted_kernel"), r.get("path", "fast"), r.get("alt_ms"), r.get("alt_kernel"))
        seen.setdefault(t.key, t)
    return list(seen.values())


def write(path: Path, device: str, torch_version: str, rows: list[dict], timings: list[Timing]) -> dict:
    tokens_of = {t.key: tokens_of_timing(t.pass_, t.m, t.n, t.k) for t in timings}
    summary = summarize(timings, tokens_of)
    path.write_text(json.dumps({"device": device, "torch": torch_version, "benchmark": "corpus", "rows": rows,
                                "summary": summary}, indent=1))
    return summary


def parse_list(text: str | None, cast=str) -> list | None:
    return None if text is None else [cast(v) for v in text.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=None, help="comma list (default: all): "
                        + ", ".join(m.name for m in corpus.models()))
    parser.add_argument("--tokens", default=None, help=f"comma list of M (default: {','.join(map(str, corpus.TOKENS))})")
    parser.add_argument("--passes", default="fwd,dX,dW", help="comma list of fwd, dX, dW")
    parser.add_argument("--layers", default=None, help="comma list of layer kinds (default: all), e.g. lm_head,o")
    parser.add_argument("--dtypes", default="bf16", help="comma list of bf16, fp16, fp32 (tf32)")
    parser.add_argument("--max-gflop", type=float, default=None, help="leave out GEMMs of more GFLOP (time budget)")
    parser.add_argument("--buckets", default=None, help="the M buckets' bounds (default: Gemm.compile_buckets')")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds; the median of three drops one disturbed round (docs/corpus.md)")
    parser.add_argument("--warmup-ms", type=float, default=5.0)
    parser.add_argument("--rep-ms", type=float, default=25.0)
    parser.add_argument("--exact", action="store_true",
                        help="also time the kernel planned for each row's exact size (dispatch against kernel)")
    parser.add_argument("--unhinted", action="store_true",
                        help="backward rows: also time the kernel planned without hints (the backward before it was "
                             "planned for its own shape)")
    parser.add_argument("--alt-buckets", default=None,
                        help="also time each call on the layer's op bucketed by these bounds (e.g. the previous grid "
                             "64,128,256,512,1024,2048): column 'alt', side by side with ours")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="summarise these files' rows together instead of measuring")
    parser.add_argument("--json", default=None, help="default $OUT/bench_corpus.json or ./bench_corpus.json")
    args = parser.parse_args(argv)
    out = Path(args.json) if args.json else Path(os.environ.get("OUT", ".")) / "bench_corpus.json"
    if args.merge:
        files = [json.loads(Path(f).read_text()) for f in args.merge]
        rows = [r for f in files for r in f["rows"]]
        timings = list({t.key: t for f in files for t in timings_of(f)}.values())
        print_summary(write(out, files[0]["device"], files[0]["torch"], rows, timings))
        print(f"wrote {out}")
        return 0
    import torch
    from generator.gemm import M_BUCKETS

    if not torch.cuda.is_available():
        print("bench_corpus: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        rows = corpus.rows(parse_list(args.models), parse_list(args.tokens, int) or corpus.TOKENS,
                           parse_list(args.passes), args.max_gflop, parse_list(args.layers))
    except ValueError as e:
        parser.error(str(e))
    dtypes = parse_list(args.dtypes)
    buckets = tuple(parse_list(args.buckets, int)) if args.buckets else M_BUCKETS
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; {len(rows)} rows, "
          f"{len({r.gemm for r in rows})} distinct GEMMs per dtype", flush=True)
    columns = [c for c, on in (("exact", args.exact), ("unhinted", args.unhinted)) if on]
    device = torch.cuda.get_device_name()

    def save(timings: list[Timing]) -> dict:
        return write(out, device, torch.__version__, result_rows(rows, timings), timings)

    alt_buckets = tuple(parse_list(args.alt_buckets, int)) if args.alt_buckets else None
    timings = run(rows, dtypes, buckets, args.rounds, columns, args.warmup_ms, args.rep_ms, save, alt_buckets)
    summary = save(timings)
    print_summary(summary)
    wrong = [t for t in timings if not t.rel_error <= ERROR_BOUND[t.dtype]]
    for t in wrong:
        print(f"WRONG: {t.pass_} {t.m}x{t.n}x{t.k} {t.dtype} rel.err {t.rel_error:.2e} ({t.kernel})")
    print(f"wrote {out}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
