"""The kernels a call may take besides the config's own (templates/common/launch.cuh choose_path), on the CPU: which
configs have the small-M kernel, the Python constants against the C++ ones, what print(plan) and plan.why say, and
the rendered library's entry points. The GPU side (op.path, numerics) is tests/gpu/test_small_m.py and
tests/gpu/test_repacked.py."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from generator import Gemm
from generator.render import render, templates_dir
from generator.spec.config import (REPACK_MIN_VOLUME, SMALL_M_MAX_ROWS, SMALL_M_N_MAJOR_MAX_BYTES,
                                   SMALL_M_N_MAJOR_STRIP, SMALL_M_N_MAJOR_TWO_GROUPS_MIN_K, has_small_m_kernel,
                                   takes_small_m)

TEMPLATES = Path(templates_dir())


@pytest.mark.parametrize("kwargs, expected", [
    (dict(dtype="bf16", layout="tn", arch=90), True),
    (dict(dtype="fp16", layout="tn", arch=80), True),
    (dict(dtype="bf16", layout="tn", layout_c="col", out_dtype="fp32", arch=90), True),
    (dict(dtype="bf16", layout="tn", activation="gelu", bias="col", arch=80), True),
    (dict(dtype="bf16", layout="nn", arch=90), False),    # A M-major
    (dict(dtype="fp16", layout="tt", arch=80), True),     # B N-major: transposed in registers (movmatrix)
    (dict(dtype="bf16", layout="nt", arch=90), False),    # A M-major
    (dict(dtype="tf32", layout="tn", arch=90), False),
    (dict(dtype="e4m3", layout="tn", scale="tensor", arch=90), False),
    (dict(dtype="e4m3", layout="tn", scale="block", arch=90), False),
    (dict(dtype="int8", layout="tn", out_dtype="int32", arch=90), False),
])
def test_which_configs_have_the_small_m_kernel(kwargs, expected):
    plan = Gemm(**kwargs)
    assert has_small_m_kernel(plan.config) is expected
    text = str(plan)
    assert ("the small-M kernel" in text) is expected
    assert "copied into an aligned workspace" in text and "else the unaligned kernel" in text
    # Every library carries the entry point (an empty stub where the config has no such kernel).
    source = next(iter(render(plan.config).values()))
    assert f"{plan.name}_small_m(GemmArgs args)" in source
    assert f"{plan.name}_unaligned, {plan.name}_small_m" in source


def test_python_constants_match_the_templates():
    small_m = (TEMPLATES / "common" / "gemm_small_m.cuh").read_text()
    assert "constexpr int kMaxRows = GEMMGEN_SMALL_M_MAX_ROWS;" in small_m
    assert int(re.search(r"#define GEMMGEN_SMALL_M_MAX_ROWS (\d+)", small_m).group(1)) == SMALL_M_MAX_ROWS == 16
    assert re.search(r"kBlockColumns = (\d+);", small_m).group(1) == str(SMALL_M_N_MAJOR_STRIP)
    assert re.search(r"kNMajorTwoGroupsMinK = (\d+);", small_m).group(1) == str(SMALL_M_N_MAJOR_TWO_GROUPS_MIN_K)
    bytes_shift = int(re.search(r"kNMajorMaxBytes = int64_t\((\d+)\) << 20;", small_m).group(1))
    assert bytes_shift << 20 == SMALL_M_N_MAJOR_MAX_BYTES
    workspace = (TEMPLATES / "common" / "workspace.cuh").read_text()
    shift = int(re.search(r"kRepackMinVolume = int64_t\(1\) << (\d+);", workspace).group(1))
    assert 1 << shift == REPACK_MIN_VOLUME
    paths = (TEMPLATES / "common" / "gemm_args.h").read_text()
    from generator.runtime.library import PATHS
    for code, name in PATHS.items():
        assert re.search(rf"GEMM_PATH_{name.upper()} = {code}\b", paths), name


def test_why_names_the_small_m_kernel_for_few_rows():
    decode = Gemm("bf16", "tn", m=1, n=4096, k=4096, arch=90)
    assert decode.why.startswith("M = 1 <= 16: calls take the small-M kernel, which streams B once (4096x4096, "
                                 "33.6 MB: 10.0 us at the HBM's 3.35 TB/s)")
    assert decode.why.endswith(Gemm("bf16", "tn", m=1, n=4096, k=4096, arch=90)._estimate.reason)
    # More rows, or a config without the kernel: the estimate's reason alone.
    for plan in (Gemm("bf16", "tn", m=17, n=4096, k=4096, arch=90), Gemm("bf16", "nn", m=1, n=4096, k=4096, arch=90)):
        assert plan.why == plan._estimate.reason


def test_an_n_major_b_takes_the_small_m_kernel_within_its_bounds():
    """While its strips of 32 columns fit one per SM, B is at most 192 MiB and, past 8 rows, K at least 2560
    (takes_small_m in launch.cuh): beyond, the tiled kernels run faster. A K-major B takes it at any size;
    print(plan)'s why says which."""
    tt = Gemm("bf16", "tt", arch=90).config
    assert takes_small_m(tt, 16, 4096, 14336, 132)             # 117 MB, 128 strips
    assert not takes_small_m(tt, 16, 4096, 14336, 114)         # 128 strips on 114 SMs: a second wave
    assert not takes_small_m(tt, 16, 4096, 128256, 132)        # a vocabulary head's dX: 1 GB
    assert not takes_small_m(tt, 1, 132 * SMALL_M_N_MAJOR_STRIP + 8, 64, 132)
    assert not takes_small_m(tt, SMALL_M_MAX_ROWS + 1, 4096, 4096, 132)
    assert takes_small_m(tt, 8, 4096, 1024, 132)               # one n8 MMA per k16: any K
    assert not takes_small_m(tt, 9, 4096, SMALL_M_N_MAJOR_TWO_GROUPS_MIN_K - 8, 132)   # two, a short K
    assert takes_small_m(Gemm("bf16", "tn", arch=90).config, 16, 4096, 128256, 132)
    assert "small-M" in Gemm("bf16", "tt", m=16, n=4096, k=4096, arch=90).why
    assert "small-M" not in Gemm("bf16", "tt", m=16, n=4096, k=128256, arch=90).why
