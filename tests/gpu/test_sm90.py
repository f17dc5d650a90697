"""GPU numerics of the sm90 family (TMA, mbarrier ring, wgmma; warp-specialized) on Hopper.

Every schedule and cluster shape the templates offer, with all 4 layouts x 2 input dtypes x 3 output
dtypes, against a float64 reference on fresh random inputs, output poisoned with NaN first. Ragged
sizes use operands whose leading dimension is padded to 16 bytes, so they take the TMA path (its
out-of-bounds zero fill and the bounded stores are what is under test); the unaligned path has its
own tests in test_numerics.py.
"""
from __future__ import annotations

import itertools
import random

import pytest

torch = pytest.importorskip("torch")

from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from generator.planner.shipped import shipped_configs  # noqa: E402
from generator.planner.sm90 import with_staging_in_ring  # noqa: E402
from generator.spec.config import takes_small_m  # noqa: E402

from gpu_cases import BOUND, DTYPES, LAYOUTS, OUT_DTYPES, RAGGED, gemm_error  # noqa: E402

pytestmark = pytest.mark.gpu

# (schedule, tile, cluster): every schedule, every cluster shape, all three consumer splits (along M, a 64-row
# cooperative tile's along N, pingpong's whole tiles).
VARIANTS = (
    ("cooperative", (128, 256, 64), (2, 1)),
    ("cooperative", (128, 256, 64), (1, 1)),
    ("cooperative", (128, 256, 64), (1, 2)),
    ("cooperative", (256, 128, 64), (2, 1)),
    ("cooperative", (128, 128, 64), (1, 2)),
    ("ws", (128, 128, 64), (1, 1)),
    ("ws", (128, 256, 64), (2, 1)),
    ("pingpong", (64, 256, 64), (1, 1)),
    ("pingpong", (128, 128, 64), (2, 1)),
    ("pingpong", (64, 128, 64), (1, 2)),
    ("cooperative", (128, 256, 64), (2, 2)),
    ("pingpong", (128, 128, 64), (4, 1)),
    ("ws", (128, 128, 64), (1, 4)),
    ("cooperative", (128, 320, 64), (2, 1)),  # two wgmmas (n256 + n64) per m64 block and k step
    ("cooperative", (64, 128, 64), (1, 1)),   # split along N: 64 x 64 per consumer warpgroup
    ("cooperative", (64, 256, 64), (2, 1)),
    ("cooperative", (64, 128, 64), (1, 2)),
)


def _is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


if not _is_hopper():
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="the sm90 family needs a Hopper GPU (sm_90)")]


def variant_id(v: tuple) -> str:
    schedule, tile, cluster = v
    return f"{schedule}-{tile[0]}x{tile[1]}-c{cluster[0]}x{cluster[1]}"


