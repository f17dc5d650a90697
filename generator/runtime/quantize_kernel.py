"""``generator.quantize``'s CUDA kernels for rows of a matrix (``templates/common/quantize_rows.cu``): in 1x128 blocks,
the activations' layout of the fp8 GEMMs with scale="block" (one pass over x), and by whole rows, the rowwise scales
of ``torch._scaled_mm`` and scale="row" (x read twice, the second time from cache), where the torch path is two to
eight passes over x and an fp32 copy of it.

The kernels are built once per GPU architecture through the build cache (one small nvcc run, no torch headers) and
launched through ctypes: directly in eager mode, and inside torch custom ops (``gemmgen_quantize::row_blocks`` and
``gemmgen_quantize::rows``) under ``torch.compile``, which traces those. They compute what the torch path computes,
bit for bit (IEEE divisions, NaN kept as torch.amax and torch.clamp keep it). ``quantize`` uses them where they apply
(``kernel_refusal``) and falls back to torch otherwise, or, with one warning, if the kernels cannot be built.
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
#: The columns of one scale in the block kernel (the kernel's kBlockColumns).
BLOCK_COLUMNS = 128
#: The kernel's InputType and Fp8Type codes.
INPUT_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
FP8_TYPES = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1}
#: Each lane loads this many neighbouring elements in one vector load (8 bytes of 16-bit input, 16 of fp32), so rows
#: start on a multiple of it; the row kernel's columns come in multiples of it too (its fp8 stores are whole words).
VECTOR_ELEMENTS = 4
#: The row kernel runs one CTA per row, in a grid of at most this many.
MAX_ROWS = 2**31 - 1
#: The scale modes the kernels take: "block" (1x128 blocks) and "row" (whole rows).
SCALES = ("block", "row")


def kernel_refusal(x: torch.Tensor, fp8: torch.dtype, scale: str = "block",
                   block: tuple[int, int] | None = None) -> str | None:
    """Why no kernel takes ``x`` quantized by ``scale`` ('block' with ``block`` (1, 128), the default, or 'row'; None:
    one does). Shapes, strides and device only, never values or addresses (``torch.compile`` traces with tensors that
    have neither): the torch path gives the same bits wherever a kernel would run, and the op copies a tensor whose
    first row is not aligned."""
    if scale not in SCALES:
        return f"scale={scale!r} (the kernels take 'block' and 'row')"
    if scale == "block" and block not in (None, (1, BLOCK_COLUMNS)):
        return f"blocks of {block} (the kernel takes 1x{BLOCK_COLUMNS})"
    if x.device.type != "cuda":
        return f"x is on {x.device.type}"
    if x.dim() != 2 or x.dtype not in INPUT_TYPES or fp8 not in FP8_TYPES:
        return f"x is {x.dim()}-D {x.dtype} (the kernel takes 2-D float32, float16 or bfloat16)"
    rows, cols = x.shape
    if rows == 0:
        return "x has no rows"
    multiple = BLOCK_COLUMNS if scale == "block" else VECTOR_ELEMENTS
    if cols == 0 or cols % multiple:
        return f"{cols} columns (the kernel takes a positive multiple of {multiple})"
    if scale == "row" and rows > MAX_ROWS:
        return f"{rows} rows (the row kernel takes at most {MAX_ROWS})"
    if x.stride(1) != 1 or x.stride(0) % VECTOR_ELEMENTS:
        return f"a row stride that is no multiple of {VECTOR_ELEMENTS} elements, or columns that are not contiguous"
    return None


#: The library's launch function per scale mode.
LAUNCH_SYMBOLS = {"block": "gemmgen_quantize_row_blocks", "row": "gemmgen_quantize_rows"}


class _Kernel:
    """The built library per architecture, loaded once per process, or why it is not there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._launch: dict[str, dict[str, ctypes._CFuncPtr]] = {}
        self._error_string: ctypes._CFuncPtr | None = None
        self.failure: str | None = None

    def launch(self, arch: str) -> dict[str, ctypes._CFuncPtr] | None:
        """The launch functions for ``arch`` (e.g. "90") by scale mode, built or found in the cache; None, with one
        warning, if they cannot be built."""
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
            launches = {scale: dll[symbol] for scale, symbol in LAUNCH_SYMBOLS.items()}
            for launch in launches.values():  # (both: x, type, ld_x, q, s, fp8, fmax, rows, blocks or cols, stream)
                launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_int, ctypes.c_float, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
                launch.restype = ctypes.c_int
            error_string = dll["gemmgen_quantize_error_string"]
            error_string.argtypes, error_string.restype = [ctypes.c_int], ctypes.c_char_p
            self._launch[arch], self._error_string = launches, error_string
            return launches

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


