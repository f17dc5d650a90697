"""The bad-input matrix: each call raises a clear TypeError/ValueError before any launch, the process
survives, and a following valid call is still right."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from generator import Gemm  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def op():
    torch.backends.cuda.matmul.allow_tf32 = False
    return Gemm(dtype="bf16", layout="tn").compile()


def good(m=256, n=128, k=64, dtype=torch.bfloat16):
    a = torch.randn(m, k, device="cuda").to(dtype)
    b = torch.randn(n, k, device="cuda").to(dtype).t()
    return a, b


def assert_still_right(op):
    a, b = good(321, 123, 77)
    d = op(a, b)
    ref = a.float() @ b.float()
    assert ((d.float() - ref).norm() / ref.norm()).item() < 1e-2


BAD_CASES = {
    "A not a tensor": (lambda: ([[1.0]], good()[1]), TypeError, "A must be a torch.Tensor"),
    "A 4-D": (lambda: (torch.randn(2, 2, 4, 8, device="cuda").bfloat16(), good()[1]), ValueError,
              "A must be 2-D (M, K) or 3-D (batch, M, K)"),
    "A float32": (lambda: (good()[0].float(), good()[1]), TypeError, "pass A.to(torch.bfloat16)"),
    "B float16": (lambda: (good()[0], good()[1].half()), TypeError, "this plan computes bf16"),
    "A on CPU": (lambda: (good()[0].cpu(), good()[1]), ValueError, "pass A.cuda()"),
    "K mismatch": (lambda: (good(k=64)[0], good(k=32)[1]), ValueError, "K must agree"),
    "B row-major": (lambda: (good()[0], good()[1].contiguous()), ValueError,
                    "this plan was made for layout_b='col': plan with layout='tt'"),
    "A column-major": (lambda: (good()[0].t().contiguous().t(), good()[1]), ValueError,
                       "this plan was made for layout_a='row': plan with layout='nn'"),
    "A neither": (lambda: (torch.randn(64, 256, device="cuda").bfloat16()[::2, ::2], good(k=128)[1]), ValueError,
                  "neither row- nor column-major"),
}


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_operands(op, case):
    make, error, message = BAD_CASES[case]
    a, b = make()
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        op(a, b)
    assert_still_right(op)


def test_same_check_through_torch_ops(op):
    a, b = good()
    with pytest.raises(ValueError, match="layout_b='col'"):
        getattr(torch.ops.gemmgen, op.name)(a, b.contiguous())
    assert_still_right(op)


BAD_OUTS = {
    "wrong shape": (lambda: torch.empty(10, 10, device="cuda", dtype=torch.bfloat16), ValueError, "out has shape"),
    "wrong dtype": (lambda: torch.empty(256, 128, device="cuda", dtype=torch.float32), TypeError, "out is torch.float32"),
    "on CPU": (lambda: torch.empty(256, 128, dtype=torch.bfloat16), ValueError, "allocate out on cuda"),
    "column-major": (lambda: torch.empty(128, 256, device="cuda", dtype=torch.bfloat16).t(), ValueError,
                     "plan with layout_c='col'"),
    "not a tensor": (lambda: 3, TypeError, "out must be a torch.Tensor"),
}


@pytest.mark.parametrize("case", BAD_OUTS)
def test_bad_out(op, case):
    make, error, message = BAD_OUTS[case]
    a, b = good()
    with pytest.raises(error, match=message):
        op(a, b, out=make())
    assert_still_right(op)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_operands_on_two_devices(op):
    a, b = good()
    with pytest.raises(ValueError, match="put both on one GPU"):
        op(a, b.to("cuda:1"))
