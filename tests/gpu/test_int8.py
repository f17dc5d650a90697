"""int8 on the GPU (both families, on an sm90 GPU): int8 operands, int32 accumulation; D int32 (exact, compared for equality with a float64
reference, exact below 2^53) or a float type with rowwise scales and an epilogue; ragged sizes, NaN/poisoned
outputs, the unaligned kernel, bad inputs and gradients refused with the process left working."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("int8 kernels are sm90 (an H100-class GPU)", allow_module_level=True)

from gpu_cases import RAGGED  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

pytestmark = pytest.mark.gpu
PLANS = {
    "int32": dict(),
    "int32_pingpong_dcol": dict(schedule="pingpong", tile_shape=(128, 128, 128), layout_c="col"),
    "int32_c1x2": dict(tile_shape=(128, 128, 128), cluster_shape=(1, 2)),
    "row_bf16_silu": dict(scale="row", out_dtype="bf16", activation="silu"),
    "fp32": dict(out_dtype="fp32"),
    "int32_sm80": dict(family="sm80"),
    "int32_sm80_dcol_small": dict(family="sm80", tile_shape=(64, 64, 128), warps=(2, 2), layout_c="col"),
    "row_bf16_silu_sm80": dict(family="sm80", scale="row", out_dtype="bf16", activation="silu"),
}
# K = 143: rows of 143 bytes break TMA's 16-byte rule (the unaligned kernel, int32 multiply-adds).
SHAPES = [(1024, 1024, 1024), (RAGGED[4], RAGGED[5], RAGGED[6] + 16), (300, 520, 1104), (129, 4100, 272),
          (70, 90, 143), (64, 64, 8192)]
INT32_POISON = -(2**31)


@pytest.fixture(scope="module")
def ops():
    plans = {key: Gemm("int8", "tn", arch=90, **kw) for key, kw in PLANS.items()}
    built = compile_many([p.config for p in plans.values()], namespace="gemmgen_int8_test")
    return dict(zip(plans, built))


def operands(m: int, n: int, k: int):
    a = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8).t()
    return a, b, a.double() @ b.double()


@pytest.mark.parametrize("key", [k for k in PLANS if k.startswith("int32")])
def test_int32_is_exact(ops, key):
    op = ops[key]
    for m, n, k in SHAPES:
        a, b, ref = operands(m, n, k)
        out = op._empty_out(a, b).fill_(INT32_POISON)
        op(a, b, out=out)
        assert out.dtype == torch.int32
        assert torch.equal(out.double(), ref), f"{op.name} {m}x{n}x{k}: {(out.double() - ref).abs().max().item()}"


@pytest.mark.parametrize("key", ["row_bf16_silu", "row_bf16_silu_sm80"])
def test_rowwise_scales_and_epilogue(ops, key):
    op = ops[key]
    for m, n, k in SHAPES:
        a, b, acc = operands(m, n, k)
        sa, sb = torch.rand(m, device="cuda") / 64, torch.rand(n, device="cuda") / 64
        ref = torch.nn.functional.silu(acc * sa.double()[:, None] * sb.double()[None, :])
        out = op._empty_out(a, b).fill_(float("nan"))
        op(a, b, sa, sb, out=out)
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert torch.isfinite(out).all() and err <= 1e-2, f"{op.name} {m}x{n}x{k}: {err:.2e}"


def test_float_output_matches_to_its_rounding(ops):
    op = ops["fp32"]
    a, b, ref = operands(300, 520, 1104)
    assert torch.equal(op(a, b).double(), ref.float().double())   # |sums| < 2^24: exact in fp32


def test_bad_inputs_raise_and_keep_the_process_working(ops):
    op = ops["int32"]
    a, b, ref = operands(128, 128, 256)
    with pytest.raises(TypeError, match="int8"):
        op(a.float(), b)
    with pytest.raises(ValueError, match="column-major"):
        op(a, b.contiguous())
    scale = torch.ones(128, device="cuda")
    with pytest.raises(RuntimeError, match="no backward"):
        ops["row_bf16_silu"](a, b, scale.clone().requires_grad_(), scale)
    assert torch.equal(op(a, b).double(), ref)


@pytest.mark.parametrize("key", ["int32", "int32_sm80"])
def test_opcheck_and_compile_fullgraph(ops, key):
    """The real kernels through torch.library.opcheck (default and .out) and torch.compile(fullgraph=True) with
    a dynamic M: equal to the eager op."""
    op = ops[key]
    for m, n, k in ((256, 384, 512), (130, 200, 272)):
        a, b, _ = operands(m, n, k)
        assert set(torch.library.opcheck(op.op.default, (a, b)).values()) == {"SUCCESS"}
        result = torch.library.opcheck(op.op.out, (a, b), {"out": op._empty_out(a, b)})
        assert set(result.values()) == {"SUCCESS"}, result
    compiled = torch.compile(lambda a, b: op.op.default(a, b) * 2, fullgraph=True, dynamic=True)
    for m in (128, 96, 200):
        a, b, _ = operands(m, 256, 384)
        assert torch.equal(compiled(a, b), op(a, b) * 2)
