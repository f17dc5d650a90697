"""fp8 grouped GEMM with per-row scales against torch._scaled_grouped_mm (its rowwise form, the kernel torch's fp8 MoE
paths call): ``op.grouped(A, B, offsets, scale_a, scale_b)`` of ``Gemm("e4m3", "tn", scale="row", m=rows per group,
n=, k=, batch=E, ragged=True)``, scale_a (total_M,) and scale_b (E, N), on the same tensors, each result checked
against the other (and ours against float64 on the first case). Group sizes are skewed (a Dirichlet draw) and
multiples of 16. do_bench medians of three interleaved rounds (bench.py timed_rounds); writes $OUT/bench_grouped_fp8_rowwise.json.

    python3 gpu/bench_grouped_fp8_rowwise.py
"""
from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import torch  # noqa: E402

from bench import timed_rounds, warm_up_gpu  # noqa: E402
from generator import Gemm, dequantize, quantize  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

#: (experts, rows in all, N, K)
CASES = [(8, 4096, 4096, 7168), (32, 4096, 4096, 2048), (8, 16384, 14336, 4096)]
ALIGN = 16
ROUNDS = 3


def group_sizes(experts: int, rows: int, seed: int = 0) -> list[int]:
    """A skewed split of ``rows`` into ``experts`` sizes (a Dirichlet(0.5) draw), each a multiple of ALIGN (some may
    be 0); the largest takes what the rounding left."""
    draw = random.Random(seed)
    share = [draw.gammavariate(0.5, 1.0) for _ in range(experts)]
    sizes = [int(s / sum(share) * rows) // ALIGN * ALIGN for s in share]
    sizes[sizes.index(max(sizes))] += rows - sum(sizes)
    return sizes


def main() -> None:
    cases = [(e, rows, n, k, group_sizes(e, rows)) for e, rows, n, k in CASES]
    plans = [Gemm("e4m3", "tn", scale="row", m=rows // e, n=n, k=k, batch=e, ragged=True) for e, rows, n, k, _ in cases]
    ops = compile_many([p.config for p in plans], namespace="gemmgen_bench_fp8_rowwise")
    warm_up_gpu()
    results = []
    for (e, rows, n, k, sizes), op in zip(cases, ops):
        x, w = torch.randn(rows, k, device="cuda"), torch.randn(e, n, k, device="cuda")
        a, scale_a = quantize(x, "e4m3", scale="row")
        q, scale_b = quantize(w, "e4m3", scale="row")
        b = q.transpose(1, 2)
        offsets = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
        ours = lambda: op.grouped(a, b, offsets, scale_a, scale_b)   # noqa: E731
        torch_call = lambda: torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offsets,   # noqa: E731
                                                      out_dtype=torch.bfloat16)
        d = ours()
        row = {"experts": e, "rows": rows, "n": n, "k": k, "sizes": sizes, "kernel": op.name}
        if not results:   # the first case against float64
            ref_a, ref_w = dequantize(a, scale_a, scale="row").double(), dequantize(q, scale_b, scale="row").double()
            ref = torch.cat([r @ ref_w[g].t() for g, r in enumerate(torch.split(ref_a, sizes))])
            row["rel_error_float64"] = ((d.double() - ref).norm() / ref.norm()).item()
        try:
            t = torch_call()
            row["rel_diff_torch"] = ((d.double() - t.double()).norm() / t.double().norm()).item()
        except RuntimeError as err:   # a form this torch does not take: say so, time ours alone
            torch_call, row["torch_refused"] = None, str(err).splitlines()[0]
        ms = timed_rounds({"ours": ours, **({"torch": torch_call} if torch_call is not None else {})}, ROUNDS)
        flop = 2.0 * rows * n * k
        row["ours_tflops"] = flop / ms["ours"] / 1e9
        if "torch" in ms:
            row["torch_tflops"] = flop / ms["torch"] / 1e9
            row["ours_vs_torch"] = row["ours_tflops"] / row["torch_tflops"]
        print(json.dumps(row), flush=True)
        results.append(row)
    out = Path(os.environ.get("OUT", ".")) / "bench_grouped_fp8_rowwise.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": results},
                              indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
