"""A tuned result in use, on the CPU: a plan whose problem has a recorded winner builds it and says so, the switch
that turns that off, plan.tune() answering from the cache, bucketed plans, the command line (no GPU: exit 2;
--export / --import), and emit embedding a table. The GPU side is tests/gpu/test_tune.py."""
from __future__ import annotations

import json
import time
import types
from dataclasses import replace
from pathlib import Path

import pytest

from generator import Gemm
from generator.cli import main
from generator.emit import package_files, resolve_ops
from generator.gemm import UNTUNED_LINE, _space
from generator.tune import DeviceKey, Entry, entry_key, load_tables
from generator.tune import tuner
from generator.tune.cache import config_fields, record, table_path
from tune_cases import H100, no_shipped_tables, own_tuning_dir  # noqa: E402


@pytest.fixture(autouse=True)
def tuning_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    no_shipped_tables(tmp_path, monkeypatch)
    yield own_tuning_dir(tmp_path, monkeypatch)
    from generator.tune import shipped
    shipped.shipped_tables.cache_clear()


@pytest.fixture
def on_h100(monkeypatch: pytest.MonkeyPatch) -> DeviceKey:
    """This machine is the made-up H100 (as far as the tuning cache can tell)."""
    monkeypatch.setattr(tuner, "current_device", lambda **_: H100)
    return H100


def winner_of(plan: Gemm):
    pick = plan.estimate.config
    return replace(pick, cluster=(1, 2), raster="n") if pick.family == "sm90" else replace(pick, stages=3)


def record_for(plan: Gemm, device: DeviceKey = H100, *, kernel: str | None = None) -> Entry:
    """Record a made-up measurement for ``plan``'s request and problem: the winner 5 % faster than the pick."""
    pick, winner = plan.estimate.config, winner_of(plan)
    entry = Entry(key=entry_key(_space(plan._request), plan._request.problem, pick), kernel=kernel or winner.name,
                  config=config_fields(winner), ms=0.19, estimate_ms=0.1995, estimate_kernel=pick.name, candidates=21,
                  date="2026-11-24T10:00:00Z", seconds=40.0, table=((pick.name, 0.1995, ""), (winner.name, 0.19, "")))
    record(device, entry)
    return entry


def test_a_recorded_winner_changes_the_plan(on_h100: DeviceKey) -> None:
    entry = record_for(Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096))
    plan = Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096)
    assert plan.tuned is not None and plan.config.name == entry.kernel != plan.estimate.config.name
    assert plan.config.cluster == (1, 2)
    text = str(plan)
    assert f"name:         {entry.kernel}" in text
    tuned_line = next(line for line in text.splitlines() if line.startswith("tuned:"))
    assert tuned_line == (f"tuned:        {entry.kernel}, 0.19 ms vs 0.1995 ms for the estimate's pick (+5.0 %), "
                          "measured on NVIDIA H100 80GB HBM3 2026-11-24 (21 candidates)")
    assert plan.why.startswith(f"measured (see tuned:); the estimate picked {plan.estimate.config.name}")
    # another problem, another request (a fixed knob) or the switch: the estimate's pick
    assert Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=8192).tuned is None
    assert Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096, stages=4).tuned is None
    assert Gemm("fp16", "tn", arch=90, m=4096, n=4096, k=4096).tuned is None
    assert Gemm("bf16", "tn", arch=90).tuned is None
    # a knob set later re-plans: the key changes with it
    plan.stages = 3
    assert plan.tuned is None and f"tuned:        {UNTUNED_LINE}" in str(plan)


def test_the_switch_turns_lookups_off(on_h100: DeviceKey, monkeypatch: pytest.MonkeyPatch) -> None:
    record_for(Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096))
    monkeypatch.setenv("GEMMGEN_TUNED", "0")
    plan = Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096)
    assert plan.tuned is None and plan.config == plan.estimate.config


def test_no_table_means_no_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(**_: object) -> None:
        raise AssertionError("the GPU was asked for although no tuning table exists")

    monkeypatch.setattr(tuner, "current_device", boom)
    assert Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096).tuned is None


def test_another_gpu_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    record_for(Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096))
    monkeypatch.setattr(tuner, "current_device", lambda **_: replace(H100, torch="2.6.0"))
    assert Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096).tuned is None


def test_a_stale_record_is_ignored(on_h100: DeviceKey) -> None:
    record_for(Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096), kernel="sm90_some_other_kernel")
    assert Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096).tuned is None


