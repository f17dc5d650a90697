"""tf32 on the GPU: fp32 tensors in, the tensor cores multiplying in tf32, fp32 (or 16-bit) out, against a float64
reference computed from the fp32 inputs; ragged sizes, NaN-poisoned outputs, a fused epilogue, autograd.

* sm90 (an H100-class GPU): layout tn, every schedule and a cluster, autograd and the refusals; the other layouts,
  whose M/N-major tiles the kernel transposes in shared memory, on every schedule, clusters that multicast the
  transposed operand, split-K, a column-major D and a fused epilogue, each with ragged edges, repeated bit for bit.
* sm80 family (Ampere and newer, Hopper included): every layout and order of D, the fast path (leading dimensions
  padded to the 16-byte rule) and the unaligned one, the inputs rounded to nearest tf32 (not truncated), NaN inputs
  kept, and autograd, whose kernels take every layout (no copies).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
    pytest.skip("tf32 kernels need sm80 or newer (an A100- or H100-class GPU)", allow_module_level=True)

from gpu_cases import LAYOUTS, RAGGED  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

pytestmark = pytest.mark.gpu
needs_sm90 = pytest.mark.skipif(torch.cuda.get_device_capability() < (9, 0),
                                reason="the sm90 family's tf32 kernels need an H100-class GPU")
#: ||D - ref|| / ||ref|| for tf32 inputs (10-bit mantissa, each product rounded once) against float64.
BOUND = 2e-3
PLANS = {
    "cooperative": dict(),
    "pingpong": dict(schedule="pingpong", tile_shape=(128, 128, 32)),
    "c1x2": dict(schedule="cooperative", tile_shape=(128, 128, 32), cluster_shape=(1, 2)),
    "dcol": dict(layout_c="col"),
    "gelu_bias_bf16": dict(activation="gelu", bias="col", out_dtype="bf16"),
}
SHAPES = [(1000, 1000, 1000), (RAGGED[4], RAGGED[5], RAGGED[6]), (RAGGED[7], RAGGED[0], RAGGED[8]), (257, 4100, 36)]


@pytest.fixture(scope="module")
def ops():
    plans = {key: Gemm("fp32", "tn", arch=90, **kw) for key, kw in PLANS.items()}
    built = compile_many([p.config for p in plans.values()], namespace="gemmgen_tf32_test")
    return dict(zip(plans, built))


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).norm() / ref.norm()).item()


def inputs(m: int, n: int, k: int, requires_grad: bool = False):
    a = torch.randn(m, k, device="cuda", requires_grad=requires_grad)
    w = torch.randn(n, k, device="cuda")
    b = w.t().requires_grad_(requires_grad) if requires_grad else w.t()   # (K, N) column-major: layout tn
    return a, b


@pytest.mark.parametrize("key", list(PLANS))
@needs_sm90
def test_against_float64(ops, key):
    op = ops[key]
    for m, n, k in SHAPES:
        a, b = inputs(m, n, k)
        operands = [torch.randn(n, device="cuda").bfloat16()] if op.config.epilogue.operands else []
        ref = a.double() @ b.double()
        if operands:
            ref = torch.nn.functional.gelu(ref + operands[0].double())
        out = op._empty_out(a, b).fill_(float("nan"))
        op(a, b, *operands, out=out)
        assert torch.isfinite(out).all(), f"{op.name} {m}x{n}x{k}: unwritten elements"
        bound = 1e-2 if out.dtype == torch.bfloat16 else BOUND
        assert rel(out, ref) <= bound, f"{op.name} {m}x{n}x{k}: {rel(out, ref):.2e}"


def check_grads(op, a: torch.Tensor, b: torch.Tensor, g: torch.Tensor) -> None:
    """dA and dB of op(a, b) for the upstream gradient g (a and b require grad) against float64."""
    a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
    op(a, b).backward(g)
    (a64 @ b64).backward(g.double())
    assert rel(a.grad, a64.grad) <= BOUND and rel(b.grad, b64.grad) <= BOUND


@needs_sm90
def test_autograd_against_float64(ops):
    for m, n, k in ((300, 200, 100), (64, 48, 32)):
        a, b = inputs(m, n, k, requires_grad=True)
        check_grads(ops["cooperative"], a, b, torch.randn(n, m, device="cuda").t())   # a column-major gradient


@needs_sm90
def test_refusals_keep_the_process_working(ops):
    op = ops["cooperative"]
    a, b = inputs(128, 64, 32)
    with pytest.raises(ValueError, match="column-major"):
        op(a, b.contiguous())                              # B row-major: the plan reads it K-major
    with pytest.raises(TypeError, match="this plan computes tf32"):
        op(a.bfloat16(), b)
    assert rel(op(a, b), a.double() @ b.double()) <= BOUND


# -- sm90 in the layouts whose tiles it transposes -----------------------------------------------------------------

#: A column-major A (nn, nt) and a row-major B (nt, tt) come M/N-major: A read into registers by the consumers, B's
#: 32 x 32 chunks transposed in place by the producer warpgroup (gemm_kernel.cuh transpose_slots), and tt with an
#: identity epilogue run as the transposed product D^T = B^T A^T (spec/config.py transposed_product: nothing
#: transposed). Each plan runs every layout; the clusters share the M/N-major operand (1x2: A, 2x1: B, 2x2: both), the
#: 64-row tile splits along N, split-K adds partial tiles.
SM90_PLANS = {
    "cooperative": dict(),
    "pingpong": dict(schedule="pingpong", tile_shape=(128, 128, 32)),
    "c1x2": dict(schedule="cooperative", tile_shape=(128, 128, 32), cluster_shape=(1, 2)),
    "c2x2_256x128": dict(schedule="cooperative", tile_shape=(256, 128, 32), cluster_shape=(2, 2)),
    "split_n_64x256": dict(schedule="cooperative", tile_shape=(64, 256, 32), cluster_shape=(1, 1)),
    "split_k": dict(m=256, n=256, k=8192, schedule="pingpong", tile_shape=(128, 128, 32), cluster_shape=(1, 1)),
    "few_rows": dict(m=64, n=4096, k=4096),   # the planner's 64x128 pingpong with split-K for a few rows
    "dcol": dict(layout_c="col"),
    "gelu_tanh_bias_bf16": dict(activation="gelu_tanh", bias="col", out_dtype="bf16"),
}
TRANSPOSED_LAYOUTS = ("nn", "nt", "tt")
#: (M, N, K) with leading dimensions padded to the fast kernel's rule: ragged edges in every dimension (K ends inside
#: a 32 x 32 chunk, M and N inside a tile and a chunk), a long K for split-K, K = 0.
SM90_SHAPES = ((1000, 1000, 1000), (197, 263, 141), (333, 4100, 36), (256, 256, 8192), (129, 65, 0))


@pytest.fixture(scope="module")
def sm90_ops():
    plans = {(layout, key): Gemm("fp32", layout, arch=90, **kw)
             for layout in TRANSPOSED_LAYOUTS for key, kw in SM90_PLANS.items()}
    assert all(p.config.family == "sm90" for p in plans.values())
    built = compile_many([p.config for p in plans.values()], namespace="gemmgen_tf32_sm90_layouts_test")
    return dict(zip(plans, built))


@pytest.mark.parametrize("layout", TRANSPOSED_LAYOUTS)
@pytest.mark.parametrize("key", list(SM90_PLANS))
@needs_sm90
def test_sm90_transposed_layouts_against_float64(sm90_ops, layout, key):
    op = sm90_ops[(layout, key)]
    if key in ("split_k", "few_rows"):
        assert op.config.stream_k, f"{op.name}: the plan splits K"
    for m, n, k in SM90_SHAPES:
        a, b = sm80_inputs(layout, m, n, k, padded=True)
        operands = [torch.randn(n, device="cuda").bfloat16()] if op.config.epilogue.operands else []
        if min(m, n, k) > 1:
            assert op.path(a, b, *operands) == "fast", f"{op.name} {m}x{n}x{k}"
        check_sm80(op, a, b, operands, m, n, k)
        first = op(a, b, *operands)
        assert torch.equal(first, op(a, b, *operands)), f"{op.name} {m}x{n}x{k}: not the same bits twice"


@pytest.mark.parametrize("layout", TRANSPOSED_LAYOUTS)
@needs_sm90
def test_sm90_transposed_layouts_autograd(layout):
    """dA and dB of an sm90 op in a layout it transposes: its gradient kernels read the operands as stored."""
    a, b = sm80_inputs(layout, 300, 200, 100, padded=True)
    check_grads(Gemm("fp32", layout, arch=90).compile(), a.requires_grad_(), b.requires_grad_(),
                torch.randn(300, 200, device="cuda"))


# -- the sm80 family: every layout ---------------------------------------------------------------------------------

#: (M, N, K): aligned; ragged inside the tiles (K ends inside a k tile and inside a 16-byte chunk); one row; a few
#: hundred tiles; a wide N; K = 0.
SM80_SHAPES = ((256, 256, 256), (197, 263, 141), (1, 7, 5), (1000, 1000, 1000), (65, 4097, 260), (300, 200, 0))
SM80_PLANS = {f"{layout}_d{order}": dict(layout=layout, layout_c=order)
              for layout in LAYOUTS for order in ("row", "col")}
SM80_PLANS["tn_gelu_tanh_bias_bf16"] = dict(layout="tn", activation="gelu_tanh", bias="col", out_dtype="bf16")
#: The fast kernel's 16-byte rule in fp32 elements: leading dimensions padded to it take the fast path.
ALIGN_ELEMS = 4


@pytest.fixture(scope="module")
def sm80_ops():
    """One sm80-family op per plan, for the visible GPU (family='sm80' on Hopper, where sm90 is the default)."""
    plans = {key: Gemm("fp32", family="sm80", **kw) for key, kw in SM80_PLANS.items()}
    assert all(p.config.family == "sm80" for p in plans.values())
    built = compile_many([p.config for p in plans.values()], namespace="gemmgen_tf32_sm80_test")
    return dict(zip(plans, built))


def stored(rows: int, cols: int, order: str, padded: bool) -> torch.Tensor:
    """A random fp32 (rows, cols) matrix stored row- or column-major; padded: its leading dimension rounded up to
    the fast kernel's 16-byte rule (a view into a wider buffer), else exactly the matrix's."""
    inner, outer = (cols, rows) if order == "row" else (rows, cols)
    ld = inner + (-inner % ALIGN_ELEMS if padded else 0)
    t = torch.randn(outer, ld, device="cuda")[:, :inner]
    return t if order == "row" else t.t()


def sm80_inputs(layout: str, m: int, n: int, k: int, padded: bool):
    a_order, b_order = ("row" if letter == "t" else "col" for letter in layout)
    return stored(m, k, a_order, padded), stored(k, n, b_order, padded)


def poisoned_out(op, m: int, n: int):
    """(buffer, D): D a view of a NaN-filled buffer whose leading dimension is padded (so a row-major D takes the
    staged epilogue's 16-byte stores, ragged N included); the padding must stay NaN."""
    row = op.config.layout.c.value == "row"
    inner, outer = (n, m) if row else (m, n)
    buf = torch.full((outer, inner + -inner % ALIGN_ELEMS + ALIGN_ELEMS), float("nan"), dtype=op.out_dtype,
                     device="cuda")
    view = buf[:, :inner]
    return buf, view if row else view.t()


def check_sm80(op, a, b, operands, m: int, n: int, k: int) -> None:
    ref = a.double() @ b.double()
    if operands:
        ref = torch.nn.functional.gelu(ref + operands[0].double(), approximate="tanh")
    buf, out = poisoned_out(op, m, n)
    op(a, b, *operands, out=out)
    assert torch.isfinite(out).all(), f"{op.name} {m}x{n}x{k}: unwritten elements"
    assert torch.isnan(buf[:, out.shape[1] if op.config.layout.c.value == "row" else out.shape[0]:]).all(), (
        f"{op.name} {m}x{n}x{k}: wrote past the matrix")
    if ref.norm() == 0:
        assert torch.count_nonzero(out) == 0, f"{op.name} {m}x{n}x{k}: K = 0 gives zeros"
        return
    bound = 1e-2 if out.dtype == torch.bfloat16 else BOUND
    assert rel(out, ref) <= bound, f"{op.name} {m}x{n}x{k}: {rel(out, ref):.2e}"


@pytest.mark.parametrize("key", list(SM80_PLANS))
def test_sm80_against_float64(sm80_ops, key):
    op = sm80_ops[key]
    layout = SM80_PLANS[key]["layout"]
    for m, n, k in SM80_SHAPES:
        for padded in (True, False):
            a, b = sm80_inputs(layout, m, n, k, padded)
            operands = [torch.randn(n, device="cuda").bfloat16()] if op.config.epilogue.operands else []
            if padded and min(m, n, k) > 1:   # (a single row's leading dimension is its length: maybe unaligned)
                assert op.path(a, b, *operands) == "fast", f"{op.name} {m}x{n}x{k}"
            check_sm80(op, a, b, operands, m, n, k)


def tf32_of(t: torch.Tensor, rounded: bool) -> torch.Tensor:
    """fp32 -> the tf32 the tensor cores multiply, in float64: the 13 low mantissa bits dropped after adding half of
    them (rounded to nearest, ties away, as cvt.rna; sm_90's cvt.rn breaks ties to even: rare, and an ulp apart) or
    not (truncated, what mma.sync makes of raw fp32 bits)."""
    bits = t.contiguous().view(torch.int32)
    if rounded:
        bits = bits + 0x1000
    return (bits & -0x2000).view(torch.float32).double()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sm80_rounds_inputs_to_nearest_tf32(sm80_ops, layout):
    # Products of tf32 values are exact in fp32: against the rounded inputs only the fp32 accumulation is left, far
    # below what truncating them would cost (~3e-4).
    op = sm80_ops[f"{layout}_drow"]
    a, b = sm80_inputs(layout, 256, 256, 256, padded=True)
    assert op.path(a, b) == "fast"
    d = op(a, b)
    rounded = rel(d, tf32_of(a, True) @ tf32_of(b, True))
    truncated = rel(d, tf32_of(a, False) @ tf32_of(b, False))
    assert rounded <= 1e-4 and rounded < 0.25 * truncated, (rounded, truncated)


@pytest.mark.parametrize("layout", ["nt", "tn"])
def test_sm80_nan_inputs_stay_nan(sm80_ops, layout):
    op = sm80_ops[f"{layout}_drow"]
    a, b = sm80_inputs(layout, 256, 192, 128, padded=True)
    a[3, 5] = float("nan")
    d = op(a, b)
    assert torch.isnan(d[3]).all() and torch.isfinite(torch.cat([d[:3], d[4:]])).all()


def test_sm80_autograd_against_float64(sm80_ops):
    # layout nt: A and B M/N-major. dA and dB run sm80 tf32 kernels of the gradient's own layouts, no copies.
    op = sm80_ops["nt_drow"]
    for m, n, k in ((300, 200, 100), (64, 48, 32)):      # dense operands, every leading dimension aligned
        for grad_order in ("row", "col"):
            a, b = (t.requires_grad_() for t in sm80_inputs("nt", m, n, k, padded=False))
            a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
            g = stored(m, n, grad_order, padded=False)
            op(a, b).backward(g)
            (a64 @ b64).backward(g.double())
            for got, ref, t in ((a.grad, a64.grad, a), (b.grad, b64.grad, b)):
                assert got.dtype == torch.float32 and got.stride() == t.stride()
                assert rel(got, ref) <= BOUND, (m, n, k, grad_order, rel(got, ref))
