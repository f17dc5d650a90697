"""Grouped GEMM along K on the GPU: ``op.grouped(A, B, offsets)`` with B 2-D, torch._grouped_mm's 2-D x 2-D form and
the weight gradient of grouped rows (dW[g] = X[rows of g].t() @ dY[rows of g], grouped_formula's dB).

A (M, K) and B (K, N) in the plan's orders, offsets (E,) int32 the groups' ends along K; D (E, M, N), D[g] =
A[:, group g] @ B[group g, :], zeros for an empty group. The library builds each group's tensor maps on the device
(templates/sm90/k_groups.cuh: A's and B's K extent cut at the group's end, its first k value the problem's k_begin)
and runs the list kernel over them.

Every check draws fresh random inputs (NaN in every padding) and compares each group's matrix with float64; D is
allocated right after a NaN block of its size was freed, so a matrix left unwritten reads NaN. Groups start at
k values that are no multiple of the k tile (1, 127, 129, ...), so a group's last k tile reads into the next group's
values unless the map's cut stops it; empty groups first, last and between; one group of all of K. Layouts: layout
nt (A column-major, B row-major: K the outer dimension of both, where a TMA load may start at any k; the other
layouts are refused), D row- and column-major, cooperative and pingpong, clusters 2x1 and 1x2. Also: the MoE
block's dB through autograd; the backward of a call along K; a CUDA graph replayed with new group sizes (nothing
is read on the host)."""
from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]

from gpu_cases import BOUND, ops_for_this_gpu, op_of, poison  # noqa: E402
from generator import Gemm  # noqa: E402

NAMESPACE = "gemmgen_grouped_k_test"
NAN = float("nan")

#: Plans that take grouped calls along K (list calls, A column-major and B row-major: layout nt), D both ways.
PLANS: dict[str, dict] = {
    "nt_bf16_coop_c2x1": dict(dtype="bf16", layout="nt", arch=90, schedule="cooperative", tile_shape=(128, 256, 64),
                              cluster_shape=(2, 1)),
    "nt_dcol_bf16_coop": dict(dtype="bf16", layout="nt", layout_c="col", arch=90, schedule="cooperative"),
    "nt_bf16_pp": dict(dtype="bf16", layout="nt", arch=90, schedule="pingpong", tile_shape=(128, 128, 64),
                       cluster_shape=(1, 1)),
    "nt_fp16_coop_c1x2": dict(dtype="fp16", layout="nt", arch=90, schedule="cooperative", tile_shape=(128, 128, 64),
                              cluster_shape=(1, 2)),
}
#: A plan whose A is row-major (K contiguous): refused, with the layout to plan.
REFUSED = dict(dtype="bf16", layout="tn", arch=90, schedule="pingpong", tile_shape=(128, 128, 64),
               cluster_shape=(1, 1))
#: Group sizes along K: ragged starts, empty groups anywhere, one group holding all of K.
SIZES = ([1, 127, 0, 129, 300, 5], [0, 0, 512], [64, 0, 0, 64, 1000, 0], [77], [0, 3, 0, 1, 0, 300, 0, 0, 2])


@pytest.fixture(scope="module")
def ops():
    configs = {key: Gemm(**kw).config for key, kw in PLANS.items()}
    return ops_for_this_gpu({**configs, "refused": Gemm(**REFUSED).config}, NAMESPACE)


def test_a_row_major_a_is_refused_with_the_layout(ops):
    op = op_of(ops, "refused")
    a, b = stored(64, 128, "row", op.dtype), stored(128, 64, "col", op.dtype)
    with pytest.raises(ValueError, match=r"grouped calls along K take A column-major.*plan with layout='nt'"):
        op.grouped(a, b, offsets_of([64, 64]))
    assert torch.equal(op(a, b), op(a, b))   # the op works on afterwards


