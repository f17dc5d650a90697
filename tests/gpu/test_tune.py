"""Measured tuning on the GPU (generator/tune): a small shape over a few candidates, the winner among them and
correct, the plan switched to it, a second tune answered from the cache in under a second, a wrong kernel never
winning, the budget, the M buckets. Each test has its own tuning table (GEMMGEN_TUNING_DIR); builds share the
build cache."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from generator import Gemm
from generator.tune import measure

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def tuning_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GEMMGEN_TUNING_DIR", str(tmp_path / "tuning"))
    monkeypatch.delenv("GEMMGEN_TUNED", raising=False)
    return tmp_path / "tuning"


def relative_error(plan: Gemm, m: int, n: int, k: int) -> float:
    op = plan.compile()
    A = torch.randn(m, k, device="cuda").bfloat16()
    B = torch.randn(n, k, device="cuda").bfloat16().t()
    ref = A.float() @ B.float()
    return ((op(A, B).float() - ref).norm() / ref.norm()).item()


def test_tune_a_small_shape_then_answer_from_the_cache() -> None:
    m, n, k = 256, 512, 1024
    plan = Gemm("bf16", "tn", m=m, n=n, k=k)
    pick = plan.estimate.config
    result = plan.tune(max_candidates=4, progress=False)
    names = [row.config.name for row in result.table]
    assert len(names) <= 4 and names[0] == pick.name and result.winner.name in names
    assert not result.from_cache and 0 < result.ms <= result.pick_ms
    assert all(row.ms is not None for row in result.table), result.format()
    assert plan.config == result.winner and plan.tuned is not None
    assert "tuned:" in str(plan) and result.device.gpu in str(plan)
    assert relative_error(plan, m, n, k) < 1e-2
    print(result.format())

    start = time.perf_counter()
    again = Gemm("bf16", "tn").tune(m=m, n=n, k=k, progress=False)
    seconds = time.perf_counter() - start
    assert again.from_cache and again.winner == result.winner and seconds < 1.0, seconds
    fresh = Gemm("bf16", "tn", m=m, n=n, k=k)
    assert fresh.config == result.winner and fresh.estimate.config == pick


def test_the_switch_plans_by_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = Gemm("bf16", "tn", m=384, n=640, k=512)
    plan.tune(max_candidates=3, progress=False)
    monkeypatch.setenv("GEMMGEN_TUNED", "0")
    untuned = Gemm("bf16", "tn", m=384, n=640, k=512)
    assert untuned.tuned is None and untuned.config == untuned.estimate.config


def test_a_wrong_kernel_never_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    real = measure.compile_many

    def one_broken(configs, **kwargs):
        ops = real(configs, **kwargs)
        broken = ops[1]
        ops[1] = lambda A, B, *operands: torch.full_like(broken(A, B, *operands), float("nan"))
        return ops

    monkeypatch.setattr(measure, "compile_many", one_broken)
    plan = Gemm("bf16", "tn", m=512, n=512, k=512)
    result = plan.tune(max_candidates=3, progress=False, force=True)
    broken = result.table[1]
    assert broken.ms is None and broken.note.startswith("wrong result"), result.format()
    assert result.winner.name != broken.config.name


def test_the_budget_stops_further_candidates() -> None:
    plan = Gemm("bf16", "tn", m=640, n=768, k=1024)
    result = plan.tune(max_candidates=4, progress=False, budget_s=1e-3)
    timed = [row for row in result.table if row.ms is not None]
    assert [row.config.name for row in timed] == [plan.estimate.config.name]
    assert any("budget" in note for note in result.notes), result.notes
    assert "budget" in result.format()


def test_bucket_plans_take_their_winners() -> None:
    plan = Gemm("bf16", "tn", n=1024, k=1024)
    results = plan.tune_buckets(bounds=(64,), max_candidates=2, progress=False)
    # the bucket M <= 64, then the plan itself (it has size hints: M 4096 stands for every larger M)
    assert [r.problem.m for r in results] == [64, 4096]
    op = plan.compile_buckets(bounds=(64,))
    assert op.select(64).config == results[0].winner
    assert op.select(4096).config == results[1].winner


def test_an_emitted_package_routes_its_tuned_shape(tmp_path: Path) -> None:
    """emit(tuning=...) on this GPU: the package's op sends a call of exactly the tuned (M, N, K) to the winner's
    kernel and every other call to its own; both correct against float32. The winner is recorded by hand (a
    legal config other than the pick), so the route is there whatever a measurement would pick."""
    from dataclasses import replace

    from generator import emit
    from generator.gemm import _space
    from generator.tune import current_device, entry_key, load_tables
    from generator.tune.cache import Entry, config_fields, record, table_path
    from toolchain import find_cuda_home, pip_install_and_import

    cuda_home = find_cuda_home()
    if cuda_home is None:
        pytest.skip("nvcc not found (set CUDA_HOME): cannot build the emitted package")
    m, n, k = 384, 512, 256
    plan = Gemm("bf16", "tn", m=m, n=n, k=k)
    pick = plan.estimate.config
    winner = replace(pick, stages=pick.stages - 1)
    device = current_device()
    record(device, Entry(key=entry_key(_space(plan._request), plan._request.problem, pick), kernel=winner.name,
                         config=config_fields(winner), ms=0.010, estimate_ms=0.011, estimate_kernel=pick.name,
                         candidates=2, date="2026-11-26T00:00:00Z", seconds=1.0,
                         table=((pick.name, 0.011, ""), (winner.name, 0.010, ""))))
    package = emit([Gemm("bf16", "tn")], "gemmgen_gpu_tuned", tmp_path / "pkg", autograd=False,
                   tuning=load_tables(table_path(device)))
    module, _ = pip_install_and_import(package, "gemmgen_gpu_tuned", tmp_path, cuda_home)
    op_name = "gemm_bf16_tn"
    assert module._routed(op_name, torch.empty(m, k, device="cuda"), torch.empty(k, n, device="cuda")) \
        == getattr(torch.ops.gemmgen_gpu_tuned, f"_tuned_{winner.name}")
    assert module._routed(op_name, torch.empty(m + 1, k, device="cuda"), torch.empty(k, n, device="cuda")) \
        == getattr(torch.ops.gemmgen_gpu_tuned, op_name)
    for rows in (m, m + 1):
        A = torch.randn(rows, k, device="cuda").bfloat16()
        B = torch.randn(n, k, device="cuda").bfloat16().t()
        ref = A.float() @ B.float()
        D = getattr(module, op_name)(A, B)
        assert ((D.float() - ref).norm() / ref.norm()).item() < 1e-2


def test_the_timer_reads_the_kernel_not_the_host_gap() -> None:
    """A kernel shorter than its call's host path (64 x 768 x 2048: about 10 us behind 20-30 us of Python) reads
    what do_bench reads, not twice that: the flush holds the GPU until the call is enqueued (docs/defects.md, "The
    tuner timed the host's gap"). Without the hold it read 22.6 us against do_bench's 10.3."""
    import statistics

    from triton.testing import do_bench

    from generator.planner import Problem
    from generator.tune.timing import L2Flush, TimingSettings, make_operands, time_calls, warm_up

    plan = Gemm("bf16", "tn", m=64, n=768, k=2048)
    op = plan.compile()
    A, B, _ = make_operands(plan.config, Problem(64, 768, 2048))
    fn = lambda: op(A, B)  # noqa: E731
    flush = L2Flush(A.device)
    warm_up(fn, TimingSettings(), flush)
    ours = statistics.median(time_calls(fn, 50, flush))
    theirs = do_bench(fn, warmup=5, rep=25, return_mode="median")
    assert 0.8 < ours / theirs < 1.25, (ours, theirs, flush.lead_s)
