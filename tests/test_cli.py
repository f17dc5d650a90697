"""The command line: python -m generator plan|render|emit|bench, as a user runs it: its exit status, stdout and
stderr (cli). The calls that import a user's module from their own folder run as a subprocess there; the rest run
``generator.cli.main`` in this process, as ``python -m generator`` would (60 interpreter starts and imports of
torch, 40 s on the CI's cores, saved). ``python -m generator`` itself is test_the_module_entry_point's."""
from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from generator.cli import main

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m generator *args``'s exit status and output; with ``cwd``, run there as a subprocess (a module
    named by --epilogue is imported from the current folder, and two tests' modules of one name must not meet in
    one process's sys.modules)."""
    if cwd is not None:
        return subprocess.run([sys.executable, "-m", "generator", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=120)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(args))
        except SystemExit as exit_:   # argparse's refusals (2), --help (0)
            status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except Exception:             # what the interpreter would print, and its status
            traceback.print_exc()
            status = 1
    return subprocess.CompletedProcess(["python", "-m", "generator", *args], status or 0, out.getvalue(),
                                       err.getvalue())


def test_the_module_entry_point():
    """``python -m generator`` runs main and exits with its status: 0 for a plan, 2 for a refused value."""
    r = cli("plan", "--dtype", "bf16", "--layout", "tn", "--arch", "80", cwd=ROOT)   # (cwd: a subprocess)
    assert r.returncode == 0 and "name:         sm80_bf16_tn_" in r.stdout, r.stderr
    r = cli("plan", "--dtype", "int4", cwd=ROOT)
    assert r.returncode == 2 and "invalid choice: 'int4'" in r.stderr and "Traceback" not in r.stderr


def test_plan_prints_the_config_with_its_name():
    r = cli("plan", "--dtype", "bf16", "--layout", "tn", "--arch", "80")
    assert r.returncode == 0, r.stderr
    assert "name:         sm80_bf16_tn_" in r.stdout
    assert "stages:" in r.stdout and "why:" in r.stdout


def test_plan_tf32_and_its_refusal():
    r = cli("plan", "--dtype", "tf32", "--layout", "tn", "--arch", "90")
    assert r.returncode == 0, r.stderr
    assert "name:         sm90_tf32_tn_128x256x32_" in r.stdout and "dtype:        tf32 -> fp32" in r.stdout
    r = cli("plan", "--dtype", "tf32", "--layout", "nn", "--arch", "90")   # sm90 reads A's tiles into registers
    assert r.returncode == 0, r.stderr
    assert "name:         sm90_tf32_nn_" in r.stdout and "registers:    A's M-major tiles" in r.stdout
    r = cli("plan", "--dtype", "tf32", "--out-dtype", "tf32", "--arch", "90")
    assert r.returncode == 2 and "--out-dtype: invalid choice: 'tf32'" in r.stderr and "Traceback" not in r.stderr
    r = cli("plan", "--dtype", "tf32", "--layout", "nt", "--arch", "80")   # the sm80 family: every layout
    assert r.returncode == 0, r.stderr
    assert "name:         sm80_tf32_nt_128x256x16_w2x4_s4_g8_ofp32\n" in r.stdout


def test_plan_honours_every_knob():
    r = cli("plan", "--dtype", "fp16", "--out-dtype", "fp32", "--layout", "nt", "--layout-c", "col", "--arch", "90",
            "--family", "sm80", "--m", "512", "--n", "512", "--k", "1024", "--tile", "128x128x32", "--warps", "2x2",
            "--stages", "3", "--raster-group", "4")
    assert r.returncode == 0, r.stderr
    assert "name:         sm80_fp16_nt_dcol_128x128x32_w2x2_s3_g4_ofp32\n" in r.stdout
    assert "arch:         sm_90" in r.stdout


def test_plan_honours_every_sm90_knob():
    r = cli("plan", "--dtype", "fp16", "--out-dtype", "fp32", "--layout", "nt", "--layout-c", "col", "--arch", "90",
            "--m", "512", "--n", "512", "--k", "1024", "--tile", "128x128x64", "--schedule", "pingpong",
            "--cluster", "1x2", "--raster", "n", "--stages", "3", "--raster-group", "4")
    assert r.returncode == 0, r.stderr
    assert "name:         sm90_fp16_nt_dcol_128x128x64_c1x2_s3_pp_g4n_ofp32\n" in r.stdout
    assert "schedule:     pingpong" in r.stdout and "cluster:      1x2" in r.stdout
    r = cli("plan", "--arch", "90", "--family", "sm90", "--schedule", "ws", "--cluster", "2x1")
    assert r.returncode == 0, r.stderr
    assert "_c2x1_" in r.stdout and "_ws_" in r.stdout


