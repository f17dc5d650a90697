"""Steady-state throughput, SM clock and power of our kernels next to cuBLAS (GPU machine).

do_bench's 100 ms windows read the same cuBLAS kernel 2-3 % apart from run to run (inductor_compare.py
measured max-autotune, which picks that very kernel, at 0.98-1.02x of itself). This probe runs each
candidate back to back for --seconds (after a warm-up), interleaved over --rounds (bench.balanced_order),
times the whole stretch with CUDA events and samples the SM clock and board power meanwhile (nvidia-smi -lms).
TFLOP/s per GHz separates what the kernel does per clock from what the power limit lets the clock do.

    python3 gpu/power_probe.py [--shapes 8192x8192x8192,4096x4096x4096] [--dtype bf16]
        [--variant name=key:value,...]   (Gemm overrides, e.g. g16=raster_group:16  n8=raster:n)
        [--seconds 2] [--rounds 3] [--flush | --burst] [--json out.json]

--flush times the stretch the way do_bench does (L2 flushed before each call, each call timed alone),
to tell do_bench's figures apart from steady state's by what the flush does, with the clock sampled.
--burst runs do_bench itself (25 ms warm-up, 100 ms timed, as benchmarks/bench.py) and keeps every
call's time, so that the first and last thirds of its window can be compared with the clock in each:
whether a kernel loses to cuBLAS while the clock falls from its boost, or once it has settled.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench import DTYPES, interleaved_rounds, operands, parse_shapes, tflops, warm_up_gpu  # noqa: E402
from generator import Gemm  # noqa: E402


class Sampler:
    """nvidia-smi's SM clock (MHz) and power (W) every ~50 ms, each stamped with the host's monotonic clock."""

    def __init__(self, interval_ms: int = 50) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms",
             str(interval_ms)],
            stdout=subprocess.PIPE, text=True, bufsize=1)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                clock, power = (float(v) for v in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.monotonic(), clock, power))

    def between(self, start: float, end: float) -> tuple[float, float]:
        window = [(c, p) for t, c, p in self.samples if start <= t <= end]
        if not window:
            return float("nan"), float("nan")
        return statistics.median(c for c, _ in window), statistics.median(p for _, p in window)

    def stop(self) -> None:
        self.proc.terminate()


def _warmed_calls(step, seconds: float) -> int:
    """How many calls of ``step`` make a stretch of about ``seconds`` (from one timed call after a first
    untimed one); then a quarter of that many run untimed, so that clocks settle per kernel."""
    step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    calls = max(10, int(seconds / max(time.perf_counter() - t0, 1e-6)))
    for _ in range(max(1, calls // 4)):
        step()
    return calls


def steady_ms(fn, seconds: float) -> tuple[float, float, float]:
    """Milliseconds per call over a stretch of about ``seconds`` of back-to-back calls; the host's
    monotonic start and end of the timed stretch."""
    start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls = _warmed_calls(fn, seconds)
    torch.cuda.synchronize()
    host_start = time.monotonic()
    start_ev.record()
    for _ in range(calls):
        fn()
    end_ev.record()
    end_ev.synchronize()
    return start_ev.elapsed_time(end_ev) / calls, host_start, time.monotonic()


def flushed_ms(fn, seconds: float) -> tuple[float, float, float]:
    """Like steady_ms, but in do_bench's regime: before every call the 256 MB buffer do_bench uses to
    flush L2 is zeroed, and each call is timed alone by its own pair of events; the median call."""
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")

    def flushed_call() -> None:
        flush.zero_()
        fn()

    calls = _warmed_calls(flushed_call, seconds)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    torch.cuda.synchronize()
    host_start = time.monotonic()
    for start_ev, end_ev in events:
        flush.zero_()
        start_ev.record()
        fn()
        end_ev.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events), host_start, time.monotonic()


def steady_sample(fn, seconds: float, sampler: Sampler, flushed: bool = False) -> tuple[float, float, float]:
    """Milliseconds per call over a steady stretch of about ``seconds`` (steady_ms, or flushed_ms), with
    the median SM clock (MHz) and board power (W) the sampler saw during it."""
    ms, start, end = (flushed_ms if flushed else steady_ms)(fn, seconds)
    return (ms, *sampler.between(start, end))


def burst_sample(fn, sampler: Sampler) -> dict:
    """One do_bench window as bench.py times it (every call's time kept): the median call of the whole
    window and of its first and last thirds, each beside the median SM clock the sampler saw then."""
    from triton.testing import do_bench

    start = time.monotonic()
    times = [float(t) for t in do_bench(fn, warmup=25, rep=100, return_mode="all")]
    end = time.monotonic()
    third = max(1, len(times) // 3)
    # do_bench's calls fill the last ~100 ms before it returns; its warm-up and estimate come first.
    span = min(end - start, 0.1)
    timed_start = end - span
    mhz, watts = sampler.between(timed_start, end)
    return {"ms": statistics.median(times), "calls": len(times),
            "first_ms": statistics.median(times[:third]), "last_ms": statistics.median(times[-third:]),
            "first_mhz": sampler.between(timed_start, timed_start + span / 3)[0],
            "last_mhz": sampler.between(end - span / 3, end)[0], "mhz": mhz, "watts": watts,
            "series_ms": [round(t, 4) for t in times],
            "series_mhz": [c for t, c, _ in sampler.samples if timed_start <= t <= end]}


def burst_rows(m: int, n: int, k: int, dtype: str, runs: dict[str, list[dict]], kernels: dict[str, str]) -> list[dict]:
    """Per candidate, the medians over the rounds of each window figure, and the ratios to cuBLAS's."""
    def med(name: str, key: str) -> float:
        return statistics.median(w[key] for w in runs[name])

    rows = []
    for name in runs:
        row = {"shape": [m, n, k], "dtype": dtype, "name": name, "kernel": kernels[name], "mode": "burst",
               "tflops": round(tflops(m, n, k, med(name, "ms")), 1)}
        for part in ("", "first_", "last_"):
            row[f"{part}vs_cublas"] = round(med("cublas", f"{part}ms") / med(name, f"{part}ms"), 3)
        for key in ("mhz", "first_mhz", "last_mhz", "watts"):
            row[key] = med(name, key)
        row["windows_ms"] = [round(w["ms"], 4) for w in runs[name]]
        row["series_ms"] = [w["series_ms"] for w in runs[name]]
        row["series_mhz"] = [w["series_mhz"] for w in runs[name]]
        rows.append(row)
        print(f"{m}x{n}x{k} {dtype} {name:>10} {row['tflops']:7.1f} TFLOP/s  {row['vs_cublas']:6.3f}x cuBLAS "
              f"(first third {row['first_vs_cublas']:.3f}x at {row['first_mhz']:.0f} MHz, last third "
              f"{row['last_vs_cublas']:.3f}x at {row['last_mhz']:.0f} MHz)  {row['watts']:.0f} W  {kernels[name]}",
              flush=True)
    return rows


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, spec = text.partition("=")
    overrides = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition(":")
        overrides[key] = int(value) if value.isdigit() else value
    return name, overrides


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8192x8192x8192,4096x4096x4096")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--variant", action="append", default=[], help="name=key:value,... (Gemm overrides)")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flush", action="store_true",
                    help="do_bench's regime: L2 flushed (256 MB zeroed) before each call, calls timed one by one")
    ap.add_argument("--burst", action="store_true",
                    help="do_bench's own 100 ms windows, as bench.py times them; first and last thirds apart")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    dtype = DTYPES[args.dtype]
    if args.flush and args.burst:
        ap.error("--flush and --burst are two different regimes: pick one")
    variants = [("planner", {})] + [parse_variant(v) for v in args.variant]
    sampler = Sampler(interval_ms=10 if args.burst else 50)
    rows = []
    try:
        for m, n, k in parse_shapes(args.shapes):
            a, b = operands("tn", m, n, k, dtype)
            ref = a.float() @ b.float()
            fns = {"cublas": lambda: torch.matmul(a, b)}
            kernels = {"cublas": "cuBLAS"}
            for name, overrides in variants:
                plan = Gemm(dtype=dtype, layout="tn", m=m, n=n, k=k)
                for key, value in overrides.items():
                    setattr(plan, key, value)
                op = plan.compile()
                err = ((op(a, b).float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (name, err)
                fns[name], kernels[name] = (lambda op=op: op(a, b)), op.name
            warm_up_gpu()
            if args.burst:
                windows = interleaved_rounds(fns, args.rounds, lambda fn: burst_sample(fn, sampler))
                rows += burst_rows(m, n, k, args.dtype, windows, kernels)
                continue
            runs = interleaved_rounds(fns, args.rounds,
                                      lambda fn: steady_sample(fn, args.seconds, sampler, args.flush))
            base = statistics.median(ms for ms, _, _ in runs["cublas"])
            for name, samples in runs.items():
                ms = statistics.median(s[0] for s in samples)
                mhz = statistics.median(s[1] for s in samples)
                watts = statistics.median(s[2] for s in samples)
                tf = tflops(m, n, k, ms)
                row = {"shape": [m, n, k], "dtype": args.dtype, "name": name, "kernel": kernels[name],
                       "tflops": round(tf, 1), "vs_cublas": round(base / ms, 3), "sm_mhz": mhz, "watts": watts,
                       "tflops_per_ghz": round(tf / (mhz / 1000), 1) if mhz == mhz else None,
                       "rounds_ms": [round(s[0], 4) for s in samples]}
                rows.append(row)
                print(f"{m}x{n}x{k} {args.dtype} {name:>10} {tf:7.1f} TFLOP/s  {base / ms:6.3f}x cuBLAS  "
                      f"{mhz:6.0f} MHz {watts:6.1f} W  {row['tflops_per_ghz']} TFLOP/s/GHz  {kernels[name]}",
                      flush=True)
    finally:
        sampler.stop()
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
