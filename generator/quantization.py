"""fp8 quantization with scales, in the three layouts of scales the fp8 GEMMs take (torch, on any device).

    q, s = generator.quantize(x, "e4m3", scale="tensor")   # s: () fp32; x ~ q.float() * s
    q, s = generator.quantize(x, "e4m3", scale="row")      # s: (rows,) fp32, one per row of x
    q, s = generator.quantize(x, "e4m3", scale="block")    # s: (rows, ceil(cols / 128)), one per 1x128 block
    q, s = generator.quantize(W, "e4m3", scale="block", block=(128, 128))   # weights: one per 128x128 block
    q, s = generator.quantize(Ws, "e4m3", scale="block", block=(128, 128))  # experts' (E, N, K): s (E, N/128, K/128)

A scale is the dequantizing factor (``torch._scaled_mm``'s convention): each block's largest magnitude maps to
the format's largest finite value (448 for e4m3, 57344 for e5m2), so ``q.float() * s`` (each scale spread over
its block) gives x back to the format's precision: e4m3 keeps 3 mantissa bits, e5m2 2. For an A @ B with
B = W.t(), quantize A by row or by (1, 128) block, and W by row (one scale per column of B) or by (128, 128)
block, as DeepGEMM lays them out. An all-zero block gets a tiny scale and quantizes to zeros.

Torch operations, with two exceptions: a CUDA matrix in 1x128 blocks (the activations' layout) or by rows goes
through a kernel of its own, one pass over x (two, the second from cache, by rows) instead of two to eight and an
fp32 copy, with the same bits (``generator.runtime.quantize_kernel``).
Planning does not need this module, and ``generator`` imports it when ``generator.quantize`` is first used.
"""
from __future__ import annotations

import math

import torch

__all__ = ["FP8_DTYPES", "SCALE_MODES", "dequantize", "quantize"]

#: The fp8 formats, by the names a plan uses and torch's.
FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
SCALE_MODES = ("tensor", "row", "block")
# The smallest magnitude a block's scale is taken from: an all-zero block keeps a finite, nonzero scale.
_TINY_AMAX = torch.finfo(torch.float32).tiny


def _fp8_dtype(dtype: object) -> torch.dtype:
    for name, fp8 in FP8_DTYPES.items():
        if dtype in (name, fp8, str(fp8), str(fp8).removeprefix("torch.")):
            return fp8
    raise ValueError(f"dtype={dtype!r} is not an fp8 format: use 'e4m3' (torch.float8_e4m3fn) or 'e5m2' "
                     "(torch.float8_e5m2)")


def _block_shape(scale: str, block: tuple[int, int] | None, x: torch.Tensor) -> tuple[int, int] | None:
    """The (rows, cols) a scale covers, None for one scale for the whole tensor."""
    if scale not in SCALE_MODES:
        raise ValueError(f"scale={scale!r}: use 'tensor' (one scale), 'row' (one per row) or 'block' (one per "
                         "block, 1x128 by default)")
    if scale != "block" and block is not None:
        raise ValueError(f"block={block!r} goes with scale='block' only")
    if scale == "tensor":
        return None
    if x.dim() != 2:
        raise ValueError(f"scale={scale!r} takes a 2-D tensor (rows, cols); got shape {tuple(x.shape)}: "
                         "reshape it, e.g. x.reshape(-1, x.shape[-1])")
    if scale == "row":
        return 1, max(x.shape[1], 1)
    rows, cols = (1, 128) if block is None else block
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (rows, cols)):
        raise ValueError(f"block={block!r} must be two positive ints (rows, cols), e.g. (1, 128) or (128, 128)")
    return rows, cols


