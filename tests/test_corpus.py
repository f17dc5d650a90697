"""benchmarks/corpus.py and bench_corpus.py's pure parts (no GPU): the passes' GEMM shapes, the row filters and their
refusals, the summary per pass and M band."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_corpus  # noqa: E402
import corpus  # noqa: E402


def test_the_passes_are_the_products_autograd_runs():
    # y = x @ W.t() with W (N, K) at M tokens: dX = dY @ W is M x K x N, dW = dY.t() @ X is N x K x M
    assert corpus.pass_shape("fwd", 256, 14336, 4096) == (256, 14336, 4096)
    assert corpus.pass_shape("dX", 256, 14336, 4096) == (256, 4096, 14336)
    assert corpus.pass_shape("dW", 256, 14336, 4096) == (14336, 4096, 256)
    with pytest.raises(ValueError, match="pass 'dY': one of fwd, dX, dW"):
        corpus.pass_shape("dY", 1, 2, 3)


def test_rows_filters_and_refusals():
    models = corpus.models()
    assert len(models) >= 10 and any(layer.kind.startswith("expert") for m in models for layer in m.layers)
    rows = corpus.rows(["llama3-8b"], tokens=[1, 4096], passes=["fwd"], layer_kinds=["lm_head"])
    assert [(r.m, r.n, r.k) for r in rows] == [(1, 128256, 4096), (4096, 128256, 4096)]
    assert all(r.flop <= 1e12 for r in corpus.rows(["llama3-8b"], max_gflop=1000))
    with pytest.raises(ValueError, match="unknown model\\(s\\) nope: choose from "):
        corpus.rows(["nope"])
    with pytest.raises(ValueError, match="pass 'bwd': one of fwd, dX, dW"):
        corpus.rows(passes=["bwd"])
    assert corpus.band_of(256) == "65-256" and corpus.band_of(20000) == ">16384"


def test_summary_per_pass_and_band_counts_each_gemm_once():
    t = [bench_corpus.Timing("fwd", m, 4096, 4096, "bf16", 1.0, r, r, "k", 1e-3) for m, r in
         [(1, 1.2), (256, 0.8), (256 + 1, 0.9), (4096, 1.0)]]
    t.append(bench_corpus.Timing("dW", 4096, 4096, 256, "bf16", 1.0, 0.9, 0.9, "k", 1e-3))
    tokens = {x.key: bench_corpus.tokens_of_timing(x.pass_, x.m, x.n, x.k) for x in t}
    s = bench_corpus.summarize(t, tokens)
    assert s["fwd"]["all"]["count"] == 4 and s["fwd"]["all"]["min"] == 0.8 and s["fwd"]["all"]["below_0.95"] == 2
    assert s["fwd"]["bands"]["65-256"]["count"] == 1 and s["fwd"]["bands"]["257-1024"]["geomean"] == 0.9
    assert s["dW"]["bands"] == {"65-256": s["dW"]["all"]}    # dW's band is its token count, its inner dimension
    assert bench_corpus.percentile([1.0, 2.0, 3.0], 0.5) == 2.0


def test_the_other_bucket_grid_column_is_summarised_and_kept_in_the_file() -> None:
    """--alt-buckets: the same call on the layer's op bucketed by another grid, beside ours: its ratio to cuBLAS is
    summarised as 'alt_plan' and its time and kernel survive the JSON round trip (result_rows, timings_of)."""
    t = [bench_corpus.Timing("fwd", 384, 4096, 4096, "bf16", 1.0, 0.9, 0.9, "new", 1e-3, alt_ms=1.2, alt_kernel="old"),
         bench_corpus.Timing("fwd", 768, 4096, 4096, "bf16", 1.0, 0.9, 0.9, "new", 1e-3)]
    s = bench_corpus.summarize(t, {x.key: x.m for x in t})
    assert s["fwd"]["alt_plan"]["count"] == 1 and s["fwd"]["alt_plan"]["geomean"] == 0.75
    rows = [corpus.CorpusRow("m", "q", "fwd", x.m, x.m, 4096, 4096, 4096, 4096) for x in t]
    again = bench_corpus.timings_of({"rows": bench_corpus.result_rows(rows, t)})
    assert [(x.alt_ms, x.alt_kernel) for x in again] == [(1.2, "old"), (None, None)]


def test_bench_epilogue_takes_the_corpus_mlp_up_layers() -> None:
    """bench_epilogue.py --corpus-up: the MLP-up layers (the ones a bias + activation follows), distinct, at the
    token counts given."""
    import bench_epilogue

    shapes = bench_epilogue.corpus_up_shapes([512, 2048])
    up = {(layer.n, layer.k) for model in corpus.models() for layer in model.layers
          if layer.kind in bench_epilogue.UP_KINDS}
    assert len(shapes) == len(set(shapes)) == 2 * len(up)
    assert {(n, k) for _, n, k in shapes} == up and {m for m, _, _ in shapes} == {512, 2048}


def test_cublas_kernel_names_read_in_our_terms() -> None:
    """gpu/cublas_kernels.py: cuBLAS's nvjet names put our N first (it computes D^T column-major), in tile and cluster;
    a split-K kernel says so; other kernels (the split-K reduction) parse to None."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu"))
    from cublas_kernels import parse_nvjet

    assert parse_nvjet("nvjet_sm90_tst_144x128_64x6_1x2_h_bz_TNN") == {
        "tile": [128, 144, 64], "stages": 6, "cluster": [2, 1], "split_k": False}
    assert parse_nvjet("nvjet_sm90_tst_64x32_64x16_1x2_h_bz_splitK_TNT")["split_k"]
    assert parse_nvjet("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>") is None


