"""An emitted package with the types beyond 16-bit on the GPU (sm90): fp8 with per-block scales (promoted, two column
slices), a mixed e5m2 x e4m3 rowwise op, int8 -> int32, and tf32 in layout nt (both tiles transposed in shared
memory); pip-installed (--no-build-isolation --no-deps) and imported, each op checked against the float64 product
of the same quantized operands and scales, bit-equal to the JIT op of the same plan, NaN-poisoned out= written, the
same refusal of a bad scale as the JIT op, gradients refused (fp8 and int8 ops are forward only) or, for tf32,
computed by the package's own formula; the fp8 op's grouped calls with per-block scales (offsets and masked forms)
against float64 and the JIT op.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("fp8 kernels are sm90 (an H100-class GPU)", allow_module_level=True)

from generator import Gemm, dequantize, emit, quantize  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from toolchain import find_cuda_home, pip_install_and_import  # noqa: E402

pytestmark = pytest.mark.gpu

PACKAGE = "gemmgen_gpu_emitted_dtypes"
PLANS = {
    "fp8_block": dict(dtype="e4m3", scale="block", tile_shape=(128, 256, 128)),
    "fp8_mixed_row": dict(dtype="e5m2", dtype_b="e4m3", scale="row"),
    "int8": dict(dtype="int8", out_dtype="int32"),
    "tf32_nt": dict(dtype="fp32", layout="nt"),
}
SHAPES = [(256, 384, 512), (130, 200, 272), (1000, 1500, 1104)]
#: ||D - ref|| / ||ref||: bf16 output rounding (fp8 ops); int8 -> int32 is exact.
BOUND = {"fp8_block": 1e-2, "fp8_mixed_row": 1e-2, "int8": 0.0, "tf32_nt": 2e-3}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    cuda_home = find_cuda_home()
    if cuda_home is None:
        pytest.skip("nvcc not found (set CUDA_HOME): cannot build the emitted package")
    root = tmp_path_factory.mktemp("emitted_dtypes")
    plans = {op: Gemm(arch=90, **{"layout": "tn", **kw}) for op, kw in PLANS.items()}
    pkg = emit(list(plans.values()), name=PACKAGE, out=root / PACKAGE, op_names=list(plans))
    module, _ = pip_install_and_import(pkg, PACKAGE, root, cuda_home)
    jit = dict(zip(plans, compile_many([p.config for p in plans.values()], namespace="gemmgen_emitted_dtypes_jit")))
    return {"module": module, "plans": plans, "jit": jit}


def operands(op: str, m: int, n: int, k: int):
    """The op's arguments and the float64 product they stand for."""
    if op == "tf32_nt":   # A column-major, B row-major
        a, b = torch.randn(k, m, device="cuda").t(), torch.randn(k, n, device="cuda")
        return (a, b), a.double() @ b.double()
    if op == "int8":
        a = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
        w = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8)
        return (a, w.t()), a.double() @ w.double().t()
    scale = PLANS[op]["scale"]
    dtype_a, dtype_b = PLANS[op]["dtype"], PLANS[op].get("dtype_b", PLANS[op]["dtype"])
    block_a, block_w = ((1, 128), (128, 128)) if scale == "block" else (None, None)
    a, sa = quantize(torch.randn(m, k, device="cuda"), dtype_a, scale=scale)
    w, sw = quantize(torch.randn(n, k, device="cuda"), dtype_b, scale=scale, block=block_w)
    ref = dequantize(a, sa, scale=scale, block=block_a).double() @ dequantize(w, sw, scale=scale,
                                                                              block=block_w).double().t()
    return (a, w.t(), sa, sw), ref


@pytest.mark.parametrize("op", PLANS)
def test_numerics_and_the_jit_op(installed, op):
    fn, jit = getattr(installed["module"], op), installed["jit"][op]
    for m, n, k in SHAPES:
        args, ref = operands(op, m, n, k)
        out = jit._empty_out(args[0], args[1])
        out.fill_(float("nan") if out.is_floating_point() else -1)
        assert fn(*args, out=out) is out
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err <= BOUND[op], f"{op} {m}x{n}x{k}: {err:.2e} > {BOUND[op]}"
        assert torch.equal(out, jit(*args)), f"{op} {m}x{n}x{k}: differs from the JIT op"


def test_bad_scale_and_gradients_are_refused_as_by_the_jit_op(installed):
    fn, jit = installed["module"].fp8_block, installed["jit"]["fp8_block"]
    (a, b, sa, sb), _ = operands("fp8_block", 256, 256, 384)
    messages = []
    for f in (fn, jit):
        with pytest.raises(ValueError, match="scale_a") as info:
            f(a, b, sa[:, :2], sb)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert installed["module"].PLANS["fp8_block"]["differentiable"] is False
    with pytest.raises(RuntimeError, match="no backward"):
        fn(a, b, sa.requires_grad_(), sb)
    assert torch.isfinite(fn(a, b, sa.detach(), sb)).all()


