"""Grouped GEMM on the GPU, the masked form (issue 35 item 4, DeepGEMM's masked layout): ``op.masked(A, B, counts)``
and ``torch.ops.<namespace>.<name>.masked(A, B, counts)``.

A (E, max_m, K) holds each group's rows in a slab of its own, the first counts[g] valid; B (E, K, N) as for the
offsets form; counts (E,) int32 on the GPU. D (E, max_m, N): D[g, :counts[g]] = A[g, :counts[g]] @ B[g], and the rows
of a slab past its count are not written. The kernel is the offsets form's (GroupedRows with a slab: group g starts
at row g * max_m of A's slabs taken as one matrix).

Every check draws fresh random inputs, fills the padding rows of A (past each count) with NaN (a valid row that
read them would be NaN), and compares each group's valid rows with a float64 reference (||D - ref|| / ||ref|| at
most gpu_cases.BOUND[dtype]); the rows past the counts are checked unwritten: D is taken from a caching allocator
block filled with a sentinel first, and those rows must still hold it. Cases: E in {1, 4, 9, 43}, counts of 0, 1, a
full slab, ragged and all empty; max_m not a multiple of the tile; N and K ragged; a CUDA graph captured once and
replayed with new counts and data written in place; counts outside [0, max_m] inside a capture (clamped: nothing
written outside the slab); the refusals outside a capture. Plans: the offsets form's cooperative and pingpong, tn and
tt."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpu_cases import BOUND, op_of, ops_for_this_gpu  # noqa: E402
from generator import Gemm  # noqa: E402

pytestmark = pytest.mark.gpu
NAMESPACE = "gemmgen_masked_test"
NAN = float("nan")
SENTINEL = -4096.0   # exact in bf16 and fp16

PLANS = {
    "tn_bf16_coop_c2x1": dict(dtype="bf16", layout="tn", arch=90, schedule="cooperative", tile_shape=(128, 256, 64),
                              cluster_shape=(2, 1)),
    "tn_bf16_pp_64x128": dict(dtype="bf16", layout="tn", arch=90, schedule="pingpong", tile_shape=(64, 128, 64),
                              cluster_shape=(1, 1)),
    "tt_fp16_coop_c1x2": dict(dtype="fp16", layout="tt", arch=90, schedule="cooperative", tile_shape=(128, 128, 64),
                              cluster_shape=(1, 2)),
}


@pytest.fixture(scope="module")
def ops():
    return ops_for_this_gpu({key: Gemm(**kw).config for key, kw in PLANS.items()}, NAMESPACE)


def operands(op, counts: list[int], slab: int, n: int, k: int):
    """A (E, slab, K) with NaN past each count, B (E, K, N) in the plan's order, counts on the GPU."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[op.config.dtype.value]
    groups = len(counts)
    a = torch.randn(groups, slab, k, device="cuda").to(dtype)
    for g, c in enumerate(counts):
        a[g, c:] = NAN
    w = torch.randn(groups, n, k, device="cuda").to(dtype)
    b = w.transpose(1, 2) if op.config.layout.b.value == "col" else w.transpose(1, 2).contiguous()
    return a, b, torch.tensor(counts, dtype=torch.int32, device="cuda")


def poison_allocator(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Leave a block of D's size holding SENTINEL in torch's caching allocator, for the op's D to be given."""
    block = torch.full(shape, SENTINEL, dtype=dtype, device="cuda")
    del block


def check(op, d: torch.Tensor, a: torch.Tensor, b: torch.Tensor, counts: list[int], sentinel: bool = True) -> None:
    bound = BOUND[d.dtype]
    for g, c in enumerate(counts):
        if c:
            ref = a[g, :c].double() @ b[g].double()
            err = ((d[g, :c].double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            assert err <= bound, f"{op.name} group {g} ({c} rows): rel error {err:.3g}"
        if sentinel and c < d.shape[1]:
            assert bool((d[g, c:] == SENTINEL).all()), f"{op.name} group {g}: rows past its count {c} were written"


CASES = [  # (counts, max_m, N, K)
    ([37], 64, 200, 256),
    ([0, 1, 200, 77], 200, 256, 512),
    ([5, 300, 0, 128, 1, 299, 64, 0, 17], 300, 1000, 200),
    ([0, 0, 0, 0], 96, 128, 128),
    # more groups than a warp walks at a time (GroupedRows::warp_chunk: 32), full slabs in the second chunk
    ([1 if g % 7 == 2 else 0 for g in range(40)] + [64, 0, 9], 64, 136, 128),
]


@pytest.mark.parametrize("key", list(PLANS))
@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda i: f"case{i}")
def test_masked_matches_float64_and_leaves_the_padding(ops, key, case):
    op = op_of(ops, key)
    counts, slab, n, k = CASES[case]
    for _ in range(2):   # fresh inputs each time: a stale row of the first call fails the second's reference
        a, b, c = operands(op, counts, slab, n, k)
        poison_allocator((len(counts), slab, n), op.out_dtype)
        d = op.masked(a, b, c)
        torch.cuda.synchronize()
        assert d.shape == (len(counts), slab, n)
        check(op, d, a, b, counts)
        again = getattr(getattr(torch.ops, NAMESPACE), op.name).masked(a, b, c)   # the registered op, the same bits
        for g, count in enumerate(counts):
            assert torch.equal(again[g, :count], d[g, :count]), f"{op.name} group {g}: a repeat differs"
        del again


def test_masked_replays_in_a_cuda_graph_with_new_counts(ops):
    """Captured once, replayed with new counts (also outside [0, max_m]: clamped into the slab) and data in place."""
    op = op_of(ops, "tn_bf16_coop_c2x1")
    counts, slab, n, k = [3, 0, 128, 64], 128, 256, 256
    a, b, c = operands(op, counts, slab, n, k)
    op.masked(a, b, c)   # built and warmed outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d = op.masked(a, b, c)
    for new_counts, clamped in (([128, 1, 0, 77], [128, 1, 0, 77]), ([500, -3, 64, 128], [128, 0, 64, 128])):
        fresh, _, _ = operands(op, clamped, slab, n, k)
        a.copy_(fresh)
        c.copy_(torch.tensor(new_counts, dtype=torch.int32))
        d.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        check(op, d, a, b, clamped)


def test_masked_refusals_outside_a_capture(ops):
    op = op_of(ops, "tn_bf16_coop_c2x1")
    a, b, c = operands(op, [3, 0, 64, 64], 64, 128, 128)
    with pytest.raises(ValueError, match=r"counts\[2\] = 65 is outside \[0, 64\]"):
        op.masked(a, b, torch.tensor([3, 0, 65, 1], dtype=torch.int32, device="cuda"))
    with pytest.raises(TypeError, match=r"pass counts.to\(torch.int32\)"):
        op.masked(a, b, c.long())
    with pytest.raises(RuntimeError, match="masked calls have no backward pass yet"):
        op.masked(a.clone().requires_grad_(), b, c)
    d = op.masked(a, b, c)   # the op right afterwards
    torch.cuda.synchronize()
    assert d.shape == (4, 64, 128)
