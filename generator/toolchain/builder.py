"""The builder: rendered sources -> a plain CUDA shared library (no torch headers), cached by content.

A kernel library is loaded later with ctypes, so building one is a single nvcc run. Builds are

* content-addressed: the cache directory ``cache_root()/<name>-<key[:16]>/`` is named by a sha256
  over everything that can change the binary (sources, the headers they may include, the flags,
  the nvcc version, the torch version), so a cache entry is never stale and never needs checking;
* safe under concurrency: a process holds an ``fcntl.flock`` on ``<name>-<key[:16]>.lock`` while it
  checks and builds, and the library appears under its final name only by an atomic rename, so
  the existence of ``lib<name>.so`` is the one and only "built" marker;
* parallel: ``build_many`` hands every uncached library to one ninja run (``-j os.cpu_count()``).

Each cache directory keeps the sources, ``build.ninja`` (``ninja -f`` it to reproduce a build by
hand), ``lib<name>.so`` and ``ptxas.log`` (the ``-Xptxas -v`` report, kept so that register and
spill counts are available for cached builds too).
"""
from __future__ import annotations

import contextlib
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
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

#: Bump when the build recipe (rule, file layout) changes so that old cache entries are not reused.
RECIPE_VERSION = "gemmgen-build-1"
#: File names inside a cache directory.
NINJA_FILE = "build.ninja"
PTXAS_LOG = "ptxas.log"
HEADER_SUFFIXES = (".h", ".cuh")
#: What a translation unit may be: CUDA, or host-only C++ (nvcc hands it to the host compiler).
SOURCE_SUFFIXES = (".cu", ".cpp")
#: A build slower than this gets a progress line on stderr.
SLOW_BUILD_S = 1.0

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class BuildError(RuntimeError):
    """nvcc (or ninja) failed, or is missing. The message says what ran, on which file, and why."""


@dataclass(frozen=True)
class BuildRequest:
    """What to build: the rendered translation units and how to compile them."""

    name: str                      # kernel name, a C identifier, used for file names
    sources: dict[str, str]        # {"<name>.cu": text}; exactly the rendered translation units
    gencode: str                   # e.g. "-gencode=arch=compute_90a,code=sm_90a"
    include_dirs: tuple[str, ...]  # e.g. (str(templates_dir()),)
    # more nvcc flags, after the others (the JIT runtime's torch include paths and libraries)
    extra_flags: tuple[str, ...] = ()
    cxx_std: str = "c++17"         # the language standard (torch's headers want c++20 in torch >= 2.12)

    def __post_init__(self) -> None:
        # Names become file names and shell words: reject anything that could escape the cache dir.
        if not _IDENTIFIER.fullmatch(self.name):
            raise ValueError(f"BuildRequest.name must be a C identifier, got {self.name!r}")
        if not self.sources:
            raise ValueError(f"BuildRequest {self.name!r} has no sources")
        for file_name in self.sources:
            if Path(file_name).name != file_name or not file_name.endswith(SOURCE_SUFFIXES) or file_name.startswith("."):
                raise ValueError(f"source names must be plain '.cu' or '.cpp' file names, got {file_name!r}")
        object.__setattr__(self, "include_dirs", tuple(str(d) for d in self.include_dirs))
        object.__setattr__(self, "extra_flags", tuple(self.extra_flags))


@dataclass(frozen=True)
class BuildResult:
    """A built (or found) library."""

    library: Path     # the .so
    key: str          # content hash
    cached: bool      # True if nothing was compiled
    seconds: float
    ptxas_log: str    # the -Xptxas -v output, read from ptxas.log next to the .so


# -- tools --------------------------------------------------------------------------------------------

