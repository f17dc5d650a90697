"""benchmarks/bench.py's timing method, without a GPU: every column of a row is measured the same number
of times, interleaved so that every column follows every other alike (a drift during the row, and the
power history each window inherits, hit all alike), and the table gets the median."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench  # noqa: E402


def test_rounds_interleave_and_the_median_is_reported(monkeypatch):
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
    assert calls == ["ours", "cublas", "triton", "ours", "triton", "cublas", "ours", "cublas", "triton"]
    assert ms == {"ours": 2.0, "cublas": 3.0, "triton": 5.0}
    calls.clear()
    results.update(ours=iter([7.0]), cublas=iter([8.0]), triton=iter([9.0]))
    assert bench.timed_rounds(fns, 1) == {"ours": 7.0, "cublas": 8.0, "triton": 9.0}
    results.update(ours=iter([1.0, 2.0]), cublas=iter([3.0, 4.0]), triton=iter([5.0, 6.0]))
    calls.clear()
    bench.timed_rounds(fns, 2, order="alternating")
    assert calls == ["ours", "cublas", "triton", "triton", "cublas", "ours"]


@pytest.mark.parametrize("columns", [2, 3, 4, 5])
@pytest.mark.parametrize("per_name", [1, 2, 5, 6])
def test_balanced_order_gives_every_column_the_same_neighbours(columns, per_name):
    """Each column measured per_name times, never twice in a row, and (for the 2-4 columns the scripts
    time) each ordered pair of columns adjacent as often as any other, within one: the cap's power
    history is what a window inherits."""
    names = [f"c{i}" for i in range(columns)]
    order = bench.balanced_order(names, per_name)
    assert all(order.count(n) == per_name for n in names)
    assert all(a != b for a, b in zip(order, order[1:]))
    if columns > 4:
        return  # the greedy order is only near-balanced here; no script times five columns
    pairs = [(a, b) for a in names for b in names if a != b]
    transitions = list(zip(order, order[1:]))
    uses = [transitions.count(p) for p in pairs]
    assert max(uses) - min(uses) <= 1, dict(zip(pairs, uses))
    # preceded by each other column alike, so no column gets the cooler or hotter neighbour more often
    for n in names:
        before = [transitions.count((m, n)) for m in names if m != n]
        assert max(before) - min(before) <= 1, (n, before)


def test_the_old_alternating_order_favoured_the_middle_column():
    """Why the order changed: A B C / C B A runs A and C back to back (a hotter second window) and never B."""
    order = bench.alternating_order(["ours", "cublas", "triton"], 5)
    repeats = {n: sum(a == b == n for a, b in zip(order, order[1:])) for n in ("ours", "cublas", "triton")}
    assert repeats == {"ours": 2, "cublas": 0, "triton": 2}


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
    assert spec == ((128, 256, 64), (2, 1), "cooperative", 3, False)
    split = ab_variants.parse_sm90_kernel("64x128x64:1x1:pingpong:8:sk")   # a fifth field: stream-K / split-K
    names = [c.name for c in ab_variants.family_configs("sm90", "bf16", "tn", 90, [spec, split])]
    assert names == ["sm90_bf16_tn_128x256x64_c2x1_s3_coop_g8m", "sm90_bf16_tn_64x128x64_c1x1_s8_pp_sk_g8n"]
    for bad in ("128x256x64:2x1:cooperative", "128x256:2x1:cooperative:x", "64x128x64:1x1:pingpong:8:xx"):
        with pytest.raises(argparse.ArgumentTypeError, match="TILE:CLUSTER:SCHEDULE:STAGES"):
            ab_variants.parse_sm90_kernel(bad)


def test_ab_variants_rows_compare_to_one_cublas_reading_per_shape():
    """gpu/ab_variants.py times torch.matmul beside each kernel; every row of a shape is put against the median of
    those readings, so that two kernels' ratios compare as their times do."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu"))
    import ab_variants

    rows = [{"ms": 2.0}, {"ms": 1.0}, {"ms": 4.0}]
    assert ab_variants.against_median_cublas(rows, [1.9, 2.0, 2.2], flop=2e9) == 2.0
    assert [r["vs_cublas"] for r in rows] == [1.0, 2.0, 0.5]
    assert rows[1]["cublas_tflops"] == 1.0 and rows[0]["vs_cublas"] / rows[2]["vs_cublas"] == 4.0 / 2.0


