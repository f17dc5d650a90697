"""build(sources) -> a loadable kernel library. ninja runs nvcc; results are cached by content.

The kernel libraries are plain CUDA shared objects (no torch headers), so a new kernel costs one
nvcc run. The cache key covers everything that changes the binary: sources, the headers they may
include, flags, the nvcc version and the torch version. Several processes may build the same
kernel at once: a file lock serializes them, and nvcc writes to a temporary name that is renamed
into place, so a half-written library is never loaded.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator

SLOW_BUILD_NOTICE_S = 1.0


class BuildError(RuntimeError):
    """nvcc or ninja failed; the message names the generated file and carries the compiler's errors."""


@dataclass(frozen=True)
class BuildRequest:
    name: str                       # kernel name, a C identifier; names the files
    sources: dict[str, str]         # {"<name>.cu": text}: the rendered translation units
    gencode: str                    # e.g. "-gencode=arch=compute_90a,code=sm_90a"
    include_dirs: tuple[str, ...]   # where the sources' #include "..." resolve


@dataclass(frozen=True)
class BuildResult:
    library: Path
    key: str
    cached: bool
    seconds: float
    ptxas_log: str


def cache_root() -> Path:
    """$GEMMGEN_CACHE_DIR, else $XDG_CACHE_HOME/gemmgen, else ~/.cache/gemmgen."""
    if os.environ.get("GEMMGEN_CACHE_DIR"):
        return Path(os.environ["GEMMGEN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gemmgen"


def nvcc_path() -> str:
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "bin" / "nvcc")
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for path in candidates:
        if path.is_file():
            return str(path)
    found = shutil.which("nvcc")
    if found:
        return found
    raise BuildError("nvcc was not found: install the CUDA toolkit (12.4 or newer) and set CUDA_HOME "
                     "or put nvcc on PATH")


def ninja_path() -> str:
    try:
        import ninja

        path = Path(ninja.BIN_DIR) / "ninja"
        if path.is_file():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("ninja")
    if found:
        return found
    raise BuildError("ninja was not found: pip install ninja")


@lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout.strip()


def torch_version() -> str:
    """torch's version when it is installed (it changes nothing in the binary today, but the key says so)."""
    if importlib.util.find_spec("torch") is None:
        return "none"
    import torch

    return torch.__version__


def nvcc_flags(req: BuildRequest) -> list[str]:
    flags = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v", "-lineinfo",
             req.gencode]
    flags += [f"-I{d}" for d in req.include_dirs]
    return flags


def _headers_digest(include_dirs: tuple[str, ...]) -> list[tuple[str, bytes]]:
    items = []
    for d in include_dirs:
        root = Path(d)
        for path in sorted(root.rglob("*")):
            if path.suffix in (".h", ".cuh", ".hpp"):
                items.append((str(path.relative_to(root)), path.read_bytes()))
    return items


def cache_key(req: BuildRequest) -> str:
    h = hashlib.sha256()
    for name in sorted(req.sources):
        h.update(name.encode() + b"\0" + req.sources[name].encode() + b"\0")
    for name, data in _headers_digest(req.include_dirs):
        h.update(name.encode() + b"\0" + data + b"\0")
    h.update(" ".join(nvcc_flags(req)).encode())
    h.update(nvcc_version(nvcc_path()).encode())
    h.update(torch_version().encode())
    return h.hexdigest()


@dataclass(frozen=True)
class _Target:
    req: BuildRequest
    key: str
    folder: Path

    @property
    def library(self) -> Path:
        return self.folder / f"lib{self.req.name}.so"

    @property
    def log(self) -> Path:
        return self.folder / "ptxas.log"

    @property
    def lock(self) -> Path:
        return self.folder.parent / f"{self.folder.name}.lock"


def _target(req: BuildRequest) -> _Target:
    key = cache_key(req)
    return _Target(req, key, cache_root() / f"{req.name}-{key[:16]}")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _ninja_rules(nvcc: str) -> str:
    # nvcc writes $out.tmp and its report to $log.tmp; only a successful build renames both into place.
    command = (f"{shlex.quote(nvcc)} $flags -o $out.tmp $in > $log.tmp 2>&1; rc=$$?; cat $log.tmp; "
               "if [ $$rc = 0 ]; then mv -f $out.tmp $out && mv -f $log.tmp $log; fi; exit $$rc")
    return f"rule nvcc\n  command = /bin/sh -c {shlex.quote(command)}\n  description = nvcc $out\n\n"


