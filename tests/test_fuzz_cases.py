"""gpu/fuzz.py on the CPU: the cases are a function of their seed (a replay draws the same case), they stay within
the size caps, 500 draws cover every op, layout, form and storage feature and the edges, every op of every family x
dtype plans; and the runner, driven by a torch stand-in for the op on CPU tensors, passes right answers, counts
documented refusals apart, and fails wrong numbers, NaN, writes into inputs, undocumented refusals and crashes."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from generator.runtime.evaluate import evaluate, operand_values  # noqa: E402
from generator.spec.types import Order  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _load_fuzz():
    if "gemmgen_gpu_fuzz" in sys.modules:
        return sys.modules["gemmgen_gpu_fuzz"]
    spec = importlib.util.spec_from_file_location("gemmgen_gpu_fuzz", ROOT / "gpu" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # (dataclasses look their module up while the file runs)
    spec.loader.exec_module(module)
    return module


fuzz = _load_fuzz()
COMBOS = [(f, d) for f in fuzz.FAMILIES for d in fuzz.DEFAULT_DTYPES]
DRAWS = 500


@pytest.fixture(scope="module")
def drawn() -> dict[tuple[str, str], list]:
    return {(f, d): fuzz.draw_cases(7, f, d, DRAWS) for f, d in COMBOS}


def test_cases_are_a_function_of_their_seed(drawn):
    for (family, dtype), cases in drawn.items():
        assert cases[:50] == fuzz.draw_cases(7, family, dtype, 50)[:50]   # (then each count's cases along K)
        assert len({c.seed for c in cases}) == len(cases)
        assert fuzz.draw_cases(8, family, dtype, 50) != cases[:50]


def test_replay_key_draws_the_same_case(drawn):
    for cases in drawn.values():
        for case in cases[::25]:
            family, dtype, seed = fuzz.parse_key(case.key)
            assert fuzz.draw_case(family, dtype, seed) == case
            assert fuzz.replay_command(case).endswith(f"--replay {case.key}")
    for bad in ("sm90:bf16", "sm70:bf16:1", "sm90:fp64:1", "sm90:bf16:x"):
        with pytest.raises(ValueError, match="family:dtype:seed"):
            fuzz.parse_key(bad)


def _views(case) -> list:
    views = list(case.a) + list(case.b) + ([case.out] if case.out is not None else [])
    return views + [o.view for o in case.operands if o.view is not None]


def test_sizes_and_storage_stay_in_bounds(drawn):
    for cases in drawn.values():
        for case in cases:
            assert all(0 <= s <= fuzz.MAX_SIZE for p in case.problems for s in p), case.text()
            assert case.volume <= fuzz.MAX_VOLUME, case.text()
            batch = case.batch if case.form == "batched" else 1
            for m, n, k in case.problems:
                assert max(m * n, m * k, k * n) * max(batch, 1) <= fuzz.MAX_ELEMENTS, case.text()
            for view in _views(case):
                assert view.extent <= 2 * fuzz.MAX_ELEMENTS + 4096 and view.offset >= 0
                assert len(view.shape) == len(view.strides)
            if case.form == "batched":
                assert case.batch >= 1 and any(len(v.shape) == 3 for v in case.a + case.b)
            if case.form in ("plain", "batched"):
                assert len(case.a) == len(case.b) == len(case.problems) == 1
            elif case.form == "grouped_k":   # A (M, K) and B (K, N), K the groups' total; D (E, M, N)
                m, n = case.problems[0][:2]
                k = sum(p[2] for p in case.problems)
                assert all(p[:2] == (m, n) for p in case.problems) and case.seed >= fuzz.K_SEED_BASE
                assert case.a[0].shape == (m, k) and case.b[0].shape == (k, n) and not case.operands
                assert max(m * k, k * n, len(case.problems) * m * n) <= fuzz.MAX_ELEMENTS, case.text()
            elif case.form in ("grouped", "masked"):
                n, k = case.problems[0][1:]
                assert all(p[1:] == (n, k) for p in case.problems)
                assert case.b[0].shape == (len(case.problems), k, n) and not case.operands
                if case.form == "masked":   # slabs back to back, each at least its group's rows
                    groups, slab = len(case.problems), case.batch
                    assert all(p[0] <= slab for p in case.problems), case.text()
                    assert case.a[0].shape == (groups, slab, k), case.text()
                    if fuzz.op_spec(case.family, case.dtype, case.op).a_row:
                        assert case.a[0].strides == (max(slab, 1) * max(k, 1), max(k, 1), 1), case.text()
                    assert groups * slab * max(n, k) <= fuzz.MAX_ELEMENTS, case.text()
            else:
                assert len(case.a) == len(case.b) == len(case.problems)


def test_matrices_have_the_ops_storage_order(drawn):
    """A and B follow the op's layout, a leading dimension covers its rows, 3-D matrices do not overlap."""
    for (family, dtype), cases in drawn.items():
        for case in cases:
            spec = fuzz.op_spec(family, dtype, case.op)
            for view, row in [(v, spec.a_row) for v in case.a] + [(v, spec.b_row) for v in case.b]:
                rows, cols = view.shape[-2:]
                inner, ld = (view.strides[-1], view.strides[-2]) if row else (view.strides[-2], view.strides[-1])
                assert inner == 1 and ld >= max(cols if row else rows, 1), case.text()
                if len(view.shape) == 3 and view.shape[0] > 1 and view.strides[0]:
                    assert view.strides[0] >= max(rows if row else cols, 1) * ld, case.text()