def test_ab_variants_summarises_each_variant_against_the_first():
    """The summary a device run prints and writes: the first variant's time over each other's, per (shape, kernel)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu"))
    import ab_variants

    rows = [{"shape": s, "kernel": "k", "variant": v, "ms": ms}
            for s, v, ms in (("a", "base", 2.0), ("a", "new", 1.0), ("b", "base", 1.0), ("b", "new", 2.0),
                             ("b", "old", 1.0))]
    summary = ab_variants.variant_summary(rows)
    assert summary["new"] == {"pairs": 2, "geomean": pytest.approx(1.0), "min": 0.5, "max": 2.0}
    assert summary["old"]["pairs"] == 1 and "base" not in summary


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
    assert len(report) == 20, report  # 10 probes, bf16 and fp16
    assert all(r["spill_stores"] == 0 and r["spill_loads"] == 0 for r in report.values()), report


def test_ab_variants_summarizes_rounds_by_mode():
    """do_bench rounds keep the best median; steady rounds the median stretch and its clock."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu"))
    import ab_variants

    rounds = [(2.0, 1500.0), (1.0, 1400.0), (4.0, 1300.0)]
    assert ab_variants.summarize([(ms, None) for ms, _ in rounds], steady=0.0) == (1.0, None)
    assert ab_variants.summarize(rounds, steady=2.0) == (2.0, 1400.0)


def test_triton_mma_sync_column_is_printed_and_checked():
    """The optional Triton mma.sync column shows in the header and rows, and a wgmma build is refused."""
    row = bench.Row(4096, 4096, 4096, "bf16", "tn", "k", 0.3, 0.2, 0.25, 458.1, 687.2, 549.8, 0.667, 0.833, 1e-3)
    assert "Tri.mma" not in bench.header() and "416.5" not in bench.format_row(row)
    with_column = bench.Row(**{**row.__dict__, "triton_mma_sync_ms": 0.33, "triton_mma_sync_tflops": 416.5,
                               "vs_triton_mma_sync": 1.1})
    assert "Tri.mma" in bench.header(True) and "416.5" in bench.format_row(with_column)
    assert len(bench.header(True)) - len(bench.header()) == len(bench.format_row(with_column)) - len(
        bench.format_row(row))
    bench.check_mma_sync_build({"mma.sync"})
    with pytest.raises(RuntimeError, match="ignores DISABLE_MMA_V3"):
        bench.check_mma_sync_build({"wgmma", "mma.sync"})


def test_planned_ops_per_shape_or_bucketed(monkeypatch):
    """--bucketed times the op generator.nn.Linear holds (one per N and K, a kernel per bucket of M); without it,
    a kernel planned for each shape. Every distinct kernel is built once, in one call."""
    from functools import partial
    from types import SimpleNamespace

    from generator import Gemm

    builds = []

    def fake_compile_many(configs, *, namespace, problems):
        builds.append(list(zip(configs, problems)))
        return [SimpleNamespace(name=c.name, config=c, dtype=None, out_dtype=None, device_type="cuda") for c in configs]

    monkeypatch.setattr(bench, "compile_many", fake_compile_many)
    monkeypatch.setattr(bench, "Gemm", partial(Gemm, arch=90))
    shapes = [(16, 4096, 4096), (300, 4096, 4096), (4096, 4096, 4096)]
    per_shape = bench.planned_ops(shapes, ["bf16"], "tn", {}, None)
    assert [op.name for op in per_shape.values()] == [
        "sm90_bf16_tn_64x64x64_c1x1_s12_pp_g1m", "sm90_bf16_tn_128x128x64_c2x1_s6_pp_g8m",
        "sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m"]
    bucketed = bench.planned_ops(shapes, ["bf16"], "tn", {}, bench.M_BUCKETS)
    ops = list(bucketed.values())
    # one build, each op (kernel and backward hint) once: one per bucket of the one (N, K) that does not merge
    buckets = Gemm("bf16", "tn", arch=90, n=4096, k=4096).bucket_plans(bench.M_BUCKETS)
    assert len(builds) == 2 and len(builds[1]) == len(set(builds[1])) == len(buckets) >= 5
    assert [op.select(m).name for op, (m, _, _) in zip(ops, shapes)] == [op.name for op in per_shape.values()]


