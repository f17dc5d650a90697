"""The ops as torch citizens, on the GPU: opcheck, torch.compile (fullgraph, dynamic M), autograd against a
float64 reference, and generator.nn.Linear in a small model next to the stock layers.

Error is ||x - ref|| / ||ref||, bounded per input dtype (bf16 1e-2, fp16 5e-3). Gradients cannot be checked
with torch.autograd.gradcheck (finite differences need float64; the kernels take fp16/bf16), so they are
compared with the gradients of the same product computed in float64.
"""
from __future__ import annotations

import copy
import itertools

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from generator import Gemm  # noqa: E402
from generator.runtime.autograd import grad_ops  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from generator.spec.types import Order  # noqa: E402

pytestmark = pytest.mark.gpu

BOUND = {torch.bfloat16: 1e-2, torch.float16: 5e-3}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LAYOUTS = ("tn", "tt", "nn", "nt")
# (layout, dtype, layout_c, out_dtype) of every forward op below, built in one parallel run.
KEYS = ([(lay, dt, "row", None) for lay, dt in itertools.product(LAYOUTS, DTYPES)]
        + [(lay, "bf16", "col", None) for lay in LAYOUTS]
        + [(lay, "bf16", "row", "fp32") for lay in LAYOUTS])


@pytest.fixture(scope="module", autouse=True)
def exact_reference():
    torch.backends.cuda.matmul.allow_tf32 = False
    yield


@pytest.fixture(scope="module")
def ops():
    plans = [Gemm(dtype=dt, layout=lay, layout_c=lc, out_dtype=od) for lay, dt, lc, od in KEYS]
    return dict(zip(KEYS, compile_many([p.config for p in plans], namespace="gemmgen")))


def operand(rows, cols, order, dtype, requires_grad=False):
    t = torch.randn(rows, cols, device="cuda") if order == "row" else torch.randn(cols, rows, device="cuda").t()
    return t.to(dtype).requires_grad_(requires_grad)


def operands(layout, m, n, k, dtype, requires_grad=False):
    return (operand(m, k, "row" if layout[0] == "t" else "col", dtype, requires_grad),
            operand(k, n, "row" if layout[1] == "t" else "col", dtype, requires_grad))


def empty_out(op, m, n):
    if op.config.layout.c is Order.row:
        return torch.empty(m, n, dtype=op.out_dtype, device="cuda")
    return torch.empty(n, m, dtype=op.out_dtype, device="cuda").t()


def rel(got, ref) -> float:
    ref = ref.double()
    diff = (got.double() - ref).norm()
    if not torch.isfinite(diff):
        return float("inf")
    return (diff / ref.norm().clamp_min(1e-30)).item()


# -- opcheck ---------------------------------------------------------------------------------------------

SHAPES = ((256, 192, 128), (127, 33, 65))   # the second is ragged and unaligned (K = 65)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout", ["tn", "nt"])
@pytest.mark.parametrize("overload", ["default", "out"])
def test_opcheck(ops, dtype, layout, overload):
    op = ops[(layout, dtype, "row", None)]
    for m, n, k in SHAPES:
        if overload == "default":
            # With inputs that require grad, test_autograd_registration and test_aot_dispatch_dynamic
            # cover the backward (dA, dB by this generator's kernels) too.
            a, b = operands(layout, m, n, k, DTYPES[dtype], requires_grad=True)
            result = torch.library.opcheck(op.op.default, (a, b))
            assert set(result.values()) == {"SUCCESS"}, result
            result = torch.library.opcheck(op.op.default, (a.detach(), b.detach()))
        else:
            # Like aten's out= ops, .out is not differentiable: inputs without grad.
            a, b = operands(layout, m, n, k, DTYPES[dtype])
            result = torch.library.opcheck(op.op.out, (a, b), {"out": empty_out(op, m, n)})
        assert set(result.values()) == {"SUCCESS"}, result


def test_opcheck_column_major_d_and_fp32_out(ops):
    for key in (("tn", "bf16", "col", None), ("nt", "bf16", "row", "fp32")):
        op = ops[key]
        for m, n, k in SHAPES:
            a, b = operands(key[0], m, n, k, torch.bfloat16, requires_grad=True)
            assert set(torch.library.opcheck(op.op.default, (a, b)).values()) == {"SUCCESS"}
            a, b = a.detach(), b.detach()
            result = torch.library.opcheck(op.op.out, (a, b), {"out": empty_out(op, m, n)})
            assert set(result.values()) == {"SUCCESS"}, result


# -- torch.compile ---------------------------------------------------------------------------------------

class Projection(nn.Module):
    """x @ W.t() through our op, then elementwise work for Inductor to fuse."""

    def __init__(self, op, via, n=192, k=128):
        super().__init__()
        self.op, self.via = op, via
        self.weight = nn.Parameter(torch.randn(n, k, device="cuda").to(op.dtype) / k ** 0.5)

    def forward(self, x):
        if self.via == "call":
            y = self.op(x, self.weight.t())
        else:
            y = getattr(torch.ops.gemmgen, self.op.name)(x, self.weight.t())
        return torch.relu(y) + 1


