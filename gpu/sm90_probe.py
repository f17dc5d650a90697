"""Development probe for the sm90 templates, independent of the planner: render explicit template
contexts, build them in one parallel ninja run, check numerics (fast TMA path, ragged sizes through
padded leading dimensions), repeatability, and time the big squares against torch.matmul.

    python3 gpu/sm90_probe.py [--quick] [--json $OUT/sm90_probe.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from generator.spec.arch import ARCHS  # noqa: E402
from generator.toolchain import BuildRequest, build_many, spill_report  # noqa: E402
from generator.runtime import GemmArgsStruct, KernelLibrary  # noqa: E402
from generator.render import _environment, templates_dir  # noqa: E402

CUDA_TYPE = {"bf16": "__nv_bfloat16", "fp16": "__half", "fp32": "float"}
TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
BOUND = {"bf16": 1e-2, "fp16": 5e-3}
SCHED_TAG = {"ws": "ws", "cooperative": "coop", "pingpong": "pp"}


def context(dtype: str, out: str, layout: str, tile: tuple[int, int], stages: int, cluster: tuple[int, int],
            schedule: str, d_row: bool = True, raster: str = "m", group: int = 8) -> dict:
    bm, bn = tile
    name = (f"probe_{dtype}_{layout}{'' if d_row else '_dcol'}_{bm}x{bn}x64_c{cluster[0]}x{cluster[1]}_s{stages}_"
            f"{SCHED_TAG[schedule]}_g{group}{raster}_o{out}")
    return dict(name=name, description=[name], elem_cuda=CUDA_TYPE[dtype], out_cuda=CUDA_TYPE[out], bm=bm, bn=bn,
                bk=64, stages=stages, cluster_m=cluster[0], cluster_n=cluster[1], schedule=schedule, raster=raster,
                raster_group=group, a_k_major=layout[0] == "t", b_k_major=layout[1] == "n", d_row_major=d_row,
                _dtype=dtype, _out=out, _layout=layout)


def kernels(quick: bool) -> list[dict]:
    out = []
    main = [((128, 256), 4, (2, 1), "cooperative"), ((128, 256), 4, (1, 1), "cooperative"),
            ((128, 256), 4, (1, 2), "cooperative"), ((128, 128), 6, (1, 1), "ws"),
            ((64, 256), 4, (1, 1), "pingpong"), ((128, 128), 6, (2, 1), "pingpong"),
            ((256, 128), 4, (1, 1), "cooperative"), ((128, 192), 4, (2, 1), "cooperative")]
    if quick:
        main = main[:1]
    for tile, stages, cluster, schedule in main:
        for layout in ("tn", "nn", "nt", "tt"):
            out.append(context("bf16", "bf16", layout, tile, stages, cluster, schedule))
    out.append(context("fp16", "fp32", "tn", (128, 256), 4, (2, 1), "cooperative"))
    out.append(context("fp16", "fp16", "nt", (128, 256), 4, (2, 1), "cooperative", d_row=False))
    out.append(context("bf16", "bf16", "tn", (128, 256), 4, (2, 1), "cooperative", raster="n"))
    for group in (4, 16):
        out.append(context("bf16", "bf16", "tn", (128, 256), 4, (2, 1), "cooperative", group=group))
    return out


def operand(rows: int, cols: int, row_major: bool, dtype: torch.dtype) -> torch.Tensor:
    """Random (rows, cols), stored row- or column-major with the leading dimension padded to 8."""
    if row_major:
        ld = (cols + 7) // 8 * 8
        return torch.randn(rows, ld, device="cuda").to(dtype)[:, :cols]
    ld = (rows + 7) // 8 * 8
    return torch.randn(cols, ld, device="cuda").to(dtype)[:, :rows].t()


def run(lib: KernelLibrary, ctx: dict, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor) -> int:
    lda = a.stride(0) if ctx["a_k_major"] else a.stride(1)
    ldb = b.stride(1) if ctx["b_k_major"] else b.stride(0)
    ldd = d.stride(0) if ctx["d_row_major"] else d.stride(1)
    if a.shape[0] == 1 and ctx["a_k_major"]:
        lda = max(lda, a.shape[1])
    args = GemmArgsStruct(a.data_ptr(), b.data_ptr(), d.data_ptr(), a.shape[0], b.shape[1], a.shape[1], lda, ldb, ldd)
    path = lib.choose_path(ctypes.byref(args))
    code = lib.launch(ctypes.byref(args), torch.cuda.current_stream().cuda_stream)
    if code:
        raise RuntimeError(f"{ctx['name']}: launch error {code} {lib.error_string(code).decode()}")
    return path


def check(lib: KernelLibrary, ctx: dict, m: int, n: int, k: int) -> tuple[float, int]:
    dt, od = TORCH[ctx["_dtype"]], TORCH[ctx["_out"]]
    a = operand(m, k, ctx["a_k_major"], dt)
    b = operand(k, n, not ctx["b_k_major"], dt)
    if ctx["d_row_major"]:
        d = torch.full((m, (n + 7) // 8 * 8), float("nan"), dtype=od, device="cuda")[:, :n]
    else:
        d = torch.full((n, (m + 7) // 8 * 8), float("nan"), dtype=od, device="cuda")[:, :m].t()
    path = run(lib, ctx, a, b, d)
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    if ref.numel() == 0:
        return 0.0, path
    diff = (d.double() - ref).norm()
    err = float("inf") if not torch.isfinite(diff) else (diff / ref.norm().clamp_min(1e-30)).item()
    if k == 0:
        err = 0.0 if torch.count_nonzero(d) == 0 and torch.isfinite(d.float()).all() else float("inf")
    return err, path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "sm90_probe.json"))
    ap.add_argument("--no-bench", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    ctxs = kernels(args.quick)
    env = _environment()
    template = env.get_template("sm90/gemm.cu.j2")
    reqs = [BuildRequest(name=c["name"], sources={f"{c['name']}.cu": template.render(**c)},
                         gencode=ARCHS[90].gencode, include_dirs=(str(templates_dir()),)) for c in ctxs]
    t0 = time.time()
    results = build_many(reqs)
    print(f"built {len(reqs)} kernels in {time.time() - t0:.1f} s", flush=True)
    report = {"kernels": {}, "bench": []}
    failures = 0
    sizes = [(1, 1, 1), (7, 8, 63), (65, 129, 127), (127, 1000, 64), (1000, 4097, 129), (4097, 63, 1000),
             (129, 7, 4097), (3000, 5000, 1000), (4097, 4095, 4104), (127, 8191, 4096), (256, 512, 0),
             (8192, 1024, 2048)]
    for ctx, res in zip(ctxs, results):
        spills = spill_report(res.ptxas_log).get(ctx["name"], {})
        lib = KernelLibrary.load(res.library, ctx["name"])
        rows = []
        for m, n, k in sizes:
            try:
                err, path = check(lib, ctx, m, n, k)
            except Exception as exc:  # noqa: BLE001 - report and go on
                err, path = float("inf"), -1
                print(f"  {ctx['name']} {m}x{n}x{k}: {exc}", flush=True)
                torch.cuda.synchronize()
            ok = err <= BOUND[ctx["_dtype"]]
            failures += not ok
            rows.append({"m": m, "n": n, "k": k, "err": err, "path": path, "ok": ok})
            if not ok:
                print(f"  FAIL {ctx['name']} M={m} N={n} K={k}: rel err {err:.3g} path {path}", flush=True)
        # Repeatability: the same inputs, 10 runs, bit-identical.
        dt = TORCH[ctx["_dtype"]]
        a = operand(1000, 1032, ctx["a_k_major"], dt)
        b = operand(1032, 1000, not ctx["b_k_major"], dt)
        outs = []
        for _ in range(10):
            d = torch.empty(1000, 1000, dtype=TORCH[ctx["_out"]], device="cuda")
            if not ctx["d_row_major"]:
                d = torch.empty(1000, 1000, dtype=TORCH[ctx["_out"]], device="cuda").t()
            run(lib, ctx, a, b, d)
            outs.append(d.clone())
        same = all(torch.equal(outs[0], o) for o in outs[1:])
        failures += not same
        worst = max(r["err"] for r in rows)
        print(f"{ctx['name']}: regs {spills.get('registers')} spills {spills.get('spill_stores')} "
              f"worst err {worst:.3g} repeatable {same}", flush=True)
        report["kernels"][ctx["name"]] = {"rows": rows, "repeatable": same, "ptxas": spills}
    if not args.no_bench:
        import triton.testing

        for ctx, res in zip(ctxs, results):
            if ctx["_layout"] != "tn" or ctx["_out"] != ctx["_dtype"] or not ctx["d_row_major"]:
                continue
            lib = KernelLibrary.load(res.library, ctx["name"])
            for s in (4096, 8192):
                a = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
                d = torch.empty(s, s, device="cuda", dtype=torch.bfloat16)
                ours = triton.testing.do_bench(lambda: run(lib, ctx, a, w.t(), d), warmup=100, rep=400,
                                               return_mode="median")
                cublas = triton.testing.do_bench(lambda: torch.matmul(a, w.t()), warmup=100, rep=400,
                                                 return_mode="median")
                flops = 2 * s**3
                row = {"kernel": ctx["name"], "size": s, "ours_tflops": flops / ours / 1e9,
                       "cublas_tflops": flops / cublas / 1e9, "ratio": cublas / ours}
                report["bench"].append(row)
                print(f"{ctx['name']} {s}^3: ours {row['ours_tflops']:.1f} cuBLAS {row['cublas_tflops']:.1f} "
                      f"ratio {row['ratio']:.3f}", flush=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    print(f"failures: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
