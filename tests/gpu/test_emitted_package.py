"""An emitted package on the GPU: emit plans for the visible GPU, pip-install the package
(--no-build-isolation --no-deps, timed: one op must install in <= 60 s on the 16-core GPU machine), import
it, and check every op: numerics against a float32 reference on fresh random inputs with ragged sizes and
NaN-poisoned out, bit-equality with the JIT-built op of the same plan, the same error messages as the JIT op,
opcheck and torch.compile(fullgraph=True); and autograd (the package is emitted with its backward kernels):
gradients against float64 for a row-major, a column-major and an expanded dD, bit-equal to the JIT op's,
double backward, .out not differentiable, a compiled training step.
"""
from __future__ import annotations

import itertools
import os
import time

import pytest

torch = pytest.importorskip("torch")

from generator import Gemm, emit  # noqa: E402
from generator.planner.backward import backward_closure  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from toolchain import find_cuda_home, pip_install_and_import  # noqa: E402

pytestmark = pytest.mark.gpu

PACKAGE = "gemmgen_gpu_emitted"
#: The plans, for the visible GPU's architecture: row-major D, column-major D with an fp32 output, fp16.
PLANS = {
    "gemm_bf16_tn": dict(dtype="bf16", layout="tn"),
    "gemm_fp16_nn": dict(dtype="fp16", layout="nn"),
    "gemm_bf16_tt_ofp32_dcol": dict(dtype="bf16", layout="tt", out_dtype="fp32", layout_c="col"),
}
# Applied to this three-op package with its backward kernels (17 .cu files): stricter than the one-op bound. On
# 16 cores the kernels compile beside binding.cpp (torch headers), the longest job, which barely grows with ops.
INSTALL_LIMIT_S = float(os.environ.get("GEMMGEN_EMIT_INSTALL_LIMIT_S", "60"))
BOUND = {torch.bfloat16: 1e-2, torch.float16: 5e-3}
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
RAGGED = [(1, 1, 1), (127, 65, 33), (256, 384, 64), (1000, 1500, 333), (3, 515, 1029), (4097, 63, 8),
          (1024, 1024, 1024), (129, 2049, 4095)]


def report(request, line: str) -> None:
    """One line on the terminal past pytest's capture, so the install time lands in the log."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            reporter.write_line(line)


@pytest.fixture(scope="module")
def installed(tmp_path_factory, request):
    """Emit PLANS for this GPU, pip install the package into a target folder, import it; also the JIT ops."""
    cuda_home = find_cuda_home()
    if cuda_home is None:
        pytest.skip("nvcc not found (set CUDA_HOME): cannot build the emitted package")
    root = tmp_path_factory.mktemp("emitted")
    plans = {op: Gemm(**kw) for op, kw in PLANS.items()}
    start = time.perf_counter()
    pkg = emit(list(plans.values()), name=PACKAGE, out=root / PACKAGE, op_names=list(plans))
    emit_s = time.perf_counter() - start
    module, install_s = pip_install_and_import(pkg, PACKAGE, root, cuda_home)
    kernels = len(list((pkg / "csrc").glob("*.cu")))
    report(request, f"[emitted package] {len(plans)} ops for sm_{next(iter(plans.values())).arch} with autograd "
                    f"({kernels} kernels, the backward's included): emit {emit_s * 1000:.0f} ms, pip install "
                    f"--no-build-isolation {install_s:.1f} s ({os.cpu_count()} CPUs)")
    # The JIT ops, and the kernels of their backward built now in one parallel run (not one by one on first use)
    configs = [plan.config for plan in plans.values()]
    backward = [c for c in backward_closure(configs).values() if c not in configs]
    built = compile_many(configs + backward, namespace=next(iter(plans.values())).namespace)
    jit = dict(zip(plans, built))
    return {"module": module, "plans": plans, "jit": jit, "install_s": install_s}


def operands(plan: Gemm, m: int, n: int, k: int, *, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random A (M, K) and B (K, N) stored as the plan's layout says; pad > 0 widens the leading dimension."""
    dtype = TORCH_DTYPE[plan.dtype.value]
    a_row, b_row = plan.layout.a.value == "row", plan.layout.b.value == "row"
    # convert first, slice second: .to() of a sliced view would make it contiguous again
    a = (torch.randn(m, k + pad, device="cuda").to(dtype)[:, :k] if a_row
         else torch.randn(k, m + pad, device="cuda").to(dtype)[:, :m].t())
    b = (torch.randn(k, n + pad, device="cuda").to(dtype)[:, :n] if b_row
         else torch.randn(n, k + pad, device="cuda").to(dtype)[:, :k].t())
    return a, b


