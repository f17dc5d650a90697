"""generator.quantize's CUDA kernel for 1x128 blocks, without a GPU: which tensors it takes (the others take the torch
path), its custom op's shapes under tracing, and its source compiling for sm_80 and sm_90 without spills. Its values
(bit for bit the torch path's) are checked on the GPU: tests/gpu/test_quantize_kernel_gpu.py."""
from __future__ import annotations

import subprocess

import pytest

torch = pytest.importorskip("torch")

from generator.render import templates_dir  # noqa: E402
from generator.runtime.quantize_kernel import SOURCE, kernel_refusal  # noqa: E402  (registers the op)
from test_nvcc_compile import DEVICE_FLAGS, NO_NVCC, NVCC, parse_ptxas  # noqa: E402

E4M3 = torch.float8_e4m3fn


def meta(rows: int, cols: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(rows, cols, dtype=dtype, device="meta")


def test_the_kernel_takes_rows_of_whole_blocks_on_cuda_only():
    assert "cpu" in kernel_refusal(torch.empty(4, 256, dtype=torch.bfloat16), (1, 128), E4M3)
    assert "blocks of (128, 128)" in kernel_refusal(meta(4, 256), (128, 128), E4M3)
    # (a meta tensor stands for a CUDA one in the remaining rules: they read shapes and strides only)
    assert kernel_refusal(meta(4, 256), (1, 128), E4M3) == "x is on meta"


@pytest.mark.parametrize("x, why", [
    (torch.empty(4, 200, dtype=torch.bfloat16, device="meta"), "200 columns"),
    (torch.empty(0, 256, dtype=torch.bfloat16, device="meta"), "no rows"),
    (torch.empty(256, 4, dtype=torch.bfloat16, device="meta").t(), "columns that are not contiguous"),
    (torch.empty(4, 256, dtype=torch.float64, device="meta"), "float64"),
])
def test_what_it_refuses(monkeypatch, x, why):
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda")), raising=True)
    assert why in kernel_refusal(x, (1, 128), E4M3)


def test_rows_with_a_stride_of_whole_16_byte_units_are_taken(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda")), raising=True)
    wide = torch.empty(4, 264, dtype=torch.bfloat16, device="meta")   # stride 264 x 2 bytes: 33 units of 16
    assert kernel_refusal(wide[:, :256], (1, 128), E4M3) is None
    odd = torch.empty(4, 260, dtype=torch.bfloat16, device="meta")    # 520 bytes: not whole units
    assert "row stride" in kernel_refusal(odd[:, :256], (1, 128), E4M3)


def test_the_op_traces_with_the_shapes_quantize_returns():
    q, s = torch.ops.gemmgen_quantize.row_blocks(meta(5, 384), torch.float8_e5m2)
    assert (q.shape, q.dtype, s.shape, s.dtype) == ((5, 384), torch.float8_e5m2, (5, 3), torch.float32)


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
@pytest.mark.parametrize("arch", ["80", "90"])
def test_the_kernel_compiles_without_spills(tmp_path, arch):
    out = tmp_path / f"quantize_sm{arch}.cubin"
    proc = subprocess.run([NVCC, *DEVICE_FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}",
                           f"-I{templates_dir()}", "-cubin", "-o", str(out), str(templates_dir() / SOURCE)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (report,) = parse_ptxas(proc.stdout + proc.stderr).values()
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0