def test_500_draws_cover_ops_layouts_forms_and_features(drawn):
    for (family, dtype), cases in drawn.items():
        specs = fuzz.ops_for(family, dtype)
        assert {c.op for c in cases} == {s.key for s in specs}
        assert {fuzz.op_spec(family, dtype, c.op).layout for c in cases} == set(fuzz.LAYOUTS)
        forms = {c.form for c in cases}
        assert forms == set(fuzz.FORMS), forms   # sm80's grouped forms: drawn to be refused
        by_form = {f: [c for c in cases if c.form == f and fuzz.op_spec(family, dtype, c.op).fits(family, f)]
                   for f in fuzz.FORMS}
        assert len(by_form["plain"]) > 150 and len(by_form["batched"]) > 80
        if family == "sm90":
            assert len(by_form["grouped"]) > 40 and len(by_form["list"]) > 40 and len(by_form["grouped_k"]) > 20
        features = fuzz.distribution(cases)["features"]
        for feature in ("operand off the 16-byte rule", "operand with a padded leading dimension", "batch stride 0",
                        "3-D batch of one", "2-D operand of a batched call", "K = 0", "out= poisoned",
                        "out=C in place", "input scale 1/sqrt(K)"):
            assert features.get(feature, 0) > 0, (family, dtype, feature)
        if family == "sm90":
            assert features["empty group or problem"] > 10
        sizes = [s for c in cases for p in c.problems for s in p]
        for edge in (1, 2, 7, 8, 9, 127, 128, 129, 255, 256, 257):
            assert edge in sizes, (family, dtype, edge)
        assert 0 in sizes and max(sizes) > 4096
        assert sum(1 <= s <= 16 for s in sizes) > len(sizes) / 10       # small and large both drawn often
        assert sum(s > 1024 for s in sizes) > len(sizes) / 10
        kinds = {o.kind for c in cases for o in c.operands}
        assert kinds == {"scalar", "scalar_tensor", "row", "col", "matrix"}


@pytest.mark.parametrize("dtype", fuzz.DTYPES)
@pytest.mark.parametrize("family", fuzz.FAMILIES)
def test_every_op_plans(family, dtype):
    """Every op of the set plans (arch 90: both families), distinct kernels, and its epilogue is the drawn one."""
    specs = fuzz.ops_for(family, dtype)
    if dtype in ("e4m3", "e5m2") and family == "sm80":
        assert specs == ()
        return
    configs = [s.config(family, dtype, 90) for s in specs]
    assert len({c.name for c in configs}) == len(specs)
    assert all(c.family == family for c in configs)
    for spec, cfg in zip(specs, configs):
        assert [(o.name, o.kind) for o in cfg.epilogue.operands] == \
               [(o.name, o.kind) for o in spec.description().operands]
        assert cfg.out_dtype.value == spec.out_dtype(dtype) and cfg.stream_k == spec.stream_k
    cases = fuzz.draw_cases(3, family, dtype, 60)
    assert {c.dtype for c in cases} == {dtype}