def cache_root() -> Path:
    """$GEMMGEN_CACHE_DIR, else $XDG_CACHE_HOME/gemmgen, else ~/.cache/gemmgen. Read on every call so
    that tests and tools can point it elsewhere at any time."""
    explicit = os.environ.get("GEMMGEN_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "gemmgen"


def nvcc_path() -> str:
    """$CUDA_HOME/bin/nvcc, /usr/local/cuda/bin/nvcc, or nvcc on PATH, in that order."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which("nvcc")
    if on_path:
        return on_path
    raise BuildError("nvcc not found (looked in $CUDA_HOME/bin, /usr/local/cuda/bin and PATH): install the "
                     "CUDA toolkit (https://developer.nvidia.com/cuda-downloads, or "
                     "`pip install nvidia-cuda-nvcc-cu12`) and set CUDA_HOME to its root")


def ninja_path() -> str:
    """The ninja binary of the `ninja` Python package if installed, else ninja on PATH."""
    spec = importlib.util.find_spec("ninja")
    if spec is not None:
        import ninja  # a tiny package: it only tells where its binary is

        candidate = Path(ninja.BIN_DIR) / "ninja"
        if candidate.is_file():
            return str(candidate)
    on_path = shutil.which("ninja")
    if on_path:
        return on_path
    raise BuildError("ninja not found: `pip install ninja` (or install it with your system's package manager)")


@lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    """`nvcc --version`, so that a new toolkit never reuses old binaries. Running nvcc costs ~0.1 s, a
    fifth of the budget for loading a cached kernel, so the answer is kept in the cache folder, keyed by
    the nvcc binary's path, size and modification time (a reinstall changes them)."""
    stat = os.stat(os.path.realpath(nvcc))
    stamp = hashlib.sha256(f"{os.path.realpath(nvcc)}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    memo = cache_root() / f"nvcc-version-{stamp}.txt"
    if memo.is_file():
        return memo.read_text()
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"`{nvcc} --version` failed: {exc}") from exc
    version = out.stdout.strip()
    memo.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(memo, version)
    return version


def nvcc_flags(req: BuildRequest) -> list[str]:
    """Everything after `nvcc` but the output and inputs. -Xptxas -v: the register/spill report goes to
    ptxas.log; -lineinfo: profilers can map SASS back to template lines at no runtime cost."""
    return ["-O3", f"-std={req.cxx_std}", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v", "-lineinfo",
            *shlex.split(req.gencode), *(f"-I{d}" for d in req.include_dirs), *req.extra_flags]


def _torch_version() -> str:
    """torch.__version__ if torch is installed (without importing it when it is not)."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return "no torch"
    import torch

    return str(torch.__version__)


# -- cache keys -----------------------------------------------------------------------------------------

def _header_files(include_dir: Path) -> Iterator[Path]:
    """Headers a source may include from this directory, in a stable order."""
    if not include_dir.is_dir():
        return iter(())
    return iter(sorted(p for p in include_dir.rglob("*") if p.suffix in HEADER_SUFFIXES and p.is_file()))


def cache_key(req: BuildRequest) -> str:
    """sha256 over all inputs of the build. Each field is length-prefixed so that no two different
    inputs can hash the same byte stream."""
    digest = hashlib.sha256()

    def feed(label: str, data: str | bytes) -> None:
        raw = data.encode() if isinstance(data, str) else data
        digest.update(f"{label}:{len(raw)}:".encode())
        digest.update(raw)

    feed("recipe", RECIPE_VERSION)
    for file_name in sorted(req.sources):
        feed("source", file_name)
        feed("text", req.sources[file_name])
    for include_dir in req.include_dirs:
        root = Path(include_dir)
        feed("include", include_dir)
        for header in _header_files(root):
            feed("header", header.relative_to(root).as_posix())
            feed("text", header.read_bytes())
    for flag in nvcc_flags(req):
        feed("flag", flag)
    feed("nvcc", nvcc_version(nvcc_path()))
    feed("torch", _torch_version())
    return digest.hexdigest()


# -- one target -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Target:
    """Where one request lives in the cache."""

    req: BuildRequest
    key: str

    @property
    def stem(self) -> str:
        return f"{self.req.name}-{self.key[:16]}"

    @property
    def directory(self) -> Path:
        return cache_root() / self.stem

    @property
    def library(self) -> Path:
        return self.directory / f"lib{self.req.name}.so"

    @property
    def lock_file(self) -> Path:
        return cache_root() / f"{self.stem}.lock"

    @property
    def log(self) -> Path:
        return self.directory / PTXAS_LOG

    @property
    def failed_log(self) -> Path:
        """Where the rule leaves nvcc's output when nvcc fails (it is renamed to ptxas.log on success)."""
        return self.directory / f"{PTXAS_LOG}.tmp"

    @property
    def sources(self) -> list[Path]:
        return [self.directory / file_name for file_name in sorted(self.req.sources)]

    def is_built(self) -> bool:
        # The rule renames ptxas.log into place before the .so, so an existing .so implies its log.
        return self.library.is_file()

    def result(self, *, cached: bool, seconds: float) -> BuildResult:
        # A cache copied or cleaned by other tools may keep the .so without its log: the library is still whole,
        # only its ptxas report (registers, spills) is gone.
        log = self.log.read_text(errors="replace") if self.log.is_file() else ""
        return BuildResult(self.library, self.key, cached, seconds, log)

    def command(self) -> list[str]:
        """The nvcc command the rule runs, for error messages (the rule adds the redirections)."""
        return [nvcc_path(), *nvcc_flags(self.req), "-o", f"{self.library}.tmp", *map(str, self.sources)]


def write_atomically(path: Path, text: str) -> None:
    """Write via a temp file and os.replace, so a reader (or a crashed writer) never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _ninja_path_escape(path: Path | str) -> str:
    """A path as a word of a ninja `build` or `subninja` line."""
    return str(path).replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _ninja_value(text: str) -> str:
    """Text as a ninja variable value (only `$` is special there)."""
    return text.replace("$", "$$")


def _shell_word(path: Path | str) -> str:
    """A path as one shell word inside a ninja variable value."""
    return _ninja_value(shlex.quote(str(path)))


def _ninja_file(target: _Target) -> str:
    """build.ninja for one target. The rule compiles to `$out.tmp` and keeps nvcc's output (stdout and
    stderr, where ptxas -v reports) in ptxas.log.tmp; it always prints that output, so ninja shows it
    on failure; only on success it renames the log and then the library into place (atomic renames,
    library last: its existence is the "built" marker)."""
    nvcc = shlex.join([nvcc_path(), *nvcc_flags(target.req)])
    command = (f"{_ninja_value(nvcc)} -o $so_tmp $in > $log_tmp 2>&1; rc=$$?; cat $log_tmp; "
               f"[ $$rc -eq 0 ] || exit $$rc; mv -f $log_tmp $log && mv -f $so_tmp $out")
    inputs = " ".join(_ninja_path_escape(s) for s in target.sources)
    return "\n".join([
        f"# {target.req.name}, cache key {target.key}. Generated by generator/toolchain/builder.py; reproduce with",
        f"#   ninja -f {NINJA_FILE}   (run in this directory after deleting lib{target.req.name}.so)",
        "ninja_required_version = 1.3",
        "",
        "rule nvcc",
        f"  command = {command}",
        f"  description = nvcc {target.req.name}",
        "",
        f"build {_ninja_path_escape(target.library)}: nvcc {inputs}",
        f"  so_tmp = {_shell_word(f'{target.library}.tmp')}",
        f"  log = {_shell_word(target.log)}",
        f"  log_tmp = {_shell_word(target.failed_log)}",
        "",
    ])


def _prepare(target: _Target) -> None:
    """Write the sources and build.ninja into the target's directory (the caller holds its lock)."""
    target.directory.mkdir(parents=True, exist_ok=True)
    for path in target.sources:
        write_atomically(path, target.req.sources[path.name])
    write_atomically(target.directory / NINJA_FILE, _ninja_file(target))
    with contextlib.suppress(FileNotFoundError):
        target.failed_log.unlink()  # so that a log found after a failure is this run's


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if missing) for the ``with`` block; closing the file
    releases it, also when the process dies, so a crashed holder never leaves a stale lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(targets: list[_Target]) -> Iterator[None]:
    """Hold the flock of every target. Taken in sorted order so two processes building overlapping
    sets cannot deadlock."""
    with contextlib.ExitStack() as stack:
        for target in sorted(targets, key=lambda t: t.stem):
            stack.enter_context(file_lock(target.lock_file))
        yield


