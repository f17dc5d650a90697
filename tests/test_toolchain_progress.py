"""build_many's progress callback (what a tuning run's build bar counts): each distinct request once, as ninja
finishes it, with whether it built; cached ones at once; the failed one named while the others still build."""
from __future__ import annotations

from pathlib import Path

import pytest

from generator.toolchain import BuildError, BuildRequest, build_many, nvcc_path

GENCODE = "-gencode=arch=compute_80,code=sm_80"
GOOD = 'extern "C" int answer() { return ANSWER; }\n'
BROKEN = 'extern "C" int answer() { return 42 }\n'


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    try:
        nvcc_path()
    except BuildError as exc:
        pytest.skip(f"no nvcc: {exc}")
    monkeypatch.setenv("GEMMGEN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def request(name: str, text: str) -> BuildRequest:
    return BuildRequest(name=name, sources={f"{name}.cu": text}, gencode=GENCODE, include_dirs=())


def test_progress_hears_each_kernel_once() -> None:
    reqs = [request("prog_a", GOOD.replace("ANSWER", "1")), request("prog_b", GOOD.replace("ANSWER", "2"))]
    heard: list[tuple[str, bool]] = []
    build_many(reqs + [reqs[0]], progress=lambda req, ok: heard.append((req.name, ok)))
    assert sorted(heard) == [("prog_a", True), ("prog_b", True)]
    heard.clear()
    build_many(reqs, progress=lambda req, ok: heard.append((req.name, ok)))   # cached: at once
    assert sorted(heard) == [("prog_a", True), ("prog_b", True)]


def test_progress_names_the_failed_kernel() -> None:
    reqs = [request("prog_good", GOOD.replace("ANSWER", "3")), request("prog_broken", BROKEN)]
    heard: dict[str, bool] = {}
    with pytest.raises(BuildError, match="prog_broken"):
        build_many(reqs, progress=lambda req, ok: heard.__setitem__(req.name, ok))
    assert heard == {"prog_good": True, "prog_broken": False}


def test_the_end_line_says_which_kernels_another_process_built(capsys: pytest.CaptureFixture[str]) -> None:
    """Ranks that start together on one machine wait for the one building a kernel (its file lock): the waiting
    process says so instead of claiming the build."""
    import re
    import time

    from generator.toolchain.builder import _Progress

    for by_others, count, what in ((2, 2, "2 kernels (a, b)"), (1, 3, "3 kernels (a, b, c)"), (0, 1, "k")):
        with _Progress(what, verbose=True, count=count) as shown:   # verbose: the "building" line at once
            time.sleep(0.05)
            shown.by_others = by_others
    err = capsys.readouterr().err
    assert re.search(r"another process built 2 kernels \(a, b\); waited [0-9.]+ s\n", err), err
    assert re.search(r"\] built 3 kernels \(a, b, c\) in [0-9.]+ s \(1 of them by another process\)\n", err), err
    assert re.search(r"\] built k in [0-9.]+ s\n", err), err
