"""The builder on a CPU machine: nvcc compiles and links without a GPU, and ctypes can call host code."""
from __future__ import annotations

import ctypes
import multiprocessing
import time
from pathlib import Path

import pytest

from generator.toolchain import (BuildError, BuildRequest, BuildResult, build, build_many, cache_key,
                             nvcc_flags, nvcc_path, spill_report)

GENCODE = "-gencode=arch=compute_80,code=sm_80"

TINY = r"""
#include "tiny.cuh"
extern "C" int answer() { return TINY_ANSWER; }
__global__ void scale(float* p, float s) { p[threadIdx.x] *= s; }
"""

BROKEN = r"""
extern "C" int answer() { return 42 }   // missing ';'
"""


@pytest.fixture(autouse=True)
def _needs_nvcc() -> None:
    try:
        nvcc_path()
    except BuildError as exc:
        pytest.skip(f"no nvcc: {exc}")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("GEMMGEN_CACHE_DIR", str(root))
    return root


@pytest.fixture
def include_dir(tmp_path: Path) -> Path:
    d = tmp_path / "include"
    d.mkdir()
    (d / "tiny.cuh").write_text("#pragma once\n#define TINY_ANSWER 42\n")
    return d


def tiny_request(include_dir: Path, name: str = "tiny", answer: int | None = None) -> BuildRequest:
    text = TINY if answer is None else TINY.replace("TINY_ANSWER", str(answer))
    return BuildRequest(name=name, sources={f"{name}.cu": text}, gencode=GENCODE,
                        include_dirs=(str(include_dir),))


def call_answer(result: BuildResult) -> int:
    lib = ctypes.CDLL(str(result.library))
    lib.answer.restype = ctypes.c_int
    return lib.answer()


def test_build_load_and_cache(cache: Path, include_dir: Path) -> None:
    first = build(tiny_request(include_dir))
    assert not first.cached
    assert first.library == cache / f"tiny-{first.key[:16]}" / "libtiny.so"
    assert call_answer(first) == 42
    assert "Compiling entry function" in first.ptxas_log
    assert spill_report(first.ptxas_log).keys() == {"_Z5scalePff"}
    directory = first.library.parent
    assert {"tiny.cu", "build.ninja", "libtiny.so", "ptxas.log"} <= {p.name for p in directory.iterdir()}
    assert not list(directory.glob("*.tmp"))

    t0 = time.perf_counter()
    second = build(tiny_request(include_dir))
    elapsed = time.perf_counter() - t0
    assert second.cached and elapsed < 0.5, elapsed
    assert second.library == first.library and second.key == first.key
    assert second.ptxas_log == first.ptxas_log


def test_cached_library_without_its_log(cache: Path, include_dir: Path) -> None:
    first = build(tiny_request(include_dir))
    (first.library.parent / "ptxas.log").unlink()   # as a partial copy of the cache leaves it
    again = build(tiny_request(include_dir))
    assert again.cached and again.library == first.library and again.ptxas_log == ""
    assert call_answer(again) == 42


def test_key_covers_headers(cache: Path, include_dir: Path) -> None:
    before = cache_key(tiny_request(include_dir))
    (include_dir / "sub").mkdir()
    (include_dir / "sub" / "other.h").write_text("// a new header may be included: a new key\n")
    assert cache_key(tiny_request(include_dir)) != before


def test_syntax_error(cache: Path, include_dir: Path) -> None:
    req = BuildRequest(name="broken", sources={"broken.cu": BROKEN}, gencode=GENCODE,
                       include_dirs=(str(include_dir),))
    with pytest.raises(BuildError) as info:
        build(req)
    message = str(info.value)
    key = cache_key(req)
    assert str(cache / f"broken-{key[:16]}" / "broken.cu") in message
    assert "error" in message
    assert "nvcc" in message and GENCODE in message
    assert "ptxas info" not in message
    assert not (cache / f"broken-{key[:16]}" / "libbroken.so").exists()


def test_build_many(cache: Path, include_dir: Path) -> None:
    reqs = [tiny_request(include_dir, "many_a", 1), tiny_request(include_dir, "many_b", 2)]
    results = build_many(reqs)
    assert [r.cached for r in results] == [False, False]
    assert [call_answer(r) for r in results] == [1, 2]
    again = build_many(reqs + [reqs[0]])
    assert [r.cached for r in again] == [True, True, True]
    assert again[2].library == results[0].library


def _build_in_child(include_dir: str) -> tuple[str, bool]:
    result = build(tiny_request(Path(include_dir), "racy"))
    assert call_answer(result) == 42
    return str(result.library), result.cached


def test_concurrent_processes(cache: Path, include_dir: Path) -> None:
    # GEMMGEN_CACHE_DIR is in os.environ, which spawned children inherit.
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(_build_in_child, [str(include_dir)] * 2)
    paths = {path for path, _ in results}
    assert len(paths) == 1
    assert sorted(cached for _, cached in results) == [False, True]  # exactly one compiled


SAMPLE_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_80'
ptxas info    : Function properties for _Z6kernelPf
    256 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 256 bytes cumulative stack size, 360 bytes cmem[0]
ptxas info    : Compile time = 14.648 ms
ptxas info    : Function properties for _Z3devf
    64 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'gemm_tn' for 'sm_90a'
ptxas info    : Function properties for gemm_tn
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, 400 bytes cmem[0]
"""


def test_spill_report() -> None:
    assert spill_report(SAMPLE_LOG) == {
        "_Z6kernelPf": {"registers": 255, "spill_stores": 8, "spill_loads": 12, "stack": 256},
        "gemm_tn": {"registers": 168, "spill_stores": 0, "spill_loads": 0, "stack": 0},
    }
    assert spill_report("") == {}


def test_extra_nvcc_flags_reach_every_library_and_its_cache_key(monkeypatch):
    """GEMMGEN_EXTRA_NVCC_FLAGS (a benchmark run under a template switch): the flags join every kernel library's build
    request, after the plan's own, so the switched libraries cache apart from the plain ones."""
    pytest.importorskip("torch")
    from generator import Gemm
    from generator.runtime.loader import EXTRA_FLAGS_ENV, build_request

    config = Gemm("bf16", "tn", arch=90).config
    monkeypatch.delenv(EXTRA_FLAGS_ENV, raising=False)
    plain = build_request(config, 90)
    monkeypatch.setenv(EXTRA_FLAGS_ENV, "-DGEMMGEN_SMALL_M_N_MAJOR=0  -DGEMMGEN_SMALL_M_WARPS=4")
    switched = build_request(config, 90)
    assert plain.extra_flags == ()
    assert switched.extra_flags == ("-DGEMMGEN_SMALL_M_N_MAJOR=0", "-DGEMMGEN_SMALL_M_WARPS=4")
    assert switched.extra_flags == tuple(nvcc_flags(switched)[-2:])
    assert cache_key(switched) != cache_key(plain)
