"""GPU numerics of the sm80 family against a float32 torch reference (TF32 off). Plans pass family="sm80",
so that they test that family on Hopper too (where sm90 is the default; see test_sm90.py for it).

Every check draws fresh random inputs and poisons the output with NaN first, so an element the
kernel never wrote fails. Error is ||D - ref|| / ||ref||, bounded per input dtype.
"""
from __future__ import annotations

import itertools
import random

import pytest

torch = pytest.importorskip("torch")

from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

from gpu_cases import BOUND, DTYPES, LAYOUTS, OUT_DTYPES, RAGGED, gemm_error  # noqa: E402

pytestmark = pytest.mark.gpu

LARGE = ((4096, 4096, 4096), (3000, 5000, 1000), (4097, 4095, 4104), (127, 8191, 4096), (8192, 1024, 2048))
# Tiles the planner may choose (see planner.SM80_TILES), each checked with every layout.
TILES = ((128, 256, 32), (256, 128, 32), (128, 128, 32), (128, 64, 64), (64, 128, 64), (64, 64, 64),
         (128, 64, 32), (64, 128, 32), (64, 64, 32), (128, 256, 64), (128, 128, 64))


def make_operand(rows: int, cols: int, order: str, dtype: torch.dtype) -> torch.Tensor:
    """A random (rows, cols) tensor stored row- or column-major."""
    if order == "row":
        return torch.randn(rows, cols, device="cuda").to(dtype)
    return torch.randn(cols, rows, device="cuda").to(dtype).t()


