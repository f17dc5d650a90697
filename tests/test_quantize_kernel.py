"""generator.quantize's CUDA kernels (1x128 blocks, whole rows), without a GPU: which tensors they take (the others
take the torch path), their custom ops' shapes under tracing, and their source compiling for sm_80 and sm_90 without
spills. Their values (bit for bit the torch path's) are checked on the GPU: tests/gpu/test_quantize_kernel_gpu.py."""
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
    assert "cpu" in kernel_refusal(torch.empty(4, 256, dtype=torch.bfloat16), E4M3)
    assert "blocks of (128, 128)" in kernel_refusal(meta(4, 256), E4M3, "block", (128, 128))
    # (a meta tensor stands for a CUDA one in the remaining rules: they read shapes and strides only)
    assert kernel_refusal(meta(4, 256), E4M3) == "x is on meta"


@pytest.mark.parametrize("scale, x, why", [
    ("block", torch.empty(4, 200, dtype=torch.bfloat16, device="meta"), "200 columns"),
    ("row", torch.empty(4, 202, dtype=torch.bfloat16, device="meta"), "202 columns (the kernel takes a positive "
                                                                      "multiple of 4)"),
    ("row", torch.empty(4, 0, dtype=torch.bfloat16, device="meta"), "0 columns"),
    ("block", torch.empty(0, 256, dtype=torch.bfloat16, device="meta"), "no rows"),
    ("row", torch.empty(256, 4, dtype=torch.bfloat16, device="meta").t(), "columns that are not contiguous"),
    ("block", torch.empty(4, 256, dtype=torch.float64, device="meta"), "float64"),
    ("tensor", torch.empty(4, 256, dtype=torch.bfloat16, device="meta"), "scale='tensor'"),
])
def test_what_it_refuses(monkeypatch, scale, x, why):
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda")), raising=True)
    assert why in kernel_refusal(x, E4M3, scale)


def test_rows_with_a_stride_of_whole_vectors_are_taken(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda")), raising=True)
    wide = torch.empty(4, 260, dtype=torch.bfloat16, device="meta")   # stride 260 elements: 65 vectors of 4
    assert kernel_refusal(wide[:, :256], E4M3) is None
    odd = torch.empty(4, 258, dtype=torch.bfloat16, device="meta")    # 258 elements: not whole vectors
    assert "row stride" in kernel_refusal(odd[:, :256], E4M3)
    assert "row stride" in kernel_refusal(odd[:, :256], E4M3, "row")


def test_rows_of_any_multiple_of_four_columns_are_taken(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda")), raising=True)
    assert kernel_refusal(meta(3, 204), E4M3, "row") is None
    assert "204 columns" in kernel_refusal(meta(3, 204), E4M3, "block")


@pytest.mark.parametrize("op, scale_shape", [("row_blocks", (5, 3)), ("rows", (5,))])
def test_the_ops_trace_with_the_shapes_quantize_returns(op, scale_shape):
    q, s = getattr(torch.ops.gemmgen_quantize, op)(meta(5, 384), torch.float8_e5m2)
    assert (q.shape, q.dtype, s.shape, s.dtype) == ((5, 384), torch.float8_e5m2, scale_shape, torch.float32)


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
@pytest.mark.parametrize("arch", ["80", "90"])
def test_the_kernel_compiles_without_spills(tmp_path, arch):
    out = tmp_path / f"quantize_sm{arch}.cubin"
    proc = subprocess.run([NVCC, *DEVICE_FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}",
                           f"-I{templates_dir()}", "-cubin", "-o", str(out), str(templates_dir() / SOURCE)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = parse_ptxas(proc.stdout + proc.stderr)
    assert len(reports) == 2, reports   # the block kernel and the row kernel
    assert all(r["spill_stores"] == 0 and r["spill_loads"] == 0 for r in reports.values()), reports