def stored(rows: int, cols: int, order: str, dtype: torch.dtype) -> torch.Tensor:
    """A fresh random (rows, cols) matrix stored `order`-major, its leading dimension padded to 16 bytes plus 8
    elements of NaN."""
    outer, inner = (rows, cols) if order == "row" else (cols, rows)
    buf = torch.full((outer, (inner + 7) // 8 * 8 + 8), NAN, dtype=dtype, device="cuda")
    buf[:, :inner] = torch.randn(outer, inner, device="cuda").to(dtype)
    return buf[:, :inner] if order == "row" else buf[:, :inner].t()


def offsets_of(sizes) -> torch.Tensor:
    return torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32, device="cuda")


def check(op, sizes, m: int, n: int, d: torch.Tensor, a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert tuple(d.shape) == (len(sizes), m, n) and d.dtype == op.out_dtype, f"{what}: D is {tuple(d.shape)}"
    start = 0
    for g, size in enumerate(sizes):
        end = start + size
        want = a[:, start:end].double() @ b[start:end].double()
        got = d[g].double()
        assert torch.isfinite(got).all(), f"{what}: group {g} (K {start}:{end}) unwritten or reading NaN"
        if size == 0:
            assert torch.equal(got, torch.zeros_like(got)), f"{what}: empty group {g} is not zeros"
        else:
            err = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
            assert err <= BOUND[op.dtype], f"{what}: group {g} (K {start}:{end}) rel error {err:.3g}"
        start = end


@pytest.mark.parametrize("key", list(PLANS))
def test_groups_along_k_match_float64(ops, key):
    op = op_of(ops, key)
    layout = op.config.layout
    for sizes, (m, n) in itertools.product(SIZES, ((200, 72), (1000, 1000))):
        k = sum(sizes)
        a, b = stored(m, k, layout.a.value, op.dtype), stored(k, n, layout.b.value, op.dtype)
        offsets = offsets_of(sizes)
        poison(op.out_dtype, (len(sizes), m, n))
        d = op.grouped(a, b, offsets)
        want_strides = (m * n, n, 1) if layout.c.value == "row" else (m * n, 1, m)
        assert d.stride() == want_strides, f"{op.name}: D strides {d.stride()}"
        check(op, sizes, m, n, d, a, b, f"{op.name} sizes={sizes} M={m} N={n}")
        assert torch.equal(d, op.grouped(a, b, offsets)), f"{op.name} sizes={sizes}: not bit-identical on a repeat"


def test_moe_weight_gradient_takes_one_call_along_k(ops):
    """The dB of op.grouped's backward (grouped rows) against float64, through autograd: its dB op's grouped call along
    K (no list call, no host copy of the offsets)."""
    plan = Gemm("bf16", "tn", arch=90, schedule="cooperative")
    op = plan.compile()
    sizes, n, k = [0, 1, 127, 129, 0, 300, 64, 5], 200, 256
    x = stored(sum(sizes), k, "row", torch.bfloat16).requires_grad_()
    w = torch.randn(len(sizes), n, k, device="cuda").bfloat16().requires_grad_()
    offsets = offsets_of(sizes)
    y = op.grouped(x, w.transpose(1, 2), offsets)
    g = torch.randn_like(y)
    poison(torch.bfloat16, tuple(w.shape))
    y.backward(g)
    starts = [0, *itertools.accumulate(sizes)]
    for e in range(len(sizes)):
        rows = slice(starts[e], starts[e + 1])
        want = g[rows].double().t() @ x[rows].double()   # dW[e] (N, K)
        got = w.grad[e].double()
        if sizes[e] == 0:
            assert torch.equal(got, torch.zeros_like(got)), e
        else:
            err = ((got - want).norm() / want.norm()).item()
            assert err <= BOUND[torch.bfloat16], (e, err)


def test_backward_matches_float64(ops):
    """dA and dB of a call along K through autograd (two grouped calls of rows: grouped_formula.grouped_k_backward)
    against float64, empty groups and groups starting at any k included."""
    op = op_of(ops, "nt_bf16_coop_c2x1")
    sizes, m, n = [1, 127, 0, 129, 300, 5], 200, 72
    k = sum(sizes)
    a = stored(m, k, "col", op.dtype).requires_grad_()
    b = stored(k, n, "row", op.dtype).requires_grad_()
    d = op.grouped(a, b, offsets_of(sizes))
    g = torch.randn_like(d)
    poison(op.dtype, (k, m), (k, n))
    d.backward(g)
    starts = [0, *itertools.accumulate(sizes)]
    a64, b64, g64 = a.detach().double(), b.detach().double(), g.double()
    ref_a = torch.cat([g64[e] @ b64[s:t].t() for e, (s, t) in enumerate(zip(starts, starts[1:]))], dim=1)
    ref_b = torch.cat([a64[:, s:t].t() @ g64[e] for e, (s, t) in enumerate(zip(starts, starts[1:]))])
    for got, ref, what in ((a.grad, ref_a, "dA"), (b.grad, ref_b, "dB")):
        assert torch.isfinite(got).all(), f"{what}: unwritten or NaN"
        err = ((got.double() - ref).norm() / ref.norm()).item()
        assert err <= BOUND[op.dtype], (what, err)


def test_cuda_graph_replays_new_group_sizes(ops):
    """Captured once, replayed with new sizes written into the same offsets: nothing is read on the host."""
    op = op_of(ops, "nt_bf16_coop_c2x1")
    m, n, k = 256, 192, 640
    a, b = stored(m, k, "col", op.dtype), stored(k, n, "row", op.dtype)
    patterns = ([100, 0, 540, 0], [0, 0, 0, 640], [1, 1, 1, 637], [160, 160, 160, 160])
    offsets = offsets_of(patterns[0])
    op.grouped(a, b, offsets)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_d = op.grouped(a, b, offsets)
    for sizes in patterns[1:] + patterns[:1]:
        offsets.copy_(offsets_of(sizes))
        graph.replay()
        torch.cuda.synchronize()
        check(op, sizes, m, n, static_d, a, b, f"{op.name} replay sizes={sizes}")
