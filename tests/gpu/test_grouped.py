"""Grouped GEMM on the GPU (issue 21 part 4b, the mixture-of-experts form): ``op.grouped(A, B, offsets)`` and
``torch.ops.<namespace>.<name>.grouped(A, B, offsets)``.

A (total_M, K) holds every group's rows one after another (tokens sorted by expert), in the plan's order for A;
offsets is a 1-D int32 CUDA tensor of the E cumulative group ends (group g is rows [offsets[g - 1], offsets[g]) of A
and D, group 0 from row 0; a group may be empty; offsets[-1] == total_M); B is (E, K, N), each B[g] in the plan's
order for B, any expert stride (for layout tn: B = W.transpose(1, 2) with W (E, N, K)); D (total_M, N) in the plan's
D order, D[rows of g] = A[rows of g] @ B[g]: torch._grouped_mm(A, B, offs=offsets) for a 2-D A and a 3-D B.

Plans: sm90 cooperative and pingpong (the only schedules that take grouped calls), both layouts with a row-major A
(the others are refused), bf16 and fp16,
clusters 2x1, 1x2 and 1x1; and the plans that refuse them (sm80, ws, stream-K, a fused epilogue).

Every check draws fresh random inputs and compares with a float64 reference computed per group
(A[rows of g].double() @ B[g].double()): ||D - ref|| / ||ref|| over the whole D, and over each non-empty group, at
most gpu_cases.BOUND[dtype]. A grouped call has no out=, so unwritten rows are caught two ways: each check runs twice
on new inputs, the first call after a NaN-filled block of D's size went back to torch's caching allocator (the op's
D is likely to get it: a row left unwritten reads NaN), the second after the first call's D was dropped (likely
reused: a row left unwritten holds the first inputs' product, which fails the second reference). Operands are
padded with NaN (leading dimensions, and the stride between B's experts where a case pads it), so a wrong leading
dimension or expert stride reads NaN.

Cases: E in {1, 3, 8, 17}; groups of 0, 1, multiples of 128 and ragged sizes; empty groups first and last; every
group empty but one; total_M = 0 (D (0, N), no kernel of ours launched); N in {72, 200, 1000} and K in
{64, 200, 1000}, and K = 0 (zeros); bit-identical repeats; CUDA graph capture and replay with the data and the group
sizes changed in place between replays (the kernel reads offsets on the device); torch.compile(fullgraph=True);
opcheck; the same results as torch._grouped_mm where this torch takes the operands; the refusals (each of its
documented type, the op right afterwards).

All kernels (9 plans) are built in one parallel ninja run (module fixture)."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from gpu_cases import BOUND, ops_for_this_gpu, op_of  # noqa: E402
from generator import Gemm  # noqa: E402

pytestmark = pytest.mark.gpu
NAMESPACE = "gemmgen_grouped_test"
NAN = float("nan")

#: (id, Gemm kwargs): the plans that take grouped calls (sm90 cooperative / pingpong, no epilogue, A row-major: a
#: group starts at any row, which a TMA load of a column-major A cannot start at), both layouts with a row-major A.
GROUPED_PLANS: dict[str, dict] = {
    # the default plan at arch=90 (README): 128x256 cooperative, cluster 2x1
    "tn_bf16_coop_c2x1": dict(dtype="bf16", layout="tn", arch=90, schedule="cooperative", tile_shape=(128, 256, 64),
                              cluster_shape=(2, 1)),
    "tn_bf16_pp_128x128": dict(dtype="bf16", layout="tn", arch=90, schedule="pingpong", tile_shape=(128, 128, 64),
                               cluster_shape=(1, 1)),
    "tt_fp16_coop_c1x2": dict(dtype="fp16", layout="tt", arch=90, schedule="cooperative", tile_shape=(128, 128, 64),
                              cluster_shape=(1, 2)),
    # an odd width: its epilogue staged in the ring (planner.sm90.ring_staged), the held slot under the groups' walk
    "tn_bf16_pp_128x96_staged": dict(dtype="bf16", layout="tn", arch=90, schedule="pingpong",
                                     tile_shape=(128, 96, 64), cluster_shape=(1, 1)),
    "tt_bf16_coop": dict(dtype="bf16", layout="tt", arch=90, schedule="cooperative"),
    "tt_bf16_pp": dict(dtype="bf16", layout="tt", arch=90, schedule="pingpong"),
    # planned for ragged groups (Gemm's ragged=True): 128x128 pingpong 1x2 (DeepSeek-V3 EP8's experts at 4096 tokens)
    # and 128x192 cooperative 1x2 (Mixtral's at 512 tokens)
    "tn_bf16_ragged_pp": dict(dtype="bf16", layout="tn", arch=90, m=148, n=4096, k=7168, batch=32, ragged=True),
    "tn_bf16_ragged_coop": dict(dtype="bf16", layout="tn", arch=90, m=128, n=28672, k=4096, batch=8, ragged=True),
    # a decode step's groups (at most 4 rows each, planner RAGGED_FEW_ROWS): 64x128 pingpong
    "tn_bf16_ragged_decode": dict(dtype="bf16", layout="tn", arch=90, m=1, n=1536, k=2048, batch=128, ragged=True),
}
DEFAULT = "tn_bf16_coop_c2x1"
#: Plans that refuse grouped calls, and a regular expression their message must match (the fix it names).
REFUSING_PLANS: dict[str, dict] = {
    "sm80_tn_bf16": dict(dtype="bf16", layout="tn", arch=80),
    "sm90_tn_bf16_ws": dict(dtype="bf16", layout="tn", arch=90, schedule="ws"),
    "sm90_nn_bf16_pp": dict(dtype="bf16", layout="nn", arch=90, schedule="pingpong"),
    "sm90_nt_fp16_coop": dict(dtype="fp16", layout="nt", arch=90, schedule="cooperative"),
    "sm90_tn_bf16_relu_bias": dict(dtype="bf16", layout="tn", arch=90, schedule="cooperative", activation="relu",
                                   bias="col"),
}
#: Stream-K is not a Gemm knob: the cooperative config with stream_k=True (as tests/gpu/test_stream_k.py).
STREAM_K = "sm90_tn_bf16_stream_k"
STREAM_K_PLAN = dict(dtype="bf16", layout="tn", arch=90, schedule="cooperative", tile_shape=(128, 64, 64),
                     cluster_shape=(1, 1))
REFUSAL_MESSAGES = {"sm80_tn_bf16": "arch=90", "sm90_tn_bf16_ws": "schedule", "sm90_nn_bf16_pp": "layout='tn'",
                    "sm90_nt_fp16_coop": "layout='tt'", STREAM_K: "(?i)stream|schedule",
                    "sm90_tn_bf16_relu_bias": "(?i)epilogue"}


def configs() -> dict:
    found = {key: Gemm(**kw).config for key, kw in {**GROUPED_PLANS, **REFUSING_PLANS}.items()}
    found[STREAM_K] = replace(Gemm(**STREAM_K_PLAN).config, stream_k=True)
    return found


@pytest.fixture(scope="module")
def ops():
    return ops_for_this_gpu(configs(), NAMESPACE)


def test_plans_are_what_they_say():
    """The plans under test have the schedules and layouts their ids name (a planner change must not quietly move
    a case onto another kernel)."""
    cfgs = configs()
    for key, cfg in cfgs.items():
        if key in GROUPED_PLANS:
            assert cfg.family == "sm90" and cfg.schedule in ("cooperative", "pingpong"), key
            assert not cfg.stream_k and not cfg.epilogue.operands, key
            assert cfg.layout.blas == key.split("_")[0], key
            assert cfg.layout.c.value == "row", key
    assert {c.layout.blas for k, c in cfgs.items() if k in GROUPED_PLANS} == {"tn", "tt"}
    assert cfgs["tn_bf16_ragged_pp"].tile[:2] == (128, 128) and cfgs["tn_bf16_ragged_pp"].cluster == (1, 2)
    assert cfgs["tn_bf16_ragged_coop"].tile[:2] == (128, 192) and cfgs["tn_bf16_ragged_coop"].cluster == (1, 2)
    assert cfgs["tn_bf16_pp_128x96_staged"].staging_in_ring
    assert cfgs[DEFAULT].name == Gemm("bf16", "tn", arch=90).name   # the default plan
    assert cfgs["sm80_tn_bf16"].family == "sm80"
    assert cfgs["sm90_tn_bf16_ws"].schedule == "ws"
    assert cfgs[STREAM_K].stream_k


# -- operands --------------------------------------------------------------------------------------------------

def ceil8(x: int) -> int:
    """The smallest leading dimension >= x that is a multiple of 8 elements (16 bytes of a 16-bit type), at least 8."""
    return max(8, -(-x // 8) * 8)


def ends_of(sizes) -> list[int]:
    """Group sizes -> the cumulative group ends (offsets)."""
    ends, total = [], 0
    for s in sizes:
        total += s
        ends.append(total)
    return ends


def offsets_of(sizes, device: str = "cuda", dtype=None) -> torch.Tensor:
    return torch.tensor(ends_of(sizes), dtype=dtype or torch.int32, device=device)


def bounds(sizes) -> list[tuple[int, int]]:
    """[(first row, end row)] of each group."""
    ends = ends_of(sizes)
    return [(e - s, e) for s, e in zip(sizes, ends)]


def stored(rows: int, cols: int, order: str, dtype: torch.dtype, pad: int = 0) -> torch.Tensor:
    """A fresh random (rows, cols) matrix stored `order`-major ("row" / "col"), its leading dimension the inner size
    padded to 16 bytes plus `pad` elements, NaN in the padding."""
    outer, inner = (rows, cols) if order == "row" else (cols, rows)
    ld = ceil8(inner) + pad
    buf = torch.full((outer, ld), NAN, dtype=dtype, device="cuda")
    buf[:, :inner] = torch.randn(outer, inner, device="cuda").to(dtype)
    view = buf[:, :inner]
    return view if order == "row" else view.t()


def experts(count: int, rows: int, cols: int, order: str, dtype: torch.dtype, *, gap: int = 0,
            pad: int = 0) -> torch.Tensor:
    """Fresh random (count, rows, cols) matrices, each stored `order`-major with its leading dimension padded to 16
    bytes plus `pad`, and `gap` elements of NaN after each matrix (a padded expert stride: a slice of a bigger tensor),
    NaN in every padding. Layout tn's B (order "col") is W.transpose(1, 2) for a W (count, N, K)."""
    outer, inner = (rows, cols) if order == "row" else (cols, rows)
    ld = ceil8(inner) + pad
    stride = outer * ld + gap
    buf = torch.full((count * stride + 16,), NAN, dtype=dtype, device="cuda")
    buf.as_strided((count, outer, inner), (stride, ld, 1)).copy_(torch.randn(count, outer, inner, device="cuda"))
    return buf.as_strided((count, rows, cols), (stride, ld, 1) if order == "row" else (stride, 1, ld))


