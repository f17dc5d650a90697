"""An emitted package with fused epilogues on the GPU: emit epilogue plans (knobs; a function with row, matrix and
scalar operands and a second output; a column-major D) for the visible GPU, with autograd (its backward kernels),
pip-install the package (--no-build-isolation --no-deps), import it, and check each op: numerics against the
float64 reference of the whole expression (generator.runtime.evaluate on the float64 product), bit-equality with
the JIT op of the same plan (same kernel, same launch arguments), out= (in place on the matrix operand too), the
same error messages as the JIT op for bad operands, gradients of A, B and every tensor operand (and double
backward) against float64 torch autograd of the same expression, .out refusing grad, opcheck and
torch.compile(fullgraph=True).
"""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from generator import Gemm, emit  # noqa: E402
from generator import epilogue as ep  # noqa: E402
from generator.planner.backward import accumulator_config  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from generator.runtime.evaluate import evaluate, operand_values  # noqa: E402
from toolchain import find_cuda_home, pip_install_and_import  # noqa: E402

pytestmark = pytest.mark.gpu

PACKAGE = "gemmgen_gpu_emitted_epilogue"
BOUND = {torch.bfloat16: 1e-2, torch.float16: 5e-3}
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
RAGGED = [(1, 1, 1), (127, 65, 33), (256, 384, 64), (1000, 1500, 333), (3, 515, 1029), (4097, 63, 8)]


def fused(acc, bias: ep.Col, C: ep.Matrix, alpha: ep.Scalar, beta: ep.Scalar):
    return ep.silu(alpha * acc + bias) + beta * C


FP32_ROW = ep.Row(dtype="fp32")


def scaled_with_aux(acc, scale: FP32_ROW):
    h = scale * acc
    return ep.gelu_tanh(h), h