def test_batched_shapes_parse_and_the_bmm_set():
    """--set bmm is issue 21's batched shapes (batch, M, N, K); bench.py's --shapes takes BxMxNxK next to MxNxK, the
    other scripts' parse_shapes still only MxNxK."""
    assert bench.load_shapes(["bmm"]) == [(32, 2048, 2048, 128), (32, 2048, 128, 2048), (8, 4096, 4096, 4096),
                                          (512, 256, 256, 256)]
    assert bench.load_shapes(["square", "bmm"])[:4] == [(1024,) * 3, (2048,) * 3, (4096,) * 3, (8192,) * 3]
    assert bench.parse_shapes("32x2048x2048x128,128x4096x4096", batched=True) == [(32, 2048, 2048, 128),
                                                                                  (128, 4096, 4096)]
    assert bench.split_shape((32, 2048, 128, 2048)) == (32, 2048, 128, 2048)
    assert bench.split_shape((128, 4096, 4096)) == (None, 128, 4096, 4096)
    for bad, batched in (("32x2048x2048x128", False), ("4096x4096", True), ("1x2x3x4x5", True)):
        with pytest.raises(ValueError):
            bench.parse_shapes(bad, batched=batched)


def test_planned_ops_for_batched_shapes(monkeypatch):
    """A batched shape gets the op planned for its batch of M x N x K problems (Gemm's batch hint), in the batched
    layout (tt by default in main: torch.bmm's row-major A and B); bucketed ops refuse batched shapes."""
    from functools import partial
    from types import SimpleNamespace

    from generator import Gemm

    def fake_compile_many(configs, *, namespace, problems):
        return [SimpleNamespace(name=c.name, config=c) for c in configs]

    monkeypatch.setattr(bench, "compile_many", fake_compile_many)
    monkeypatch.setattr(bench, "Gemm", partial(Gemm, arch=90))
    shapes = [(8, 4096, 4096, 4096), (4096, 4096, 4096), (512, 256, 256, 256)]
    ops = bench.planned_ops(shapes, ["bf16"], "tn", {}, None, batched_layout="tt")
    assert [op.name for op in ops.values()] == [Gemm("bf16", "tt", arch=90, m=4096, n=4096, k=4096, batch=8).name,
                                                Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096).name,
                                                Gemm("bf16", "tt", arch=90, m=256, n=256, k=256, batch=512).name]
    # the batch counts: 512 problems of 256^3 are not planned as one 256^3 problem
    assert ops[((512, 256, 256, 256), "bf16")].name != Gemm("bf16", "tt", arch=90, m=256, n=256, k=256).name
    with pytest.raises(ValueError, match="batched shapes without --bucketed"):
        bench.planned_ops(shapes, ["bf16"], "tn", {}, bench.M_BUCKETS)


def test_batched_rows_print_and_write_json():
    """A batch column only in runs with batched shapes (the other sets' table and JSON rows stay as they were); a
    batched row shows no Triton numbers and its JSON names the batch and the baseline, torch.bmm."""
    row = bench.Row(4096, 4096, 4096, "bf16", "tn", "k", 0.3, 0.2, 0.25, 458.1, 687.2, 549.8, 0.667, 0.833, 1e-3)
    bmm = bench.Row(2048, 2048, 128, "bf16", "tt", "k", 0.3, 0.2, None, 458.1, 687.2, None, 0.667, None, 1e-3,
                    batch=32, baseline="torch.bmm")
    assert "batch" not in bench.header() and bench.format_row(row) == bench.format_row(row, False)
    assert bench.header(False, True).startswith("batch ")
    assert len(bench.header(False, True)) - len(bench.header()) == len(bench.format_row(bmm, True)) - len(
        bench.format_row(bmm))
    assert bench.format_row(bmm, True).split()[:4] == ["32", "2048", "2048", "128"]
    assert bench.format_row(row, True).split()[0] == "-"
    assert bench.format_row(bmm).split()[6] == "-"   # the Triton column: not measured
    assert "batch" not in bench.row_json(row) and "baseline" not in bench.row_json(row)
    assert bench.row_json(bmm)["batch"] == 32 and bench.row_json(bmm)["baseline"] == "torch.bmm"
    # (a batched 8 x 8192^3 is not a square of the 2-D targets)
    square = bench.Row(**{**row.__dict__, "m": 8192, "n": 8192, "k": 8192, "vs_cublas": 0.9})
    batched_square = bench.Row(**{**square.__dict__, "batch": 8, "baseline": "torch.bmm", "vs_cublas": 0.5})
    assert bench.summarize([square, bmm, batched_square], ["bf16"]) == {
        "bf16 square 4096/8192 geomean ours/cuBLAS": 0.9,
        "bf16 batched geomean ours/torch.bmm": round((0.667 * 0.5) ** 0.5, 4)}


