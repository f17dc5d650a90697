"""Where a Llama training step's GPU time goes, stock against replace_linear's model: examples/llama_linear.py's
eager step (forward with labels, backward) timed per model (benchmarks/bench.py timed_rounds: do_bench medians in
interleaved rounds), then torch.profiler's CUDA kernels of one step of each, summed per kind (GEMM kernels, ours or
cuBLAS's; everything else) and listed per GEMM kernel, so a step ratio splits into the GEMMs' share and the rest.
Writes $OUT/llama_train_profile.txt and .json.

    python3 gpu/llama_train_profile.py [llama_linear.py's model arguments, e.g. --layers 4 --hidden 3072
                                        --intermediate 8192 --heads 24 --kv-heads 8 --train-batch 2 --train-len 1024]
"""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
import llama_linear as ll  # noqa: E402
from bench import timed_rounds, warm_up_gpu  # noqa: E402

OUT = Path(os.environ.get("OUT", "."))
GEMM_MARKS = ("gemm", "nvjet", "sm90_", "sm80_", "splitkreduce", "cutlass")
# cuDNN's attention kernels carry "sm90_" in their names too (h200_llama_train_profile_4layers.txt counted them as
# GEMMs: 0.55 ms a step in both models)
NOT_GEMM_MARKS = ("sdpa", "flash")
PROFILED_STEPS = 3


def is_gemm(kernel: str) -> bool:
    name = kernel.lower()
    return any(mark in name for mark in GEMM_MARKS) and not any(mark in name for mark in NOT_GEMM_MARKS)


def kernel_us(step: Callable[[], Any]) -> dict[str, tuple[float, int]]:
    """{kernel: (GPU us per step, launches per step)} of PROFILED_STEPS steps."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_STEPS):
            step()
        torch.cuda.synchronize()
    out: dict[str, tuple[float, int]] = {}
    for e in prof.key_averages():
        t = e.self_device_time_total
        if t > 0 and e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.key] = (t / PROFILED_STEPS, e.count // PROFILED_STEPS)
    return out


def main() -> None:
    args = ll.parse_args(sys.argv[1:])
    stock, ours, _, build_s = ll.build_models(args)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    ids = torch.randint(0, args.vocab, (args.train_batch, args.train_len), device="cuda", generator=gen)

    steps = {"stock": ll.train_step(stock, ids), "ours": ll.train_step(ours, ids)}
    for step in steps.values():
        step()
    warm_up_gpu(1.0)
    ms = timed_rounds(steps, args.rounds)
    kernels = {w: kernel_us(s) for w, s in steps.items()}
    lines = [ll.describe(args), f"replace_linear {build_s:.1f} s; step ms stock {ms['stock']:.3f} ours "
             f"{ms['ours']:.3f} stock/ours {ms['stock'] / ms['ours']:.3f}x (do_bench medians, {args.rounds} rounds)",
             "", f"{'GPU us per step':18s} {'stock':>10s} {'ours':>10s} {'ours-stock':>11s}"]
    sums: dict[str, dict[str, float]] = {w: defaultdict(float) for w in steps}
    for w, ks in kernels.items():
        for k, (us, _) in ks.items():
            sums[w]["GEMM" if is_gemm(k) else "other"] += us
            sums[w]["all"] += us
    for kind in ("GEMM", "other", "all"):
        s, o = sums["stock"][kind], sums["ours"][kind]
        lines.append(f"{kind:18s} {s:10.0f} {o:10.0f} {o - s:+11.0f}")
    for w, ks in kernels.items():
        lines += ["", f"{w}: GEMM kernels, us per step, launches per step"]
        for k, (us, n) in sorted(ks.items(), key=lambda kv: -kv[1][0]):
            if is_gemm(k):
                lines.append(f"  {us:9.0f} {n:4d}  {k[:110]}")
        lines += [f"{w}: top other kernels"]
        others = [(k, v) for k, v in ks.items() if not is_gemm(k)]
        for k, (us, n) in sorted(others, key=lambda kv: -kv[1][0])[:15]:
            lines.append(f"  {us:9.0f} {n:4d}  {k[:110]}")
    text = "\n".join(lines)
    print(text, flush=True)
    (OUT / "llama_train_profile.txt").write_text(text + "\n")
    (OUT / "llama_train_profile.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "step_ms": ms, "build_s": build_s,
         "sums_us": sums, "kernels_us": kernels}, indent=1))


if __name__ == "__main__":
    main()
