"""Grouped GEMM on the GPU, the list form (CUTLASS's GroupedGemm): ``op([A0, A1, ...], [B0, B1, ...])``, also
``op.grouped_list(As, Bs)`` and ``torch.ops.<namespace>.<name>.grouped_list(As, Bs)``.

Each A_i (M_i, K_i) is stored in the plan's order for A, each B_i (K_i, N_i) in its order for B (layout tn:
B_i = W_i.t() for a W_i (N_i, K_i)); M, N and K differ per problem. The op returns a list of D_i (M_i, N_i) in the
plan's D order, D_i = A_i @ B_i, in one launch of the plan's persistent kernel (sm90 cooperative or pingpong, no
stream-K, no fused epilogue). Unlike the offsets form (test_grouped.py), a column-major A is taken: all four layouts.
An empty list gives []; M_i = 0 or N_i = 0 an empty D_i; K_i = 0 zeros. Not capturable (a call while a CUDA graph is
captured is refused). The backward: tests/gpu/test_grouped_autograd.py.

Plans: every layout with both persistent schedules, clusters 1x1, 2x1 and 1x2 spread over them (each layout gets
two), bf16 and fp16 on each layout; one fp8 e4m3 tn plan (skipped if the op refuses fp8 lists); the plans that refuse
list calls (sm80, ws, stream-K, a fused epilogue). All kernels built in one parallel ninja run (module fixture).

Every check draws fresh random inputs and compares each D_i with the float64 product A_i.double() @ B_i.double():
||D_i - ref_i|| / ||ref_i|| and over the whole list at most gpu_cases.BOUND[dtype], and every element within
BOUND * (|ref| + sqrt(K_i)) (a stale or unwritten element of random data is outside it). The op allocates the D_i
itself, so unwritten elements are caught as in test_grouped.py: each check runs twice on new inputs, the first call
after NaN-filled blocks of the D_i's sizes (and of their total) went back to torch's caching allocator (an unwritten
element likely reads NaN), the second after the first call's outputs were dropped (likely reused: an unwritten
element holds the first inputs' product, which fails the second reference). Operands' leading dimensions are padded
to 16 bytes (and by more in some checks) with NaN in the padding, so a wrong leading dimension reads NaN.

A 1-row (or 1-column) operand has no meaningful leading dimension (generator.runtime.checks.leading_dim reports its
inner size); the numerics cases keep such an operand's inner size on the 16-byte rule (``tidy``), and
test_degenerate_operands_right_or_refused checks the others separately: right, or refused with a ValueError."""
from __future__ import annotations

import gc
import math
import random
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from gpu_cases import BOUND, ops_for_this_gpu, op_of  # noqa: E402
from generator import Gemm  # noqa: E402

pytestmark = pytest.mark.gpu
NAMESPACE = "gemmgen_grouped_list_test"
NAN = float("nan")

#: (id, Gemm kwargs): plans that take list calls. Every layout has a cooperative and a pingpong plan, a bf16 and an
#: fp16 one, and two of the clusters 1x1, 2x1, 1x2 (tile and cluster pinned, so a planner change cannot move a case).
LIST_PLANS: dict[str, dict] = {
    # the default plan at arch=90 (README): 128x256 cooperative, cluster 2x1
    "tn_bf16_coop_c2x1": dict(dtype="bf16", layout="tn", arch=90, schedule="cooperative", tile_shape=(128, 256, 64),
                              cluster_shape=(2, 1)),
    "tn_fp16_pp_c1x1": dict(dtype="fp16", layout="tn", arch=90, schedule="pingpong", tile_shape=(128, 128, 64),
                            cluster_shape=(1, 1)),
    "tt_fp16_coop_c1x2": dict(dtype="fp16", layout="tt", arch=90, schedule="cooperative", tile_shape=(128, 128, 64),
                              cluster_shape=(1, 2)),
    "tt_bf16_pp_c2x1": dict(dtype="bf16", layout="tt", arch=90, schedule="pingpong", tile_shape=(128, 128, 64),
                            cluster_shape=(2, 1)),
    "nt_bf16_coop_c1x1": dict(dtype="bf16", layout="nt", arch=90, schedule="cooperative", tile_shape=(128, 128, 64),
                              cluster_shape=(1, 1)),
    "nt_fp16_pp_c1x2": dict(dtype="fp16", layout="nt", arch=90, schedule="pingpong", tile_shape=(128, 128, 64),
                            cluster_shape=(1, 2)),
    "nn_fp16_coop_c2x1": dict(dtype="fp16", layout="nn", arch=90, schedule="cooperative", tile_shape=(128, 128, 64),
                              cluster_shape=(2, 1)),
    "nn_bf16_coop_c1x2": dict(dtype="bf16", layout="nn", arch=90, schedule="cooperative", tile_shape=(256, 128, 64),
                              cluster_shape=(1, 2)),
    "nn_bf16_pp_c1x1": dict(dtype="bf16", layout="nn", arch=90, schedule="pingpong", tile_shape=(128, 128, 64),
                            cluster_shape=(1, 1)),
    # an odd width: its epilogue staged in the ring (planner.sm90.ring_staged), problems of their own K
    "tn_bf16_pp_c2x1_staged": dict(dtype="bf16", layout="tn", arch=90, schedule="pingpong",
                                          tile_shape=(128, 80, 64), cluster_shape=(2, 1)),
}
DEFAULT = "tn_bf16_coop_c2x1"
NN = "nn_bf16_pp_c1x1"   # a column-major A, for the checks that run on a few plans only
#: fp8 (A and B e4m3, K-major: layout tn only; bf16 out, no scales): checked if the op takes fp8 lists, else skipped.
FP8 = "tn_e4m3_coop_c1x1"
FP8_PLAN = dict(dtype="e4m3", layout="tn", arch=90, schedule="cooperative", tile_shape=(128, 128, 128),
                cluster_shape=(1, 1))
