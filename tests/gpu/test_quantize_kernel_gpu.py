"""generator.quantize's CUDA kernels (1x128 blocks, whole rows) against the torch path they replace: the same bits (q
as bytes, s as fp32 bits) for every input dtype, both fp8 formats, ragged row and column counts, strided and
misaligned rows, and blocks of zeros, tiny, huge, infinite and NaN values; and the same under torch.compile."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import generator  # noqa: E402
from generator.runtime import quantize_kernel  # noqa: E402

pytestmark = pytest.mark.gpu
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
INPUTS = (torch.bfloat16, torch.float16, torch.float32)


def torch_path(x: torch.Tensor, fp8: str, monkeypatch, scale: str = "block") -> tuple[torch.Tensor, torch.Tensor]:
    """quantize() with the kernels refused: its torch operations."""
    with monkeypatch.context() as patch:
        patch.setattr(quantize_kernel, "quantize_on_gpu", lambda *args: None)
        return generator.quantize(x, fp8, scale=scale)


def assert_same_bits(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    (q, s), (q_ref, s_ref) = got, want
    assert q.dtype == q_ref.dtype and q.shape == q_ref.shape and s.shape == s_ref.shape
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)), "q differs"
    assert torch.equal(s.view(torch.int32), s_ref.view(torch.int32)), "s differs"


def special_rows(x: torch.Tensor) -> torch.Tensor:
    """x with rows that end in blocks of zeros, tiny values, huge values, inf, -inf, NaN and -0."""
    x = x.clone()
    big = 60000.0 if x.dtype == torch.float16 else 1e30
    specials = [0.0, 1e-40 if x.dtype == torch.float32 else 1e-7, big, float("inf"), float("-inf"), float("nan"),
                -0.0]
    for i, value in enumerate(specials[: x.shape[0]]):
        x[i, -128:] = value
        x[i, -200] = value   # (inside a block of ordinary values too)
    return x


@pytest.mark.parametrize("dtype", INPUTS, ids=str)
@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("scale, rows, cols", [("block", 1, 128), ("block", 7, 384), ("block", 4096, 4096),
                                               ("row", 1, 4), ("row", 7, 204), ("row", 5, 9220),
                                               ("row", 4096, 4096)])
def test_same_bits_as_the_torch_path(monkeypatch, dtype, fp8, scale, rows, cols):
    x = special_rows(torch.randn(rows, cols, device="cuda").mul_(3).to(dtype)) if cols >= 256 else \
        torch.randn(rows, cols, device="cuda").to(dtype)
    assert quantize_kernel.kernel_refusal(x, FP8[fp8], scale) is None
    assert_same_bits(generator.quantize(x, fp8, scale=scale), torch_path(x, fp8, monkeypatch, scale))


@pytest.mark.parametrize("scale", ["block", "row"])
def test_strided_and_misaligned_rows(monkeypatch, scale):
    wide = torch.randn(33, 520, device="cuda").to(torch.bfloat16)
    strided = wide[:, :512]                                  # rows 520 elements apart: 130 vectors of 4
    misaligned = wide.view(-1)[2:2 + 32 * 512].view(32, 512)  # first row 4 bytes past a vector's boundary
    for x in (strided, misaligned):
        assert quantize_kernel.kernel_refusal(x, FP8["e4m3"], scale) is None
        assert_same_bits(generator.quantize(x, "e4m3", scale=scale), torch_path(x, "e4m3", monkeypatch, scale))


def test_experts_weights_by_row(monkeypatch):
    """A 3-D x by rows: each matrix through the row kernel, s (E, rows)."""
    x = torch.randn(3, 64, 1028, device="cuda").to(torch.bfloat16)
    got, want = generator.quantize(x, "e4m3", scale="row"), torch_path(x, "e4m3", monkeypatch, "row")
    assert got[1].shape == (3, 64)
    assert_same_bits(got, want)


@pytest.mark.parametrize("scale", ["block", "row"])
def test_under_torch_compile(monkeypatch, scale):
    x = torch.randn(256, 1024, device="cuda").to(torch.bfloat16)
    compiled = torch.compile(lambda t: generator.quantize(t, "e4m3", scale=scale), fullgraph=True)
    assert_same_bits(compiled(x), torch_path(x, "e4m3", monkeypatch, scale))
