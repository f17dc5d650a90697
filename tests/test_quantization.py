"""generator.quantize / dequantize: fp8 with per-tensor, per-row and per-block scales (CPU; torch only)."""
from __future__ import annotations

import math
import re

import pytest

torch = pytest.importorskip("torch")

import generator  # noqa: E402
from generator.quantization import FP8_DTYPES  # noqa: E402

#: ||dequantize(quantize(x)) - x|| / ||x|| for Gaussian x: half an ulp of 3 (e4m3) or 2 (e5m2) mantissa bits
#: bounds each element's relative error by 2^-4 or 2^-3; norm-wise it is a third of that or less.
ROUND_TRIP = {"e4m3": 0.035, "e5m2": 0.07}
MODES = [("tensor", None), ("row", None), ("block", None), ("block", (128, 128)), ("block", (2, 64))]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("dtype", list(FP8_DTYPES))
@pytest.mark.parametrize("scale, block", MODES)
@pytest.mark.parametrize("shape", [(7, 300), (130, 129), (1, 1)])
def test_round_trip_and_scale_shapes(dtype, scale, block, shape):
    x = torch.randn(shape, dtype=torch.bfloat16) * 3.0
    q, s = generator.quantize(x, dtype, scale=scale, block=block)
    assert q.dtype == FP8_DTYPES[dtype] and q.shape == x.shape and s.dtype == torch.float32
    rows, cols = shape
    br, bc = block or (1, 128)
    want = {"tensor": (), "row": (rows,), "block": (math.ceil(rows / br), math.ceil(cols / bc))}[scale]
    assert tuple(s.shape) == want
    y = generator.dequantize(q, s, scale=scale, block=block)
    assert rel(y, x.float()) <= ROUND_TRIP[dtype]


@pytest.mark.parametrize("dtype", list(FP8_DTYPES))
def test_each_blocks_largest_magnitude_maps_to_the_formats_largest_value(dtype):
    x = torch.randn(64, 256)
    q, s = generator.quantize(x, dtype, scale="block")
    fmax = torch.finfo(FP8_DTYPES[dtype]).max
    amax = q.float().abs().view(64, 2, 128).amax(dim=2)
    assert torch.equal(amax, torch.full_like(amax, fmax))
    torch.testing.assert_close(s, x.abs().view(64, 2, 128).amax(dim=2) / fmax)


def test_zero_blocks_quantize_to_zeros_with_a_finite_scale():
    x = torch.randn(4, 256)
    x[1] = 0
    x[:, 128:] = 0
    for scale in ("row", "block"):
        q, s = generator.quantize(x, "e4m3", scale=scale)
        assert torch.isfinite(s).all() and (s > 0).all()
        assert torch.equal(q[1].float(), torch.zeros(256))
        assert torch.isfinite(generator.dequantize(q, s, scale=scale)).all()


def test_per_row_is_per_column_of_b_for_a_transposed_weight():
    W = torch.randn(48, 200)                      # B = W.t() is (200, 48): one scale per column of B
    q, s = generator.quantize(W, "e4m3", scale="row")
    assert s.shape == (48,)
    B = generator.dequantize(q, s, scale="row").t()
    assert rel(B, W.t()) <= ROUND_TRIP["e4m3"]


def test_torch_dtype_spellings():
    x = torch.randn(3, 5)
    for spelling in ("e4m3", torch.float8_e4m3fn, "float8_e4m3fn", "torch.float8_e4m3fn"):
        assert generator.quantize(x, spelling)[0].dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("call, error, fragment", [
    (lambda x: generator.quantize(x, "int8"), ValueError, "use 'e4m3' (torch.float8_e4m3fn) or 'e5m2'"),
    (lambda x: generator.quantize(x, scale="column"), ValueError, "use 'tensor' (one scale), 'row'"),
    (lambda x: generator.quantize(x[0], scale="row"), ValueError, "reshape it, e.g. x.reshape(-1, x.shape[-1])"),
    (lambda x: generator.quantize(x, scale="block", block=(0, 128)), ValueError, "two positive ints"),
    (lambda x: generator.quantize(x, scale="row", block=(1, 128)), ValueError, "goes with scale='block' only"),
    (lambda x: generator.quantize(x.int()), TypeError, "pass x.float()"),
    (lambda x: generator.quantize(x.to(torch.float8_e4m3fn)), TypeError, "pass x.float()"),
    (lambda x: generator.quantize(x.tolist()), TypeError, "must be a torch.Tensor, got list"),
])
def test_refusals_name_the_fix(call, error, fragment):
    with pytest.raises(error, match=re.escape(fragment)):
        call(torch.randn(4, 8))


def test_generator_has_no_other_lazy_attribute():
    with pytest.raises(AttributeError, match="no attribute 'quantise'"):
        generator.quantise  # noqa: B018


def test_a_batch_of_matrices_is_quantized_each_on_its_own():
    """An experts' (E, N, K) weight with block or row scales: each matrix as quantize gives it alone, the scales
    stacked (E, ...), as the grouped fp8 calls take them; dequantize inverts it; an empty batch keeps the shapes."""
    w = torch.randn(3, 300, 640)
    for scale, block, one_shape in (("block", (128, 128), (3, 5)), ("row", None, (300,))):
        q, s = generator.quantize(w, "e4m3", scale=scale, block=block)
        assert (q.shape, s.shape) == (w.shape, (3, *one_shape))
        for e in range(3):
            qe, se = generator.quantize(w[e], "e4m3", scale=scale, block=block)
            assert torch.equal(q[e].float(), qe.float()) and torch.equal(s[e], se)
        back = generator.dequantize(q, s, scale=scale, block=block)
        assert back.shape == w.shape and ((back - w).norm() / w.norm()).item() < 0.05
        q0, s0 = generator.quantize(w[:0], "e4m3", scale=scale, block=block)
        assert (q0.shape, s0.shape) == ((0, 300, 640), (0, *one_shape))