def test_bench_grouped_shapes_and_group_sizes():
    """benchmarks/bench_grouped.py: issue 21's MoE shapes by default; --ragged group sizes keep the total, are seeded
    (the same sizes on every run, others for another seed) and uneven; equal sizes otherwise; ExTxNxK parsing."""
    import bench_grouped as g

    assert g.SHAPES == [(8, 2048, 14336, 4096), (8, 2048, 4096, 14336), (64, 256, 2048, 7168), (128, 64, 768, 2048)]
    assert set(g.ANCHOR_GROUPED_MM) == set(g.SHAPES)
    assert g.parse_grouped_shapes("8x2048x14336x4096,128X64X768X2048") == [(8, 2048, 14336, 4096), (128, 64, 768, 2048)]
    with pytest.raises(ValueError, match="ExTxNxK"):
        g.parse_grouped_shapes("2048x14336x4096")
    for experts, tokens, _, _ in g.SHAPES + [(3, 1, 8, 8), (17, 5, 8, 8)]:
        assert g.group_sizes(experts, tokens) == [tokens] * experts
        sizes = g.group_sizes(experts, tokens, ragged=True, seed=0)
        assert len(sizes) == experts and sum(sizes) == experts * tokens and min(sizes) >= 0, sizes
        assert sizes == g.group_sizes(experts, tokens, ragged=True, seed=0)
        if experts * tokens >= 64:
            assert len(set(sizes)) > 1, sizes
            assert sizes != g.group_sizes(experts, tokens, ragged=True, seed=1)
    assert g.ends([0, 3, 0, 5]) == [0, 3, 3, 8]


def test_bench_grouped_table_lines_up():
    """The grouped benchmark's header and rows have the same width, with and without the _grouped_mm column."""
    import bench_grouped as g

    row = g.Row(8, 2048, 14336, 4096, 16384, "bf16", "k", "grouped", 2.8, 2.8, 3.0, 690.1, 690.2, 640.5, 1.0, 1.07,
                2e-3, 2e-3, 2e-3, 693.6)
    refused = g.Row(**{**row.__dict__, "grouped_mm_ms": None, "grouped_mm_tflops": None, "vs_grouped_mm": None,
                       "anchor_grouped_mm_tflops": None})
    width = len(g.header().split("  kernel")[0])
    for r in (row, refused):
        assert len(g.format_row(r).split("  k (grouped)")[0]) == width, g.format_row(r)
    assert "WRONG" in g.format_row(g.Row(**{**row.__dict__, "rel_error": 0.5}))
    assert "WRONG" not in g.format_row(row)
    assert g.summarize([row, refused]) == {"geomean ours/torch._grouped_mm": 1.0, "geomean ours/loop": 1.07}


