"""Grouped GEMM of a list of problems from an emitted package: ``grouped_gemm.run([A0, A1], [B0, B1])``.

(This script is not named grouped_gemm.py: its folder comes first on sys.path, and the script would then be what
``import grouped_gemm`` finds instead of the package.)

    python examples/grouped_gemm_package.py [--out emitted/grouped_gemm]

Plans a bf16 GEMM for the sm90 family (layout ``tn``: A (M, K) row-major, B = W.t() for a weight W (N, K), the
cooperative schedule, which takes list calls), emits it as the package ``grouped_gemm`` with its one op named ``run``
(``emit(..., op_names=["run"])``), pip-installs it (``pip install --no-build-isolation --no-deps --force-reinstall
<folder>``) and uses it as any user would:

    import grouped_gemm
    Ds = grouped_gemm.run([A0, A1, ...], [B0, B1, ...])   # D[i] = A[i] @ B[i]: problems of their own sizes, one launch

(``grouped_gemm.run(A, B)`` with two tensors is the plain GEMM; ``grouped_gemm.run.grouped_list(As, Bs)`` and
``torch.ops.grouped_gemm.run.grouped_list(As, Bs)`` are the list call too.) Each D[i] is checked against
``A[i].float() @ B[i].float()``, and the one launch is timed next to a loop of torch.matmul over the same problems.

Without a CUDA GPU of compute capability 9.0 or newer, torch or nvcc it emits the package, then prints what it
skipped and why, and exits 0. Exit status 1 when a result is wrong.
"""
from __future__ import annotations

import argparse
import importlib
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

try:
    import torch
except ImportError:  # planning and emitting do not need torch
    torch = None

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # run from a checkout without installing gemmgen

from generator import Gemm, emit  # noqa: E402

PACKAGE = "grouped_gemm"
OP = "run"
#: (M, K, N) of the problems: ragged sizes, one row, and an empty problem (no rows: an empty D, nothing launched).
#: K a multiple of 8 keeps A's and B's leading dimensions (K elements) on the 16-byte rule of the list form.
SIZES = [(256, 512, 384), (1, 4096, 1024), (0, 128, 256), (777, 1024, 1536), (64, 2048, 48)]
REL_ERROR_BOUND = 1e-2  # bf16 inputs, fp32 accumulation


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "emitted" / PACKAGE,
                   help="the folder to emit the package into (default emitted/grouped_gemm, emit's default folder)")
    return p.parse_args(argv)


def plan() -> Gemm:
    """bf16 tn for Hopper on the cooperative schedule: a persistent kernel, which takes list calls."""
    return Gemm(dtype="bf16", layout="tn", arch=90, schedule="cooperative")


def emit_package(out: Path) -> Path:
    """The package ``grouped_gemm`` with the plan's op as ``run`` (no backward kernels: this example runs no
    backward, and the package builds faster without them)."""
    return emit(plan(), name=PACKAGE, out=out, op_names=[OP], autograd=False)


def why_not_run() -> str | None:
    """Why the GPU part cannot run here, or None."""
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    if torch.cuda.get_device_capability() < (9, 0):
        return f"{torch.cuda.get_device_name()} is not sm_90 (the list form runs on the sm90 family's kernels)"
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        return "nvcc is not on PATH and CUDA_HOME is not set (pip builds the package with it)"
    return None


def install(folder: Path) -> None:
    """pip install the emitted folder into this Python, against the torch installed here."""
    command = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--force-reinstall",
               str(folder)]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    importlib.invalidate_caches()


def problems() -> tuple[list, list]:
    """A[i] (M, K) row-major and B[i] = W[i].t() for a contiguous W[i] (N, K), on the GPU."""
    like = dict(device="cuda", dtype=torch.bfloat16)
    return ([torch.randn(m, k, **like) for m, k, _ in SIZES], [torch.randn(n, k, **like).t() for _, k, n in SIZES])


def median_ms(fn, warmup: int = 5, iters: int = 20) -> float:
    """Median time of fn() in milliseconds, each call timed with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def check(Ds: list, As: list, Bs: list) -> bool:
    """Each D[i] against torch in float32; prints one line per problem."""
    ok = True
    for i, (d, a, b) in enumerate(zip(Ds, As, Bs)):
        ref = a.float() @ b.float()
        rel = ((d.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item() if d.numel() else 0.0
        good = tuple(d.shape) == tuple(ref.shape) and d.dtype == torch.bfloat16 and rel <= REL_ERROR_BOUND
        ok &= good
        print(f"  D[{i}] {tuple(d.shape)}: relative error {rel:.2e} (bound {REL_ERROR_BOUND:.0e}) "
              f"{'OK' if good else 'WRONG'}")
    return ok


def run_on_gpu(folder: Path) -> int:
    install(folder)
    grouped_gemm = importlib.import_module(PACKAGE)
    As, Bs = problems()
    Ds = grouped_gemm.run(As, Bs)   # one launch for every problem with work
    print(f"{PACKAGE}.{OP}(As, Bs): {len(Ds)} problems (M, K, N) {SIZES}")
    ok = check(Ds, As, Bs)
    ours = median_ms(lambda: grouped_gemm.run(As, Bs))
    loop = median_ms(lambda: [torch.matmul(a, b) for a, b in zip(As, Bs)])
    print(f"one list call: {ours:.3f} ms; a loop of torch.matmul: {loop:.3f} ms ({loop / ours:.2f}x)")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(plan(), "\n")
    folder = emit_package(args.out)
    print(f"emitted {folder}: import {PACKAGE}; Ds = {PACKAGE}.{OP}([A0, A1, ...], [B0, B1, ...])")
    reason = why_not_run()
    if reason is not None:
        print(f"skipped: pip install of {folder} and the GPU run (one list call checked against torch, and timed): "
              f"{reason}")
        return 0
    return run_on_gpu(folder)


if __name__ == "__main__":
    sys.exit(main())