def test_refusals_are_few_and_as_documented(drawn):
    for (family, dtype), cases in drawn.items():
        configs = {s.key: s.config(family, dtype, 90) for s in fuzz.ops_for(family, dtype)}
        reasons = [fuzz.expected_refusal(c, configs[c.op]) for c in cases]
        refused = [r for r in reasons if r]
        assert 0 < len(refused) < 0.12 * len(cases), (family, dtype, len(refused))
        for case, reason in zip(cases, reasons):
            if case.form == "plain":
                assert reason is None
            if family == "sm80" and case.form in ("grouped", "list"):
                assert reason is not None


def test_sample_is_small_nested_and_runs_kernels(drawn):
    for (family, dtype), cases in drawn.items():
        big, small = fuzz.sample_indices(cases, 12, 0), fuzz.sample_indices(cases, 4, 0)
        assert len(big) == 12 and set(small) <= set(big)
        chosen = [cases[i] for i in big]
        assert all(c.volume <= fuzz.SAMPLE_MAX_VOLUME for c in chosen)
        assert all(fuzz.op_spec(family, dtype, c.op).fits(family, c.form) for c in chosen)
        wanted = {"plain", "batched"} | ({"grouped", "list", "masked", "grouped_k"} if family == "sm90" else set())
        assert {c.form for c in chosen} == wanted


def test_error_measure():
    ref = torch.randn(3, 40, 50, dtype=torch.float64)
    assert fuzz.relative_error(ref.float(), ref) < 1e-6
    wrong = ref.clone()
    wrong[1, 0, 0] += 100.0   # one problem's error is not averaged away by the others
    assert fuzz.relative_error(wrong, ref) > 0.5
    nan = ref.clone()
    nan[2, 3, 4] = float("nan")
    assert fuzz.relative_error(nan, ref) == math.inf
    zeros = torch.zeros(4, 5, dtype=torch.float64)
    assert fuzz.relative_error(zeros.bfloat16(), zeros) == 0.0
    assert fuzz.relative_error(zeros.bfloat16() + 1e-3, zeros) == math.inf   # a zero reference is exact
    small, floor = torch.full((1, 1), 1e-3, dtype=torch.float64), torch.full((1, 1), -5.0, dtype=torch.float64)
    assert fuzz.relative_error(small + 1e-3, small) == pytest.approx(1.0)
    assert fuzz.relative_error(small + 1e-3, small, [(0.1, floor)]) == pytest.approx(1e-3 / 0.5)
    assert fuzz.relative_error(small + 1e-3, small, [(0.1, floor), (1.0, -floor)]) == pytest.approx(1e-3 / 5)
    a, b = torch.tensor([[1.0, -1.0]], dtype=torch.float64), torch.tensor([[1.0], [1.0 + 1e-9]], dtype=torch.float64)
    assert fuzz.magnitude(a, b).item() == pytest.approx(2 ** 0.5)   # the sum cancels, its rounding scale does not
    assert fuzz.relative_error(torch.empty(0, 3), torch.empty(0, 3, dtype=torch.float64)) == 0.0


def test_views_materialize_with_nan_padding():
    view = fuzz.matrix_view(3, 5, False, 7, offset=2, batch=2, batch_stride=40)
    gen = torch.Generator().manual_seed(1)
    buf, t = fuzz.materialize(view, torch.bfloat16, gen, "cpu")
    assert t.shape == (2, 3, 5) and t.stride() == (40, 1, 7) and buf.numel() == view.extent
    assert torch.isfinite(t).all() and torch.isnan(buf).sum() == buf.numel() - 30
    assert fuzz.padding_intact(buf, view)
    buf[0] = 1.0
    assert not fuzz.padding_intact(buf, view)
    shared = fuzz.matrix_view(4, 3, True, 8, batch=5, batch_stride=0)
    _, s = fuzz.materialize(shared, torch.float16, gen, "cpu")
    assert s.stride()[0] == 0 and torch.isfinite(s).all()
    _, q = fuzz.materialize(fuzz.matrix_view(4, 4, True, 16), torch.int8, gen, "cpu")
    assert q.dtype == torch.int8
    row = fuzz.matrix_view(1, 7, True, 16)   # one row: the rule reads its length (as checks.leading_dim)
    assert fuzz.effective_ld(row, True) == 7 and fuzz.breaks_16_bytes(row, True, 2)
    assert not fuzz.breaks_16_bytes(fuzz.matrix_view(2, 7, True, 16), True, 2)
    assert fuzz.breaks_16_bytes(fuzz.matrix_view(2, 8, True, 8, batch=3, batch_stride=20), True, 2)