def test_bench_moe_routing():
    """benchmarks/bench_moe.py's router: every token picks top-k distinct experts (each group at most the token count,
    the groups summing to tokens x top-k), seeded (the same sizes again, others for another seed), skewed as named
    (Dirichlet and Zipf's largest group above uniform's), only the local experts under expert parallelism; and without
    a GPU the script says so, exits 2 and prints the sizes."""
    import bench_moe as m

    for name, layer in m.MODELS.items():
        for routing in m.ROUTINGS:
            sizes = m.route(layer, 512, routing, seed=0)
            assert len(sizes) == layer.groups and min(sizes) >= 0 and max(sizes) <= 512, (name, routing)
            if layer.local_experts is None:
                assert sum(sizes) == 512 * layer.top_k, (name, routing)
            assert sizes == m.route(layer, 512, routing, seed=0)
            assert sizes != m.route(layer, 512, routing, seed=1), (name, routing)
    layer = m.MODELS["qwen1.5-moe-a2.7b"]
    largest = {r: max(m.route(layer, 4096, r)) for r in m.ROUTINGS}
    assert largest["dirichlet"] > 2 * largest["uniform"] and largest["zipf"] > 2 * largest["uniform"], largest
    assert m.MODELS["mixtral-8x7b"].gemms() == {"up": (28672, 4096), "down": (4096, 14336)}
    with pytest.raises(ValueError, match="routing 'hot'"):
        m.popularity("hot", 8, __import__("torch").Generator())
    if not __import__("torch").cuda.is_available():
        assert m.main(["--models", "mixtral-8x7b", "--tokens", "64", "--routings", "zipf"]) == 2
    with pytest.raises(SystemExit):
        m.main(["--routings", "hot"])


def test_bench_moe_leaves_out_calls_with_no_rows(capsys):
    """A call whose tokens all went to other GPUs' experts (DeepSeek-V3's 32 local experts, one token) has nothing to
    time: said and left out of the rows, not timed into the summary (an empty result's error is 0, not NaN)."""
    import torch

    import bench_moe as m
    from bench_grouped import rel_error

    layer = m.MODELS["deepseek-v3-ep8"]
    assert sum(m.route(layer, 1, "zipf", seed=0)) == 0 and sum(m.route(layer, 1, "uniform", seed=0)) == 1
    if not torch.cuda.is_available():
        assert m.main(["--models", "deepseek-v3-ep8", "--tokens", "1", "--routings", "uniform,zipf"]) == 2
        err = capsys.readouterr().err
        assert "up 1 tokens zipf: no rows routed to these experts, nothing to time" in err
        assert "up 1 tokens zipf: [" not in err and "up 1 tokens uniform: [" in err
    assert rel_error(torch.empty(0, 5), torch.empty(0, 5)) == 0.0
    assert rel_error(torch.empty(1, 5), torch.empty(0, 5)) == float("inf")


def test_bench_moe_candidates_beside_the_pick(monkeypatch):
    """bench_moe.py --candidates: each shape's candidates are the same hints with the tile, cluster and schedule fixed,
    the pick itself and those the planner refuses left out (a 2x1 cluster over one tile row per group), and stream-K
    refused (grouped calls take none); --variants: the pick with its fields changed."""
    import functools

    import bench_moe as m
    from bench import parse_candidates, parse_variants
    from generator import Gemm

    monkeypatch.setattr(m, "Gemm", functools.partial(Gemm, arch=90))
    monkeypatch.setattr(m, "compile_many", lambda configs, namespace: [c.name for c in configs])
    layer = m.MODELS["olmoe-1b-7b"]
    cases = [("olmoe-1b-7b", "up", 512, "uniform", m.route(layer, 512, "uniform"), *layer.gemms()["up"])]
    ops, others = m.planned(cases, "bf16", parse_candidates("64x128x64:1x1:pp,128x128x64:2x1:coop,64x256x64:1x2:pp"))
    (shape, pick), = ops.items()
    names = list(others[shape])
    assert pick not in names and len(names) == 1 + (not pick.startswith("sm90_bf16_tn_64x256x64_c1x2_"))
    assert names[0].startswith("sm90_bf16_tn_64x128x64_c1x1_")
    with pytest.raises(SystemExit, match="stream-K"):
        m.planned(cases, "bf16", parse_candidates("64x128x64:1x1:pp:sk"))
    _, varied = m.planned(cases, "bf16", variants=parse_variants("raster_group=1"))
    (name,), = [list(v) for v in varied.values()]
    assert name == pick.replace("_g8m", "_g1m") and pick.endswith("_g8m")    # a ragged pick bands 8 tile rows


