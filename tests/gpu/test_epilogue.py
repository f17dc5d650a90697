"""Fused epilogues on the GPU, both kernel families: every activation and operand kind against a float64
reference of the whole expression (generator.runtime.evaluate on the float64 accumulator), ragged sizes,
every layout of A, B, C and D, output dtypes, NaN-poisoned outputs, the second output, K = 0, the in-place
``D += A @ B``, bad operands (each refused, the next call right), repeatability, and autograd.

All kernels are built in one parallel ninja run (module fixture)."""
from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

from gpu_cases import BOUND, RAGGED  # noqa: E402
from generator import Gemm  # noqa: E402
from generator import epilogue as ep  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from generator.runtime.evaluate import evaluate, operand_values  # noqa: E402

pytestmark = pytest.mark.gpu
IS_SM90 = torch.cuda.get_device_capability() >= (9, 0)
ACTIVATIONS = ("relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")
TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def fused(acc, bias: ep.Col, C: ep.Matrix, alpha: ep.Scalar, beta: ep.Scalar):
    return ep.silu(alpha * acc + bias) + beta * C


COL_MAJOR_FP32 = ep.Matrix(dtype="fp32", order="col")


def rowwise(acc, scale: ep.Row, R: COL_MAJOR_FP32):
    z = scale * acc
    return ep.clamp(ep.tanh(z) + R, -0.75, 0.75) / 2.0 + ep.max(ep.abs(z), R) - ep.min(z, 0.5), z


def with_aux(acc, bias: ep.Col):
    h = acc + bias
    return ep.gelu(h), h


def residual(acc, C: ep.Matrix):
    return acc + C


# (id, Gemm kwargs): the families' kernels under test. sm90 ones are skipped on an older GPU.
PLANS: dict[str, dict] = {}
for family in ("sm90", "sm80"):
    arch = {"family": family}
    for act in ACTIVATIONS:
        PLANS[f"{family}_{act}"] = dict(dtype="bf16", layout="tn", activation=act, bias="col", **arch)
    PLANS[f"{family}_fused_nt"] = dict(dtype="fp16", layout="nt", epilogue=fused, **arch)
    PLANS[f"{family}_rowwise_nn_fp32"] = dict(dtype="bf16", layout="nn", out_dtype="fp32", epilogue=rowwise, **arch)
    PLANS[f"{family}_aux_dcol"] = dict(dtype="bf16", layout="tt", layout_c="col", epilogue=with_aux, **arch)
    PLANS[f"{family}_residual"] = dict(dtype="bf16", layout="tn", epilogue=residual, **arch)
    PLANS[f"{family}_row_bias_fp16out"] = dict(dtype="bf16", layout="tn", out_dtype="fp16", bias="row",
                                               activation="relu", **arch)
PLANS["sm90_fused_pingpong"] = dict(dtype="bf16", layout="tn", epilogue=fused, family="sm90", schedule="pingpong",
                                    tile_shape=(128, 128, 64))
# Split along N: each consumer warpgroup's epilogue covers its half of the columns.
PLANS["sm90_fused_64x128_split_n"] = dict(dtype="bf16", layout="tn", epilogue=fused, family="sm90",
                                          schedule="cooperative", tile_shape=(64, 128, 64))
PLANS["sm90_fused_128x144_odd_n"] = dict(dtype="bf16", layout="tn", epilogue=fused, family="sm90",
                                         schedule="cooperative", tile_shape=(128, 144, 64))
PLANS["sm90_fused_256x128_c1x2"] = dict(dtype="bf16", layout="tn", epilogue=fused, family="sm90",
                                        tile_shape=(256, 128, 64), cluster_shape=(1, 2))
