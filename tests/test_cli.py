"""The command line: python -m generator plan|render|bench, run as a user runs it (a subprocess)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "generator", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_plan_prints_the_config_with_its_name():
    r = cli("plan", "--dtype", "bf16", "--layout", "tn", "--arch", "80")
    assert r.returncode == 0, r.stderr
    assert "name:         sm80_bf16_tn_" in r.stdout
    assert "stages:" in r.stdout and "why:" in r.stdout


def test_plan_honours_every_knob():
    r = cli("plan", "--dtype", "fp16", "--out-dtype", "fp32", "--layout", "nt", "--layout-c", "col", "--arch", "90",
            "--m", "512", "--n", "512", "--k", "1024", "--tile", "128x128x32", "--warps", "2x2", "--stages", "3",
            "--raster-group", "4")
    assert r.returncode == 0, r.stderr
    assert "name:         sm80_fp16_nt_dcol_128x128x32_w2x2_s3_g4_ofp32\n" in r.stdout
    assert "arch:         sm_90" in r.stdout


def test_per_operand_layouts_override_the_letters():
    r = cli("plan", "--arch", "80", "--layout", "tn", "--layout-a", "col", "--layout-b", "row")
    assert r.returncode == 0, r.stderr
    assert "layout:       nt (A col-major, B row-major, D row-major)" in r.stdout


def test_plan_verbose_lists_rejected_candidates():
    r = cli("plan", "--arch", "86", "--verbose")
    assert r.returncode == 0, r.stderr
    assert "rejected:" in r.stdout


def test_render_writes_the_sources_and_prints_their_paths(tmp_path):
    out = tmp_path / "kernels"
    r = cli("render", "--dtype", "bf16", "--layout", "tn", "--arch", "80", "--stages", "3", "--out", str(out))
    assert r.returncode == 0, r.stderr
    paths = [Path(line) for line in r.stdout.splitlines() if line.strip()]
    assert paths and all(p.parent == out and p.is_file() for p in paths)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in paths)
    text = paths[0].read_text()
    assert paths[0].name == "sm80_bf16_tn_128x256x32_w2x4_s3_g8.cu"
    assert "sm80_bf16_tn_128x256x32_w2x4_s3_g8" in text.splitlines()[0]


def test_render_matches_the_python_api(tmp_path):
    from generator import Gemm

    r = cli("render", "--dtype", "fp16", "--layout", "tt", "--arch", "80", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    expected = Gemm("fp16", "tt", arch=80).render()
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == expected


def test_render_needs_out():
    r = cli("render", "--arch", "80")
    assert r.returncode == 2
    assert "--out" in r.stderr


@pytest.mark.parametrize("option, value, choices", [
    ("--layout", "xx", "'nn', 'nt', 'tn', 'tt'"),
    ("--dtype", "fp8", "'fp16', 'bf16'"),
    ("--out-dtype", "int8", "'fp16', 'bf16', 'fp32'"),
    ("--layout-b", "diag", "'row', 'col'"),
    ("--arch", "70", "80, 86, 89, 90"),
])
def test_a_bad_choice_exits_2_listing_the_choices(option, value, choices):
    r = cli("plan", "--arch", "80", option, value)
    assert r.returncode == 2
    assert "invalid choice" in r.stderr and choices in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("args, message", [
    (("--tile", "128x128"), "3 positive integers joined by 'x'"),
    (("--warps", "2by2"), "2 positive integers joined by 'x'"),
    (("--m", "0"), "not a positive integer"),
    (("--stages", "four"), "invalid int value"),
])
def test_a_malformed_value_exits_2(args, message):
    r = cli("plan", "--arch", "80", *args)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args, message", [
    (("--stages", "9"), "stages=9: the multistage pipeline takes 2 to 8 stages"),
    (("--tile", "128x256x64", "--stages", "6"), "needs 294912 bytes of shared memory; sm80 allows 166912"),
    (("--tile", "96x128x32"), "tile 96x128x32 is not one the sm80 template builds"),
    (("--warps", "1x1"), "warps 1x1 cannot split tile"),
    (("--raster-group", "3"), "raster_group=3"),
])
def test_an_override_the_planner_refuses_exits_2_with_its_reason(args, message, tmp_path):
    r = cli("plan", "--arch", "80", *args)
    assert r.returncode == 2
    assert r.stderr.startswith("error: "), r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    r = cli("render", "--arch", "80", "--out", str(tmp_path / "out"), *args)
    assert r.returncode == 2 and message in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [(), ("plan",), ("render",), ("bench",)])
def test_help(args):
    r = cli(*args, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:")
    if args != ("bench",) or (ROOT / "benchmarks" / "bench.py").exists():
        assert "python -m generator" in r.stdout


def test_help_shows_examples():
    for args in ((), ("plan",), ("render",)):
        r = cli(*args, "--help")
        assert "examples:" in r.stdout and "--arch 80" in r.stdout


def test_no_command_exits_2():
    r = cli()
    assert r.returncode == 2
    assert "plan" in r.stderr and "render" in r.stderr


def test_plan_and_render_do_not_import_torch(tmp_path):
    code = (
        "import sys\n"
        "from generator.cli import main\n"
        "assert main(['plan', '--arch', '80']) == 0\n"
        f"assert main(['render', '--arch', '90', '--out', {str(tmp_path)!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'the CLI imported torch'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_bench_without_a_checkout_says_so(tmp_path, monkeypatch):
    from generator import cli as cli_module

    monkeypatch.setattr(cli_module, "BENCH_SCRIPT", tmp_path / "missing" / "bench.py")
    assert cli_module.main(["bench", "--set", "square"]) == 2


def test_bench_forwards_its_arguments(tmp_path, monkeypatch, capsys):
    from generator import cli as cli_module

    script = tmp_path / "bench.py"
    script.write_text("import sys\n"
                      "def main(argv):\n"
                      "    print('ARGS', argv, sys.argv[0])\n"
                      "    return 3\n")
    monkeypatch.setattr(cli_module, "BENCH_SCRIPT", script)
    assert cli_module.main(["bench", "--set", "square", "--no-triton"]) == 3
    out = capsys.readouterr().out
    assert "ARGS ['--set', 'square', '--no-triton'] python -m generator bench" in out
