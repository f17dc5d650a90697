"""Quantize-on-store on the GPU (sm90): a plan with out_dtype 'e4m3' or 'e5m2' returns (D, scales) (and with amax=True
the amax of D, which must equal the bf16 result's), which must equal
``generator.quantize(D_bf16, dtype, scale="block")`` bit for bit, D_bf16 being the same kernel's result with a bf16
D (same tile, cluster, schedule and epilogue); and, dequantized, D must be within fp8's precision of a float64
reference. Ragged M and N (partial 128-column blocks, N off the 16-byte rule: the direct stores), small M, K = 0,
each schedule's warpgroup shares, fused epilogues and fp8 inputs with block scales; the refusals."""
from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("quantized outputs are built for the sm90 family (an H100-class GPU)", allow_module_level=True)

from generator import Gemm, dequantize, quantize  # noqa: E402
from generator import epilogue as ep  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from generator.spec.types import DType  # noqa: E402

pytestmark = pytest.mark.gpu

#: key -> Gemm keywords (layout tn, arch 90); each is also built with out_dtype='bf16' and the same kernel shape.
PLANS = {
    "bf16_e4m3": dict(dtype="bf16", out_dtype="e4m3"),
    "bf16_e5m2": dict(dtype="bf16", out_dtype="e5m2"),
    "bf16_e4m3_silu_bias": dict(dtype="bf16", out_dtype="e4m3", activation="silu", bias="col"),
    "fp16_e4m3_gelu_tanh": dict(dtype="fp16", out_dtype="e4m3", activation="gelu_tanh"),
    "bf16_e4m3_pingpong_64x128": dict(dtype="bf16", out_dtype="e4m3", schedule="pingpong", tile_shape=(64, 128, 64)),
    "bf16_e4m3_split_n_64x256": dict(dtype="bf16", out_dtype="e4m3", schedule="cooperative",
                                     tile_shape=(64, 256, 64)),
    "bf16_e4m3_256x128": dict(dtype="bf16", out_dtype="e4m3", tile_shape=(256, 128, 64), cluster_shape=(1, 2)),
    "e4m3_block_e4m3": dict(dtype="e4m3", scale="block", out_dtype="e4m3"),
    # the fp8 MLP's gate (examples/fp8_mlp.py): an M x N operand read element by element beside a quantized D
    "e4m3_block_e4m3_silu_times_up": dict(dtype="e4m3", scale="block", out_dtype="e4m3", epilogue="silu_times_up"),
}
#: (M, N, K): whole blocks, a partial last block with N off the 16-byte rule, a few rows, K = 0.
SHAPES = [(1024, 1024, 1024), (1000, 4100, 264), (129, 520, 1104), (5, 384, 256), (300, 200, 0)]
FP8_EPS = {"e4m3": 2.0 ** -4, "e5m2": 2.0 ** -3}   # half an ulp at 1, relative


def silu_times_up(acc, up: ep.Matrix):
    return ep.silu(acc) * up


EPILOGUES = {"silu_times_up": silu_times_up}


def plan_kwargs(kw: dict) -> dict:
    return {**kw, "epilogue": EPILOGUES[kw["epilogue"]]} if "epilogue" in kw else kw


@pytest.fixture(scope="module")
def ops():
    quantized = [Gemm(layout="tn", arch=90, **plan_kwargs(kw)).config for kw in PLANS.values()]
    unquantized = [dataclasses.replace(cfg, out_dtype=DType.bf16) for cfg in quantized]   # the same kernel, bf16 D
    built = compile_many(quantized + unquantized, namespace="gemmgen_quantized_out_test")
    return {key: (built[i], built[len(PLANS) + i]) for i, key in enumerate(PLANS)}


def operands(key: str, m: int, n: int, k: int):
    """(the op's arguments, the float64 reference of D)."""
    kw = PLANS[key]
    x, w = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
    if kw["dtype"] == "e4m3":
        a, sa = quantize(x, "e4m3", scale="block")
        q, sw = quantize(w, "e4m3", scale="block", block=(128, 128))
        args = [a, q.t(), sa, sw]
        ref = dequantize(a, sa, scale="block").double() @ dequantize(q, sw, scale="block", block=(128, 128)).double().t()
    else:
        dtype = torch.bfloat16 if kw["dtype"] == "bf16" else torch.float16
        a, b = x.to(dtype), w.to(dtype).t()
        args = [a, b]
        ref = a.double() @ b.double()
    if "bias" in kw:
        bias = torch.randn(n, device="cuda").bfloat16()
        args.append(bias)
        ref = ref + bias.double()
    if kw.get("epilogue") == "silu_times_up":
        up = torch.randn(m, n, device="cuda").bfloat16()
        args.append(up)
        ref = torch.nn.functional.silu(ref) * up.double()
    activation = kw.get("activation")
    if activation == "silu":
        ref = torch.nn.functional.silu(ref)
    elif activation == "gelu_tanh":
        ref = torch.nn.functional.gelu(ref, approximate="tanh")
    return args, ref


