"""The JIT runtime on a machine without a GPU: it builds with the first kernel, registers each JIT op's
C++ CUDA kernel and autograd formula (templates/torch/gemm_op.h and gemm_autograd.h, the emitted
packages' code) beside the Python path, says the same as the Python checks, and its absence costs a
warning, never an op. (The C++ formula itself is run by tests/test_autograd_cpu.py, on CPU stand-in
kernels.)

The C++ kernel is reached without a GPU by redispatching straight to the CUDA key with CPU tensors: its
checks run A's rank, dtype and device first, so those are exercised here (B's checks and the rest come
after A's device check); the others and the launch are tests/gpu/test_jit_runtime_gpu.py's, and every
CUDA call of a JIT op in tests/gpu/ goes through this kernel."""
from __future__ import annotations

import ctypes
import dataclasses
import itertools
import types

import pytest

torch = pytest.importorskip("torch")

from generator import Gemm  # noqa: E402
from generator import epilogue as ep  # noqa: E402
from generator.runtime import GemmOp, jit_runtime  # noqa: E402
from generator.runtime import compile_op, registered_op  # noqa: E402
from generator.runtime.checks import TORCH_DTYPES  # noqa: E402
from generator.runtime.library import GemmArgsStruct, GemmListProblemStruct  # noqa: E402
from generator.runtime.operands import scale_blocks  # noqa: E402
from generator.spec.config import outputs, second_output  # noqa: E402
from generator.spec.epilogue import with_scales  # noqa: E402

CUDA_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)


@pytest.fixture(scope="module")
def op(build_cache):
    return Gemm(dtype="bf16", layout="tn", arch=90, namespace="gemmgen_rt").compile()


def cuda_kernel_source(qualname: str, key: str = "CUDA") -> str | None:
    """The file that registered the op's kernel for ``key`` (CUDA, or Autograd[alias]), from the
    dispatcher's own table."""
    for line in torch._C._dispatch_dump(qualname).splitlines():
        if line.startswith(f"{key}: registered at "):
            return line.removeprefix(f"{key}: registered at ")
    return None


def test_compile_registers_the_cpp_cuda_kernel_and_autograd(op):
    assert op.cpp_kernel and op.cpp_autograd and jit_runtime.RUNTIME.failure is None
    for overload in ("", ".out", ".grouped", ".grouped_list"):
        for key in ("CUDA", "Autograd[alias]"):
            where = cuda_kernel_source(f"gemmgen_rt::{op.name}{overload}", key)
            # (the grouped overloads' Autograd kernels are generator/runtime/autograd.py's formulas)
            python = key == "Autograd[alias]" and "grouped" in overload
            assert where is not None and ("jit_runtime.cpp" in where) != python, (key, overload, where)
    # the other keys stay Python's: CPU tensors hear the Python checks, meta tensors the fake
    assert "registration.py" in torch._C._dispatch_dump(f"gemmgen_rt::{op.name}").split("CompositeExplicitAutograd")[1]


def _raise(call):
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


BAD = {
    "A 4-D": lambda: (torch.randn(2, 2, 4, 8).bfloat16(), torch.randn(4, 8).bfloat16().t()),
    "A 3-D on the CPU": lambda: (torch.randn(2, 4, 8).bfloat16(), torch.randn(4, 8).bfloat16().t()),
    "A float32": lambda: (torch.randn(4, 8), torch.randn(4, 8).bfloat16().t()),
    "A on the CPU": lambda: (torch.randn(4, 8).bfloat16(), torch.randn(4, 8).bfloat16().t()),
}


@pytest.mark.parametrize("case", BAD)
def test_cpp_checks_say_what_the_python_checks_say(op, case):
    a, b = BAD[case]()
    cpp = _raise(lambda: op.op.default.redispatch(CUDA_KEY, a, b))
    python = _raise(lambda: op.run(a, b, (), None))
    assert cpp == python and cpp[0] in (TypeError, ValueError)
    out = torch.empty(4, 4, dtype=torch.bfloat16)
    assert _raise(lambda: op.op.out.redispatch(CUDA_KEY, a, b, out=out)) == _raise(lambda: op.run(a, b, (), out))


# The ops registered unbuilt below take `op`'s config in namespaces of their own: a new registration, whose first
# launch finds the kernel library in the build cache (a registration, not a kernel, is what these tests are about).

def test_an_op_built_on_first_use_gets_its_cpp_kernel_then(op):
    lazy = registered_op(op.config, "gemmgen_rt_lazy")
    assert not lazy.built and not lazy.cpp_kernel and cuda_kernel_source(f"gemmgen_rt_lazy::{lazy.name}") is None
    assert lazy.cpp_autograd   # the formula is registered with the op, before any build
    lazy.library  # noqa: B018  (the first launch's build)
    assert lazy.cpp_kernel and "jit_runtime.cpp" in cuda_kernel_source(f"gemmgen_rt_lazy::{lazy.name}")
    again = compile_op(lazy.config, namespace="gemmgen_rt_lazy")   # a second compile registers nothing twice
    assert again.cpp_kernel and again.op is lazy.op


def test_a_second_handle_built_first_registers_through_the_registered_one(op, recwarn):
    from generator.runtime import GemmOp

    config = op.config
    registered = registered_op(config, "gemmgen_rt_second")            # registered, not built
    second = GemmOp(config, None, "gemmgen_rt_second")                  # another handle of the same op
    second.library  # noqa: B018  (built through the second handle)
    assert second.cpp_kernel and registered.cpp_kernel and registered.built
    dump = torch._C._dispatch_dump(f"gemmgen_rt_second::{config.name}")
    assert dump.count("CUDA: registered at ") == 1 and "jit_runtime.cpp" in dump
    assert not [w for w in recwarn if "Overriding" in str(w.message)]


def test_without_the_runtime_ops_still_work_and_a_warning_says_why(build_cache, monkeypatch):
    broken = jit_runtime._Runtime()
    monkeypatch.setattr(jit_runtime, "RUNTIME", broken)
    request = jit_runtime.runtime_request()
    bad = jit_runtime.BuildRequest(name="gemmgen_jit_runtime_broken", sources={"jit_runtime.cpp": "#error no\n"},
                                   gencode="", include_dirs=request.include_dirs)
    monkeypatch.setattr(jit_runtime, "runtime_request", lambda: bad)
    with pytest.warns(RuntimeWarning, match="JIT runtime .* did not build.*results are the same"):
        op = Gemm(dtype="bf16", layout="tn", arch=90, namespace="gemmgen_rt_none").compile()   # (`op`'s kernel)
    assert not op.cpp_kernel and not op.cpp_autograd and op.built and "#error no" in broken.failure
    assert cuda_kernel_source(f"gemmgen_rt_none::{op.name}") is None
    autograd = cuda_kernel_source(f"gemmgen_rt_none::{op.name}", "Autograd[alias]")
    assert autograd is not None and "jit_runtime.cpp" not in autograd   # the Python formula
    with pytest.raises(ValueError, match=r"pass A\.cuda\(\)"):   # the Python path serves every key
        op(torch.randn(4, 8).bfloat16(), torch.randn(4, 8).bfloat16().t())


# -- ops with a fused epilogue: the boxed C++ kernels ----------------------------------------------------------

def fused(acc, bias: ep.Col, C: ep.Matrix, alpha: ep.Scalar, beta: ep.Scalar):
    return ep.silu(alpha * acc + bias) + beta * C


BF16_ROW = ep.Row(dtype="bf16")
FP32_COL_MAJOR = ep.Matrix(dtype="fp32", order="col")


def rowwise(acc, scale: BF16_ROW, R: FP32_COL_MAJOR):
    z = scale * acc
    return ep.tanh(z) + R, z


def shared_vectors(acc, bias: ep.Col, scale: ep.Row, alpha: ep.Scalar):
    """Vectors and a scalar: the operands a batched call shares between its problems."""
    return ep.silu(alpha * acc * scale + bias)


def gelu_aux(acc, bias: ep.Col):
    h = acc + bias
    return ep.gelu(h), h


@pytest.fixture(scope="module")
def epilogue_op(build_cache):
    return Gemm(dtype="bf16", layout="tn", arch=90, activation="gelu", bias="col", namespace="gemmgen_rt").compile()


def test_an_epilogue_op_gets_boxed_cpp_kernels_and_a_plain_op_keeps_its_unboxed_ones(op, epilogue_op):
    # gelu(acc + bias), a Linear layer's epilogue: the C++ closed form for the default overload; .out's refusal of
    # grad stays Python's (its schema varies per epilogue)
    assert epilogue_op.cpp_kernel and epilogue_op.cpp_autograd
    assert "jit_runtime.cpp" in cuda_kernel_source(f"gemmgen_rt::{epilogue_op.name}", "Autograd[alias]")
    assert "jit_runtime.cpp" not in cuda_kernel_source(f"gemmgen_rt::{epilogue_op.name}.out", "Autograd[alias]")
    for overload in ("", ".out"):
        where = cuda_kernel_source(f"gemmgen_rt::{epilogue_op.name}{overload}")
        assert where is not None and "jit_runtime.cpp" in where and where.endswith("[ boxed ]"), where
        plain = cuda_kernel_source(f"gemmgen_rt::{op.name}{overload}")
        assert "jit_runtime.cpp" in plain and plain.endswith("[ boxed unboxed ]"), plain
    # CPU tensors redispatched to the CUDA key reach the C++ checks: A's device first, as in Python
    a, b, bias = torch.randn(4, 8).bfloat16(), torch.randn(6, 8).bfloat16().t(), torch.randn(6).bfloat16()
    cpp = _raise(lambda: epilogue_op.op.default.redispatch(CUDA_KEY, a, b, bias))
    assert cpp == _raise(lambda: epilogue_op.run(a, b, (bias,), None)) == (ValueError, (
        "A is on cpu; this op runs on CUDA tensors: pass A.cuda()"))


# The checks past A's device need tensors on the op's device: a stand-in op takes CPU tensors (device_type
# "cpu", which the C++ kernels are told too), and its "kernel library" records the GemmArgs of each launch.
# GemmOp.run, unchanged, is the reference: both paths must refuse with the same type and words, and fill the
# same GemmArgs (the operands' slots, leading dimensions, aux) for the same call.

LAUNCHES: list = []
LAUNCH_CODE = [0]
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(GemmArgsStruct), ctypes.c_void_p)
_ERROR_STRING = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int)
_PATH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(GemmArgsStruct))
_FAILURE = ctypes.create_string_buffer(b"the stand-in kernel failed")
#: The GemmArgs each op.path(...) asked the stand-in library's path chooser about; it answers 1 ('unaligned'), and
#: for a grouped call (group_ends or list set) GROUPED_PATH[0] (4: 'grouped').
PATHS_ASKED: list = []
GROUPED_PATH = [4]


def _copy_args(args):
    """A copy of the GemmArgs a call passed; a list call's problems copied too, as ``.problems`` (the host array lives
    only during the call)."""
    copy = GemmArgsStruct.from_buffer_copy(args.contents)
    copy.problems = ([GemmListProblemStruct.from_buffer_copy(args.contents.list[i]) for i in range(copy.batch)]
                     if args.contents.list else None)
    return copy


@_LAUNCH
def _record_launch(args, stream):
    LAUNCHES.append(_copy_args(args))
    return LAUNCH_CODE[0]


@_PATH
def _record_path(args):
    PATHS_ASKED.append(_copy_args(args))
    return GROUPED_PATH[0] if args.contents.group_ends or args.contents.list else 1


@_ERROR_STRING
def _error_string(code):
    return ctypes.addressof(_FAILURE)


class StandInOp(GemmOp):
    device_type = "cpu"


STAND_IN_NAMESPACE = "gemmgen_rt_standin"
STAND_IN_PLANS = {
    "plain": dict(layout="nt"),
    "fused": dict(layout="tn", epilogue=fused),
    "rowwise_aux_dcol": dict(layout="tt", layout_c="col", out_dtype="fp32", epilogue=rowwise),
    "knobs_row_bias": dict(layout="nn", activation="relu", bias="row", alpha=0.5),
    # fp8 scales: one-element tensors read on the device, and per-block scales with their leading dimension
    "scaled_tensor": dict(layout="tn", epilogue=with_scales(ep.from_knobs(activation="gelu", bias="col"), "tensor")),
    "scaled_block": dict(dtype="e4m3", layout="tn", epilogue=with_scales(ep.from_knobs(bias="col"), "block")),
    # fp8 of two formats: B's dtype is checked apart from A's
    "mixed_fp8": dict(dtype="e5m2", dtype_b="e4m3", layout="tn", epilogue=with_scales(ep.IDENTITY, "tensor")),
    # what a batched call shares between its problems, D column-major; and a second output, which it refuses
    "vectors_dcol": dict(layout="tt", layout_c="col", epilogue=shared_vectors),
    "aux_col_bias": dict(layout="tn", epilogue=gelu_aux),
    # grouped calls (A row-major): a plain plan, the pingpong schedule with a column-major D, an int8 plan (int32 D);
    # and plans whose kernels take none (the sm80 family, planned for Hopper or for Ampere; the ws schedule; "plain",
    # whose A is column-major)
    "grouped_tt": dict(layout="tt", cluster_shape=(1, 2)),   # (a config no other plan here derives: its own op)
    "pingpong_dcol": dict(layout="tt", layout_c="col", schedule="pingpong"),
    "int8": dict(dtype="int8", layout="tn"),
    "sm80": dict(layout="tn", family="sm80"),
    "sm80_arch80": dict(layout="tn", arch=80),
    "ws": dict(layout="tn", schedule="ws"),
    # list calls take a column-major A too (a config no other plan here derives: its own op)
    "list_nt": dict(layout="nt", schedule="pingpong"),
    # fp8 with DeepSeek's per-block scales alone: grouped calls of rows with their scales (.grouped_scaled)
    "fp8_block": dict(dtype="e4m3", layout="tn", scale="block"),
    # a quantized D (fp8, its per-block scales the second output): after a fused epilogue, and of fp8 inputs
    "quantized_silu_bias": dict(layout="tn", out_dtype="e4m3", activation="silu", bias="col"),
    "quantized_fp8_block": dict(dtype="e4m3", layout="tn", scale="block", out_dtype="e5m2"),
    # and the amax of D, a third output
    "quantized_amax": dict(layout="tn", out_dtype="e4m3", amax=True),
}
_STAND_INS: dict = {}