# -- the runner, with a torch stand-in for the op ----------------------------------------------------------------------

class ReferenceOp:
    """What a GemmOp's calls return, computed by torch on the CPU (float64, cast to D's dtype), in the plan's order of
    D; it refuses a call with ValueError exactly when told to (the case's documented refusal)."""

    def __init__(self, config: Any, refuse: str | None = None) -> None:
        self.config, self.refuse = config, refuse
        self.out_dtype = fuzz.TORCH[config.out_dtype.value]
        self.name = f"reference({config.name})"

    def _check(self) -> None:
        if self.refuse:
            raise ValueError(f"{self.name}: {self.refuse}")

    def _store(self, value: torch.Tensor) -> torch.Tensor:
        if self.config.layout.c is Order.col:
            return value.transpose(-1, -2).contiguous().transpose(-1, -2).to(self.out_dtype)
        return value.to(self.out_dtype).contiguous()

    def __call__(self, A: Any, B: Any, *values: Any, out: torch.Tensor | None = None) -> Any:
        self._check()
        if isinstance(A, list):
            return [self._store(fuzz.to64(a) @ fuzz.to64(b)) for a, b in zip(A, B)]
        ep = self.config.epilogue
        a, b = fuzz.to64(A), fuzz.to64(B)
        if ep.scale_mode == "block":   # scale_a[m, k // 128] and scale_b[n // 128, k // 128], by index
            k, n = torch.arange(a.shape[-1]) // 128, torch.arange(b.shape[-1]) // 128
            a = a * values[0].double()[:, k]
            b = b * values[1].double()[n][:, k].t()
        d, aux = evaluate(ep, a @ b, operand_values(ep, values, torch.float64))
        if out is not None:
            return out.copy_(d)
        return (self._store(d), self._store(aux)) if aux is not None else self._store(d)

    def grouped(self, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        self._check()
        if B.dim() == 2:   # groups along K: D (E, M, N)
            ends = [0, *offsets.tolist()]
            return self._store(torch.stack([fuzz.to64(A[:, s:e]) @ fuzz.to64(B[s:e]) for s, e in zip(ends, ends[1:])])
                               if len(ends) > 1 else torch.empty(0, A.shape[0], B.shape[1], dtype=torch.float64))
        D, start = torch.empty(A.shape[0], B.shape[-1], dtype=torch.float64), 0
        for g, end in enumerate(offsets.tolist()):
            D[start:end] = fuzz.to64(A[start:end]) @ fuzz.to64(B[g])
            start = end
        return self._store(D)

    def masked(self, A: torch.Tensor, B: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        self._check()
        D = torch.full((A.shape[0], A.shape[1], B.shape[-1]), float("nan"), dtype=torch.float64)
        for g, count in enumerate(counts.tolist()):   # the rows past a count stay unwritten (NaN here)
            D[g, :count] = fuzz.to64(A[g, :count]) @ fuzz.to64(B[g])
        return self._store(D)

    def path(self, *args: Any, **kwargs: Any) -> str:
        return "reference"


def _small_cases(family: str, dtype: str, count: int) -> list:
    cases = fuzz.draw_cases(11, family, dtype, 300)
    return [cases[i] for i in fuzz.sample_indices(cases, count, 11)]


def _config(case) -> Any:
    return fuzz.op_spec(case.family, case.dtype, case.op).config(case.family, case.dtype, 90)


@pytest.mark.parametrize("family, dtype", COMBOS + [("sm80", "tf32"), ("sm90", "e4m3"), ("sm90", "int8")])
def test_runner_passes_right_answers_of_every_form(family, dtype):
    cases = _small_cases(family, dtype, 16)
    if dtype == "e4m3":   # and per-block scales, whose reference the harness computes its own way
        cases += [c for c in fuzz.draw_cases(11, family, dtype, 300) if c.op == "tn_sblock" and c.volume < 1 << 20]
    assert {c.form for c in cases} >= {"plain", "batched"}
    for case in cases:
        cfg = _config(case)
        outcome = fuzz.run_case(case, ReferenceOp(cfg, fuzz.expected_refusal(case, cfg)), device="cpu")
        assert outcome.status in ("passed", "refused"), (case.text(), outcome)
        assert outcome.status == "passed" or outcome.predicted, case.text()
        assert outcome.error <= outcome.bound


def _first(family: str, form: str, predicate=lambda case: True):
    cases = fuzz.draw_cases(5, family, "bf16", 400)
    for case in cases:
        spec = fuzz.op_spec(case.family, case.dtype, case.op)
        if case.form == form and spec.fits(family, form) and case.volume <= 1 << 20 and predicate(case):
            return case
    raise AssertionError(f"no {form} case")


class WrongOp(ReferenceOp):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = super().__call__(*args, **kwargs)
        first = result[0] if isinstance(result, (tuple, list)) else result
        first[(0,) * first.dim()] += 1000.0
        return result


class NaNOp(ReferenceOp):
    def grouped(self, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        D = super().grouped(A, B, offsets)
        D[-1, -1] = float("nan")   # an element the kernel never wrote
        return D


class WritesInputOp(ReferenceOp):
    def __call__(self, A: Any, B: Any, *values: Any, **kwargs: Any) -> Any:
        result = super().__call__(A, B, *values, **kwargs)
        A[(0,) * A.dim()] = 3.0
        return result


class RefusesOp(ReferenceOp):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("A has strides (1, 1): this plan was made for ...")


class CrashesOp(ReferenceOp):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("sm90_bf16_tn: launch failed: CUDA error: an illegal memory access was encountered")


class PaddingOp(ReferenceOp):
    def __call__(self, A: Any, B: Any, *values: Any, out: torch.Tensor | None = None) -> Any:
        result = super().__call__(A, B, *values, out=out)
        size = out.untyped_storage().nbytes() // out.element_size()
        inside = torch.zeros(size, dtype=torch.bool)
        inside.as_strided(out.shape, out.stride(), out.storage_offset()).fill_(True)
        padding = (~inside).nonzero()[0, 0]   # the first element of out's buffer outside the view
        out.as_strided((size,), (1,), 0)[padding] = 0.0
        return result


def test_runner_fails_wrong_numbers_nan_and_writes_into_inputs():
    case = _first("sm90", "plain", lambda c: min(c.problems[0]) > 0)
    cfg = _config(case)
    outcome = fuzz.run_case(case, WrongOp(cfg), device="cpu")
    assert outcome.status == "failed" and "relative error" in outcome.message
    outcome = fuzz.run_case(case, WritesInputOp(cfg), device="cpu")
    assert outcome.status == "failed" and "wrote into its input A" in outcome.message
    grouped = _first("sm90", "grouped", lambda c: sum(p[0] for p in c.problems) > 0 and min(c.problems[0][1:]) > 0)
    outcome = fuzz.run_case(grouped, NaNOp(_config(grouped), fuzz.expected_refusal(grouped, _config(grouped))),
                            device="cpu")
    assert outcome.status == "failed" and math.isinf(outcome.error) and "non-finite" in outcome.message
    masked = _first("sm90", "masked", lambda c: c.problems[0][0] > 0 and min(c.problems[0][1:]) > 0)
    cfg = _config(masked)
    assert fuzz.run_case(masked, ReferenceOp(cfg), device="cpu").status == "passed"
    outcome = fuzz.run_case(masked, ShiftedSlabsOp(cfg), device="cpu")
    assert outcome.status == "failed" and "relative error" in outcome.message, outcome


class ShiftedSlabsOp(ReferenceOp):
    """A masked call that takes group g's rows from where the offsets form would (the previous group's end)."""

    def masked(self, A: torch.Tensor, B: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        rows, ends = A.reshape(-1, A.shape[-1]), torch.cumsum(counts, 0).to(torch.int32)
        packed = super().grouped(rows[:int(ends[-1])], B, ends)
        D = torch.full((A.shape[0], A.shape[1], B.shape[-1]), float("nan"), dtype=packed.dtype)
        for g, count in enumerate(counts.tolist()):
            D[g, :count] = packed[int(ends[g]) - count:int(ends[g])]
        return D


def test_runner_fails_writes_past_the_output():
    case = _first("sm80", "plain", lambda c: c.out is not None and not c.in_place
                  and c.out.extent > math.prod(c.out.shape))
    outcome = fuzz.run_case(case, PaddingOp(_config(case)), device="cpu")
    assert outcome.status == "failed" and "padding" in outcome.message, outcome


def test_runner_sorts_refusals_and_crashes():
    case = _first("sm90", "plain")
    outcome = fuzz.run_case(case, RefusesOp(_config(case)), device="cpu")
    assert outcome.status == "failed" and "refused a documented call" in outcome.message
    outcome = fuzz.run_case(case, CrashesOp(_config(case)), device="cpu")
    assert outcome.status == "failed" and outcome.fatal
    cases = fuzz.draw_cases(5, "sm80", "bf16", 400)
    probe = next(c for c in cases if c.form in ("grouped", "list"))
    cfg = _config(probe)
    assert fuzz.expected_refusal(probe, cfg) is not None
    outcome = fuzz.run_case(probe, RefusesOp(cfg, fuzz.expected_refusal(probe, cfg)), device="cpu")
    assert outcome.status == "refused" and outcome.predicted


def test_tally_and_summary(capsys):
    tally = fuzz.Tally("sm90", "bf16")
    case = _first("sm90", "plain")
    tally.add(case, fuzz.Outcome("passed", error=1e-3, bound=1e-2, path="fast"))
    tally.add(case, fuzz.Outcome("refused", bound=1e-2, predicted="grouped calls run on the sm90 family"))
    tally.add(case, fuzz.Outcome("failed", error=math.inf, bound=1e-2, path="fast"))
    assert (tally.cases, tally.passed, tally.refused, tally.failed) == (3, 1, 1, 1)
    assert math.isinf(tally.worst_ratio) and tally.as_dict()["worst_ratio"] is None
    fuzz.print_summary([tally])
    out = capsys.readouterr().out
    assert "sm90" in out and "inf" in out and "refused as documented" in out
    record = fuzz.report_failure(case, fuzz.Outcome("failed", error=0.5, bound=1e-2, message="x"), "k")
    assert record["replay"] == f"python3 gpu/fuzz.py --replay {case.key}" and record["case"]["seed"] == case.seed
    assert f"--replay {case.key}" in capsys.readouterr().out


def test_cli_dry_run_and_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        fuzz.main(["--help"])
    assert exit_info.value.code == 0 and "--replay" in capsys.readouterr().out
    assert fuzz.main(["--dry-run", "--cases", "30", "--show", "2", "--dtypes", "bf16", "--arch", "90"]) == 0
    out = capsys.readouterr().out
    # 30 cases each and their cases along K (one in 50 for sm80, one in 8 for sm90)
    assert "sm80 x bf16: 31 cases" in out and "sm90 x bf16: 34 cases" in out and "coverage:" in out
    key = fuzz.draw_cases(0, "sm90", "fp16", 1)[0].key
    assert fuzz.main(["--dry-run", "--replay", key]) == 0
    assert key in capsys.readouterr().out
    assert fuzz.main(["--dry-run", "--families", "sm80", "--dtypes", "e4m3"]) == 0
    assert "skipped" in capsys.readouterr().out
    assert fuzz.main(["--replay", "sm90:bf16"]) == 2
    with pytest.raises(SystemExit):
        fuzz.main(["--dtypes", "fp64"])
    if not torch.cuda.is_available():
        assert fuzz.main(["--cases", "1"]) == 2