#: tests/gpu/test_fp8.py's bounds by output dtype (fp8 products are exact; the output's rounding dominates).
FP8_BOUND = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 5e-4}
#: Plans that refuse list calls, and a regular expression their message must match (the fix it names).
REFUSING_PLANS: dict[str, dict] = {
    "sm80_tn_bf16": dict(dtype="bf16", layout="tn", arch=80),
    "sm90_tn_bf16_ws": dict(dtype="bf16", layout="tn", arch=90, schedule="ws"),
    "sm90_tn_bf16_relu_bias": dict(dtype="bf16", layout="tn", arch=90, schedule="cooperative", activation="relu",
                                   bias="col"),
}
#: Stream-K is not a Gemm knob: the cooperative config with stream_k=True (as tests/gpu/test_stream_k.py).
STREAM_K = "sm90_tn_bf16_stream_k"
STREAM_K_PLAN = dict(dtype="bf16", layout="tn", arch=90, schedule="cooperative", tile_shape=(128, 64, 64),
                     cluster_shape=(1, 1))
REFUSAL_MESSAGES = {"sm80_tn_bf16": "arch=90", "sm90_tn_bf16_ws": "schedule", STREAM_K: "(?i)stream|schedule",
                    "sm90_tn_bf16_relu_bias": "(?i)epilogue"}


def configs() -> dict:
    found = {key: Gemm(**kw).config for key, kw in {**LIST_PLANS, **REFUSING_PLANS}.items()}
    found[FP8] = Gemm(**FP8_PLAN).config
    found[STREAM_K] = replace(Gemm(**STREAM_K_PLAN).config, stream_k=True)
    return found


@pytest.fixture(scope="module")
def ops():
    return ops_for_this_gpu(configs(), NAMESPACE)


def test_plans_are_what_they_say():
    """The plans under test have the layouts, schedules, clusters and dtypes their ids name; together they cover
    every layout with both schedules and both 16-bit dtypes, and the clusters 1x1, 2x1 and 1x2."""
    cfgs = configs()
    for key in LIST_PLANS:
        cfg = cfgs[key]
        layout, dtype, schedule, cluster, *staged = key.split("_")
        assert cfg.staging_in_ring == bool(staged), key
        assert cfg.family == "sm90" and not cfg.stream_k and cfg.epilogue.is_identity, key
        assert cfg.layout.blas == layout and cfg.layout.c.value == "row", key
        assert cfg.dtype.value == dtype, key
        assert cfg.schedule == {"coop": "cooperative", "pp": "pingpong"}[schedule], key
        assert "c%dx%d" % cfg.cluster == cluster, key
    for layout in ("tn", "tt", "nt", "nn"):
        mine = [cfgs[k] for k in LIST_PLANS if k.startswith(layout)]
        assert {c.schedule for c in mine} == {"cooperative", "pingpong"}, layout
        assert {c.dtype.value for c in mine} == {"bf16", "fp16"}, layout
    assert {cfgs[k].cluster for k in LIST_PLANS} == {(1, 1), (2, 1), (1, 2)}
    assert cfgs[DEFAULT].name == Gemm("bf16", "tn", arch=90).name   # the default plan
    assert cfgs[FP8].dtype.value == "e4m3" and cfgs[FP8].layout.blas == "tn" and cfgs[FP8].epilogue.is_identity
    assert cfgs["sm80_tn_bf16"].family == "sm80"
    assert cfgs["sm90_tn_bf16_ws"].schedule == "ws"
    assert cfgs[STREAM_K].stream_k
    assert not cfgs["sm90_tn_bf16_relu_bias"].epilogue.is_identity


# -- operands --------------------------------------------------------------------------------------------------

def align_of(dtype: torch.dtype) -> int:
    """Elements in 16 bytes of ``dtype``."""
    return 16 // torch.empty((), dtype=dtype).element_size()


