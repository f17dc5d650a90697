"""python -m generator plot: benchmark JSON read (no matplotlib needed) and drawn (skipped without matplotlib)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from generator import cli
from generator.plot import (INSTALL_HINT, Corpus, PlotOptions, check_kind, is_corpus, layer_geomeans, load_results,
                            parse_corpus, parse_results, pass_spread, plot)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
LLM_H200 = RESULTS / "h200_bench_llm_rules.json"         # bench.py --set llm: ours, cuBLAS, Triton
INDUCTOR_H100 = RESULTS / "h100_inductor_max_autotune.json"  # inductor_compare.py: ours, cuBLAS, Inductor
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def matplotlib():
    return pytest.importorskip("matplotlib", reason=f"drawing needs matplotlib ({INSTALL_HINT})")


def assert_png(path: Path, min_bytes: int = 20_000) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert len(data) > min_bytes, f"{path} is only {len(data)} bytes: an empty figure?"


def corpus_row(model: str, layer: str, pass_: str, tokens: int, dtype: str, ratio: float | None, **more) -> dict:
    return {"model": model, "layer": layer, "pass": pass_, "tokens": tokens, "m": tokens, "n": 4096, "k": 4096,
            "dtype": dtype, "vs_cublas": ratio, "kernel": "sm90_bf16_tn_x", **more}


#: A bench_corpus.py file in small: no dX rows, a ratio only as times, and two rows that cannot be drawn.
CORPUS = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "benchmark": "corpus", "summary": {}, "rows": [
    corpus_row("llama3-8b", "mlp_up", "fwd", 256, "bf16", 0.8),
    corpus_row("qwen2-7b", "mlp_up", "fwd", 256, "bf16", 1.25),
    corpus_row("llama3-8b", "mlp_up", "fwd", 1024, "bf16", 1.1),
    corpus_row("llama3-8b", "q", "fwd", 256, "bf16", 0.9),
    corpus_row("llama3-8b", "mlp_up", "dW", 256, "bf16", 0.96),
    corpus_row("llama3-8b", "mlp_up", "dW", 256, "fp16", None, ours_ms=0.05, cublas_ms=0.03),   # 0.6 from the times
    corpus_row("llama3-8b", "mlp_up", "bwd", 256, "bf16", 1.0),                                 # not a pass
    corpus_row("llama3-8b", "q", "fwd", 0, "bf16", 1.0),                                        # no tokens
]}


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps(CORPUS))
    return path


# -- reading ----------------------------------------------------------------------------------------

def test_reads_the_h200_llm_set():
    results = load_results(LLM_H200)
    assert results.device == "NVIDIA H200" and results.skipped == 0
    assert len(results.points) == 36 and results.dtypes == ("bf16",)
    assert results.series == ("ours", "cuBLAS", "Triton")
    first = results.points[0]
    assert first.label() == "16x4096x4096"
    row = json.loads(LLM_H200.read_text())["rows"][0]
    assert first.ratio("cuBLAS") == pytest.approx(row["vs_cublas"], rel=1e-9)
    # 2*16*4096*4096 flops over bf16 A (16x4096), B (4096x4096) and D (16x4096)
    assert first.intensity == pytest.approx(2 * 16 * 4096 * 4096 / (2 * (16 * 4096 * 2 + 4096 * 4096)))


def test_reads_the_inductor_compare_format():
    results = load_results(INDUCTOR_H100)
    assert results.series == ("ours", "cuBLAS", "Inductor") and results.dtypes == ("bf16", "fp16")
    assert [p.label(with_dtype=True) for p in results.points] == [
        "4096x4096x4096 bf16", "8192x8192x8192 bf16", "4096x4096x4096 fp16", "8192x8192x8192 fp16"]
    assert results.points[1].ratio("Inductor") == pytest.approx(660.2 / 686.5)
    assert results.points[0].intensity == pytest.approx(4096 / 3)   # square: 2n^3 / (3 n^2 * 2 bytes)


def test_rows_with_missing_columns_are_tolerated():
    data = {"device": "NVIDIA H100 80GB HBM3", "rows": [
        {"m": 128, "n": 256, "k": 512, "dtype": "fp16", "ours_tflops": 10.0, "cublas_tflops": 20.0,
         "triton_tflops": None},
        {"m": 64, "n": 64, "k": 64, "dtype": "bf16", "ours_tflops": 1.0, "cublas_tflops": 2.0, "batch": 32},
        {"experts": 8, "n": 14336, "k": 4096, "dtype": "bf16", "ours_tflops": 700.0},   # grouped: no m
        {"m": 64, "n": 64, "k": 64, "dtype": "fp4", "ours_tflops": 1.0},                 # a dtype not known
        {"m": 64, "n": 64, "k": 64, "dtype": "bf16", "cublas_tflops": 1.0},              # ours not measured
        "not a row",
    ]}
    results = parse_results(data, "made-up.json")
    assert len(results.points) == 2 and results.skipped == 4
    assert results.series == ("ours", "cuBLAS")   # Triton was null in the one row that has the column
    plain, batched = results.points
    assert plain.ratio("Triton") is None and plain.ratio("cuBLAS") == 0.5
    assert batched.label() == "32x[64x64x64]" and batched.flops == 32 * 2 * 64 ** 3
    assert batched.intensity == pytest.approx(2 * 64 ** 3 / (3 * 64 * 64 * 2))   # the batch cancels


def test_not_a_results_file_says_why(tmp_path):
    with pytest.raises(ValueError, match="\"rows\" list"):
        parse_results([1, 2], "list.json")
    with pytest.raises(ValueError, match="none of its 1 rows"):
        parse_results({"rows": [{"m": 1}]}, "empty.json")
    with pytest.raises(ValueError, match="is not JSON"):
        load_results(ROOT / "README.md")
    with pytest.raises(ValueError, match="cannot read"):
        load_results(tmp_path / "missing.json")
    with pytest.raises(ValueError, match=r"no fp16 rows \(its dtypes: bf16\)"):
        load_results(LLM_H200).only(["fp16"])


def test_a_corpus_file_is_read_as_one(corpus_file):
    assert not is_corpus(json.loads(LLM_H200.read_text())) and is_corpus(CORPUS)
    corpus = load_results(corpus_file)
    assert isinstance(corpus, Corpus) and corpus.device == "NVIDIA H100 80GB HBM3" and corpus.torch == "2.11.0+cu130"
    assert len(corpus.rows) == 6 and corpus.skipped == 2
    assert corpus.passes == ("fwd", "dW") and corpus.layers == ("mlp_up", "q") and corpus.dtypes == ("bf16", "fp16")
    assert corpus.rows[5].ratio == pytest.approx(0.6)   # cuBLAS's time over ours where vs_cublas is null
    assert len(corpus.only(["bf16"]).rows) == 5
    with pytest.raises(ValueError, match=r"no fp8 rows \(its dtypes: bf16, fp16\)"):
        corpus.only(["fp8"])
    with pytest.raises(ValueError, match="none of its 1 corpus rows"):
        parse_corpus({"benchmark": "corpus", "rows": [corpus_row("m", "q", "fwd", 16, "bf16", None)]}, "c.json")
    with pytest.raises(ValueError, match="without a \"rows\" list"):
        parse_corpus({"benchmark": "corpus"}, "c.json")


def test_corpus_geomeans_per_pass_layer_and_tokens(corpus_file):
    corpus = load_results(corpus_file)
    assert layer_geomeans(corpus) == pytest.approx({
        ("fwd", "mlp_up", 256): 1.0,                  # over the models: sqrt(0.8 * 1.25)
        ("fwd", "mlp_up", 1024): 1.1,
        ("fwd", "q", 256): 0.9,
        ("dW", "mlp_up", 256): (0.96 * 0.6) ** 0.5,   # over the dtypes
    })
    assert layer_geomeans(corpus.only(["bf16"]))[("dW", "mlp_up", 256)] == pytest.approx(0.96)
    spread = pass_spread(corpus)   # (pass, tokens) -> (geomean, min) of every row
    assert spread.keys() == {("fwd", 256), ("fwd", 1024), ("dW", 256)}
    assert spread[("fwd", 256)] == pytest.approx(((0.8 * 1.25 * 0.9) ** (1 / 3), 0.8))
    assert spread[("dW", 256)] == pytest.approx(((0.96 * 0.6) ** 0.5, 0.6))


def test_each_file_refuses_the_other_files_kinds(corpus_file):
    corpus, shapes = load_results(corpus_file), load_results(LLM_H200)
    for kind in ("both", "bands"):
        check_kind(corpus, kind)
    for kind in ("bars", "roofline"):
        with pytest.raises(ValueError, match=f"is a corpus file .*--kind {kind} draws per-shape files"):
            check_kind(corpus, kind)
    with pytest.raises(ValueError, match="--kind bands draws a corpus file"):
        check_kind(shapes, "bands")


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch):
    # None in sys.modules makes the import fail, whether matplotlib is installed or not
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(RuntimeError, match=re.escape(INSTALL_HINT)):
        plot(load_results(LLM_H200), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# -- drawing ----------------------------------------------------------------------------------------

def test_draws_bars_and_roofline_of_the_llm_set(matplotlib, tmp_path):
    drawn = plot(load_results(LLM_H200), tmp_path / "llm.png")
    assert_png(tmp_path / "llm.png")
    assert len(drawn.shapes) == 36 and drawn.shapes[0] == "16x4096x4096" and drawn.shapes[-1] == "16384x8192x28672"
    assert drawn.series == ("ours", "cuBLAS", "Triton")
    assert {name: len(points) for name, points in drawn.roofline.items()} == {"ours": 36, "cuBLAS": 36}
    assert drawn.ceilings is not None and drawn.ceilings.device == "H200"
    # every point under the roof: a measured rate above bandwidth x intensity or the peak is a wrong formula
    for intensity, tflops in drawn.roofline["ours"]:
        assert tflops < min(drawn.ceilings.hbm_tbps * intensity, drawn.ceilings.peak_tflops["bf16"])


def test_draws_the_inductor_comparison_one_kind_at_a_time(matplotlib, tmp_path):
    results = load_results(INDUCTOR_H100)
    bars = plot(results, tmp_path / "bars.png", PlotOptions(kind="bars", title="ours vs Inductor"))
    assert_png(tmp_path / "bars.png")
    assert bars.series == ("ours", "cuBLAS", "Inductor") and bars.roofline == {} and bars.ceilings is None
    assert bars.shapes[2] == "4096x4096x4096 fp16"
    roof = plot(results, tmp_path / "roof.svg", PlotOptions(kind="roofline"))
    assert (tmp_path / "roof.svg").read_text().lstrip().startswith("<?xml")
    assert roof.shapes == () and len(roof.roofline["ours"]) == 4
    assert roof.ceilings is not None and roof.ceilings.hbm_tbps == pytest.approx(3.0037)   # the measured copy


def test_draws_a_corpus_as_bands(matplotlib, corpus_file, tmp_path):
    corpus = load_results(corpus_file)
    drawn = plot(corpus, tmp_path / "corpus.png")   # the default kind, both, is the bands for a corpus
    assert_png(tmp_path / "corpus.png", min_bytes=10_000)
    assert drawn.passes == ("fwd", "dW") and drawn.layers == ("mlp_up", "q")
    (t0, g0), (t1, g1) = drawn.lines[("fwd", "mlp_up")]
    assert (t0, t1) == (256, 1024) and (g0, g1) == pytest.approx((1.0, 1.1))
    assert ("dW", "q") not in drawn.lines   # no rows there: no line
    [(tokens, geomean, low)] = drawn.overall["dW"]
    assert tokens == 256 and (geomean, low) == pytest.approx(((0.96 * 0.6) ** 0.5, 0.6))
    bf16 = plot(corpus.only(["bf16"]), tmp_path / "bf16.svg", PlotOptions(kind="bands", title="bf16"))
    assert (tmp_path / "bf16.svg").read_text().lstrip().startswith("<?xml")
    assert bf16.overall["dW"][0][1:] == pytest.approx((0.96, 0.96))


def test_cli_draws_a_corpus(matplotlib, corpus_file, tmp_path):
    r = subprocess.run([sys.executable, "-m", "generator", "plot", str(corpus_file), "--kind", "bands",
                        "--dtype", "bf16"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("corpus_bands.png: 5 corpus row(s) (fwd, dW) of NVIDIA H100 80GB HBM3, bands")
    assert "2 row(s) without a pass of fwd, dX, dW" in r.stdout
    assert_png(tmp_path / "corpus_bands.png", min_bytes=10_000)


def test_cli_draws_a_plot(matplotlib, tmp_path):
    out = tmp_path / "cli.png"
    r = subprocess.run([sys.executable, "-m", "generator", "plot", str(LLM_H200), "--out", str(out),
                        "--kind", "bars", "--title", "H200"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"{out}: 36 shape(s) of NVIDIA H200, bars" in r.stdout
    assert_png(out)


@pytest.mark.parametrize("args, message", [
    (["missing.json"], "cannot read"),
    ([str(ROOT / "README.md")], "is not JSON"),
    ([str(RESULTS / "h200_bench_grouped.json")], "nothing to plot"),
    ([str(LLM_H200), "--dtype", "fp16"], "no fp16 rows"),
])
def test_cli_bad_input_exits_2(args, message, tmp_path, capsys):
    assert cli.main(["plot", *args, "--out", str(tmp_path / "x.png")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("kind", ["bars", "roofline"])
def test_cli_refuses_bars_or_roofline_of_a_corpus(kind, corpus_file, tmp_path, capsys):
    assert cli.main(["plot", str(corpus_file), "--kind", kind, "--out", str(tmp_path / "x.png")]) == 2
    assert "is a corpus file" in capsys.readouterr().err and not (tmp_path / "x.png").exists()


def test_cli_refuses_bands_of_a_per_shape_file(tmp_path, capsys):
    assert cli.main(["plot", str(LLM_H200), "--kind", "bands", "--out", str(tmp_path / "x.png")]) == 2
    assert "--kind bands draws a corpus file" in capsys.readouterr().err and not (tmp_path / "x.png").exists()


def test_cli_bad_kind_exits_2_listing_the_choices(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["plot", str(LLM_H200), "--kind", "pie"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'pie'" in err and all(kind in err for kind in ("both", "bars", "roofline"))


def test_the_docs_images_exist():
    """README.md and docs/benchmarking.md embed committed plots; each must be in the tree and small."""
    for page in (ROOT / "README.md", ROOT / "docs" / "benchmarking.md"):
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", page.read_text()):
            path = (page.parent / image).resolve()
            assert path.is_file(), f"{page.name} embeds {image}, which is missing"
            assert path.stat().st_size <= 150_000, f"{image} is over 150 KB"