def stand_in(key: str) -> StandInOp:
    """The stand-in op of STAND_IN_PLANS[key], with its C++ kernels registered for the CUDA key (once). The key
    "stream_k" is the cooperative tn plan with stream-K (a config field, not a knob)."""
    if key not in _STAND_INS:
        if not jit_runtime.RUNTIME.ensure():
            pytest.skip(f"the JIT runtime did not build here: {jit_runtime.RUNTIME.failure}")
        if key == "stream_k":
            config = dataclasses.replace(Gemm("bf16", "tn", arch=90, schedule="cooperative").config, stream_k=True)
        else:
            config = Gemm(**{"dtype": "bf16", "arch": 90, **STAND_IN_PLANS[key]}).config
        # A namespace per key: an op registers its backward ops (GemmOps of device type "cuda") in its namespace, and
        # one may be another key's kernel (rowwise_aux_dcol's dA is plain's), which would then keep a GemmOp, not this
        # StandInOp, behind torch.ops and the fake, if that key were asked for later. (Also keeps sm80 apart from
        # sm80_arch80: an sm80 kernel's name does not spell the arch it was planned for.)
        op = StandInOp(config, None, f"{STAND_IN_NAMESPACE}_{key}")
        assert registered_op(config, op.namespace) is op, f"{key}: its StandInOp is not the registered handle"
        library = types.SimpleNamespace(launch=_record_launch, error_string=_error_string)
        assert jit_runtime.RUNTIME.register(op, library)
        # GemmOp.run's launch: the same recorder, and its message as bytes
        op._library = types.SimpleNamespace(launch=_record_launch, error_string=lambda code: _FAILURE.value,
                                            choose_path=_record_path)
        _STAND_INS[key] = op
    return _STAND_INS[key]


