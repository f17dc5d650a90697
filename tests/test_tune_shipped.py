"""The dispatch tables shipped per GPU model (generator/tune/shipped.py): an entry measured at m rows answers its
layer's plans with M in (m/2, m]; the user's own tuning cache wins over it; another GPU model, GEMMGEN_TUNED=0, an
entry that is no longer that kernel, and shapes outside the table keep the estimate."""
from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from generator import Gemm
from generator.gemm import _space
from generator.planner import Problem
from generator.planner.backward import backward_configs, backward_hint, gradient_requests, hinted_op_name
from generator.spec.types import Order
from generator.tune import Entry, Table, tuned_plan, tuner
from generator.tune import shipped
from generator.tune.cache import bundle_json, config_fields, load_tables, record
from generator.tune.tuner import entry_key
from tune_cases import H100, no_shipped_tables, own_tuning_dir, visible_h200  # noqa: E402


@pytest.fixture(autouse=True)
def tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    own_tuning_dir(tmp_path, monkeypatch)
    folder = no_shipped_tables(tmp_path, monkeypatch)
    monkeypatch.setattr(tuner, "current_device", lambda **_: H100)
    yield folder
    shipped.shipped_tables.cache_clear()


def entry_for(plan: Gemm, winner_of, ms: float = 0.05) -> Entry:
    pick = plan.estimate.config
    winner = winner_of(pick)
    return Entry(key=entry_key(_space(plan._request), plan._request.problem, pick), kernel=winner.name,
                 config=config_fields(winner), ms=ms, estimate_ms=ms * 1.1, estimate_kernel=pick.name, candidates=12,
                 date="2026-11-27T10:00:00Z")


def ship(folder: Path, entries: list[Entry], device=H100) -> None:
    table = Table(device, {e.key.text: e for e in entries})
    (folder / "h100.json").write_text(json.dumps(bundle_json([table])))
    shipped.shipped_tables.cache_clear()


def two_clusters(pick):
    return replace(pick, cluster=(1, 2) if pick.cluster != (1, 2) else (1, 1))


def test_an_entry_answers_its_band_of_rows(tables: Path) -> None:
    at_256 = entry_for(Gemm("bf16", "tn", arch=90, m=256, n=4096, k=4096), two_clusters)
    ship(tables, [at_256])
    for m in (129, 200, 256):   # (128, 256]
        plan = Gemm("bf16", "tn", arch=90, m=m, n=4096, k=4096)
        assert plan.tuned is not None and plan.config.name == at_256.kernel, m
        line = next(x for x in str(plan).splitlines() if x.startswith("tuned:"))
        assert "from the H100 table (measured at 256x4096x4096" in line
    for m in (128, 257, 1024):  # outside the band: the estimate
        assert Gemm("bf16", "tn", arch=90, m=m, n=4096, k=4096).tuned is None, m
    # another layer, another request, no size hints: the estimate
    assert Gemm("bf16", "tn", arch=90, m=256, n=4096, k=8192).tuned is None
    assert Gemm("fp16", "tn", arch=90, m=256, n=4096, k=4096).tuned is None
    assert Gemm("bf16", "tn", arch=90, m=256, n=4096, k=4096, stages=3).tuned is None
    assert Gemm("bf16", "tn", arch=90).tuned is None


def test_the_nearest_measured_row_count_answers(tables: Path) -> None:
    plan_128, plan_512 = (Gemm("bf16", "tn", arch=90, m=m, n=4096, k=4096) for m in (128, 512))
    at_128 = entry_for(plan_128, two_clusters)
    at_512 = entry_for(plan_512, lambda p: replace(p, raster="n" if p.raster == "m" else "m"))
    ship(tables, [at_512, at_128])
    assert Gemm("bf16", "tn", arch=90, m=100, n=4096, k=4096).config.name == at_128.kernel
    assert Gemm("bf16", "tn", arch=90, m=300, n=4096, k=4096).config.name == at_512.kernel
    assert Gemm("bf16", "tn", arch=90, m=200, n=4096, k=4096).tuned is None   # (128, 256]: not measured