# -- errors ---------------------------------------------------------------------------------------------

_PTXAS_NOISE = re.compile(r"^(ptxas info\s*:|\s+\d+ bytes stack frame,)")


def _errors_only(nvcc_output: str) -> str:
    """nvcc's output without the ptxas -v report, which would bury the errors."""
    lines = [line for line in nvcc_output.splitlines() if not _PTXAS_NOISE.match(line)]
    return "\n".join(lines).strip()


def _failure_message(target: _Target, ninja_output: str) -> str:
    if target.failed_log.is_file():
        output = _errors_only(target.failed_log.read_text(errors="replace"))
    else:  # nvcc never ran: ninja itself failed
        output = f"(ninja output)\n{ninja_output.strip()}"
    source = ", ".join(map(str, target.sources))
    return (f"nvcc failed to build {target.req.name}\n"
            f"  source:  {source}\n"
            f"  command: {shlex.join(target.command())}\n"
            f"  rerun:   cd {shlex.quote(str(target.directory))} && ninja -f {NINJA_FILE}\n"
            f"nvcc output:\n{output or '(none)'}")


# -- progress -------------------------------------------------------------------------------------------

class _Progress:
    """One stderr line when a build turns out slow (> SLOW_BUILD_S), one when it ends; silent for fast
    builds so that a cache hit or a tiny kernel prints nothing. The end line says how many of the kernels another
    process built while this one waited for their locks (``by_others``), so that ranks starting together on one
    machine do not each claim the build."""

    def __init__(self, what: str, verbose: bool, count: int = 1) -> None:
        self.what = what
        self.count = count
        self.by_others = 0
        self.started = threading.Event()
        self.t0 = time.perf_counter()
        self.timer = threading.Timer(0.0 if verbose else SLOW_BUILD_S, self._announce)
        self.timer.daemon = True

    def _announce(self) -> None:
        self.started.set()
        print(f"[gemmgen] building {self.what} (nvcc)...", file=sys.stderr, flush=True)

    def __enter__(self) -> _Progress:
        self.timer.start()
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.timer.cancel()
        self.timer.join()  # so that "building" is never printed after "built"
        if self.started.is_set():
            seconds = time.perf_counter() - self.t0
            if exc_type is None and self.by_others == self.count:
                line = f"another process built {self.what}; waited {seconds:.1f} s"
            else:
                verb = "built" if exc_type is None else "failed to build"
                others = f" ({self.by_others} of them by another process)" if self.by_others else ""
                line = f"{verb} {self.what} in {seconds:.1f} s{others}"
            print(f"[gemmgen] {line}", file=sys.stderr, flush=True)