@pytest.fixture
def python_launches_on_cpu(monkeypatch):
    """GemmOp.run asks torch.cuda for the device and stream of its launch: the CPU tensors' answers."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0))
    LAUNCH_CODE[0] = 0
    yield
    LAUNCH_CODE[0] = 0


M, N, K = 33, 40, 24


def stored(rows, cols, order, dtype=torch.bfloat16):
    t = torch.randn(rows, cols) if order == "row" else torch.randn(cols, rows).t()
    return t.to(dtype)


def stand_in_inputs(op, m=M, n=N, k=K):
    cfg = op.config
    a = stored(m, k, cfg.layout.a.value, TORCH_DTYPES[cfg.dtype])
    b = stored(k, n, cfg.layout.b.value, TORCH_DTYPES[cfg.b_dtype])
    values = []
    for o in cfg.epilogue.operands:
        dtype = TORCH_DTYPES[o.dtype]
        if o.kind == "scalar":
            values.append(1.25 if o.name == "alpha" else -0.5)
        elif o.kind == "scalar_tensor":
            values.append(torch.rand(1) + 0.5)
        elif o.kind in ("row_blocks", "col_blocks"):
            values.append(torch.rand(m if o.kind == "row_blocks" else scale_blocks(n), scale_blocks(k)) + 0.5)
        elif o.kind in ("row", "col"):
            values.append(torch.randn(m if o.kind == "row" else n).to(dtype))
        else:
            values.append(stored(m, n, o.order.value, dtype))
    return a, b, values


def cpp_call(op, a, b, values, out=None):
    if out is None:
        return op.op.default.redispatch(CUDA_KEY, a, b, *values)
    return op.op.out.redispatch(CUDA_KEY, a, b, *values, out=out)


def python_call(op, a, b, values, out=None):
    return op.run(a, b, tuple(values), out)


def launched(call):
    """(the call's result, the GemmArgs it launched with, or None if it launched nothing)."""
    before = len(LAUNCHES)
    result = call()
    assert len(LAUNCHES) - before in (0, 1)
    return result, (LAUNCHES[-1] if len(LAUNCHES) > before else None)


def args_dict(args, outputs):
    """The GemmArgs as plain values, D's, aux's and amax's addresses replaced by which output they point at."""
    fields = {name: getattr(args, name) for name, _ in GemmArgsStruct._fields_}
    for name in ("ep_ptr", "ep_ld", "ep_scalar"):
        fields[name] = list(fields[name])
    fields["list"] = ctypes.cast(fields["list"], ctypes.c_void_p).value   # (a pointer object: its address)
    pointers = {t.data_ptr(): f"output {i}" for i, t in enumerate(outputs)}
    for name in ("d", "aux", "amax"):
        fields[name] = pointers.get(fields[name], fields[name])
    return fields


def outputs_of(result):
    return list(result) if isinstance(result, tuple) else [result]


def batch_fields(args):
    """GemmArgs' batch and batch strides (A, B, D)."""
    return (args.batch, args.batch_stride_a, args.batch_stride_b, args.batch_stride_d)


@pytest.mark.parametrize("key", list(STAND_IN_PLANS))
def test_cpp_kernels_launch_with_the_gemm_args_of_the_python_path(python_launches_on_cpu, key):
    op = stand_in(key)
    ep_ = op.config.epilogue
    for m, n, k in ((M, N, K), (1, 7, 5), (16, 8, 0), (0, 8, 4)):
        a, b, values = stand_in_inputs(op, m, n, k)
        cpp, cpp_args = launched(lambda: cpp_call(op, a, b, values))
        python, python_args = launched(lambda: python_call(op, a, b, values))
        cpp, python = outputs_of(cpp), outputs_of(python)
        assert [(t.shape, t.stride(), t.dtype) for t in cpp] == [(t.shape, t.stride(), t.dtype) for t in python]
        second = second_output(op.config)
        assert len(cpp) == outputs(op.config) == 1 + (second is not None) + op.config.amax
        if op.config.amax:   # a 0-dim fp32 zero the kernel raises (the stand-in launches nothing that raises it)
            assert cpp[-1].shape == () and cpp[-1].dtype == torch.float32 and cpp[-1].item() == 0.0
        if m * n == 0:
            assert cpp_args is None and python_args is None
            continue
        assert args_dict(cpp_args, cpp) == args_dict(python_args, python)
        assert batch_fields(cpp_args) == (0, 0, 0, 0)   # a 2-D call: one problem, as before batching
        # (ctypes reads a null pointer as None: K = 0 gives empty A and B)
        assert (cpp_args.d, cpp_args.a or 0, cpp_args.b or 0) == (cpp[0].data_ptr(), a.data_ptr(), b.data_ptr())
        if second == "aux":
            assert (cpp_args.aux, cpp_args.ldaux) == (cpp[1].data_ptr(), cpp_args.ldd)
        elif second == "scales":   # (M, ceil(N / 128)) fp32, row-major
            assert cpp[0].dtype == TORCH_DTYPES[op.config.out_dtype] and cpp[1].dtype == torch.float32
            assert cpp[1].shape == (m, -(-n // 128)) and cpp_args.ldaux == -(-n // 128)
            assert cpp_args.aux == cpp[1].data_ptr()
        else:
            assert not cpp_args.aux and cpp_args.ldaux == 0
        assert (cpp_args.amax or 0) == (cpp[2].data_ptr() if op.config.amax else 0)
        for i, (o, v) in enumerate(zip(ep_.operands, values)):
            if o.kind == "scalar":
                assert cpp_args.ep_scalar[i] == v and not cpp_args.ep_ptr[i]
            else:   # (None: the null address of K = 0's empty per-block scales)
                assert (cpp_args.ep_ptr[i] or 0) == v.data_ptr()
        if second is None:   # .out writes into the given out
            out = op._empty_out(a, b)
            got, cpp_args = launched(lambda: cpp_call(op, a, b, values, out))
            assert got is out or got.data_ptr() == out.data_ptr()
            _, python_args = launched(lambda: python_call(op, a, b, values, out))
            assert args_dict(cpp_args, [out]) == args_dict(python_args, [out])


def _bias_strided(v):
    return (torch.randn(2 * N).bfloat16()[::2], *v[1:])


# (plan, case) -> the operand values made wrong in one way; every C++ refusal must equal GemmOp.run's.
BAD_OPERANDS = {
    ("fused", "bias too short"): lambda v: (v[0][:-1], *v[1:]),
    ("fused", "bias too long"): lambda v: (torch.randn(N + 1).bfloat16(), *v[1:]),
    ("fused", "bias float32"): lambda v: (v[0].float(), *v[1:]),
    ("fused", "bias float64 (no dtype to declare)"): lambda v: (v[0].double(), *v[1:]),
    ("fused", "bias on meta"): lambda v: (v[0].to("meta"), *v[1:]),
    ("fused", "bias strided"): _bias_strided,
    ("fused", "bias 2-D"): lambda v: (v[0][None], *v[1:]),
    ("fused", "bias 0-D"): lambda v: (v[0][0], *v[1:]),
    ("fused", "bias None"): lambda v: (None, *v[1:]),
    ("fused", "C wrong shape"): lambda v: (v[0], v[1][:-1], *v[2:]),
    ("fused", "C transposed shape"): lambda v: (v[0], torch.randn(N, M).bfloat16(), *v[2:]),
    ("fused", "C column-major"): lambda v: (v[0], v[1].t().contiguous().t(), *v[2:]),
    ("fused", "C neither order"): lambda v: (v[0], torch.randn(M, 2 * N).bfloat16()[:, ::2], *v[2:]),
    ("fused", "C float16"): lambda v: (v[0], v[1].half(), *v[2:]),
    ("fused", "C 1-D"): lambda v: (v[0], v[1][0], *v[2:]),
    ("fused", "C on meta"): lambda v: (v[0], v[1].to("meta"), *v[2:]),
    ("fused", "C None"): lambda v: (v[0], None, *v[2:]),
    ("rowwise_aux_dcol", "scale too short"): lambda v: (v[0][:-1], v[1]),
    ("rowwise_aux_dcol", "scale of N"): lambda v: (torch.randn(N).bfloat16(), v[1]),
    ("rowwise_aux_dcol", "scale float32 (declared bf16)"): lambda v: (v[0].float(), v[1]),
    ("rowwise_aux_dcol", "R row-major"): lambda v: (v[0], v[1].contiguous()),
    ("rowwise_aux_dcol", "R bfloat16"): lambda v: (v[0], v[1].bfloat16()),
    ("rowwise_aux_dcol", "R wrong shape"): lambda v: (v[0], stored(M - 1, N, "col", torch.float32)),
    ("knobs_row_bias", "bias of N"): lambda v: (torch.randn(N).bfloat16(),),
    ("knobs_row_bias", "bias strided"): lambda v: (torch.randn(2 * M).bfloat16()[::2],),
    ("scaled_tensor", "scale_a two elements"): lambda v: (torch.ones(2), *v[1:]),
    ("scaled_tensor", "scale_a empty"): lambda v: (torch.ones(0), *v[1:]),
    ("scaled_tensor", "scale_b 2-D"): lambda v: (v[0], torch.ones(1, 1), v[2]),
    ("scaled_tensor", "scale_a float16"): lambda v: (v[0].half(), *v[1:]),
    ("scaled_tensor", "scale_a float64"): lambda v: (v[0].double(), *v[1:]),
    ("scaled_tensor", "scale_b on meta"): lambda v: (v[0], v[1].to("meta"), v[2]),
    ("scaled_tensor", "scale_a None"): lambda v: (None, *v[1:]),
    ("scaled_block", "scale_a one k block too many"): lambda v: (torch.ones(M, 2), *v[1:]),
    ("scaled_block", "scale_b of N rows"): lambda v: (v[0], torch.ones(N, 1), v[2]),
    ("scaled_block", "scale_a 1-D"): lambda v: (v[0][:, 0], *v[1:]),
    ("scaled_block", "scale_b bfloat16"): lambda v: (v[0], v[1].bfloat16(), v[2]),
    ("scaled_block", "scale_a on meta"): lambda v: (v[0].to("meta"), *v[1:]),
}


@pytest.mark.parametrize("key, case", list(BAD_OPERANDS), ids=[f"{k}-{c}" for k, c in BAD_OPERANDS])
def test_cpp_operand_checks_say_what_the_python_checks_say(python_launches_on_cpu, key, case):
    op = stand_in(key)
    a, b, values = stand_in_inputs(op)
    bad = BAD_OPERANDS[key, case](values)
    before = len(LAUNCHES)
    cpp = _raise(lambda: cpp_call(op, a, b, bad))
    assert cpp == _raise(lambda: python_call(op, a, b, bad)) and cpp[0] in (TypeError, ValueError), cpp
    if op.config.epilogue.aux is None:
        out = op._empty_out(a, b)
        cpp_out = _raise(lambda: cpp_call(op, a, b, bad, out))
        assert cpp_out == _raise(lambda: python_call(op, a, b, bad, out)) == cpp
    assert len(LAUNCHES) == before   # refused before any launch
    # the next correct call is right
    _, cpp_args = launched(lambda: cpp_call(op, a, b, values))
    assert cpp_args is not None


def test_cpp_out_checks_and_aliasing_say_what_the_python_checks_say(python_launches_on_cpu):
    op = stand_in("fused")
    a, b, values = stand_in_inputs(op)
    bias, C, alpha, beta = values
    rows = torch.randn(M, K + N).bfloat16()          # A and out side by side in each row: their spans interleave
    arena = torch.empty(M * N + N, dtype=torch.bfloat16)   # out, then bias overlapping out's last elements
    wide = torch.randn(M, 2 * N).bfloat16()
    # label -> (A, operand values, out)
    cases = {
        "out wrong shape": (a, values, torch.empty(M, N - 1, dtype=torch.bfloat16)),
        "out float32": (a, values, torch.empty(M, N)),
        "out on meta": (a, values, torch.empty(M, N, dtype=torch.bfloat16, device="meta")),
        "out column-major": (a, values, torch.empty(N, M, dtype=torch.bfloat16).t()),
        "out beside A in the same rows": (rows[:, :K], values, rows[:, K:]),
        "out overlapping bias": (a, (arena[M * N - 5: M * N - 5 + N], C, alpha, beta), arena[: M * N].view(M, N)),
        # the same address as C, other strides: not C itself
        "out over C with other strides": (a, (bias, wide[:, :N], alpha, beta), wide.view(-1)[: M * N].view(M, N)),
    }
    for label, (x, vals, out) in cases.items():
        cpp = _raise(lambda: cpp_call(op, x, b, vals, out))
        assert cpp == _raise(lambda: python_call(op, x, b, vals, out)) and cpp[0] in (TypeError, ValueError), label
        assert ("shares memory" in cpp[1]) == label.startswith(("out beside", "out overlapping", "out over")), cpp
    # .out(out=None) through torch.ops: refused (GemmOp.run would take None for "no out" and return a new D)
    assert _raise(lambda: op.op.out.redispatch(CUDA_KEY, a, b, *values, out=None)) == (
        TypeError, "out must be a torch.Tensor, got NoneType")
    # out = C itself: D = silu(alpha * acc + bias) + beta * C in place, allowed on both paths
    got, cpp_args = launched(lambda: cpp_call(op, a, b, values, C))
    assert got.data_ptr() == C.data_ptr() and cpp_args.d == cpp_args.ep_ptr[1] == C.data_ptr()
    _, python_args = launched(lambda: python_call(op, a, b, values, C))
    assert args_dict(cpp_args, [C]) == args_dict(python_args, [C])
    # a plain op's out= is checked against A and B too (as GemmOp.run does): its B (K, N) row-major, and an out
    # whose first row is B's last
    plain = stand_in("plain")
    assert plain.config.layout.b.value == "row"
    x, _, _ = stand_in_inputs(plain)
    rows = torch.randn(K + M - 1, N).bfloat16()
    cpp = _raise(lambda: cpp_call(plain, x, rows[:K], (), rows[K - 1:]))
    assert cpp == _raise(lambda: python_call(plain, x, rows[:K], (), rows[K - 1:])) == (
        ValueError, "out shares memory with B: the kernel reads B while it writes D; pass a separate out")


def test_out_of_an_aux_plan_and_a_failed_launch_say_what_python_says(python_launches_on_cpu):
    op = stand_in("rowwise_aux_dcol")
    a, b, values = stand_in_inputs(op)
    out = op._empty_out(a, b)
    cpp = _raise(lambda: cpp_call(op, a, b, values, out))
    assert cpp == _raise(lambda: op.op.out(a, b, *values, out=out)) == (
        ValueError, f"{op.name}.out: the plan has a second output (aux), which out= cannot receive: call the op "
                    "without out=")
    LAUNCH_CODE[0] = 7
    cpp = _raise(lambda: cpp_call(op, a, b, values))
    assert cpp == _raise(lambda: python_call(op, a, b, values)) == (
        RuntimeError, f"{op.name}: launch failed: the stand-in kernel failed")


def test_scalars_and_missing_operands_never_reach_a_kernel(python_launches_on_cpu):
    """op(...) checks the operands' types and binds them before dispatch (Python, both paths); through torch.ops
    the dispatcher refuses a missing operand and converts a one-element tensor given for a float itself."""
    op = stand_in("fused")
    a, b, (bias, C, alpha, beta) = stand_in_inputs(op)
    for bad, message in [((bias, C, torch.tensor(2.0), beta), "alpha is a runtime scalar of the epilogue: pass a "
                          "Python number, got Tensor (use float(t) for a one-element tensor)"),
                         ((bias, C, alpha, True), "beta is a runtime scalar of the epilogue: pass a Python number, "
                          "got bool"),
                         ((bias, C, alpha), "missing epilogue operand(s) beta: call op(A, B, bias, C, alpha, beta)"),
                         ((bias, 2.0, alpha, beta), "C must be a torch.Tensor of shape (M, N), got float")]:
        assert _raise(lambda: op(a, b, *bad)) == (TypeError, message)
    missing = _raise(lambda: op.op.default.redispatch(CUDA_KEY, a, b, bias, C, alpha))
    assert missing == _raise(lambda: op.op.default(a, b, bias, C, alpha)) and "beta" in missing[1]
    _, cpp_args = launched(lambda: cpp_call(op, a, b, (bias, C, torch.tensor(2.0), beta)))
    assert cpp_args.ep_scalar[2] == 2.0


def test_the_runtime_refuses_a_spec_that_does_not_match_the_schema():
    op = stand_in("fused")
    other = Gemm("bf16", arch=90, layout="tn", activation="relu", bias="col").config
    handle = types.SimpleNamespace(namespace=op.namespace, name=op.name, config=other, device_type="cpu")
    with pytest.raises(RuntimeError, match=r"the schema of gemmgen_rt_standin_fused::.* does not match the op spec's 1 "
                                           r"epilogue operand\(s\)"):
        jit_runtime.RUNTIME.register(handle, types.SimpleNamespace(launch=_record_launch, error_string=_error_string))


def test_cpp_block_scale_checks_say_what_the_python_checks_say(python_launches_on_cpu):
    """Per-block scales over several K blocks: their storage order and leading dimension, both paths alike."""
    op = stand_in("scaled_block")
    a, b, (sa, sb, bias) = stand_in_inputs(op, M, 300, 260)
    assert sa.shape == (M, 3) and sb.shape == (3, 3)
    for bad in [(sa.t().contiguous().t(), sb, bias), (sa, sb.t().contiguous().t(), bias),
                (sa, torch.ones(3, 6)[:, ::2], bias)]:
        cpp = _raise(lambda: cpp_call(op, a, b, bad))
        assert cpp == _raise(lambda: python_call(op, a, b, bad)) and cpp[0] is ValueError, cpp
        assert "; the kernel reads per-block scales row-major: pass scale_" in cpp[1] and ".contiguous()" in cpp[1]
    padded = torch.ones(M, 8)[:, :3]
    cpp, cpp_args = launched(lambda: cpp_call(op, a, b, (padded, sb, bias)))
    python, python_args = launched(lambda: python_call(op, a, b, (padded, sb, bias)))
    assert args_dict(cpp_args, [cpp]) == args_dict(python_args, [python])
    assert list(cpp_args.ep_ld)[:3] == [8, 3, 0] and cpp_args.ep_ptr[0] == padded.data_ptr()


def test_cpp_checks_of_a_mixed_fp8_plan_say_what_python_says(python_launches_on_cpu):
    """e5m2 x e4m3: each of A and B against its own dtype, in both paths."""
    op = stand_in("mixed_fp8")
    a, b, values = stand_in_inputs(op)
    for bad_a, bad_b in ((a, b.to(torch.float8_e5m2)), (a.to(torch.float8_e4m3fn), b)):
        cpp = _raise(lambda: cpp_call(op, bad_a, bad_b, values))
        assert cpp == _raise(lambda: python_call(op, bad_a, bad_b, values)) and cpp[0] is TypeError, cpp
    assert "B is torch.float8_e5m2; this plan computes e4m3: pass B.to(torch.float8_e4m3fn) or plan with dtype_b=" in \
        _raise(lambda: cpp_call(op, a, b.to(torch.float8_e5m2), values))[1]
    cpp, cpp_args = launched(lambda: cpp_call(op, a, b, values))
    python, python_args = launched(lambda: python_call(op, a, b, values))
    assert args_dict(cpp_args, [cpp]) == args_dict(python_args, [python])


# -- batched calls (3-D A or B): the same checks and GemmArgs on both paths --------------------------------------

BATCH = 3
GAP = 3   # lines (rows of a row-major matrix, columns of a column-major one) between a padded operand's matrices


def batched_operand(rows, cols, order, mode, dtype=torch.bfloat16, batch=BATCH):
    """(an operand of rows x cols matrices stored in order, the batch stride its launch takes): 'shared' a 2-D one,
    'one' a batch of 1, 'packed' matrices back to back, 'padded' GAP lines apart, 'expanded' one matrix for every
    problem (batch stride 0)."""
    one = stored(rows, cols, order, dtype)
    if mode == "shared":
        return one, 0
    if mode == "one":
        return one[None], 0
    if mode == "expanded":
        return one.expand(batch, rows, cols), 0
    pad = GAP if mode == "padded" else 0
    if order == "row":   # (the dtype before the slice: .to() of a padded view would pack it)
        return torch.randn(batch, rows + pad, cols).to(dtype)[:, :rows], (rows + pad) * cols
    return torch.randn(batch, cols + pad, rows).to(dtype)[:, :cols].transpose(1, 2), (cols + pad) * rows


def batched_inputs(op, a_mode="packed", b_mode="packed", m=M, n=N, k=K):
    """A and B of op's plan as batched_operand makes them (without their batch strides)."""
    cfg = op.config
    a, _ = batched_operand(m, k, cfg.layout.a.value, a_mode, TORCH_DTYPES[cfg.dtype])
    b, _ = batched_operand(k, n, cfg.layout.b.value, b_mode, TORCH_DTYPES[cfg.b_dtype])
    return a, b


def batched_out(op, m, n, batch=BATCH):
    """(an out for a batched call, its matrices in the plan's order of D and GAP lines apart; its batch stride)."""
    if op.config.layout.c.value == "row":
        return torch.empty(batch, m + GAP, n, dtype=op.out_dtype)[:, :m], (m + GAP) * n
    return torch.empty(batch, n + GAP, m, dtype=op.out_dtype)[:, :n].transpose(1, 2), (n + GAP) * m


def line(rows, cols, order):
    """The leading dimension of a packed rows x cols matrix stored in order."""
    return cols if order == "row" else rows


#: (A's mode, B's mode) of batched_operand: each with the other, a batch of 1 broadcast, and a batch of 1 only.
MODES = [("packed", "packed"), ("packed", "shared"), ("shared", "packed"), ("padded", "expanded"), ("one", "padded"),
         ("expanded", "one"), ("one", "one")]
#: The stand-in plans that take a batched call: plain, and scalars, one-element scales and vectors.
BATCHABLE = ["plain", "knobs_row_bias", "scaled_tensor", "mixed_fp8", "vectors_dcol"]


@pytest.mark.parametrize("key", BATCHABLE)
def test_batched_calls_fill_the_batch_fields_alike_on_both_paths(python_launches_on_cpu, key):
    op = stand_in(key)
    cfg = op.config
    orders = (cfg.layout.a.value, cfg.layout.b.value, cfg.layout.c.value)
    for (a_mode, b_mode), (m, n, k) in itertools.product(MODES, ((M, N, K), (1, 7, 5))):
        label = (a_mode, b_mode, m, n, k)
        _, _, values = stand_in_inputs(op, m, n, k)
        a, stride_a = batched_operand(m, k, orders[0], a_mode, TORCH_DTYPES[cfg.dtype])
        b, stride_b = batched_operand(k, n, orders[1], b_mode, TORCH_DTYPES[cfg.b_dtype])
        batch = max(1 if mode == "one" else BATCH for mode in (a_mode, b_mode) if mode != "shared")
        cpp, cpp_args = launched(lambda: cpp_call(op, a, b, values))
        python, python_args = launched(lambda: python_call(op, a, b, values))
        # D batch-contiguous, each D[b] in the plan's order
        strides = (m * n, n, 1) if orders[2] == "row" else (m * n, 1, m)
        for d in (cpp, python):
            assert (tuple(d.shape), d.stride(), d.dtype) == ((batch, m, n), strides, op.out_dtype), label
        assert args_dict(cpp_args, [cpp]) == args_dict(python_args, [python]), label
        assert batch_fields(cpp_args) == (batch, stride_a, stride_b, m * n if batch > 1 else 0), label
        assert (cpp_args.m, cpp_args.n, cpp_args.k, cpp_args.lda, cpp_args.ldb, cpp_args.ldd) == (
            m, n, k, line(m, k, orders[0]), line(k, n, orders[1]), line(m, n, orders[2])), label
        assert (cpp_args.a, cpp_args.b, cpp_args.d) == (a.data_ptr(), b.data_ptr(), cpp.data_ptr())
        # out= with its matrices GAP lines apart: its batch stride reaches the launch
        out, stride_out = batched_out(op, m, n, batch)
        got, cpp_args = launched(lambda: cpp_call(op, a, b, values, out))
        _, python_args = launched(lambda: python_call(op, a, b, values, out))
        assert got.data_ptr() == out.data_ptr() and cpp_args.d == out.data_ptr()
        assert args_dict(cpp_args, [out]) == args_dict(python_args, [out]), label
        assert batch_fields(cpp_args) == (batch, stride_a, stride_b, stride_out if batch > 1 else 0), label


def test_empty_batches_launch_nothing_on_both_paths(python_launches_on_cpu):
    """A batch of 0, or problems of M = 0 or N = 0: an empty 3-D D and no launch, as torch.matmul."""
    op = stand_in("vectors_dcol")
    for batch, m, n in ((0, M, N), (BATCH, 0, N), (BATCH, M, 0)):
        _, _, values = stand_in_inputs(op, m, n, K)
        a = batched_operand(m, K, "row", "packed", batch=batch)[0]
        for call in (cpp_call, python_call):
            d, args = launched(lambda: call(op, a, stored(K, n, "row"), values))
            assert args is None and tuple(d.shape) == (batch, m, n), (call, batch, m, n)
            out = batched_out(op, m, n, batch)[0]
            d, args = launched(lambda: call(op, a, stored(K, n, "row"), values, out))
            assert args is None and d.data_ptr() == out.data_ptr()
            if batch > 1:   # an empty out with a batch stride of 0: no problem writes it, so it is taken
                empty = torch.empty(1, m, n, dtype=op.out_dtype).expand(batch, m, n)
                d, args = launched(lambda: call(op, a, stored(K, n, "row"), values, empty))
                assert args is None and d.stride()[0] == 0


def test_path_of_a_batched_call_asks_with_the_arguments_of_its_launch(python_launches_on_cpu):
    op = stand_in("vectors_dcol")
    _, _, values = stand_in_inputs(op)
    a, b = batched_inputs(op, "padded", "one")
    PATHS_ASKED.clear()
    assert op.path(a, b, *values) == "unaligned"   # what the stand-in chooser answers
    d, launch_args = launched(lambda: python_call(op, a, b, values))
    (asked,) = PATHS_ASKED
    core = ("a", "b", "m", "n", "k", "lda", "ldb", "ldd", "batch", "batch_stride_a", "batch_stride_b", "batch_stride_d")
    assert {f: getattr(asked, f) for f in core} == {f: getattr(launch_args, f) for f in core}
    assert batch_fields(asked) == (BATCH, (M + GAP) * K, 0, M * N)


def _plain_batched(op, values, a_mode="packed", b_mode="packed"):
    return (*batched_inputs(op, a_mode, b_mode), values, None)


def _with_out(out_of):
    """A case whose batched A and B are right and whose out is out_of(op)."""
    return lambda op, values: (*batched_inputs(op), values, out_of(op))


def _out_over_b(op, values):
    # B (3, K, N) row-major and out (3, M, N) in one buffer, out's first row on B's last
    buf = torch.randn(BATCH * K * N + BATCH * M * N - N).bfloat16()
    return batched_inputs(op)[0], buf[:BATCH * K * N].view(BATCH, K, N), values, buf[BATCH * K * N - N:].view(
        BATCH, M, N)


def _bf16(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16)


# label -> (stand-in plan, make (A, B, operand values, out or None) from the op and good 2-D values, what both paths
# raise). M, N, K = 33, 40, 24; "plain" is layout nt (A column-major, B row-major, D row-major).
BATCHED_BAD = {
    "A 4-D": ("plain", lambda op, v: (torch.randn(2, BATCH, M, K).bfloat16(), stored(K, N, "row"), v, None),
              (ValueError, f"A must be 2-D (M, K) or 3-D (batch, M, K); got shape (2, {BATCH}, {M}, {K})")),
    "B 1-D": ("plain", lambda op, v: (batched_inputs(op)[0], torch.randn(N).bfloat16(), v, None),
              (ValueError, f"B must be 2-D (K, N) or 3-D (batch, K, N); got shape ({N},)")),
    "batch sizes 3 and 2": ("plain", lambda op, v: (batched_inputs(op)[0], batched_operand(K, N, "row", "packed",
                                                                                          batch=2)[0], v, None),
                            (ValueError, f"A is ({BATCH}, {M}, {K}) and B is (2, {K}, {N}): their batch sizes must "
                                         "agree, or one be 1 (broadcast, as torch.matmul)")),
    "A's matrices row-major": (
        "plain", lambda op, v: (torch.randn(BATCH, M, K).bfloat16(), stored(K, N, "row"), v, None),
        (ValueError, f"A has strides ({M * K}, {K}, 1) (row-major); this plan was made for layout_a='col': plan with "
                     "layout='tt' or pass A.transpose(-1, -2).contiguous().transpose(-1, -2) (a column-major copy)")),
    "B's matrices column-major": (
        "plain", lambda op, v: (batched_inputs(op)[0], torch.randn(BATCH, N, K).bfloat16().transpose(1, 2), v, None),
        (ValueError, f"B has strides ({N * K}, 1, {K}) (column-major); this plan was made for layout_b='row': plan "
                     "with layout='nn' or pass B.contiguous()")),
    "A's matrices in neither order": ("plain", lambda op, v: (torch.randn(BATCH, M, 2 * K).bfloat16()[:, :, ::2],
                                                              stored(K, N, "row"), v, None),
                                      (ValueError, f"A has strides ({2 * M * K}, {2 * K}, 2) (neither row- nor "
                                                   "column-major); this plan was made for layout_a='col'")),
    "K of B's matrices": ("plain", lambda op, v: (batched_inputs(op)[0], torch.randn(BATCH, K - 1, N).bfloat16(), v,
                                                  None),
                          (ValueError, f"A is ({BATCH}, {M}, {K}) and B is ({BATCH}, {K - 1}, {N}): K must agree (A's "
                                       "columns = B's rows); for x @ W.t() pass B = W.t()")),
    "a batch past int32": ("plain", lambda op, v: (stored(M, K, "col")[None].expand(2**31, M, K), stored(K, N, "row"),
                                                   v, None),
                           (ValueError, "batch=2147483648 is larger than the kernels index (2**31 - 1): split the "
                                        "problem")),
    "out 2-D": ("plain", _with_out(lambda op: _bf16(M, N)),
                (ValueError, f"out has shape ({M}, {N}); D = A @ B is ({BATCH}, {M}, {N}): pass torch.empty({BATCH}, "
                             f"{M}, {N}, dtype=torch.bfloat16, device='cpu')")),
    "out of batch 2": ("plain", _with_out(lambda op: _bf16(2, M, N)),
                       (ValueError, f"out has shape (2, {M}, {N}); D = A @ B is ({BATCH}, {M}, {N}): pass "
                                    f"torch.empty({BATCH}, {M}, {N}, dtype=torch.bfloat16, device='cpu')")),
    "out float32": ("plain", _with_out(lambda op: torch.empty(BATCH, M, N)),
                    (TypeError, "out is torch.float32; this plan writes bf16: pass an out of dtype torch.bfloat16 or "
                                "plan with out_dtype='float32'")),
    "out's matrices column-major": (
        "plain", _with_out(lambda op: _bf16(BATCH, N, M).transpose(1, 2)),
        (ValueError, f"out has strides ({M * N}, 1, {M}) (column-major); this plan writes D row-major: pass "
                     "out=torch.empty(batch, M, N) or plan with layout_c='col'")),
    "out with batch stride 0": ("plain", _with_out(lambda op: _bf16(1, M, N).expand(BATCH, M, N)),
                                (ValueError, f"out has strides (0, {N}, 1): with a batch stride of 0, all {BATCH} "
                                             "problems would write the same D; pass out=torch.empty(batch, M, N)")),
    "out over B's last row": ("plain", _out_over_b,
                              (ValueError, "out shares memory with B: the kernel reads B while it writes D; pass a "
                                           "separate out")),
    "column-major D: out's matrices row-major": (
        "vectors_dcol", _with_out(lambda op: _bf16(BATCH, M, N)),
        (ValueError, f"out has strides ({M * N}, {N}, 1) (row-major); this plan writes D col-major: pass "
                     "out=torch.empty(batch, N, M).transpose(1, 2) or plan with layout_c='row'")),
    "column-major D: out with batch stride 0": (
        "vectors_dcol", _with_out(lambda op: _bf16(1, N, M).transpose(1, 2).expand(BATCH, M, N)),
        (ValueError, f"out has strides (0, 1, {M}): with a batch stride of 0, all {BATCH} problems would write the "
                     "same D; pass out=torch.empty(batch, N, M).transpose(1, 2)")),
    "a per-problem bias": ("vectors_dcol", lambda op, v: (*batched_inputs(op), (torch.randn(BATCH, N).bfloat16(),
                                                                                *v[1:]), None),
                           (ValueError, f"bias must be 1-D (N,); got shape ({BATCH}, {N})")),
    "a row bias of batch * M": ("knobs_row_bias", lambda op, v: (*batched_inputs(op, "shared", "packed"),
                                                                 (torch.randn(BATCH * M).bfloat16(),), None),
                                (ValueError, f"bias has length {BATCH * M}; a per-row vector has one value per row of "
                                             f"D: length M (A's rows) = {M}")),
    "a matrix operand": ("fused", lambda op, v: (*batched_inputs(op, "packed", "shared"), v, None),
                         (ValueError, "a batched call (3-D A or B) takes no matrix operand 'C': call the op once per "
                                      "problem with 2-D tensors, or plan without it")),
    "a matrix operand of 3-D C, B batched": (
        "fused", lambda op, v: (*batched_inputs(op, "shared", "packed"),
                                (v[0], torch.randn(BATCH, M, N).bfloat16(), *v[2:]), _bf16(BATCH, M, N)),
        (ValueError, "a batched call (3-D A or B) takes no matrix operand 'C': call the op once per problem with 2-D "
                     "tensors, or plan without it")),
    "a matrix operand before aux": ("rowwise_aux_dcol", _plain_batched,
                                    (ValueError, "a batched call (3-D A or B) takes no matrix operand 'R': call the op "
                                                 "once per problem with 2-D tensors, or plan without it")),
    "a second output": ("aux_col_bias", _plain_batched,
                        (ValueError, "a batched call (3-D A or B) cannot store the plan's second output (aux): call "
                                     "the op once per problem with 2-D tensors, or plan without it")),
    "per-block scales": ("scaled_block", _plain_batched,
                         (ValueError, "a batched call (3-D A or B) takes no per-block scales 'scale_a': call the op "
                                      "once per problem with 2-D tensors, or plan with scale='tensor' or "
                                      "scale='row'")),
}


@pytest.mark.parametrize("case", list(BATCHED_BAD))
def test_cpp_batched_checks_say_what_the_python_checks_say(python_launches_on_cpu, case):
    key, make, expected = BATCHED_BAD[case]
    op = stand_in(key)
    _, _, values = stand_in_inputs(op)
    a, b, bad, out = make(op, values)
    before = len(LAUNCHES)
    cpp = _raise(lambda: cpp_call(op, a, b, bad, out))
    assert cpp == _raise(lambda: python_call(op, a, b, bad, out)), case
    if expected[0] is ValueError and "neither" in expected[1]:
        assert cpp[0] is ValueError and cpp[1].startswith(expected[1]), cpp
    else:
        assert cpp == expected, cpp
    assert len(LAUNCHES) == before   # refused before any launch
    # the next correct call launches: batched where the plan takes one, else with 2-D operands
    good_a, good_b = batched_inputs(op) if key in BATCHABLE else stand_in_inputs(op)[:2]
    _, args = launched(lambda: cpp_call(op, good_a, good_b, values))
    assert args is not None and args.batch == (BATCH if key in BATCHABLE else 0)


def test_fake_batched_outputs_have_the_real_shapes_and_strides(python_launches_on_cpu):
    """The fake implementation (torch.compile's) gives D's 3-D shape, dtype and strides, as eager calls allocate it,
    and refuses what a batched call refuses."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for key, (a_mode, b_mode) in itertools.product(("plain", "vectors_dcol"), MODES):
        op = stand_in(key)
        _, _, values = stand_in_inputs(op)
        a, b = batched_inputs(op, a_mode, b_mode)
        real = cpp_call(op, a, b, values)
        with FakeTensorMode() as mode:
            fakes = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in (a, b, *values)]
            fake = op.op.default(*fakes)
            out = mode.from_tensor(batched_out(op, M, N, real.shape[0])[0])
            assert op.op.out(*fakes, out=out) is out    # .out's decomposition
        assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype), (key, a_mode, b_mode)
    op = stand_in("fused")
    _, _, values = stand_in_inputs(op)
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in (*batched_inputs(op), *values)]
        with pytest.raises(ValueError, match="a batched call .3-D A or B. takes no matrix operand 'C'"):
            op.op.default(*fakes)
        with pytest.raises(ValueError, match="their batch sizes must agree"):
            op.op.default(mode.from_tensor(batched_operand(M, K, "row", "packed", batch=2)[0]), *fakes[1:])


# -- grouped calls (.grouped: a mixture of experts' rows): the same checks and GemmArgs on both paths ---------------

from generator.runtime import op as op_module  # noqa: E402
from generator.runtime.checks import batch_stride  # noqa: E402
from generator.spec.grouped import (GROUPED_EPILOGUE_REFUSAL, grouped_epilogue_refusal, grouped_k_refusal,  # noqa: E402
                                    grouped_list_refusal, grouped_refusal)

#: total_M, N, K of the grouped calls: every bf16 (and int8) leading dimension and B's stride keep the 16-byte rule.
GM, GN, GK = 40, 48, 32
#: Group sizes (rows of A per group), empty groups among them; each sums to GM.
GROUP_SIZES = [[5, 0, 17, 18], [GM], [0, GM, 0], [GM, 0], [0, 0, 0, GM]]
#: The stand-in plans whose kernels take grouped calls: cooperative nt (A column-major), pingpong with a column-major
#: D, int8 tn (int32 D).
GROUPED = ["grouped_tt", "pingpong_dcol", "int8"]


def ends_of(sizes):
    """offsets: the groups' ends (cumulative row counts), int32."""
    return torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32)


def grouped_inputs(op, sizes=(5, 0, 17, 18), a_mode="stored", b_mode="packed", n=GN, k=GK):
    """A (sum(sizes), K) and B (E, K, N) of op's plan, and offsets. a_mode 'padded': A's leading dimension 16 more
    than its lines; b_mode as batched_operand's ('packed', 'padded': GAP lines between matrices, 'expanded': stride
    0)."""
    cfg = op.config
    m, order = sum(sizes), cfg.layout.a.value
    dtype = TORCH_DTYPES[cfg.dtype]
    if a_mode == "padded":
        a = (torch.randn(m, k + 16).to(dtype)[:, :k] if order == "row" else
             torch.randn(k, m + 16).to(dtype)[:, :m].t())
    else:
        a = stored(m, k, order, dtype)
    b, _ = batched_operand(k, n, cfg.layout.b.value, b_mode, TORCH_DTYPES[cfg.b_dtype], batch=len(sizes))
    return a, b, ends_of(sizes)


def cpp_grouped(op, a, b, offsets):
    return op.op.grouped.redispatch(CUDA_KEY, a, b, offsets)


def python_grouped(op, a, b, offsets):
    return op.run_grouped(a, b, offsets)


@pytest.mark.parametrize("key", GROUPED)
def test_grouped_calls_fill_the_gemm_args_alike_on_both_paths(python_launches_on_cpu, key):
    """GemmArgs of a grouped call: A, B and D, total_M x N x K and their leading dimensions, the groups as the batch,
    B's stride between its matrices (0 for one), A's and D's 0, group_ends the offsets' address; the same on the
    C++ kernel, the Python path and op.grouped; D (total_M, N) in the plan's order."""
    op = stand_in(key)
    cfg = op.config
    orders = (cfg.layout.a.value, cfg.layout.b.value, cfg.layout.c.value)
    for sizes, a_mode, b_mode in itertools.product(GROUP_SIZES, ("stored", "padded"), ("packed", "padded",
                                                                                         "expanded")):
        label = (sizes, a_mode, b_mode)
        a, b, offsets = grouped_inputs(op, sizes, a_mode, b_mode)
        cpp, cpp_args = launched(lambda: cpp_grouped(op, a, b, offsets))
        python, python_args = launched(lambda: python_grouped(op, a, b, offsets))
        method, method_args = launched(lambda: op.grouped(a, b, offsets))   # (CPU tensors: the Python kernel)
        strides = (GN, 1) if orders[2] == "row" else (1, GM)
        for d in (cpp, python, method):
            assert (tuple(d.shape), d.stride(), d.dtype) == ((GM, GN), strides, op.out_dtype), label
        assert args_dict(cpp_args, [cpp]) == args_dict(python_args, [python]) == args_dict(method_args, [method])
        groups = len(sizes)
        stride_b = batch_stride(b)
        assert stride_b == (0 if groups == 1 or b_mode == "expanded" else b.stride(0)), label
        assert batch_fields(cpp_args) == (groups, 0, stride_b, 0), label
        assert cpp_args.group_ends == offsets.data_ptr(), label
        assert (cpp_args.m, cpp_args.n, cpp_args.k, cpp_args.lda, cpp_args.ldb, cpp_args.ldd) == (
            GM, GN, GK, a.stride(0 if orders[0] == "row" else 1), b.stride(1 if orders[1] == "row" else 2),
            line(GM, GN, orders[2])), label
        assert (cpp_args.a, cpp_args.b, cpp_args.d) == (a.data_ptr(), b.data_ptr(), cpp.data_ptr()), label
        assert not any(cpp_args.ep_ptr) and not cpp_args.aux


#: The stand-in plans whose kernels take grouped calls along K (A column-major, B row-major).
GROUPED_K = ["list_nt"]


def test_grouped_k_refusal_names_the_layout():
    """Along K, a group starts at any k: K must be the outer dimension of A and B (layout nt)."""
    assert grouped_k_refusal(stand_in("list_nt").config) is None
    assert grouped_k_refusal(stand_in("sm80").config) == grouped_list_refusal(stand_in("sm80").config)
    tail = ": plan with layout='nt' (for a weight gradient dW = X.t() @ dY: A = X.t(), B = dY)"
    assert grouped_k_refusal(stand_in("grouped_tt").config).endswith("this plan's A is row-major" + tail)
    assert grouped_k_refusal(stand_in("int8").config).endswith(
        "this plan's A is row-major and B is column-major" + tail)


@pytest.mark.parametrize("key", GROUPED_K)
def test_grouped_calls_along_k_fill_the_gemm_args_alike_on_both_paths(python_launches_on_cpu, key):
    """B 2-D: groups along K. GemmArgs: A (M, K) and B (K, N), one matrix each (batch strides 0), the groups as the
    batch, D (E, M, N) with each matrix in the plan's order and its stride between matrices, groups_along_k set; the
    same on the C++ kernel and the Python path."""
    op = stand_in(key)
    cfg = op.config
    orders = (cfg.layout.a.value, cfg.layout.b.value, cfg.layout.c.value)
    dtype = TORCH_DTYPES[cfg.dtype]
    for sizes in ([2 * s for s in sizes] for sizes in GROUP_SIZES):   # K = 2 GM (int8's 16-byte rule)
        a, b = stored(GN, 2 * GM, orders[0], dtype), stored(2 * GM, GK, orders[1], TORCH_DTYPES[cfg.b_dtype])
        offsets = ends_of(sizes)
        cpp, cpp_args = launched(lambda: cpp_grouped(op, a, b, offsets))
        python, python_args = launched(lambda: python_grouped(op, a, b, offsets))
        groups = len(sizes)
        strides = (GN * GK, GK, 1) if orders[2] == "row" else (GN * GK, 1, GN)
        for d in (cpp, python):
            assert (tuple(d.shape), d.stride(), d.dtype) == ((groups, GN, GK), strides, op.out_dtype), sizes
        assert args_dict(cpp_args, [cpp]) == args_dict(python_args, [python]), sizes
        assert batch_fields(cpp_args) == (groups, 0, 0, GN * GK), sizes
        assert cpp_args.groups_along_k == python_args.groups_along_k == 1
        assert cpp_args.group_ends == offsets.data_ptr(), sizes
        assert (cpp_args.m, cpp_args.n, cpp_args.k) == (GN, GK, 2 * GM), sizes


def test_empty_grouped_calls_launch_nothing_on_both_paths(python_launches_on_cpu):
    """No rows, no columns or no groups: an empty D and no launch; K = 0: D of zeros and no launch (as
    torch.matmul). Operands off the 16-byte rule are taken where nothing launches."""
    op = stand_in("grouped_tt")   # tt: A and B row-major
    cases = {   # label -> (A, B, offsets, D's shape)
        "no rows": (*grouped_inputs(op, [0, 0, 0])[:2], ends_of([0, 0, 0]), (0, GN)),
        "no groups": (*grouped_inputs(op, [])[:2], ends_of([]), (0, GN)),
        "no columns": (*grouped_inputs(op, n=0), (GM, 0)),
        "K = 0": (*grouped_inputs(op, k=0), (GM, GN)),
        "no rows, B's leading dimension off the rule": (*grouped_inputs(op, [0, 0], n=GN - 4), (0, GN - 4)),
        "K = 0, A's leading dimension off the rule": (*grouped_inputs(op, [3, 33], k=0), (36, GN)),
    }
    for label, (a, b, offsets, shape) in cases.items():
        for call in (cpp_grouped, python_grouped):
            d, args = launched(lambda: call(op, a, b, offsets))
            assert args is None and tuple(d.shape) == shape, (label, call)
            if label.startswith("K = 0"):
                assert torch.equal(d, torch.zeros(shape, dtype=op.out_dtype)), label


def _strided_b(op, extra):
    """B (4, K, N) row-major with its matrices K * N + extra elements apart."""
    return torch.randn(4, GK * GN + extra).bfloat16()[:, :GK * GN].view(4, GK, GN)


def _plan_refusal(key):
    return lambda op: (ValueError, f"{op.name}: {grouped_refusal(op.config)}")


# label -> (stand-in plan, make (A, B, offsets) from the plan's op and good grouped inputs, what both paths raise, or a
# function of the op giving it). GM, GN, GK = 40, 48, 32; "grouped_tt" is layout tt (A and B row-major).
GROUPED_BAD = {
    "an sm80 plan for Hopper": ("sm80", lambda op, a, b, o: (a, b, o), _plan_refusal("sm80")),
    "an sm80 plan for Ampere": ("sm80_arch80", lambda op, a, b, o: (a, b, o), _plan_refusal("sm80_arch80")),
    "the ws schedule": ("ws", lambda op, a, b, o: (a, b, o), _plan_refusal("ws")),
    "stream-K": ("stream_k", lambda op, a, b, o: (a, b, o), _plan_refusal("stream_k")),
    "an sm80 plan, whatever the operands": ("sm80", lambda op, a, b, o: (a[None], b[None], o.float()),
                                            _plan_refusal("sm80")),
    "A 3-D": ("grouped_tt", lambda op, a, b, o: (a[None], b, o),
              (ValueError, f"A must be 2-D (total_M, K) for a grouped call: every group's rows, sorted by group; got "
                           f"shape (1, {GM}, {GK})")),
    "B 2-D: groups along K, which take A column-major": (
        "grouped_tt", lambda op, a, b, o: (a, b[0], o),
        lambda op: (ValueError, f"{op.name}: {grouped_k_refusal(op.config)}")),
    "along K: the ends must reach K": (
        "list_nt", lambda op, a, b, o: (a, b[0], o),
        (ValueError, f"offsets[-1] = {GM} but K is {GK} (A's columns, B's rows): the last group must end at K")),
    "along K: A 3-D": ("list_nt", lambda op, a, b, o: (a[None], b[0], o),
                       (ValueError, f"A must be 2-D (M, K) for a grouped call along K (B 2-D): offsets split K; got "
                                    f"shape (1, {GM}, {GK})")),
    "along K: K disagrees": ("list_nt", lambda op, a, b, o: (a, b[0, 1:], o),
                             (ValueError, f"A is ({GM}, {GK}) and B is ({GK - 1}, {GN}): K must agree (A's columns = "
                                          "B's rows), the dimension offsets splits")),
    "along K: no groups": ("list_nt", lambda op, a, b, o: (a, b[0], o[:0]),
                           (ValueError, f"offsets has no group ends (E = 0) but K is {GK}: with no groups, K must be "
                                        "0")),
    "along K: an sm80 plan": ("sm80", lambda op, a, b, o: (a, b[0], o),
                              lambda op: (ValueError, f"{op.name}: {grouped_list_refusal(op.config)}")),
    "A float32": ("grouped_tt", lambda op, a, b, o: (a.float(), b, o),
                  (TypeError, "A is torch.float32; this plan computes bf16: pass A.to(torch.bfloat16) or plan with "
                              "dtype='float32'")),
    "B float16": ("grouped_tt", lambda op, a, b, o: (a, b.half(), o),
                  (TypeError, "B is torch.float16; this plan computes bf16: pass B.to(torch.bfloat16) or plan with "
                              "dtype='float16'")),
    "A column-major": ("grouped_tt", lambda op, a, b, o: (a.t().contiguous().t(), b, o),
                       (ValueError, f"A has strides (1, {GM}) (column-major); this plan was made for layout_a='row': "
                                    "plan with layout='nt' or pass A.contiguous()")),
    "B's matrices column-major": (
        "grouped_tt", lambda op, a, b, o: (a, b.transpose(1, 2).contiguous().transpose(1, 2), o),
        (ValueError, f"B has strides ({GK * GN}, 1, {GK}) (column-major); this plan was made for layout_b='row': plan "
                     "with layout='tn' or pass B.contiguous()")),
    "A on meta": ("grouped_tt", lambda op, a, b, o: (a.to("meta"), b, o),
                  (ValueError, "A is on meta; this op runs on CUDA tensors: pass A.cuda()")),
    "B on meta": ("grouped_tt", lambda op, a, b, o: (a, b.to("meta"), o),
                  (ValueError, "B is on meta; this op runs on CUDA tensors: pass B.cuda()")),
    "K of B's matrices": ("grouped_tt", lambda op, a, b, o: (a, b[:, 1:], o),
                          (ValueError, f"A is ({GM}, {GK}) and B is (4, {GK - 1}, {GN}): K must agree (A's columns = "
                                       "the rows of B's matrices); for experts' weights W (E, N, K) pass "
                                       "B = W.transpose(1, 2)")),
    "offsets float32": ("grouped_tt", lambda op, a, b, o: (a, b, o.float()),
                        (TypeError, "offsets is torch.float32; group ends are int32: pass offsets.to(torch.int32)")),
    "offsets int64": ("grouped_tt", lambda op, a, b, o: (a, b, o.long()),
                      (TypeError, "offsets is torch.int64; group ends are int32: pass offsets.to(torch.int32)")),
    "offsets None": ("grouped_tt", lambda op, a, b, o: (a, b, None),
                     (TypeError, "offsets must be a torch.Tensor, got NoneType")),
    "offsets 2-D": ("grouped_tt", lambda op, a, b, o: (a, b, o[None]),
                    (ValueError, "offsets must be 1-D (E,), the groups' ends (cumulative row counts); got shape "
                                 "(1, 4)")),
    "offsets on meta": ("grouped_tt", lambda op, a, b, o: (a, b, o.to("meta")),
                        (ValueError, "offsets is on meta but A and B on cpu: pass offsets.to('cpu')")),
    "one end short": ("grouped_tt", lambda op, a, b, o: (a, b, o[1:]),
                      (ValueError, "offsets has 3 group ends but B has 4 matrices (B.size(0)): pass one end per "
                                   "group")),
    "offsets strided": ("grouped_tt", lambda op, a, b, o: (a, b, o.repeat_interleave(2)[::2]),
                        (ValueError, "offsets has stride 2; the kernel reads group ends contiguous: pass "
                                     "offsets.contiguous()")),
    "rows without groups": ("grouped_tt", lambda op, a, b, o: (a, b[:0], o[:0]),
                            (ValueError, f"B has no matrices (E = 0) but A has {GM} rows: with no groups, A must have "
                                         "no rows")),
    "M past int32": ("grouped_tt", lambda op, a, b, o: (torch.empty(0, 2**31 + 1, dtype=torch.bfloat16).t(), b[:1, :0],
                                                   o[:1]),
                     (ValueError, "M=2147483649 is larger than the kernels index (2**31 - 1): split the problem")),
    # the 16-byte rule of the grouped kernel's TMA loads
    "A's base address": ("grouped_tt", lambda op, a, b, o: (torch.randn(GM * GK + 1).bfloat16()[1:].view(GM, GK), b, o),
                         (ValueError, "A breaks the 16-byte rule of grouped calls: its base address is 2 bytes past "
                                      "a multiple of 16; the grouped kernel loads A and B by TMA, which needs the base "
                                      "address, the leading dimension and the stride between B's matrices to be "
                                      "multiples of 16 bytes: pass a copy, "
                                      "A.clone(memory_format=torch.contiguous_format)")),
    "A's leading dimension": ("grouped_tt", lambda op, a, b, o: (torch.randn(GM, GK + 4).bfloat16()[:, :GK], b, o),
                              (ValueError, f"A breaks the 16-byte rule of grouped calls: its leading dimension is "
                                           f"{GK + 4} elements ({2 * (GK + 4)} bytes); the grouped kernel loads A and B "
                                           "by TMA, which needs the base address, the leading dimension and the stride "
                                           "between B's matrices to be multiples of 16 bytes: make its leading "
                                           "dimension a multiple of 8 elements: pass a view of a padded buffer, e.g. "
                                           f"torch.empty({GM}, {GK}, dtype=torch.bfloat16, device='cpu')[:, :{GK}]")),
    "B's base address": ("grouped_tt", lambda op, a, b, o: (a, torch.randn(4 * GK * GN + 4).bfloat16()[4:].view(4, GK, GN),
                                                       o),
                         (ValueError, "B breaks the 16-byte rule of grouped calls: its base address is 8 bytes past "
                                      "a multiple of 16; the grouped kernel loads A and B by TMA, which needs the base "
                                      "address, the leading dimension and the stride between B's matrices to be "
                                      "multiples of 16 bytes: pass a copy, "
                                      "B.clone(memory_format=torch.contiguous_format)")),
    "B's leading dimension": ("grouped_tt", lambda op, a, b, o: (a, *grouped_inputs(op, n=GN - 4)[1:]),
                              (ValueError, "B breaks the 16-byte rule of grouped calls: its leading dimension is 44 "
                                           "elements (88 bytes); the grouped kernel loads A and B by TMA, which needs "
                                           "the base address, the leading dimension and the stride between B's "
                                           "matrices to be multiples of 16 bytes: make its leading dimension a "
                                           "multiple of 8 elements: pass a view of a padded buffer, e.g. "
                                           f"torch.empty(4, {GK}, 48, dtype=torch.bfloat16, device='cpu')[:, :, :44]")),
    "B's matrices 4 elements off": (
        "grouped_tt", lambda op, a, b, o: (a, _strided_b(op, 4), o),
        (ValueError, f"B breaks the 16-byte rule of grouped calls: its matrices are {GK * GN + 4} elements "
                     f"({2 * (GK * GN + 4)} bytes) apart; the grouped kernel loads A and B by TMA, which needs the "
                     "base address, the leading dimension and the stride between B's matrices to be multiples of 16 "
                     "bytes: pass a copy, B.clone(memory_format=torch.contiguous_format)")),
    "int8: A's leading dimension": ("int8", lambda op, a, b, o: grouped_inputs(op, k=20),
                                    (ValueError, "A breaks the 16-byte rule of grouped calls: its leading dimension is "
                                                 "20 elements (20 bytes); the grouped kernel loads A and B by TMA, "
                                                 "which needs the base address, the leading dimension and the stride "
                                                 "between B's matrices to be multiples of 16 bytes: make its leading "
                                                 "dimension a multiple of 16 elements: pass a view of a padded "
                                                 f"buffer, e.g. torch.empty({GM}, 32, dtype=torch.int8, "
                                                 "device='cpu')[:, :20]")),
    "int8: B's column-major matrices' leading dimension": (
        "int8", lambda op, a, b, o: (torch.randn(GM, 32).to(torch.int8)[:, :20], *grouped_inputs(op, k=20)[1:]),
        (ValueError, "B breaks the 16-byte rule of grouped calls: its leading dimension is 20 elements (20 bytes); the "
                     "grouped kernel loads A and B by TMA, which needs the base address, the leading dimension and "
                     "the stride between B's matrices to be multiples of 16 bytes: make its leading dimension a "
                     "multiple of 16 elements: pass a view of a padded buffer, e.g. torch.empty(4, "
                     f"{GN}, 32, dtype=torch.int8, device='cpu')[:, :, :20].transpose(1, 2)")),
    # the offsets' values (read on the host)
    "a negative first end": ("grouped_tt", lambda op, a, b, o: (a, b, torch.tensor([-1, 17, 22, GM], dtype=torch.int32)),
                             (ValueError, "offsets must be nondecreasing group ends (cumulative row counts) from 0: "
                                          "offsets[0] = -1 < 0")),
    "ends out of order": ("grouped_tt", lambda op, a, b, o: (a, b, torch.tensor([5, 22, 17, GM], dtype=torch.int32)),
                          (ValueError, "offsets must be nondecreasing group ends (cumulative row counts): offsets[2] = "
                                       "17 < offsets[1] = 22")),
    "the last end short of A's rows": ("grouped_tt", lambda op, a, b, o: (a, b, ends_of([5, 0, 17, 16])),
                                       (ValueError, f"offsets[-1] = 38 but A has {GM} rows: the last group must end at "
                                                    "A's last row")),
    "the last end past A's rows": ("grouped_tt", lambda op, a, b, o: (a, b, ends_of([5, 0, 17, 20])),
                                   (ValueError, f"offsets[-1] = 42 but A has {GM} rows: the last group must end at A's "
                                                "last row")),
}


def test_cpp_grouped_calls_check_changed_offsets_again(python_launches_on_cpu):
    """gemm_op.h reads a tensor's offsets on the host once while it stays unchanged (the backward's calls on the
    forward's offsets skip the sync); an in-place change, another total or another tensor is checked again."""
    op = stand_in("grouped_tt")
    a, b, offsets = grouped_inputs(op)
    for _ in range(2):
        launched(lambda: cpp_grouped(op, a, b, offsets))
    offsets[2] = 4   # in place: the version counter moves
    assert _raise(lambda: cpp_grouped(op, a, b, offsets)) == (
        ValueError, "offsets must be nondecreasing group ends (cumulative row counts): offsets[2] = 4 < offsets[1] = 5")
    offsets[2] = 22
    launched(lambda: cpp_grouped(op, a, b, offsets))
    shorter = a[:GM - 2]   # the same offsets against another total
    assert _raise(lambda: cpp_grouped(op, shorter, b, offsets)) == (
        ValueError, f"offsets[-1] = {GM} but A has {GM - 2} rows: the last group must end at A's last row")
    del offsets   # a fresh tensor, wherever it lands, is checked
    assert _raise(lambda: cpp_grouped(op, a, b, ends_of([5, 0, 17, 16]))) == (
        ValueError, f"offsets[-1] = 38 but A has {GM} rows: the last group must end at A's last row")


@pytest.mark.parametrize("case", list(GROUPED_BAD))
def test_cpp_grouped_checks_say_what_the_python_checks_say(python_launches_on_cpu, case):
    key, make, expected = GROUPED_BAD[case]
    op = stand_in(key)
    a, b, offsets = make(op, *grouped_inputs(op))
    if callable(expected):
        expected = expected(op)
    before = len(LAUNCHES)
    cpp = _raise(lambda: cpp_grouped(op, a, b, offsets))
    assert cpp == _raise(lambda: python_grouped(op, a, b, offsets)) == expected, cpp
    if all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in (a, b, offsets)):
        # the method, through the dispatcher (to the Python kernel: a meta tensor would go to the fake)
        assert _raise(lambda: op.grouped(a, b, offsets)) == expected
    assert len(LAUNCHES) == before   # refused before any launch
    if key in GROUPED:   # the next correct call launches
        _, args = launched(lambda: cpp_grouped(op, *grouped_inputs(op)))
        assert args is not None and args.group_ends


def test_grouped_refusals_name_the_fix_for_each_plan():
    """The plan refusals of the table above, spelled out once."""
    assert grouped_refusal(stand_in("grouped_tt").config) is None and grouped_refusal(stand_in("int8").config) is None
    assert grouped_refusal(stand_in("pingpong_dcol").config) is None
    assert grouped_refusal(stand_in("sm80").config) == ("grouped calls run on the sm90 family's persistent kernels; "
                                                        "this plan is sm80: plan with family='sm90' (or family=None)")
    assert grouped_refusal(stand_in("sm80_arch80").config) == ("grouped calls run on the sm90 family's persistent "
                                                               "kernels; this plan is sm80: plan with arch=90")
    assert grouped_refusal(stand_in("ws").config) == (
        "grouped calls run on the persistent schedules; this plan's schedule is 'ws' (one tile per block, its grid "
        "sized on the host): plan with schedule='cooperative' or 'pingpong'")
    assert grouped_refusal(stand_in("stream_k").config) == (
        "grouped calls do not split tiles by stream-K (its shares are cut on the host from the tile count, which the "
        "groups' sizes on the device do not give); this config has stream_k=True: use one without it, "
        "schedule='cooperative' or 'pingpong'")
    assert grouped_refusal(stand_in("fused").config) == GROUPED_EPILOGUE_REFUSAL
    assert grouped_refusal(stand_in("plain").config) == (   # nt: a column-major A
        "grouped calls take A row-major (K contiguous): a group may start at any row, and TMA cannot start a load at "
        "such a row along A's contiguous dimension; this plan's A is column-major: plan with layout='tt' and pass A "
        "row-major (A.contiguous())")


def test_an_epilogue_op_has_no_grouped_overload(python_launches_on_cpu):
    op = stand_in("fused")
    assert "grouped" not in op.op.overloads() and "grouped" in stand_in("grouped_tt").op.overloads()
    a, b, offsets = grouped_inputs(stand_in("grouped_tt"))
    assert _raise(lambda: op.grouped(a, b, offsets)) == (ValueError, f"{op.name}: {GROUPED_EPILOGUE_REFUSAL}")
    assert _raise(lambda: op.path(a, b, offsets=offsets)) == (ValueError, f"{op.name}: {GROUPED_EPILOGUE_REFUSAL}")
    assert _raise(lambda: stand_in("grouped_tt").grouped(a, b, [5, 5, 22, 40])) == (
        TypeError, "offsets must be a torch.Tensor, got list")


def test_while_a_graph_is_captured_the_python_path_skips_the_value_checks(python_launches_on_cpu, monkeypatch):
    """Capturing a CUDA graph (torch.cuda.is_current_stream_capturing()), the offsets' values are not read (a copy to
    the host): the launch goes on with them (the kernel clamps bad ends). The C++ path asks
    c10::cuda::currentStreamCaptureStatusMayInitCtx() on CUDA tensors only (the GPU tests' part)."""
    op = stand_in("grouped_tt")
    a, b, _ = grouped_inputs(op)
    bad = torch.tensor([5, 22, 17, GM + 9], dtype=torch.int32)
    assert _raise(lambda: python_grouped(op, a, b, bad))[0] is ValueError
    monkeypatch.setattr(op_module, "stream_capturing", lambda device: True)
    d, args = launched(lambda: python_grouped(op, a, b, bad))
    assert args is not None and args.group_ends == bad.data_ptr() and args.batch == 4 and d.shape == (GM, GN)
    # the other checks stay
    assert _raise(lambda: python_grouped(op, a, b, bad.long()))[0] is TypeError


# -- the masked form (op.masked: each group's rows in a slab of their own; a Python kernel, no C++ one yet) ----------

SLAB = 24


def masked_inputs(op, counts=(5, 0, 24, 17), slab=SLAB, n=GN, k=GK):
    """A (E, slab, K) row-major slabs back to back, B (E, K, N) of op's plan, and counts (int32)."""
    cfg = op.config
    a = torch.randn(len(counts), slab, k).to(TORCH_DTYPES[cfg.dtype])
    b, _ = batched_operand(k, n, cfg.layout.b.value, "packed", TORCH_DTYPES[cfg.b_dtype], batch=len(counts))
    return a, b, torch.tensor(counts, dtype=torch.int32)


@pytest.mark.parametrize("key", GROUPED)
def test_masked_calls_launch_the_grouped_kernel_over_the_slabs(python_launches_on_cpu, key):
    """GemmArgs of a masked call: A's slabs as one (E * max_m, K) matrix, the groups as the batch, group_ends the
    counts' address and group_rows the slab; D (E, max_m, N), each slab a block of one matrix in the plan's order of
    D; the method, torch.ops and the fake agree on it."""
    op = stand_in(key)
    a, b, counts = masked_inputs(op)
    groups, rows = a.shape[0], a.shape[0] * SLAB
    d, args = launched(lambda: op.masked(a, b, counts))   # (CPU tensors: the Python kernel)
    cpp, cpp_args = launched(lambda: op.op.masked.redispatch(CUDA_KEY, a, b, counts))
    python, python_args = launched(lambda: op.run_masked(a, b, counts))
    for other in (cpp, python):
        assert (other.shape, other.stride(), other.dtype) == (d.shape, d.stride(), d.dtype)
    assert args_dict(cpp_args, [cpp]) == args_dict(python_args, [python]) == args_dict(args, [d])
    row = op.config.layout.c.value == "row"
    assert (tuple(d.shape), d.dtype) == ((groups, SLAB, GN), op.out_dtype)
    assert d.stride() == ((SLAB * GN, GN, 1) if row else (SLAB, 1, rows))
    assert (args.a, args.b, args.d) == (a.data_ptr(), b.data_ptr(), d.data_ptr())
    assert (args.m, args.n, args.k, args.lda, args.ldb, args.ldd) == (
        rows, GN, GK, GK, b.stride(1 if op.config.layout.b.value == "row" else 2), line(rows, GN, "row" if row else "col"))
    assert batch_fields(args) == (groups, 0, b.stride(0), 0)
    assert (args.group_ends, args.group_rows) == (counts.data_ptr(), SLAB)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = op.op.masked(mode.from_tensor(a), mode.from_tensor(b), mode.from_tensor(counts))
    assert (tuple(fake.shape), fake.stride(), fake.dtype) == (tuple(d.shape), d.stride(), d.dtype)


MASKED_BAD = {
    "A 2-D": (lambda a, b, c: (a[0], b, c), (ValueError, "a masked call takes A 3-D (E, max_m, K)")),
    "slabs apart": (lambda a, b, c: (torch.randn(4, SLAB + 3, GK).bfloat16()[:, :SLAB], b, c),
                    (ValueError, "pass A.contiguous()")),
    "B 2-D": (lambda a, b, c: (a, b[0], c), (ValueError, "B must be 3-D (E, K, N) for a grouped call")),
    "E differs": (lambda a, b, c: (a[:3], b, c[:3]), (ValueError, "A has 3 slabs (A.size(0)) but B has 4 matrices")),
    "A float32": (lambda a, b, c: (a.float(), b, c), (TypeError, "pass A.to(torch.bfloat16)")),
    "counts stride 2": (lambda a, b, c: (a, b, torch.tensor([5, 9, 0, 9, 24, 9, 17, 9], dtype=torch.int32)[::2]),
                        (ValueError, "pass counts.contiguous()")),
    "K differs": (lambda a, b, c: (a[..., :GK - 8], b, c), (ValueError, "K must agree")),
    "counts int64": (lambda a, b, c: (a, b, c.long()), (TypeError, "pass counts.to(torch.int32)")),
    "counts 2-D": (lambda a, b, c: (a, b, c[None]), (ValueError, "counts must be 1-D (E,)")),
    "counts short": (lambda a, b, c: (a, b, c[:3]), (ValueError, "counts has 3 entries but B has 4 matrices")),
    "counts a list": (lambda a, b, c: (a, b, [5, 0, 24, 17]), (TypeError, "counts must be a torch.Tensor, got list")),
    "count past the slab": (lambda a, b, c: (a, b, torch.tensor([5, 0, SLAB + 1, 17], dtype=torch.int32)),
                            (ValueError, f"counts[2] = {SLAB + 1} is outside [0, {SLAB}]")),
    "count negative": (lambda a, b, c: (a, b, torch.tensor([-1, 0, 2, 17], dtype=torch.int32)),
                       (ValueError, f"counts[0] = -1 is outside [0, {SLAB}]")),
    "A requires grad": (lambda a, b, c: (a.requires_grad_(), b, c),
                        (RuntimeError, "masked calls have no backward pass yet, but A require(s) grad")),
}


@pytest.mark.parametrize("case", list(MASKED_BAD))
def test_masked_refusals_name_the_fix(python_launches_on_cpu, case):
    make, (kind, words) = MASKED_BAD[case]
    op = stand_in("grouped_tt")
    args = make(*masked_inputs(op))
    before = len(LAUNCHES)
    got_kind, message = _raise(lambda: op.masked(*args))
    assert got_kind is kind and words in message, message
    if case not in ("A requires grad", "counts a list"):   # (the Autograd kernel's, and the dispatcher's own words)
        assert _raise(lambda: op.op.masked.redispatch(CUDA_KEY, *args)) == _raise(lambda: op.run_masked(*args)) == (
            got_kind, message)
    assert len(LAUNCHES) == before   # refused before any launch
    _, launch_args = launched(lambda: op.masked(*masked_inputs(op)))   # and the next right call launches
    assert launch_args is not None and launch_args.group_rows == SLAB


def test_masked_plan_refusals_and_capture(python_launches_on_cpu, monkeypatch):
    """A plan whose kernels walk no groups is refused in grouped_refusal's words; an op with a fused epilogue has no
    .masked; while a CUDA graph is captured the counts' values are not read (the kernel clamps them into the slab)."""
    for key in ("sm80", "ws"):
        op = stand_in(key)
        assert _raise(lambda: op.masked(*masked_inputs(op))) == (ValueError, f"{op.name}: {grouped_refusal(op.config)}")
    fused = stand_in("fused")
    assert "masked" not in fused.op.overloads() and "masked" in stand_in("grouped_tt").op.overloads()
    assert _raise(lambda: fused.masked(*masked_inputs(stand_in("grouped_tt")))) == (
        ValueError, f"{fused.name}: {GROUPED_EPILOGUE_REFUSAL}")
    op = stand_in("grouped_tt")
    a, b, _ = masked_inputs(op)
    bad = torch.tensor([SLAB + 9, -2, 3, 4], dtype=torch.int32)
    monkeypatch.setattr(op_module, "stream_capturing", lambda device: True)
    d, args = launched(lambda: op.masked(a, b, bad))
    assert args is not None and args.group_ends == bad.data_ptr() and d.shape == (4, SLAB, GN)


def test_path_of_a_grouped_call_asks_with_the_arguments_of_its_launch(python_launches_on_cpu):
    op = stand_in("pingpong_dcol")
    a, b, offsets = grouped_inputs(op, b_mode="padded")
    PATHS_ASKED.clear()
    assert op.path(a, b, offsets=offsets) == "grouped"   # what the stand-in chooser answers for group_ends
    _, launch_args = launched(lambda: python_grouped(op, a, b, offsets))
    (asked,) = PATHS_ASKED
    core = ("a", "b", "m", "n", "k", "lda", "ldb", "ldd", "batch", "batch_stride_a", "batch_stride_b", "batch_stride_d",
            "group_ends")
    assert {f: getattr(asked, f) for f in core} == {f: getattr(launch_args, f) for f in core}
    assert batch_fields(asked) == (4, 0, b.stride(0), 0) and asked.group_ends == offsets.data_ptr()
    GROUPED_PATH[0] = -1
    try:
        assert op.path(a, b, offsets=offsets) == "none"
    finally:
        GROUPED_PATH[0] = 4
    with pytest.raises(ValueError, match="offsets has 3 group ends but B has 4 matrices"):
        op.path(a, b, offsets=offsets[1:])


def test_fake_grouped_outputs_have_the_real_shapes_and_strides(python_launches_on_cpu):
    """The fake (torch.compile's) gives D (total_M, N) in the plan's order as eager calls allocate it, whatever the
    offsets' values, and refuses what needs no data."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for key in GROUPED:
        op = stand_in(key)
        a, b, offsets = grouped_inputs(op, b_mode="padded")
        real = cpp_grouped(op, a, b, offsets)
        with FakeTensorMode() as mode:
            fake = op.op.grouped(*(mode.from_tensor(t) for t in (a, b, offsets)))
        assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype), key
    plain = stand_in("grouped_tt")
    a, b, offsets = grouped_inputs(plain)
    sm80 = stand_in("sm80")
    for op, (x, y, o), expected in [
        (sm80, grouped_inputs(sm80), (ValueError, f"{sm80.name}: {grouped_refusal(sm80.config)}")),
        (plain, (a, b, offsets[1:]), (ValueError, "offsets has 3 group ends but B has 4 matrices (B.size(0)): pass one "
                                                  "end per group")),
        (plain, (a, b, offsets.long()), (TypeError, "offsets is torch.int64; group ends are int32: pass "
                                                    "offsets.to(torch.int32)")),
        (plain, (a, b[0], offsets), (ValueError, f"{plain.name}: {grouped_k_refusal(plain.config)}")),
    ]:
        with FakeTensorMode() as mode:
            fakes = [mode.from_tensor(t) for t in (x, y, o)]
            assert _raise(lambda: op.op.grouped(*fakes)) == expected
    # B 2-D, groups along K: D (E, M, N), each matrix in the plan's order, as the eager call allocates it
    for key in GROUPED_K:
        op = stand_in(key)
        cfg = op.config
        a = stored(GN, 2 * GM, cfg.layout.a.value, TORCH_DTYPES[cfg.dtype])
        b = stored(2 * GM, GK, cfg.layout.b.value, TORCH_DTYPES[cfg.b_dtype])
        offsets = ends_of([10, 0, 70])
        real = cpp_grouped(op, a, b, offsets)
        with FakeTensorMode() as mode:
            fake = op.op.grouped(*(mode.from_tensor(t) for t in (a, b, offsets)))
        assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype), key


# -- list calls (.grouped_list: problems of their own sizes, CUTLASS's GroupedGemm): the same checks and GemmArgs ------

from generator.spec.grouped import grouped_list_refusal  # noqa: E402

#: (M, K, N) of a list call's problems: empty ones among them (no rows, no columns, K = 0), which are not launched.
LIST_SIZES = [(40, 32, 48), (1, 16, 8), (0, 32, 48), (17, 8, 0), (24, 0, 40), (33, 40, 24)]
#: The stand-in plans whose kernels take list calls: tt cooperative, pingpong with a column-major D, int8 tn (int32 D)
#: and nt pingpong (a column-major A, which list calls take, unlike grouped rows).
LISTED = ["grouped_tt", "pingpong_dcol", "int8", "list_nt"]


def padded(rows, cols, order, dtype, lead=None):
    """A rows x cols matrix stored in order whose leading dimension is ``lead`` (default: its line rounded up to 16
    elements, which keeps every dtype here on the 16-byte rule)."""
    line_ = cols if order == "row" else rows
    lead = lead if lead is not None else -(-max(line_, 1) // 16) * 16
    if order == "row":
        return torch.randn(rows, lead).to(dtype)[:, :cols]
    return torch.randn(cols, lead).to(dtype)[:, :rows].t()


def list_inputs(op, sizes=LIST_SIZES):
    """A[i] (M_i, K_i) and B[i] (K_i, N_i) of op's plan, each on the 16-byte rule."""
    cfg = op.config
    a = [padded(m, k, cfg.layout.a.value, TORCH_DTYPES[cfg.dtype]) for m, k, _ in sizes]
    b = [padded(k, n, cfg.layout.b.value, TORCH_DTYPES[cfg.b_dtype]) for _, k, n in sizes]
    return a, b


def cpp_list(op, a, b):
    return op.op.grouped_list.redispatch(CUDA_KEY, a, b)


def python_list(op, a, b):
    return op.run_grouped_list(a, b)


def problem_fields(p):
    return (p.a, p.b, p.d, p.m, p.n, p.k, p.lda, p.ldb, p.ldd)


def list_args(args, outputs):
    """A list call's GemmArgs: its problems, D's addresses replaced by which D[i] they point at; the other fields."""
    where = {t.data_ptr(): f"D[{i}]" for i, t in enumerate(outputs)}
    problems = [(*problem_fields(p)[:2], where.get(p.d, p.d), *problem_fields(p)[3:]) for p in args.problems]
    rest = {k: v for k, v in args_dict(args, outputs).items() if k != "list"}
    return problems, rest


@pytest.mark.parametrize("key", LISTED)
def test_list_calls_fill_the_gemm_args_alike_on_both_paths(python_launches_on_cpu, key):
    """A list call's GemmArgs: zeroed but for batch (the problems with work) and list, each problem's A[i], B[i],
    D[i], sizes and leading dimensions, in order; the same on the C++ kernel, the Python path, op.grouped_list and
    op(As, Bs). D[i] (M_i, N_i) in the plan's order; K_i = 0 gives zeros, no rows or columns an empty D[i]."""
    op = stand_in(key)
    orders = [o.value for o in (op.config.layout.a, op.config.layout.b, op.config.layout.c)]
    a, b = list_inputs(op)
    calls = {"cpp": lambda: cpp_list(op, a, b), "python": lambda: python_list(op, a, b),
             "method": lambda: op.grouped_list(a, b), "call": lambda: op(tuple(a), tuple(b))}
    results = {name: launched(call) for name, call in calls.items()}
    work = [i for i, (m, k, n) in enumerate(LIST_SIZES) if m and n and k]
    for name, (d, args) in results.items():
        assert isinstance(d, list) and len(d) == len(LIST_SIZES), name
        for i, (m, k, n) in enumerate(LIST_SIZES):
            strides = (torch.empty(m, n) if orders[2] == "row" else torch.empty(n, m).t()).stride()
            assert (tuple(d[i].shape), d[i].stride(), d[i].dtype) == ((m, n), strides, op.out_dtype), (name, i)
            if k == 0:
                assert torch.equal(d[i], torch.zeros(m, n, dtype=op.out_dtype)), (name, i)
        assert args.batch == len(work) and args.list and not args.list_device, name
        expected = [(a[i].data_ptr(), b[i].data_ptr(), d[i].data_ptr(), m, n, k,
                     a[i].stride(0 if orders[0] == "row" else 1), b[i].stride(0 if orders[1] == "row" else 1),
                     line(m, n, orders[2]))
                    for i, (m, k, n) in enumerate(LIST_SIZES) if i in work]
        assert [problem_fields(p) for p in args.problems] == expected, name
        zeroed = {f: getattr(args, f) for f in ("a", "b", "d", "m", "n", "k", "lda", "ldb", "ldd", "batch_stride_a",
                                                "batch_stride_b", "batch_stride_d", "group_ends", "aux", "ldaux")}
        assert not any(zeroed.values()) and not any(args.ep_ptr), (name, zeroed)
    first = list_args(results["cpp"][1], results["cpp"][0])
    assert all(list_args(args, d) == first for d, args in results.values())


def test_empty_list_calls_launch_nothing_on_both_paths(python_launches_on_cpu):
    """An empty list gives [] and no launch; a list of problems without work (no rows, no columns, K = 0) gives their
    D[i] (zeros for K = 0) and no launch; operands off the 16-byte rule are taken where they are not launched."""
    op = stand_in("grouped_tt")   # tt: A and B row-major
    off = ([padded(5, 0, "row", torch.bfloat16, lead=3)], [padded(0, 4, "row", torch.bfloat16, lead=5)])   # K = 0
    cases = {   # label -> (A, B)
        "no problems": ([], []),
        "no work": list_inputs(op, [(0, 32, 48), (17, 8, 0), (24, 0, 40)]),
        "K = 0, leading dimensions off the rule": off,
        "no rows, B's leading dimension off the rule": ([padded(0, 8, "row", torch.bfloat16)],
                                                         [padded(8, 44, "row", torch.bfloat16, lead=44)]),
    }
    for label, (a, b) in cases.items():
        for call in (cpp_list, python_list):
            d, args = launched(lambda: call(op, a, b))
            assert args is None and [tuple(t.shape) for t in d] == [(x.shape[0], y.shape[1]) for x, y in zip(a, b)]
            assert all(torch.equal(t, torch.zeros_like(t)) for t in d), label
    d, args = launched(lambda: op.grouped_list((), ()))
    assert d == [] and args is None


def _list_plan_refusal(op):
    return ValueError, f"{op.name}: {grouped_list_refusal(op.config)}"


def _swap(values, i, value):
    return [value if j == i else v for j, v in enumerate(values)]


_RULE = ("the grouped kernel loads A and B by TMA, which needs the base address, the leading dimension and the "
         "stride between B's matrices to be multiples of 16 bytes")

# label -> (stand-in plan, make (A, B) from the plan's op and good list inputs (LIST_SIZES), what both paths raise,
# or a function of the op giving it). "grouped_tt" is layout tt (A and B row-major); "list_nt" nt.
LIST_BAD = {
    "an sm80 plan for Hopper": ("sm80", lambda op, a, b: (a, b), _list_plan_refusal),
    "an sm80 plan for Ampere": ("sm80_arch80", lambda op, a, b: (a, b), _list_plan_refusal),
    "the ws schedule": ("ws", lambda op, a, b: (a, b), _list_plan_refusal),
    "stream-K": ("stream_k", lambda op, a, b: (a, b), _list_plan_refusal),
    "an sm80 plan, whatever the operands": ("sm80", lambda op, a, b: ([a[0][None]], b[:2]), _list_plan_refusal),
    "an sm80 plan, an empty list": ("sm80", lambda op, a, b: ([], []), _list_plan_refusal),
    "one B short": ("grouped_tt", lambda op, a, b: (a, b[:-1]),
                    (ValueError, "A has 6 matrices but B has 5: pass one B per A")),
    "no B": ("grouped_tt", lambda op, a, b: (a[:3], []),
             (ValueError, "A has 3 matrices but B has 0: pass one B per A")),
    "A[1] 3-D": ("grouped_tt", lambda op, a, b: (_swap(a, 1, a[1][None]), b),
                 (ValueError, "A[1] must be 2-D (M, K) for a list call: one matrix per problem; got shape (1, 1, 16)")),
    "B[0] 1-D": ("grouped_tt", lambda op, a, b: (a, _swap(b, 0, b[0][0])),
                 (ValueError, "B[0] must be 2-D (K, N) for a list call: one matrix per problem; got shape (48,)")),
    "A[1] float32": ("grouped_tt", lambda op, a, b: (_swap(a, 1, a[1].float()), b),
                     (TypeError, "A[1] is torch.float32; this plan computes bf16: pass A[1].to(torch.bfloat16) or plan "
                                 "with dtype='float32'")),
    "B[5] float16": ("grouped_tt", lambda op, a, b: (a, _swap(b, 5, b[5].half())),
                     (TypeError, "B[5] is torch.float16; this plan computes bf16: pass B[5].to(torch.bfloat16) or plan "
                                 "with dtype='float16'")),
    "int8: B[0] int32": ("int8", lambda op, a, b: (a, _swap(b, 0, b[0].int())),
                         (TypeError, "B[0] is torch.int32; this plan computes int8: pass B[0].to(torch.int8)")),
    "A[0] column-major": ("grouped_tt", lambda op, a, b: (_swap(a, 0, a[0].t().contiguous().t()), b),
                          (ValueError, "A[0] has strides (1, 40) (column-major); this plan was made for "
                                       "layout_a='row': plan with layout='nt' or pass A[0].contiguous()")),
    "nt: A[5] row-major": ("list_nt", lambda op, a, b: (_swap(a, 5, a[5].contiguous()), b),
                           (ValueError, "A[5] has strides (40, 1) (row-major); this plan was made for layout_a='col': "
                                        "plan with layout='tt' or pass A[5].t().contiguous().t() (a column-major "
                                        "copy)")),
    "B[1] on meta": ("grouped_tt", lambda op, a, b: (a, _swap(b, 1, b[1].to("meta"))),
                     (ValueError, "B[1] is on meta; this op runs on CUDA tensors: pass B[1].cuda()")),
    "K of B[5]": ("grouped_tt", lambda op, a, b: (a, _swap(b, 5, b[5][1:])),
                  (ValueError, "A[5] is (33, 40) and B[5] is (39, 24): K must agree (A[5]'s columns = B[5]'s rows); "
                               "for x @ W.t() pass B[5] = W.t()")),
    "M[1] past int32": ("grouped_tt",
                        lambda op, a, b: (_swap(a, 1, torch.empty(0, 2**31 + 1, dtype=torch.bfloat16).t()),
                                          _swap(b, 1, b[1][:0])),
                        (ValueError, "M[1]=2147483649 is larger than the kernels index (2**31 - 1): split the "
                                     "problem")),
    # the 16-byte rule of the problems with work (the kernel's TMA loads), after every other check
    "A[5]'s base address": (
        "grouped_tt", lambda op, a, b: (_swap(a, 5, torch.randn(33 * 40 + 1).bfloat16()[1:].view(33, 40)), b),
        (ValueError, f"A[5] breaks the 16-byte rule of grouped calls: its base address is 2 bytes past a multiple of "
                     f"16; {_RULE}: pass a copy, A[5].clone(memory_format=torch.contiguous_format)")),
    "A[0]'s leading dimension": (
        "grouped_tt", lambda op, a, b: (_swap(a, 0, padded(40, 32, "row", torch.bfloat16, lead=36)), b),
        (ValueError, f"A[0] breaks the 16-byte rule of grouped calls: its leading dimension is 36 elements (72 bytes); "
                     f"{_RULE}: make its leading dimension a multiple of 8 elements: pass a view of a padded buffer, "
                     "e.g. torch.empty(40, 32, dtype=torch.bfloat16, device='cpu')[:, :32]")),
    "nt: A[1]'s leading dimension": (
        "list_nt", lambda op, a, b: (_swap(a, 1, padded(1, 16, "col", torch.bfloat16, lead=4)), b),
        (ValueError, f"A[1] breaks the 16-byte rule of grouped calls: its leading dimension is 4 elements (8 bytes); "
                     f"{_RULE}: make its leading dimension a multiple of 8 elements: pass a view of a padded buffer, "
                     "e.g. torch.empty(16, 8, dtype=torch.bfloat16, device='cpu')[:, :1].t()")),
    "B[5]'s leading dimension": (
        "grouped_tt", lambda op, a, b: (a, _swap(b, 5, padded(40, 24, "row", torch.bfloat16, lead=28))),
        (ValueError, f"B[5] breaks the 16-byte rule of grouped calls: its leading dimension is 28 elements (56 bytes); "
                     f"{_RULE}: make its leading dimension a multiple of 8 elements: pass a view of a padded buffer, "
                     "e.g. torch.empty(40, 24, dtype=torch.bfloat16, device='cpu')[:, :24]")),
    "int8: A[0]'s leading dimension": (
        "int8", lambda op, a, b: (_swap(a, 0, padded(40, 32, "row", torch.int8, lead=40)), b),
        (ValueError, f"A[0] breaks the 16-byte rule of grouped calls: its leading dimension is 40 elements (40 bytes); "
                     f"{_RULE}: make its leading dimension a multiple of 16 elements: pass a view of a padded buffer, "
                     "e.g. torch.empty(40, 32, dtype=torch.int8, device='cpu')[:, :32]")),
}


@pytest.mark.parametrize("case", list(LIST_BAD))
def test_cpp_list_checks_say_what_the_python_checks_say(python_launches_on_cpu, case):
    key, make, expected = LIST_BAD[case]
    op = stand_in(key)
    a, b = make(op, *list_inputs(op))
    if callable(expected):
        expected = expected(op)
    before = len(LAUNCHES)
    cpp = _raise(lambda: cpp_list(op, a, b))
    assert cpp == _raise(lambda: python_list(op, a, b)) == expected, cpp
    if all(t.device.type == "cpu" for t in (*a, *b)):
        # the method and op(As, Bs), through the dispatcher (to the Python kernel: a meta tensor would go to the fake)
        assert _raise(lambda: op.grouped_list(a, b)) == _raise(lambda: op(a, b)) == expected
    assert len(LAUNCHES) == before   # refused before any launch
    if key in LISTED:   # the next correct call launches
        _, args = launched(lambda: cpp_list(op, *list_inputs(op)))
        assert args is not None and args.list


def test_list_refusals_name_the_fix_for_each_plan():
    """The list form's plan refusals: grouped_refusal's but A's order (each problem's maps start at its own A)."""
    for key in LISTED:
        assert grouped_list_refusal(stand_in(key).config) is None, key
    assert grouped_refusal(stand_in("list_nt").config) is not None   # (grouped rows refuse the column-major A)
    for key in ("sm80", "sm80_arch80", "ws", "fused"):
        assert grouped_list_refusal(stand_in(key).config) == grouped_refusal(stand_in(key).config), key
    assert grouped_list_refusal(stand_in("stream_k").config) == (
        "grouped calls do not split tiles by stream-K (the list's walk takes each problem's tiles whole); this config "
        "has stream_k=True: use one without it, schedule='cooperative' or 'pingpong'")


def test_list_calls_take_lists_of_tensors(python_launches_on_cpu):
    """What the dispatcher would refuse in its own words (a list of something else) is refused by op.grouped_list and
    op(As, Bs) with the fix; an op with a fused epilogue has no .grouped_list overload."""
    op = stand_in("grouped_tt")
    a, b = list_inputs(op, [(8, 16, 8), (16, 8, 16)])
    assert _raise(lambda: op.grouped_list(a[0], b)) == (
        TypeError, "A must be a list (or tuple) of torch.Tensors, one matrix per problem, got Tensor")
    assert _raise(lambda: op.grouped_list(a, {0: b[0]})) == (
        TypeError, "B must be a list (or tuple) of torch.Tensors, one matrix per problem, got dict")
    assert _raise(lambda: op.grouped_list([a[0], 3], b)) == (TypeError, "A[1] must be a torch.Tensor, got int")
    assert _raise(lambda: op(a, [b[0], None])) == (TypeError, "B[1] must be a torch.Tensor, got NoneType")
    assert _raise(lambda: op(a, b, out=a[0])) == (
        ValueError, f"{op.name}: a list call, op(As, Bs), returns a new D per problem and takes no out= or epilogue "
                    "operands: call it with the two lists alone")
    # one list: not a list call
    assert _raise(lambda: op(a[0], b)) == (TypeError, "B must be a torch.Tensor, got list")
    fused = stand_in("fused")
    assert "grouped_list" not in fused.op.overloads() and "grouped_list" in op.op.overloads()
    for call in (lambda: fused.grouped_list(a, b), lambda: fused(a, b, torch.ones(8), a[0], 1.0, 2.0),
                 lambda: fused.path(a, b)):
        assert _raise(call) == (ValueError, f"{fused.name}: {GROUPED_EPILOGUE_REFUSAL}")
    schema = str(op.op.grouped_list._schema)
    assert schema.endswith(".grouped_list(Tensor[] A, Tensor[] B) -> Tensor[]"), schema
    tags = op.op.grouped_list.tags
    assert torch.Tag.needs_fixed_stride_order in tags and torch.Tag.pt2_compliant_tag in tags
    assert "jit_runtime.cpp" in cuda_kernel_source(f"{op.namespace}::{op.name}.grouped_list")


def test_while_a_graph_is_captured_list_calls_are_refused(python_launches_on_cpu, monkeypatch):
    """Capturing a CUDA graph, a list call is refused after its checks (the library builds each problem's tensor maps
    on the host at each call); an empty list still gives []. The C++ path asks c10::cuda on CUDA tensors only (the
    GPU tests' part)."""
    op = stand_in("grouped_tt")
    a, b = list_inputs(op)
    monkeypatch.setattr(op_module, "stream_capturing", lambda device: True)
    assert _raise(lambda: python_list(op, a, b)) == (ValueError, f"{op.name}: {op_module.LIST_CAPTURE_REFUSAL}")
    assert op_module.LIST_CAPTURE_REFUSAL.endswith("call it outside the capture, or use the offsets form "
                                                   "op.grouped(A, B, offsets), whose launch is capturable")
    assert _raise(lambda: python_list(op, a, b[:-1]))[1].startswith("A has 6 matrices")   # the checks come first
    assert launched(lambda: python_list(op, [], [])) == ([], None)


def test_path_of_a_list_call_asks_with_the_arguments_of_its_launch(python_launches_on_cpu):
    op = stand_in("pingpong_dcol")
    a, b = list_inputs(op)
    PATHS_ASKED.clear()
    assert op.path(a, b) == "grouped"   # what the stand-in chooser answers for a list
    _, launch_args = launched(lambda: python_list(op, a, b))
    (asked,) = PATHS_ASKED
    assert asked.batch == launch_args.batch == 3 and not asked.group_ends
    # the same problems but for D's addresses (the path's D is its own)
    assert [problem_fields(p)[:2] + problem_fields(p)[3:] for p in asked.problems] == [
        problem_fields(p)[:2] + problem_fields(p)[3:] for p in launch_args.problems]
    GROUPED_PATH[0] = -1
    try:
        assert op.path(tuple(a), tuple(b)) == "none"
    finally:
        GROUPED_PATH[0] = 4
    PATHS_ASKED.clear()
    assert op.path([], []) == "grouped" and stand_in("sm80").path([], []) == "none" and not PATHS_ASKED
    with pytest.raises(ValueError, match="A has 6 matrices but B has 5"):
        op.path(a, b[1:])


def test_fake_list_outputs_have_the_real_shapes_and_strides(python_launches_on_cpu):
    """The fake (torch.compile's) gives each D[i] (M_i, N_i) in the plan's order as eager calls allocate it, and
    refuses what needs no data with the real call's words."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for key in LISTED:
        op = stand_in(key)
        a, b = list_inputs(op)
        real = cpp_list(op, a, b)
        with FakeTensorMode() as mode:
            fake = op.op.grouped_list([mode.from_tensor(t) for t in a], [mode.from_tensor(t) for t in b])
        assert [(t.shape, t.stride(), t.dtype) for t in fake] == [(t.shape, t.stride(), t.dtype) for t in real], key
    op = stand_in("grouped_tt")
    a, b = list_inputs(op)
    sm80 = stand_in("sm80")
    for target, (x, y) in [(sm80, list_inputs(sm80)), (op, (a, b[1:])), (op, (a, _swap(b, 5, b[5][1:]))),
                           (op, (_swap(a, 1, a[1].float()), b)), (op, (a, _swap(b, 0, b[0][0])))]:
        expected = _raise(lambda: python_list(target, x, y))
        with FakeTensorMode() as mode:
            fakes = [[mode.from_tensor(t) for t in x], [mode.from_tensor(t) for t in y]]
            assert _raise(lambda: target.op.grouped_list(*fakes)) == expected
    # meta tensors reach the C++ Meta kernel of an emitted package (tests/test_emit.py) and the fake here
    d = op.op.grouped_list([t.to("meta") for t in a], [t.to("meta") for t in b])
    assert [(tuple(t.shape), t.device.type) for t in d] == [((m, n), "meta") for m, _, n in LIST_SIZES]


# -- fp8 grouped calls with per-block scales (.grouped_scaled, .masked_scaled): both paths alike ---------------------

#: N and K of the scaled grouped calls: several 128-wide blocks of each, and a partial last one.
SN, SK = 300, 640


def scales_of(op, rows, groups, n=SN, k=SK):
    """scale_a (rows, ceil(K/128)) and scale_b (E, ceil(N/128), ceil(K/128)), fp32."""
    return (torch.rand(rows, scale_blocks(k)) + 0.5, torch.rand(groups, scale_blocks(n), scale_blocks(k)) + 0.5)


def test_scaled_grouped_calls_fill_the_scale_slots_alike_on_both_paths(python_launches_on_cpu):
    """op.grouped(A, B, offsets, scale_a, scale_b) of an fp8 plan with scale='block': the grouped call's GemmArgs
    plus the scales' slots (scale_a's address and leading dimension ceil(K/128); scale_b's address and ceil(K/128),
    its matrices back to back), on the C++ kernel, the Python path and the method; the fake gives D's shape."""
    op = stand_in("fp8_block")
    sizes = (5, 0, 17, 18)
    a, b, offsets = grouped_inputs(op, sizes, n=SN, k=SK)
    scale_a, scale_b = scales_of(op, sum(sizes), len(sizes))
    cpp, cpp_args = launched(lambda: op.op.grouped_scaled.redispatch(CUDA_KEY, a, b, offsets, scale_a, scale_b))
    python, python_args = launched(lambda: op.run_grouped_scaled(a, b, offsets, scale_a, scale_b))
    method, method_args = launched(lambda: op.grouped(a, b, offsets, scale_a, scale_b))
    assert args_dict(cpp_args, [cpp]) == args_dict(python_args, [python]) == args_dict(method_args, [method])
    assert (tuple(cpp.shape), cpp.dtype) == ((sum(sizes), SN), op.out_dtype)
    assert list(cpp_args.ep_ptr[:2]) == [scale_a.data_ptr(), scale_b.data_ptr()]
    assert list(cpp_args.ep_ld[:2]) == [scale_blocks(SK), scale_blocks(SK)]
    assert (cpp_args.group_ends, cpp_args.batch) == (offsets.data_ptr(), len(sizes))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = op.op.grouped_scaled(*(mode.from_tensor(t) for t in (a, b, offsets, scale_a, scale_b)))
    assert (tuple(fake.shape), fake.stride(), fake.dtype) == (tuple(cpp.shape), cpp.stride(), cpp.dtype)