def _check_input(x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point() or x.dtype in FP8_DTYPES.values():
        raise TypeError(f"x is {x.dtype}; quantize takes a float16, bfloat16 or float32 tensor: pass x.float()")
    return x


def _each_matrix(quantize_one, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, s) of a batch of matrices, each quantized by ``quantize_one``, stacked (an empty batch: empty q and s of
    the shapes one matrix would give)."""
    parts = [quantize_one(matrix) for matrix in x]
    if not parts:
        q, s = quantize_one(x.new_zeros(x.shape[1:]))
        return q.new_empty((0, *q.shape)), s.new_empty((0, *s.shape))
    return torch.stack([q for q, _ in parts]), torch.stack([s for _, s in parts])


def _spread(s: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    """Each block's scale repeated over the block's elements, cropped to ``shape``."""
    rows, cols = block
    return s.repeat_interleave(rows, 0).repeat_interleave(cols, 1)[: shape[0], : shape[1]]


def _block_amax(xf: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The largest magnitude of each (rows x cols) block of a 2-D tensor; ragged edge blocks included."""
    rows, cols = block
    m, n = xf.shape
    mb, nb = math.ceil(m / rows), math.ceil(n / cols)
    padded = torch.nn.functional.pad(xf.abs(), (0, nb * cols - n, 0, mb * rows - m))
    return padded.view(mb, rows, nb, cols).amax(dim=(1, 3))


def _quantize_row_blocks(xf: torch.Tensor, cols: int, fp8: torch.dtype, fmax_t: torch.Tensor,
                         per_row: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize() of blocks of one row and ``cols`` columns that tile the rows exactly (activations' 1x128 blocks, or
    whole rows): the same values and scales as the general path, from a view of the blocks instead of scales spread
    over a padded copy (two passes over x instead of about six)."""
    rows = xf.shape[0]
    blocks = xf.reshape(rows, -1, cols)
    s = blocks.abs().amax(dim=-1).clamp_min(_TINY_AMAX) / fmax_t
    q = (blocks / s[..., None]).clamp(-fmax_t, fmax_t).to(fp8).reshape(rows, -1)
    return q, (s[:, 0] if per_row else s)


def quantize(x: torch.Tensor, dtype: object = "e4m3", scale: str = "tensor",
             block: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, s): ``x`` in fp8 (``dtype``: 'e4m3' or 'e5m2', or the torch dtype) and its fp32 scales, ``x ~ q * s``.

    ``scale``: 'tensor' (s has shape ()), 'row' (s: (rows,)), or 'block' (s: (ceil(rows / br), ceil(cols / bc))
    for ``block=(br, bc)``, default (1, 128); (1, 128) gives (rows, ceil(cols / 128))). See the module
    docstring. A 3-D ``x`` with scale 'row' or 'block' is a batch of matrices (a mixture of experts' weights,
    (E, N, K)), each quantized on its own: s gets the batch dimension first, (E, ...), as the grouped fp8 calls
    take it."""
    x = _check_input(x)
    if x.dim() == 3 and scale in ("row", "block"):
        return _each_matrix(lambda matrix: quantize(matrix, dtype, scale, block), x)
    fp8 = _fp8_dtype(dtype)
    covered = _block_shape(scale, block, x)
    fmax = torch.finfo(fp8).max
    if scale != "tensor" and x.is_cuda:
        # (imported here: the runtime and its build cache only where a CUDA tensor is quantized)
        from .runtime.quantize_kernel import quantize_on_gpu
        fused = quantize_on_gpu(x, fp8, scale, covered)
        if fused is not None:
            return fused
    xf = x.float()
    # Divided by a tensor on x's device: torch divides by a Python number as a multiplication by its reciprocal on
    # CUDA (not on the CPU), which differs in the last bit; a tensor's division is IEEE's on both, as the GEMM's
    # quantized output computes it (templates/sm90/gemm_kernel.cuh quantize_out).
    fmax_t = torch.full((), fmax, dtype=torch.float32, device=xf.device)
    if covered is not None and covered[0] == 1 and x.shape[1] % covered[1] == 0 and x.shape[1] > 0:
        return _quantize_row_blocks(xf, covered[1], fp8, fmax_t, scale == "row")
    if covered is None:
        s = xf.abs().amax().clamp_min(_TINY_AMAX) / fmax_t
        spread = s
    else:
        s = _block_amax(xf, covered).clamp_min(_TINY_AMAX) / fmax_t
        spread = _spread(s, covered, x.shape)
        if scale == "row":
            s = s[:, 0]
    q = (xf / spread).clamp(-fmax, fmax).to(fp8)
    return q, s


def dequantize(q: torch.Tensor, s: torch.Tensor, scale: str = "tensor",
               block: tuple[int, int] | None = None) -> torch.Tensor:
    """``q * s`` in fp32, each scale spread over its block: the inverse of ``quantize`` up to fp8 rounding (a 3-D
    ``q`` with scale 'row' or 'block': each matrix with its own scales, ``s`` (E, ...))."""
    if isinstance(q, torch.Tensor) and q.dim() == 3 and scale in ("row", "block"):
        return torch.stack([dequantize(matrix, scales, scale, block) for matrix, scales in zip(q, s)]) if len(q) \
            else q.float()
    covered = _block_shape(scale, block, q)
    qf = q.float()
    if covered is None:
        return qf * s
    if scale == "row":
        s = s[:, None]
    return qf * _spread(s, covered, q.shape)