def _ninja_edge(t: _Target) -> str:
    sources = " ".join(shlex.quote(str(t.folder / name)) for name in sorted(t.req.sources))
    flags = " ".join(shlex.quote(f) for f in nvcc_flags(t.req))
    return (f"build {t.library}: nvcc {sources}\n  flags = {flags}\n  log = {shlex.quote(str(t.log))}\n\n")


def _run_ninja(targets: list[_Target], verbose: bool) -> None:
    """Each target gets its own build.ninja (rerun by hand with `ninja` in its folder); one top-level
    file includes them all so that ninja compiles them in parallel."""
    rules = _ninja_rules(nvcc_path())
    for t in targets:
        t.folder.mkdir(parents=True, exist_ok=True)
        for name, text in t.req.sources.items():
            _write_atomic(t.folder / name, text)
        _write_atomic(t.folder / "build.ninja", rules + _ninja_edge(t))
    with tempfile.TemporaryDirectory(dir=cache_root(), prefix="ninja-") as tmp:
        build_file = Path(tmp) / "build.ninja"
        build_file.write_text("".join(f"subninja {t.folder / 'build.ninja'}\n" for t in targets))
        cmd = [ninja_path(), "-f", str(build_file), "-j", str(os.cpu_count() or 1)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if verbose and proc.stdout:
        print(proc.stdout, file=sys.stderr)
    if proc.returncode != 0:
        failed = [t for t in targets if not t.library.exists()]
        files = ", ".join(str(t.folder / n) for t in failed for n in t.req.sources)
        errors = "\n".join(line for line in proc.stdout.splitlines() if "ptxas info" not in line
                           and not line.lstrip().startswith(("bytes stack frame", "0 bytes stack")))
        raise BuildError(f"nvcc failed for {files}:\n{errors}")


def _report_slow(names: list[str]) -> threading.Timer:
    label = names[0] if len(names) == 1 else f"{len(names)} kernels"
    timer = threading.Timer(SLOW_BUILD_NOTICE_S, lambda: print(f"[gemmgen] building {label} (nvcc) ...",
                                                                file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    return timer


def build_many(reqs: list[BuildRequest], *, verbose: bool = False) -> list[BuildResult]:
    """Build every request, the uncached ones in one parallel ninja run; results in request order."""
    start = time.perf_counter()
    targets = [_target(r) for r in reqs]
    unique = {t.library: t for t in targets}
    with ExitStack() as stack:
        for t in sorted(unique.values(), key=lambda t: str(t.lock)):
            stack.enter_context(_locked(t.lock))
        todo = [t for t in unique.values() if not t.library.exists()]
        if todo:
            timer = _report_slow([t.req.name for t in todo])
            try:
                _run_ninja(todo, verbose)
            finally:
                timer.cancel()
            seconds = time.perf_counter() - start
            if seconds > SLOW_BUILD_NOTICE_S:
                label = todo[0].req.name if len(todo) == 1 else f"{len(todo)} kernels"
                print(f"[gemmgen] built {label} in {seconds:.1f} s", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    built = {t.library for t in todo}
    return [BuildResult(t.library, t.key, t.library not in built, seconds,
                        t.log.read_text() if t.log.exists() else "") for t in targets]


def build(req: BuildRequest, *, verbose: bool = False) -> BuildResult:
    return build_many([req], verbose=verbose)[0]


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def spill_report(ptxas_log: str) -> dict[str, dict[str, int]]:
    """{kernel: {registers, stack, spill_stores, spill_loads}} for each entry function of an
    `-Xptxas -v` report (the properties of non-entry device functions are skipped)."""
    report: dict[str, dict[str, int]] = {}
    entry = properties_of = None
    for line in ptxas_log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            report[entry] = {}
        elif m := _PROPERTIES.search(line):
            properties_of = m.group(1)
        elif (m := _SPILL.search(line)) and entry is not None and properties_of == entry:
            report[entry].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif (m := _REGS.search(line)) and entry is not None:
            report[entry]["registers"] = int(m.group(1))
    return report