def test_scaled_masked_calls_read_scale_a_in_the_slabs(python_launches_on_cpu):
    """op.masked(A, B, counts, scale_a, scale_b): scale_a (E, max_m, ceil(K/128)) read as its slabs' rows, the
    masked call's GemmArgs otherwise; both paths alike."""
    op = stand_in("fp8_block")
    a, b, counts = masked_inputs(op, n=SN, k=SK)
    groups = a.shape[0]
    scale_a, scale_b = scales_of(op, groups * SLAB, groups)
    scale_a = scale_a.view(groups, SLAB, -1)
    cpp, cpp_args = launched(lambda: op.op.masked_scaled.redispatch(CUDA_KEY, a, b, counts, scale_a, scale_b))
    python, python_args = launched(lambda: op.run_masked_scaled(a, b, counts, scale_a, scale_b))
    method, method_args = launched(lambda: op.masked(a, b, counts, scale_a, scale_b))
    assert args_dict(cpp_args, [cpp]) == args_dict(python_args, [python]) == args_dict(method_args, [method])
    assert list(cpp_args.ep_ptr[:2]) == [scale_a.data_ptr(), scale_b.data_ptr()]
    assert (cpp_args.group_rows, cpp_args.m) == (SLAB, groups * SLAB)


#: Bad scales of a scaled grouped call -> the refusal's start, the same on both paths.
BAD_SCALES = {
    "scale_b 2-D": (lambda sa, sb: (sa, sb[0]),
                    (ValueError, "scale_b has shape (3, 5); a grouped call's per-block scales of B are one")),
    "scale_b of another expert count": (lambda sa, sb: (sa, sb[:2]), (ValueError, "scale_b has shape (2, 3, 5)")),
    "scale_b bfloat16": (lambda sa, sb: (sa, sb.bfloat16()), (TypeError, "scale_b is torch.bfloat16; this plan's")),
    "scale_b transposed": (lambda sa, sb: (sa, sb.transpose(1, 2).contiguous().transpose(1, 2)),
                           (ValueError, "scale_b has strides (15, 1, 3); the kernel reads each group's scales of B")),
    "scale_b None": (lambda sa, sb: (sa, None), (TypeError, "scale_b must be a torch.Tensor of shape (E, ceil(N/128)")),
    "scale_a of too few rows": (lambda sa, sb: (sa[:-1], sb), (ValueError, "scale_a has shape (39, 5)")),
}


