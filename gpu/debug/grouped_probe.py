"""Which grouped call faults: each grouped plan of tests/gpu/test_grouped.py in its own process (a sticky CUDA
error hides the next ones), every case of its CASES with a sync after each, plus one 2-D call first.

    python3 gpu/debug/grouped_probe.py            (the parent: one child per plan)
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))


def child(key: str) -> None:
    import torch
    import test_grouped as t
    from generator import Gemm
    from generator.runtime import compile_many

    op = compile_many([Gemm(**t.GROUPED_PLANS[key]).config], namespace="gemmgen_grouped_probe")[0]
    a = torch.randn(300, 200, device="cuda").to(op.dtype)
    layout = op.config.layout
    A = a if layout.a.value == "row" else a.t().contiguous().t()
    b = torch.randn(200, 136, device="cuda").to(op.dtype)
    B = b if layout.b.value == "row" else b.t().contiguous().t()
    d = op(A, B)
    torch.cuda.synchronize()
    print(f"{key}: 2-D ok, err {((d.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()):.1e}",
          flush=True)
    for label, sizes, n, k in t.CASES:
        A, B, offsets = t.inputs(op, sizes, n, k)
        try:
            D = op.grouped(A, B, offsets)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - report and stop: the context is gone
            print(f"{key}: FAULT at {label} sizes={sizes} N={n} K={k}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            return
        ref = t.reference(A, B, sizes)
        err = ((D.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        print(f"{key}: {label} ok err {err:.1e}", flush=True)


def main() -> None:
    if len(sys.argv) > 1:
        child(sys.argv[1])
        return
    import test_grouped as t
    from generator import Gemm
    from generator.runtime import compile_many
    compile_many([Gemm(**kw).config for kw in t.GROUPED_PLANS.values()], namespace="gemmgen_grouped_probe")  # in parallel
    for key in t.GROUPED_PLANS:
        subprocess.run([sys.executable, __file__, key], check=False, timeout=120)


if __name__ == "__main__":
    main()
