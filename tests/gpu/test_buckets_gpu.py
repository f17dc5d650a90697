"""M-bucketed ops on the GPU (Gemm.compile_buckets, generator.nn.Linear without m): each call runs its bucket's
kernel (op.path), every bucket against float64 with NaN-poisoned outputs, nn.Linear's buckets agree with the
single-kernel ops, and a torch.compile'd graph (one op over every bucket, BucketSetOp) runs each call's bucket."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from gpu_cases import BOUND  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.nn import Linear  # noqa: E402
from generator.runtime import BucketedOp  # noqa: E402
from generator.runtime.buckets import BucketSetOp  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def bucketed():
    return Gemm("bf16", "tn", n=4096, k=1024, bias="col", namespace="gemmgen_buckets_test").compile_buckets()


def bucket_taking(bucketed, m: int) -> int:
    """The index of the bucket that should take m rows: the first whose bound is at least m, else the last."""
    bounds = [b.max_m for b in bucketed.buckets]
    return next((i for i, bound in enumerate(bounds) if bound is not None and m <= bound), len(bounds) - 1)


def test_every_bucket_against_float64(bucketed):
    names = [b.op.name for b in bucketed.buckets]
    assert len(set(names)) == len(names) >= 2
    for m in (1, 64, 100, 128, 200, 300, 2000, 3000, 5000):
        x = torch.randn(m, 1024, device="cuda").bfloat16()
        w = torch.randn(4096, 1024, device="cuda").bfloat16()
        bias = torch.randn(4096, device="cuda").bfloat16()
        expected_op = bucketed.buckets[bucket_taking(bucketed, m)].op
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


def kernels_run(fn) -> set[str]:
    """The names of the CUDA kernels ``fn()`` launches, from the profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.key for e in prof.key_averages()}


def test_compiled_graph_runs_each_calls_bucket(bucketed):
    """Under torch.compile the graph calls the op over every bucket, which picks per call in C++ (gemm_op.h
    bucket_of): one graph for every M, the bucket's kernel in the profile and no other bucket's, the same bits as
    the bucket's own op; the Python path (op.run, through ctypes) picks the same."""
    from torch._dynamo.testing import CompileCounterWithBackend

    set_op = bucketed.set_op()
    assert isinstance(set_op, BucketSetOp) and set_op.cpp_kernel
    torch._dynamo.reset()
    w = torch.randn(4096, 1024, device="cuda").bfloat16()
    bias = torch.randn(4096, device="cuda").bfloat16()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(lambda x: bucketed(x, w.t(), bias), backend=counter, fullgraph=True, dynamic=True)
    names = {b.op.config.name for b in bucketed.buckets}   # the CUDA kernels' names (an op's may add _bwd_...)
    for m in (1, 64, 100, 200, 300, 2000, 5000):
        x = torch.randn(m, 1024, device="cuda").bfloat16()
        expected = bucketed.buckets[bucket_taking(bucketed, m)].op
        assert set_op.path(x, w.t(), bias).startswith(expected.name + ": ")
        compiled(x)   # (the first call compiles)
        ran = kernels_run(lambda: compiled(x))
        ours = {name for name in names if any(name in k for k in ran)}
        assert ours == {expected.config.name}, (m, ours, ran)
        y = compiled(x)
        assert torch.equal(y, expected(x, w.t(), bias)), m
        assert torch.equal(set_op(x, w.t(), bias), y) and torch.equal(set_op.run(x, w.t(), (bias,), None), y), m
    # M = 1 gets a graph of its own (dynamo specializes sizes 0 and 1 whatever the op); every other M shares one
    assert counter.frame_count == 2, f"{counter.frame_count} compiles for 7 row counts"


def test_each_bucket_differentiates_on_kernels_planned_for_its_shape():
    """Each bucket's op chooses its backward kernels for the bucket's forward problem (planner.backward_configs with the
    problem and the op's plan_gradient): at 256 tokens dW's inner dimension is 256, not a large square. Gradients of every bucket (ragged M
    included) against float64; the grad ops are the hinted plans."""
    from generator.planner import Problem
    from generator.planner.backward import backward_configs
    from generator.runtime.autograd import grad_ops
    from generator.spec.types import Order

    n, k = 3072, 1024
    op = Gemm("bf16", "tn", n=n, k=k, namespace="gemmgen_buckets_grad_test").compile_buckets()
    hinted = [b for b in op.buckets if b.op.problem is not None]
    assert hinted, "no bucket's backward differs from the unhinted plan"
    for bucket in op.buckets:
        bound = bucket.max_m or 4096
        want = backward_configs(bucket.op.config, Order.row, Problem(bound, n, k) if bucket.op.problem else None,
                                bucket.op.plan_gradient)   # (tune.tuned_plan: a shipped table may answer a gradient)
        assert tuple(g.config for g in grad_ops(bucket.op, Order.row)) == want
    for m in (77, 256, 300, 1500, 3000):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        op(x, w.t()).backward(dy)
        x64, w64, dy64 = x.detach().double(), w.detach().double(), dy.double()
        for got, ref, what in ((x.grad, dy64 @ w64, "dX"), (w.grad, dy64.t() @ x64, "dW")):
            assert got is not None and torch.isfinite(got).all(), (m, what)
            err = ((got.double() - ref).norm() / ref.norm()).item()
            assert err <= BOUND[torch.bfloat16], (m, what, err)