def poison_allocator(nbytes: int) -> None:
    """Leaves a freed block of NaN bytes in the caching allocator, which the op's outputs are then likely carved
    from: an element the kernel does not write stays NaN (0xff: NaN in fp32 and in both fp8 formats)."""
    torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(0xFF)


@pytest.mark.parametrize("key", list(PLANS))
def test_equals_quantize_of_the_bf16_result_bit_for_bit(ops, key):
    op, op_bf16 = ops[key]
    fp8 = op.out_dtype
    for m, n, k in SHAPES:
        args, ref = operands(key, m, n, k)
        poison_allocator(4 * m * n + 4 * m * (n // 128 + 1))
        q, s = op(*args)
        assert q.dtype == fp8 and q.shape == (m, n) and s.dtype == torch.float32 and s.shape == (m, -(-n // 128))
        want_q, want_s = quantize(op_bf16(*args), PLANS[key]["out_dtype"], scale="block")
        where = f"{op.name} {m}x{n}x{k}"
        assert torch.equal(s, want_s), f"{where}: scales differ at {(s != want_s).nonzero()[:4].tolist()}"
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)), (
            f"{where}: values differ at {(q.view(torch.uint8) != want_q.view(torch.uint8)).nonzero()[:4].tolist()}")
        got = dequantize(q, s, scale="block").double()
        if ref.norm() == 0:   # K = 0 without a bias: zeros
            assert (got == 0).all(), where
        else:
            error = ((got - ref).norm() / ref.norm()).item()
            assert error < FP8_EPS[PLANS[key]["out_dtype"]], f"{where}: error {error:.2e} against float64"


#: Plans that also return the amax of D (amax=True), beside the same kernel without it and with a bf16 D.
AMAX_PLANS = {
    "bf16_e4m3_silu_bias": dict(dtype="bf16", out_dtype="e4m3", activation="silu", bias="col"),
    "bf16_e4m3_pingpong_64x128": dict(dtype="bf16", out_dtype="e4m3", schedule="pingpong", tile_shape=(64, 128, 64)),
}


@pytest.fixture(scope="module")
def amax_ops(ops):
    with_amax = [dataclasses.replace(ops[key][0].config, amax=True) for key in AMAX_PLANS]
    built = compile_many(with_amax, namespace="gemmgen_quantized_out_test")
    return {key: (built[i], *ops[key]) for i, key in enumerate(AMAX_PLANS)}


@pytest.mark.parametrize("key", list(AMAX_PLANS))
def test_the_amax_of_d_is_that_of_the_bf16_result(amax_ops, key):
    """amax=True: the third output is the largest |value| of the bf16 result, exactly (rows past M and columns past N
    left out: a bias makes the epilogue of the zero rows past M nonzero), twice in a row (it starts at zero each call);
    D and its scales are the kernel's without amax, bit for bit."""
    op, op_plain, op_bf16 = amax_ops[key]
    for m, n, k in SHAPES:
        args, _ = operands(key, m, n, k)
        for _ in range(2):
            q, s, amax = op(*args)
            assert amax.shape == () and amax.dtype == torch.float32
            want = op_bf16(*args).float().abs().amax() if m * n else torch.zeros((), device="cuda")
            assert amax.item() == want.item(), f"{op.name} {m}x{n}x{k}: amax {amax.item()} against {want.item()}"
        plain_q, plain_s = op_plain(*args)
        assert torch.equal(s, plain_s) and torch.equal(q.view(torch.uint8), plain_q.view(torch.uint8))
    big = torch.randn(4096, 1024, device="cuda").bfloat16()
    args, _ = operands(key, 4096, 1024, 1024)
    args[0] = big
    args[0][1234, 5] = 300.0                      # one large value: its row's products dominate
    q, s, amax = op(*args)
    assert amax.item() == op_bf16(*args).float().abs().amax().item()


@pytest.mark.parametrize("magnitude", [1e-10, 1e-3, 1e3])
def test_tiny_huge_and_all_zero_blocks(ops, magnitude):
    """Blocks whose scale is tiny (D about 1e-19: the division's reciprocal path rescales them), large, or zero (a
    block of zero columns: the smallest scale), still quantize() of the bf16 result bit for bit."""
    op, op_bf16 = ops["bf16_e4m3"]
    a = (torch.randn(300, 512, device="cuda") * magnitude).bfloat16()
    w = torch.randn(700, 512, device="cuda") * magnitude
    w[:128] = 0          # block 0 of every row: zeros
    w[300:301] = 0       # one zero column inside a block
    b = w.bfloat16().t()
    q, s = op(a, b)
    want_q, want_s = quantize(op_bf16(a, b), "e4m3", scale="block")
    assert torch.equal(s, want_s) and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)), magnitude
    assert (q[:, :128].float() == 0).all()


