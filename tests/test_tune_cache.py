"""The tuning cache (generator/tune/cache.py): tables round-trip, the key and the device key decide what an entry
is valid for, concurrent writers lose nothing, exports and imports are checked, a corrupt file is named and
survived. CPU only: the device keys are made up."""
from __future__ import annotations

import json
import multiprocessing
import os
from dataclasses import replace
from pathlib import Path

import pytest

from generator import Gemm
from generator.gemm import _space
from generator.tune import DeviceKey, Entry, EntryKey, TableError, entry_key, export_tables, import_tables, load_tables
from generator.tune import cache
from generator.tune.cache import apply_fields, config_fields, lookup, record, table_path
from tune_cases import H100, own_tuning_dir  # noqa: E402


@pytest.fixture(autouse=True)
def tuning_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return own_tuning_dir(tmp_path, monkeypatch)


def make_entry(m: int = 4096, n: int = 4096, k: int = 4096, *, date: str = "2026-11-24T10:00:00Z",
               ms: float = 0.19, stages: int | None = None) -> Entry:
    plan = Gemm("bf16", "tn", arch=90, m=m, n=n, k=k)
    pick = plan.estimate.config
    winner = replace(pick, cluster=(1, 2), raster="n") if stages is None else replace(pick, stages=stages)
    key = entry_key(_space(plan._request), plan._request.problem, pick)
    return Entry(key=key, kernel=winner.name, config=config_fields(winner), ms=ms, estimate_kernel=pick.name,
                 estimate_ms=0.2, candidates=12, date=date, seconds=30.0,
                 table=((pick.name, 0.2, ""), (winner.name, ms, "")))


def test_round_trip(tuning_dir: Path) -> None:
    entry = make_entry()
    path = record(H100, entry)
    assert path.parent == tuning_dir and path.name.startswith("nvidia-h100-80gb-hbm3-132sm-")
    data = json.loads(path.read_text())
    assert data["format"] == "gemmgen-tuning" and data["format_version"] == 1
    assert data["device"] == {"gpu": "NVIDIA H100 80GB HBM3", "sm_count": 132, "cc": 90, "driver": "550.54.15",
                              "cuda": "12.8.93", "torch": "2.5.1+cu124", "config_space": 1}
    assert list(data["entries"]) == [entry.key.text]
    assert lookup(H100, entry.key) == entry
    assert lookup(H100, entry.key).table == entry.table
    assert abs(entry.gain - (0.2 / 0.19 - 1)) < 1e-12


def test_key_fields() -> None:
    key = make_entry(512, 4096, 14336).key
    assert key.text == "sm90/sm90/bf16/bf16/tn/-/-/512x4096x14336x1"
    plan = Gemm("bf16", "tn", arch=90, m=512, n=4096, k=14336, activation="gelu", stages=4, layout_c="col")
    other = entry_key(_space(plan._request), plan._request.problem, plan.estimate.config)
    assert other.layout == "tn_dcol" and other.epilogue.startswith("_ep_") and other.knobs == "stages=4"
    assert not other.same_request(key) and key.same_request(make_entry(64, 1, 1).key)


def test_the_recorded_config_rebuilds_the_winner() -> None:
    entry = make_entry()
    pick = Gemm("bf16", "tn", arch=90, m=4096, n=4096, k=4096).estimate.config
    assert apply_fields(pick, entry.config).name == entry.kernel


@pytest.mark.parametrize("field,value", [("torch", "2.6.0+cu126"), ("gpu", "NVIDIA H200"), ("sm_count", 114),
                                         ("driver", "560.35.03"), ("cuda", "12.9.41"), ("config_space", 2)])
def test_a_changed_device_key_misses(field: str, value: object) -> None:
    entry = make_entry()
    record(H100, entry)
    other = replace(H100, **{field: value})
    assert other.file_name != H100.file_name
    assert lookup(other, entry.key) is None
    assert lookup(H100, entry.key) == entry


def test_another_problem_misses() -> None:
    record(H100, make_entry())
    assert lookup(H100, make_entry(4096, 4096, 8192).key) is None