def _describe(targets: list[_Target]) -> str:
    if len(targets) == 1:
        return targets[0].req.name
    return f"{len(targets)} kernels ({', '.join(t.req.name for t in targets)})"


# -- ninja ----------------------------------------------------------------------------------------------

def _run_ninja(targets: list[_Target], *, verbose: bool, on_line: Callable[[str], None] | None = None) -> str:
    """One ninja run over all targets (a top-level file that subninja's each target's build.ninja, in
    a temp dir under cache_root() that also takes ninja's own log, not the caller's cwd). Returns
    ninja's output; ``on_line`` sees each line as it comes. -k 0: keep going, so every failing kernel is
    reported and every good one cached."""
    workdir = Path(tempfile.mkdtemp(prefix=".ninja-", dir=cache_root()))
    try:
        top = workdir / NINJA_FILE
        lines = [f"subninja {_ninja_path_escape(t.directory / NINJA_FILE)}" for t in targets]
        top.write_text("ninja_required_version = 1.3\n" + "\n".join(lines) + "\n")
        cmd = [ninja_path(), "-f", str(top), "-j", str(os.cpu_count() or 1), "-k", "0"]
        if verbose:
            cmd.append("-v")  # show the full nvcc commands
            print(f"[gemmgen] {shlex.join(cmd)}", file=sys.stderr, flush=True)
        return _stream(cmd, cwd=workdir, echo=verbose, on_line=on_line)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _stream(cmd: list[str], *, cwd: Path, echo: bool, on_line: Callable[[str], None] | None = None) -> str:
    """Run cmd, returning its combined output; with echo, also pass it through to stderr as it comes."""
    chunks = []
    with subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            chunks.append(line)
            if echo:
                sys.stderr.write(line)
            if on_line is not None:
                on_line(line)
    return "".join(chunks)


# -- entry points ---------------------------------------------------------------------------------------

#: ``build_many``'s progress callback: called once per distinct request when its library is ready (True; at once
#: for a cached one) or its build has failed (False), as ninja finishes it.
BuildProgress = Callable[[BuildRequest, bool], None]
#: The line ninja prints as it finishes an edge of the rule above ("[3/32] nvcc <name>"; not a smart terminal).
_NINJA_FINISHED = re.compile(r"^\[\d+/\d+\] nvcc ([A-Za-z_][A-Za-z0-9_]*)\s*$")