# The source (C) by TMA through the staging buffers: 16-bit and fp32 D, one subtile per tile (128x64: the
# buffers alternate between tiles), pingpong.
PLANS["sm90_alpha_beta"] = dict(dtype="bf16", layout="tn", alpha=2.0, beta=0.5, family="sm90")
PLANS["sm90_alpha_beta_fp32"] = dict(dtype="bf16", layout="tn", alpha=2.0, beta=0.5, out_dtype="fp32", family="sm90")
PLANS["sm90_alpha_beta_128x64"] = dict(dtype="fp16", layout="nt", alpha=2.0, beta=0.5, family="sm90",
                                       schedule="cooperative", tile_shape=(128, 64, 64))
PLANS["sm90_alpha_beta_pingpong"] = dict(dtype="bf16", layout="tn", alpha=-1.0, beta=1.5, family="sm90",
                                         schedule="pingpong", tile_shape=(128, 128, 64))
PLANS["sm90_alpha_beta_odd_n"] = dict(dtype="fp16", layout="nn", alpha=2.0, beta=0.5, family="sm90",
                                      schedule="pingpong", tile_shape=(64, 112, 64))
PLANS["sm90_alpha_beta_split_n"] = dict(dtype="bf16", layout="nt", alpha=2.0, beta=0.5, out_dtype="fp32",
                                        family="sm90", schedule="cooperative", tile_shape=(64, 256, 64))
# sm80 reads the source in pairs of neighbouring columns.
PLANS["sm80_alpha_beta"] = dict(dtype="bf16", layout="tn", alpha=2.0, beta=0.5, family="sm80")
PLANS["sm80_alpha_beta_fp32"] = dict(dtype="bf16", layout="tn", alpha=2.0, beta=0.5, out_dtype="fp32", family="sm80")
SOURCED = [k for k in PLANS if "_alpha_beta" in k] + ["sm90_fused_pingpong", "sm90_residual", "sm80_residual"]


def wanted(key: str) -> bool:
    return IS_SM90 or not key.startswith("sm90")


@pytest.fixture(scope="module")
def ops():
    arch = torch.cuda.get_device_capability()
    plans = {key: Gemm(arch=arch[0] * 10 + arch[1], **kw) for key, kw in PLANS.items() if wanted(key)}
    unique = {p.name: p.config for p in plans.values()}
    built = dict(zip(unique, compile_many(list(unique.values()), namespace="gemmgen_ep_test")))
    return {key: built[p.name] for key, p in plans.items()}


def operand(t: torch.dtype, shape: tuple[int, ...], order: str = "row") -> torch.Tensor:
    if order == "col" and len(shape) == 2:
        return torch.randn(shape[::-1], device="cuda").to(t).t()
    return torch.randn(shape, device="cuda").to(t)


def inputs(op, m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, list]:
    cfg = op.config
    dt = TORCH[cfg.dtype.value]
    a = operand(dt, (m, k), cfg.layout.a.value)
    b = operand(dt, (k, n), cfg.layout.b.value)
    values = []
    for o in cfg.epilogue.operands:
        if o.kind == "scalar":
            values.append(float(torch.empty(()).uniform_(0.5, 2.0)))
        elif o.kind in ("row", "col"):
            values.append(operand(TORCH[o.dtype.value], (m if o.kind == "row" else n,)))
        else:
            values.append(operand(TORCH[o.dtype.value], (m, n), o.order.value))
    return a, b, values


def reference(op, a, b, values):
    ep_ = op.config.epilogue
    acc = a.double() @ b.double()
    return evaluate(ep_, acc, operand_values(ep_, values, torch.float64))


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(op, m, n, k, poisoned_out: bool = True) -> None:
    a, b, values = inputs(op, m, n, k)
    bound = BOUND[TORCH[op.config.dtype.value]]
    d_ref, aux_ref = reference(op, a, b, values)
    if op.config.epilogue.aux is None and poisoned_out:
        out = op._empty_out(a, b).fill_(float("nan"))
        got = op(a, b, *values, out=out)
        assert got is out
        results = [(out, d_ref)]
    else:
        got = op(a, b, *values)
        results = list(zip(got, (d_ref, aux_ref))) if aux_ref is not None else [(got, d_ref)]
    for t, ref in results:
        assert t.dtype == TORCH[op.config.out_dtype.value]
        assert torch.isfinite(t).all(), f"{op.name} {m}x{n}x{k}: unwritten or non-finite elements"
        err = rel(t, ref)
        assert err <= bound, f"{op.name} {m}x{n}x{k}: rel err {err:.2e} > {bound}"


