"""benchmarks/bench.py's timing method, without a GPU: every column of a row is measured the same number
of times, in alternating order (so a drift during the row hits all alike), and the table gets the median."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench  # noqa: E402


def test_rounds_alternate_and_the_median_is_reported(monkeypatch):
    calls = []
    # each call's do_bench median: ours 1, 2, 9 ms; cuBLAS 3, 3, 3; Triton 5, 4, 6 (in call order per column)
    results = {"ours": iter([1.0, 2.0, 9.0]), "cublas": iter([3.0, 3.0, 3.0]), "triton": iter([5.0, 4.0, 6.0])}

    def fake_bench_ms(fn):
        name = fn()
        calls.append(name)
        return next(results[name])

    monkeypatch.setattr(bench, "bench_ms", fake_bench_ms)
    fns = {name: (lambda name=name: name) for name in ("ours", "cublas", "triton")}
    ms = bench.timed_rounds(fns, 3)
    assert calls == ["ours", "cublas", "triton", "triton", "cublas", "ours", "ours", "cublas", "triton"]
    assert ms == {"ours": 2.0, "cublas": 3.0, "triton": 5.0}
    calls.clear()
    results.update(ours=iter([7.0]), cublas=iter([8.0]), triton=iter([9.0]))
    assert bench.timed_rounds(fns, 1) == {"ours": 7.0, "cublas": 8.0, "triton": 9.0}


def test_power_probe_variants_and_benchmark_shapes_parse():
    """gpu/power_probe.py's --variant and the benchmark scripts' --shapes, as the device runs take them."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu"))
    import power_probe

    assert power_probe.parse_variant("g16=raster_group:16,raster:n") == ("g16", {"raster_group": 16, "raster": "n"})
    assert power_probe.parse_variant("planner=") == ("planner", {})
    assert bench.parse_shapes("4096x14336x4096") == [(4096, 14336, 4096)]
    assert bench.parse_shapes("1024X1024X1024,128x4096x4096") == [(1024, 1024, 1024), (128, 4096, 4096)]
    with pytest.raises(ValueError):
        bench.parse_shapes("4096x4096")


def test_ab_variants_takes_explicit_sm90_kernels():
    """gpu/ab_variants.py --kernel TILE:CLUSTER:SCHEDULE:STAGES, as the device runs give it."""
    import argparse

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu"))
    import ab_variants

    spec = ab_variants.parse_sm90_kernel("128x256x64:2x1:cooperative:3")
    assert spec == ((128, 256, 64), (2, 1), "cooperative", 3)
    names = [c.name for c in ab_variants.family_configs("sm90", "bf16", "tn", 90, [spec])]
    assert names == ["sm90_bf16_tn_128x256x64_c2x1_s3_coop_g8m"]
    for bad in ("128x256x64:2x1:cooperative", "128x256:2x1:cooperative:x"):
        with pytest.raises(argparse.ArgumentTypeError, match="TILE:CLUSTER:SCHEDULE:STAGES"):
            ab_variants.parse_sm90_kernel(bad)


def test_ab_variants_refuses_kernels_without_sm90_configs(capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu"))
    import ab_variants

    with pytest.raises(SystemExit) as exit_info:
        ab_variants.main(["--kernel", "128x256x64:2x1:cooperative:3", "--variant", "a=", "--variant", "b=-DX=1"])
    assert exit_info.value.code == 2
    assert "--kernel takes sm90 kernels: add --configs sm90" in capsys.readouterr().err


def test_mma_ceiling_kernel_compiles(tmp_path):
    """gpu/mma_ceiling.cu (the device's per-clock ceiling probe) still builds against the PTX helpers."""
    import subprocess

    from test_nvcc_compile import NO_NVCC, NVCC, parse_ptxas

    if NVCC is None:
        pytest.skip(NO_NVCC)
    root = Path(__file__).resolve().parent.parent
    cmd = [NVCC, "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c",
           str(root / "gpu" / "mma_ceiling.cu"), "-o", str(tmp_path / "mma_ceiling.o")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = parse_ptxas(done.stderr)
    assert len(report) == 16, report  # 8 probes, bf16 and fp16
    assert all(r["spill_stores"] == 0 and r["spill_loads"] == 0 for r in report.values()), report


def test_ab_variants_summarizes_rounds_by_mode():
    """do_bench rounds keep the best median; steady rounds the median stretch and its clock."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu"))
    import ab_variants

    rounds = [(2.0, 1500.0), (1.0, 1400.0), (4.0, 1300.0)]
    assert ab_variants.summarize([(ms, None) for ms, _ in rounds], steady=0.0) == (1.0, None)
    assert ab_variants.summarize(rounds, steady=2.0) == (2.0, 1400.0)
