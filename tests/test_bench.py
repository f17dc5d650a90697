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