def _empty_outputs(x: torch.Tensor, fp8: torch.dtype, scale: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q (rows, cols) in ``fp8`` and s fp32, (rows, cols / 128) by blocks or (rows,) by rows, on x's device (fake
    tensors for a fake x)."""
    rows, cols = x.shape
    s_shape = (rows, cols // BLOCK_COLUMNS) if scale == "block" else (rows,)
    return x.new_empty((rows, cols), dtype=fp8), x.new_empty(s_shape, dtype=torch.float32)


def _launch(launches: dict[str, ctypes._CFuncPtr], x: torch.Tensor, fp8: torch.dtype,
            scale: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, s) of ``x`` by the built kernel of ``scale``, on the current stream of x's device."""
    if x.data_ptr() % (VECTOR_ELEMENTS * x.element_size()):
        x = x.clone(memory_format=torch.contiguous_format)  # (a view into a tensor: its copy starts aligned)
    q, s = _empty_outputs(x, fp8, scale)
    index = x.device.index
    # (the common case, x on the current device, makes no device switch around the launch)
    with contextlib.nullcontext() if index == torch.cuda.current_device() else torch.cuda.device(index):
        code = _call(launches[scale], x, q, s, fp8, scale, torch.cuda.current_stream().cuda_stream)
    if code:
        raise RuntimeError(f"gemmgen: the quantize kernel failed to launch: {_KERNEL.error(code)}")
    return q, s


def _call(launch: ctypes._CFuncPtr, x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, fp8: torch.dtype, scale: str,
          stream: int) -> int:
    rows, cols = x.shape
    return launch(x.data_ptr(), INPUT_TYPES[x.dtype], x.stride(0), q.data_ptr(), s.data_ptr(), FP8_TYPES[fp8],
                  FP8_MAX[fp8], rows, cols // BLOCK_COLUMNS if scale == "block" else cols, stream)


def _traced(x: torch.Tensor, fp8: torch.dtype, scale: str) -> tuple[torch.Tensor, torch.Tensor]:
    """What the custom ops run (torch.compile's path); eager calls launch directly (quantize_on_gpu)."""
    launches = _KERNEL.launch(_arch(x.device.index))
    if launches is None:  # (only under torch.compile, which traces the op without asking: quantize_on_gpu)
        raise RuntimeError(f"gemmgen: the quantize kernel did not build, so a compiled quantize() cannot run it: "
                           f"{_KERNEL.failure}")
    return _launch(launches, x, fp8, scale)


@torch.library.custom_op("gemmgen_quantize::row_blocks", mutates_args=(), device_types="cuda")
def row_blocks(x: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, s) of ``x`` in 1x128 blocks (``kernel_refusal(x, fp8, "block")`` is None): q (rows, cols) in ``fp8``,
    s (rows, cols / 128) fp32."""
    return _traced(x, fp8, "block")


@row_blocks.register_fake
def _row_blocks_fake(x: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return _empty_outputs(x, fp8, "block")


@torch.library.custom_op("gemmgen_quantize::rows", mutates_args=(), device_types="cuda")
def rows(x: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, s) of ``x`` by whole rows (``kernel_refusal(x, fp8, "row")`` is None): q (rows, cols) in ``fp8``, s (rows,)
    fp32."""
    return _traced(x, fp8, "row")


@rows.register_fake
def _rows_fake(x: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return _empty_outputs(x, fp8, "row")


_CUSTOM_OPS = {"block": row_blocks, "row": rows}


def quantize_on_gpu(x: torch.Tensor, fp8: torch.dtype, scale: str,
                    block: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A kernel's (q, s) of ``x`` by ``scale`` ('block' in 1x128 blocks, or 'row') where one applies and is built,
    else None (the caller's torch path then runs). Eager calls launch the kernel directly: a custom op's dispatch
    cost 60-100 µs of host time per call on the H200 machines (gpu/quantize_timing.py), more than the kernel takes
    below about 16k x 7k elements."""
    if kernel_refusal(x, fp8, scale, block) is not None:
        return None
    if torch.compiler.is_compiling():
        return _CUSTOM_OPS[scale](x, fp8)
    launches = _KERNEL.launch(_arch(x.device.index))
    return None if launches is None else _launch(launches, x, fp8, scale)
