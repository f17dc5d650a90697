"""Shared test setup: GPU tests carry @pytest.mark.gpu and are skipped, with the reason, without a GPU."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _compile_kernels_in_the_background(config, items)
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run gpu/run_all.sh on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _compile_kernels_in_the_background(config: pytest.Config, items: list[pytest.Item]) -> None:
    """tests/test_nvcc_compile.py's kernels compile while the rest of the suite runs (its BackgroundCompiles): started
    here, its tests moved to the end of the run, where they wait for what is left."""
    nvcc_items = [item for item in items if item.fspath.basename == "test_nvcc_compile.py"]
    if not nvcc_items:
        return
    root = Path(tempfile.mkdtemp(prefix="gemmgen-nvcc-"))
    config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))
    nvcc_items[0].module.start_background_compiles(root)
    moved = {id(item) for item in nvcc_items}
    items[:] = [item for item in items if id(item) not in moved] + nvcc_items


@pytest.fixture(scope="session")
def session_build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder build_cache points $GEMMGEN_CACHE_DIR at: one for the session, so that a kernel several modules
    build (the default bf16 plan, its backward's) compiles once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def build_cache(session_build_dir: Path):
    """A build cache ($GEMMGEN_CACHE_DIR) of the test session's own, not the user's, for a module that builds
    kernels, while the module runs (the others keep theirs); skips without nvcc."""
    from generator.toolchain import BuildError, nvcc_path

    try:
        nvcc_path()
    except BuildError as err:
        pytest.skip(f"no nvcc: {err}")
    mp = pytest.MonkeyPatch()
    mp.setenv("GEMMGEN_CACHE_DIR", str(session_build_dir))
    try:
        yield
    finally:
        mp.undo()
