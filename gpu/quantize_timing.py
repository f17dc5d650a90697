"""generator.quantize(x, "e4m3", scale="block" and scale="row") on CUDA: its kernels (generator.runtime.quantize_kernel)
against the torch path they replace, per shape and scale: median µs (triton do_bench), the kernel's bandwidth (x
read once, the fp8 values and the scales written), and the host time per call of quantize(), of its custom op and of
the bare ctypes launch (gpu/overhead.py's host_us). Writes $OUT/quantize_timing.json.

    python3 gpu/quantize_timing.py
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from unittest import mock

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from generator import quantize  # noqa: E402
from generator.runtime import quantize_kernel  # noqa: E402
from overhead import host_us  # noqa: E402

OUT = Path(os.environ.get("OUT", "."))
#: (rows, columns): decode and prefill activations of 4096- and 7168-wide models and an MLP's intermediate.
SHAPES = [(128, 7168), (4096, 4096), (4096, 14336), (16384, 7168)]


def main() -> None:
    rows = []
    fp8 = torch.float8_e4m3fn
    launches = quantize_kernel._KERNEL.launch(quantize_kernel._arch(torch.cuda.current_device()))
    for m, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for scale in quantize_kernel.SCALES:
            fused = lambda: quantize(x, "e4m3", scale=scale)  # noqa: E731
            q1, s1 = fused()
            with mock.patch.object(quantize_kernel, "quantize_on_gpu", lambda *a, **kw: None):
                q0, s0 = fused()
                torch_us = do_bench(fused, warmup=25, rep=100, return_mode="median") * 1e3
            assert torch.equal(q0.view(torch.uint8), q1.view(torch.uint8)) and torch.equal(s0, s1), (m, k, scale)
            kernel_us = do_bench(fused, warmup=25, rep=100, return_mode="median") * 1e3
            q, s = torch.empty_like(q1), torch.empty_like(s1)
            stream = torch.cuda.current_stream().cuda_stream
            raw = lambda: quantize_kernel._call(launches[scale], x, q, s, fp8, scale, stream)  # noqa: E731
            op = quantize_kernel.row_blocks if scale == "block" else quantize_kernel.rows
            host = {"host_us quantize": host_us(fused),
                    "host_us custom op": host_us(lambda: op(x, fp8)),  # noqa: B023
                    "host_us ctypes launch": host_us(raw),
                    "launch_us (do_bench)": do_bench(raw, warmup=25, rep=100, return_mode="median") * 1e3}
            moved = m * k * 2 + m * k + s1.numel() * 4
            row = {"rows": m, "cols": k, "scale": scale, "kernel_us": round(kernel_us, 2),
                   "torch_us": round(torch_us, 2), "speedup": round(torch_us / kernel_us, 2),
                   "kernel_GBps": round(moved / kernel_us / 1e3, 1), **{key: round(v, 2) for key, v in host.items()}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    (OUT / "quantize_timing.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
