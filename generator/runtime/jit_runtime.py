"""The JIT runtime: one small torch C++ library that gives every JIT-built op a C++ CUDA kernel.

A kernel library has no torch headers (one nvcc run per kernel, see ``generator.toolchain``), so from
Python it is called through ctypes. That path costs 20-30 us of host time per call (the dispatcher's
Python kernel, the argument checks in Python, ctypes), about twice what ``torch.matmul`` costs. This
module builds ``templates/torch/jit_runtime.cpp`` once per torch version and compiler (through the same
build cache, in the same ninja run as the first kernels) and, for every kernel library loaded, registers
the checks and launch of ``templates/torch/gemm_op.h`` (the code of the emitted packages) as the op's
CUDA kernel: unboxed for a plain op, boxed for one with a fused epilogue (its operands and second output
are described in the ``JitOpSpec``). Python keeps the schema, the fake implementation, the autograd formula
and the kernels of the other dispatch keys (``generator.runtime``).

If the runtime cannot be built (no C++ compiler that can read torch's headers), the ops still work
through the Python path, with a warning that says why and what it costs.
"""
from __future__ import annotations

import ctypes
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..toolchain import BuildError, BuildRequest, build
from ..planner.backward import autograd_form
from ..render import templates_dir
from ..spec.config import QUANT_BLOCK, KernelConfig, quantizes_out, second_output
from ..spec.grouped import grouped_list_refusal, grouped_refusal
from ..spec.epilogue import KINDS, BiasActivation, Epilogue
from ..spec.types import Order
from .checks import other_layout
from .handle import OpHandle
from .library import KernelLibrary

#: The runtime's source under templates/ and the name of its library in the build cache.
SOURCE = "torch/jit_runtime.cpp"
NAME = "gemmgen_jit_runtime"
ERROR_BUFFER_BYTES = 4096