SHAPES = [(1000, 1000, 1000), (RAGGED[4], RAGGED[5], RAGGED[6]), (RAGGED[1], RAGGED[3], RAGGED[2]),
          (RAGGED[7], RAGGED[0], RAGGED[8]), (257, 4097, 129)]


@pytest.mark.parametrize("key", [k for k in PLANS], ids=list(PLANS))
def test_epilogue_against_float64(ops, key):
    if key not in ops:
        pytest.skip("sm90 family needs an sm_90 GPU")
    for m, n, k in SHAPES:
        check(ops[key], m, n, k)


# Split-K (stream-K with fewer tiles than SMs, every tile's k tiles cut into parts): each part adds up its share of the
# tile's columns and applies the epilogue there, D stored directly; a long K so that the launch cuts.
SPLIT_K_PLANS = {
    "pingpong_fused": dict(dtype="bf16", layout="tn", epilogue=fused, schedule="pingpong", tile_shape=(64, 128, 64)),
    "aux_dcol": dict(dtype="bf16", layout="tt", layout_c="col", epilogue=with_aux, schedule="cooperative",
                     tile_shape=(128, 64, 64)),
    "alpha_beta_fp32": dict(dtype="fp16", layout="nt", alpha=2.0, beta=0.5, out_dtype="fp32",
                            schedule="cooperative", tile_shape=(128, 128, 64)),
    "split_n_row_bias": dict(dtype="bf16", layout="tn", bias="row", activation="gelu_tanh", schedule="cooperative",
                             tile_shape=(64, 256, 64)),
}
SPLIT_K_SHAPES = [(64, 1000, 8192), (17, 520, 4104), (130, 1000, 3000)]


@pytest.fixture(scope="module")
def split_k_ops():
    if not IS_SM90:
        pytest.skip("split-K is built for the sm90 family (an H100-class GPU)")
    configs = {key: replace(Gemm(family="sm90", arch=90, cluster_shape=(1, 1), **kw).config, stream_k=True)
               for key, kw in SPLIT_K_PLANS.items()}
    return dict(zip(configs, compile_many(list(configs.values()), namespace="gemmgen_ep_split_k_test")))


@pytest.mark.parametrize("key", list(SPLIT_K_PLANS))
def test_split_k_epilogue_against_float64(split_k_ops, key):
    op = split_k_ops[key]
    for m, n, k in SPLIT_K_SHAPES:
        check(op, m, n, k)
        a, b, values = inputs(op, m, n, k)
        first, again = outputs(op(a, b, *values)), outputs(op(a, b, *values))
        assert all(map(torch.equal, first, again)), f"{op.name} {m}x{n}x{k}: differs between runs"


def outputs(got) -> tuple:
    return got if isinstance(got, tuple) else (got,)


@pytest.mark.parametrize("family", ["sm90", "sm80"])
def test_k_zero_is_the_epilogue_of_zero(ops, family):
    if f"{family}_fused_nt" not in ops:
        pytest.skip("sm90 family needs an sm_90 GPU")
    op = ops[f"{family}_fused_nt"]
    check(op, 130, 70, 0)


