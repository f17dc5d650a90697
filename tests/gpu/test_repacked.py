"""Operands off the 16-byte rule in problems big enough to repay a copy (M*N*K >= 2^26): the launch copies them into
an aligned workspace of its own and runs the fast (or small-M) kernel (templates/common/workspace.cuh). Every
layout, both families, fp8 and tf32; against a float64 reference with NaN-poisoned outputs; the user's tensors
untouched; bit-identical repeats; and a CUDA graph that captures the copy, its workspace and the GEMM, replayed on
new data."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from generator import Gemm, dequantize, quantize  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from generator.spec.config import REPACK_MIN_VOLUME  # noqa: E402

pytestmark = pytest.mark.gpu
IS_SM90 = torch.cuda.get_device_capability() >= (9, 0)
LAYOUTS = ("nn", "nt", "tn", "tt")

PLANS = {f"{family}_{layout}": dict(dtype="bf16", layout=layout, family=family)
         for family in ("sm90", "sm80") for layout in LAYOUTS}
PLANS["sm80_fp16_tn"] = dict(dtype="fp16", layout="tn", family="sm80")
PLANS["sm90_tf32_tn"] = dict(dtype="tf32", layout="tn", family="sm90")
PLANS["sm90_e4m3_row"] = dict(dtype="e4m3", layout="tn", scale="row", out_dtype="bf16", family="sm90")
BOUND = {torch.bfloat16: 1e-2, torch.float16: 5e-3, torch.float32: 2e-3}


@pytest.fixture(scope="module")
def ops():
    plans = {key: Gemm(**kw) for key, kw in PLANS.items() if IS_SM90 or kw["family"] == "sm80"}
    built = compile_many([p.config for p in plans.values()], namespace="gemmgen_repacked_test")
    return dict(zip(plans, built))


def operand(rows: int, cols: int, row_major: bool, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous rows x cols matrix in the given order: with an odd inner size its pitch breaks the 16-byte rule."""
    if row_major:
        return torch.randn(rows, cols, device="cuda").to(dtype)
    return torch.randn(cols, rows, device="cuda").to(dtype).t()


def problem(op, key: str, m: int, n: int, k: int):
    """(the op's arguments, their float64 product)."""
    layout = PLANS[key]["layout"]
    if op.dtype in (torch.float8_e4m3fn,):
        a, sa = quantize(torch.randn(m, k, device="cuda"), "e4m3", scale="row")
        q, sb = quantize(torch.randn(n, k, device="cuda"), "e4m3", scale="row")
        ref = dequantize(a, sa, scale="row").double() @ dequantize(q, sb, scale="row").double().t()
        return (a, q.t(), sa, sb), ref
    a = operand(m, k, layout[0] == "t", op.dtype)
    b = operand(k, n, layout[1] == "t", op.dtype)
    return (a, b), a.double() @ b.double()


def run_checked(op, key: str, m: int, n: int, k: int) -> None:
    args, ref = problem(op, key, m, n, k)
    assert m * n * k >= REPACK_MIN_VOLUME
    assert op.path(*args) == "repacked", key
    saved = [x.clone() for x in args]
    out = op._empty_out(args[0], args[1]).fill_(float("nan"))
    op(*args, out=out)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), f"{key} {m}x{n}x{k}: unwritten elements"
    err = ((out.double() - ref).norm() / ref.norm()).item()
    bound = BOUND[op.out_dtype] if op.dtype != torch.float32 else BOUND[torch.float32]
    assert err <= bound, f"{key} {m}x{n}x{k}: {err:.2e} > {bound}"
    for x, before in zip(args, saved):   # never a write to the user's tensors
        assert torch.equal(x.view(torch.uint8) if x.element_size() == 1 else x,
                           before.view(torch.uint8) if before.element_size() == 1 else before)
    assert torch.equal(op(*args), out), f"{key} {m}x{n}x{k}: differs between runs"


@pytest.mark.parametrize("key", list(PLANS))
def test_against_float64(ops, key):
    if key not in ops:
        pytest.skip("sm90 kernels need an sm90 GPU")
    # M, N and K odd: every operand's pitch is off the rule in every layout.
    for m, n, k in ((521, 1001, 259), (777, 1029, 511), (4001, 503, 301)):
        run_checked(ops[key], key, m, n, k)


def test_small_m_after_the_copy(ops):
    """M <= 16 with an odd K: W is copied, then the small-M kernel runs on the copy."""
    op = ops["sm80_fp16_tn"]
    run_checked(op, "sm80_fp16_tn", 8, 8191, 4099)


def test_small_problem_keeps_the_unaligned_kernel(ops):
    op = ops["sm80_fp16_tn"]
    (a, b), _ = problem(op, "sm80_fp16_tn", 100, 100, 99)
    assert op.path(a, b) == "unaligned"


def test_cuda_graph_capture_and_replay(ops):
    """The copy kernel, the workspace (stream-ordered allocation from the library's pool) and the GEMM are captured
    in one graph; replays on new data in the same tensors give the eager results."""
    key = "sm90_tn" if "sm90_tn" in ops else "sm80_tn"
    op = ops[key]
    (a, b), _ = problem(op, key, 1000, 1024, 1001)
    assert op.path(a, b) == "repacked"
    out = op._empty_out(a, b)
    op(a, b, out=out)   # build and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(a, b, out=out)
    for _ in range(2):
        a.copy_(torch.randn_like(a, dtype=torch.float32).to(a.dtype))
        b.copy_(torch.randn_like(b, dtype=torch.float32).to(b.dtype))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, op(a, b))
