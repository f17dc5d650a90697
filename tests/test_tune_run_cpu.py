"""A whole tuning run on the CPU, with the GPU's parts stood in for: the builds succeed (or one fails), each
candidate's op multiplies on the CPU and reports a made-up time per call. What is checked is the run's logic:
the fastest correct candidate wins, a wrong one is not timed, the budget, the record in the cache, the table,
the progress bars, and the second call answering from the cache. tests/gpu/test_tune.py does it for real."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from generator import Gemm  # noqa: E402
from generator.gemm import _space  # noqa: E402
from generator.tune import candidates, measure, timing, tuner  # noqa: E402
from generator.tune.cache import table_path  # noqa: E402
from tune_cases import H100  # noqa: E402


class FakeFlush:
    """The L2 flush without a GPU: nothing to write, nothing to hold."""

    def __init__(self, device=None) -> None:
        self.lead_s = 0.0

    def cover(self, host_s: float) -> None:
        self.lead_s = max(self.lead_s, host_s)

    def __call__(self) -> None:
        pass


class FakeGpu:
    """Per kernel name: its time per call (ms) and whether it computes garbage; the last call's time."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self.wrong: set[str] = set()
        self.fail_build: set[str] = set()
        self.confirm_ms: dict[str, float] = {}   # the times once fresh operands are drawn (the confirmation)
        self.operand_draws = 0
        self.last = 0.0

    def op(self, name: str):
        def call(A, B, *operands):
            times = self.confirm_ms if self.operand_draws > 1 and name in self.confirm_ms else self.ms
            self.last = times.get(name, 1.0)
            D = A.float() @ B.float()
            return torch.zeros_like(D) if name in self.wrong else D
        return call


def candidate_names(plan: Gemm, cap: int) -> list[str]:
    return [c.name for c in candidates(_space(plan._request), plan._request.problem, plan.estimate.config, cap)]


@pytest.fixture
def gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    fake = FakeGpu()
    monkeypatch.setenv("GEMMGEN_TUNING_DIR", str(tmp_path / "tuning"))
    monkeypatch.delenv("GEMMGEN_TUNED", raising=False)
    monkeypatch.setattr(tuner, "current_device", lambda **_: H100)
    monkeypatch.setattr(measure, "build_all", lambda configs, progress: (
        [c for c in configs if c.name not in fake.fail_build],
        "nvcc failed to build x\n  error" if fake.fail_build else None))
    monkeypatch.setattr(measure, "compile_many", lambda configs, namespace: [fake.op(c.name) for c in configs])

    def operands(cfg, problem, seed=None):
        fake.operand_draws += 1
        gen = torch.Generator().manual_seed(0)
        return torch.randn(problem.m, problem.k, generator=gen), torch.randn(problem.k, problem.n, generator=gen), []

    monkeypatch.setattr(measure, "make_operands", operands)
    monkeypatch.setattr(measure, "L2Flush", FakeFlush)

    def time_calls(fn, calls, flush):
        fn()
        return [fake.last] * calls

    monkeypatch.setattr(timing, "time_calls", time_calls)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return fake


def test_the_fastest_correct_candidate_wins(gpu: FakeGpu, capsys: pytest.CaptureFixture[str]) -> None:
    plan = Gemm("bf16", "tn", arch=90, m=64, n=96, k=128)
    names = candidate_names(plan, 6)
    gpu.ms = {name: 1.0 + 0.1 * i for i, name in enumerate(names)}
    gpu.ms[names[3]] = 0.5     # the fastest
    gpu.ms[names[4]] = 0.1     # faster still, but wrong
    gpu.wrong = {names[4]}
    gpu.fail_build = {names[5]}
    result = plan.tune(max_candidates=6)
    assert result.winner.name == names[3] and result.ms == 0.5 and result.pick_ms == 1.0
    assert abs(result.gain - 1.0) < 1e-12
    rows = {row.config.name: row for row in result.table}
    assert rows[names[4]].ms is None and rows[names[4]].note.startswith("wrong result")
    assert rows[names[5]].ms is None and rows[names[5]].note == "build failed"
    assert any("failed to build" in n for n in result.notes)
    assert plan.config.name == names[3] and "tuned:" in str(plan) and "(+100.0 %)" in str(plan)
    assert table_path(H100).is_file()
    text = result.format()
    assert text.splitlines()[2].startswith(f"  * {names[3]}") and "estimate's pick" in text
    assert "timing" in capsys.readouterr().err    # the progress bar
    # the second time: from the cache, nothing measured
    gpu.ms = {}
    again = Gemm("bf16", "tn", arch=90).tune(m=64, n=96, k=128, progress=False)
    assert again.from_cache and again.winner.name == names[3] and again.ms == 0.5


def test_the_budget_times_the_pick_only(gpu: FakeGpu) -> None:
    plan = Gemm("bf16", "tn", arch=90, m=64, n=96, k=128)
    result = plan.tune(max_candidates=5, budget_s=1e-9, progress=False)
    timed = [row for row in result.table if row.ms is not None]
    assert [row.config.name for row in timed] == [plan.estimate.config.name]
    assert sum(row.note == "not timed: the budget was spent" for row in result.table) == 4
    assert any("budget was spent: 4 candidate(s)" in n for n in result.notes)
    assert any("1 of 5 timing rounds" in n for n in result.notes)


def test_a_small_m_shape_has_one_candidate(gpu: FakeGpu) -> None:
    result = Gemm("bf16", "tn", arch=90, m=16, n=256, k=256).tune(progress=False)
    assert len(result.table) == 1 and result.winner == result.pick
    assert any("small-M kernel" in n for n in result.notes)


def test_force_measures_again(gpu: FakeGpu) -> None:
    plan = Gemm("bf16", "tn", arch=90, m=64, n=96, k=128)
    plan.tune(max_candidates=2, progress=False)
    assert not plan.tune(max_candidates=2, progress=False, force=True).from_cache


def test_a_gain_within_the_noise_keeps_the_pick(gpu: FakeGpu) -> None:
    plan = Gemm("bf16", "tn", arch=90, m=64, n=96, k=128)
    pick = plan.estimate.config.name
    gpu.ms = {pick: 1.0}
    for name in candidate_names(plan, 3)[1:]:
        gpu.ms[name] = 0.995
    result = plan.tune(max_candidates=3, progress=False)
    assert result.winner.name == pick and result.gain == 0.0
    assert any("the pick is kept" in n for n in result.notes)


def test_a_winner_must_win_again_on_fresh_operands(gpu: FakeGpu) -> None:
    """The fastest of the main rounds is timed against the pick once more; a lead that does not hold keeps the
    pick, one that holds wins."""
    plan = Gemm("bf16", "tn", arch=90, m=64, n=96, k=128)
    pick, other = candidate_names(plan, 2)
    gpu.ms = {pick: 1.0, other: 0.9}
    gpu.confirm_ms = {other: 1.02}
    result = plan.tune(max_candidates=2, progress=False)
    assert result.winner.name == pick
    assert any("timed again on fresh operands: the pick is kept" in n for n in result.notes), result.notes
    gpu.confirm_ms = {other: 0.92}
    again = plan.tune(max_candidates=2, progress=False, force=True)
    assert again.winner.name == other and not any("timed again" in n for n in again.notes)


def test_a_budget_of_no_time_is_refused(gpu: FakeGpu) -> None:
    with pytest.raises(ValueError, match=r"budget_s=0: give a positive number of seconds"):
        Gemm("bf16", "tn", arch=90, m=64, n=96, k=128).tune(budget_s=0, progress=False)
