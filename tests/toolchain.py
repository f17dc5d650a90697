"""What the tests that build emitted packages share: finding the CUDA toolkit, and installing a package with
pip into a folder of its own and importing it from there (tests/test_emit.py, tests/gpu/test_emitted_*.py)."""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType


def find_cuda_home() -> Path | None:
    """The CUDA toolkit root, with bin/nvcc and include/cuda_runtime.h (torch's own guess may take a wrapper's folder)."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    for c in filter(None, candidates):
        if (Path(c) / "bin" / "nvcc").is_file() and (Path(c) / "include" / "cuda_runtime.h").is_file():
            return Path(c)
    return None


def pip_install_and_import(pkg: Path, name: str, root: Path, cuda_home: Path) -> tuple[ModuleType, float]:
    """``pip install --no-build-isolation`` the package folder ``pkg`` into ``root/site`` and import ``name`` from
    there; returns the module and the install's seconds. Fails the test with pip's output if pip fails."""
    site = root / "site"
    env = dict(os.environ, CUDA_HOME=str(cuda_home), PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--target",
                        str(site), str(pkg)], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    assert r.returncode == 0, f"pip install failed after {seconds:.0f} s:\n{r.stdout[-8000:]}\n{r.stderr[-8000:]}"
    sys.path.insert(0, str(site))
    try:
        return importlib.import_module(name), seconds
    finally:
        sys.path.remove(str(site))
