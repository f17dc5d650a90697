"""The backward of grouped GEMM on the GPU: dA and dB of ``op.grouped(A, B, offsets)`` and of ``op(As, Bs)``
(``op.grouped_list``), computed by generator/runtime/autograd.py's formulas on this generator's kernels
(docs/grouped.md, "Backward"):

* offsets form, dD (T, N): dA = dA-op.grouped(dD, B.transpose(1, 2), offsets), one launch; dB[g] = A[rows of g].t() @
  dD[rows of g], one grouped call along K on the dB op (dB-op.grouped(A.t(), dD, offsets); an empty group's dB[g] is
  zeros); a gradient off the 16-byte rule takes one list call, or one plain call per group, instead.
* list form: dA_i = dD_i @ B_i.t() and dB_i = A_i.t() @ dD_i, one list call each per storage order of the gradients,
  a problem whose gradient is off the 16-byte rule a plain call of its own; None where no gradient flows.

Plans: the offsets form on tn and tt, cooperative and pingpong (the plans that take grouped calls); the list form on
all four layouts (cooperative). Their backward kernels (a row-major gradient; for tn also a column-major one) are the
default sm90 plans of the backward layouts; all of them, forward and backward, are built in one parallel ninja run
(module fixture, 10 kernels: test_plans_and_kernel_count).

Each check draws fresh random inputs (leading dimensions padded to 16 bytes, NaN in the padding: a wrong leading
dimension reads NaN), runs the backward with torch.autograd.grad after a NaN-filled block of each gradient's size
went back to torch's caching allocator (an unwritten element likely reads NaN), and compares each gradient with the
float64 one: ||got - ref|| / ||ref|| at most gpu_cases.BOUND over the whole gradient and over every group (dA's rows
of the group, dB[g]); an empty group's dB[g] exactly zero; each gradient in its input's dtype, shape and storage order
(packed). Which path each backward took (the grouped call, the list call, or plain calls) is recorded and checked.
torch.autograd.gradcheck needs float64, which the kernels do not take: reference comparisons instead."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import gpu_cases  # noqa: E402
from gpu_cases import BOUND, IS_SM90, nan_padded, padded_ld, rel_error64 as rel_error  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.planner.backward import backward_configs  # noqa: E402
from generator.runtime import autograd, compile_many  # noqa: E402
from generator.runtime.autograd import grad_ops  # noqa: E402
from generator.spec.grouped import grouped_list_refusal, grouped_refusal  # noqa: E402
from generator.spec.types import Order  # noqa: E402

pytestmark = pytest.mark.gpu
NAMESPACE = "gemmgen_grouped_autograd_test"
DTYPE = torch.bfloat16

#: The offsets form's plans (sm90, a row-major A): tn and tt, cooperative and pingpong.
GROUPED_PLANS = {
    "tn_coop": dict(dtype="bf16", layout="tn", arch=90, schedule="cooperative"),
    "tn_pp": dict(dtype="bf16", layout="tn", arch=90, schedule="pingpong"),
    "tt_coop": dict(dtype="bf16", layout="tt", arch=90, schedule="cooperative"),
    "tt_pp": dict(dtype="bf16", layout="tt", arch=90, schedule="pingpong"),
}
#: The list form's plans: every layout (tn and tt shared with the offsets form).
LIST_PLANS = {"tn": "tn_coop", "tt": "tt_coop", "nn": "nn_coop", "nt": "nt_coop"}
PLANS = {**GROUPED_PLANS,
         "nn_coop": dict(dtype="bf16", layout="nn", arch=90, schedule="cooperative"),
         "nt_coop": dict(dtype="bf16", layout="nt", arch=90, schedule="cooperative")}
#: At most this many kernels are built (forward and backward together).
MAX_KERNELS = 12


def configs():
    """The forward configs, and every backward config the tests reach: a row-major gradient for every plan, a
    column-major one for tn_coop (test_list_backward_gradient_orders_and_fallback); deduplicated by name."""
    forward = {key: Gemm(**kw).config for key, kw in PLANS.items()}
    found = {cfg.name: cfg for cfg in forward.values()}
    for cfg in forward.values():
        for grad in backward_configs(cfg, Order.row):
            found.setdefault(grad.name, grad)
    for grad in backward_configs(forward["tn_coop"], Order.col):
        found.setdefault(grad.name, grad)
    return forward, found


@pytest.fixture(scope="module")
def ops():
    if not IS_SM90:
        pytest.skip("the grouped kernels need an sm_90 GPU")
    forward, every = configs()
    built = dict(zip(every, compile_many(list(every.values()), namespace=NAMESPACE)))   # one ninja run
    return {key: built[cfg.name] for key, cfg in forward.items()}


@pytest.fixture
def paths(monkeypatch):
    """What the formulas decided, in order: ("grouped", layout of the dA op, refused?) per offsets-form dA, ("list",
    layout, problem, refused?) per list problem with work."""
    found = []
    grouped_call, list_problem = autograd.grouped_call_refusal, autograd.list_problem_refusal

    def recording_grouped(grad_op, x, y):
        reason = grouped_call(grad_op, x, y)
        found.append(("grouped", grad_op.config.layout.tag, reason is not None))
        return reason

    def recording_list(grad_op, i, x, y):
        reason = list_problem(grad_op, i, x, y)
        found.append(("list", grad_op.config.layout.tag, i, reason is not None))
        return reason

    monkeypatch.setattr(autograd, "grouped_call_refusal", recording_grouped)
    monkeypatch.setattr(autograd, "list_problem_refusal", recording_list)
    return found


def test_plans_and_kernel_count():
    """The plans are what their ids say; the backward ops of the offsets form take the grouped call (dA) and the list
    call (dB), and those of the list form the list call, so that the tests below reach those paths and not only the
    fallback; at most MAX_KERNELS kernels in all."""
    forward, every = configs()
    assert len(every) <= MAX_KERNELS, sorted(every)
    for key, cfg in forward.items():
        assert cfg.family == "sm90" and cfg.schedule == PLANS[key]["schedule"] and not cfg.stream_k, key
        assert cfg.layout.blas == key[:2], key
        grad_a, grad_b = backward_configs(cfg, Order.row)
        if key in GROUPED_PLANS:
            assert grouped_refusal(cfg) is None and grouped_refusal(grad_a) is None, (key, grad_a.name)
        assert grouped_list_refusal(grad_a) is None and grouped_list_refusal(grad_b) is None, key


# -- operands and references ------------------------------------------------------------------------------------

def stored(rows: int, cols: int, order: str) -> torch.Tensor:
    return nan_padded(rows, cols, order, DTYPE)


def experts(count: int, rows: int, cols: int, order: str) -> torch.Tensor:
    return nan_padded(rows, cols, order, DTYPE, count)


def bounds(sizes) -> list[tuple[int, int]]:
    ends, total = [], 0
    for s in sizes:
        ends.append((total, total + s))
        total += s
    return ends


def upstream(rows: int, cols: int, kind: str) -> torch.Tensor:
    """dD: "row" (contiguous), "col" (column-major, its leading dimension padded to 16 bytes) or "unaligned" (a
    row-major slice of a wider buffer: base address and leading dimension off the 16-byte rule)."""
    if kind == "row":
        return torch.randn(rows, cols, device="cuda").to(DTYPE)
    if kind == "col":
        return torch.randn(cols, padded_ld(rows), device="cuda").to(DTYPE)[:, :rows].t()
    return torch.randn(rows, cols + 3, device="cuda").to(DTYPE)[:, 1:cols + 1]


def poison(*shapes) -> None:
    gpu_cases.poison(DTYPE, *shapes)


def check_grad(got, ref, t, what: str) -> None:
    gpu_cases.check_grad(got, ref, t, what, BOUND[DTYPE])


# -- the offsets form ----------------------------------------------------------------------------------------------

#: (label, group sizes, N, K): ragged groups with empty ones, E = 1, E = 17 (several empty), one group with rows,
#: multiples of 128, no rows at all.
OFFSETS_CASES = [
    ("ragged", [5, 0, 17, 130, 1], 72, 64),
    ("E=1", [200], 200, 72),
    ("E=17", [3, 0, 0, 8, 1, 160, 0, 5, 2, 7, 0, 0, 129, 4, 1, 0, 64], 72, 200),
    ("one group with rows", [0, 0, 256, 0], 200, 64),
    ("128 multiples", [128, 256, 128], 1000, 200),
    ("no rows", [0, 0], 72, 64),
]
#: Which inputs require grad.
NEEDS = {"A and B": (True, True), "only A": (True, False), "only B": (False, True)}


def grouped_inputs(op, sizes, n: int, k: int, need_a: bool, need_b: bool):
    layout = op.config.layout
    a = stored(sum(sizes), k, layout.a.value).requires_grad_(need_a)
    b = experts(len(sizes), k, n, layout.b.value).requires_grad_(need_b)
    offsets = torch.tensor([e for _, e in bounds(sizes)], dtype=torch.int32, device="cuda")
    return a, b, offsets


def check_grouped_backward(op, sizes, n, k, need_a, need_b, kind, what, via="method"):
    """One forward and backward against float64 (see the module docstring)."""
    a, b, offsets = grouped_inputs(op, sizes, n, k, need_a, need_b)
    if via == "method":
        d = op.grouped(a, b, offsets)
    else:
        d = getattr(getattr(torch.ops, NAMESPACE), op.name).grouped(a, b, offsets)
    g = upstream(sum(sizes), n, kind)
    wanted = [t for t, need in ((a, need_a), (b, need_b)) if need]
    poison((max(sum(sizes), 1), k), (len(sizes), k, n))
    got = dict(zip([name for name, need in (("A", need_a), ("B", need_b)) if need],
                   torch.autograd.grad(d, wanted, g)))
    torch.cuda.synchronize()
    a64, b64, g64 = a.detach().double(), b.detach().double(), g.double()
    if need_a:
        ref = torch.zeros_like(a64)
        for e, (start, end) in enumerate(bounds(sizes)):
            if end > start:
                ref[start:end] = g64[start:end] @ b64[e].t()
        check_grad(got["A"], ref, a, f"{what}: dA")
        for e, (start, end) in enumerate(bounds(sizes)):
            if end > start:
                err = rel_error(got["A"][start:end], ref[start:end])
                assert err <= BOUND[DTYPE], f"{what}: dA of group {e} (rows {start}:{end}) rel error {err:.3g}"
    if need_b:
        ref = torch.zeros_like(b64)
        for e, (start, end) in enumerate(bounds(sizes)):
            if end > start:
                ref[e] = a64[start:end].t() @ g64[start:end]
        check_grad(got["B"], ref, b, f"{what}: dB")
        for e, (start, end) in enumerate(bounds(sizes)):
            if end > start:
                err = rel_error(got["B"][e], ref[e])
                assert err <= BOUND[DTYPE], f"{what}: dB[{e}] (rows {start}:{end}) rel error {err:.3g}"
            else:
                assert torch.equal(got["B"][e], torch.zeros_like(got["B"][e])), f"{what}: dB[{e}] of an empty group"


@pytest.mark.parametrize("needs", NEEDS)
@pytest.mark.parametrize("plan", GROUPED_PLANS)
def test_grouped_backward_matches_float64(ops, paths, plan, needs):
    """dA and dB of op.grouped against float64, every case, on the grouped dA call and the dB call along K (one query
    of the dB op's refusal for the whole call, as problem 0)."""
    op = ops[plan]
    need_a, need_b = NEEDS[needs]
    for label, sizes, n, k in OFFSETS_CASES:
        paths.clear()
        check_grouped_backward(op, sizes, n, k, need_a, need_b, "row", f"{op.name} {label} ({needs})")
        # the paths: the grouped dA call, and dB in one call along K (none refused; no rows: nothing launched)
        assert [p for p in paths if p[0] == "grouped"] == ([("grouped", grad_ops(op)[0].config.layout.tag, False)]
                                                           if need_a else []), (label, paths)
        list_problems = [p for p in paths if p[0] == "list"]
        assert not any(p[-1] for p in list_problems), (label, paths)
        assert len(list_problems) == (1 if need_b and n and k and sum(sizes) else 0), (label, paths)


@pytest.mark.parametrize("plan", ["tn_coop", "tt_pp"])
def test_grouped_backward_other_gradients(ops, paths, plan):
    """A column-major gradient (copied row-major: the grouped dA kernel walks a row-major A) takes the same paths; a
    gradient off the 16-byte rule takes one plain call per group with rows (dA and dB: the call along K refused
    first), with the same results; the torch.ops overload too."""
    op = ops[plan]
    label, sizes, n, k = OFFSETS_CASES[0]
    check_grouped_backward(op, sizes, n, k, True, True, "col", f"{op.name} {label} column-major dD")
    assert [p[-1] for p in paths] == [False, False], paths   # the grouped dA call, the dB call along K
    paths.clear()
    check_grouped_backward(op, sizes, n, k, True, True, "unaligned", f"{op.name} {label} unaligned dD")
    assert paths[0] == ("grouped", grad_ops(op)[0].config.layout.tag, True) and all(p[-1] for p in paths), paths
    check_grouped_backward(op, sizes, n, k, True, True, "row", f"{op.name} {label} torch.ops", via="torch.ops")


def test_grouped_backward_without_grad_mode_builds_no_graph(ops):
    op = ops["tn_coop"]
    a, b, offsets = grouped_inputs(op, [5, 0, 17], 72, 64, True, True)
    with torch.no_grad():
        assert op.grouped(a, b, offsets).grad_fn is None
    assert op.grouped(a.detach(), b.detach(), offsets).grad_fn is None
    assert op.grouped(a, b, offsets).grad_fn is not None


# -- the list form -------------------------------------------------------------------------------------------------

#: (M, K, N) per problem: ragged sizes, a 1-row problem, M = 0, K = 0, N = 0.
LIST_CASES = {
    "ragged": [(5, 64, 72), (130, 200, 8), (17, 8, 200), (1, 72, 64)],
    "empty problems": [(0, 64, 16), (64, 0, 24), (33, 40, 0), (48, 16, 32)],
    "17 problems": [(8 * (i % 5) + i, 8 * (1 + i % 4), 8 * (1 + i % 3)) for i in range(17)],
}


def list_inputs(op, sizes, need_a: bool, need_b: bool):
    layout = op.config.layout
    a = [stored(m, k, layout.a.value).requires_grad_(need_a) for m, k, _ in sizes]
    b = [stored(k, n, layout.b.value).requires_grad_(need_b) for _, k, n in sizes]
    return a, b


def check_list_backward(op, sizes, need_a, need_b, kinds, what, used=None):
    """Forward and backward of a list call against float64; ``kinds[i]`` the kind of dD_i, ``used`` the problems whose
    output feeds the loss (the others get no gradient: None)."""
    a, b = list_inputs(op, sizes, need_a, need_b)
    d = op(a, b)
    used = list(range(len(sizes))) if used is None else used
    grads = {i: upstream(*d[i].shape, kinds[i]) for i in used}
    inputs = [t for t in (*a, *b) if t.requires_grad]
    poison(*[(max(m, 1), max(k, 1)) for m, k, _ in sizes])
    got = torch.autograd.grad([d[i] for i in used], inputs, [grads[i] for i in used], allow_unused=True)
    torch.cuda.synchronize()
    found = dict(zip([id(t) for t in inputs], got))
    for i, (x, y) in enumerate(zip(a, b)):
        for t, name, need in ((x, f"dA[{i}]", need_a), (y, f"dB[{i}]", need_b)):
            if not need:
                continue
            grad = found[id(t)]
            if i not in used:
                assert grad is None, f"{what}: {name} of a problem without a gradient"
                continue
            g64, x64, y64 = grads[i].double(), x.detach().double(), y.detach().double()
            ref = g64 @ y64.t() if name[1] == "A" else x64.t() @ g64
            check_grad(grad, ref, t, f"{what}: {name}")


@pytest.mark.parametrize("needs", NEEDS)
@pytest.mark.parametrize("layout", LIST_PLANS)
def test_list_backward_matches_float64(ops, paths, layout, needs):
    """dA_i and dB_i of a list call against float64, all four layouts, every case: one list call per gradient op,
    no problem refused."""
    op = ops[LIST_PLANS[layout]]
    need_a, need_b = NEEDS[needs]
    for label, sizes in LIST_CASES.items():
        paths.clear()
        check_list_backward(op, sizes, need_a, need_b, ["row"] * len(sizes), f"{op.name} {label} ({needs})")
        assert paths and not any(p[-1] for p in paths), (label, paths)


def test_list_backward_gradient_orders_and_fallback(ops, paths):
    """A column-major dD_i takes the column-major gradient's ops (a second list call each); a dD_i off the 16-byte
    rule a plain call for its problem alone; outputs without a gradient give None."""
    op = ops["tn_coop"]
    sizes = LIST_CASES["ragged"]
    check_list_backward(op, sizes, True, True, ["row", "col", "unaligned", "row"], f"{op.name} mixed orders")
    (row_a, row_b), (col_a, col_b) = ([o.config.layout.tag for o in grad_ops(op, order)] for order in Order)
    # the row-major gradients' list calls (problems 0, 2, 3: positions 0, 1, 2) refuse problem 2 alone (position
    # 1), a plain call; the column-major one (problem 1) takes its own ops' list calls
    assert paths == [("list", row_a, 0, False), ("list", row_a, 1, True), ("list", row_a, 2, False),
                     ("list", row_b, 0, False), ("list", row_b, 1, True), ("list", row_b, 2, False),
                     ("list", col_a, 0, False), ("list", col_b, 0, False)], paths
    check_list_backward(op, sizes, True, True, ["row"] * 4, f"{op.name} unused outputs", used=[0, 3])