def test_bench_moe_flags_variant_builds_under_the_flags(monkeypatch):
    """bench_moe.py --flags-variant: each pick built again, once per kernel, with the flags (shell words) given to
    compile_many's extra_flags, in a namespace of its own; GEMMGEN_EXTRA_NVCC_FLAGS is left as it was."""
    import types

    import bench_moe as m
    from generator.runtime.loader import EXTRA_FLAGS_ENV

    seen = []

    def compile_many(configs, namespace, extra_flags=()):
        seen.append((list(configs), namespace, extra_flags, m.os.environ.get(EXTRA_FLAGS_ENV)))
        return [f"{c}@{namespace}" for c in configs]

    monkeypatch.setattr(m, "compile_many", compile_many)
    ops = {(8, 1024, 4096, 14336): types.SimpleNamespace(config="k1"), (8, 512, 4096, 14336):
           types.SimpleNamespace(config="k1"), (32, 16, 7168, 2048): types.SimpleNamespace(config="k2")}
    monkeypatch.setenv(EXTRA_FLAGS_ENV, "-DA=1")
    built = m.built_with_flags(ops, "-DB=1 -DC=2")
    assert seen == [(["k1", "k2"], "gemmgen_flags", ("-DB=1", "-DC=2"), "-DA=1")]
    assert built == {s: f"{op.config}@gemmgen_flags" for s, op in ops.items()}


def test_extra_flags_follow_the_environment_s_in_a_build_request(monkeypatch):
    """build_request's extra_flags (compile_many's): after GEMMGEN_EXTRA_NVCC_FLAGS's, so both reach nvcc and the
    cache key; none by default."""
    from generator import Gemm
    from generator.runtime.loader import EXTRA_FLAGS_ENV, build_request

    cfg = Gemm("bf16", "tn", arch=90).config
    monkeypatch.setenv(EXTRA_FLAGS_ENV, "-DA=1")
    assert build_request(cfg).extra_flags == ("-DA=1",)
    assert build_request(cfg, extra_flags=("-DB=1",)).extra_flags == ("-DA=1", "-DB=1")
    monkeypatch.delenv(EXTRA_FLAGS_ENV)
    assert build_request(cfg, extra_flags=["-DB=1"]).extra_flags == ("-DB=1",)


def test_bench_moe_split_by_rows(monkeypatch):
    """bench_moe.py --split-at: a call's groups of more than R rows through one op and the rest through another, each
    given its groups' rows and K-major weights in order (empty groups with the small ones), the whole D put back
    together for the check and nothing gathered again on the timed calls; no split where one part has no rows; a part
    of one group plans without ragged=True (which needs two groups)."""
    import functools
    import itertools

    import torch

    import bench_moe as m
    from generator import Gemm

    calls = []

    class Reference:   # op.grouped's contract on the CPU
        def grouped(self, x, w, ends):
            calls.append((x.shape[0], w.shape[0], w.stride(1)))
            out, start = torch.empty(x.shape[0], w.shape[2]), 0
            for g, end in enumerate(ends.tolist()):
                out[start:end] = x[start:end] @ w[g]
                start = end
            return out

    sizes = [0, 5, 300, 2, 0, 150, 64, 65]
    ends = torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32)
    a, b = torch.randn(sum(sizes), 32), torch.randn(len(sizes), 48, 32).transpose(1, 2)
    split = m.SplitByRows(Reference(), Reference(), 64)
    assert torch.allclose(split.grouped(a, b, ends), Reference().grouped(a, b, ends), atol=1e-5)
    assert calls[:2] == [(515, 3, 1), (71, 5, 1)]              # 300, 150, 65 rows; then 0, 5, 2, 0, 64 (K-major)
    calls.clear()
    assert split.grouped(a, b, ends) is None and calls == [(515, 3, 1), (71, 5, 1)]
    assert m.split_sizes(sizes, 64) == ([300, 150, 65], [0, 5, 2, 0, 64])
    assert m.split_sizes([1, 2], 64) is None and m.split_sizes([0, 0, 300], 64) is None
    monkeypatch.setattr(m, "Gemm", functools.partial(Gemm, arch=90))
    monkeypatch.setattr(m, "compile_many", lambda configs, namespace: [c.name for c in configs])
    ops, _ = m.planned([("x", "up", 512, "zipf", [300], 1024, 2048)], "bf16")
    assert list(ops) == [(1, 300, 1024, 2048)]