@pytest.mark.parametrize("family", ["sm90", "sm80"])
def test_in_place_d_plus_equals_a_b(ops, family):
    if f"{family}_residual" not in ops:
        pytest.skip("sm90 family needs an sm_90 GPU")
    op = ops[f"{family}_residual"]
    for m, n, k in ((2048, 2048, 512), (1000, 1003, 77)):
        a, b, (c,) = inputs(op, m, n, k)
        ref = a.double() @ b.double() + c.double()
        got = op(a, b, c, out=c)
        assert got is c and rel(c, ref) <= BOUND[torch.bfloat16]


@pytest.mark.parametrize("key", SOURCED)
def test_source_by_tma_over_many_tiles_per_block(ops, key):
    # Several tiles per persistent block, so that the source barriers' phases and the staging buffers
    # carry over from tile to tile.
    if key not in ops:
        pytest.skip("sm90 family needs an sm_90 GPU")
    for m, n, k in ((2048, 4096, 128), (4096, 4096, 64), (1999, 4104, 72)):
        check(ops[key], m, n, k)


@pytest.mark.parametrize("family", ["sm90", "sm80"])
@pytest.mark.parametrize("misalign", ["pitch", "base"])
def test_source_off_the_fast_path_is_read_element_by_element(ops, family, misalign):
    # A row pitch or base address off the 16-byte rule (sm90's TMA) or the pair alignment (sm80): the same
    # kernel reads C element by element.
    if f"{family}_alpha_beta" not in ops:
        pytest.skip("sm90 family needs an sm_90 GPU")
    op = ops[f"{family}_alpha_beta"]
    m, n, k = 1030, 2052, 200
    a, b, values = inputs(op, m, n, k)
    wide = torch.randn(m, n + 1, device="cuda").to(values[0].dtype)
    values[0] = wide[:, :n] if misalign == "pitch" else wide.flatten()[1:1 + m * n].view(m, n)
    ref, _ = reference(op, a, b, values)
    out = op._empty_out(a, b).fill_(float("nan"))
    op(a, b, *values, out=out)
    assert rel(out, ref) <= BOUND[torch.bfloat16]


def test_repeated_runs_are_bit_identical(ops):
    for key in ("sm90_fused_nt", "sm80_fused_nt", "sm90_aux_dcol", "sm90_alpha_beta", "sm90_alpha_beta_128x64",
                "sm80_alpha_beta"):
        if key not in ops:
            continue
        op = ops[key]
        a, b, values = inputs(op, 2000, 1500, 700)
        first = op(a, b, *values)
        for _ in range(5):
            again = op(a, b, *values)
            pairs = zip(first, again) if isinstance(first, tuple) else [(first, again)]
            assert all(torch.equal(x, y) for x, y in pairs), f"{op.name}: results move between runs (a race?)"