def test_later_measurement_wins_and_others_stay() -> None:
    first, second = make_entry(date="2026-11-24T10:00:00Z"), make_entry(512, 4096, 4096)
    record(H100, first)
    record(H100, second)
    newer = make_entry(date="2026-11-25T10:00:00Z", ms=0.18, stages=3)
    record(H100, newer)
    assert lookup(H100, first.key) == newer and lookup(H100, second.key) == second


def _writer(folder: str, worker: int, count: int) -> None:
    os.environ["GEMMGEN_TUNING_DIR"] = folder
    for i in range(count):
        record(H100, make_entry(64 * (worker + 1), 1024 + i, 4096))


def test_concurrent_writers_lose_nothing(tuning_dir: Path) -> None:
    workers, count = 4, 6
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tuning_dir), w, count)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    table = cache.read_table(table_path(H100))
    assert len(table.entries) == workers * count
    assert not list(tuning_dir.glob("*.tmp"))


def test_export_and_import(tuning_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h200 = replace(H100, gpu="NVIDIA H200")
    record(H100, make_entry())
    record(h200, make_entry(512, 4096, 4096))
    out = tmp_path / "shared.json"
    tables = export_tables(out)
    assert {t.device for t in tables} == {H100, h200}
    data = json.loads(out.read_text())
    assert data["format"] == "gemmgen-tuning" and len(data["tables"]) == 2
    # another machine: an empty cache takes both tables, each kept apart under its own device
    monkeypatch.setenv("GEMMGEN_TUNING_DIR", str(tmp_path / "other"))
    imported = import_tables(out)
    assert sorted(changed for _, _, changed in imported) == [1, 1]
    assert lookup(H100, make_entry().key) is not None and lookup(h200, make_entry().key) is None
    assert lookup(h200, make_entry(512, 4096, 4096).key) is not None
    # importing again changes nothing; a single table file is taken too
    assert [changed for _, _, changed in import_tables(out)] == [0, 0]
    assert len(load_tables(table_path(H100))) == 1


def test_export_without_tables_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TableError, match="no tuning table to export"):
        export_tables(tmp_path / "x.json")


@pytest.mark.parametrize("text,match", [
    ("not json", "is not valid JSON"),
    ('{"format": "something else"}', "not a gemmgen tuning table"),
    ('{"format": "gemmgen-tuning", "format_version": 99, "tables": []}', "written by a newer gemmgen"),
    ('{"format": "gemmgen-tuning", "format_version": 1, "device": {"gpu": "x"}, "entries": {}}', "device"),
    ('{"format": "gemmgen-tuning", "format_version": 1, "tables": [{"device": 1}]}', "device"),
])
def test_import_validates(tmp_path: Path, text: str, match: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(TableError, match=match):
        import_tables(bad)


def test_an_entry_under_the_wrong_name_is_refused(tmp_path: Path) -> None:
    record(H100, make_entry())
    data = json.loads(table_path(H100).read_text())
    data["entries"] = {"elsewhere": next(iter(data["entries"].values()))}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(TableError, match="filed under the wrong name"):
        import_tables(bad)


def test_corrupt_table_is_named_ignored_and_replaced(capsys: pytest.CaptureFixture[str]) -> None:
    path = table_path(H100)
    path.parent.mkdir(parents=True)
    path.write_text("{ truncated")
    entry = make_entry()
    assert lookup(H100, entry.key) is None
    assert "ignoring the tuning table" in capsys.readouterr().err
    record(H100, entry)     # a writer moves the corrupt file aside and starts a new table
    err = capsys.readouterr().err
    assert "moved it to" in err
    assert lookup(H100, entry.key) == entry
    assert len(list(path.parent.glob(path.name + ".corrupt-*"))) == 1


def test_device_key_file_name_and_json() -> None:
    assert DeviceKey.from_json(H100.to_json(), "x") == H100
    with pytest.raises(ValueError, match="sm_count"):
        DeviceKey.from_json({**H100.to_json(), "sm_count": "132"}, "x")
    assert replace(H100, gpu="../../etc").file_name.startswith("etc-132sm-")


def test_entry_key_rejects_bad_fields() -> None:
    with pytest.raises(TableError, match="exactly the keys"):
        EntryKey.from_json({"arch": 90}, "x")
