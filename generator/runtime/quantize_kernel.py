"""``generator.quantize``'s CUDA kernel for 1x128 blocks of rows, the activations' layout of the fp8 GEMMs with
scale="block": one pass over x (``templates/common/quantize_rows.cu``) where the torch path is about eight.

The kernel is built once per GPU architecture through the build cache (one small nvcc run, no torch headers) and
launched through ctypes: directly in eager mode, and inside a torch custom op (``gemmgen_quantize::row_blocks``)
under ``torch.compile``, which traces that. It computes what the torch path computes, bit for bit (IEEE divisions,
NaN kept as torch.amax and torch.clamp keep it). ``quantize`` uses it where it applies (``kernel_refusal``) and falls
back to torch otherwise, or, with one warning, if the kernel cannot be built.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
import warnings

import torch

from ..render import templates_dir
from ..toolchain import BuildError, BuildRequest, build

SOURCE = "common/quantize_rows.cu"
#: The columns of one scale (the kernel's kBlockColumns).
BLOCK_COLUMNS = 128
#: The kernel's InputType and Fp8Type codes.
INPUT_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
FP8_TYPES = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1}
#: Rows start on this many bytes: the kernel loads each lane's four elements in one vector load.
ROW_ALIGNMENT = 16


def kernel_refusal(x: torch.Tensor, block: tuple[int, int], fp8: torch.dtype) -> str | None:
    """Why the kernel does not take ``x`` in blocks of ``block`` (None: it does). Shapes, strides and device only, never
    values or addresses (``torch.compile`` traces with tensors that have neither): the torch path gives the same bits
    wherever the kernel would run, and the op copies a tensor whose first row is not aligned."""
    if block != (1, BLOCK_COLUMNS):
        return f"blocks of {block} (the kernel takes 1x{BLOCK_COLUMNS})"
    if x.device.type != "cuda":
        return f"x is on {x.device.type}"
    if x.dim() != 2 or x.dtype not in INPUT_TYPES or fp8 not in FP8_TYPES:
        return f"x is {x.dim()}-D {x.dtype} (the kernel takes 2-D float32, float16 or bfloat16)"
    rows, cols = x.shape
    if rows == 0:
        return "x has no rows"
    if cols == 0 or cols % BLOCK_COLUMNS:
        return f"{cols} columns (the kernel takes a positive multiple of {BLOCK_COLUMNS})"
    if x.stride(1) != 1 or (x.stride(0) * x.element_size()) % ROW_ALIGNMENT:
        return f"a row stride that is no multiple of {ROW_ALIGNMENT} bytes, or columns that are not contiguous"
    return None


class _Kernel:
    """The built library per architecture, loaded once per process, or why it is not there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._launch: dict[str, ctypes._CFuncPtr] = {}
        self._error_string: ctypes._CFuncPtr | None = None
        self.failure: str | None = None

    def launch(self, arch: str) -> ctypes._CFuncPtr | None:
        """The launch function for ``arch`` (e.g. "90"), built or found in the cache; None, with one warning, if
        it cannot be built."""
        with self._lock:
            if arch in self._launch or self.failure is not None:
                return self._launch.get(arch)
            try:
                library = build(request(arch)).library
                dll = ctypes.CDLL(str(library))
            except (BuildError, OSError) as exc:
                self.failure = str(exc)
                warnings.warn(f"gemmgen: the quantize kernel (templates/{SOURCE}) did not build; quantize() runs "
                              f"as torch operations (the same values, about eight passes over x). Why:\n{exc}",
                              RuntimeWarning, stacklevel=4)
                return None
            launch, error_string = dll["gemmgen_quantize_row_blocks"], dll["gemmgen_quantize_error_string"]
            launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_int, ctypes.c_float, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
            launch.restype = ctypes.c_int
            error_string.argtypes, error_string.restype = [ctypes.c_int], ctypes.c_char_p
            self._launch[arch], self._error_string = launch, error_string
            return launch

    def error(self, code: int) -> str:
        return self._error_string(code).decode() if self._error_string is not None else f"CUDA error {code}"