@pytest.mark.parametrize("case", BAD_SCALES)
def test_scaled_grouped_refusals_say_the_same_on_both_paths(python_launches_on_cpu, case):
    op = stand_in("fp8_block")
    sizes = (5, 0, 17, 18)
    a, b, offsets = grouped_inputs(op, sizes, n=SN, k=SK)
    make, (kind, start) = BAD_SCALES[case]
    scale_a, scale_b = make(*scales_of(op, sum(sizes), len(sizes)))
    cpp = _raise(lambda: op.op.grouped_scaled.redispatch(CUDA_KEY, a, b, offsets, scale_a, scale_b))
    python = _raise(lambda: op.run_grouped_scaled(a, b, offsets, scale_a, scale_b))
    assert cpp == python, case
    assert cpp[0] is kind and cpp[1].startswith(start), cpp


def test_which_plans_take_scales_in_grouped_calls(python_launches_on_cpu):
    """Only fp8 plans with scale='block' and nothing else have the scaled overloads; they take no list call and no
    unscaled grouped call, and a plan without scales refuses scales given to it."""
    scaled, plain, fused_fp8 = stand_in("fp8_block"), stand_in("grouped_tt"), stand_in("scaled_block")
    assert {"grouped_scaled", "masked_scaled"} <= set(scaled.op.overloads())
    assert not {"grouped", "grouped_list", "masked"} & set(scaled.op.overloads())
    assert not {"grouped_scaled", "masked_scaled"} & (set(plain.op.overloads()) | set(fused_fp8.op.overloads()))
    a, b, offsets = grouped_inputs(plain)
    assert _raise(lambda: plain.grouped(a, b, offsets, torch.ones(1), torch.ones(1)))[1].startswith(
        f"{plain.name}: this plan has no per-block scales")
    assert _raise(lambda: scaled.grouped_list([a], [b])) == (ValueError, f"{scaled.name}: {GROUPED_EPILOGUE_REFUSAL}")
    assert _raise(lambda: fused_fp8.grouped(a, b, offsets)) == (ValueError,
                                                                f"{fused_fp8.name}: {GROUPED_EPILOGUE_REFUSAL}")
    # per-tensor scales alone: the per-row plan and the scales expanded to it are named
    per_tensor = stand_in("mixed_fp8")
    kind, said = _raise(lambda: per_tensor.grouped(a, b, offsets))
    assert kind is ValueError and said == f"{per_tensor.name}: {grouped_epilogue_refusal(per_tensor.config)}"
    assert "plan scale='row'" in said and "scale_b.expand(E, N)" in said
    assert _raise(lambda: per_tensor.path(a, b, offsets=offsets)) == (kind, said)

