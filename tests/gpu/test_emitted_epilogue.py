"""An emitted package with fused epilogues on the GPU: emit epilogue plans (knobs; a function with row, matrix and
scalar operands and a second output; a column-major D) for the visible GPU, pip-install the package
(--no-build-isolation --no-deps), import it, and check each op: numerics against the float64 reference of the
whole expression (generator.runtime.evaluate on the float64 product), bit-equality with the JIT op of the same
plan (same kernel, same launch arguments), out= (in place on the matrix operand too), the same error messages as
the JIT op for bad operands, grad refused at the call (the package does not differentiate epilogues), opcheck and
torch.compile(fullgraph=True).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from generator import Gemm, emit  # noqa: E402
from generator import epilogue as ep  # noqa: E402
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
    assert not list((pkg / "csrc").glob("sm*_*_grad*")) and len(list((pkg / "csrc").glob("*.cu"))) == len(plans)
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
        assert pkg.PLANS[op]["kernel"] == plan.name and pkg.PLANS[op]["differentiable"] is False
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


def test_grad_is_refused_at_the_call(installed):
    plan, fn = installed["plans"]["linear_gelu"], installed["module"].linear_gelu
    a, b, (bias,) = inputs(plan, 64, 48, 32)
    for args in ((a.clone().requires_grad_(), b, bias), (a, b, bias.clone().requires_grad_())):
        with pytest.raises(RuntimeError, match="cannot differentiate .* requires grad"):
            fn(*args)
    with torch.no_grad():
        d = fn(a.clone().requires_grad_(), b, bias)
    assert d.grad_fn is None and rel(d, reference(plan, a, b, [bias])[0]) <= BOUND[torch.bfloat16]


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