def operands(layout: str, m: int, n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    a_order = "row" if layout[0] == "t" else "col"
    b_order = "row" if layout[1] == "t" else "col"
    return make_operand(m, k, a_order, dtype), make_operand(k, n, b_order, dtype)


def rel_error(d: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    ref = a.double() @ b.double()
    if ref.numel() == 0:
        return 0.0
    return gemm_error(d, a, b, ref)


def check(op, layout: str, m: int, n: int, k: int, dtype: torch.dtype, out_dtype: torch.dtype,
          col_major_out: bool = False) -> None:
    a, b = operands(layout, m, n, k, dtype)
    out = torch.full((n, m) if col_major_out else (m, n), float("nan"), dtype=out_dtype, device="cuda")
    out = out.t() if col_major_out else out
    d = op(a, b, out=out)
    assert d.data_ptr() == out.data_ptr()
    err = rel_error(d, a, b)
    assert err <= BOUND[dtype], f"{op.name} {layout} M={m} N={n} K={k}: rel error {err:.3g}"
    if k == 0:
        assert torch.count_nonzero(d) == 0


@pytest.fixture(scope="session", autouse=True)
def exact_reference():
    torch.backends.cuda.matmul.allow_tf32 = False
    yield


@pytest.fixture(scope="session")
def matrix_ops():
    """One op per (layout, dtype, out dtype), planned without hints, built in one parallel run."""
    keys = list(itertools.product(LAYOUTS, DTYPES, OUT_DTYPES))
    plans = [Gemm(dtype=dt, layout=lay, out_dtype=od, family="sm80") for lay, dt, od in keys]
    return dict(zip(keys, compile_many([p.config for p in plans], namespace="gemmgen")))


@pytest.fixture(scope="session")
def tile_ops():
    keys = list(itertools.product(LAYOUTS, TILES))
    plans = [Gemm(dtype="bf16", layout=lay, tile_shape=tile, family="sm80") for lay, tile in keys]
    return dict(zip(keys, compile_many([p.config for p in plans], namespace="gemmgen")))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_layouts_dtypes_ragged(matrix_ops, layout, dtype, out_dtype):
    op = matrix_ops[(layout, dtype, out_dtype)]
    rng = random.Random(f"{layout}{dtype}{out_dtype}")
    shapes = [tuple(rng.choice(RAGGED) for _ in range(3)) for _ in range(12)] + [(1, 1, 1), (65, 129, 63)]
    for m, n, k in shapes:
        check(op, layout, m, n, k, DTYPES[dtype], OUT_DTYPES[out_dtype])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_all_ragged_combinations(matrix_ops, layout):
    """Every (M, N, K) from the ragged set, bf16 -> bf16, for each layout."""
    op = matrix_ops[(layout, "bf16", "bf16")]
    for m, n, k in itertools.product(RAGGED, repeat=3):
        if m * n * k > 2 * 10**10:
            continue  # the 4097^3 corner alone would dominate the run; LARGE covers that size
        check(op, layout, m, n, k, torch.bfloat16, torch.bfloat16)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_large(matrix_ops, layout, dtype):
    op = matrix_ops[(layout, dtype, dtype)]
    for m, n, k in LARGE:
        check(op, layout, m, n, k, DTYPES[dtype], DTYPES[dtype])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tile", TILES, ids=lambda t: "x".join(map(str, t)))
def test_every_tile(tile_ops, layout, tile):
    op = tile_ops[(layout, tile)]
    for m, n, k in ((1000, 1000, 1000), (257, 513, 129), (33, 4097, 65), (2048, 2048, 4096)):
        check(op, layout, m, n, k, torch.bfloat16, torch.bfloat16)


def test_column_major_output():
    op = Gemm(dtype="bf16", layout="tn", layout_c="col", family="sm80").compile()
    for m, n, k in ((1000, 1000, 1000), (7, 129, 65), (4097, 63, 8)):
        check(op, "tn", m, n, k, torch.bfloat16, torch.bfloat16, col_major_out=True)
    d = op(*operands("tn", 100, 60, 30, torch.bfloat16))
    assert d.stride() == (1, 100)


def test_default_allocation_and_torch_ops(matrix_ops):
    op = matrix_ops[("tn", "bf16", "bf16")]
    a, b = operands("tn", 300, 200, 100, torch.bfloat16)
    d1 = op(a, b)
    d2 = getattr(torch.ops.gemmgen, op.name)(a, b)
    assert d1.shape == (300, 200) and d1.dtype == torch.bfloat16 and d1.is_contiguous()
    assert rel_error(d1, a, b) <= BOUND[torch.bfloat16]
    assert torch.equal(d1, d2)


def test_empty_and_zero_k(matrix_ops):
    op = matrix_ops[("tn", "fp16", "fp16")]
    a, b = operands("tn", 0, 64, 32, torch.float16)
    assert op(a, b).shape == (0, 64)
    a, b = operands("tn", 64, 0, 32, torch.float16)
    assert op(a, b).shape == (64, 0)
    a, b = operands("tn", 65, 33, 0, torch.float16)
    out = torch.full((65, 33), float("nan"), dtype=torch.float16, device="cuda")
    assert torch.count_nonzero(op(a, b, out=out)) == 0


def test_unaligned_operands_take_the_safe_path(matrix_ops):
    """Leading dimensions and base addresses off the 16-byte rule still give the right answer."""
    op = matrix_ops[("tn", "bf16", "bf16")]
    m, n, k = 300, 200, 129
    big_a = torch.randn(m, k + 1, device="cuda").bfloat16()
    a = big_a[:, :k]                                  # lda = 130: 260 bytes, not a multiple of 16
    b = torch.randn(n, k, device="cuda").bfloat16().t()  # ldb = 129
    assert op.path(a, b) == "unaligned"
    check_d = op(a, b)
    assert rel_error(check_d, a, b) <= BOUND[torch.bfloat16]
    flat = torch.randn(m * 64 + 1, device="cuda").bfloat16()
    a2 = flat[1:].view(m, 64)                         # base address 2 bytes past 16-byte alignment
    b2 = torch.randn(n, 64, device="cuda").bfloat16().t()
    assert op.path(a2, b2) == "unaligned"
    assert rel_error(op(a2, b2), a2, b2) <= BOUND[torch.bfloat16]
    a3, b3 = operands("tn", m, n, 64, torch.bfloat16)
    assert op.path(a3, b3) == "fast"


def test_strided_views_with_aligned_leading_dimension(matrix_ops):
    op = matrix_ops[("tn", "bf16", "bf16")]
    big = torch.randn(512, 1024, device="cuda").bfloat16()
    a = big[:300, :136]                               # lda = 1024, K = 136 (ragged inside the row)
    b = torch.randn(200, 1024, device="cuda").bfloat16()[:, :136].t()
    assert op.path(a, b) == "fast"
    d = op(a, b)
    assert rel_error(d, a, b) <= BOUND[torch.bfloat16]


def test_repeatable(matrix_ops):
    """Same inputs, bit-identical outputs: a race would move them."""
    op = matrix_ops[("tn", "bf16", "bf16")]
    a, b = operands("tn", 1000, 1000, 1000, torch.bfloat16)
    first = op(a, b)
    for _ in range(10):
        assert torch.equal(op(a, b), first)


def test_current_stream_is_used(matrix_ops):
    op = matrix_ops[("tn", "bf16", "bf16")]
    a, b = operands("tn", 2048, 2048, 2048, torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        d = op(a, b)
    stream.synchronize()
    assert rel_error(d, a, b) <= BOUND[torch.bfloat16]


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_padded_output_rows_ragged_n(matrix_ops, out_dtype):
    """A row-major D whose pitch keeps the 16-byte rule while N does not: the staged epilogue stores whole
    16-byte chunks and, at the end of each row, element by element. The padding past N must stay as it
    was (NaN), every element up to N must be written."""
    op = matrix_ops[("tn", "bf16", out_dtype)]
    per_chunk = 16 // torch.empty((), dtype=OUT_DTYPES[out_dtype]).element_size()
    for m, n, k in ((1000, 1001, 64), (65, 7, 129), (129, 4097, 100), (300, 63, 1000), (17, 1, 33)):
        pitch = (n + per_chunk - 1) // per_chunk * per_chunk + per_chunk
        buf = torch.full((m, pitch), float("nan"), dtype=OUT_DTYPES[out_dtype], device="cuda")
        a, b = operands("tn", m, n, k, torch.bfloat16)
        d = op(a, b, out=buf[:, :n])
        err = rel_error(d, a, b)
        assert err <= BOUND[torch.bfloat16], f"{op.name} M={m} N={n} K={k} pitch {pitch}: rel error {err:.3g}"
        assert torch.isnan(buf[:, n:]).all(), f"{op.name} M={m} N={n}: wrote past N into the row padding"