def test_forward_shapes_are_the_distinct_forward_gemms() -> None:
    """corpus.forward_shapes (what benchmarks/tune_corpus.py tunes): each distinct forward GEMM once, at the given row
    counts; an unknown model is refused."""
    import tune_corpus  # noqa: F401  (imports without a GPU)

    shapes = corpus.forward_shapes(["llama3-8b", "qwen2.5-7b"], [64, 256])
    assert len(shapes) == len(set(shapes)) and {m for m, _, _ in shapes} == {64, 256}
    assert (256, 4096, 4096) in shapes and (64, 14336, 4096) in shapes
    with pytest.raises(ValueError, match="unknown model"):
        corpus.forward_shapes(["no-such-model"], [64])


def test_pass_product_is_each_pass_as_autograd_runs_it() -> None:
    torch = pytest.importorskip("torch")
    X, W, dY = torch.randn(5, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64), \
        torch.randn(5, 4, dtype=torch.float64)
    assert torch.equal(corpus.pass_product("fwd", X, W, dY), X @ W.t())
    assert corpus.pass_product("dX", X, W, dY).shape == X.shape == (5, 3)
    assert corpus.pass_product("dW", X, W, dY).shape == W.shape == (4, 3)
    with pytest.raises(ValueError, match="pass 'bwd': one of fwd, dX, dW"):
        corpus.pass_product("bwd", X, W, dY)


def test_result_rows_keep_which_kernel_path_ran() -> None:
    """A decode row runs the op's small-M kernel, not the bucket's tiled kernel its `kernel` names: the row says so, and
    a written file reads back with it (files written before the field read 'fast')."""
    rows = corpus.rows(["llama3-8b"], [16], passes=["fwd"])[:1]
    timing = bench_corpus.Timing("fwd", 16, rows[0].n, rows[0].k, "bf16", 1.0, 1.1, 1.1, "k", 1e-3, path="small_m")
    written = bench_corpus.result_rows(rows, [timing])
    assert written[0]["path"] == "small_m"
    assert bench_corpus.timings_of({"rows": written})[0].path == "small_m"
    del written[0]["path"]
    assert bench_corpus.timings_of({"rows": written})[0].path == "fast"


def test_a_winner_that_loses_inside_its_band_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """tune_corpus.interior_check: a winner measured at a band's top is kept only where it is no slower than the
    pick at the rows inside the band (a 512-row winner can lose at 384 rows, where the waves differ)."""
    from types import SimpleNamespace

    import tune_corpus
    from generator.planner import Problem
    from generator.tune import measure as measure_module

    pick, winner = SimpleNamespace(name="pick"), SimpleNamespace(name="winner")
    result = SimpleNamespace(problem=Problem(512, 3072, 8192), pick=pick, winner=winner, ms=0.048, pick_ms=0.051)
    slow_at = {320: False, 384: True}

    def fake_measure(configs, problem, **_):
        assert [c.name for c in configs] == ["pick", "winner"] and (problem.n, problem.k) == (3072, 8192)
        winner_ms = 0.060 if slow_at[problem.m] else 0.040
        return [SimpleNamespace(ms=0.050), SimpleNamespace(ms=winner_ms)], [], None

    monkeypatch.setattr(measure_module, "measure", fake_measure)
    check = tune_corpus.interior_check(result, [0.625, 0.75], tolerance=0.01)
    assert not check["kept"] and set(check["interior"]) == {"320", "384"} and check["summary"].endswith("dropped")
    slow_at[384] = False
    assert tune_corpus.interior_check(result, [0.625, 0.75], tolerance=0.01)["kept"]


def test_bucket_grid_scores_a_grid_against_the_exact_plans() -> None:
    """bucket_grid.grid_loss: on a grid with a bound at every M scored, each call runs its exact plan (loss 1); on
    the old 2x grid 384 rows take the 512-row plan, which the model costs more than the plan for 384."""
    import bucket_grid

    layers, ms = [(14336, 4096)], [256, 384]
    exact = bucket_grid.grid_loss((256, 384), layers, ms)
    assert exact["geomean"] == exact["max"] == 1.0 and exact["kernels_max"] == 2
    old = bucket_grid.grid_loss(bucket_grid.OLD_GRID, layers, ms)
    assert old["max"] > 1.1


def test_tune_corpus_builds_every_candidate_in_one_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """tune_corpus.prebuild: the candidates tune() will time for each plan, built together once (none for a plan of
    at most 16 rows, whose pick is its only candidate)."""
    pytest.importorskip("torch")
    import tune_corpus
    from generator import Gemm
    from generator.tune import measure as measure_module

    runs = []
    monkeypatch.setattr(measure_module, "build_all", lambda configs, progress: (runs.append(configs) or configs, None))
    plans = [Gemm("bf16", "tn", arch=90, m=m, n=4096, k=4096) for m in (256, 512, 8)]
    tune_corpus.prebuild(plans, 4)
    from generator.gemm import _space
    from generator.tune import candidates

    expected = {c.name for p in plans[:2] for c in candidates(_space(p._request), p.problem, p.estimate.config, 4)}
    assert len(runs) == 1 and len({c.name for c in runs[0]}) == len(runs[0])
    assert {c.name for c in runs[0]} == expected and plans[0].estimate.config.name in expected
