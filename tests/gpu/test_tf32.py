"""tf32 on the GPU (sm90): fp32 tensors in, the tensor cores multiplying in tf32, fp32 (or 16-bit) out, against a
float64 reference; ragged sizes, NaN-poisoned outputs, every schedule and a cluster, a fused epilogue, autograd
(its kernels read both operands K-major, so the formula copies the others), and the refusals."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("tf32 kernels are sm90 (an H100-class GPU)", allow_module_level=True)

from gpu_cases import RAGGED  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

pytestmark = pytest.mark.gpu
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


def test_autograd_against_float64(ops):
    op = ops["cooperative"]
    for m, n, k in ((300, 200, 100), (64, 48, 32)):
        a, b = inputs(m, n, k, requires_grad=True)
        a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
        g = torch.randn(n, m, device="cuda").t()          # a column-major gradient: copied for the K-major kernels
        op(a, b).backward(g)
        (a64 @ b64).backward(g.double())
        assert rel(a.grad, a64.grad) <= BOUND and rel(b.grad, b64.grad) <= BOUND


def test_refusals_keep_the_process_working(ops):
    op = ops["cooperative"]
    a, b = inputs(128, 64, 32)
    with pytest.raises(ValueError, match="column-major"):
        op(a, b.contiguous())                              # B row-major: the plan reads it K-major
    with pytest.raises(TypeError, match="this plan computes tf32"):
        op(a.bfloat16(), b)
    assert rel(op(a, b), a.double() @ b.double()) <= BOUND
