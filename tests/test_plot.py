"""python -m generator plot: benchmark JSON read (no matplotlib needed) and drawn (skipped without matplotlib)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from generator import cli
from generator.plot import INSTALL_HINT, PlotOptions, load_results, parse_results, plot

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