def build(req: BuildRequest, *, verbose: bool = False) -> BuildResult:
    """Build one kernel library, or find it in the cache."""
    return build_many([req], verbose=verbose)[0]


def build_many(reqs: list[BuildRequest], *, verbose: bool = False,
               progress: BuildProgress | None = None) -> list[BuildResult]:
    """Build several kernel libraries with one parallel ninja run; results in the order of ``reqs``.

    Cached libraries are returned without taking any lock: the .so only ever appears complete. The
    others are checked again under their locks (another process may have built them meanwhile).
    ``progress`` hears of each distinct request as it is ready or has failed (see BuildProgress)."""
    t0 = time.perf_counter()
    targets = [_Target(req, cache_key(req)) for req in reqs]
    unique = list({t.stem: t for t in targets}.values())  # a repeated request: one lock, one build
    cached = {t.stem for t in unique if t.is_built()}
    missing = [t for t in unique if t.stem not in cached]
    for t in unique:
        if t.stem in cached:
            if verbose:
                print(f"[gemmgen] {t.req.name}: cached, {t.library}", file=sys.stderr, flush=True)
            if progress is not None:
                progress(t.req, True)
    if missing:
        _build_missing(missing, cached, verbose=verbose, progress=progress)
    seconds = time.perf_counter() - t0
    return [t.result(cached=t.stem in cached, seconds=seconds) for t in targets]


def _build_missing(missing: list[_Target], cached: set[str], *, verbose: bool,
                   progress: BuildProgress | None = None) -> None:
    """Build the targets not found in the cache, holding all their locks; adds to ``cached`` those
    that another process finished while we waited for the locks."""
    cache_root().mkdir(parents=True, exist_ok=True)
    reported: set[str] = set()

    def report(target: _Target) -> None:
        if progress is not None and target.stem not in reported:
            reported.add(target.stem)
            progress(target.req, target.is_built())

    with _Progress(_describe(missing), verbose, len(missing)) as shown, _locked(missing):
        todo = []
        for target in missing:
            if target.is_built():
                cached.add(target.stem)
                report(target)
            else:
                _prepare(target)
                todo.append(target)
        shown.by_others = len(missing) - len(todo)
        if not todo:
            return
        by_name: dict[str, list[_Target]] = {}
        for target in todo:
            by_name.setdefault(target.req.name, []).append(target)

        def on_line(line: str) -> None:
            if progress is not None and (m := _NINJA_FINISHED.match(line)):
                for target in by_name.get(m.group(1), ()):
                    report(target)

        output = _run_ninja(todo, verbose=verbose, on_line=on_line)
        for target in todo:   # whatever ninja's status lines did not name (a custom NINJA_STATUS)
            report(target)
        failed = [t for t in todo if not t.is_built()]
        if failed:
            raise BuildError("\n\n".join(_failure_message(t, output) for t in failed))


# -- ptxas report ---------------------------------------------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")


def spill_report(ptxas_log: str) -> dict[str, dict]:
    """Per entry function (kernel): registers, spill stores/loads and stack frame bytes.

    ptxas -v prints, per kernel, "Compiling entry function 'K'", then "Function properties for K" with
    the stack/spill line, then "Used N registers". Property blocks of other (device) functions are
    skipped. A kernel compiled for several architectures keeps its last report."""
    report: dict[str, dict] = {}
    current: str | None = None      # the kernel whose block we are in
    properties_of: str | None = None
    for line in ptxas_log.splitlines():
        if m := _ENTRY.search(line):
            current, properties_of = m.group(1), None
            report[current] = {"registers": 0, "spill_stores": 0, "spill_loads": 0, "stack": 0}
        elif m := _PROPERTIES.search(line):
            properties_of = m.group(1)
        elif (m := _FRAME.search(line)) and current is not None and properties_of == current:
            stack, stores, loads = map(int, m.groups())
            report[current].update(stack=stack, spill_stores=stores, spill_loads=loads)
        elif (m := _REGISTERS.search(line)) and current is not None:
            report[current]["registers"] = int(m.group(1))
    return report
