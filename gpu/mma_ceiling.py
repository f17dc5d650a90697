"""The mma.sync m16n8k16 ceiling per second and per clock (GPU machine), next to our sm80 kernel.

The issue's 665 TFLOP/s anchor is a short burst at boost clock. Under a GEMM's load the H100 sits at its
700 W cap and lowers the clock (docs/sm80.md: the sm80 kernel at 1568 MHz), so what a kernel does per
clock is the figure to compare. This builds gpu/mma_ceiling.cu (register-only mma.sync chains, and a
ladder of probes that add the sm80 kernel's ingredients one at a time: 8 warps per SM, ldmatrix, block
barriers, or 12 warps), runs each as a short burst (do_bench) and steadily for --seconds while sampling
clock and power, and does the same for the planner's sm80 kernel at each shape. Per clock, every row
is compared with the first probe.

    python3 gpu/mma_ceiling.py [--probes ceiling,regs_w8,...] [--shapes 4096x4096x4096] [--dtype bf16]
                               [--seconds 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "gpu"))

from bench import DTYPES, operands, parse_shapes, tflops, warm_up_gpu  # noqa: E402
from power_probe import Sampler, steady_sample  # noqa: E402
from generator import Gemm  # noqa: E402


# gpu/mma_ceiling.cu's order
PROBES = ["ceiling", "regs_w8", "ldsm_w8", "ldsm_bar_w8", "regs_w12", "ldsm_w12", "ldsm_bar_w12", "copy_w8",
          "ldsm_bar_w8_t96", "copy_w8_t96"]
LAUNCH_FLOP = 2.8e11  # ~0.45 ms per launch at the ceiling


def build_probes(workdir: Path) -> ctypes.CDLL:
    lib = workdir / "libmma_ceiling.so"
    cmd = ["nvcc", "-O3", "-shared", "-Xcompiler", "-fPIC", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
           "-Xptxas", "-v", str(ROOT / "gpu" / "mma_ceiling.cu"), "-o", str(lib)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    so = ctypes.CDLL(str(lib))
    so.mma_probe_launch.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    so.mma_probe_flop.restype = ctypes.c_double
    so.mma_probe_flop.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    so.mma_probe_threads.argtypes = [ctypes.c_int, ctypes.c_int]
    assert so.mma_probe_count() == len(PROBES), "PROBES is out of step with gpu/mma_ceiling.cu"
    return so


def probe_runner(so: ctypes.CDLL, probe: int, bf16: bool, sms: int, seed: torch.Tensor, source: torch.Tensor):
    """A no-argument launcher of one probe, sized to LAUNCH_FLOP, and the FLOP of one launch."""
    iters = max(2, 2 * round(LAUNCH_FLOP / so.mma_probe_flop(probe, sms, 2)))
    out = torch.empty(so.mma_probe_threads(probe, sms), device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    def run() -> None:
        code = so.mma_probe_launch(probe, int(bf16), sms, iters, seed.data_ptr(), source.data_ptr(), out.data_ptr(),
                                   stream)
        if code:
            raise RuntimeError(f"mma probe {PROBES[probe]}: CUDA error {code}")

    return run, so.mma_probe_flop(probe, sms, iters)


def measure(name: str, fn, flop: float, sampler: Sampler, seconds: float) -> dict:
    from triton.testing import do_bench

    burst_ms = float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    ms, mhz, watts = steady_sample(fn, seconds, sampler)
    row = {"name": name, "burst_tflops": round(flop / burst_ms / 1e9, 1), "steady_tflops": round(flop / ms / 1e9, 1),
           "sm_mhz": mhz, "watts": watts, "steady_tflops_per_ghz": round(flop / ms / 1e9 / (mhz / 1000), 1)}
    print(f"{name:>34}  burst {row['burst_tflops']:7.1f}  steady {row['steady_tflops']:7.1f} TFLOP/s  "
          f"{mhz:6.0f} MHz {watts:6.1f} W  {row['steady_tflops_per_ghz']} TFLOP/s/GHz", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x4096x4096")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--probes", default="ceiling",
                    help=f"comma-separated, the first is the reference per clock; of {','.join(PROBES)}")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    sampler = Sampler()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            so = build_probes(Path(tmp))
            seed = torch.randn(so.mma_probe_seed_words() * 2, device="cuda").to(DTYPES[args.dtype]).view(torch.int32)
            source = torch.randn(so.mma_probe_copy_source_bytes() // 2, device="cuda").to(DTYPES[args.dtype])
            warm_up_gpu()
            for probe in [PROBES.index(p) for p in args.probes.split(",")]:
                run, flop = probe_runner(so, probe, args.dtype == "bf16", sms, seed, source)
                rows.append(measure(f"mma {PROBES[probe]} ({args.dtype})", run, flop, sampler, args.seconds))
        for m, n, k in parse_shapes(args.shapes) if args.shapes else []:
            a, b = operands("tn", m, n, k, DTYPES[args.dtype])
            plan = Gemm(dtype=DTYPES[args.dtype], layout="tn", m=m, n=n, k=k)
            plan.family = "sm80"
            op = plan.compile()
            ref = a.float() @ b.float()
            err = ((op(a, b).float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, err
            row = measure(f"{op.name} {m}x{n}x{k}", lambda: op(a, b), 2.0 * m * n * k, sampler, args.seconds)
            rows.append({**row, "shape": [m, n, k], "kernel": op.name})
    finally:
        sampler.stop()
    ceiling_row = rows[0]
    for row in rows[1:]:
        row["per_clock_vs_ceiling"] = round(row["steady_tflops_per_ghz"] / ceiling_row["steady_tflops_per_ghz"], 3)
        print(f"{row.get('kernel', row['name'])}: {row['per_clock_vs_ceiling']:.3f} of {ceiling_row['name']} per clock")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
