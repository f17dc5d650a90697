"""examples/fp8_mlp.py on the CPU: its three plans (the gate GEMM's epilogue is silu(acc) * up, quantized on store
into what the down projection reads), and its run without a GPU, which plans and says what it skipped. The timing
and the error against the bf16 block are the GPU machine's (`python examples/fp8_mlp.py`)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from example_scripts import imported_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "fp8_mlp.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT, "fp8_mlp_example") as module:
        yield module


def test_the_gate_gemm_quantizes_what_the_down_projection_reads(script):
    planned = script.plans(4096, 14336, 4096, arch=90)
    up, gate, down = (planned[k].config for k in ("up", "gate", "down"))
    assert up.out_dtype.value == "bf16" and down.out_dtype.value == "bf16"
    assert gate.out_dtype.value == "e4m3" and gate.tile[1] % 128 == 0
    names = [op.name for op in gate.epilogue.operands]
    assert names == ["scale_a", "scale_b", "up"]                       # the op's arguments after A and B
    assert [op.kind for op in gate.epilogue.operands] == ["row_blocks", "col_blocks", "matrix"]
    assert all(c.epilogue.scale_mode == "block" for c in (up, gate, down))


def test_without_a_gpu_it_plans_and_says_what_it_skipped(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, str(SCRIPT), "--tokens", "512"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "gate: sm90_e4m3_tn_" in r.stdout and "_oe4m3_" in r.stdout
    assert "skipped: building the kernels" in r.stdout
