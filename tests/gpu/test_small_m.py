"""The small-M kernel (templates/common/gemm_small_m.cuh) on the GPU: calls with at most 16 rows of a K-major A and
a K-major (tn) or N-major (tt) B, both families' libraries, against a float64 reference with NaN-poisoned outputs;
ragged N and K, a K that ends inside a 16-byte chunk with NaN in the padding past it (nothing past K may reach the
sums), an N-major B with NaN past N in each row and in the rows past K, D column-major and fp32, a fused epilogue;
bit-identical results across runs (warps' partial sums added in a fixed order); and the path each call takes
(op.path), agreeing with spec.config.has_small_m_kernel."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from gpu_cases import BOUND  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from generator.spec.config import SMALL_M_MAX_ROWS, has_small_m_kernel, takes_small_m  # noqa: E402

pytestmark = pytest.mark.gpu
IS_SM90 = torch.cuda.get_device_capability() >= (9, 0)
TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

PLANS = {
    "sm90_bf16": dict(dtype="bf16", layout="tn", family="sm90"),
    "sm90_fp16_dcol_fp32": dict(dtype="fp16", layout="tn", layout_c="col", out_dtype="fp32", family="sm90"),
    "sm90_bias_gelu": dict(dtype="bf16", layout="tn", activation="gelu", bias="col", alpha=0.5, family="sm90"),
    "sm80_fp16": dict(dtype="fp16", layout="tn", family="sm80"),
    "sm80_bf16_dcol": dict(dtype="bf16", layout="tn", layout_c="col", family="sm80"),
    # B N-major (dX = dY @ W; a weight kept (in, out))
    "sm90_bf16_tt": dict(dtype="bf16", layout="tt", family="sm90"),
    "sm90_fp16_tt_dcol_fp32": dict(dtype="fp16", layout="tt", layout_c="col", out_dtype="fp32", family="sm90"),
    "sm80_bf16_tt_bias_gelu": dict(dtype="bf16", layout="tt", activation="gelu", bias="col", alpha=0.5,
                                   family="sm80"),
    # Configs without the kernel: every call takes the fast path.
    "sm90_bf16_nn": dict(dtype="bf16", layout="nn", family="sm90"),
    "sm80_fp16_nt": dict(dtype="fp16", layout="nt", family="sm80"),
}
SMALL = [k for k in PLANS if not k.endswith(("_nn", "_nt"))]
#: M up to 16 (one and two n8 halves), N and K ragged against the 16 rows and 128-wide k steps of a block; K long
#: enough that each warp takes many steps, ending inside one.
SHAPES = [(1, 4096, 4096), (2, 1000, 2048), (7, 17, 100), (8, 16, 128), (9, 129, 1000), (15, 4097, 520),
          (16, 3000, 4104), (1, 1, 8), (16, 64, 8), (3, 200, 14344), (12, 48, 9000), (11, 2056, 2600)]


@pytest.fixture(scope="module")
def ops():
    plans = {key: Gemm(**kw) for key, kw in PLANS.items() if IS_SM90 or kw["family"] == "sm80"}
    built = compile_many([p.config for p in plans.values()], namespace="gemmgen_small_m_test")
    return dict(zip(plans, built))


def operands(op, m: int, n: int, k: int, pad: int = 0):
    """x (m, k) of the op's dtype, its rows `pad` elements longer than k and the padding NaN; and B (k x n) in the op's
    layout: K-major as W.t() (W: n x k, padded as x), or N-major with its rows padded with NaN to a multiple of 8
    elements and 8 rows of NaN after its last."""
    dtype = op.dtype
    x = torch.full((m, k + pad), float("nan"), device="cuda", dtype=dtype)
    x[:, :k] = torch.randn(m, k, device="cuda").to(dtype)
    if op.config.layout.b_k_major:
        w = torch.full((n, k + pad), float("nan"), device="cuda", dtype=dtype)
        w[:, :k] = torch.randn(n, k, device="cuda").to(dtype)
        return x[:, :k], w[:, :k].t()
    b = torch.full((k + 8, n + (-n) % 8), float("nan"), device="cuda", dtype=dtype)
    b[:k, :n] = torch.randn(k, n, device="cuda").to(dtype)
    return x[:, :k], b[:k, :n]


def reference(op, key: str, a, b):
    ref = a.double() @ b.double()
    if "bias_gelu" in key:
        return ref, lambda bias: torch.nn.functional.gelu(0.5 * ref + bias.double())
    return ref, None


def check(op, key: str, m: int, n: int, k: int, pad: int | None = None) -> None:
    """pad: elements of NaN past K in each row; by default the fewest that keep rows 16-byte aligned."""
    a, b = operands(op, m, n, k, (-k) % 8 if pad is None else pad)
    ref, with_epilogue = reference(op, key, a, b)
    extra = {}
    if with_epilogue is not None:
        bias = torch.randn(n, device="cuda", dtype=op.dtype)
        extra, ref = {"bias": bias}, with_epilogue(bias)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert op.path(a, b, **extra) == ("small_m" if takes_small_m(op.config, m, n, k, sms) else "fast")
    out = op._empty_out(a, b).fill_(float("nan"))
    op(a, b, out=out, **extra)
    assert torch.isfinite(out).all(), f"{key} {m}x{n}x{k}: unwritten elements or NaN from past K"
    scale = ref.norm() if ref.norm() > 0 else 1.0
    err = ((out.double() - ref).norm() / scale).item()
    assert err <= BOUND[op.dtype], f"{key} {m}x{n}x{k}: {err:.2e} > {BOUND[op.dtype]}"
    for _ in range(2):   # the warps' partial sums are added in warp order: the same bits every run
        assert torch.equal(op(a, b, **extra), out), f"{key} {m}x{n}x{k}: differs between runs"


@pytest.mark.parametrize("key", SMALL)
def test_against_float64_and_repeatable(ops, key):
    if key not in ops:
        pytest.skip("sm90 kernels need an sm90 GPU")
    for m, n, k in SHAPES:
        check(ops[key], key, m, n, k)


@pytest.mark.parametrize("key", ["sm90_bf16", "sm80_fp16", "sm90_bf16_tt"])
def test_k_ends_inside_a_chunk(ops, key):
    """K = 8j + r with rows padded to a multiple of 8 (16-byte aligned, so not the unaligned kernel): the last chunk
    is read element by element and the NaN past K stays out."""
    if key not in ops:
        pytest.skip("sm90 kernels need an sm90 GPU")
    for m, n, k in ((2, 300, 1001), (16, 33, 13), (5, 4096, 4095)):   # (one row of A: its ld is K, unaligned)
        check(ops[key], key, m, n, k, pad=(-k) % 8 + 8)


def test_k_zero(ops):
    """K = 0 with rows 16-byte apart (slices of wider tensors, so the small-M kernel takes them): D = 0."""
    op = ops["sm80_fp16"]
    a = torch.randn(3, 8, device="cuda").half()[:, :0]
    b = torch.randn(90, 8, device="cuda").half()[:, :0].t()
    assert op.path(a, b) == "small_m"
    out = op._empty_out(a, b).fill_(float("nan"))
    op(a, b, out=out)
    assert (out == 0).all()


def test_paths(ops):
    """op.path: small_m up to 16 rows where the config has the kernel (has_small_m_kernel), fast above and for
    configs without it (and an N-major B past its bounds, takes_small_m), unaligned for an operand off the 16-byte
    rule."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for key, op in ops.items():
        bias = {"bias": torch.randn(256, device="cuda", dtype=op.dtype)} if "bias" in key else {}
        for m, k in ((SMALL_M_MAX_ROWS, 512), (SMALL_M_MAX_ROWS, 4096), (8, 512)):
            a, b = operands(op, m, 256, k)
            if PLANS[key]["layout"][0] == "n":   # A column-major
                a = a.t().contiguous().t()
            if PLANS[key]["layout"][1] == "t":   # B row-major
                b = b.contiguous()
            expected = "small_m" if takes_small_m(op.config, m, 256, k, sms) else "fast"
            assert op.path(a, b, **bias) == expected, (key, m, k)
        assert has_small_m_kernel(op.config) == takes_small_m(op.config, 8, 256, 512, sms), key
        a17, b17 = operands(op, SMALL_M_MAX_ROWS + 1, 256, 512)
        if PLANS[key]["layout"] == "tt" and has_small_m_kernel(op.config):   # a strip of 32 columns per SM at most
            for n, expected in ((32 * sms, "small_m"), (32 * sms + 8, "fast")):
                wide = {"bias": torch.randn(n, device="cuda", dtype=op.dtype)} if bias else {}
                assert op.path(*operands(op, 4, n, 64), **wide) == expected, (key, n)
        if PLANS[key]["layout"] in ("tn", "tt"):
            assert op.path(a17, b17, **bias) == "fast", key
            odd_a, odd_b = operands(op, 4, 256, 511)   # rows of 511 elements: not 16-byte aligned
            assert op.path(odd_a, odd_b, **bias) == "unaligned", key
    assert not has_small_m_kernel(Gemm("e4m3", "tn", scale="tensor", arch=90).config)
    assert not has_small_m_kernel(Gemm("tf32", "tn", arch=90).config)
    assert not has_small_m_kernel(Gemm("int8", "tn", out_dtype="int32", arch=90).config)
