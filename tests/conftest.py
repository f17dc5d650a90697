"""Shared test setup: GPU tests carry @pytest.mark.gpu and are skipped, with the reason, without a GPU."""
from __future__ import annotations

import pytest


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run gpu/run_all.sh on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory: pytest.TempPathFactory):
    """A fresh build cache ($GEMMGEN_CACHE_DIR) for a module that builds kernels; skips without nvcc."""
    from generator.toolchain import BuildError, nvcc_path

    try:
        nvcc_path()
    except BuildError as err:
        pytest.skip(f"no nvcc: {err}")
    mp = pytest.MonkeyPatch()
    mp.setenv("GEMMGEN_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    try:
        yield
    finally:
        mp.undo()
