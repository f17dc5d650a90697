"""The JIT runtime's C++ CUDA kernel against the Python path it replaces, on the GPU: the same results
bit for bit, the same errors for every bad operand (those past the device check too), on every layout."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from generator import Gemm  # noqa: E402

pytestmark = pytest.mark.gpu

LAYOUTS = ("tn", "nt", "nn", "tt")


def operand(rows, cols, row_major, dtype=torch.bfloat16):
    t = torch.randn(rows, cols, device="cuda") if row_major else torch.randn(cols, rows, device="cuda").t()
    return t.to(dtype)


@pytest.fixture(scope="module")
def ops():
    from generator.runtime import compile_many

    plans = [Gemm("bf16", layout, arch=90) for layout in LAYOUTS]
    return dict(zip(LAYOUTS, compile_many([p.config for p in plans], namespace="gemmgen")))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cpp_kernel_matches_the_python_path(ops, layout):
    op = ops[layout]
    assert op.cpp_kernel, "the JIT runtime did not load on the GPU machine"
    a_row, b_row = op.config.layout.a.value == "row", op.config.layout.b.value == "row"
    for m, n, k in ((321, 123, 77), (256, 512, 128), (1, 8, 0)):
        a, b = operand(m, k, a_row), operand(k, n, b_row)
        cpp = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        python = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        op(a, b, out=cpp)
        op.run(a, b, (), python)
        assert torch.equal(cpp, python) and torch.equal(op(a, b), op.run(a, b, (), None))
        ref = a.double() @ b.double()
        if k:
            assert ((cpp.double() - ref).norm() / ref.norm()).item() < 1e-2
        else:
            assert not cpp.any()


def _error(call):
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


def test_cpp_kernel_says_what_the_python_path_says(ops):
    op = ops["tn"]
    a, b = operand(64, 32, True), operand(32, 48, False)
    bad_operands = {
        "B row-major": (a, b.contiguous()),
        "A column-major": (a.t().contiguous().t(), b),
        "A neither": (torch.randn(64, 128, device="cuda").bfloat16()[:, ::2], b),
        "K mismatch": (a, operand(16, 48, False)),
        "A on the CPU": (a.cpu(), b),
    }
    for case, (x, y) in bad_operands.items():
        assert _error(lambda: op(x, y)) == _error(lambda: op.run(x, y, (), None)), case
    bad_outs = {
        "shape": torch.empty(10, 10, device="cuda", dtype=torch.bfloat16),
        "dtype": torch.empty(64, 48, device="cuda"),
        "device": torch.empty(64, 48, dtype=torch.bfloat16),
        "order": torch.empty(48, 64, device="cuda", dtype=torch.bfloat16).t(),
    }
    for case, out in bad_outs.items():
        assert _error(lambda: op(a, b, out=out)) == _error(lambda: op.run(a, b, (), out)), case


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cpp_autograd_matches_the_python_formula(ops, layout, monkeypatch):
    """The C++ formula (gemm_op.h) and generator.runtime.autograd's Python fallback run the same kernels on the same
    operands: bit-equal gradients, for a row-major, a column-major and an expanded dD."""
    from generator.runtime import jit_runtime
    from generator.runtime import compile_op

    op = ops[layout]
    assert op.cpp_autograd
    monkeypatch.setattr(jit_runtime.RUNTIME, "register_autograd", lambda op, configs, epilogue=None: False)
    python = compile_op(op.config, namespace="gemmgen_python_formula")
    assert not python.cpp_autograd
    a_row, b_row = op.config.layout.a.value == "row", op.config.layout.b.value == "row"
    m, n, k = 333, 200, 96
    for kind in ("row", "col", "expanded"):
        a, b = operand(m, k, a_row), operand(k, n, b_row)
        g = {"row": torch.randn(m, n, device="cuda"), "col": torch.randn(n, m, device="cuda").t(),
             "expanded": torch.randn((), device="cuda").expand(m, n)}[kind].bfloat16()
        grads = []
        for which in (op, python):
            x, y = a.clone().requires_grad_(), b.clone().requires_grad_()
            which(x, y).backward(g)
            grads.append((x.grad, y.grad))
        assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1]), (layout, kind)
