"""examples/grouped_gemm_package.py without a GPU: it emits the package ``grouped_gemm`` whose op ``run`` takes list calls,
then says what it skipped and why, and exits 0. The install and the GPU run are the GPU machine's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from example_scripts import imported_script
from generator.spec.grouped import grouped_list_refusal

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "grouped_gemm_package.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT, "grouped_gemm_example") as module:
        yield module


def test_its_plan_takes_list_calls_and_its_sizes_keep_the_rule(script):
    assert grouped_list_refusal(script.plan().config) is None
    assert all(k % 8 == 0 for _, k, _ in script.SIZES)   # bf16 leading dimensions of K elements: 16-byte multiples
    assert any(m == 0 for m, _, _ in script.SIZES)       # an empty problem among them
    assert script.parse_args([]).out == ROOT / "emitted" / "grouped_gemm"


def test_without_a_gpu_it_emits_the_package_and_says_what_it_skipped(tmp_path):
    out = tmp_path / "grouped_gemm"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")   # (a machine with a GPU skips too: no pip install here)
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    skipped = [line for line in r.stdout.splitlines() if line.startswith("skipped: ")]
    assert len(skipped) == 1 and "pip install" in skipped[0] and skipped[0].endswith(
        ("no CUDA GPU is visible", "torch is not installed")), r.stdout
    record = json.loads((out / "plans.json").read_text())
    assert record["name"] == "grouped_gemm" and [p["op_name"] for p in record["plans"]] == ["run"]
    init = (out / "grouped_gemm" / "__init__.py").read_text()
    assert "def run(A, B, *, out=None):" in init and "run.grouped_list = _run_grouped_list" in init
    assert "return _run_grouped_list(A, B)" in init   # run(As, Bs) with two lists: the list call
    binding = (out / "csrc" / "binding.cpp").read_text()
    assert 'm.def("run.grouped_list(Tensor[] A, Tensor[] B) -> Tensor[]", kTags);' in binding
