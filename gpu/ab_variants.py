"""A/B runs of template variants: the same planned configs built with different preprocessor switches
(experiment macros in the templates), checked and timed side by side in one run, next to torch.matmul.

    python3 gpu/ab_variants.py --configs sm90 --dtype fp16 --variant dp= --variant sk=-DGEMMGEN_SM90_STREAM_K=1 \\
        [--shapes 4096x4096x4096,8192x8192x8192] [--json $OUT/ab.json]
    python3 gpu/ab_variants.py --configs sm80 --variant a= --variant b=-DSOME_SWITCH=1   (a switch in the templates;
        several joined by +, as b=-DONE=1+-DTWO=4, so that a shell variable can carry them)
    python3 gpu/ab_variants.py --configs sm90 --kernel 128x256x64:2x1:cooperative:3 --variant a= --variant b=...

Each variant's kernels are separate libraries (the flags are part of the build cache key). Timing
interleaves the variants and torch.matmul (bench.balanced_order: each follows each other alike) so that
clock drift and the power history a window inherits hit all alike; each figure is the best of the
rounds' do_bench medians. With --steady SECONDS each measurement is instead a steady stretch of
back-to-back calls under the power cap (gpu/power_probe.py), with the SM clock sampled: the figure is
the median over the rounds, beside its clock and TFLOP/s per GHz. Effects of 1-2 % are lost in
do_bench's spread between runs (up to 4 %, docs/benchmarking.md); steady stretches average the power
management out.

With --chain N each figure is per call of a chain of N calls on N weights (B operands; they stream from HBM where
N x their bytes exceed L2), back to back in one CUDA graph, as a model's layers run: what launching a kernel while
the previous one still runs (programmatic dependent launch, sm90/launch.cuh) saves shows there, where do_bench puts
an L2 flush and an event between the timed calls.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # sm90_probe beside this file
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import torch  # noqa: E402

from bench import interleaved_rounds, parse_shapes  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.toolchain import build_many, spill_report  # noqa: E402
from generator.spec.config import KernelConfig  # noqa: E402
from generator.runtime import GemmArgsStruct, KernelLibrary, build_request  # noqa: E402
from power_probe import Sampler, steady_sample  # noqa: E402
from sm90_probe import BOUND, TORCH, operand  # noqa: E402  (the probe's dtypes, bounds and padded operands)

RAGGED = [(1, 1, 1), (7, 8, 63), (65, 129, 127), (1000, 4097, 129), (4097, 63, 1000), (129, 7, 4097),
          (3000, 5000, 1000), (4097, 4095, 4104), (256, 512, 0)]

# (tile, warps, stages): the sm80 configs the sweep found best at 4096^3 / 8192^3 (docs/sm80.md).
SM80_CONFIGS = [((128, 256, 32), (2, 4), 4), ((128, 256, 32), (2, 4), 3), ((128, 256, 32), (2, 4), 5),
                ((128, 256, 64), (2, 4), 3), ((256, 128, 32), (4, 2), 4), ((128, 128, 64), (2, 2), 3)]


# (tile, cluster, schedule, stages): the sm90 kernels the sweeps found best at 4096^3 / 8192^3 (docs/planner.md).
SM90_CONFIGS = [((128, 256, 64), (2, 1), "cooperative", 4), ((128, 256, 64), (1, 2), "cooperative", 4),
                ((256, 128, 64), (1, 2), "cooperative", 4), ((128, 256, 64), (1, 1), "cooperative", 4)]


def family_configs(family: str, dtype: str, layout: str, arch: int | None,
                   sm90_kernels: list[tuple] | None = None) -> list[KernelConfig]:
    if family == "sm80":
        return [Gemm(dtype=dtype, layout=layout, arch=arch, tile_shape=t, warps=w, stages=s, family="sm80").config
                for t, w, s in SM80_CONFIGS]
    return [dataclasses.replace(Gemm(dtype=dtype, layout=layout, arch=arch, tile_shape=t, cluster_shape=c,
                                     schedule=sched, stages=s, family="sm90").config, stream_k=any(sk))
            for t, c, sched, s, *sk in (sm90_kernels or SM90_CONFIGS)]


def parse_sm90_kernel(text: str) -> tuple:
    """"TILE:CLUSTER:SCHEDULE:STAGES[:sk]", e.g. "128x256x64:2x1:cooperative:3", as an SM90_CONFIGS entry (a fifth
    field: stream-K / split-K on)."""
    try:
        tile, cluster, schedule, stages, *rest = text.split(":")
        if rest not in ([], ["sk"]):
            raise ValueError(rest)
        return (tuple(int(x) for x in tile.split("x")), tuple(int(x) for x in cluster.split("x")), schedule,
                int(stages), bool(rest))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected TILE:CLUSTER:SCHEDULE:STAGES[:sk], "
                                         "e.g. 128x256x64:2x1:cooperative:3 or 64x128x64:1x1:pingpong:8:sk") from None


def launch(lib: KernelLibrary, cfg: KernelConfig, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
           aux: torch.Tensor | None = None) -> None:
    """D = A @ B through the library's launch; `aux`: GemmArgs::aux (a timing experiment's buffer, sk_timeline.py)."""
    row = {"row": True, "col": False}
    lda = a.stride(0) if row[cfg.layout.a.value] else a.stride(1)
    ldb = b.stride(0) if row[cfg.layout.b.value] else b.stride(1)
    ldd = d.stride(0) if row[cfg.layout.c.value] else d.stride(1)
    args = GemmArgsStruct(a.data_ptr(), b.data_ptr(), d.data_ptr(), a.shape[0], b.shape[1], a.shape[1],
                          max(lda, 1), max(ldb, 1), max(ldd, 1))
    if aux is not None:
        args.aux = aux.data_ptr()
    code = lib.launch(ctypes.byref(args), torch.cuda.current_stream().cuda_stream)
    if code:
        raise RuntimeError(f"{cfg.name}: launch error {code} {lib.error_string(code).decode()}")


def inputs(cfg: KernelConfig, m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dt = TORCH[cfg.dtype.value]
    a = operand(m, k, cfg.layout.a.value == "row", dt)
    b = operand(k, n, cfg.layout.b.value == "row", dt)
    d = operand(m, n, cfg.layout.c.value == "row", TORCH[cfg.out_dtype.value]).fill_(float("nan"))
    return a, b, d


def rel_error(lib: KernelLibrary, cfg: KernelConfig, m: int, n: int, k: int) -> float:
    a, b, d = inputs(cfg, m, n, k)
    launch(lib, cfg, a, b, d)
    ref = a.double() @ b.double()
    diff = (d.double() - ref).norm()
    return float("inf") if not torch.isfinite(diff) else (diff / ref.norm().clamp_min(1e-30)).item()


def repeatable(lib: KernelLibrary, cfg: KernelConfig) -> bool:
    a, b, d = inputs(cfg, 1000, 1000, 1032)
    outs = []
    for _ in range(10):
        launch(lib, cfg, a, b, d)
        outs.append(d.clone())
    return all(torch.equal(outs[0], o) for o in outs[1:])


def bench_ms(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=50, rep=200, return_mode="median"))


def timed(fn, steady: float, sampler) -> tuple[float, float | None]:
    """Milliseconds per call (a do_bench median, or a steady stretch of `steady` seconds) and the median
    SM clock in MHz over the stretch (steady only)."""
    if not steady:
        return bench_ms(fn), None
    ms, mhz, _ = steady_sample(fn, steady, sampler)
    return ms, mhz


def summarize(samples: list[tuple[float, float | None]], steady: float) -> tuple[float, float | None]:
    """The figure of several rounds: the best do_bench median, or the median steady stretch."""
    if not steady:
        return min(ms for ms, _ in samples), None
    ms = statistics.median(ms for ms, _ in samples)
    return ms, statistics.median(mhz for _, mhz in samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", required=True, metavar="NAME=FLAGS",
                    help="a variant: a name and its space-separated nvcc flags (may be empty); one variant "
                         "(e.g. base=) compares the --kernel configs, each against torch.matmul")
    ap.add_argument("--configs", default="sm80", choices=["sm80", "sm90"], help="which family's configs")
    ap.add_argument("--kernel", action="append", type=parse_sm90_kernel, metavar="TILE:CLUSTER:SCHEDULE:STAGES",
                    help="with --configs sm90: run these kernels instead of SM90_CONFIGS (repeatable)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--layout", default="tn", choices=["nn", "nt", "tn", "tt"])
    ap.add_argument("--shapes", default="4096x4096x4096,8192x8192x8192")
    ap.add_argument("--arch", type=int, choices=[80, 90], help="default: the GPU's")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--chain", type=int, default=0, metavar="N",
                    help="time a CUDA graph of N calls back to back on N weights, per call (0: one call per timing)")
    ap.add_argument("--between", action="store_true",
                    help="with --chain: an elementwise torch kernel on an M x K activation between the calls (as a "
                         "norm or an activation between a model's layers)")
    ap.add_argument("--steady", type=float, default=0.0, metavar="SECONDS",
                    help="time steady stretches of this length with the SM clock sampled, not do_bench bursts")
    ap.add_argument("--build-only", action="store_true", help="build and print the ptxas reports (no GPU needed)")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "ab_variants.json"))
    args = ap.parse_args(argv)
    variants = dict(v.split("=", 1) for v in args.variant)
    if len(variants) < 2 and len(args.kernel or []) < 2:
        ap.error("give at least two --variant NAME=FLAGS, or one and at least two --kernel configs")
    torch.backends.cuda.matmul.allow_tf32 = False

    if args.kernel and args.configs != "sm90":
        ap.error("--kernel takes sm90 kernels: add --configs sm90")
    configs = family_configs(args.configs, args.dtype, args.layout, args.arch, args.kernel)
    plain = [build_request(c) for c in configs]   # (with GEMMGEN_EXTRA_NVCC_FLAGS, if set, under every variant)
    requests = [dataclasses.replace(req, extra_flags=req.extra_flags + tuple(flags.replace("+", " ").split()))
                for flags in variants.values() for req in plain]
    t0 = time.time()
    results = build_many(requests)
    print(f"built {len(requests)} kernels in {time.time() - t0:.1f} s", flush=True)
    if args.build_only:
        for req, res in zip(requests, results):
            ptxas = spill_report(res.ptxas_log).get(req.name, {})
            print(f"{' '.join(req.extra_flags) or '(no flags)':>32} {req.name}: {ptxas}")
        return 0
    libs: dict[tuple[str, str], KernelLibrary] = {}
    report: dict = {"variants": variants, "kernels": [], "bench": []}
    failures = 0
    for i, (variant, res) in enumerate(zip([v for v in variants for _ in configs], results)):
        cfg = configs[i % len(configs)]
        lib = libs[variant, cfg.name] = KernelLibrary.load(res.library, cfg.name)
        ptxas = spill_report(res.ptxas_log).get(cfg.name, {})
        worst = max(rel_error(lib, cfg, m, n, k) for m, n, k in RAGGED)
        same = repeatable(lib, cfg)
        ok = worst <= BOUND[args.dtype] and same
        failures += not ok
        report["kernels"].append({"variant": variant, "kernel": cfg.name, "worst_rel_error": worst,
                                  "repeatable": same, "ptxas": ptxas})
        print(f"{variant:>6} {cfg.name}: regs {ptxas.get('registers')} spills {ptxas.get('spill_stores')} "
              f"worst err {worst:.2e} repeatable {same}{'' if ok else '  FAIL'}", flush=True)

    sampler = Sampler() if args.steady else None
    try:
        for shape in parse_shapes(args.shapes):
            failures += bench_shape(shape, configs, variants, libs, args, sampler, report)
    finally:
        if sampler:
            sampler.stop()
    report["summary"] = variant_summary(report["bench"])
    for name, row in report["summary"].items():
        print(f"{name}: time of the first variant / this one over {row['pairs']} (shape, kernel) pairs: geomean "
              f"{row['geomean']:.3f}, min {row['min']:.3f}, max {row['max']:.3f}")
    Path(args.json).write_text(json.dumps(report, indent=1))
    print(f"failures: {failures}")
    return 1 if failures else 0


def variant_summary(rows: list[dict]) -> dict[str, dict]:
    """Per variant after the first: the first variant's time over its own at each (shape, kernel), summarised (above 1:
    this variant is faster)."""
    by_pair: dict[tuple[str, str], dict[str, float]] = {}
    for r in rows:
        by_pair.setdefault((r["shape"], r["kernel"]), {})[r["variant"]] = r["ms"]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    summary = {}
    for v in variants[1:]:
        ratios = [times[variants[0]] / times[v] for times in by_pair.values() if variants[0] in times and v in times]
        if ratios:
            summary[v] = {"pairs": len(ratios), "geomean": statistics.geometric_mean(ratios), "min": min(ratios),
                          "max": max(ratios)}
    return summary


def chained(call, weights: list[torch.Tensor], activation: torch.Tensor | None = None):
    """A function replaying a CUDA graph of call(w) for each of `weights`, in order, on the current stream; each call
    followed by an elementwise kernel on `activation` where one is given."""
    def calls():
        for w in weights:
            call(w)
            if activation is not None:
                activation.mul_(1.0)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # (warm up off the capture: first launches may allocate or probe)
        calls()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    return graph.replay


def bench_shape(mnk: tuple[int, int, int], configs: list[KernelConfig], variants: dict[str, str],
                libs: dict[tuple[str, str], KernelLibrary], args: argparse.Namespace, sampler, report: dict) -> int:
    """Time every config's variants and torch.matmul interleaved at one shape; rows into `report`.
    Returns the number of wrong results.

    torch.matmul is timed beside each config's variants, and those readings of one shape differ by a few percent
    (up to 6 % measured on the H200 at 10-20 us calls); every row's ratio is to their median, so that two kernels'
    ratios compare as their times do (each kernel's own reading stays in its row as ``cublas_ms_beside``)."""
    m, n, k = mnk
    shape = f"{m}x{n}x{k}"
    flop = 2.0 * m * n * k
    a, b, d = inputs(configs[0], m, n, k)
    ref = a.float() @ b.float()
    failures = 0
    if args.chain:   # (the chain's weights, cuBLAS's output and the activation between calls: one set per shape)
        weights = [b] + [inputs(configs[0], m, n, k)[1] for _ in range(args.chain - 1)]
        cublas_out = torch.empty(m, n, dtype=a.dtype, device=a.device)
        activation = torch.randn(m, k, device=a.device) if args.between else None
    rows, beside = [], []
    for cfg in configs:
        if args.chain:
            runs = {"cuBLAS": chained(lambda w: torch.matmul(a, w, out=cublas_out), weights, activation),
                    **{v: chained(lambda w, lib=libs[v, cfg.name]: launch(lib, cfg, a, w, d), weights, activation)
                       for v in variants}}
        else:
            runs = {"cuBLAS": lambda: torch.matmul(a, b),
                    **{v: lambda lib=libs[v, cfg.name]: launch(lib, cfg, a, b, d) for v in variants}}
        samples = interleaved_rounds(runs, args.rounds, lambda fn: timed(fn, args.steady, sampler))
        if args.chain:   # (per call)
            samples = {v: [(ms / args.chain, mhz) for ms, mhz in rounds] for v, rounds in samples.items()}
        cublas_ms, cublas_mhz = summarize(samples["cuBLAS"], args.steady)
        beside.append(cublas_ms)
        for v in variants:
            ms, mhz = summarize(samples[v], args.steady)
            launch(libs[v, cfg.name], cfg, a, b, d)
            err = ((d.float() - ref).norm() / ref.norm()).item()
            failures += not err <= BOUND[args.dtype]
            row = {"shape": shape, "kernel": cfg.name, "variant": v, "ms": ms, "tflops": flop / ms / 1e9,
                   "cublas_ms_beside": cublas_ms, "rel_error": err}
            if mhz:
                row.update(sm_mhz=mhz, tflops_per_ghz=row["tflops"] / (mhz / 1000), cublas_mhz=cublas_mhz)
            rows.append(row)
    cublas_ms = against_median_cublas(rows, beside, flop)
    print(f"{shape}: cuBLAS {flop / cublas_ms / 1e9:.1f} TFLOP/s (median of {len(beside)} readings, "
          f"{flop / max(beside) / 1e9:.1f}-{flop / min(beside) / 1e9:.1f})", flush=True)
    for row in rows:
        report["bench"].append(row)
        clock = f"  {row['sm_mhz']:5.0f} MHz {row['tflops_per_ghz']:6.1f}/GHz" if "sm_mhz" in row else ""
        print(f"  {row['kernel']:<40} {row['variant']:>6} {row['tflops']:7.1f}  x{row['vs_cublas']:.3f} "
              f"cuBLAS{clock}  err {row['rel_error']:.1e}", flush=True)
    return failures


def against_median_cublas(rows: list[dict], beside: list[float], flop: float) -> float:
    """Each row's ratio to the median of one shape's torch.matmul readings (``beside``, ms; rows carry ``ms``):
    sets ``cublas_tflops`` and ``vs_cublas``; returns the median."""
    cublas_ms = statistics.median(beside)
    for row in rows:
        row.update(cublas_tflops=flop / cublas_ms / 1e9, vs_cublas=cublas_ms / row["ms"])
    return cublas_ms


if __name__ == "__main__":
    sys.exit(main())
