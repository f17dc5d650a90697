"""M-bucketed ops on the GPU (Gemm.compile_buckets, generator.nn.Linear without m): each call runs its bucket's
kernel (op.path), every bucket against float64 with NaN-poisoned outputs, and nn.Linear's buckets agree with
the single-kernel ops."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from gpu_cases import BOUND  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.nn import Linear  # noqa: E402
from generator.runtime import BucketedOp  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def bucketed():
    return Gemm("bf16", "tn", n=4096, k=1024, bias="col", namespace="gemmgen_buckets_test").compile_buckets()


def test_every_bucket_against_float64(bucketed):
    names = [b.op.name for b in bucketed.buckets]
    assert len(set(names)) == len(names) >= 2
    for m, bucket in ((1, 0), (64, 0), (100, 1), (128, 1), (300, 2), (2000, -1)):
        x = torch.randn(m, 1024, device="cuda").bfloat16()
        w = torch.randn(4096, 1024, device="cuda").bfloat16()
        bias = torch.randn(4096, device="cuda").bfloat16()
        expected_op = bucketed.buckets[bucket].op
        assert bucketed.path(x, w.t(), bias).startswith(expected_op.name + ": ")
        out = torch.full((m, 4096), float("nan"), device="cuda", dtype=torch.bfloat16)
        bucketed(x, w.t(), bias, out=out)
        ref = x.double() @ w.double().t() + bias.double()
        assert torch.isfinite(out).all()
        assert ((out.double() - ref).norm() / ref.norm()).item() <= BOUND[torch.bfloat16], m
        assert torch.equal(out, expected_op(x, w.t(), bias))


def test_linear_holds_buckets_without_m():
    layer = torch.nn.Linear(1024, 4096).to("cuda", torch.bfloat16)
    ours = Linear(layer)
    assert isinstance(ours.op, BucketedOp)
    fixed = Linear(layer, m=128)
    assert not isinstance(fixed.op, BucketedOp)
    with torch.no_grad():
        for m in (3, 128, 700):
            x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
            ref = x.double() @ layer.weight.double().t() + layer.bias.double()
            y = ours(x)
            assert ((y.double() - ref).norm() / ref.norm()).item() <= BOUND[torch.bfloat16]
        assert torch.equal(ours(x[:128]), fixed(x[:128]))   # the M <= 128 bucket is the m=128 plan's kernel