#: op name -> Gemm keyword arguments (arch: the visible GPU's).
PLANS = {
    "linear_gelu": dict(dtype="bf16", layout="tn", activation="gelu", bias="col"),
    "fused": dict(dtype="fp16", layout="nt", epilogue=fused),
    "scaled_aux": dict(dtype="bf16", layout="tt", layout_c="col", epilogue=scaled_with_aux),
}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Emit PLANS for this GPU, pip install the package into a target folder, import it; also the JIT ops."""
    cuda_home = find_cuda_home()
    if cuda_home is None:
        pytest.skip("nvcc not found (set CUDA_HOME): cannot build the emitted package")
    major, minor = torch.cuda.get_device_capability()
    root = tmp_path_factory.mktemp("emitted_epilogue")
    plans = {op: Gemm(arch=major * 10 + minor, **kw) for op, kw in PLANS.items()}
    pkg = emit(list(plans.values()), name=PACKAGE, out=root / PACKAGE, op_names=list(plans))
    # with autograd (the default): the plans' kernels, their backward's and each epilogue's acc kernel (fp32 out)
    backward = json.loads((pkg / "plans.json").read_text())["backward_kernels"]
    assert len(list((pkg / "csrc").glob("*.cu"))) == len(plans) + len(backward)
    assert {accumulator_config(p.config).name for p in plans.values()} <= set(backward)
    module, _ = pip_install_and_import(pkg, PACKAGE, root, cuda_home)
    jit = dict(zip(plans, compile_many([p.config for p in plans.values()], namespace="gemmgen_emitted_ep_jit")))
    return {"module": module, "plans": plans, "jit": jit}


def inputs(plan: Gemm, m: int, n: int, k: int, *, pad: int = 0):
    """A, B in the plan's storage orders (pad > 0 widens their leading dimension) and the epilogue's operands."""
    cfg = plan.config
    dtype = TORCH_DTYPE[cfg.dtype.value]

    def stored(rows, cols, order, t, extra=0):
        if order == "row":
            return torch.randn(rows, cols + extra, device="cuda").to(t)[:, :cols]
        return torch.randn(cols, rows + extra, device="cuda").to(t)[:, :rows].t()

    a, b = stored(m, k, cfg.layout.a.value, dtype, pad), stored(k, n, cfg.layout.b.value, dtype, pad)
    values = []
    for o in cfg.epilogue.operands:
        if o.kind == "scalar":
            values.append(float(torch.empty(()).uniform_(0.5, 2.0)))
        elif o.kind in ("row", "col"):
            values.append(torch.randn(m if o.kind == "row" else n, device="cuda").to(TORCH_DTYPE[o.dtype.value]))
        else:
            values.append(stored(m, n, o.order.value, TORCH_DTYPE[o.dtype.value]))
    return a, b, values


def reference(plan: Gemm, a, b, values):
    epilogue = plan.config.epilogue
    return evaluate(epilogue, a.double() @ b.double(), operand_values(epilogue, values, torch.float64))


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def outputs(result):
    return list(result) if isinstance(result, tuple) else [result]


def test_ops_and_docstrings(installed):
    pkg = installed["module"]
    assert sorted(pkg.__all__) == sorted(PLANS)
    for op, plan in installed["plans"].items():
        doc = getattr(pkg, op).__doc__
        assert doc.startswith(f"D = {plan.epilogue.describe()[0].removeprefix('D = ')}, acc = A @ B"), doc
        for operand in plan.epilogue.operands:
            assert operand.describe() in doc
        assert pkg.PLANS[op]["kernel"] == plan.name and pkg.PLANS[op]["differentiable"] is True
    assert "scale: per-row vector (M,), fp32" in pkg.scaled_aux.__doc__


@pytest.mark.parametrize("op", PLANS)
def test_numerics_against_float64_and_the_jit_op(installed, op):
    plan, fn, jit = installed["plans"][op], getattr(installed["module"], op), installed["jit"][op]
    bound = BOUND[TORCH_DTYPE[plan.dtype.value]]
    out_dtype = TORCH_DTYPE[plan.out_dtype.value]
    for i, (m, n, k) in enumerate(RAGGED):
        a, b, values = inputs(plan, m, n, k, pad=8 if i % 2 else 0)
        got = outputs(fn(a, b, *values))
        refs = [r for r in reference(plan, a, b, values) if r is not None]
        assert len(got) == len(refs) == (2 if plan.epilogue.aux is not None else 1)
        for t, ref in zip(got, refs):
            assert t.dtype == out_dtype and torch.isfinite(t).all(), f"{op} {m}x{n}x{k}"
            err = rel(t, ref)
            assert err <= bound, f"{op} {m}x{n}x{k}: relative error {err:.2e} > {bound}"
        theirs = outputs(jit(a, b, *values))
        for t, u in zip(got, theirs):
            assert t.stride() == u.stride() and torch.equal(t, u), f"{op} {m}x{n}x{k}: differs from the JIT op"
        named = dict(zip((o.name for o in plan.epilogue.operands), values))
        for t, u in zip(outputs(getattr(getattr(torch.ops, PACKAGE), op)(a, b, *values)), got):
            assert torch.equal(t, u)
        for t, u in zip(outputs(fn(a, b, **named)), got):   # the operands by name
            assert torch.equal(t, u)
        if plan.epilogue.aux is None:
            out = jit._empty_out(a, b).fill_(float("nan"))
            assert fn(a, b, *values, out=out) is out and torch.equal(out, got[0])


def test_k_zero_and_in_place(installed):
    plan, fn = installed["plans"]["fused"], installed["module"].fused
    a, b, values = inputs(plan, 130, 70, 0)
    d_ref, _ = reference(plan, a, b, values)
    assert rel(fn(a, b, *values), d_ref) <= BOUND[torch.float16]
    a, b, (bias, c, alpha, beta) = inputs(plan, 1000, 1003, 77)
    d_ref, _ = reference(plan, a, b, (bias, c, alpha, beta))
    assert fn(a, b, bias, c, alpha, beta, out=c) is c      # D = silu(alpha * acc + bias) + beta * C into C
    assert rel(c, d_ref) <= BOUND[torch.float16]


def test_errors_match_the_jit_op(installed):
    plan, fn, jit = installed["plans"]["fused"], installed["module"].fused, installed["jit"]["fused"]
    m, n, k = 256, 128, 64
    a, b, (bias, c, alpha, beta) = inputs(plan, m, n, k)
    bad = {
        "bias too short": (bias[:-1], c, alpha, beta),
        "bias float32": (bias.float(), c, alpha, beta),
        "bias on the CPU": (bias.cpu(), c, alpha, beta),
        "bias strided": (torch.randn(2 * n, device="cuda").half()[::2], c, alpha, beta),
        "C wrong shape": (bias, c[:-1], alpha, beta),
        "C column-major": (bias, c.t().contiguous().t(), alpha, beta),
        "C a number": (bias, 2.0, alpha, beta),
        "alpha a tensor": (bias, c, torch.tensor(1.0), beta),
        "beta a bool": (bias, c, alpha, True),
    }
    for label, values in bad.items():
        for out in (None, jit._empty_out(a, b)):
            with pytest.raises((TypeError, ValueError)) as ours:
                fn(a, b, *values, out=out)
            with pytest.raises((TypeError, ValueError)) as theirs:
                jit(a, b, *values, out=out)
            assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value)), label
    aux_fn, aux_plan = installed["module"].scaled_aux, installed["plans"]["scaled_aux"]
    x, y, values = inputs(aux_plan, m, n, k)
    with pytest.raises(ValueError, match=r"has a second output \(aux\), which out= cannot receive"):
        aux_fn(x, y, *values, out=installed["jit"]["scaled_aux"]._empty_out(x, y))
    d_ref, _ = reference(plan, a, b, (bias, c, alpha, beta))   # still right after the errors
    assert rel(fn(a, b, bias, c, alpha, beta), d_ref) <= BOUND[torch.float16]


def stored_in(t: torch.Tensor, order: str) -> bool:
    return t.stride(1 if order == "row" else 0) == 1 or min(t.shape) <= 1


def with_grad(a, b, values):
    """The inputs requiring grad, and their float64 copies (leaves of the reference); scalars stay numbers."""
    leaves = [a, b, *(v for v in values if isinstance(v, torch.Tensor))]
    for t in leaves:
        t.requires_grad_()
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    found = iter(leaves64[2:])
    values64 = [next(found) if isinstance(v, torch.Tensor) else v for v in values]
    return leaves, leaves64, values64


@pytest.mark.parametrize("op", PLANS)
def test_gradients_against_float64(installed, op):
    """dA, dB and every tensor operand's gradient, for a row-major, a column-major and an expanded upstream gradient
    (and a padded A and B), against float64 torch autograd of the whole expression (generator.runtime.evaluate on
    the float64 product); then double backward."""
    plan, fn = installed["plans"][op], getattr(installed["module"], op)
    dtype = TORCH_DTYPE[plan.dtype.value]
    packet = getattr(getattr(torch.ops, PACKAGE), op)
    for (m, n, k), kind, pad in (((256, 384, 64), "row", 0), ((127, 65, 33), "col", 8),
                                 ((1000, 1500, 333), "expanded", 0), ((3, 515, 1029), "row", 8)):
        a, b, values = inputs(plan, m, n, k, pad=pad)
        leaves, leaves64, values64 = with_grad(a, b, values)
        got = outputs(fn(a, b, *values))
        refs = [r for r in reference(plan, leaves64[0], leaves64[1], values64) if r is not None]
        if kind == "expanded":   # the gradient of sum(): strides (0, 0)
            sum(t.float().sum() for t in got).backward()
            sum(r.sum() for r in refs).backward()
        else:
            ups = [(torch.randn(m, n, device="cuda") if kind == "row" else torch.randn(n, m, device="cuda").t())
                   .to(t.dtype) for t in got]
            torch.autograd.backward(got, ups)
            torch.autograd.backward(refs, [u.double() for u in ups])
        for i, (t, t64) in enumerate(zip(leaves, leaves64)):
            assert t.grad.dtype == t.dtype and t.grad.shape == t.shape and torch.isfinite(t.grad).all(), (op, i)
            err = rel(t.grad, t64.grad)
            assert err <= BOUND[dtype], f"{op} {m}x{n}x{k} {kind}: input {i}: relative error {err:.2e}"
        if not pad:   # dA and dB in A's and B's storage order (autograd makes a padded view's grad contiguous)
            for t, order in ((a, plan.layout.a.value), (b, plan.layout.b.value)):
                assert stored_in(t.grad, order), (op, t.grad.stride())
    torch.library.opcheck(packet.default, (a.detach().requires_grad_(), b, *values),
                          test_utils=("test_schema", "test_autograd_registration"))
    # double backward: the gradients' own gradients, through the acc op and the epilogue's second derivatives
    a, b, values = inputs(plan, 200, 136, 72)
    leaves, leaves64, values64 = with_grad(a, b, values)
    got = outputs(fn(a, b, *values))
    ups = [torch.randn(200, 136, device="cuda").to(t.dtype).requires_grad_() for t in got]
    weights = [torch.randn(t.shape, device="cuda").to(dtype).double() for t in leaves]
    firsts = torch.autograd.grad(got, leaves, ups, create_graph=True)
    sum((g.double() * w).sum() for g, w in zip(firsts, weights)).backward()
    ups64 = [u.detach().double().requires_grad_() for u in ups]
    refs = [r for r in reference(plan, leaves64[0], leaves64[1], values64) if r is not None]
    firsts64 = torch.autograd.grad(refs, leaves64, ups64, create_graph=True)
    sum((g * w).sum() for g, w in zip(firsts64, weights)).backward()
    for i, (t, t64) in enumerate(zip(leaves + ups, leaves64 + ups64)):
        if t64.grad is None:   # no second derivative (fused's C: its gradient beta * dD does not depend on it)
            assert t.grad is None, (op, i)
            continue
        err = rel(t.grad, t64.grad)
        assert err <= BOUND[dtype], f"{op} double backward: input {i}: relative error {err:.2e}"


def test_out_refuses_grad(installed):
    plan, fn = installed["plans"]["linear_gelu"], installed["module"].linear_gelu
    a, b, (bias,) = inputs(plan, 64, 48, 32)
    out = installed["jit"]["linear_gelu"]._empty_out(a, b)
    for args in ((a.clone().requires_grad_(), b, bias), (a, b, bias.clone().requires_grad_())):
        with pytest.raises(RuntimeError, match=r"linear_gelu\.out: functions with out=\.\.\. arguments don't support "
                                               "automatic differentiation"):
            fn(*args, out=out)
    with torch.no_grad():
        d = fn(a.clone().requires_grad_(), b, bias, out=out)
    assert d is out and d.grad_fn is None and rel(d, reference(plan, a, b, [bias])[0]) <= BOUND[torch.bfloat16]


@pytest.mark.parametrize("op", PLANS)
def test_opcheck_and_torch_compile(installed, op):
    plan, fn = installed["plans"][op], getattr(installed["module"], op)
    packet = getattr(getattr(torch.ops, PACKAGE), op)
    a, b, values = inputs(plan, 257, 129, 65)
    torch.library.opcheck(packet.default, (a, b, *values))
    if plan.epilogue.aux is None:
        torch.library.opcheck(packet.out, (a, b, *values), {"out": installed["jit"][op]._empty_out(a, b)})
    torch._dynamo.reset()

    def f(a, b, *values):
        return [t.float() * 2.0 for t in outputs(fn(a, b, *values))]

    compiled = torch.compile(f, fullgraph=True)
    for m in (128, 300, 77):
        a, b, values = inputs(plan, m, 96, 64)
        for x, y in zip(compiled(a, b, *values), f(a, b, *values)):
            assert torch.equal(x, y)