def poisoned_out(plan: Gemm, m: int, n: int) -> torch.Tensor:
    dtype = TORCH_DTYPE[plan.out_dtype.value]
    if plan.layout.c.value == "row":
        return torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    return torch.full((n, m), float("nan"), dtype=dtype, device="cuda").t()


def rel_error(d: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    ref = a.float() @ b.float()
    return ((d.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def test_install_time(installed):
    assert installed["install_s"] <= INSTALL_LIMIT_S, (
        f"pip install of the emitted package took {installed['install_s']:.1f} s; the bound is {INSTALL_LIMIT_S} s")


def test_ops_are_registered_with_docstrings(installed):
    pkg = installed["module"]
    assert sorted(pkg.__all__) == sorted(PLANS)
    for op, plan in installed["plans"].items():
        assert hasattr(getattr(torch.ops, PACKAGE), op)
        assert plan.name in getattr(pkg, op).__doc__
        assert pkg.PLANS[op]["kernel"] == plan.name and pkg.PLANS[op]["arch"] == plan.arch


@pytest.mark.parametrize("op", PLANS)
def test_numerics_ragged_with_poisoned_out(installed, op):
    plan, fn, jit = installed["plans"][op], getattr(installed["module"], op), installed["jit"][op]
    bound = BOUND[TORCH_DTYPE[plan.dtype.value]]
    for i, (m, n, k) in enumerate(RAGGED):
        a, b = operands(plan, m, n, k, pad=8 if i % 2 else 0)
        out = poisoned_out(plan, m, n)
        d = fn(a, b, out=out)
        assert d is out
        assert not torch.isnan(d).any(), f"{op} {m}x{n}x{k}: NaN left in out"
        err = rel_error(d, a, b)
        assert err <= bound, f"{op} {m}x{n}x{k}: relative error {err:.2e} > {bound}"
        fresh = fn(a, b)
        assert fresh.dtype == TORCH_DTYPE[plan.out_dtype.value] and fresh.stride() == jit(a, b).stride()
        assert torch.equal(fresh, d), f"{op} {m}x{n}x{k}: out= and allocating calls differ"
        assert torch.equal(fresh, jit(a, b)), f"{op} {m}x{n}x{k}: the installed op differs from the JIT op"
        assert torch.equal(getattr(getattr(torch.ops, PACKAGE), op)(a, b), fresh)


@pytest.mark.parametrize("op", PLANS)
def test_unaligned_empty_and_zero_k(installed, op):
    plan, fn, jit = installed["plans"][op], getattr(installed["module"], op), installed["jit"][op]
    bound = BOUND[TORCH_DTYPE[plan.dtype.value]]
    a, b = operands(plan, 300, 200, 129, pad=1)   # leading dimensions off the 16-byte rule: the unaligned kernel
    assert jit.path(a, b) == "unaligned"
    assert rel_error(fn(a, b), a, b) <= bound
    assert torch.equal(fn(a, b), jit(a, b))
    a, b = operands(plan, 65, 33, 0)
    assert torch.count_nonzero(fn(a, b, out=poisoned_out(plan, 65, 33))) == 0
    for m, n in ((0, 64), (64, 0)):
        a, b = operands(plan, m, n, 32)
        assert tuple(fn(a, b).shape) == (m, n)


def test_current_stream(installed):
    plan, fn = installed["plans"]["gemm_bf16_tn"], installed["module"].gemm_bf16_tn
    a, b = operands(plan, 2048, 2048, 2048)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        d = fn(a, b)
    stream.synchronize()
    assert rel_error(d, a, b) <= BOUND[torch.bfloat16]


def bad_calls(plan: Gemm):
    """(label, A, B, out) with one thing wrong each."""
    a, b = operands(plan, 256, 128, 64)
    other = torch.float16 if plan.dtype.value == "bf16" else torch.bfloat16
    flip = lambda t: t.t().contiguous().t() if t.stride(-1) == 1 else t.contiguous()  # noqa: E731
    out = poisoned_out(plan, 256, 128)
    return [
        ("A on CPU", a.cpu(), b, None),
        ("B wrong dtype", a, b.to(other), None),
        ("A 4-D", a[None, None], b, None),   # (3-D is a batched call)
        ("A other order", flip(a), b, None),
        ("B other order", a, flip(b), None),
        ("A neither order", torch.randn(512, 256, device="cuda").to(a.dtype)[::2, ::4], b, None),
        ("K mismatch", a, operands(plan, 256, 128, 32)[1], None),
        ("out shape", a, b, out[:10]),
        ("out dtype", a, b, out.to(torch.float64)),
        ("out on CPU", a, b, out.cpu()),
        ("out other order", a, b, flip(out)),
    ]


@pytest.mark.parametrize("op", PLANS)
def test_errors_match_the_jit_op(installed, op):
    plan, fn, jit = installed["plans"][op], getattr(installed["module"], op), installed["jit"][op]
    for label, a, b, out in bad_calls(plan):
        with pytest.raises((TypeError, ValueError)) as ours:
            fn(a, b, out=out)
        with pytest.raises((TypeError, ValueError)) as theirs:
            jit(a, b, out=out)
        assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value)), label
    a, b = operands(plan, 333, 222, 111)  # still right after the errors
    assert rel_error(fn(a, b), a, b) <= BOUND[TORCH_DTYPE[plan.dtype.value]]


@pytest.mark.parametrize("op", PLANS)
def test_opcheck(installed, op):
    plan = installed["plans"][op]
    packet = getattr(getattr(torch.ops, PACKAGE), op)
    a, b = operands(plan, 257, 129, 65)
    torch.library.opcheck(packet.default, (a, b))
    # inputs that require grad: opcheck's autograd-registration and AOT-dispatch tests run the backward ops too
    torch.library.opcheck(packet.default, (a.clone().requires_grad_(), b.clone().requires_grad_()))
    torch.library.opcheck(packet.out, (a, b), {"out": poisoned_out(plan, 257, 129)})


@pytest.mark.parametrize("op", PLANS)
def test_torch_compile_fullgraph(installed, op):
    plan, fn = installed["plans"][op], getattr(installed["module"], op)
    torch._dynamo.reset()

    def f(a, b):
        return fn(a, b).float() * 2.0 + 1.0

    def g(a, b, out):  # .out under torch.compile: functionalized through its decomposition
        fn(a, b, out=out)
        return out.float() * 2.0

    # Dynamo refuses any out= call whose out is not contiguous (torch.mm's too): a column-major D is a
    # graph break there, so .out is compiled with graph breaks allowed for it (README, torch.compile).
    out_fullgraph = plan.layout.c.value == "row"
    compiled, compiled_out = torch.compile(f, fullgraph=True), torch.compile(g, fullgraph=out_fullgraph)
    for m in (128, 300, 77):
        a, b = operands(plan, m, 96, 64)
        assert torch.equal(compiled(a, b), f(a, b))
        out1, out2 = poisoned_out(plan, m, 96), poisoned_out(plan, m, 96)
        assert torch.equal(compiled_out(a, b, out1), g(a, b, out2))
        assert torch.equal(out1, out2)


# -- autograd (as tests/gpu/test_torch_integration.py checks the JIT ops) ----------------------------------

GRAD_KINDS = ("row-major", "column-major", "expanded")
GRAD_SHAPES = ((256, 192, 128), (127, 33, 65), (1, 5, 7), (300, 1, 40), (1000, 1500, 333))


def leaf(t: torch.Tensor) -> torch.Tensor:
    """A fresh leaf with t's values and strides, requiring grad."""
    return t.detach().clone().requires_grad_()


def rel64(got: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (got.double() - ref.double()).norm()
    return float("inf") if not torch.isfinite(diff) else (diff / ref.double().norm().clamp_min(1e-30)).item()


def grads(fn, a: torch.Tensor, b: torch.Tensor, kind: str, g: torch.Tensor | None):
    """(dA, dB) of fn(a, b) for a dD that is g (row- or column-major) or, for "expanded", that of D.sum()."""
    a, b = leaf(a), leaf(b)
    d = fn(a, b)
    if kind == "expanded":   # dD is a scalar's gradient expanded to (M, N): strides (0, 0)
        return torch.autograd.grad(d.sum(), (a, b))
    return torch.autograd.grad(d, (a, b), g)


def upstream(kind: str, m: int, n: int, dtype: torch.dtype) -> torch.Tensor | None:
    if kind == "row-major":
        return torch.randn(m, n, device="cuda").to(dtype)
    if kind == "column-major":
        return torch.randn(n, m, device="cuda").to(dtype).t()
    return None


def test_backward_ops_are_private_ops_of_the_package(installed):
    pkg, namespace = installed["module"], getattr(torch.ops, PACKAGE)
    assert pkg.AUTOGRAD is True
    closure = backward_closure(p.config for p in installed["plans"].values())
    for kernel in closure:
        assert hasattr(namespace, f"_grad_{kernel}") and f"_grad_{kernel}" not in pkg.__all__
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{PACKAGE}::_grad_{kernel}", "Autograd")
    for op in PLANS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{PACKAGE}::{op}", "Autograd")


@pytest.mark.parametrize("op", PLANS)
def test_autograd_against_float64_and_the_jit_op(installed, op):
    plan, fn, jit = installed["plans"][op], getattr(installed["module"], op), installed["jit"][op]
    dtype, out_dtype = TORCH_DTYPE[plan.dtype.value], TORCH_DTYPE[plan.out_dtype.value]
    for (m, n, k), kind in itertools.product(GRAD_SHAPES, GRAD_KINDS):
        a, b = operands(plan, m, n, k)
        g = upstream(kind, m, n, out_dtype)
        ours, theirs = grads(fn, a, b, kind, g), grads(jit, a, b, kind, g)
        refs = grads(torch.matmul, a.double(), b.double(), kind, None if g is None else g.double())
        for got, jit_got, ref, t, what in zip(ours, theirs, refs, (a, b), ("dA", "dB")):
            label = f"{op} {what} M={m} N={n} K={k} dD {kind}"
            assert got.dtype == dtype and got.shape == t.shape, label
            err = rel64(got, ref)
            assert err <= BOUND[dtype], f"{label}: relative error {err:.3g} > {BOUND[dtype]}"
            assert got.stride() == jit_got.stride() and torch.equal(got, jit_got), f"{label}: differs from the JIT op"


@pytest.mark.parametrize("op", PLANS)
def test_double_backward(installed, op):
    plan, fn, jit = installed["plans"][op], getattr(installed["module"], op), installed["jit"][op]
    dtype, out_dtype = TORCH_DTYPE[plan.dtype.value], TORCH_DTYPE[plan.out_dtype.value]
    a, b = operands(plan, 200, 96, 72)
    g = torch.randn(200, 96, device="cuda").to(out_dtype)
    # weights representable in the input dtype, so the float64 reference sees the same values
    w1 = torch.randn(200, 72, device="cuda").to(dtype).double()
    w2 = torch.randn(72, 96, device="cuda").to(dtype).double()

    def second(f, a, b, g):
        """Gradients of <dA, w1> + <dB, w2> with respect to A, B and dD: the backward ops' own backward."""
        a, b, g = leaf(a), leaf(b), leaf(g)
        ga, gb = torch.autograd.grad(f(a, b), (a, b), g, create_graph=True)
        loss = (ga.double() * w1).sum() + (gb.double() * w2).sum()
        return torch.autograd.grad(loss, (a, b, g))

    ours, theirs = second(fn, a, b, g), second(jit, a, b, g)
    refs = second(torch.matmul, a.double(), b.double(), g.double())
    for got, jit_got, ref, what in zip(ours, theirs, refs, ("A", "B", "dD")):
        err = rel64(got, ref)
        assert err <= BOUND[dtype], f"{op} second derivative w.r.t. {what}: relative error {err:.3g}"
        assert torch.equal(got, jit_got), f"{op} second derivative w.r.t. {what} differs from the JIT op"


@pytest.mark.parametrize("op", PLANS)
def test_out_is_not_differentiable(installed, op):
    plan, fn = installed["plans"][op], getattr(installed["module"], op)
    a, b = operands(plan, 64, 48, 32)
    out = poisoned_out(plan, 64, 48)
    with pytest.raises(RuntimeError, match=r"out=\.\.\. arguments don't support automatic differentiation"):
        fn(leaf(a), b, out=out)
    with torch.no_grad():
        assert fn(leaf(a), b, out=out) is out
    assert rel_error(out, a, b) <= BOUND[TORCH_DTYPE[plan.dtype.value]]


def test_compiled_training_step(installed):
    plan, fn = installed["plans"]["gemm_bf16_tn"], installed["module"].gemm_bf16_tn
    torch._dynamo.reset()

    def f(a, b):
        return torch.relu(fn(a, b)) + 1

    compiled = torch.compile(f, fullgraph=True)   # AOTAutograd traces the backward ops through their meta kernels
    for m in (256, 300):
        a, b = operands(plan, m, 192, 128)
        g = torch.randn(m, 192, device="cuda").bfloat16()
        a1, b1, a2, b2 = leaf(a), leaf(b), leaf(a), leaf(b)
        compiled(a1, b1).backward(g)
        f(a2, b2).backward(g)
        torch.testing.assert_close(a1.grad, a2.grad)
        torch.testing.assert_close(b1.grad, b2.grad)