class JitOperandSpec(ctypes.Structure):
    """Mirror of ``JitOperandSpec`` in templates/torch/jit_runtime.cpp: one operand of a fused epilogue."""

    _fields_ = [("kind", ctypes.c_int), ("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p), ("row", ctypes.c_int)]


class JitOpSpec(ctypes.Structure):
    """Mirror of ``JitOpSpec`` in templates/torch/jit_runtime.cpp."""

    _fields_ = [("ns", ctypes.c_char_p), ("op", ctypes.c_char_p), ("kernel", ctypes.c_char_p),
                ("arch", ctypes.c_int), ("dtype", ctypes.c_char_p), ("out_dtype", ctypes.c_char_p),
                ("a_row", ctypes.c_int), ("b_row", ctypes.c_int), ("d_row", ctypes.c_int),
                ("layout_a_flipped", ctypes.c_char_p), ("layout_b_flipped", ctypes.c_char_p),
                ("launch", ctypes.c_void_p), ("error_string", ctypes.c_void_p),
                ("num_operands", ctypes.c_int), ("operands", ctypes.POINTER(JitOperandSpec)),
                ("aux", ctypes.c_int), ("device_type", ctypes.c_int), ("dtype_b", ctypes.c_char_p),
                ("grouped_refusal", ctypes.c_char_p), ("grouped_list_refusal", ctypes.c_char_p),
                ("num_buckets", ctypes.c_int), ("bucket_rows", ctypes.POINTER(ctypes.c_longlong)),
                ("bucket_launch", ctypes.POINTER(ctypes.c_void_p)),
                ("bucket_error_string", ctypes.POINTER(ctypes.c_void_p)),
                ("bucket_kernel", ctypes.POINTER(ctypes.c_char_p)), ("quant_block", ctypes.c_int),
                ("amax", ctypes.c_int)]


#: gemmgen::OperandKind in templates/torch/gemm_op.h: the index of each kind in generator.spec.epilogue.KINDS.
OPERAND_KINDS = {kind: i for i, kind in enumerate(KINDS)}
#: c10::DeviceType of the tensors an op's kernels take (GemmOp.device_type): CUDA, or the tests' CPU stand-in.
DEVICE_TYPES = {"cpu": 0, "cuda": 1}


def operand_specs(epilogue: Epilogue) -> ctypes.Array:
    """The epilogue's operands as JitOperandSpecs, in the op's schema order (its dtypes resolved)."""
    specs = (JitOperandSpec * max(len(epilogue.operands), 1))()
    for spec, op in zip(specs, epilogue.operands):
        spec.kind, spec.name, spec.dtype = OPERAND_KINDS[op.kind], op.name.encode(), op.dtype.value.encode()
        spec.row = int(op.order is not Order.col)
    return specs


class JitAutogradSpec(ctypes.Structure):
    """Mirror of ``JitAutogradSpec`` in templates/torch/jit_runtime.cpp. Index 0 of each pair: a
    row-major dD; 1: column-major."""

    _fields_ = [("ns", ctypes.c_char_p), ("op", ctypes.c_char_p), ("dtype", ctypes.c_char_p),
                ("grad_a", ctypes.c_char_p * 2), ("grad_b", ctypes.c_char_p * 2),
                ("grad_a_b_row", ctypes.c_int * 2), ("grad_b_a_row", ctypes.c_int * 2),
                ("grad_a_transposed", ctypes.c_int * 2), ("grad_b_transposed", ctypes.c_int * 2),
                ("activation", ctypes.c_int), ("bias", ctypes.c_char_p), ("saving", ctypes.c_char_p),
                ("accumulator", ctypes.c_char_p)]


#: gemmgen::Activation in templates/torch/gemm_autograd.h: the activations of Epilogue.bias_activation.
ACTIVATION_CODES = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}


@dataclass(frozen=True)
class LinearEpilogueOps:
    """What the C++ formula of an op computing activation(acc + bias) needs beyond a plain op's (gemm_autograd.h
    LinearEpilogueSpec): the form, and the names of the ops it calls in the op's namespace."""

    form: BiasActivation
    saving: str | None        # the same kernel also writing acc (planner.backward.saving_config), or None
    accumulator: str | None   # the plain fp32 op recomputing acc (accumulator_config); None without an activation


def torch_flags() -> tuple[str, ...]:
    """nvcc flags to compile and link C++ against the installed torch (what torch.utils.cpp_extension
    would add, without importing it): its headers, its C++ ABI, its libraries and an rpath to them."""
    root = Path(torch.__file__).resolve().parent
    lib = root / "lib"
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    return (f"-I{root / 'include'}", f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-L{lib}", "-lc10", "-ltorch_cpu", "-lc10_cuda",
            f"-Xlinker=-rpath={lib}",
            # a compiler that links its C++ runtime statically would otherwise export it beside torch's
            "-Xlinker=--exclude-libs,ALL")


def runtime_request() -> BuildRequest:
    """The runtime's build: host C++ only (no gencode), keyed by its source, the headers and torch.
    C++20, as torch builds its extensions (its headers need it from torch 2.12 on)."""
    source = (templates_dir() / SOURCE).read_text()
    return BuildRequest(name=NAME, sources={Path(SOURCE).name: source}, gencode="",
                        include_dirs=(str(templates_dir()),), extra_flags=torch_flags(), cxx_std="c++20")


class _Runtime:
    """The loaded runtime, or why there is none. One per process: it is a loaded library, like the
    torch registrations it makes (see ``generator.runtime.registration._LIBRARIES``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._register: ctypes._CFuncPtr | None = None
        self._register_autograd: ctypes._CFuncPtr | None = None
        self.failure: str | None = None

    def load(self, library: Path) -> None:
        """Load the built runtime (idempotent)."""
        with self._lock:
            if self._register is None:
                dll = ctypes.CDLL(str(library))
                register, register_autograd = dll["gemmgen_register_cuda_kernels"], dll["gemmgen_register_autograd"]
                register.argtypes = [ctypes.POINTER(JitOpSpec), ctypes.c_char_p, ctypes.c_size_t]
                register_autograd.argtypes = [ctypes.POINTER(JitAutogradSpec), ctypes.c_char_p, ctypes.c_size_t]
                register.restype = register_autograd.restype = ctypes.c_int
                self._register, self._register_autograd = register, register_autograd
                self.failure = None

    def fail(self, reason: str) -> None:
        with self._lock:
            if self._register is None and self.failure is None:
                self.failure = reason
                warnings.warn(f"gemmgen: the JIT runtime (templates/{SOURCE}) did not build, so JIT ops are "
                              f"called through Python and ctypes (about 20 us more host time per call); "
                              f"results are the same. Why:\n{reason}", RuntimeWarning, stacklevel=3)

    def wanted(self) -> bool:
        """Whether the runtime is still to be built: neither loaded nor failed."""
        return self._register is None and self.failure is None

    def ensure(self) -> bool:
        """Build (or find in the cache) and load the runtime; False, with one warning, if that fails."""
        if self._register is not None:
            return True
        if self.failure is not None:
            return False
        try:
            self.load(build(runtime_request()).library)
        except (BuildError, OSError, AttributeError) as exc:
            self.fail(str(exc))
            return False
        return True

    def register(self, op: OpHandle, library: KernelLibrary,
                 buckets: Sequence[tuple[int, str, KernelLibrary]] = ()) -> bool:
        """Register ``library`` as ``op``'s CUDA kernel (both overloads); False if there is no runtime.

        An op with a fused epilogue gets the boxed kernels of gemm_op.h, told its operands (kind, name, dtype,
        order) and whether it has a second output; its schema must be defined already (it is checked). A plain
        op's .grouped and .grouped_list overloads get their kernels too, told why the plan takes no such call where it
        does not. ``buckets``: (most rows, kernel name, library) of the kernels that calls of up to that many rows
        take instead of ``library``'s, bounds increasing (an op over an M-bucketed op's kernels)."""
        if not self.ensure():
            return False
        cfg = op.config
        operands = operand_specs(cfg.epilogue)
        count = max(len(buckets), 1)   # (ctypes arrays of length 0 are not pointers)
        rows = (ctypes.c_longlong * count)(*(bound for bound, _, _ in buckets))
        launches = (ctypes.c_void_p * count)(*(ctypes.cast(lib.launch, ctypes.c_void_p).value
                                               for _, _, lib in buckets))
        errors = (ctypes.c_void_p * count)(*(ctypes.cast(lib.error_string, ctypes.c_void_p).value
                                             for _, _, lib in buckets))
        kernels = (ctypes.c_char_p * count)(*(name.encode() for _, name, _ in buckets))
        spec = JitOpSpec(
            ns=op.namespace.encode(), op=op.name.encode(), kernel=cfg.name.encode(), arch=cfg.arch,
            dtype=cfg.dtype.value.encode(), out_dtype=cfg.out_dtype.value.encode(),
            a_row=int(cfg.layout.a.value == "row"), b_row=int(cfg.layout.b.value == "row"),
            d_row=int(cfg.layout.c.value == "row"),
            layout_a_flipped=other_layout(cfg.layout.blas, "A").encode(),
            layout_b_flipped=other_layout(cfg.layout.blas, "B").encode(),
            launch=ctypes.cast(library.launch, ctypes.c_void_p).value,
            error_string=ctypes.cast(library.error_string, ctypes.c_void_p).value,
            num_operands=len(cfg.epilogue.operands), operands=operands, aux=int(second_output(cfg) is not None),
            device_type=DEVICE_TYPES[op.device_type],
            dtype_b=cfg.dtype_b.value.encode() if cfg.dtype_b is not None else None,
            # why the plan takes no grouped call (an op with an epilogue has no .grouped overload: none)
            grouped_refusal=(grouped_refusal(cfg) or "").encode() if cfg.epilogue.is_identity else None,
            grouped_list_refusal=(grouped_list_refusal(cfg) or "").encode() if cfg.epilogue.is_identity else None,
            num_buckets=len(buckets), bucket_rows=rows, bucket_launch=launches, bucket_error_string=errors,
            bucket_kernel=kernels, quant_block=QUANT_BLOCK if quantizes_out(cfg) else 0, amax=int(cfg.amax))
        _call(self._register, spec, f"registering the CUDA kernel of {op.namespace}::{op.name}")
        return True

    def register_autograd(self, op: OpHandle, configs: dict[Order, tuple[KernelConfig, KernelConfig]],
                          epilogue: LinearEpilogueOps | None = None) -> bool:
        """Register gemm_autograd.h's formula as ``op``'s Autograd kernel (and .out's refusal of grad),
        with ``configs``, the (dA, dB) kernels of ``generator.planner.backward`` per storage order of dD; False
        if there is no runtime. ``epilogue``: an op computing activation(acc + bias) takes that closed form (its
        default overload only: .out's refusal stays the caller's)."""
        if not self.ensure():
            return False
        forms = [autograd_form(op.config, *configs[order]) for order in (Order.row, Order.col)]
        form = epilogue.form if epilogue is not None else BiasActivation(None, None)
        spec = JitAutogradSpec(
            ns=op.namespace.encode(), op=op.name.encode(), dtype=op.config.dtype.value.encode(),
            grad_a=(ctypes.c_char_p * 2)(*(configs[order][0].name.encode() for order in (Order.row, Order.col))),
            grad_b=(ctypes.c_char_p * 2)(*(configs[order][1].name.encode() for order in (Order.row, Order.col))),
            grad_a_b_row=(ctypes.c_int * 2)(*(int(f.a_b_row) for f in forms)),
            grad_b_a_row=(ctypes.c_int * 2)(*(int(f.b_a_row) for f in forms)),
            grad_a_transposed=(ctypes.c_int * 2)(*(int(f.a_transposed) for f in forms)),
            grad_b_transposed=(ctypes.c_int * 2)(*(int(f.b_transposed) for f in forms)),
            activation=ACTIVATION_CODES[form.activation], bias=_encoded(form.bias),
            saving=_encoded(epilogue and epilogue.saving), accumulator=_encoded(epilogue and epilogue.accumulator))
        _call(self._register_autograd, spec, f"registering the autograd formula of {op.namespace}::{op.name}")
        return True


def _encoded(name: str | None) -> bytes | None:
    return name.encode() if name is not None else None


def _call(register: ctypes._CFuncPtr, spec: ctypes.Structure, what: str) -> None:
    error = ctypes.create_string_buffer(ERROR_BUFFER_BYTES)
    if register(ctypes.byref(spec), error, ERROR_BUFFER_BYTES) != 0:
        raise RuntimeError(f"gemmgen JIT runtime: {what} failed: {error.value.decode(errors='replace')}")


RUNTIME = _Runtime()