_KERNEL = _Kernel()


def request(arch: str) -> BuildRequest:
    """The kernel's build for one architecture: plain CUDA, keyed by its source."""
    source = (templates_dir() / SOURCE).read_text()
    return BuildRequest(name=f"gemmgen_quantize_sm{arch}", sources={"quantize_rows.cu": source},
                        gencode=f"-gencode=arch=compute_{arch},code=sm_{arch}", include_dirs=(str(templates_dir()),))


@functools.lru_cache(maxsize=None)
def _arch(device_index: int) -> str:
    major, minor = torch.cuda.get_device_capability(device_index)
    return f"{major}{minor}"


#: The largest finite value of each fp8 type (the kernel's fmax).
FP8_MAX = {dtype: torch.finfo(dtype).max for dtype in FP8_TYPES}


def _launch(launch: ctypes._CFuncPtr, x: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, s) of ``x`` by the built kernel's ``launch``, on the current stream of x's device."""
    rows, cols = x.shape
    if x.data_ptr() % ROW_ALIGNMENT:
        x = x.clone(memory_format=torch.contiguous_format)  # (a view into a tensor: its copy starts aligned)
    q = torch.empty((rows, cols), dtype=fp8, device=x.device)
    s = torch.empty((rows, cols // BLOCK_COLUMNS), dtype=torch.float32, device=x.device)
    index = x.device.index
    # (the common case, x on the current device, makes no device switch around the launch)
    with contextlib.nullcontext() if index == torch.cuda.current_device() else torch.cuda.device(index):
        code = _call(launch, x, q, s, fp8, torch.cuda.current_stream().cuda_stream)
    if code:
        raise RuntimeError(f"gemmgen: the quantize kernel failed to launch: {_KERNEL.error(code)}")
    return q, s


def _call(launch: ctypes._CFuncPtr, x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, fp8: torch.dtype,
          stream: int) -> int:
    rows, cols = x.shape
    return launch(x.data_ptr(), INPUT_TYPES[x.dtype], x.stride(0), q.data_ptr(), s.data_ptr(), FP8_TYPES[fp8],
                  FP8_MAX[fp8], rows, cols // BLOCK_COLUMNS, stream)


@torch.library.custom_op("gemmgen_quantize::row_blocks", mutates_args=(), device_types="cuda")
def row_blocks(x: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, s) of ``x`` in 1x128 blocks (``kernel_refusal(x, (1, 128), fp8)`` is None): q (rows, cols) in ``fp8``,
    s (rows, cols / 128) fp32. What ``torch.compile`` traces; eager calls launch directly (quantize_row_blocks)."""
    launch = _KERNEL.launch(_arch(x.device.index))
    if launch is None:  # (only under torch.compile, which traces the op without asking: quantize_row_blocks)
        raise RuntimeError(f"gemmgen: the quantize kernel did not build, so a compiled quantize() cannot run it: "
                           f"{_KERNEL.failure}")
    return _launch(launch, x, fp8)


@row_blocks.register_fake
def _row_blocks_fake(x: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x.shape
    return x.new_empty((rows, cols), dtype=fp8), x.new_empty((rows, cols // BLOCK_COLUMNS), dtype=torch.float32)


def quantize_row_blocks(x: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The kernel's (q, s) where it applies and is built, else None (the caller's torch path then runs). Eager calls
    launch the kernel directly: the custom op's dispatch cost 60-100 µs of host time per call on the H200 machines
    (gpu/quantize_timing.py), more than the kernel takes below about 16k x 7k elements."""
    if kernel_refusal(x, (1, BLOCK_COLUMNS), fp8) is not None:
        return None
    if torch.compiler.is_compiling():
        return row_blocks(x, fp8)
    launch = _KERNEL.launch(_arch(x.device.index))
    return None if launch is None else _launch(launch, x, fp8)