def test_bench_moe_summary_per_token_count():
    """bench_moe.py's summary: geomean, p10 and lowest of both ratios over every row, and per token count where the run
    has several (the note's tables quote them so)."""
    import bench_moe as m
    from bench_grouped import Row

    def row(tokens: int, vs_gmm: float, vs_loop: float):
        r = Row(experts=1, tokens_per_expert=1, n=1, k=1, total_m=1, dtype="bf16", kernel="op", path="path",
                ours_ms=1.0, grouped_mm_ms=vs_gmm, loop_ms=vs_loop, ours_tflops=0.0, grouped_mm_tflops=0.0,
                loop_tflops=0.0, vs_grouped_mm=vs_gmm, vs_loop=vs_loop, rel_error=0.0, grouped_mm_rel_error=0.0,
                loop_rel_error=0.0, anchor_grouped_mm_tflops=None)
        return m.MoeRow("x", "up", tokens, "zipf", 0, 1, 0, r)

    rows = [row(1, 2.0, 0.5), row(1, 0.5, 4.0), row(512, 1.0, 1.0)]
    s = m.summarize(rows)
    assert s["geomean ours/torch._grouped_mm"] == 1.0 and s["min ours/torch._grouped_mm"] == 0.5
    assert s["p10 ours/best of (_grouped_mm, loop)"] == 0.5
    assert s["1 tokens: min ours/best of (_grouped_mm, loop)"] == 0.5
    assert s["512 tokens: geomean ours/torch._grouped_mm"] == 1.0 and "1 tokens: p10 ours/torch._grouped_mm" in s
    assert not any(k.startswith("512 tokens") for k in m.summarize(rows[2:]))
    assert m.p10([float(v) for v in range(20)]) == 2.0 and m.p10([3.0, 1.0]) == 1.0


def test_bench_dtypes_builds_each_switched_variant_with_its_flags(monkeypatch):
    """bench_dtypes.build_ops: the plain rows (planner's and knob variants') in one build without flags, a variant's
    template switches (define:...) passed to its own build, and the ops back in the rows' order."""
    import bench_dtypes
    builds = []

    def fake_compile_many(configs, *, namespace, extra_flags=()):
        builds.append((len(configs), namespace, tuple(extra_flags)))
        return [(namespace, tuple(extra_flags), c.name) for c in configs]

    monkeypatch.setattr(bench_dtypes, "compile_many", fake_compile_many)
    variants = dict([("", {}), bench_dtypes.parse_variant("t96=tile:128x96"),
                     bench_dtypes.parse_variant("late=define:GEMMGEN_A=0+GEMMGEN_B=1")])
    shape = (2048, 7168, 2048)
    work = [("fp8_tensor", name, shape, bench_dtypes.plan_for("fp8_tensor", *shape, knobs))
            for name, knobs in variants.items()]
    ops = bench_dtypes.build_ops(work, variants)
    assert builds == [(2, "gemmgen_bench_dtypes", ()),
                      (1, "gemmgen_bench_dtypes_late", ("-DGEMMGEN_A=0", "-DGEMMGEN_B=1"))]
    assert [op[2] for op in ops] == [plan.config.name for *_, plan in work]
    assert [op[1] for op in ops] == [(), (), ("-DGEMMGEN_A=0", "-DGEMMGEN_B=1")]


def test_bench_dtypes_interleave_k_variants(monkeypatch):
    """bench_dtypes: interleave_k:1 is Gemm's interleave_k=True (the 64-row cooperative tile with K interleaved);
    interleave_k:0 is the planner's pick without its interleaved-K rule (the rule's A/B), the rule left in place."""
    import bench_dtypes
    monkeypatch.setattr(bench_dtypes, "compile_many", lambda configs, **_: [c.name for c in configs])
    shape = (128, 4096, 4096)
    variants = dict([("", {}), bench_dtypes.parse_variant("old=interleave_k:0"),
                     bench_dtypes.parse_variant("ik96=tile:64x96,interleave_k:1")])
    work = [("fp8_block", name, shape, bench_dtypes.plan_for("fp8_block", *shape, knobs))
            for name, knobs in variants.items()]
    planned, old, ik96 = bench_dtypes.build_ops(work, variants)
    assert "_64x64x128_" in planned and "_coop_ik_" in planned
    assert "_128x64x128_" in old and "_ik_" not in old
    assert "_64x96x128_" in ik96 and "_coop_ik_" in ik96
    assert bench_dtypes.plan_for("fp8_block", *shape, {}).config.interleave_k   # the rule is back after the A/B