@pytest.mark.parametrize("via", ["call", "torch.ops"])
def test_compile_fullgraph_dynamic_m(ops, via):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model = Projection(ops[("tn", "bf16", "row", None)], via)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    with torch.no_grad():
        for m in (256, 1000, 77):
            x = torch.randn(m, 128, device="cuda").bfloat16()
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 1, f"{counter.frame_count} compiles for 3 values of a dynamic M"

    for m in (256, 1000, 77):   # training: one more graph (forward + backward), shared by every M
        x = torch.randn(m, 128, device="cuda").bfloat16().requires_grad_()
        torch._dynamo.mark_dynamic(x, 0)
        x_eager = x.detach().clone().requires_grad_()
        g = torch.randn(m, 192, device="cuda").bfloat16()
        compiled(x).backward(g)
        grad_w = model.weight.grad
        model.weight.grad = None
        model(x_eager).backward(g)
        torch.testing.assert_close(x.grad, x_eager.grad)
        torch.testing.assert_close(grad_w, model.weight.grad)
        model.weight.grad = None
    assert counter.frame_count == 2, f"{counter.frame_count} compiles"


def test_compile_fullgraph_out_overload(ops):
    op = ops[("tn", "fp16", "row", None)]

    def f(a, b):
        out = torch.empty(a.shape[0], b.shape[1], dtype=torch.float16, device="cuda")
        op(a, b, out=out)
        return out * 2

    torch._dynamo.reset()
    a, b = operands("tn", 300, 200, 64, torch.float16)
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(a, b), f(a, b))


# -- autograd --------------------------------------------------------------------------------------------

GRADS = ("contiguous", "column-major", "sliced", "expanded")
AUTOGRAD_SHAPES = ((256, 192, 128), (127, 33, 65), (1, 5, 7), (300, 1, 40))


def upstream(kind, m, n, dtype):
    if kind == "contiguous":
        return torch.randn(m, n, device="cuda").to(dtype)
    if kind == "column-major":
        return torch.randn(n, m, device="cuda").to(dtype).t()
    if kind == "sliced":        # row-major with leading dimension n + 3 and an odd offset: unaligned
        return torch.randn(m, n + 3, device="cuda").to(dtype)[:, 1:n + 1]
    return torch.randn((), device="cuda").to(dtype).expand(m, n)   # strides (0, 0)


@pytest.mark.parametrize("key", KEYS, ids=lambda k: "-".join(str(x) for x in k if x))
def test_autograd_against_float64(ops, key):
    layout, dtype_name, _, _ = key
    op, dtype = ops[key], DTYPES[dtype_name]
    for (m, n, k), kind in itertools.product(AUTOGRAD_SHAPES, GRADS):
        a, b = operands(layout, m, n, k, dtype, requires_grad=True)
        a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
        d = op(a, b)
        g = upstream(kind, m, n, d.dtype)
        d.backward(g)
        (a64 @ b64).backward(g.double())
        for got, ref, t, what in ((a.grad, a64.grad, a, "dA"), (b.grad, b64.grad, b, "dB")):
            assert got.dtype == dtype and got.shape == t.shape
            err = rel(got, ref)
            assert err <= BOUND[dtype], f"{op.name} {what} M={m} N={n} K={k} grad {kind}: rel error {err:.3g}"


def test_backward_runs_generated_kernels(ops):
    op = ops[("tn", "bf16", "row", None)]
    a, b = operands("tn", 64, 48, 32, torch.bfloat16, requires_grad=True)
    op(a, b).backward(torch.ones(64, 48, device="cuda", dtype=torch.bfloat16))
    grad_a, grad_b = grad_ops(op, Order.row)
    assert grad_a.built and grad_b.built
    # dW.t() of a tn forward is column-major: computed as dW = dD.t() @ A into row-major storage (writes_transposed)
    assert (grad_a.config.layout.tag, grad_b.config.layout.tag) == ("tt", "nt")
    assert grad_a.config.dtype == grad_b.config.dtype == op.config.dtype


@pytest.mark.parametrize("tokens, k", [(200, 5000), (384, 3000)])
def test_backward_of_a_bucket_swaps_dx(tokens, k):
    """At 129-384 tokens a tn op's dX is computed as dX.t() = W.t() @ dY.t() into column-major storage where that
    takes an odd-width tile (planner.backward.swaps_operands; 128x80 for these): the user's row-major dX, right
    against float64, and W's gradient too."""
    n = 1000
    op = Gemm("bf16", "tn", m=tokens, n=n, k=k, namespace="gemmgen_swapped_dx").compile()
    grad_a, _ = grad_ops(op, Order.row)
    assert grad_a.config.layout.tag == "nn_dcol", grad_a.name
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
    op(x, w.t()).backward(dy)
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    (x64 @ w64.t()).backward(dy.double())
    assert x.grad.is_contiguous() and w.grad.is_contiguous()
    for got, ref, what in ((x.grad, x64.grad, "dX"), (w.grad, w64.grad, "dW")):
        err = rel(got, ref)
        assert err <= BOUND[torch.bfloat16], f"{what} at {tokens} tokens: rel error {err:.3g}"


