"""generator.quantize(x, "e4m3", scale="block") on CUDA: its one-pass kernel (generator.runtime.quantize_kernel)
against the torch path it replaces, per shape: median µs (triton do_bench), the kernel's bandwidth (x read, the
fp8 values and the scales written), and the host time per call of quantize(), of its custom op and of the bare ctypes
launch (gpu/overhead.py's host_us). Writes $OUT/quantize_timing.json.

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
    for m, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        fused = lambda: quantize(x, "e4m3", scale="block")  # noqa: E731
        q1, s1 = fused()
        with mock.patch.object(quantize_kernel, "quantize_row_blocks", lambda *a, **kw: None):
            q0, s0 = fused()
            torch_us = do_bench(fused, warmup=25, rep=100, return_mode="median") * 1e3
        assert torch.equal(q0.view(torch.uint8), q1.view(torch.uint8)) and torch.equal(s0, s1), (m, k)
        kernel_us = do_bench(fused, warmup=25, rep=100, return_mode="median") * 1e3
        fp8 = torch.float8_e4m3fn
        launch = quantize_kernel._KERNEL.launch(quantize_kernel._arch(x.device.index))
        q, s = torch.empty_like(q1), torch.empty_like(s1)
        stream = torch.cuda.current_stream().cuda_stream
        raw = lambda: launch(x.data_ptr(), 2, x.stride(0), q.data_ptr(), s.data_ptr(), 0, 448.0,  # noqa: E731
                             m, k // 128, stream)
        host = {"host_us quantize": host_us(fused),
                "host_us custom op": host_us(lambda: quantize_kernel.row_blocks(x, fp8)),
                "host_us ctypes launch": host_us(raw),
                "launch_us (do_bench)": do_bench(raw, warmup=25, rep=100, return_mode="median") * 1e3}
        moved = m * k * 2 + m * k + s1.numel() * 4
        row = {"rows": m, "cols": k, "kernel_us": round(kernel_us, 2), "torch_us": round(torch_us, 2),
               "speedup": round(torch_us / kernel_us, 2), "kernel_GBps": round(moved / kernel_us / 1e3, 1),
               **{key: round(v, 2) for key, v in host.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    (OUT / "quantize_timing.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