def test_the_users_cache_wins_and_the_switch_turns_both_off(tables: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = Gemm("bf16", "tn", arch=90, m=256, n=4096, k=4096)
    ship(tables, [entry_for(plan, two_clusters)])
    mine = entry_for(plan, lambda p: replace(p, raster="n" if p.raster == "m" else "m"))
    record(H100, mine)
    again = Gemm("bf16", "tn", arch=90, m=256, n=4096, k=4096)
    assert again.config.name == mine.kernel and "table" not in str(again)
    monkeypatch.setenv("GEMMGEN_TUNED", "0")
    assert Gemm("bf16", "tn", arch=90, m=256, n=4096, k=4096).tuned is None


def test_another_gpu_model_or_a_stale_entry_misses(tables: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = Gemm("bf16", "tn", arch=90, m=256, n=4096, k=4096)
    entry = entry_for(plan, two_clusters)
    ship(tables, [entry], device=replace(H100, gpu="NVIDIA H200", driver="other"))
    assert Gemm("bf16", "tn", arch=90, m=256, n=4096, k=4096).tuned is None
    # the same model measured with another driver, CUDA and torch: it answers
    ship(tables, [entry], device=replace(H100, driver="other", cuda="13.0", torch="2.11.0"))
    assert Gemm("bf16", "tn", arch=90, m=256, n=4096, k=4096).tuned is not None
    # an entry whose recorded fields no longer give its kernel (the config space moved): ignored
    ship(tables, [replace(entry, kernel=entry.kernel + "_renamed")])
    assert Gemm("bf16", "tn", arch=90, m=256, n=4096, k=4096).tuned is None
    # an entry measured against a kernel the planner no longer picks: ignored (its winner beat another pick)
    ship(tables, [replace(entry, estimate_kernel="sm90_an_older_pick")])
    assert Gemm("bf16", "tn", arch=90, m=256, n=4096, k=4096).tuned is None
    # no GPU: no lookup
    monkeypatch.setattr(tuner, "current_device", lambda **_: None)
    ship(tables, [entry])
    assert Gemm("bf16", "tn", arch=90, m=256, n=4096, k=4096).tuned is None


def test_a_corrupt_shipped_table_is_a_clear_error(tables: Path) -> None:
    (tables / "broken.json").write_text("{not json")
    shipped.shipped_tables.cache_clear()
    with pytest.raises(ValueError, match="the shipped dispatch table .*broken.json.* is not valid JSON"):
        Gemm("bf16", "tn", arch=90, m=256, n=4096, k=4096)


def test_the_shipped_tables_are_package_data_and_well_formed() -> None:
    """setup.py ships generator/tune/tables/*.json; each file there is a table this gemmgen reads."""
    text = (Path(__file__).resolve().parents[1] / "setup.py").read_text()
    assert '"generator.tune": ["tables/*.json"]' in text
    folder = Path(shipped.__file__).resolve().parent / "tables"
    for path in sorted(folder.glob("*.json")):
        for table in load_tables(path):
            assert table.entries, f"{path}: a shipped table without entries"


def test_every_shipped_entry_is_a_kernel_of_this_gemmgen() -> None:
    """Each shipped entry's recorded fields rebuild its kernel on the request's pick (none is stale), and it is
    measured against the kernel the planner picks today: a planner change that moves a pick under a shipped entry
    retires that entry (it answers nothing), so the fix is to re-tune those rows (benchmarks/tune_corpus.py) or drop
    them from the table."""
    folder = Path(shipped.__file__).resolve().parent / "tables"
    stale, retired = [], []
    for path in sorted(folder.glob("*.json")):
        for table in load_tables(path):
            for entry in table.entries.values():
                k = entry.key
                with pytest.MonkeyPatch.context() as mp:
                    mp.setenv("GEMMGEN_TUNED", "0")
                    estimate = Gemm(k.dtype, k.layout, arch=k.arch, m=k.m, n=k.n, k=k.k).estimate
                pick = estimate.config
                if tuner.choice_from_entry(entry, pick, table.device) is None:
                    stale.append(f"{path.name}: {k.text} -> {entry.kernel}")
                if entry.estimate_kernel not in (pick.name, estimate.model_config.name):
                    retired.append(f"{path.name}: {k.text}: measured against {entry.estimate_kernel}, "
                                   f"the planner now picks {pick.name}")
    assert not stale, "shipped entries that are no longer their kernel:\n" + "\n".join(stale)
    assert not retired, "re-tune these rows (benchmarks/tune_corpus.py) or drop them:\n" + "\n".join(retired)



def test_a_gradient_takes_the_tables_winner_for_its_own_problem(tables: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The JIT ops choose their backward kernels as plans do (tune.tuned_plan): the table's entry for dX's own
    request and problem (layout tt, M x K x N for a tn forward) answers it; the op is then registered under a name
    of its own, and GEMMGEN_TUNED=0 gives the planner's kernels back."""
    forward = Gemm("bf16", "tn", arch=90, m=1024, n=4096, k=4096)   # (129-512 tokens: dX swapped, nn)
    problem = forward.problem
    grad_a_request, _ = gradient_requests(forward.config, Order.row, problem)
    assert grad_a_request.layout.blas == "tt" and grad_a_request.problem == Problem(1024, 4096, 4096)
    grad_a_plan = Gemm("bf16", "tt", arch=90, m=1024, n=4096, k=4096)
    entry = entry_for(grad_a_plan, two_clusters)
    ship(tables, [entry])
    planned = backward_configs(forward.config, Order.row, problem)
    chosen = backward_configs(forward.config, Order.row, problem, tuned_plan)
    assert chosen[0].name == entry.kernel != planned[0].name
    assert chosen[1] == planned[1]                                   # dW: no entry, the estimate
    assert backward_configs(forward.config, Order.col, problem, tuned_plan) == backward_configs(
        forward.config, Order.col, problem)                          # a column-major dD: another request
    assert backward_configs(forward.config, Order.row, None, tuned_plan) == backward_configs(forward.config)
    assert backward_hint(forward.config, problem, tuned_plan) == problem
    name = hinted_op_name(forward.config, problem, tuned_plan)
    assert re.fullmatch(re.escape(hinted_op_name(forward.config, problem)) + r"_tuned[0-9a-f]{8}", name), name
    # the op: registered under that name, its formula's dA op runs the winner (nothing is built: no GPU needed)
    from generator.runtime.autograd import grad_ops
    from generator.runtime.op import GemmOp

    op = GemmOp(forward.config, None, "gemmgen_tuned_backward", problem=problem, plan_gradient=tuned_plan)
    assert op.name == name and [g.config for g in grad_ops(op)] == list(chosen)
    # another band of rows: the planner's kernels, and its op's name
    other = Problem(2048, 4096, 4096)
    assert backward_configs(forward.config, Order.row, other, tuned_plan) == backward_configs(
        forward.config, Order.row, other)
    assert hinted_op_name(forward.config, other, tuned_plan) == hinted_op_name(forward.config, other)
    monkeypatch.setenv("GEMMGEN_TUNED", "0")
    assert backward_configs(forward.config, Order.row, problem, tuned_plan) == planned
    assert hinted_op_name(forward.config, problem, tuned_plan) == hinted_op_name(forward.config, problem)


def test_the_gradients_tune_corpus_tunes_are_the_ones_the_ops_look_up(tables: Path) -> None:
    """benchmarks/tune_corpus.py --passes dX,dW files its winners under the key the op's backward looks up
    (tuned_plan on gradient_requests): entries made from its plans answer both gradients of the forward."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import tune_corpus

    (_, dx_plan), (_, dw_plan) = tune_corpus.pass_plans([(512, 14336, 4096)], ["dX", "dW"], "bf16", arch=90)
    entries = [entry_for(dx_plan, two_clusters), entry_for(dw_plan, two_clusters)]
    ship(tables, entries)
    forward = Gemm("bf16", "tn", arch=90, m=512, n=14336, k=4096)
    chosen = backward_configs(forward.config, Order.row, forward.problem, tuned_plan)
    assert [c.name for c in chosen] == [e.kernel for e in entries]
    assert [c.name for c in chosen] != [c.name for c in backward_configs(forward.config, Order.row, forward.problem)]


def test_entries_measured_before_the_layered_rules_answer(tables: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tables predate the rules layered on the model's pick (planner.sm90 choose_sm90: the filling odd width of a
    128x128 pingpong pick on an H200, then the ring's staging of an odd-width pingpong tile): an entry measured against
    the model's pick answers the moved pick; a winner of an odd-width pingpong tile, recorded without the staging
    field, is staged as the planner's own would be; a winner that kept the model's 128x128 stays it."""
    visible_h200(monkeypatch)
    plan = Gemm("bf16", "tn", m=384, n=3072, k=2048)
    model, pick = plan.estimate.model_config, plan.estimate.config
    assert model.tile[:2] == (128, 128) and pick.tile[:2] == (128, 80) and pick.staging_in_ring
    assert "128x80 by rule" in plan.why and "D staged in the ring" in plan.why
    key = entry_key(_space(plan._request), plan._request.problem, pick)

    def measured(winner):
        fields_then = {k: v for k, v in config_fields(winner).items() if k != "staging_in_ring"}
        return Entry(key=key, kernel=winner.name, config=fields_then, ms=0.05, estimate_ms=0.055,
                     estimate_kernel=model.name, candidates=12, date="2026-11-27T10:00:00Z")

    odd = replace(model, tile=(128, 80, 64), stages=7, raster="n")
    ship(tables, [measured(odd)])
    again = Gemm("bf16", "tn", m=384, n=3072, k=2048)
    assert again.tuned is not None and again.config == replace(odd, staging_in_ring=True, stages=8)
    kept = replace(model, raster="n")
    ship(tables, [measured(kept)])
    assert Gemm("bf16", "tn", m=384, n=3072, k=2048).config == kept