def test_tf32_gradients_of_the_package_formula(installed):
    fn = installed["module"].tf32_nt
    (a, b), _ = operands("tf32_nt", 300, 200, 100)
    a.requires_grad_()
    b.requires_grad_()
    a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
    g = torch.randn(300, 200, device="cuda")
    fn(a, b).backward(g)
    (a64 @ b64).backward(g.double())
    for got, want in ((a.grad, a64.grad), (b.grad, b64.grad)):
        assert ((got.double() - want).norm() / want.norm()).item() <= BOUND["tf32_nt"]


def scaled_groups(sizes: list[int], n: int, k: int):
    """A grouped call's (A, B, offsets, scale_a, scale_b) of e4m3 rows and experts' weights with DeepSeek's block
    scales, and the float64 product of the dequantized operands, per group."""
    x, w = torch.randn(sum(sizes), k, device="cuda"), torch.randn(len(sizes), n, k, device="cuda")
    a, scale_a = quantize(x, "e4m3", scale="block")
    q, scale_b = quantize(w, "e4m3", scale="block", block=(128, 128))
    offsets = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    ref_a = dequantize(a, scale_a, scale="block").double()
    ref_w = dequantize(q, scale_b, scale="block", block=(128, 128)).double()
    ref = torch.cat([rows @ ref_w[g].t() for g, rows in enumerate(torch.split(ref_a, sizes))])
    return (a, q.transpose(1, 2), offsets, scale_a, scale_b), ref


def test_scaled_grouped_calls_match_the_jit_op(installed):
    """The fp8 op's .grouped and .masked with per-block scales (.grouped_scaled, .masked_scaled): every row written
    (a NaN-filled block handed back to the allocator first), within bf16 rounding of the float64 product per group,
    bit-equal to the JIT op's; a bad scale and a gradient refused in the JIT op's words."""
    fn, jit = installed["module"].fp8_block, installed["jit"]["fp8_block"]
    sizes, n, k = [0, 37, 300, 1, 130, 0], 384, 640
    args, ref = scaled_groups(sizes, n, k)
    torch.full((sum(sizes), n), float("nan"), dtype=torch.bfloat16, device="cuda")
    d = fn.grouped(*args)
    assert torch.isfinite(d).all(), "unwritten rows"
    err = ((d.double() - ref).norm() / ref.norm()).item()
    assert err <= BOUND["fp8_block"], err
    assert torch.equal(d, jit.grouped(*args)) and torch.equal(d, torch.ops.gemmgen_gpu_emitted_dtypes.fp8_block
                                                              .grouped_scaled(*args))
    # the masked form: the same rows in slabs of max_m, the slabs' scales as A's
    a, b, _, scale_a, scale_b = args
    slab = 320
    counts = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    a_slabs = torch.zeros(len(sizes), slab, k, device="cuda").to(a.dtype)
    sa_slabs = torch.ones(len(sizes), slab, scale_a.shape[1], device="cuda")
    for g, rows in enumerate(torch.split(torch.arange(sum(sizes), device="cuda"), sizes)):
        a_slabs[g, :len(rows)], sa_slabs[g, :len(rows)] = a[rows], scale_a[rows]
    masked = fn.masked(a_slabs, b, counts, sa_slabs, scale_b)
    valid = torch.cat([masked[g, :count] for g, count in enumerate(sizes)])
    assert torch.equal(valid, d), "the masked form differs from the offsets form"
    jit_masked = jit.masked(a_slabs, b, counts, sa_slabs, scale_b)
    assert torch.equal(torch.cat([jit_masked[g, :count] for g, count in enumerate(sizes)]), valid)
    # refusals, in the JIT op's words
    errors = []
    for f in (fn, jit):
        with pytest.raises(ValueError, match="scale_b") as info:
            f.grouped(a, b, args[2], scale_a, scale_b[:, :1])
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    errors = []
    for f in (fn, jit):
        with pytest.raises(RuntimeError, match="no backward pass") as info:
            f.grouped(a.float().requires_grad_().to(a.dtype), b, args[2], scale_a, scale_b)
        errors.append(str(info.value))
    assert errors[0] == errors[1].replace(jit.name, "fp8_block"), errors
    with torch.no_grad():
        assert torch.equal(fn.grouped(a.float().requires_grad_().to(a.dtype), b, args[2], scale_a, scale_b), d)