def test_plan_at_arch_90_is_the_sm90_family_by_default():
    r = cli("plan", "--dtype", "bf16", "--layout", "tn", "--arch", "90")
    assert r.returncode == 0, r.stderr
    from generator import Gemm

    assert r.stdout == str(Gemm("bf16", "tn", arch=90)) + "\n"
    assert "name:         sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m\n" in r.stdout


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
    ("--dtype", "fp8", "'fp16', 'bf16', 'tf32'"),
    ("--out-dtype", "int8", "'fp16', 'bf16', 'fp32'"),
    ("--layout-b", "diag", "'row', 'col'"),
    ("--arch", "70", "80, 86, 89, 90"),
    ("--family", "sm70", "'sm80', 'sm90'"),
    ("--schedule", "fast", "'ws', 'cooperative', 'pingpong'"),
    ("--raster", "x", "'m', 'n'"),
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
    (("--cluster", "2by1"), "2 positive integers joined by 'x', e.g. 2x1"),
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


@pytest.mark.parametrize("args, message", [
    (("--arch", "90", "--cluster", "3x2"), "error: cluster 3x2 is not one the sm90 template launches"),
    (("--arch", "90", "--tile", "128x256x64", "--stages", "5"),
     "needs 279552 bytes of shared memory (5 x 49152 operand tiles + 32768 epilogue + 1024 barriers and alignment); "
     "sm90 allows 232448: use stages<=4 or tile 128x128x64"),
    (("--arch", "90", "--tile", "128x128x32"), "the sm90 family needs BK=64"),
    (("--arch", "90", "--warps", "2x4"), "error: warps= is a knob of the sm80 family"),
    (("--arch", "80", "--schedule", "pingpong"),
     "error: schedule= is a knob of the sm90 family (Hopper, arch=90); this plan is sm80: plan with arch=90"),
    (("--arch", "80", "--cluster", "2x1"), "error: cluster_shape= is a knob of the sm90 family"),
    (("--arch", "80", "--family", "sm90"),
     "error: arch=80: the sm90 family uses wgmma and TMA, which exist only on sm_90a: plan with arch=90, or "
     "family='sm80'"),
    (("--arch", "90", "--m", "16", "--cluster", "2x1"),
     "error: cluster 2x1 is larger than the tile grid (1 tile along M for M=16): use cluster 1x1"),
])
def test_sm90_refusals_exit_2_with_their_reason(args, message, tmp_path):
    r = cli("plan", *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = cli("render", "--out", str(tmp_path / "out"), *args)
    assert r.returncode == 2 and message in r.stderr
    assert not (tmp_path / "out").exists()


def test_render_sm90(tmp_path):
    from generator import Gemm

    r = cli("render", "--arch", "90", "--schedule", "pingpong", "--cluster", "1x1", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    expected = Gemm("bf16", "tn", arch=90, schedule="pingpong", cluster_shape=(1, 1)).render()
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == expected
    assert next(iter(expected)).startswith("sm90_bf16_tn_") and "_c1x1_" in next(iter(expected))


@pytest.mark.parametrize("args", [(), ("plan",), ("render",), ("emit",), ("bench",)])
def test_help(args):
    r = cli(*args, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:")
    if args != ("bench",) or (ROOT / "benchmarks" / "bench.py").exists():
        assert "python -m generator" in r.stdout


def test_help_shows_examples():
    for args in ((), ("plan",), ("render",), ("emit",)):
        r = cli(*args, "--help")
        assert "examples:" in r.stdout and "--arch 80" in r.stdout
        assert "--arch 90" in r.stdout
    r = cli("plan", "--help")
    for option in ("--family {sm80,sm90}", "--schedule {ws,cooperative,pingpong}", "--cluster MxN", "--raster {m,n}"):
        assert option in r.stdout
    assert "--schedule pingpong --cluster 1x2 --raster n" in r.stdout  # an sm90 example


def test_top_level_help_lists_every_command():
    r = cli("--help")
    assert "{plan,render,emit,tune,bench,plot}" in r.stdout
    for command in ("plan", "render", "emit", "tune", "bench", "plot"):
        assert re.search(rf"^\s+{command}\s+\S", r.stdout, re.M), f"{command} is not listed with a summary"


def test_no_command_exits_2():
    r = cli()
    assert r.returncode == 2
    assert "plan" in r.stderr and "render" in r.stderr and "emit" in r.stderr


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


# -- emit ---------------------------------------------------------------------------------------------

def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_emit_one_plan_from_the_knobs(tmp_path):
    from generator import Gemm, emit

    out = tmp_path / "pkg"
    r = cli("emit", "--dtype", "fp16", "--layout", "tt", "--arch", "80", "--stages", "3", "--name", "my_gemms",
            "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "gemm_fp16_tt" in r.stdout and "pip install --no-build-isolation" in r.stdout
    expected = emit([Gemm("fp16", "tt", arch=80, stages=3)], name="my_gemms", out=tmp_path / "api")
    assert files_of(out) == files_of(expected)


def test_emit_says_which_ops_are_forward_only(tmp_path):
    """fp8 ops are forward only, beside a differentiable bf16 op in the same package."""
    status, out, err = run_main("emit", "--arch", "90", "--plan", "dtype=e4m3,scale=row", "--plan", "dtype=bf16",
                                "--name", "q", "--out", str(tmp_path / "q"))
    assert status == 0, err
    assert "autograd: differentiable, with" in out and "autograd: none" not in out
    assert ("autograd: forward only (fp8 and int8 inputs, and quantized outputs, refuse inputs that require grad): "
            "gemm_e4m3_tn_") in out


def test_emit_several_plans_and_op_names(tmp_path):
    r = cli("emit", "--arch", "80", "--plan", "dtype=bf16", "--plan", "dtype=fp16,out_dtype=fp32,op_name=mm_f32",
            "--plan", "layout=nt,layout_c=col,arch=90,family=sm80,tile=128x128x32,warps=2x2,stages=3,raster_group=4",
            "--plan", "layout=tt,arch=90,schedule=pingpong,cluster=1x2,raster=n,tile_shape=64x128x64",
            "--plan", "layout=nn,arch=90,family=sm90,cluster_shape=1x1",
            "--out", str(tmp_path / "mm"))
    assert r.returncode == 0, r.stderr
    plans = json.loads((tmp_path / "mm" / "plans.json").read_text())
    assert plans["name"] == "mm"  # --name defaults to the folder's name
    got = {p["op_name"]: (p["kernel"], p["arch"]) for p in plans["plans"]}
    assert got == {"gemm_bf16_tn": ("sm80_bf16_tn_128x256x32_w2x4_s4_g8", 80),
                   "mm_f32": ("sm80_fp16_tn_128x256x32_w2x4_s4_g8_ofp32", 80),
                   "gemm_bf16_nt_dcol": ("sm80_bf16_nt_dcol_128x128x32_w2x2_s3_g4", 90),
                   "gemm_bf16_tt": ("sm90_bf16_tt_64x128x64_c1x2_s8_pp_g8n", 90),
                   "gemm_bf16_nn": ("sm90_bf16_nn_128x256x64_c1x1_s4_coop_g8n", 90)}
    r = cli("emit", "--arch", "80", "--plan", "dtype=bf16", "--plan", "dtype=fp16", "--op-name", "a", "--op-name", "b",
            "--name", "ab", "--out", str(tmp_path / "ab"))
    assert r.returncode == 0, r.stderr
    assert [p["op_name"] for p in json.loads((tmp_path / "ab" / "plans.json").read_text())["plans"]] == ["a", "b"]


def test_emit_from_a_plans_file(tmp_path):
    (tmp_path / "plans.json").write_text(json.dumps([{"dtype": "bf16", "layout": "tn", "arch": 90},
                                                     {"dtype": "fp16", "layout": "nn", "arch": 80}]))
    r = cli("emit", "--plans", str(tmp_path / "plans.json"), "--name", "my_gemms", "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    # the plans.json that emit writes is a plans file too, and re-emits the same package
    r = cli("emit", "--plans", str(tmp_path / "a" / "plans.json"), "--name", "my_gemms", "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")


def test_a_planner_rule_s_interleaved_k_tile_re_emits_from_plans_json(tmp_path):
    """plans.json records interleave_k (planner rule 22 chose it from the size hints; with the tile fixed in the
    record, only the knob plans it again), so re-emitting from it gives the same package."""
    r = cli("emit", "--plan", "dtype=e4m3,layout=tn,arch=90,scale=block,m=128,n=4096,k=4096", "--name", "ik",
            "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert "_coop_ik_" in r.stdout
    assert json.loads((tmp_path / "a" / "plans.json").read_text())["plans"][0]["interleave_k"] is True
    r = cli("emit", "--plans", str(tmp_path / "a" / "plans.json"), "--name", "ik", "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")


def test_a_ring_staged_tile_re_emits_from_plans_json(tmp_path):
    """A plan staged in the ring (rule 18: an odd-width pingpong tile, its stages the ones the staging freed) records
    no stages, so re-emitting from plans.json plans the same kernel (with them fixed it would no longer fit)."""
    r = cli("emit", "--plan", "dtype=bf16,layout=tn,arch=90,tile=128x80x64,schedule=pingpong", "--name", "sr",
            "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert "_pp_sr_" in r.stdout
    r = cli("emit", "--plans", str(tmp_path / "a" / "plans.json"), "--name", "sr", "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")


def test_a_package_without_autograd_re_emits_without_autograd(tmp_path):
    r = cli("emit", "--dtype", "bf16", "--layout", "tn", "--arch", "90", "--no-autograd", "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    # its plans.json says "autograd": false, and re-emitting from it keeps that without --no-autograd
    r = cli("emit", "--plans", str(tmp_path / "a" / "plans.json"), "--name", "a", "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert "autograd: none (the plans file says" in r.stdout
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")
    (tmp_path / "bad.json").write_text(json.dumps({"autograd": "yes", "plans": [{"dtype": "bf16", "arch": 90}]}))
    r = cli("emit", "--plans", str(tmp_path / "bad.json"), "--out", str(tmp_path / "c"))
    assert r.returncode == 2 and '"autograd" must be true or false' in r.stderr


@pytest.mark.parametrize("args, message", [
    (("--plan", "dtype=fp4"), "dtype='fp4' is not a valid choice (choose from 'fp16', 'bf16', 'tf32', 'e4m3', "
                               "'e5m2', 'int8')"),
    (("--plan", "layout=xy"), "layout='xy' is not a valid choice (choose from 'nn', 'nt', 'tn', 'tt')"),
    (("--plan", "arch=70"), "arch='70' is not a valid choice (choose from 80, 86, 89, 90)"),
    (("--plan", "colour=red"), "with a key of dtype, out_dtype, layout"),
    (("--plan", "tile=128x128"), "3 positive integers joined by 'x'"),
    (("--plan", "stages=9"), "stages=9: the multistage pipeline takes 2 to 8 stages"),
    (("--plan", "schedule=fast"),
     "schedule='fast' is not a valid choice (choose from 'ws', 'cooperative', 'pingpong')"),
    (("--plan", "family=sm70"), "family='sm70' is not a valid choice (choose from 'sm80', 'sm90')"),
    (("--plan", "raster=x"), "raster='x' is not a valid choice (choose from 'm', 'n')"),
    (("--plan", "cluster=2"), "2 positive integers joined by 'x'"),
    (("--plan", "arch=90,warps=2x4"), "plan 0: warps= is a knob of the sm80 family"),
    (("--plan", "schedule=pingpong"), "plan 0: schedule= is a knob of the sm90 family (Hopper, arch=90); this plan is "
                                      "sm80: plan with arch=90"),
    (("--layout", "xx"), "invalid choice: 'xx' (choose from 'nn', 'nt', 'tn', 'tt')"),
    (("--name", "my-gemms"), "name='my-gemms' is not allowed"),
    (("--name", "import"), "is a Python keyword"),
    (("--name", "a;rm -rf"), "regex ^[a-z_][a-z0-9_]*$"),
    (("--op-name", "Ab"), "op name='Ab' is not allowed"),
    (("--op-name", "a", "--op-name", "b"), "--op-name is given 2 time(s) for 1 plan(s)"),
    (("--plan", "dtype=bf16", "--plan", "dtype=bf16"), "both map to the op name 'gemm_bf16_tn'"),
    (("--plans", "missing.json"), "cannot read the plans file"),
])
def test_emit_bad_values_exit_2(tmp_path, args, message):
    if "--name" not in args:
        args = (*args, "--name", "pkg")
    r = cli("emit", "--arch", "80", *args, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_emit_needs_out_and_refuses_a_folder_it_did_not_write(tmp_path):
    r = cli("emit", "--arch", "80")
    assert r.returncode == 2 and "--out" in r.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    r = cli("emit", "--arch", "80", "--name", "x", "--out", str(tmp_path / "mine"))
    assert r.returncode == 2 and "emit did not write" in r.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_emit_does_not_import_torch(tmp_path):
    code = (
        "import sys\n"
        "from generator.cli import main\n"
        f"assert main(['emit', '--arch', '90', '--plan', 'dtype=fp16', '--plan', 'dtype=bf16', '--out', {str(tmp_path / 'p')!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'emit imported torch'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# -- fused epilogue options -----------------------------------------------------------------------------

def run_main(*args: str) -> tuple[int, str, str]:
    """generator.cli.main in-process: (exit status, stdout, stderr); argparse's errors exit via SystemExit."""
    import contextlib
    import io

    from generator.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(args))
        except SystemExit as exit_:
            status = exit_.code
    return status, out.getvalue(), err.getvalue()


EPILOGUE_MODULE = '''\
from __future__ import annotations

from generator import epilogue as ep


def fused(acc, bias: ep.Col):
    return ep.gelu_tanh(acc + bias)


def scaled(acc, bias: ep.Row, C: ep.Matrix, alpha: ep.Scalar):
    return ep.silu(alpha * acc + bias) + 0.5 * C


def refused(acc):
    import math
    return math.exp(acc)


def unused(acc, bias: ep.Col):
    return ep.relu(acc)


NOT_A_FUNCTION = 3
'''


@pytest.fixture
def epilogue_file(tmp_path):
    path = tmp_path / "my_epilogues.py"
    path.write_text(EPILOGUE_MODULE)
    return path


@pytest.mark.parametrize("args, expression, tag, kwargs", [
    (("--activation", "gelu_tanh", "--bias", "col"), "D = gelu_tanh(acc + bias)", "_ep_gelutanh_cbias_",
     dict(activation="gelu_tanh", bias="col")),
    (("--activation", "relu"), "D = relu(acc)", "_ep_relu_", dict(activation="relu")),
    (("--activation", "swish"), "D = silu(acc)", "_ep_silu_", dict(activation="swish")),
    (("--bias", "row"), "D = acc + bias", "_ep_rbias_", dict(bias="row")),
    (("--alpha", "2"), "D = 2 * acc", "_ep_expr_", dict(alpha=2.0)),
    (("--alpha", "scalar", "--beta", "0.5"), "D = alpha * acc + 0.5 * C", "_ep_mC_salpha_",
     dict(alpha="scalar", beta=0.5)),
    (("--beta", "Scalar"), "D = acc + beta * C", "_ep_mC_sbeta_", dict(beta="scalar")),
    (("--activation", "relu", "--bias", "row", "--alpha", "0.5", "--beta", "2"), "D = relu(0.5 * acc + 2 * C + bias)",
     "_ep_relu_rbias_mC_", dict(activation="relu", bias="row", alpha=0.5, beta=2)),
])
def test_plan_with_epilogue_knobs(args, expression, tag, kwargs):
    from generator import Gemm

    for arch in ("80", "90"):
        status, out, err = run_main("plan", "--arch", arch, *args)
        assert status == 0, err
        assert f"epilogue:     {expression}\n" in out
        name = re.search(r"^name:\s+(\S+)$", out, re.M).group(1)
        assert tag in name
        assert out == str(Gemm("bf16", "tn", arch=int(arch), **kwargs)) + "\n"


def test_plan_with_epilogue_knobs_as_a_user_runs_it():
    r = cli("plan", "--arch", "90", "--activation", "gelu_tanh", "--bias", "col")
    assert r.returncode == 0, r.stderr
    assert "name:         sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m_ep_gelutanh_cbias_" in r.stdout
    assert "epilogue:     D = gelu_tanh(acc + bias)\n              bias: per-column vector (N,), bf16" in r.stdout


def test_render_with_epilogue_knobs(tmp_path):
    from generator import Gemm

    status, out, err = run_main("render", "--arch", "80", "--activation", "silu", "--bias", "col",
                                "--out", str(tmp_path))
    assert status == 0, err
    expected = Gemm("bf16", "tn", arch=80, activation="silu", bias="col").render()
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == expected
    assert all("_ep_silu_cbias_" in name for name in expected)


def test_epilogue_from_a_file(epilogue_file, tmp_path):
    from generator import Gemm

    status, out, err = run_main("plan", "--arch", "90", "--epilogue", f"{epilogue_file}:fused")
    assert status == 0, err
    # the traced function is the same epilogue as the equal knobs: same kernel
    assert out == str(Gemm("bf16", "tn", arch=90, activation="gelu_tanh", bias="col")) + "\n"
    assert "_ep_gelutanh_cbias_" in out
    status, out, err = run_main("render", "--arch", "80", "--epilogue", f"{epilogue_file}:scaled",
                                "--out", str(tmp_path / "k"))
    assert status == 0, err
    files = sorted(p.name for p in (tmp_path / "k").iterdir())
    assert files and "_ep_silu_" in files[0]
    assert "D = silu(alpha * acc + bias) + 0.5 * C" in (tmp_path / "k" / files[0]).read_text()


def test_epilogue_from_a_module_function(epilogue_file, tmp_path, monkeypatch):
    # python -m generator puts the current folder first on sys.path; the CLI does so for --epilogue itself
    monkeypatch.chdir(tmp_path)
    try:
        status, out, err = run_main("plan", "--arch", "80", "--epilogue", "my_epilogues:scaled")
    finally:
        sys.modules.pop("my_epilogues", None)
    assert status == 0, err
    assert "epilogue:     D = silu(alpha * acc + bias) + 0.5 * C\n" in out
    assert "bias: per-row vector (M,), bf16" in out and "alpha: runtime scalar (fp32)" in out
    assert re.search(r"^name:\s+sm80_\S+_ep_silu_rbias_mC_salpha_[0-9a-f]{8}$", out, re.M), out
    assert str(tmp_path) not in sys.path
    r = cli("plan", "--arch", "90", "--epilogue", "my_epilogues:fused", cwd=tmp_path)  # as a user runs it
    assert r.returncode == 0, r.stderr
    assert "_ep_gelutanh_cbias_" in r.stdout and "epilogue:     D = gelu_tanh(acc + bias)" in r.stdout


@pytest.mark.parametrize("args, choices", [
    (("--activation", "gleu"), "invalid choice: 'gleu' (choose from 'identity', 'none', 'relu', 'leaky_relu', "
                               "'gelu', 'gelu_tanh', 'silu', 'sigmoid', 'tanh', 'gelu_erf', 'swish')"),
    (("--bias", "diag"), "invalid choice: 'diag' (choose from 'row', 'col')"),
    (("--alpha", "abc"), "argument --alpha: 'abc' is not a number or 'scalar'"),
    (("--beta", "nan"), "argument --beta: 'nan' is not a number or 'scalar'"),
    (("--beta", "inf"), "argument --beta: 'inf' is not a number or 'scalar'"),
    (("--epilogue", "my_epilogues"), "argument --epilogue: 'my_epilogues' is not module:function or "
                                     "path/to/file.py:function"),
    (("--epilogue", "my_epilogues:"), "is not module:function"),
    (("--epilogue", ":fused"), "is not module:function"),
])
def test_a_bad_epilogue_value_exits_2_listing_the_choices(args, choices):
    from generator.epilogue import ACTIVATIONS

    r = cli("plan", "--arch", "80", *args)
    assert r.returncode == 2
    assert choices in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""
    if args[0] == "--activation":
        assert all(repr(name) in r.stderr for name in ACTIVATIONS if name is not None)


def test_an_epilogue_value_the_planner_refuses_exits_2():
    status, out, err = run_main("plan", "--arch", "80", "--alpha", "0")
    assert status == 2 and out == ""
    assert err == "error: alpha=0 is not supported: D would not depend on A @ B\n"


@pytest.mark.parametrize("spec, message", [
    ("{file}:refused", "--epilogue '{file}:refused': epilogue refused() line 16 (my_epilogues.py): math.exp"),
    ("{file}:unused", "parameter 'bias' is not used"),
    ("{file}:missing", "--epilogue '{file}:missing': '{file}' has no attribute 'missing' (its functions: fused, "
                       "refused, scaled, unused)"),
    ("{file}:NOT_A_FUNCTION", "NOT_A_FUNCTION is not a function of the accumulator (its type is int)"),
    ("{dir}/no_such_file.py:fused", "no such file '{dir}/no_such_file.py'"),
    ("{dir}/broken.py:fused", "cannot import the file '{dir}/broken.py': RuntimeError: broken on import here"),
    ("{dir}/syntax.py:fused", "cannot import the file '{dir}/syntax.py': SyntaxError:"),
    ("no_such_module_gemmgen:fused", "cannot import the module 'no_such_module_gemmgen': ModuleNotFoundError: "
                                     "No module named 'no_such_module_gemmgen'"),
])
def test_an_epilogue_that_cannot_be_loaded_or_traced_exits_2(epilogue_file, tmp_path, spec, message):
    (tmp_path / "broken.py").write_text('raise RuntimeError("broken\\non import\\nhere")\n')
    (tmp_path / "syntax.py").write_text("def fused(acc:\n")
    spec = spec.format(file=epilogue_file, dir=tmp_path)
    status, out, err = run_main("plan", "--arch", "80", "--epilogue", spec)
    assert status == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err  # one line
    assert message.format(file=epilogue_file, dir=tmp_path) in err
    r = cli("plan", "--arch", "80", "--epilogue", spec, cwd=tmp_path)  # as a user runs it: no traceback
    assert r.returncode == 2 and r.stderr == err and "Traceback" not in r.stderr


@pytest.mark.parametrize("knobs", [("--activation", "relu"), ("--bias", "col"), ("--alpha", "2"),
                                   ("--beta", "scalar"), ("--bias", "row", "--alpha", "scalar")])
def test_epilogue_with_a_knob_exits_2(epilogue_file, tmp_path, knobs):
    named = ", ".join(k for k in knobs if k.startswith("--"))
    for command in (("plan",), ("render", "--out", str(tmp_path / "k")), ("emit", "--out", str(tmp_path / "p"))):
        status, out, err = run_main(*command, "--arch", "80", "--epilogue", f"{epilogue_file}:fused", *knobs)
        assert status == 2 and out == ""
        assert err == (f"error: --epilogue cannot be combined with {named}: use one or the other (put the "
                       "activation, bias and scales into the function, or drop --epilogue and use the knobs)\n")
    assert not (tmp_path / "k").exists() and not (tmp_path / "p").exists()


def test_emit_epilogue_plans(epilogue_file, tmp_path):
    from generator import Gemm, emit

    # the options: one op, which takes the epilogue's operands and is recorded by its knobs
    status, out, err = run_main("emit", "--arch", "90", "--activation", "gelu_tanh", "--bias", "col",
                                "--name", "ep", "--out", str(tmp_path / "a"))
    assert status == 0, err
    assert "ep.gemm_bf16_tn_gelutanh_cbias  (bf16 -> bf16, layout tn, D = gelu_tanh(acc + bias), kernel " \
           "sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m_ep_gelutanh_cbias_" in out
    # differentiable: the 4 backward kernels of bf16 sm_90 (row-major D: a column-major gradient is computed as its
    # transpose) and the one recomputing acc in fp32
    assert "autograd: differentiable, with 5 backward kernel(s) in the package" in out
    assert "autograd: none" not in out and "autograd: forward only" not in out
    expected = emit([Gemm("bf16", "tn", arch=90, activation="gelu_tanh", bias="col")], name="ep", out=tmp_path / "api")
    assert files_of(tmp_path / "a") == files_of(expected)
    # --plan keys, beside a plain plan; a --plans file of the package re-emits it
    status, out, err = run_main("emit", "--arch", "80", "--plan", "activation=relu,bias=row,alpha=scalar,beta=2",
                                "--plan", "dtype=fp16", "--name", "mix", "--out", str(tmp_path / "b"))
    assert status == 0, err
    record = json.loads((tmp_path / "b" / "plans.json").read_text())["plans"]
    kernels = sorted(p["kernel"] for p in record)
    assert "_ep_relu_rbias_mC_salpha_" in kernels[0] and kernels[1] == "sm80_fp16_tn_128x256x32_w2x4_s4_g8"
    assert "D = relu(alpha * acc + 2 * C + bias)" in out
    assert "autograd: differentiable, with" in out and "autograd: not for" not in out
    status, out, err = run_main("emit", "--plans", str(tmp_path / "b" / "plans.json"), "--name", "mix",
                                "--out", str(tmp_path / "c"))
    assert status == 0, err
    assert files_of(tmp_path / "b") == files_of(tmp_path / "c")
    # --epilogue: the function's epilogue, the same kernel as the equal knobs
    status, out, err = run_main("emit", "--arch", "90", "--epilogue", f"{epilogue_file}:fused", "--name", "ep",
                                "--out", str(tmp_path / "d"))
    assert status == 0, err
    assert "kernel sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m_ep_gelutanh_cbias_" in out
    # an identity epilogue (alpha 1, no activation) is the plain GEMM
    status, out, err = run_main("emit", "--arch", "80", "--alpha", "1", "--plan", "activation=identity",
                                "--name", "p", "--out", str(tmp_path / "p"))
    assert status == 0, err
    assert "p.gemm_bf16_tn  (bf16 -> bf16, layout tn, kernel sm80_bf16_tn_128x256x32_w2x4_s4_g8, sm_80)" in out


def test_emit_refusing_an_epilogue_exits_2(tmp_path):
    # emit's own refusal (an operand name the package's Python function cannot take): a message, no traceback
    (tmp_path / "eps.py").write_text("from generator import epilogue as ep\n\n\n"
                                     "def f(acc, _b: ep.Col):\n    return acc + _b\n")
    r = cli("emit", "--arch", "80", "--epilogue", "eps:f", "--out", str(tmp_path / "p"), cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("error: the epilogue operand '_b' of sm80_") and r.stderr.count("\n") == 1
    assert "rename the operand" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("args, message", [
    (("--plan", "activation=gleu"), "activation='gleu' is not a valid choice (choose from 'identity', 'none', "
                                    "'relu', 'leaky_relu', 'gelu', 'gelu_tanh', 'silu', 'sigmoid', 'tanh', "
                                    "'gelu_erf', 'swish')"),
    (("--plan", "bias=diag"), "bias='diag' is not a valid choice (choose from 'row', 'col')"),
    (("--plan", "alpha=abc"), "alpha='abc' is not a number or 'scalar'"),
    (("--plan", "beta=inf"), "beta='inf' is not a number or 'scalar'"),
    (("--plan", "dtype=fp16", "--plan", "alpha=0"), "--plan 1: alpha=0 is not supported"),
    (("--plan", "dtype=fp16", "--plan", "stages=9"), "--plan 1: stages=9: the multistage pipeline takes 2 to 8"),
    (("--epilogue", "{file}:fused", "--plan", "dtype=fp16", "--plan", "bias=col,activation=relu"),
     "--plan 1: activation=, bias= cannot be combined with --epilogue: use one or the other"),
])
def test_emit_bad_epilogue_plan_values_exit_2(epilogue_file, tmp_path, args, message):
    args = tuple(a.format(file=epilogue_file) for a in args)
    r = cli("emit", "--arch", "80", *args, "--name", "pkg", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_help_lists_the_epilogue_options():
    for command in ("plan", "render", "emit"):
        r = cli(command, "--help")
        assert r.returncode == 0, r.stderr
        for option in ("--activation NAME", "--bias {row,col}", "--alpha X|scalar", "--beta X|scalar",
                       "--epilogue MODULE:FUNCTION"):
            assert option in r.stdout, (command, option)
    r = cli("plan", "--help")
    assert "--activation gelu_tanh --bias col" in r.stdout  # an example


def test_epilogue_options_do_not_import_torch(epilogue_file):
    code = (
        "import sys\n"
        "from generator.cli import main\n"
        "assert main(['plan', '--arch', '80', '--activation', 'gelu', '--bias', 'col']) == 0\n"
        f"assert main(['plan', '--arch', '90', '--epilogue', {str(epilogue_file) + ':scaled'!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'the CLI imported torch'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