def test_tune_answers_from_the_cache(on_h100: DeviceKey, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = record_for(Gemm("bf16", "tn", arch=90, m=2048, n=2048, k=2048))
    plan = Gemm("bf16", "tn", arch=90)
    monkeypatch.setattr(tuner, "candidates", lambda *a, **k: pytest.fail("a cached shape was measured again"))
    start = time.perf_counter()
    result = plan.tune(m=2048, n=2048, k=2048, progress=False)
    assert time.perf_counter() - start < 1.0
    assert result.from_cache and result.winner.name == entry.kernel and abs(result.gain - 0.05) < 1e-9
    assert plan.config.name == entry.kernel and plan.tuned is not None
    assert "from the tuning cache" in result.format() and entry.kernel in result.format()


def test_tune_keeps_a_ragged_plans_hint(on_h100: DeviceKey, monkeypatch: pytest.MonkeyPatch) -> None:
    # tune() on a plan for ragged groups replans nothing: the recorded winner answers it, and the plan stays ragged
    ragged = dict(arch=90, m=148, n=4096, k=7168, batch=32, ragged=True)
    entry = record_for(Gemm("bf16", "tn", **ragged))
    plan = Gemm("bf16", "tn", **ragged)
    monkeypatch.setattr(tuner, "candidates", lambda *a, **k: pytest.fail("a cached shape was measured again"))
    result = plan.tune(progress=False)
    assert result.from_cache and plan.config.name == entry.kernel and plan.problem.ragged


def test_tune_needs_a_problem_and_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="needs the problem size"):
        Gemm("bf16", "tn", arch=90).tune(m=128)
    monkeypatch.setattr(tuner, "current_device", lambda **_: None)
    with pytest.raises(RuntimeError, match="needs? .*GPU|CUDA GPU"):
        Gemm("bf16", "tn", arch=90, m=128, n=128, k=128).tune()


def test_bucket_plans_take_recorded_winners(on_h100: DeviceKey) -> None:
    bucket = Gemm("bf16", "tn", arch=90, m=512, n=4096, k=4096)
    entry = record_for(bucket)
    plans = dict(Gemm("bf16", "tn", arch=90, n=4096, k=4096).bucket_plans((64, 128, 512)))
    assert plans[512].config.name == entry.kernel and plans[512].tuned is not None
    assert plans[128].tuned is None


# -- the command line -------------------------------------------------------------------------------------------

def test_cli_tune_without_a_gpu_exits_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("generator.tune.current_device", lambda **_: None)
    assert main(["tune", "--arch", "90", "--shapes", "4096x4096x4096"]) == 2
    err = capsys.readouterr().err
    assert "CUDA GPU" in err and "--export and --import work without one" in err
    assert main(["tune", "--arch", "90"]) == 2
    assert "needs --shapes" in capsys.readouterr().err


def test_cli_bad_shapes_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--shapes", "4096x4096"])
    assert exit_.value.code == 2 and "4096x4096" in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [(["--budget", "0"], "'0' is not a positive number of seconds"),
                                        (["--max-candidates", "0"], "'0' is not a positive integer")])
def test_cli_bad_budget_or_candidates_exit_2(argv: list[str], said: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--shapes", "4096x4096x4096", *argv])
    assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_cli_export_and_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    entry = record_for(Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096))
    out = tmp_path / "shared.json"
    assert main(["tune", "--export", str(out)]) == 0
    assert "exported 1 table(s), 1 entry" in capsys.readouterr().out
    monkeypatch.setenv("GEMMGEN_TUNING_DIR", str(tmp_path / "elsewhere"))
    assert main(["tune", "--import", str(out)]) == 0
    said = capsys.readouterr().out
    assert "imported 1 of 1 entry" in said and "NVIDIA H100 80GB HBM3 (132 SMs" in said
    assert entry.key.text in json.loads(table_path(H100).read_text())["entries"]
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert main(["tune", "--import", str(bad)]) == 2
    assert "not a gemmgen tuning table" in capsys.readouterr().err


# -- emit ---------------------------------------------------------------------------------------------------------

def _routed_namespace(init_py: str) -> dict:
    """TUNED and _routed of an emitted __init__.py, run against stand-ins of torch and the ops."""
    start = init_py.index("TUNED = {")
    end = init_py.index("\n\n\n", init_py.index("def _routed"))
    ops = types.SimpleNamespace()
    fake_torch = types.SimpleNamespace(
        compiler=types.SimpleNamespace(is_compiling=lambda: False),
        cuda=types.SimpleNamespace(current_device=lambda: 0, get_device_properties=lambda i: types.SimpleNamespace(
            name="NVIDIA H100 80GB HBM3", multi_processor_count=132)))
    namespace = {"_torch": fake_torch, "_OPS": ops}
    exec(init_py[start:end], namespace)
    return namespace