BAD = {
    "bias too short": lambda a, b, v: (v[0][:-1], *v[1:]),
    "bias wrong dtype": lambda a, b, v: (v[0].float(), *v[1:]),
    "bias on the CPU": lambda a, b, v: (v[0].cpu(), *v[1:]),
    "bias strided": lambda a, b, v: (torch.randn(2 * v[0].shape[0], device="cuda").to(v[0].dtype)[::2], *v[1:]),
    "C wrong shape": lambda a, b, v: (v[0], v[1][:-1], *v[2:]),
    "C column-major": lambda a, b, v: (v[0], v[1].t().contiguous().t(), *v[2:]),
    "alpha a tensor": lambda a, b, v: (v[0], v[1], torch.tensor(1.0), v[3]),
    "missing beta": lambda a, b, v: tuple(v[:3]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_operands_are_refused_and_the_next_call_is_right(ops, case):
    op = ops["sm90_fused_nt"] if "sm90_fused_nt" in ops else ops["sm80_fused_nt"]
    a, b, values = inputs(op, 300, 200, 100)
    with pytest.raises((TypeError, ValueError)):
        op(a, b, *BAD[case](a, b, values))
    check(op, 300, 200, 100)


def test_operands_by_keyword(ops):
    op = ops["sm90_fused_nt"] if "sm90_fused_nt" in ops else ops["sm80_fused_nt"]
    a, b, (bias, c, alpha, beta) = inputs(op, 256, 384, 128)
    positional = op(a, b, bias, c, alpha, beta)
    assert torch.equal(op(a, b, bias=bias, C=c, alpha=alpha, beta=beta), positional)
    assert torch.equal(getattr(torch.ops.gemmgen_ep_test, op.name)(a, b, bias, c, alpha, beta), positional)


@pytest.mark.parametrize("act", ["gelu_tanh", "silu", "relu"])
def test_autograd_against_float64(ops, act):
    key = f"sm90_{act}" if IS_SM90 else f"sm80_{act}"
    op = ops[key]
    m, n, k = 300, 260, 200
    x = torch.randn(m, k, device="cuda").bfloat16().requires_grad_()
    w = torch.randn(n, k, device="cuda").bfloat16().requires_grad_()
    bias = torch.randn(n, device="cuda").bfloat16().requires_grad_()
    g = torch.randn(m, n, device="cuda").bfloat16()
    got = torch.autograd.grad(op(x, w.t(), bias), (x, w, bias), g)
    fn = {"gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu, "relu": F.relu}[act]
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, bias))
    want = torch.autograd.grad(fn(x64 @ w64.t() + b64), (x64, w64, b64), g.double())
    for name, gt, wt in zip(("dx", "dW", "dbias"), got, want):
        assert gt.dtype == torch.bfloat16
        assert rel(gt, wt) <= 2e-2, f"{act} {name}: {rel(gt, wt):.2e}"


# -- the C++ call path (the JIT runtime's boxed kernels) against the Python one (GemmOp.run, ctypes) ----------

def _error(call):
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


def _pairs(x, y):
    return list(zip(x, y)) if isinstance(x, tuple) else [(x, y)]


@pytest.mark.parametrize("key", [k for k in PLANS], ids=list(PLANS))
def test_cpp_kernel_matches_the_python_path(ops, key):
    """op(...) and torch.ops reach the JIT runtime's C++ kernel (templates/torch/gemm_op.h, boxed for an epilogue's
    operands); op.run(...) is the Python path it replaces. Same kernel, same GemmArgs: the same bits, and the same
    strides, for every plan, both overloads, ragged and empty sizes and K = 0."""
    if key not in ops:
        pytest.skip("sm90 family needs an sm_90 GPU")
    op = ops[key]
    assert op.cpp_kernel, f"{op.name}: the C++ kernel is not registered (did the JIT runtime build?)"
    for m, n, k in ((RAGGED[6], RAGGED[5], RAGGED[7]), (RAGGED[8], RAGGED[3], RAGGED[4]), (1, 8, 0), (0, 16, 8)):
        a, b, values = inputs(op, m, n, k)
        cpp, python = op(a, b, *values), op.run(a, b, tuple(values), None)
        ops_call = getattr(torch.ops.gemmgen_ep_test, op.name)(a, b, *values)
        for x, y in _pairs(cpp, python) + _pairs(ops_call, python):
            assert x.stride() == y.stride() and x.dtype == y.dtype and torch.equal(x, y), f"{op.name} {m}x{n}x{k}"
        if op.config.epilogue.aux is None:
            out_cpp = op._empty_out(a, b).fill_(float("nan"))
            out_python = op._empty_out(a, b).fill_(float("nan"))
            assert op(a, b, *values, out=out_cpp) is out_cpp
            op.run(a, b, tuple(values), out_python)
            assert torch.equal(out_cpp, out_python) and torch.equal(out_cpp, python), f"{op.name} {m}x{n}x{k} out="


def test_cpp_kernel_says_what_the_python_path_says(ops):
    """Every bad operand, out and overlap: the C++ kernel (through torch.ops, past op(...)'s own checks) refuses
    with the type and the words of GemmOp.run, and the next call is right."""
    op = ops["sm90_fused_nt"] if "sm90_fused_nt" in ops else ops["sm80_fused_nt"]
    m, n, k = 300, 200, 100
    a, b, (bias, c, alpha, beta) = inputs(op, m, n, k)
    wide = torch.randn(m, 2 * n, device="cuda").half()
    arena = torch.empty(m * n + n, device="cuda").half()
    bad = {
        "bias too short": (bias[:-1], c, alpha, beta),
        "bias float32": (bias.float(), c, alpha, beta),
        "bias float64": (bias.double(), c, alpha, beta),
        "bias on the CPU": (bias.cpu(), c, alpha, beta),
        "bias strided": (torch.randn(2 * n, device="cuda").half()[::2], c, alpha, beta),
        "bias 2-D": (bias[None], c, alpha, beta),
        "C wrong shape": (bias, c[:-1], alpha, beta),
        "C column-major": (bias, c.t().contiguous().t(), alpha, beta),
        "C neither order": (bias, wide[:, ::2], alpha, beta),
        "C bfloat16": (bias, c.bfloat16(), alpha, beta),
        "C on the CPU": (bias, c.cpu(), alpha, beta),
    }
    packet = getattr(torch.ops.gemmgen_ep_test, op.name)
    for label, values in bad.items():
        python = _error(lambda: op.run(a, b, values, None))
        assert _error(lambda: packet(a, b, *values)) == python, label
        assert _error(lambda: op(a, b, *values)) == python, label
        out = op._empty_out(a, b)
        assert _error(lambda: packet.out(a, b, *values, out=out)) == _error(lambda: op.run(a, b, values, out)), label
    bad_outs = {
        "out shape": (torch.empty(m, n - 1, device="cuda").half(), (bias, c, alpha, beta)),
        "out dtype": (torch.empty(m, n, device="cuda"), (bias, c, alpha, beta)),
        "out on the CPU": (torch.empty(m, n).half(), (bias, c, alpha, beta)),
        "out column-major": (torch.empty(n, m, device="cuda").half().t(), (bias, c, alpha, beta)),
        "out over bias": (arena[: m * n].view(m, n), (arena[m * n - 3: m * n - 3 + n], c, alpha, beta)),
        "out over C, other strides": (wide.view(-1)[: m * n].view(m, n), (bias, wide[:, :n], alpha, beta)),
        "out over A": (torch.empty(m * max(n, k), device="cuda").half()[: m * n].view(m, n), None),
    }
    for label, (out, values) in bad_outs.items():
        x = a
        if values is None:   # A a view of out's memory (stored as the plan takes A)
            values = (bias, c, alpha, beta)
            x = (out.view(-1)[: m * k].view(m, k) if op.config.layout.a.value == "row"
                 else out.view(-1)[: m * k].view(k, m).t())
        python = _error(lambda: op.run(x, b, values, out))
        assert _error(lambda: packet.out(x, b, *values, out=out)) == python, label
        assert _error(lambda: op(x, b, *values, out=out)) == python, label
    aux_op = ops["sm90_aux_dcol"] if "sm90_aux_dcol" in ops else ops["sm80_aux_dcol"]
    x, y, values = inputs(aux_op, m, n, k)
    out = aux_op._empty_out(x, y)
    aux_packet = getattr(torch.ops.gemmgen_ep_test, aux_op.name)
    assert _error(lambda: aux_packet.out(x, y, *values, out=out)) == (ValueError, (
        f"{aux_op.name}.out: the plan has a second output (aux), which out= cannot receive: call the op without out="))
    check(op, m, n, k)   # still right after the errors
    # in place, D = silu(alpha * acc + bias) + beta * C into C itself: the same on both paths
    c1, c2 = c.clone(), c.clone()
    op(a, b, bias, c1, alpha, beta, out=c1)
    op.run(a, b, (bias, c2, alpha, beta), c2)
    assert torch.equal(c1, c2)