# -- generator.nn ------------------------------------------------------------------------------------------

def small_model():
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256), nn.Tanh(),
                         nn.Linear(256, 128, bias=False))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_replaced_model_matches_stock(dtype):
    from generator.nn import Linear, replace_linear

    torch.manual_seed(0)
    dt = DTYPES[dtype]
    base = small_model().cuda()
    ref64 = copy.deepcopy(base).double()
    stock = copy.deepcopy(base).to(dt)
    ours = copy.deepcopy(stock)
    assert replace_linear(ours) == 3
    assert all(isinstance(ours[i], Linear) for i in (0, 2, 4))

    x = torch.randn(4, 33, 256, device="cuda")      # 132 tokens: M is not a multiple of any tile
    g = torch.randn(4, 33, 128, device="cuda")
    results = {}
    for name, model in (("ref", ref64), ("stock", stock), ("ours", ours)):
        xx = x.to(next(model.parameters()).dtype).requires_grad_()
        y = model(xx)
        y.backward(g.to(y.dtype))
        results[name] = (y, xx.grad, [p.grad for p in model.parameters()])

    bound = BOUND[dt]
    (y, gx, gp), (y_ref, gx_ref, gp_ref), (y_stock, gx_stock, gp_stock) = (
        results["ours"], results["ref"], results["stock"])
    assert y.dtype == dt and y.shape == (4, 33, 128)
    # Each model is within the bound of float64; ours and stock within twice the bound of each other.
    assert rel(y, y_ref) <= bound and rel(y, y_stock) <= 2 * bound
    assert rel(gx, gx_ref) <= bound and rel(gx, gx_stock) <= 2 * bound
    for p, p_ref, p_stock in zip(gp, gp_ref, gp_stock):
        assert rel(p, p_ref) <= bound and rel(p, p_stock) <= 2 * bound

    # One SGD step: a learning rate that makes every update ten times the weight, so the deltas are not
    # lost to the rounding of the bf16/fp16 parameters; ours and stock move the weights alike.
    lr = 10 * max(p.float().norm().item() / p.grad.float().norm().item() for p in stock.parameters())
    before = [p.detach().clone() for p in stock.parameters()]
    for model in (stock, ours):
        torch.optim.SGD(model.parameters(), lr=lr).step()
    for p0, p_stock, p in zip(before, stock.parameters(), ours.parameters()):
        assert not torch.equal(p, p0)
        assert rel(p.float() - p0.float(), p_stock.float() - p0.float()) <= 2 * bound


def test_replaced_fp32_model_computes_in_bf16():
    from generator.nn import replace_linear

    torch.manual_seed(0)
    model = small_model().cuda()
    ref64 = copy.deepcopy(model).double()
    assert replace_linear(model, dtype=torch.bfloat16) == 3
    x = torch.randn(64, 256, device="cuda")
    y = model(x)
    assert y.dtype == torch.float32
    assert rel(y, ref64(x.double())) <= BOUND[torch.bfloat16]
    y.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def test_replaced_model_compiles_fullgraph():
    from torch._dynamo.testing import CompileCounterWithBackend

    from generator.nn import replace_linear

    torch.manual_seed(0)
    torch._dynamo.reset()
    model = small_model().cuda().bfloat16()
    replace_linear(model)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for tokens in (64, 100, 33):
        x = torch.randn(2, tokens, 256, device="cuda").bfloat16()
        torch._dynamo.mark_dynamic(x, 1)
        y = compiled(x)
        y_eager = model(x)
        assert rel(y, y_eager) <= BOUND[torch.bfloat16]
    y.float().sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert counter.frame_count == 1, f"{counter.frame_count} compiles for 3 token counts"


def test_cpu_input_falls_back_with_a_warning():
    from generator.nn import Linear

    layer = nn.Linear(64, 32).bfloat16()        # CPU weights: planned for this GPU, fed CPU inputs
    ours = Linear(layer)
    x = torch.randn(8, 64).bfloat16()
    with pytest.warns(UserWarning, match="using torch.nn.functional.linear"):
        y = ours(x)
    assert torch.equal(y, torch.nn.functional.linear(x, layer.weight, layer.bias))
    ours.cuda()                                  # the shared Parameters move; now the kernel takes it
    y = ours(x.cuda())
    assert rel(y, torch.nn.functional.linear(x.cuda().double(), layer.weight.double(), layer.bias.double())) \
        <= BOUND[torch.bfloat16]
