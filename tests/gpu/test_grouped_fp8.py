"""fp8 grouped GEMM with DeepSeek's per-block scales on the GPU: ``op.grouped(A, B, offsets, scale_a, scale_b)`` and
``op.masked(A, B, counts, scale_a, scale_b)`` of a plan ``Gemm("e4m3", "tn", scale="block")``; and, at the end, with
per-row scales (``scale="row"``: scale_a (total_M,), scale_b (E, N), torch._scaled_grouped_mm's rowwise form).

A (total_M, K) e4m3 holds every group's rows with scale_a (total_M, ceil(K/128)), one per row and 128-wide K block
(``quantize(x, "e4m3", scale="block")``); B (E, K, N) = W.transpose(1, 2) of the experts' e4m3 weights W (E, N, K)
with scale_b (E, ceil(N/128), ceil(K/128)) (``quantize(W, "e4m3", scale="block", block=(128, 128))``). The reference
is float64 of the dequantized operands, per group; ||D - ref|| / ||ref|| within the output's rounding (bf16: 1e-2,
fp32: 5e-4). Unwritten rows are caught as in test_grouped.py: a NaN-filled block of D's size is handed back to the
caching allocator before the call. Cases: empty groups first, between and last; ragged sizes; N and K with a partial
last 128-wide block; five plans (cooperative 128x256 in a 2x1 cluster, pingpong 128x128, fp32 output, e5m2, a 64x64
tile with K interleaved); each group
on its own; bit-identical repeats; the masked form; bad scales refused before any launch, the op working afterwards;
a list call refused; gradients refused."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("fp8 kernels are sm90 (an H100-class GPU)", allow_module_level=True)

from generator import Gemm, dequantize, quantize  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

pytestmark = pytest.mark.gpu
BOUNDS = {"bf16": 1e-2, "fp32": 5e-4}
PLANS = {
    "coop_c2x1": dict(tile_shape=(128, 256, 128), cluster_shape=(2, 1), schedule="cooperative"),
    "pp_128x128": dict(tile_shape=(128, 128, 128), cluster_shape=(1, 1), schedule="pingpong"),
    "coop_fp32": dict(out_dtype="fp32"),
    "e5m2_coop": dict(dtype="e5m2", tile_shape=(128, 128, 128), schedule="cooperative"),   # (e4m3 otherwise)
    # a dense plan that planner rule 22 gives the 64x64 tile with K interleaved, called on groups
    "interleaved_64x64": dict(m=128, n=4096, k=4096),
}
#: (group sizes, N, K)
CASES = [([0, 37, 300, 1, 130, 0], 384, 640), ([256, 0, 129], 300, 1040), ([5], 1024, 256)]


@pytest.fixture(scope="module")
def ops():
    plans = {key: Gemm(layout="tn", arch=90, scale="block", **{"dtype": "e4m3", **kw}) for key, kw in PLANS.items()}
    return dict(zip(plans, compile_many([p.config for p in plans.values()], namespace="gemmgen_grouped_fp8_test")))


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def operands(sizes: list[int], n: int, k: int, dtype: str = "e4m3"):
    """(A, B, offsets, scale_a, scale_b) of a grouped call and the dequantized float64 A (total_M, K) and W (E, N, K)."""
    x = torch.randn(sum(sizes), k, device="cuda")
    w = torch.randn(len(sizes), n, k, device="cuda")
    a, scale_a = quantize(x, dtype, scale="block")
    q, scale_b = quantize(w, dtype, scale="block", block=(128, 128))
    offsets = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    ref_a = dequantize(a, scale_a, scale="block").double()
    ref_w = dequantize(q, scale_b, scale="block", block=(128, 128)).double()
    return (a, q.transpose(1, 2), offsets, scale_a, scale_b), ref_a, ref_w


def reference(sizes: list[int], ref_a: torch.Tensor, ref_w: torch.Tensor) -> torch.Tensor:
    rows = torch.split(ref_a, sizes)
    return torch.cat([r @ ref_w[g].t() for g, r in enumerate(rows)])


def poison(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """A NaN-filled block of D's size back to the caching allocator: the op's D is likely to get it."""
    torch.full(shape, float("nan"), dtype=dtype, device="cuda")


@pytest.mark.parametrize("key", list(PLANS))
@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda i: f"case{i}")
def test_grouped_fp8_matches_float64(ops, key, case):
    op = ops[key]
    sizes, n, k = CASES[case]
    args, ref_a, ref_w = operands(sizes, n, k, op.config.dtype.value)
    poison((sum(sizes), n), op.out_dtype)
    d = op.grouped(*args)
    assert (tuple(d.shape), d.dtype) == ((sum(sizes), n), op.out_dtype)
    assert torch.isfinite(d).all(), f"{op.name} {sizes} {n}x{k}: unwritten rows"
    ref = reference(sizes, ref_a, ref_w)
    err = rel(d, ref)
    assert err < BOUNDS[op.config.out_dtype.value], (op.name, sizes, n, k, err)
    start = 0
    for size in sizes:   # each group on its own: a group taking another's B or scales fails here
        if size:
            assert rel(d[start:start + size], ref[start:start + size]) < BOUNDS[op.config.out_dtype.value]
        start += size
    again = op.grouped(*args)
    assert torch.equal(again, d), "not bit-identical on a repeat"


@pytest.mark.parametrize("key", ["coop_c2x1", "interleaved_64x64"])
def test_masked_fp8_matches_float64(ops, key):
    """The masked form: A's slabs and scale_a's in one (E, max_m, ...) layout each; the rows up to each count."""
    op = ops[key]
    counts, slab, n, k = [3, 0, 64, 17], 64, 384, 640
    x = torch.randn(len(counts) * slab, k, device="cuda")
    a, scale_a = quantize(x, "e4m3", scale="block")
    w = torch.randn(len(counts), n, k, device="cuda")
    q, scale_b = quantize(w, "e4m3", scale="block", block=(128, 128))
    count_t = torch.tensor(counts, dtype=torch.int32, device="cuda")
    poison((len(counts), slab, n), op.out_dtype)
    out = op.masked(a.view(len(counts), slab, k), q.transpose(1, 2), count_t, scale_a.view(len(counts), slab, -1),
                    scale_b)
    assert (tuple(out.shape), out.dtype) == ((len(counts), slab, n), op.out_dtype)
    ref_a = dequantize(a, scale_a, scale="block").double().view(len(counts), slab, k)
    ref_w = dequantize(q, scale_b, scale="block", block=(128, 128)).double()
    for g, c in enumerate(counts):
        if c:
            assert torch.isfinite(out[g, :c]).all(), g
            assert rel(out[g, :c], ref_a[g, :c] @ ref_w[g].t()) < BOUNDS["bf16"], g


def test_bad_scales_are_refused_and_the_op_works_after(ops):
    op = ops["coop_c2x1"]
    sizes, n, k = [40, 0, 88], 384, 640
    (a, b, offsets, scale_a, scale_b), ref_a, ref_w = operands(sizes, n, k)
    bad = [
        ((a, b, offsets, scale_a, scale_b[0]), ValueError, "a grouped call's per-block scales of B are one"),
        ((a, b, offsets, scale_a, scale_b[:2]), ValueError, "(E, ceil(N/128), ceil(K/128)) = (3, 3, 5)"),
        ((a, b, offsets, scale_a, scale_b.transpose(1, 2).contiguous().transpose(1, 2)), ValueError, ".contiguous()"),
        ((a, b, offsets, scale_a[:, :2], scale_b), ValueError, "scale_a has shape"),
        ((a, b, offsets, scale_a, scale_b.bfloat16()), TypeError, "pass scale_b.to(torch.float32)"),
        ((a, b, offsets, scale_a, None), TypeError, "scale_b must be a torch.Tensor"),
    ]
    for args, error, fragment in bad:
        with pytest.raises(error) as info:
            op.grouped(*args)
        assert fragment in str(info.value), str(info.value)
    d = op.grouped(a, b, offsets, scale_a, scale_b)
    assert rel(d, reference(sizes, ref_a, ref_w)) < BOUNDS["bf16"]
    with pytest.raises(ValueError, match="grouped calls take plans without a fused epilogue"):
        op.grouped_list([a], [b[0]])


def test_gradients_are_refused(ops):
    op = ops["coop_c2x1"]
    (a, b, offsets, scale_a, scale_b), _, _ = operands([16, 16], 256, 256)
    b = b.float().requires_grad_()   # (fp8 leaves cannot require grad: a float B is refused by dtype after this)
    with pytest.raises(RuntimeError, match="has no backward pass, but B require"):
        op.grouped(a, b, offsets, scale_a, scale_b)


# -- per-row scales (torch._scaled_grouped_mm's rowwise form): scale_a (total_M,), scale_b (E, N) --------------------

ROW_PLANS = {
    "row_coop_c2x1": dict(tile_shape=(128, 256, 128), cluster_shape=(2, 1), schedule="cooperative"),
    "row_pp_128x128": dict(tile_shape=(128, 128, 128), cluster_shape=(1, 1), schedule="pingpong"),
}


@pytest.fixture(scope="module")
def row_ops():
    plans = {key: Gemm("e4m3", "tn", arch=90, scale="row", **kw) for key, kw in ROW_PLANS.items()}
    return dict(zip(plans, compile_many([p.config for p in plans.values()], namespace="gemmgen_grouped_fp8_row_test")))


def row_operands(sizes: list[int], n: int, k: int):
    """(A, B, offsets, scale_a, scale_b) of a rowwise-scaled grouped call and the float64 product of the dequantized
    operands, group by group."""
    x, w = torch.randn(sum(sizes), k, device="cuda"), torch.randn(len(sizes), n, k, device="cuda")
    a, scale_a = quantize(x, "e4m3", scale="row")
    q, scale_b = quantize(w, "e4m3", scale="row")                      # scale_b (E, N): one per row of each W[e]
    offsets = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    ref_a, ref_w = dequantize(a, scale_a, scale="row").double(), dequantize(q, scale_b, scale="row").double()
    ref = torch.cat([rows @ ref_w[g].t() for g, rows in enumerate(torch.split(ref_a, sizes))])
    return (a, q.transpose(1, 2), offsets, scale_a, scale_b), ref


@pytest.mark.parametrize("key", list(ROW_PLANS))
@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda i: f"case{i}")
def test_row_scaled_grouped_fp8_matches_float64(row_ops, key, case):
    """Each group's rows scaled by its own scale_b[g] (a group read with another's scales fails its own check), every
    row written, bit-identical on a repeat; the masked form of the same groups the same rows."""
    op = row_ops[key]
    sizes, n, k = CASES[case]
    args, ref = row_operands(sizes, n, k)
    poison((sum(sizes), n), op.out_dtype)
    d = op.grouped(*args)
    assert (tuple(d.shape), d.dtype) == ((sum(sizes), n), op.out_dtype)
    assert torch.isfinite(d).all(), f"{op.name} {sizes} {n}x{k}: unwritten rows"
    start = 0
    for size in sizes:
        if size:
            assert rel(d[start:start + size], ref[start:start + size]) < BOUNDS["bf16"], (op.name, sizes, start)
        start += size
    assert torch.equal(op.grouped(*args), d), "not bit-identical on a repeat"
    a, b, offsets, scale_a, scale_b = args
    slab = max(64, -(-max(sizes) // 64) * 64)
    a_slabs = torch.zeros(len(sizes), slab, k, device="cuda").to(a.dtype)
    sa_slabs = torch.ones(len(sizes), slab, device="cuda")
    for g, rows in enumerate(torch.split(torch.arange(sum(sizes), device="cuda"), sizes)):
        a_slabs[g, :len(rows)], sa_slabs[g, :len(rows)] = a[rows], scale_a[rows]
    masked = op.masked(a_slabs, b, torch.tensor(sizes, dtype=torch.int32, device="cuda"), sa_slabs, scale_b)
    assert torch.equal(torch.cat([masked[g, :size] for g, size in enumerate(sizes)]), d)


def test_row_scaled_bad_scales_are_refused(row_ops):
    op = row_ops["row_coop_c2x1"]
    (a, b, offsets, scale_a, scale_b), ref = row_operands([40, 0, 88], 384, 640)
    bad = [
        ((a, b, offsets, scale_a, scale_b[0]), ValueError, "a grouped call's per-column scales of B are one vector"),
        ((a, b, offsets, scale_a, scale_b[:2]), ValueError, "(E, N) = (3, 384)"),
        ((a, b, offsets, scale_a[:100], scale_b), ValueError, "scale_a has length 100"),
        ((a, b, offsets, scale_a, scale_b.t().contiguous().t()), ValueError, ".contiguous()"),
        ((a, b, offsets, scale_a, scale_b.bfloat16()), TypeError, "pass scale_b.to(torch.float32)"),
    ]
    for args, error, fragment in bad:
        with pytest.raises(error) as info:
            op.grouped(*args)
        assert fragment in str(info.value), str(info.value)
    assert rel(op.grouped(a, b, offsets, scale_a, scale_b), ref) < BOUNDS["bf16"]