def operand(rows: int, cols: int, order: str, dtype: torch.dtype) -> torch.Tensor:
    """Random (rows, cols) stored row- or column-major, leading dimension padded to 16 bytes."""
    if order == "row":
        ld = -(-cols // 8) * 8
        return torch.randn(rows, ld, device="cuda").to(dtype)[:, :cols]
    ld = -(-rows // 8) * 8
    return torch.randn(cols, ld, device="cuda").to(dtype)[:, :rows].t()


def operands(layout: str, m: int, n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    a_order = "row" if layout[0] == "t" else "col"
    b_order = "row" if layout[1] == "t" else "col"
    return operand(m, k, a_order, dtype), operand(k, n, b_order, dtype)


def poisoned_out(m: int, n: int, dtype: torch.dtype, col_major: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """D as a view into a NaN buffer whose rows (columns) are padded to 16 bytes; also the padding."""
    if col_major:
        buf = torch.full((n, -(-m // 8) * 8), float("nan"), dtype=dtype, device="cuda")
        return buf[:, :m].t(), buf[:, m:]
    buf = torch.full((m, -(-n // 8) * 8), float("nan"), dtype=dtype, device="cuda")
    return buf[:, :n], buf[:, n:]


def check(op, layout: str, m: int, n: int, k: int, col_major: bool = False) -> None:
    dtype = op.dtype
    a, b = operands(layout, m, n, k, dtype)
    out, padding = poisoned_out(m, n, op.out_dtype, col_major)
    if min(m, n, k) > 1:  # a size of 0 or 1 makes the other size the leading dimension (unpadded)
        # (at most 16 rows of a K-major A: the small-M kernel, common/gemm_small_m.cuh, within its bounds)
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        expected = "small_m" if takes_small_m(op.config, m, n, k, sms) else "fast"
        assert op.path(a, b) == expected, f"{op.name}: {m}x{n}x{k} should take the {expected} path"
    d = op(a, b, out=out)
    assert torch.isnan(padding).all(), f"{op.name} {layout} M={m} N={n} K={k}: wrote past D into its padding"
    ref = a.double() @ b.double()
    if k == 0:
        assert torch.count_nonzero(d) == 0 and not torch.isnan(d).any()
        return
    err = gemm_error(d, a, b, ref)
    assert err <= BOUND[dtype], f"{op.name} {layout} M={m} N={n} K={k}: rel error {err:.3g}"


@pytest.fixture(scope="session", autouse=True)
def exact_reference():
    torch.backends.cuda.matmul.allow_tf32 = False
    yield


def build_variants(variants, layouts, namespace: str) -> dict:
    """One op per (variant, layout, dtype, out dtype), all built in one parallel ninja run."""
    keys = list(itertools.product(variants, layouts, DTYPES, OUT_DTYPES))
    configs = [Gemm(dtype=dt, layout=lay, out_dtype=od, schedule=s, tile_shape=t, cluster_shape=c).config
               for (s, t, c), lay, dt, od in keys]
    return dict(zip(keys, compile_many(configs, namespace=namespace)))


@pytest.fixture(scope="session")
def variant_ops():
    return build_variants(VARIANTS, LAYOUTS, "gemmgen_sm90")


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matrix_ragged(variant_ops, variant, layout):
    """4 layouts x 2 dtypes x 3 output dtypes, ragged M, N, K drawn from RAGGED, for every variant."""
    for dt, od in itertools.product(DTYPES, OUT_DTYPES):
        op = variant_ops[(variant, layout, dt, od)]
        assert op.config.family == "sm90"
        rng = random.Random(f"{variant}{layout}{dt}{od}")
        shapes = [tuple(rng.choice(RAGGED) for _ in range(3)) for _ in range(6)] + [(1, 1, 1), (65, 129, 63)]
        for m, n, k in shapes:
            check(op, layout, m, n, k)


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_all_ragged_combinations_bf16(variant_ops, variant):
    """Every (M, N, K) of RAGGED (but the largest corners), bf16, layout tn and nt."""
    for layout in ("tn", "nt"):
        op = variant_ops[(variant, layout, "bf16", "bf16")]
        for m, n, k in itertools.product(RAGGED, repeat=3):
            if m * n * k > 2 * 10**9:
                continue
            check(op, layout, m, n, k)


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_large_and_repeatable(variant_ops, variant):
    """Large ragged problems; the same inputs give bit-identical outputs over 10 runs (a race would not)."""
    op = variant_ops[(variant, "tn", "bf16", "bf16")]
    for m, n, k in ((4097, 4095, 4104), (3000, 5000, 1000), (127, 8191, 4096), (8192, 1024, 2048)):
        check(op, "tn", m, n, k)
    a, b = operands("tn", 2000, 3000, 1000, torch.bfloat16)
    first = op(a, b)
    for _ in range(10):
        assert torch.equal(op(a, b), first)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v[2] == (1, 1) and v[0] != "ws"], ids=variant_id)
def test_grids_taken_in_sm_order(variant_ops, variant):
    """A 1x1 persistent grid of more units than half the SMs takes its units in the order of the SMs its blocks land
    on (sm90/block_order.cuh: a block per SM, those past the units idle): ragged grids of just over half the SMs, all
    of them, and one unit more, each right and the same bits on every call."""
    _, (bm, bn, _), _ = variant
    op = variant_ops[(variant, "tn", "bf16", "bf16")]
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    tiles_n = 8
    for units in (sms // 2 + 1, sms - 1, sms, sms + 1):
        tiles_m = -(-units // tiles_n)
        m, n = tiles_m * bm - 5, tiles_n * bn - 3   # (the last tile row and column ragged)
        check(op, "tn", m, n, 1000)
        a, b = operands("tn", m, n, 1000, torch.bfloat16)
        first = op(a, b)
        assert all(torch.equal(op(a, b), first) for _ in range(3)), f"{op.name} {m}x{n}x1000: bits moved"


# One per kind of grid: clustered, 1x1 in the SMs' order (more units than half the SMs: launched in stream order),
# non-persistent (ws).
EARLY_LAUNCH_VARIANTS = (("cooperative", (128, 256, 64), (2, 1)), ("pingpong", (64, 128, 64), (1, 2)),
                         ("cooperative", (128, 256, 64), (1, 1)), ("ws", (128, 128, 64), (1, 1)))


@pytest.fixture(scope="module")
def early_launch_ops():
    configs = [Gemm(dtype="bf16", layout="tn", schedule=s, tile_shape=t, cluster_shape=c).config
               for s, t, c in EARLY_LAUNCH_VARIANTS]
    return dict(zip(EARLY_LAUNCH_VARIANTS, compile_many(configs, namespace="gemmgen_sm90")))


@pytest.mark.parametrize("variant", EARLY_LAUNCH_VARIANTS, ids=variant_id)
def test_launched_early_waits_for_the_previous_kernel(early_launch_ops, variant):
    """GEMM launches may start while the stream's previous kernel runs (launch.cuh, GEMMGEN_SM90_PDL), and each lets the
    next one start once its loads are issued: a GEMM that reads the previous GEMM's D right after it, and one that
    overwrites an operand the previous GEMM reads, both see memory as in stream order (D poisoned first)."""
    op = early_launch_ops[variant]
    m, n, k = 4096 - 3, 2048 - 8, 1024   # (D1's rows 16-byte aligned: it is the next GEMM's TMA-loaded A)
    for _ in range(3):
        x, w1 = operands("tn", m, n, k, torch.bfloat16)
        _, w2 = operands("tn", m, 1000, n, torch.bfloat16)
        x3, w3 = operands("tn", m, n, k, torch.bfloat16)
        d1 = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        op(x, w1, out=d1)      # writes D1 ...
        d2 = op(d1, w2)        # ... which this reads at once (read after write)
        op(x3, w3, out=d1)     # overwrites D1 while the previous GEMM may still read it (write after read)
        d1_first = (x.double() @ w1.double()).to(torch.bfloat16)
        assert gemm_error(d2, d1_first, w2, d1_first.double() @ w2.double()) <= BOUND[torch.bfloat16], op.name
        assert gemm_error(d1, x3, w3, x3.double() @ w3.double()) <= BOUND[torch.bfloat16], op.name


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_zero_k_and_empty(variant_ops, variant):
    op = variant_ops[(variant, "nt", "fp16", "fp32")]
    check(op, "nt", 300, 200, 0)
    a, b = operands("nt", 0, 64, 32, torch.float16)
    assert op(a, b).shape == (0, 64)


@pytest.mark.parametrize("schedule", ["cooperative", "pingpong", "ws"])
def test_column_major_output(schedule):
    tile = (64, 128, 64) if schedule == "pingpong" else (128, 128, 64)
    op = Gemm(dtype="fp16", layout="nt", layout_c="col", schedule=schedule, tile_shape=tile,
              cluster_shape=(2, 1), namespace="gemmgen_sm90").compile()
    for m, n, k in ((1000, 1000, 1000), (7, 129, 65), (4097, 63, 8), (130, 4100, 4096)):
        check(op, "nt", m, n, k, col_major=True)


# The swapped dX's kernels (planner.sm90.FEW_COLUMNS_FILL_N): A M-major, B K-major, a column-major 16-bit D staged
# transposed and stored by TMA (Kernel::stage_subtile, stmatrix .trans), the odd widths' last columns stored directly.
SWAPPED_DX_VARIANTS = (
    ("pingpong", (128, 80, 64)),
    ("pingpong", (128, 96, 64)),
    ("pingpong", (64, 96, 64)),
    ("pingpong", (128, 64, 64)),
    ("cooperative", (128, 112, 64)),
)


@pytest.mark.parametrize("variant", SWAPPED_DX_VARIANTS, ids=lambda v: f"{v[0]}-{v[1][0]}x{v[1][1]}")
def test_column_major_output_by_tma(variant):
    schedule, tile = variant
    ops = compile_many([Gemm(dtype=dt, layout="nn", layout_c="col", schedule=schedule, tile_shape=tile,
                             cluster_shape=(1, 1)).config for dt in ("bf16", "fp16")], namespace="gemmgen_sm90_dcol")
    for op in ops:
        # M a multiple of 8 (whole 16-byte chunks of D's columns: TMA), and not (the last row tile directly);
        # N past the last whole subtile; one wave and several
        for m, n, k in ((3072, 384, 256), (1000, 200, 96), (777, 129, 64), (131, 17, 520), (4096, 1024, 64)):
            check(op, "nn", m, n, k, col_major=True)


def test_unaligned_operands_fall_back():
    """Strides TMA cannot take run the unaligned kernel, correctly; the plan says so."""
    plan = Gemm(dtype="bf16", layout="tn")
    assert plan.config.family == "sm90"
    op = plan.compile()
    m, n, k = 300, 200, 129
    a = torch.randn(m, k + 1, device="cuda").bfloat16()[:, :k]   # lda = 130: 260 bytes
    b = torch.randn(n, k, device="cuda").bfloat16().t()          # ldb = 129
    assert op.path(a, b) == "unaligned"
    d = op(a, b)
    err = ((d.double() - a.double() @ b.double()).norm() / (a.double() @ b.double()).norm()).item()
    assert err <= BOUND[torch.bfloat16]


def test_first_launch_in_a_new_thread():
    """A thread that has made no CUDA call yet has no current driver context, which the tensor-map encoder
    needs (torch's autograd worker threads are such threads: a backward op's first launch there failed with
    'invalid argument'). The first launch in a fresh thread, through the C++ and the Python path, is right."""
    import threading

    op = Gemm(dtype="bf16", layout="tn", namespace="gemmgen_sm90").compile()
    assert op.cpp_kernel
    m, n, k = 333, 200, 96
    a, b = operands("tn", m, n, k, torch.bfloat16)
    ref = op(a, b)
    for path in ("cpp", "python"):
        # out= allocated here, so that nothing in the thread binds the context before our launch does
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        errors: list[BaseException] = []

        def first_call() -> None:
            try:
                op(a, b, out=out) if path == "cpp" else op.run(a, b, (), out)
                torch.cuda.current_stream().synchronize()
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                errors.append(e)

        thread = threading.Thread(target=first_call)
        thread.start()
        thread.join()
        assert not errors, (path, errors)
        assert torch.equal(out, ref), path


def test_every_shipped_config():
    """Each kernel the planner ships for arch 90 (benchmarks/shapes.json), on a ragged and a square problem."""
    configs = shipped_configs(90)
    ops = compile_many(configs, namespace="gemmgen_shipped")
    for op in ops:
        layout = op.config.layout.blas
        for m, n, k in ((1000, 1000, 1000), (257, 513, 129)):
            check(op, layout, m, n, k, col_major=op.config.layout.c.value == "col")


# N tiles that are no multiple of 64 (SM90_ODD_BLOCK_N): 16-bit inputs, K-major B (layouts tn and nn), D stored
# directly (16-bit D) or by TMA where the width is whole 32-column fp32 subtiles (96, 160, 224).
ODD_N_VARIANTS = (
    ("cooperative", (128, 144, 64), (1, 1)),
    ("cooperative", (128, 80, 64), (2, 1)),
    ("cooperative", (128, 224, 64), (1, 2)),
    ("pingpong", (64, 96, 64), (1, 1)),
    ("pingpong", (128, 112, 64), (2, 1)),
    ("pingpong", (64, 240, 64), (1, 1)),
)


@pytest.fixture(scope="session")
def odd_n_ops():
    return build_variants(ODD_N_VARIANTS, ("tn", "nn"), "gemmgen_sm90_odd_n")


# N tiles under 64 (SM90_NARROW_BLOCK_N): 16-bit inputs, K-major B, D stored directly; a cluster column's blocks each
# load a swizzle atom of B at least (64x16 1x2, 64x48 2x1: 24 rows each).
NARROW_N_VARIANTS = (
    ("pingpong", (64, 32, 64), (1, 1)),
    ("pingpong", (64, 16, 64), (1, 2)),
    ("pingpong", (64, 48, 64), (2, 1)),
    ("cooperative", (128, 32, 64), (1, 1)),
)
# (layout, dtype, out dtype, D's order): the forward's, fp32 D, and the column-major D of a swapped product (nn)
NARROW_N_CASES = (("tn", "bf16", "bf16", "row"), ("tn", "fp16", "fp32", "row"), ("nn", "bf16", "bf16", "col"))


@pytest.fixture(scope="module")
def narrow_n_ops():
    keys = list(itertools.product(NARROW_N_VARIANTS, NARROW_N_CASES))
    configs = [Gemm(dtype=dt, layout=lay, out_dtype=od, layout_c=order, schedule=s, tile_shape=t,
                    cluster_shape=c).config for (s, t, c), (lay, dt, od, order) in keys]
    return dict(zip(keys, compile_many(configs, namespace="gemmgen_sm90_narrow_n")))


@pytest.mark.parametrize("variant", NARROW_N_VARIANTS, ids=variant_id)
def test_narrow_n_tiles_ragged(narrow_n_ops, variant):
    """Ragged M, N, K on the tiles under 64 columns (direct stores of every column, a B tile of 16-48 rows split over
    a cluster column), each case; a large problem bit-identical on repeats."""
    for case in NARROW_N_CASES:
        op = narrow_n_ops[(variant, case)]
        rng = random.Random(f"narrow{variant}{case}")
        shapes = [tuple(rng.choice(RAGGED) for _ in range(3)) for _ in range(6)] + [(1, 1, 1), (65, 33, 63)]
        for m, n, k in shapes:
            check(op, case[0], m, n, k, col_major=case[3] == "col")
    op = narrow_n_ops[(variant, NARROW_N_CASES[0])]
    check(op, "tn", 4097, 1000, 3584)
    a, b = operands("tn", 1000, 3000, 1000, torch.bfloat16)
    first = op(a, b)
    for _ in range(5):
        assert torch.equal(op(a, b), first)


@pytest.mark.parametrize("variant", ODD_N_VARIANTS, ids=variant_id)
@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_odd_n_tiles_ragged(odd_n_ops, variant, layout):
    """Ragged M, N, K on the odd-width tiles, every dtype and output dtype; large problems bit-identical on
    repeats."""
    for dt, od in itertools.product(DTYPES, OUT_DTYPES):
        op = odd_n_ops[(variant, layout, dt, od)]
        rng = random.Random(f"odd{variant}{layout}{dt}{od}")
        shapes = [tuple(rng.choice(RAGGED) for _ in range(3)) for _ in range(6)] + [(1, 1, 1), (65, 145, 63)]
        for m, n, k in shapes:
            check(op, layout, m, n, k)
    op = odd_n_ops[(variant, layout, "bf16", "bf16")]
    check(op, layout, 4097, 4544, 4544)
    a, b = operands(layout, 2000, 3000, 1000, torch.bfloat16)
    first = op(a, b)
    for _ in range(5):
        assert torch.equal(op(a, b), first)


# The epilogue staged in the ring slot of a tile's last k tile (KernelConfig.staging_in_ring), the stages its own
# buffers' bytes give: both consumer splits and pingpong, clusters (the held slot delays the peers' multicast into it),
# odd widths (the columns past the subtiles directly), a 192-row tile split along N, one tile per block (ws); blocks of
# many tiles (persistent grids: the producer waits for the held slot), K = 0 (no slot held), column-major D.
STAGING_IN_RING_VARIANTS = (
    ("cooperative", (128, 256, 64), (2, 1)),
    ("cooperative", (128, 128, 64), (1, 2)),
    ("cooperative", (64, 256, 64), (2, 1)),
    ("cooperative", (192, 128, 64), (1, 1)),
    ("pingpong", (128, 96, 64), (1, 1)),
    ("pingpong", (64, 128, 64), (1, 2)),
    ("ws", (128, 128, 64), (1, 1)),
)


@pytest.fixture(scope="session")
def staging_in_ring_ops():
    keys = [(v, lay, dt, od, order) for v in STAGING_IN_RING_VARIANTS for lay in LAYOUTS for dt in DTYPES
            for od in ("bf16", "fp32") for order in ("row", "col")
            if (v[1][1] % 64 == 0 or lay[1] == "n") and (dt == "bf16" or lay == "nt")
            and (order == "row" or (lay == "nt" and dt == "fp16"))]
    configs = [with_staging_in_ring(Gemm(dtype=dt, layout=lay, out_dtype=od, layout_c=order, schedule=s, tile_shape=t,
                                         cluster_shape=c).config, True) for (s, t, c), lay, dt, od, order in keys]
    return dict(zip(keys, compile_many(configs, namespace="gemmgen_sm90_staging_in_ring")))


@pytest.mark.parametrize("variant", STAGING_IN_RING_VARIANTS, ids=variant_id)
def test_staging_in_ring(staging_in_ring_ops, variant):
    """Ragged M, N, K in every layout the tile takes (bf16; fp16 in nt, with a column-major D too), bf16 and fp32 D; a
    large problem of many tiles per block bit-identical on repeats; K = 0."""
    ops = {key[1:]: op for key, op in staging_in_ring_ops.items() if key[0] == variant}
    for (layout, dt, od, order), op in ops.items():
        assert op.config.staging_in_ring and "_sr_" in op.name, op.name
        rng = random.Random(f"ring{variant}{layout}{dt}{od}{order}")
        shapes = [tuple(rng.choice(RAGGED) for _ in range(3)) for _ in range(5)] + [(65, 129, 63), (300, 200, 0)]
        for m, n, k in shapes:
            check(op, layout, m, n, k, col_major=order == "col")
    op = ops[("tn", "bf16", "bf16", "row")]
    check(op, "tn", 4097, 4544, 4104)
    a, b = operands("tn", 3000, 5000, 1000, torch.bfloat16)
    first = op(a, b)
    for _ in range(5):
        assert torch.equal(op(a, b), first)