def refill(view: torch.Tensor) -> None:
    """New random values in a view (its padding keeps its NaN)."""
    view.copy_(torch.randn(view.shape, device="cuda").to(view.dtype))


def inputs(op, sizes, n: int, k: int, *, a_pad: int = 0, b_gap: int = 0, b_pad: int = 0
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh A (total_M, K), B (E, K, N) in the plan's orders, and the int32 offsets of `sizes`."""
    layout = op.config.layout
    a = stored(sum(sizes), k, layout.a.value, op.dtype, a_pad)
    b = experts(len(sizes), k, n, layout.b.value, op.dtype, gap=b_gap, pad=b_pad)
    return a, b, offsets_of(sizes)


def reference(a: torch.Tensor, b: torch.Tensor, sizes) -> torch.Tensor:
    """The float64 result, group by group: A[rows of g] @ B[g]."""
    ref = torch.zeros(a.shape[0], b.shape[-1], dtype=torch.float64, device=a.device)
    for g, (start, end) in enumerate(bounds(sizes)):
        if end > start:
            ref[start:end] = a[start:end].double() @ b[g].double()
    return ref


def rel_error(d: torch.Tensor, ref: torch.Tensor) -> float:
    return ((d.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def call(op, a, b, offsets, via: str = "method"):
    if via == "method":
        return op.grouped(a, b, offsets)
    return getattr(getattr(torch.ops, NAMESPACE), op.name).grouped(a, b, offsets)


def path_of(op, a, b, offsets) -> str | None:
    """The path the op reports for a grouped call (op.grouped_path(A, B, offsets) or op.path(A, B, offsets=offsets),
    whichever it has), or None if it has neither."""
    grouped_path = getattr(op, "grouped_path", None)
    if callable(grouped_path):
        return grouped_path(a, b, offsets)
    try:
        return op.path(a, b, offsets=offsets)
    except TypeError:   # a path() without offsets=
        return None


def check_result(op, d: torch.Tensor, ref: torch.Tensor, sizes, what: str) -> None:
    """D's shape, dtype and order; finite; within BOUND of ref over the whole D and in every non-empty group."""
    total, n = ref.shape
    assert tuple(d.shape) == (total, n), f"{what}: D is {tuple(d.shape)}, expected {(total, n)}"
    assert d.dtype == op.out_dtype and d.device == ref.device, f"{what}: D is {d.dtype} on {d.device}"
    if total > 1 and n > 1:
        want = (n, 1) if op.config.layout.c.value == "row" else (1, total)
        assert tuple(d.stride()) == want, f"{what}: D has strides {tuple(d.stride())}, expected {want}"
    if d.numel() == 0:
        return
    bad = ~torch.isfinite(d)
    if bad.any():
        rows = bad.any(dim=1).nonzero().flatten()[:8].tolist()
        raise AssertionError(f"{what}: unwritten (NaN) or NaN-reading rows, e.g. {rows}")
    err = rel_error(d, ref)
    assert err <= BOUND[op.dtype], f"{what}: rel error {err:.3g} > {BOUND[op.dtype]}"
    for g, (start, end) in enumerate(bounds(sizes)):
        if end > start:
            e = rel_error(d[start:end], ref[start:end])
            assert e <= BOUND[op.dtype], (f"{what}: group {g} (rows {start}:{end}) rel error {e:.3g} > "
                                          f"{BOUND[op.dtype]} (a stale, unwritten or misplaced group)")


def check(op, sizes, n: int, k: int, *, a_pad: int = 0, b_gap: int = 0, via: str = "method",
          label: str = "") -> torch.Tensor:
    """Two grouped calls on fresh inputs of the same shapes, each against its float64 reference (module docstring:
    the first after a NaN block of D's size was freed, the second after the first D was). Returns the second D."""
    what = f"{op.name} {label}sizes={list(sizes)} N={n} K={k} a_pad={a_pad} b_gap={b_gap} via {via}"
    total = sum(sizes)
    previous = None
    for attempt in (1, 2):
        a, b, offsets = inputs(op, sizes, n, k, a_pad=a_pad, b_gap=b_gap)
        ref = reference(a, b, sizes)
        if previous is None:
            # freed at once: a block of D's size holding NaN, which the op's allocation of D is likely to get
            torch.full((max(total, 1), n), NAN, dtype=op.out_dtype, device="cuda")
        previous = None   # drop the last D (the previous inputs' product): likely the block this D gets
        if total > 0:
            assert path_of(op, a, b, offsets) in (None, "grouped"), what
        d = call(op, a, b, offsets, via)
        torch.cuda.synchronize()
        check_result(op, d, ref, sizes, f"{what} (call {attempt})")
        previous = d
    return previous


# -- numerics ------------------------------------------------------------------------------------------------

#: (label, group sizes, N, K). Each row runs on every grouped plan; even rows with packed operands, odd rows with
#: A's leading dimension and B's expert stride padded (NaN there).
CASES = (
    ("E=1", [300], 200, 64),
    ("E=1, one row", [1], 72, 1000),
    ("E=3, first empty", [0, 1, 255], 1000, 200),
    ("E=3, 128s and ragged", [128, 0, 129], 72, 1000),
    ("E=8", [0, 1, 127, 129, 0, 300, 64, 5], 200, 200),
    ("E=8, one group", [0, 0, 0, 0, 0, 513, 0, 0], 1000, 64),
    ("E=17, first and last empty", [0, 128, 1, 0, 256, 77, 129, 0, 5, 384, 1, 0, 63, 200, 0, 128, 0], 200, 1000),
    ("E=17, all ones", [1] * 17, 72, 200),
    ("E=3, only the last", [0, 0, 7], 72, 64),
    ("E=3, many tiles per group", [2048, 1, 1500], 1000, 1000),
    ("E=17, multiples of 128", [128, 256, 0, 384, 128, 0, 640, 128, 128, 256, 0, 128, 512, 128, 0, 256, 128], 200, 64),
    # more groups than a warp walks at a time (32: GroupedRows::warp_chunk): a decode step's (most empty, a few of one
    # row), the last group's rows in the last chunk; a skewed routing over 257 groups
    ("E=70, a decode step's", [1 if g % 9 == 4 else 0 for g in range(69)] + [3], 200, 200),
    ("E=257, skewed", [(g * g) % 97 if g % 5 else 0 for g in range(257)], 72, 136),
)


def random_sizes(count: int, rng: random.Random) -> list[int]:
    """Group sizes drawn as a router would give them: zeros, ones, multiples of 128, ragged, a few large."""
    return [rng.choice([0, 0, 1, 128, 256, rng.randint(2, 127), rng.randint(129, 700)]) for _ in range(count)]


@pytest.mark.parametrize("key", list(GROUPED_PLANS))
def test_grouped_numerics(ops, key):
    """Every group size pattern of CASES, every N and K of them, packed and padded operands; then two group size
    patterns drawn at random (printed on failure), E = 8, 17 and 70."""
    op = op_of(ops, key)
    for i, (label, sizes, n, k) in enumerate(CASES):
        padded = i % 2 == 1
        check(op, sizes, n, k, a_pad=8 if padded else 0, b_gap=3 * ceil8(k) if padded else 0, label=f"{label}: ")
    rng = random.Random()
    for count, n, k in ((8, 1000, 200), (17, 72, 1000), (70, 136, 200)):
        check(op, random_sizes(count, rng), n, k, b_gap=8, label="random sizes: ")


@pytest.mark.parametrize("key", [DEFAULT, "tt_fp16_coop_c1x2"])
def test_torch_ops_overload(ops, key):
    """torch.ops.<namespace>.<name>.grouped is the same op as op.grouped."""
    op = op_of(ops, key)
    for sizes, n, k in (([0, 1, 127, 129, 0, 300, 64, 5], 200, 200), ([129, 0, 0], 72, 1000)):
        check(op, sizes, n, k, via="torch.ops")
        a, b, offsets = inputs(op, sizes, n, k)
        assert torch.equal(call(op, a, b, offsets, "method"), call(op, a, b, offsets, "torch.ops"))


def cuda_kernels(fn) -> list[str]:
    """The names of the CUDA kernels `fn` launched (empty where the profiler cannot see kernels)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("key", [DEFAULT, "tt_bf16_pp"])
def test_no_rows(ops, key):
    """total_M = 0 (every group empty, E = 1, 3, 17): D (0, N), by both routes, and no kernel of ours launched (the
    offsets check may copy to the host or run torch kernels; those are not ours). The profiler must see our kernel
    on a call with rows, or the empty calls' check would prove nothing."""
    op = op_of(ops, key)
    empty = (([0], 72, 64), ([0, 0, 0], 200, 200), ([0] * 17, 1000, 1000))
    for sizes, n, k in empty:
        a, b, offsets = inputs(op, sizes, n, k)
        for via in ("method", "torch.ops"):
            d = call(op, a, b, offsets, via)
            assert tuple(d.shape) == (0, n) and d.dtype == op.out_dtype, f"{op.name} {sizes}: D {tuple(d.shape)}"
    a, b, offsets = inputs(op, [3, 0, 130], 200, 64)
    seen = cuda_kernels(lambda: op.grouped(a, b, offsets))
    if not seen:
        pytest.skip("the profiler sees no CUDA kernels here: cannot tell whether an empty call launches one")
    assert any(name.startswith(op.name) for name in seen), (
        f"{op.name}: a call with rows launched {seen}, none named after the op: cannot check empty calls")
    for sizes, n, k in empty:
        a, b, offsets = inputs(op, sizes, n, k)
        for via in ("method", "torch.ops"):
            launched = [name for name in cuda_kernels(lambda: call(op, a, b, offsets, via))
                        if name.startswith(op.name)]
            assert launched == [], f"{op.name}: total_M = 0 ({len(sizes)} groups, via {via}) launched {launched}"
    check(op, [0, 1, 127, 129, 0, 300, 64, 5], 200, 200, label="after empty calls: ")


@pytest.mark.parametrize("key", [DEFAULT, "tt_fp16_coop_c1x2"])
def test_k_zero(ops, key):
    """K = 0: every row of D is a sum of nothing, zeros (written: the allocation of D is handed a NaN block first)."""
    op = op_of(ops, key)
    for sizes, n in (([0, 77, 130, 1], 200), ([5], 72)):
        a, b, offsets = inputs(op, sizes, n, 0)
        torch.full((sum(sizes), n), NAN, dtype=op.out_dtype, device="cuda")   # freed at once
        d = op.grouped(a, b, offsets)
        torch.cuda.synchronize()
        assert tuple(d.shape) == (sum(sizes), n), f"{op.name} K = 0: D {tuple(d.shape)}"
        assert (d == 0).all(), f"{op.name} K = 0, sizes {sizes}: D is not all zeros"
    check(op, [0, 1, 127, 129, 0, 300, 64, 5], 200, 200, label="after K = 0: ")


@pytest.mark.parametrize("key", list(GROUPED_PLANS))
def test_bit_identical_repeats(ops, key):
    """The same inputs give the same bits on every call (no split sums to order differently)."""
    op = op_of(ops, key)
    for sizes, n, k in (([0, 1, 127, 129, 0, 300, 64, 5], 1000, 1000), ([2048, 0, 1], 200, 200)):
        a, b, offsets = inputs(op, sizes, n, k)
        first = op.grouped(a, b, offsets).clone()
        check_result(op, first, reference(a, b, sizes), sizes, f"{op.name} {sizes}")
        for _ in range(3):
            assert torch.equal(op.grouped(a, b, offsets), first), f"{op.name} {sizes} N={n} K={k}: differs between runs"


@pytest.mark.parametrize("key", [DEFAULT, "tn_bf16_pp_128x128", "tt_fp16_coop_c1x2"])
def test_b_padded_expert_stride_and_slices(ops, key):
    """B a slice of a bigger tensor: a padded expert stride (NaN between the experts), a padded leading dimension,
    and the first E experts of a bigger stack; A a row range of a bigger buffer (16-byte aligned)."""
    op = op_of(ops, key)
    layout = op.config.layout
    sizes, n, k = [0, 77, 130, 1, 256], 200, 1000
    for gap, pad in ((8, 0), (3 * ceil8(k), 8), (ceil8(k) * 64, 16)):
        a, b, offsets = inputs(op, sizes, n, k, b_gap=gap, b_pad=pad)
        check_result(op, op.grouped(a, b, offsets), reference(a, b, sizes), sizes,
                     f"{op.name} B strides {b.stride()} (gap {gap}, pad {pad})")
    # the first 5 of 9 experts, and A rows 64.. of a bigger buffer (a 16-byte aligned start)
    big_b = experts(9, k, n, layout.b.value, op.dtype, gap=16)
    big_a = stored(sum(sizes) + 100, k, layout.a.value, op.dtype)
    b, a = big_b[:5], big_a[64:64 + sum(sizes)]
    offsets = offsets_of(sizes)
    check_result(op, op.grouped(a, b, offsets), reference(a, b, sizes), sizes, f"{op.name} sliced A and B")


@pytest.mark.parametrize("key", list(GROUPED_PLANS))
def test_same_as_torch_grouped_mm(ops, key):
    """Where this torch's _grouped_mm takes the operands (it may refuse a layout or fp16): our D and its D agree
    within the bound of the float64 reference, and ours is within the bound. Skipped if it refuses every case."""
    op = op_of(ops, key)
    grouped_mm = getattr(torch, "_grouped_mm", None)
    if grouped_mm is None:
        pytest.skip("this torch has no torch._grouped_mm")
    compared, refused = 0, []
    for sizes, n, k in (([0, 1, 127, 129, 0, 300, 64, 5], 200, 200), ([512, 256, 1024], 1000, 1000),
                        ([0, 128, 0], 72, 64)):
        a, b, offsets = inputs(op, sizes, n, k)
        try:
            theirs = grouped_mm(a, b, offs=offsets)
            torch.cuda.synchronize()
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as err:
            refused.append(f"{sizes}: {str(err).splitlines()[0][:200]}")
            continue
        ref = reference(a, b, sizes)
        theirs_err = rel_error(theirs, ref)
        if not theirs_err <= BOUND[op.dtype]:   # a layout this torch computes wrongly: nothing to compare with
            refused.append(f"{sizes}: torch's own rel error {theirs_err:.3g}")
            continue
        ours = op.grouped(a, b, offsets)
        what = f"{op.name} {sizes} N={n} K={k}"
        check_result(op, ours, ref, sizes, what)
        apart = ((ours.double() - theirs.double()).norm() / ref.norm()).item()
        assert apart <= 2 * BOUND[op.dtype], (f"{what}: ours and torch._grouped_mm differ by {apart:.3g} (relative); "
                                              f"torch's own rel error {theirs_err:.3g}")
        compared += 1
    if not compared:
        pytest.skip("torch._grouped_mm refused every case: " + "; ".join(refused))


# -- CUDA graphs, torch.compile, opcheck -----------------------------------------------------------------------

#: Group size patterns of one total (494 rows, E = 6), replayed in turn through one captured graph.
GRAPH_SIZES = ([0, 129, 1, 300, 0, 64], [300, 0, 0, 1, 129, 64], [494, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 494],
               [82, 82, 83, 82, 82, 83])


@pytest.mark.parametrize("key", [DEFAULT, "tn_bf16_pp_128x128", "tt_fp16_coop_c1x2", "tt_bf16_coop"])
def test_cuda_graph_capture_and_replay(ops, key):
    """op.grouped captured with torch.cuda.graph (no host copy of the offsets while capturing), replayed with new
    A, B and new group sizes written into the same tensors: the kernel reads the offsets on the device, so every
    replay equals an eager call on the same data, and the float64 reference."""
    op = op_of(ops, key)
    n, k = 1000, 200
    a, b, offsets = inputs(op, GRAPH_SIZES[0], n, k, a_pad=8, b_gap=8)
    op.grouped(a, b, offsets)   # build and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_d = op.grouped(a, b, offsets)
    for sizes in GRAPH_SIZES[1:] + GRAPH_SIZES[:1]:
        refill(a)
        refill(b)
        offsets.copy_(offsets_of(sizes))
        graph.replay()
        torch.cuda.synchronize()
        what = f"{op.name} replay with sizes {sizes}"
        check_result(op, static_d, reference(a, b, sizes), sizes, what)
        assert torch.equal(static_d, op.grouped(a, b, offsets)), f"{what}: differs from an eager call"


@pytest.mark.parametrize("via", ["method", "torch.ops"])
def test_torch_compile_fullgraph(ops, via):
    """torch.compile(fullgraph=True) of a function calling the grouped op: the fake gives (total_M, N) in the plan's
    D order, and the compiled result equals the eager one, for new group sizes and a new total_M (recompiled or
    dynamic) too."""
    for key in (DEFAULT, "tt_bf16_pp"):
        op = op_of(ops, key)

        def f(a, b, offsets):
            return torch.relu(call(op, a, b, offsets, via)) * 2

        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True)
        with torch.no_grad():
            for sizes in ([0, 129, 1, 300], [300, 1, 129, 0], [64, 0, 5, 1000], [0, 0, 0, 77]):
                a, b, offsets = inputs(op, sizes, 200, 200)
                got, want = compiled(a, b, offsets), f(a, b, offsets)
                assert got.shape == want.shape == (sum(sizes), 200)
                torch.testing.assert_close(got, want)
                ref = 2 * torch.relu(reference(a, b, sizes))
                assert rel_error(want, ref) <= BOUND[op.dtype], f"{op.name} {sizes}"


def test_opcheck(ops):
    """torch.library.opcheck of the grouped overload: schema (no input mutated), fake tensor and AOT dispatch
    (static and dynamic shapes). The autograd-registration test is left out: inputs that require grad are refused."""
    op = op_of(ops, DEFAULT)
    overload = getattr(getattr(torch.ops, NAMESPACE), op.name).grouped
    every = ("test_schema", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
    # (total_M = 0: schema and fake only; a size of 0 is never traced as a dynamic size)
    for sizes, utils in (([0, 1, 127, 129, 0, 300, 64, 5], every), ([0, 0, 0], every[:2])):
        a, b, offsets = inputs(op, sizes, 200, 200)
        torch.library.opcheck(overload, (a, b, offsets), test_utils=utils)


# -- refusals --------------------------------------------------------------------------------------------------

SIZES, N_, K_ = [0, 77, 130, 1], 200, 200


def assert_still_right(op) -> None:
    check(op, [0, 1, 127, 129, 0, 300, 64, 5], 200, 200, label="after a refusal: ")


def _with(**change):
    """A refusal case: the default inputs (SIZES, N_, K_) with some replaced; change maps a name (a, b, offsets) to a
    function of (op, a, b, offsets) giving the replacement."""
    def make(op):
        a, b, offsets = inputs(op, SIZES, N_, K_)
        values = dict(a=a, b=b, offsets=offsets)
        for name, fn in change.items():
            values[name] = fn(op, a, b, offsets)
        return values["a"], values["b"], values["offsets"]
    return make


def _unaligned_k(op, *_):
    # K = 4097: A's rows (row-major, tn) and B's (K-major) are 8194 bytes apart, off the 16-byte rule
    k = 4097
    a = torch.randn(sum(SIZES), k, device="cuda").to(op.dtype)
    b = torch.randn(len(SIZES), N_, k, device="cuda").to(op.dtype).transpose(1, 2)
    return a, b, offsets_of(SIZES)


def _odd_expert_stride(op, a, b, offsets):
    # each B[g] (K, N) K-major with a padded leading dimension, experts one element further apart than 16 bytes allow
    return experts(len(SIZES), K_, N_, "col", op.dtype, gap=1)


def _misaligned_a(op, a, b, offsets):
    # A's first element 2 bytes past a 16-byte boundary (its rows keep a 16-byte pitch)
    buf = torch.randn(sum(SIZES), K_ + 8, device="cuda").to(op.dtype)
    return buf[:, 1:K_ + 1]


#: name: (make (A, B, offsets) from the default op, the error type). The default plan is tn: A row-major, B K-major.
REFUSED = {
    "offsets float32": (_with(offsets=lambda op, a, b, o: o.float()), TypeError),
    "offsets int64": (_with(offsets=lambda op, a, b, o: o.long()), TypeError),
    "offsets a list": (_with(offsets=lambda op, a, b, o: o.tolist()), TypeError),
    "offsets one short": (_with(offsets=lambda op, a, b, o: o[1:].contiguous()), ValueError),
    "offsets one long": (_with(offsets=lambda op, a, b, o: torch.cat([o, o[-1:]])), ValueError),
    "offsets 2-D": (_with(offsets=lambda op, a, b, o: o.reshape(-1, 1)), ValueError),
    "offsets decreasing": (_with(offsets=lambda op, a, b, o: torch.tensor([100, 50, 207, 208], dtype=torch.int32,
                                                                          device="cuda")), ValueError),
    "offsets negative": (_with(offsets=lambda op, a, b, o: torch.tensor([-1, 76, 207, 208], dtype=torch.int32,
                                                                        device="cuda")), ValueError),
    "offsets end short of total_M": (_with(offsets=lambda op, a, b, o: o - (o == o[-1]).int()), ValueError),
    "offsets end past total_M": (_with(offsets=lambda op, a, b, o: o + (o == o[-1]).int()), ValueError),
    "offsets on the CPU": (_with(offsets=lambda op, a, b, o: o.cpu()), ValueError),
    "A on the CPU": (_with(a=lambda op, a, b, o: a.cpu()), ValueError),
    # (inputs that require grad are taken: tests/gpu/test_grouped_autograd.py)
    "A 3-D": (_with(a=lambda op, a, b, o: a.unsqueeze(0)), ValueError),
    "B 2-D": (_with(b=lambda op, a, b, o: b[1]), ValueError),
    "K disagrees": (_with(b=lambda op, a, b, o: experts(len(SIZES), K_ + 8, N_, "col", op.dtype)), ValueError),
    "A of another dtype": (_with(a=lambda op, a, b, o: a.half()), TypeError),
    "B row-major on a tn plan": (_with(b=lambda op, a, b, o: b.contiguous()), ValueError),
    "K = 4097 (A's and B's rows off 16 bytes)": (_unaligned_k, ValueError),
    "B's expert stride off 16 bytes": (_with(b=_odd_expert_stride), ValueError),
    "A's base off 16 bytes": (_with(a=_misaligned_a), ValueError),
}


METHOD_ONLY = {"offsets a list"}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refusals_then_right(ops, case):
    """Each refusal raises its documented type before any launch, by both routes; the next calls are right."""
    op = op_of(ops, DEFAULT)
    make, error = REFUSED[case]
    a, b, offsets = make(op)
    # (a list where the schema has a Tensor: the dispatcher's own error on torch.ops, not ours)
    for via in ("method",) if case in METHOD_ONLY else ("method", "torch.ops"):
        with pytest.raises(error):
            call(op, a, b, offsets, via)
            torch.cuda.synchronize()
    assert_still_right(op)


def test_odd_n_refused_or_right(ops):
    """An odd N: on layout tt B's rows (N elements) break the 16-byte rule: refused (ValueError). On layout tn only
    D's rows would: refused with a ValueError, or, where the op keeps D's rows aligned itself, right."""
    n = 137
    op = op_of(ops, "tt_bf16_coop")
    a, _, offsets = inputs(op, SIZES, n, K_)
    b = torch.randn(len(SIZES), K_, n, device="cuda").to(op.dtype)   # row-major, leading dimension N = 137
    for via in ("method", "torch.ops"):
        with pytest.raises(ValueError):
            call(op, a, b, offsets, via)
    assert_still_right(op)
    op = op_of(ops, DEFAULT)
    a = torch.randn(sum(SIZES), K_, device="cuda").to(op.dtype)
    b = torch.randn(len(SIZES), n, K_, device="cuda").to(op.dtype).transpose(1, 2)
    try:
        d = op.grouped(a, b, offsets)
    except ValueError:
        pass
    else:
        torch.cuda.synchronize()
        assert d.shape == (sum(SIZES), n)
        assert torch.isfinite(d).all() and rel_error(d, reference(a, b, SIZES)) <= BOUND[op.dtype], op.name
    assert_still_right(op)


@pytest.mark.parametrize("key", list(REFUSAL_MESSAGES))
def test_plans_without_grouped_kernel_refuse(ops, key):
    """sm80, ws, stream-K and fused-epilogue plans take no grouped call: ValueError naming the fix, by both routes;
    the op's own (2-D) calls and the default op's grouped calls stay right."""
    op = op_of(ops, key)
    a, b, offsets = inputs(op, SIZES, N_, K_)
    # (an op with a fused epilogue may have no .grouped overload at all: then only the method can refuse)
    has_overload = hasattr(getattr(getattr(torch.ops, NAMESPACE), op.name), "grouped")
    assert has_overload or op.config.epilogue.operands, f"{op.name} has no .grouped overload"
    for via in ("method", "torch.ops") if has_overload else ("method",):
        with pytest.raises(ValueError, match=REFUSAL_MESSAGES[key]):
            call(op, a, b, offsets, via)
    # the op itself still right on a 2-D call
    values = [torch.randn(N_, device="cuda").to(op.out_dtype)] if op.config.epilogue.operands else []
    a2, b2 = a[:129], b[1]
    d = op(a2, b2, *values)
    ref = a2.double() @ b2.double()
    if values:
        ref = torch.relu(ref + values[0].double())
    assert rel_error(d, ref) <= BOUND[op.dtype], op.name
    if DEFAULT in ops:
        assert_still_right(ops[DEFAULT])