class _Matrix:
    def __init__(self, rows: int, cols: int) -> None:
        self.shape = (rows, cols)
        self.device = types.SimpleNamespace(type="cuda", index=0)

    def dim(self) -> int:
        return 2


def test_emit_embeds_a_table(tmp_path: Path, on_h100: DeviceKey) -> None:
    entry = record_for(Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096))
    record_for(Gemm("fp16", "tn", arch=90, m=1024, n=1024, k=1024))   # another request: no route for a bf16 op
    tables = load_tables(table_path(H100))
    ops = resolve_ops([Gemm("bf16", "tn", arch=90)])
    files = package_files(ops, "tuned_pkg", autograd=True, tuning=tables)
    init_py = files["tuned_pkg/__init__.py"].decode()
    tuned_op = f"_tuned_{entry.kernel}"
    assert f'(4096, 4096, 4096): "{tuned_op}"' in init_py
    assert f'_routed("{ops[0].name}", A, B).default(A, B)' in init_py
    compile(init_py, "__init__.py", "exec")
    binding = files["csrc/binding.cpp"].decode()
    assert f'm.def("{tuned_op}(Tensor A, Tensor B) -> Tensor"' in binding
    assert f"csrc/{entry.kernel}.cu" in files
    record_json = json.loads(files["plans.json"])
    assert record_json["tuning"]["tables"][0]["device"]["gpu"] == "NVIDIA H100 80GB HBM3"
    # the routing itself: exactly the tuned sizes, on the tuned GPU
    ns = _routed_namespace(init_py)
    setattr(ns["_OPS"], ops[0].name, "own")
    setattr(ns["_OPS"], tuned_op, "tuned")
    assert ns["_routed"](ops[0].name, _Matrix(4096, 4096), _Matrix(4096, 4096)) == "tuned"
    assert ns["_routed"](ops[0].name, _Matrix(4096, 4096), _Matrix(4096, 1024)) == "own"
    ns["_DEVICES"][0] = ("NVIDIA A100", 108)
    assert ns["_routed"](ops[0].name, _Matrix(4096, 4096), _Matrix(4096, 4096)) == "own"
    # re-emitting from the package's plans.json keeps the table
    plans_json = tmp_path / "plans.json"
    plans_json.write_bytes(files["plans.json"])
    assert load_tables(plans_json)[0].entries.keys() == tables[0].entries.keys()


def test_emit_without_a_table_is_unchanged(on_h100: DeviceKey) -> None:
    ops = resolve_ops([Gemm("bf16", "tn", arch=90)])
    plain = package_files(ops, "pkg", autograd=False)
    assert "TUNED" not in plain["pkg/__init__.py"].decode() and "tuning" not in json.loads(plain["plans.json"])
    assert plain == package_files(ops, "pkg", autograd=False, tuning=[])


def test_emit_tunes_fused_epilogue_ops_with_their_formula(on_h100: DeviceKey) -> None:
    plan = Gemm("bf16", "tn", arch=90, m=2048, n=2048, k=2048, activation="gelu", bias="col")
    entry = record_for(plan)
    ops = resolve_ops([Gemm("bf16", "tn", arch=90, activation="gelu", bias="col")])
    files = package_files(ops, "pkg", autograd=True, tuning=load_tables(table_path(H100)))
    init_py = files["pkg/__init__.py"].decode()
    tuned_op = f"_tuned_{entry.kernel}"
    assert f'_register_epilogue_autograd("{tuned_op}"' in init_py
    assert f'_routed("{ops[0].name}", A, B).default(A, B, bias)' in init_py
    compile(init_py, "__init__.py", "exec")


def test_cli_emit_with_a_tuning_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry = record_for(Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096))
    out = tmp_path / "tuned_cli_pkg"
    assert main(["emit", "--arch", "90", "--tuning", str(table_path(H100)), "--no-autograd", "--out", str(out)]) == 0
    init_py = (out / "tuned_cli_pkg" / "__init__.py").read_text()
    assert f'(4096, 4096, 4096): "_tuned_{entry.kernel}"' in init_py and (out / f"csrc/{entry.kernel}.cu").is_file()
    capsys.readouterr()
    missing = tmp_path / "missing.json"
    assert main(["emit", "--arch", "90", "--tuning", str(missing), "--out", str(tmp_path / "other")]) == 2
    assert "cannot read" in capsys.readouterr().err