def padded(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values with its rows padded to 16 bytes (a view of a wider buffer): what the repacking copies make."""
    wide = torch.zeros(t.shape[0], -(-t.shape[1] // 8) * 8, dtype=t.dtype, device=t.device)
    view = wide[:, : t.shape[1]]
    view.copy_(t)
    return view


def test_refusals_leave_the_process_working(ops):
    op, op_bf16 = ops["bf16_e4m3"]
    a, b = torch.randn(64, 128, device="cuda").bfloat16(), torch.randn(256, 128, device="cuda").bfloat16().t()
    with pytest.raises(ValueError, match=r"batched call .* second output \(scales\)"):
        op(torch.randn(2, 64, 128, device="cuda").bfloat16(), b)
    with pytest.raises(ValueError, match=r"out= cannot receive"):
        op(a, b, out=torch.empty(64, 256, device="cuda", dtype=torch.float8_e4m3fn))
    with pytest.raises(RuntimeError, match=r"writes a quantized \(e4m3\) D and has no backward pass"):
        op(a.clone().requires_grad_(), b)
    with pytest.raises(ValueError, match=r"grouped calls do not quantize D"):
        op.grouped(a, b.t().contiguous().expand(2, 256, 128).transpose(1, 2), torch.tensor([32, 64], device="cuda",
                                                                                            dtype=torch.int32))
    # K = 127: A and B off the 16-byte rule, repacked (rows padded to 16 bytes) into the kernel that quantizes; the
    # bf16 reference is the same kernel on such padded copies (the bf16 op itself would take the unaligned kernel)
    x, w = torch.randn(64, 127, device="cuda").bfloat16(), torch.randn(256, 127, device="cuda").bfloat16()
    assert op.path(x, w.t()) == "repacked"
    for x_in, w_in, x_ref, w_ref in ((a, b.t(), a, b.t()), (x, w, padded(x), padded(w))):
        q, s = op(x_in, w_in.t())
        want_q, want_s = quantize(op_bf16(x_ref, w_ref.t()), "e4m3", scale="block")
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s)


def test_an_emitted_package_carries_the_quantized_ops(ops, tmp_path):
    """Two of PLANS emitted as a package (pip-installed, --no-build-isolation --no-deps): each op returns what the
    JIT op of the same plan returns, bit for bit, and refuses out= and grad as it does."""
    from generator import emit
    from toolchain import find_cuda_home, pip_install_and_import

    cuda_home = find_cuda_home()
    if cuda_home is None:
        pytest.skip("nvcc not found (set CUDA_HOME): cannot build the emitted package")
    keys = ["bf16_e4m3_silu_bias", "e4m3_block_e4m3"]
    package = "gemmgen_gpu_emitted_quantized"
    plans = [Gemm(layout="tn", arch=90, **PLANS[key]) for key in keys]
    pkg = emit(plans, name=package, out=tmp_path / package, op_names=keys)
    module, _ = pip_install_and_import(pkg, package, tmp_path, find_cuda_home())
    for key in keys:
        args, _ = operands(key, 1000, 4100, 264)
        q, s = getattr(module, key)(*args)
        want_q, want_s = ops[key][0](*args)
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s), key
        with pytest.raises(ValueError, match=r"second output \(scales\)"):
            getattr(module, key)(*args, out=torch.empty_like(q))
    a, b = operands("bf16_e4m3_silu_bias", 64, 256, 128)[0][:2]
    with pytest.raises(RuntimeError, match="require"):
        module.bf16_e4m3_silu_bias(a.clone().requires_grad_(), b, torch.zeros(256, device="cuda").bfloat16())