def up(x: int, dtype: torch.dtype) -> int:
    """The smallest multiple of 16 bytes (in elements of ``dtype``) >= x, at least 16 bytes."""
    a = align_of(dtype)
    return max(a, -(-x // a) * a)


def stored(rows: int, cols: int, order: str, dtype: torch.dtype, pad: int = 0) -> torch.Tensor:
    """A fresh random (rows, cols) matrix stored `order`-major ("row" / "col"), its leading dimension the inner size
    rounded up to 16 bytes plus `pad` elements (`pad` a multiple of 16 bytes), NaN in the padding."""
    outer, inner = (rows, cols) if order == "row" else (cols, rows)
    buf = torch.full((outer, up(inner, dtype) + pad), NAN, device="cuda")
    buf[:, :inner] = torch.randn(outer, inner, device="cuda")
    view = buf.to(dtype)[:, :inner]
    return view if order == "row" else view.t()


def tidy(op, problems) -> list[tuple[int, int, int]]:
    """The problems with each operand whose outer size is 0 or 1 (one row of a row-major matrix, one column of a
    column-major one, or none) given an inner size on the 16-byte rule: such an operand's leading dimension is its
    inner size (generator.runtime.checks.leading_dim), whatever the buffer's pitch. test_degenerate_operands_...
    checks the others."""
    a_row, b_row = op.config.layout.a.value == "row", op.config.layout.b.value == "row"
    out = []
    for m, n, k in problems:
        for _ in range(2):
            if a_row and m <= 1 and k % align_of(op.dtype):
                k = up(k, op.dtype)
            if not a_row and k <= 1 and m % align_of(op.dtype):
                m = up(m, op.dtype)
            if not b_row and n <= 1 and k % align_of(op.dtype_b):
                k = up(k, op.dtype_b)
            if b_row and k <= 1 and n % align_of(op.dtype_b):
                n = up(n, op.dtype_b)
        out.append((m, n, k))
    return out


def operands(op, problems, pad: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Fresh [A_i (M_i, K_i)] and [B_i (K_i, N_i)] in the plan's orders (problems taken as they are: see tidy)."""
    layout = op.config.layout
    As = [stored(m, k, layout.a.value, op.dtype, pad) for m, n, k in problems]
    Bs = [stored(k, n, layout.b.value, op.dtype_b, pad) for m, n, k in problems]
    return As, Bs


def bound_of(op) -> float:
    return BOUND.get(op.dtype) or FP8_BOUND[op.out_dtype]


def rel_error(d: torch.Tensor, ref: torch.Tensor) -> float:
    return ((d.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def overload(op):
    return getattr(getattr(torch.ops, NAMESPACE), op.name).grouped_list


def call(op, As, Bs, via: str = "method"):
    if via == "method":
        return op.grouped_list(As, Bs)
    if via == "call":
        return op(As, Bs)
    assert via == "torch.ops", via
    return overload(op)(As, Bs)


def poison(op, problems) -> None:
    """Blocks of the D_i's sizes, and of their total, filled with NaN and freed at once: the op's allocations of
    the D_i are likely to get them (an element left unwritten then reads NaN)."""
    blocks = [torch.full((max(m, 1), max(n, 1)), NAN, dtype=op.out_dtype, device="cuda") for m, n, _ in problems]
    blocks.append(torch.full((max(sum(m * n for m, n, _ in problems), 1),), NAN, dtype=op.out_dtype, device="cuda"))
    del blocks


def check_outputs(op, Ds, As, Bs, what: str) -> None:
    """A list of one D_i per problem, each (M_i, N_i) of the op's output dtype in the plan's order of D on A_i's
    device; zeros where K_i = 0; else finite, within the bound of the float64 product in norm (per problem and over
    the list) and element by element."""
    bound = bound_of(op)
    assert isinstance(Ds, list), f"{what}: returned {type(Ds).__name__}, expected a list"
    assert len(Ds) == len(As), f"{what}: {len(Ds)} outputs for {len(As)} problems"
    row = op.config.layout.c.value == "row"
    diff2 = ref2 = 0.0
    for i, (d, a, b) in enumerate(zip(Ds, As, Bs)):
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        where = f"{what}: problem {i} ({m}x{n}x{k})"
        assert isinstance(d, torch.Tensor), f"{where}: D is {type(d).__name__}"
        assert tuple(d.shape) == (m, n), f"{where}: D is {tuple(d.shape)}, expected {(m, n)}"
        assert d.dtype == op.out_dtype and d.device == a.device, f"{where}: D is {d.dtype} on {d.device}"
        if m > 1 and n > 1:   # the plan's order of D (a padded leading dimension allowed)
            inner, outer, size = (d.stride(1), d.stride(0), n) if row else (d.stride(0), d.stride(1), m)
            order = "row" if row else "column"
            assert inner == 1 and outer >= size, f"{where}: D has strides {tuple(d.stride())}, not {order}-major"
        if d.numel() == 0:
            continue
        if k == 0:
            assert (d == 0).all(), f"{where}: K = 0 but D is not all zeros"
            continue
        bad = ~torch.isfinite(d)
        if bad.any():
            first = bad.nonzero()[:8].tolist()
            raise AssertionError(f"{where}: {int(bad.sum())} unwritten (NaN) or NaN-reading elements, e.g. {first}")
        ref = a.double() @ b.double()
        err = rel_error(d, ref)
        assert err <= bound, f"{where}: rel error {err:.3g} > {bound}"
        off = (d.double() - ref).abs() > bound * (ref.abs() + math.sqrt(k))
        if off.any():
            idx = off.nonzero()[:8].tolist()
            raise AssertionError(f"{where}: {int(off.sum())} elements off the reference (stale, misplaced or another "
                                 f"problem's), e.g. {idx}: {[(d[r, c].item(), ref[r, c].item()) for r, c in idx[:3]]}")
        diff2 += (d.double() - ref).norm().item() ** 2
        ref2 += ref.norm().item() ** 2
    if ref2 > 0:
        total = math.sqrt(diff2 / ref2)
        assert total <= bound, f"{what}: rel error over the list {total:.3g} > {bound}"


def check(op, problems, *, via: str = "method", pad: int = 0, label: str = "") -> list[torch.Tensor]:
    """Two list calls on fresh inputs of the same shapes (tidied), each against its float64 reference (module
    docstring: the first after NaN blocks of the D_i's sizes were freed, the second after the first outputs were
    dropped). Returns the second call's outputs."""
    problems = tidy(op, problems)
    what = f"{op.name} {label}{len(problems)} problems {problems} pad={pad} via {via}"
    previous = None
    for attempt in (1, 2):
        As, Bs = operands(op, problems, pad)
        if attempt == 1:
            poison(op, problems)
        previous = None   # drop the last outputs (the previous inputs' products): likely the blocks these D_i get
        Ds = call(op, As, Bs, via)
        torch.cuda.synchronize()
        check_outputs(op, Ds, As, Bs, f"{what} (call {attempt})")
        previous = Ds
    return previous


def assert_still_right(op) -> None:
    check(op, [(129, 200, 64), (1, 72, 1000), (300, 7, 129)], label="afterwards: ")


# -- numerics ------------------------------------------------------------------------------------------------

#: The sizes M, N and K are drawn from.
SIZES = (1, 7, 8, 63, 64, 129, 300, 1000)

#: (label, [(M, N, K)]). Each row runs on every list plan; the routes and the padding of the leading dimensions
#: rotate over the rows.
CASES = (
    ("1 problem", [(300, 200, 64)]),
    ("1 problem, ragged", [(129, 63, 1000)]),
    ("1 problem, one row", [(1, 1000, 136)]),
    ("3 problems", [(1, 7, 63), (129, 300, 7), (63, 1000, 129)]),
    ("3 problems, 128 multiples and ragged", [(128, 256, 64), (129, 72, 1000), (256, 128, 128)]),
    ("3 tiny", [(1, 1, 1), (7, 7, 7), (8, 1, 8)]),
    ("17 problems", [(1, 7, 63), (129, 300, 7), (63, 1000, 129), (300, 64, 1000), (7, 1, 8), (1000, 129, 63),
                     (64, 8, 300), (8, 63, 1), (129, 129, 129), (300, 1000, 64), (63, 7, 300), (1, 1000, 1000),
                     (1000, 1, 7), (7, 300, 8), (64, 64, 64), (300, 129, 1000), (8, 8, 63)]),
    ("17, one big and all else tiny", [(1000, 1000, 1000)] + [(7, 8, 63)] * 16),
    # problems of one shape: a problem's D written from another's A or B (a wrong index) is caught only here
    ("3 of one shape", [(129, 200, 136)] * 3),
    ("17 of one shape", [(300, 72, 64)] * 17),
)
RAGGED_17 = CASES[6][1]
ROUTES = ("method", "call", "torch.ops")


def random_problems(count: int, rng: random.Random) -> list[tuple[int, int, int]]:
    return [(rng.choice(SIZES), rng.choice(SIZES), rng.choice(SIZES)) for _ in range(count)]


@pytest.mark.parametrize("key", list(LIST_PLANS))
def test_lists(ops, key):
    """Lists of 1, 3 and 17 problems of ragged M, N, K (CASES), by each route; then random lists of 3 and 17
    (printed on failure)."""
    op = op_of(ops, key)
    for i, (label, problems) in enumerate(CASES):
        check(op, problems, via=ROUTES[i % 3], pad=up(8, op.dtype) if i % 2 else 0, label=f"{label}: ")
    rng = random.Random()
    for count in (3, 17):
        check(op, random_problems(count, rng), via="method", label="random sizes: ")


@pytest.mark.parametrize("key", [DEFAULT, "tt_fp16_coop_c1x2", "nt_bf16_coop_c1x1", "nn_bf16_coop_c1x2", NN])
def test_huge_among_tiny(ops, key):
    """One 2048^3 problem among tiny ones, first, middle and last in the list (many tiles of one problem next to
    one-tile problems)."""
    op = op_of(ops, key)
    big, tiny = (2048, 2048, 2048), [(1, 7, 63), (7, 1, 129), (63, 300, 1), (0, 64, 64)]
    for problems in ([big] + tiny, tiny[:2] + [big] + tiny[2:], tiny + [big]):
        check(op, problems, label="2048^3 among tiny: ")


@pytest.mark.parametrize("key", [DEFAULT, "tt_bf16_pp_c2x1", "nt_fp16_pp_c1x2", "nn_fp16_coop_c2x1"])
def test_zero_sizes(ops, key):
    """Problems with M = 0, N = 0 or K = 0 mixed with others: empty D_i, zeros for K = 0 (written: NaN blocks of
    the D_i's sizes are freed first); a list of only empty problems; an empty list gives [] by every route."""
    op = op_of(ops, key)
    for problems in ([(0, 200, 64), (129, 0, 64), (63, 72, 0), (300, 200, 129)],
                     [(63, 72, 0), (0, 0, 0), (1, 8, 8), (0, 1000, 1000), (1000, 0, 64), (5, 1000, 0)],
                     [(0, 72, 64)] * 3, [(77, 0, 200)], [(5, 72, 0)], [(300, 129, 0), (129, 300, 0)]):
        for via in ROUTES:
            check(op, problems, via=via, label="zero sizes: ")
    for via in ROUTES:
        assert call(op, [], [], via) == [], f"{op.name}: an empty list via {via}"
    assert_still_right(op)


@pytest.mark.parametrize("key", list(LIST_PLANS))
def test_bit_identical_repeats(ops, key):
    """The same inputs give the same bits on every call and by every route (no split sums to order differently)."""
    op = op_of(ops, key)
    for problems in ([(1, 7, 63), (129, 300, 7), (1000, 1000, 1000), (0, 64, 64), (300, 64, 129)],
                     [(2048, 200, 200), (1, 1000, 136)]):
        As, Bs = operands(op, tidy(op, problems))
        first = [d.clone() for d in op.grouped_list(As, Bs)]
        check_outputs(op, first, As, Bs, f"{op.name} {problems}")
        for via in ("method", "call", "torch.ops", "method"):
            again = call(op, As, Bs, via)
            for i, (x, y) in enumerate(zip(again, first)):
                assert torch.equal(x, y), f"{op.name} {problems} problem {i} via {via}: differs between calls"


@pytest.mark.parametrize("key", [DEFAULT, "tt_fp16_coop_c1x2", "nt_bf16_coop_c1x1", "nn_fp16_coop_c2x1", NN])
def test_same_as_torch_mm_loop(ops, key):
    """Agreement with a Python loop of torch.mm over the same list: both within the bound of the float64
    reference, and within twice the bound of each other."""
    op = op_of(ops, key)
    bound = bound_of(op)
    for problems in (RAGGED_17, [(2048, 1000, 300), (1, 8, 8), (129, 63, 1000)]):
        As, Bs = operands(op, tidy(op, problems))
        ours = op.grouped_list(As, Bs)
        theirs = [torch.mm(a, b) for a, b in zip(As, Bs)]
        check_outputs(op, ours, As, Bs, f"{op.name} {problems}")
        for i, (x, y, a, b) in enumerate(zip(ours, theirs, As, Bs)):
            if x.numel() == 0 or a.shape[1] == 0:
                continue
            ref = a.double() @ b.double()
            assert rel_error(y, ref) <= bound, f"torch.mm itself, problem {i}"
            apart = ((x.double() - y.double()).norm() / ref.norm()).item()
            assert apart <= 2 * bound, (f"{op.name} problem {i} {tuple(a.shape)} x {tuple(b.shape)}: ours and "
                                        f"torch.mm differ by {apart:.3g} (relative)")


@pytest.mark.parametrize("key", [DEFAULT, "tt_bf16_pp_c2x1", "nt_fp16_pp_c1x2", NN])
def test_padded_sliced_and_shared_operands(ops, key):
    """Operands with padded leading dimensions (NaN in the padding); slices of bigger buffers at 16-byte aligned
    offsets; the same tensor in several problems; B_i the matrices of one 3-D stack of weights (W (E, N, K) as
    MoE layers hold them, each B_i in the plan's order)."""
    op = op_of(ops, key)
    layout = op.config.layout
    for pad in (up(8, op.dtype), up(64, op.dtype)):
        check(op, [(77, 200, 136), (130, 72, 200), (8, 1000, 64)], pad=pad, label="padded: ")
    # slices: A_i a range of rows (row-major) or columns (column-major) of a bigger buffer, starting 64 in
    big_a = stored(600, 600, layout.a.value, op.dtype)
    big_b = stored(600, 600, layout.b.value, op.dtype_b)
    As = [big_a[64:64 + 77, :200], big_a[128:128 + 300, 64:64 + 136], big_a[:8, :64]]
    Bs = [big_b[:200, 64:64 + 72], big_b[64:64 + 136, :300], big_b[128:128 + 64, 8:8 + 200]]
    check_outputs(op, call(op, As, Bs), As, Bs, f"{op.name} slices of bigger buffers")
    # one tensor in several problems (read-only: the op may not write it)
    a, a2 = stored(129, 200, layout.a.value, op.dtype), stored(1000, 200, layout.a.value, op.dtype)
    b, b2 = stored(200, 72, layout.b.value, op.dtype_b), stored(200, 300, layout.b.value, op.dtype_b)
    As, Bs = [a, a2, a, a, a2], [b, b, b2, b, b2]
    before = [t.clone() for t in (a, a2, b, b2)]
    check_outputs(op, call(op, As, Bs, "torch.ops"), As, Bs, f"{op.name} shared operands")
    for t, was in zip((a, a2, b, b2), before):
        assert torch.equal(t, was), f"{op.name}: an input changed"
    # B_i = the experts of one stack: W (E, N, K) -> (K, N) in B's order
    e, n, k = 5, 200, 136
    if layout.b.value == "col":
        stack = torch.randn(e, n, k, device="cuda").to(op.dtype_b)   # W
        Bs = [stack[g].t() for g in range(e)]
    else:
        stack = torch.randn(e, k, n, device="cuda").to(op.dtype_b)   # W.transpose(1, 2).contiguous()
        Bs = [stack[g] for g in range(e)]
    As = [stored(m, k, layout.a.value, op.dtype) for m in (77, 0, 1, 300, 129)]
    check_outputs(op, op.grouped_list(As, Bs), As, Bs, f"{op.name} B_i from one 3-D stack")


@pytest.mark.parametrize("key", [DEFAULT, NN])
def test_many_problems(ops, key):
    """128 small problems in one list (the per-problem descriptors outgrow any small fixed table)."""
    op = op_of(ops, key)
    rng = random.Random()
    check(op, [(rng.choice((1, 7, 64, 129)), rng.choice((8, 63, 200)), rng.choice((7, 64, 136)))
               for _ in range(128)], label="128 problems: ")


@pytest.mark.parametrize("key", [DEFAULT, NN])
def test_outputs_are_independent_matrices(ops, key):
    """The D[i] of one call (cut from one allocation) are tensors of their own storage over disjoint bytes, in the
    plan's order of D: writing one changes no other, and each outlives the others being freed."""
    op = op_of(ops, key)
    problems = tidy(op, RAGGED_17)
    As, Bs = operands(op, problems)
    D = op.grouped_list(As, Bs)
    spans = sorted((d.data_ptr(), d.data_ptr() + d.numel() * d.element_size()) for d in D if d.numel())
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])), "outputs overlap"
    assert len({d.untyped_storage().data_ptr() for d in D if d.numel()}) == len(spans), "outputs share a storage"
    row = op.config.layout.c.value == "row"
    for d, (m, n, _) in zip(D, problems):
        assert d.shape == (m, n) and (d.numel() == 0 or d.is_contiguous() == row or min(m, n) == 1)
    kept = D[len(D) // 2].clone()
    for d in D[: len(D) // 2]:
        d.fill_(float("nan"))
    assert torch.equal(D[len(D) // 2], kept), "writing one output changed another"
    last = D[-1]
    want = last.clone()
    del D
    torch.cuda.synchronize()
    assert torch.equal(last, want), "an output changed after the others were freed"


def cuda_kernels(fn) -> list[str]:
    """The names of the CUDA kernels `fn` launched (empty where the profiler cannot see kernels)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("key", [DEFAULT, NN])
def test_one_launch(ops, key):
    """A list of 17 problems is one launch of the plan's kernel (kernels named after the op)."""
    op = op_of(ops, key)
    problems = tidy(op, RAGGED_17)
    As, Bs = operands(op, problems)
    op.grouped_list(As, Bs)   # first call outside the profile
    seen = cuda_kernels(lambda: op.grouped_list(As, Bs))
    if not seen:
        pytest.skip("the profiler sees no CUDA kernels here")
    ours = [name for name in seen if name.startswith(op.name)]
    assert len(ours) == 1, f"{op.name}: a list of {len(problems)} problems launched {ours} (all kernels: {seen})"


@pytest.mark.parametrize("key", [DEFAULT, "tt_fp16_coop_c1x2", "nt_bf16_coop_c1x1", NN])
def test_path(ops, key):
    """op.path(As, Bs) of a list call: 'grouped'."""
    op = op_of(ops, key)
    for problems in ([(300, 200, 64)], CASES[3][1], [(0, 72, 64), (129, 200, 0), (7, 8, 63)]):
        As, Bs = operands(op, tidy(op, problems))
        assert op.path(As, Bs) == "grouped", f"{op.name} {problems}"


def test_fp8_e4m3_tn(ops):
    """fp8 e4m3 A_i and B_i (K-major, layout tn, bf16 out, no scales), against the float64 product of the same fp8
    values. Skipped if the op refuses fp8 list calls (with a ValueError naming why)."""
    op = op_of(ops, FP8)
    As, Bs = operands(op, tidy(op, [(129, 200, 136)]))
    try:
        path = op.path(As, Bs)
    except (ValueError, TypeError) as err:
        pytest.skip(f"{op.name} refuses fp8 list calls: {str(err).splitlines()[0][:300]}")
    if path == "none":
        pytest.skip(f"{op.name}: path 'none' for an fp8 list")
    assert path == "grouped", path
    for i, (label, problems) in enumerate(CASES):
        check(op, problems, via=ROUTES[i % 3], label=f"fp8 {label}: ")
    check(op, [(0, 200, 64), (129, 0, 64), (63, 72, 0), (300, 200, 129)], label="fp8 zero sizes: ")
    As, Bs = operands(op, tidy(op, RAGGED_17))
    first = [d.clone() for d in op.grouped_list(As, Bs)]
    assert all(torch.equal(x, y) for x, y in zip(op.grouped_list(As, Bs), first)), f"{op.name}: repeats differ"


def packed(t: torch.Tensor) -> torch.Tensor:
    """A packed copy of a row-major (stride(-1) == 1) or column-major matrix, in the same order."""
    fresh = torch.contiguous_format
    return t.clone(memory_format=fresh) if t.stride(-1) == 1 else t.t().clone(memory_format=fresh).t()


def test_degenerate_operands_right_or_refused(ops):
    """Operands with one row or column (or none) whose inner size breaks the 16-byte rule (row-major A (1, 7),
    column-major B (7, 1) of layout tn, column-major A (7, 1) of layout nn ...), contiguous and as views of padded
    buffers: such an operand's leading dimension means nothing (one row), so the op may take them (right) or refuse
    the call with a ValueError; never a wrong answer, and the op is right afterwards."""
    for key in (DEFAULT, NN):
        op = op_of(ops, key)
        for problems in ([(1, 72, 7)], [(7, 1, 7)], [(1, 1, 1)], [(0, 72, 7), (129, 200, 64)],
                         [(1, 7, 63), (7, 1, 129), (63, 300, 1)]):
            for contiguous in (False, True):
                As, Bs = operands(op, problems)
                if contiguous:   # fresh packed tensors in the plan's orders (leading dimension = inner size)
                    As, Bs = [packed(a) for a in As], [packed(b) for b in Bs]
                try:
                    Ds = op.grouped_list(As, Bs)
                except ValueError:
                    continue
                torch.cuda.synchronize()
                check_outputs(op, Ds, As, Bs, f"{op.name} degenerate {problems} contiguous={contiguous}")
        assert_still_right(op)


# -- CUDA graphs, torch.compile, opcheck -----------------------------------------------------------------------

@pytest.mark.parametrize("key", [DEFAULT, NN])
def test_capture_refused(ops, key):
    """A list call while a CUDA graph is captured is refused by every route, with the op's own message (not a CUDA
    error of a host sync under capture); afterwards no capture is left open, the list call is right, and the op's
    2-D call still captures and replays right."""
    op = op_of(ops, key)
    problems = tidy(op, [(129, 200, 64), (1, 72, 1000), (300, 7, 129)])
    As, Bs = operands(op, problems)
    op.grouped_list(As, Bs)   # warm (and built) outside the capture
    torch.cuda.synchronize()
    for via in ROUTES:
        graph = torch.cuda.CUDAGraph()
        # No garbage collection inside the capture: a refused capture leaves its graph in a reference cycle (the
        # exception's traceback holds the frame), and a CUDA graph that the collector happens to free while another
        # capture runs destroys its executable under that capture and invalidates it (seen when this test ran after
        # tests/gpu/test_grouped.py's graph tests: cudaErrorStreamCaptureInvalidated, "function reset").
        gc.collect()
        gc.disable()
        try:
            with pytest.raises((RuntimeError, ValueError)) as info:
                with torch.cuda.graph(graph):
                    call(op, As, Bs, via)
        finally:
            gc.enable()
        message = str(info.value)
        del info
        assert "captur" in message.lower() or "graph" in message.lower(), f"{op.name} via {via}: {message}"
        assert "not permitted" not in message and "cudaError" not in message, (
            f"{op.name} via {via}: a CUDA error under capture, not the op's refusal: {message}")
        assert not torch.cuda.is_current_stream_capturing()
        del graph
        torch.cuda.synchronize()
        assert_still_right(op)
    # the 2-D call still captures and replays
    a, b = As[0], Bs[0]
    op(a, b)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_d = op(a, b)
    a.copy_(torch.randn(a.shape, device="cuda").to(a.dtype))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_error(static_d, a.double() @ b.double()) <= bound_of(op), f"{op.name}: 2-D replay after a refusal"


@pytest.mark.parametrize("key,via", [(DEFAULT, "method"), (DEFAULT, "torch.ops"), (NN, "method")])
def test_torch_compile_fullgraph(ops, key, via):
    """torch.compile(fullgraph=True) of a function calling the list form: the fake gives each (M_i, N_i), and the
    compiled results equal the eager ones, for new sizes too (recompiled or dynamic)."""
    op = op_of(ops, key)

    def f(As, Bs):
        return [torch.relu(d) * 2 for d in call(op, As, Bs, via)]

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    with torch.no_grad():
        for problems in ([(129, 200, 64), (1, 72, 1000), (300, 8, 136)], [(300, 200, 64), (64, 72, 1000), (7, 8, 136)],
                         [(64, 200, 200), (129, 72, 64), (1000, 64, 8)], [(77, 63, 129)]):
            As, Bs = operands(op, tidy(op, problems))
            got, want = compiled(As, Bs), f(As, Bs)
            assert len(got) == len(want) == len(problems)
            for g, w, a, b in zip(got, want, As, Bs):
                assert g.shape == w.shape == (a.shape[0], b.shape[1])
                torch.testing.assert_close(g, w)
                ref = 2 * torch.relu(a.double() @ b.double())
                assert rel_error(w, ref) <= bound_of(op), f"{op.name} {problems}"


_PROBE: dict = {}


def list_probe():
    """A trivial custom op of Tensor[] -> Tensor[] (with a fake): if opcheck fails on it, this torch's opcheck does
    not handle list arguments and returns, and the opcheck of ours is skipped rather than failed."""
    if "op" not in _PROBE:
        @torch.library.custom_op("gemmgen_list_probe::twice", mutates_args=(), schema="(Tensor[] xs) -> Tensor[]")
        def twice(xs):
            return [x * 2 for x in xs]

        @twice.register_fake
        def _(xs):
            return [torch.empty_like(x) for x in xs]

        _PROBE["op"] = torch.ops.gemmgen_list_probe.twice.default
    return _PROBE["op"]


OPCHECK_UTILS = ("test_schema", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")


def test_opcheck(ops):
    """torch.library.opcheck of the grouped_list overload: schema (no input mutated), fake tensor and AOT dispatch
    (static and dynamic shapes); with an empty problem, schema and fake only (a size of 0 is never dynamic). The
    autograd-registration test is left out (its traced backward reads the problems' sizes on the host: see
    tests/gpu/test_grouped_autograd.py). Skipped where opcheck fails on a
    trivial Tensor[] -> Tensor[] op too."""
    op = op_of(ops, DEFAULT)
    xs = [torch.randn(3, 5, device="cuda"), torch.randn(7, 2, device="cuda")]
    try:
        torch.library.opcheck(list_probe(), (xs,), test_utils=OPCHECK_UTILS)
    except Exception as err:   # noqa: BLE001 - any failure of opcheck itself
        pytest.skip(f"torch.library.opcheck fails on a trivial Tensor[] -> Tensor[] op in torch {torch.__version__}: "
                    f"{type(err).__name__}: {str(err).splitlines()[0][:300]}")
    for problems, utils in (([(129, 200, 64), (1, 72, 1000), (300, 8, 136)], OPCHECK_UTILS),
                            ([(0, 72, 64), (129, 200, 64), (63, 8, 0)], OPCHECK_UTILS[:2])):
        As, Bs = operands(op, tidy(op, problems))
        torch.library.opcheck(overload(op), (As, Bs), test_utils=utils)


# -- refusals --------------------------------------------------------------------------------------------------

#: The refusals' default problems (the default plan, tn: A row-major, B column-major).
REF_PROBLEMS = [(77, 200, 64), (130, 72, 200), (8, 1000, 136)]


def _with(fn):
    """A refusal case: the default operands (REF_PROBLEMS), changed by fn(op, As, Bs) -> (As, Bs)."""
    def make(op):
        As, Bs = operands(op, tidy(op, REF_PROBLEMS))
        return fn(op, list(As), list(Bs))
    return make


def _set(lst: list, i: int, value) -> list:
    lst[i] = value
    return lst


def _misaligned_base(op, m, k, order):
    """(m, k) in ``order``, its first element 2 bytes past a 16-byte boundary (its pitch on the 16-byte rule)."""
    buf = stored(m, k + 8, order, op.dtype) if order == "row" else stored(m + 8, k, order, op.dtype)
    return buf[:, 1:k + 1] if order == "row" else buf[1:m + 1, :]


def _odd_pitch(op, rows, cols, order, dtype):
    """(rows, cols) in ``order`` with a leading dimension one element past the inner size (off 16 bytes)."""
    outer, inner = (rows, cols) if order == "row" else (cols, rows)
    view = torch.randn(outer, inner + 1, device="cuda").to(dtype)[:, :inner]
    return view if order == "row" else view.t()


def _on_nn(fn):
    """A refusal case on the NN plan (column-major A)."""
    make = _with(fn)
    make.key = NN
    return make


#: name: (make (As, Bs) from the op, the error type, a regular expression the message must match or None).
REFUSED = {
    "B list one short": (_with(lambda op, As, Bs: (As, Bs[:-1])), ValueError, None),
    "A list one long": (_with(lambda op, As, Bs: (As + As[:1], Bs)), ValueError, None),
    "a tensor for the A list": (_with(lambda op, As, Bs: (As[0], Bs[:1])), (TypeError, ValueError), None),
    "None in the A list": (_with(lambda op, As, Bs: (_set(As, 1, None), Bs)), TypeError, None),
    "a float in the B list": (_with(lambda op, As, Bs: (As, _set(Bs, 2, 3.0))), TypeError, None),
    "A_1 of another dtype": (_with(lambda op, As, Bs: (_set(As, 1, As[1].half()), Bs)), TypeError, None),
    "B_0 float32": (_with(lambda op, As, Bs: (As, _set(Bs, 0, Bs[0].float()))), TypeError, None),
    "A_1 3-D": (_with(lambda op, As, Bs: (_set(As, 1, As[1].unsqueeze(0)), Bs)), ValueError, None),
    "B_2 1-D": (_with(lambda op, As, Bs: (As, _set(Bs, 2, Bs[2][:, 0]))), ValueError, None),
    "K disagrees in pair 1": (_with(lambda op, As, Bs: (As, _set(Bs, 1, stored(208, 72, "col", op.dtype)))),
                              ValueError, "K"),
    "A_0 on the CPU": (_with(lambda op, As, Bs: (_set(As, 0, As[0].cpu()), Bs)), ValueError, None),
    "B_1 row-major on a tn plan": (_with(lambda op, As, Bs: (As, _set(Bs, 1, Bs[1].contiguous()))), ValueError,
                                   None),
    "A_1 base off 16 bytes": (_with(lambda op, As, Bs: (_set(As, 1, _misaligned_base(op, 130, 200, "row")), Bs)),
                              ValueError, "16"),
    "A_2 leading dimension off 16 bytes": (
        _with(lambda op, As, Bs: (_set(As, 2, _odd_pitch(op, 8, 136, "row", op.dtype)), Bs)), ValueError, "16"),
    "B_0 leading dimension off 16 bytes": (
        _with(lambda op, As, Bs: (As, _set(Bs, 0, _odd_pitch(op, 64, 200, "col", op.dtype)))), ValueError, "16"),
    # (inputs that require grad are taken: tests/gpu/test_grouped_autograd.py)
    # a column-major A (layout nn)
    "nn: A_1 row-major": (_on_nn(lambda op, As, Bs: (_set(As, 1, As[1].contiguous()), Bs)), ValueError, None),
    "nn: A_0 leading dimension off 16 bytes": (
        _on_nn(lambda op, As, Bs: (_set(As, 0, _odd_pitch(op, 77, 64, "col", op.dtype)), Bs)), ValueError, "16"),
    "nn: A_1 base off 16 bytes": (_on_nn(lambda op, As, Bs: (_set(As, 1, _misaligned_base(op, 130, 200, "col")), Bs)),
                                  ValueError, "16"),
}
#: Cases whose lists hold a non-tensor or are no list: the dispatcher's own argument parsing answers on torch.ops.
METHOD_ONLY = {"a tensor for the A list", "None in the A list", "a float in the B list"}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refusals_then_right(ops, case):
    """Each refusal raises its documented type (naming the fix) before any launch, by every route; the next calls
    are right."""
    make, error, match = REFUSED[case]
    op = op_of(ops, getattr(make, "key", DEFAULT))
    As, Bs = make(op)
    for via in ("method", "call") if case in METHOD_ONLY else ROUTES:
        with pytest.raises(error, match=match):
            call(op, As, Bs, via)
            torch.cuda.synchronize()
    assert_still_right(op)


@pytest.mark.parametrize("key", list(REFUSAL_MESSAGES))
def test_plans_without_list_kernel_refuse(ops, key):
    """sm80, ws, stream-K and fused-epilogue plans take no list call: ValueError naming the fix, by the method and
    torch.ops (where the op has the overload); op.path says 'none' or refuses alike; the op's own 2-D calls and the
    default op's list calls stay right."""
    op = op_of(ops, key)
    As, Bs = operands(op, tidy(op, REF_PROBLEMS))
    identity = op.config.epilogue.is_identity
    # (an op with a fused epilogue may have no .grouped_list overload: then only the method can refuse)
    has_overload = hasattr(getattr(getattr(torch.ops, NAMESPACE), op.name), "grouped_list")
    assert has_overload or not identity, f"{op.name} has no .grouped_list overload"
    routes = ["method"] + (["torch.ops"] if has_overload else []) + (["call"] if identity else [])
    for via in routes:
        with pytest.raises(ValueError, match=REFUSAL_MESSAGES[key]):
            call(op, As, Bs, via)
    try:
        assert op.path(As, Bs) == "none", op.name
    except ValueError:
        pass
    # the op itself still right on a 2-D call
    values = [torch.randn(72, device="cuda").to(op.out_dtype)] if not identity else []
    a2, b2 = As[1], Bs[1]
    d = op(a2, b2, *values)
    ref = a2.double() @ b2.double()
    if values:
        ref = torch.relu(ref + values[0].double())
    assert rel_error(d, ref) <= BOUND[op.dtype], op.name
    if DEFAULT in ops:
        assert_still_right(ops[DEFAULT])
