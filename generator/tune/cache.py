"""The tuning cache: measured winners, persistent, one JSON table per device under ``<cache_root>/tuning/``.

File format (docs/tuning.md has it in full)::

    {"format": "gemmgen-tuning", "format_version": 1,
     "device": {"gpu": ..., "sm_count": ..., "cc": ..., "driver": ..., "cuda": ..., "torch": ..., "config_space": ...},
     "entries": {"<key text>": {"key": {...}, "kernel": ..., "config": {...}, "ms": ..., "estimate_kernel": ...,
                                "estimate_ms": ..., "gain": ..., "candidates": ..., "date": ..., "seconds": ...,
                                "table": [[kernel, ms or null, note], ...]}}}

An export (``tune --export``) holds several tables: ``{"format": ..., "format_version": 1, "tables": [{"device": ...,
"entries": ...}, ...]}``. Writers hold a lock file beside the table (the builder's flock), read what is on disk, merge
their entry and replace the file atomically, so concurrent tuning runs lose nothing and readers never see half a
file. Readers take no lock.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..toolchain import cache_root, file_lock, write_atomically
from ..spec.config import KernelConfig
from .device import DeviceKey

FORMAT = "gemmgen-tuning"
FORMAT_VERSION = 1
#: The KernelConfig fields an entry records: what tuning chooses. The rest (dtypes, layout, epilogue) is the key's.
CONFIG_FIELDS = ("family", "tile", "warps", "stages", "raster_group", "cluster", "schedule", "raster", "stream_k",
                 "staging_in_ring", "interleave_k")
#: Fields an entry written before they existed lacks, with the value every config had then.
ADDED_CONFIG_FIELDS = {"staging_in_ring": False, "interleave_k": False}
_TUPLE_FIELDS = ("tile", "warps", "cluster")


class TableError(ValueError):
    """A tuning table (or an export of tables) that cannot be read: the message names the file and what is wrong."""


def tuning_dir() -> Path:
    """$GEMMGEN_TUNING_DIR, else ``<cache_root()>/tuning`` (read on every call, as cache_root is)."""
    explicit = os.environ.get("GEMMGEN_TUNING_DIR")
    return Path(explicit).expanduser() if explicit else cache_root() / "tuning"


def table_path(device: DeviceKey) -> Path:
    return tuning_dir() / device.file_name


def table_files() -> list[Path]:
    folder = tuning_dir()
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


# -- keys and entries -----------------------------------------------------------------------------------------

#: The EntryKey fields that are the request (the rest is the problem: m, n, k, batch).
REQUEST_FIELDS = ("arch", "family", "dtype", "out_dtype", "layout", "epilogue", "knobs")


@dataclass(frozen=True)
class EntryKey:
    """What makes a measured winner valid besides the device: the request (arch, family, dtypes, layout, fused
    epilogue, the knobs the user fixed) and the problem."""

    arch: int
    family: str
    dtype: str          # KernelConfig.dtype_tag: "bf16", or "e4m3xe5m2"
    out_dtype: str
    layout: str         # Layout.tag: "tn", or "tn_dcol" for a column-major D
    epilogue: str       # Epilogue.name_suffix ("" for none): the expression's tag and digest, scales included
    knobs: str          # the fixed knobs, "stages=4,tile=128x128x64" ("" for none)
    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def text(self) -> str:
        """The entry's name in a table: sm90/bf16/tn/-/-/bf16/4096x4096x4096x1 style, one per field."""
        return (f"sm{self.arch}/{self.family}/{self.dtype}/{self.out_dtype}/{self.layout}/{self.epilogue or '-'}/"
                f"{self.knobs or '-'}/{self.m}x{self.n}x{self.k}x{self.batch}")

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: object, where: str) -> EntryKey:
        names = [f.name for f in fields(cls)]
        if not isinstance(data, dict) or sorted(data) != sorted(names):
            raise TableError(f"{where}: \"key\" must be an object with exactly the keys {', '.join(names)}")
        for name in names:
            want = int if name in ("arch", "m", "n", "k", "batch") else str
            if not isinstance(data[name], want) or isinstance(data[name], bool):
                kind = "an integer" if want is int else "a string"
                raise TableError(f"{where}: key field {name!r} is {data[name]!r}, not {kind}")
        return cls(**data)

    def same_request(self, other: EntryKey) -> bool:
        """Whether the two keys differ only in the problem."""
        return all(getattr(self, f) == getattr(other, f) for f in REQUEST_FIELDS)


def config_fields(cfg: KernelConfig) -> dict[str, Any]:
    """What an entry records of a config: the fields tuning chooses, as JSON values."""
    return {name: list(getattr(cfg, name)) if name in _TUPLE_FIELDS and getattr(cfg, name) is not None
            else getattr(cfg, name) for name in CONFIG_FIELDS}


def apply_fields(base: KernelConfig, recorded: dict[str, Any]) -> KernelConfig:
    """``base`` (a config of the same request: its dtypes, layout and epilogue) with the recorded fields."""
    values = {name: tuple(recorded[name]) if name in _TUPLE_FIELDS and recorded[name] is not None else recorded[name]
              for name in CONFIG_FIELDS}
    return KernelConfig(**{**{f.name: getattr(base, f.name) for f in fields(base)}, **values})


@dataclass(frozen=True)
class Entry:
    """One measured winner: its config (``config``: CONFIG_FIELDS), its time and the estimate's pick's, measured in
    the same interleaved rounds."""

    key: EntryKey
    kernel: str
    config: dict[str, Any]
    ms: float
    estimate_kernel: str
    estimate_ms: float
    candidates: int
    date: str                       # when it was measured, UTC, ISO 8601
    seconds: float = 0.0            # the tuning run's wall time, builds included
    table: tuple[tuple[str, float | None, str], ...] = field(default=(), compare=False)   # (kernel, ms, note)

    @property
    def gain(self) -> float:
        """The winner's speed-up over the estimate's pick, minus 1 (0.05: 5 % faster)."""
        return self.estimate_ms / self.ms - 1.0

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key.to_json(), "kernel": self.kernel, "config": dict(self.config), "ms": self.ms,
                "estimate_kernel": self.estimate_kernel, "estimate_ms": self.estimate_ms,
                "gain": round(self.gain, 6), "candidates": self.candidates, "date": self.date,
                "seconds": round(self.seconds, 3), "table": [list(row) for row in self.table]}

    @classmethod
    def from_json(cls, data: object, where: str) -> Entry:
        if not isinstance(data, dict):
            raise TableError(f"{where}: an entry must be an object")
        missing = [k for k in ("key", "kernel", "config", "ms", "estimate_kernel", "estimate_ms", "candidates", "date")
                   if k not in data]
        if missing:
            raise TableError(f"{where}: the entry lacks {', '.join(missing)}")
        config = data["config"]
        if isinstance(config, dict):
            config = {**{name: value for name, value in ADDED_CONFIG_FIELDS.items() if name not in config}, **config}
        if not isinstance(config, dict) or sorted(config) != sorted(CONFIG_FIELDS):
            raise TableError(f"{where}: \"config\" must be an object with exactly the keys {', '.join(CONFIG_FIELDS)}")
        for name in ("ms", "estimate_ms"):
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise TableError(f"{where}: {name!r} must be a positive number of milliseconds, got {value!r}")
        for name in ("kernel", "estimate_kernel", "date"):
            if not isinstance(data[name], str):
                raise TableError(f"{where}: {name!r} must be a string, got {data[name]!r}")
        rows = data.get("table", [])
        if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == 3 for r in rows):
            raise TableError(f"{where}: \"table\" must be a list of [kernel, ms or null, note]")
        return cls(key=EntryKey.from_json(data["key"], where), kernel=data["kernel"], config=dict(config),
                   ms=float(data["ms"]), estimate_kernel=data["estimate_kernel"],
                   estimate_ms=float(data["estimate_ms"]), candidates=int(data["candidates"]), date=data["date"],
                   seconds=float(data.get("seconds", 0.0)), table=tuple(tuple(r) for r in rows))


@dataclass
class Table:
    """One device's entries, by key text."""

    device: DeviceKey
    entries: dict[str, Entry] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "device": self.device.to_json(),
                "entries": {text: self.entries[text].to_json() for text in sorted(self.entries)}}

    @classmethod
    def from_json(cls, data: object, where: str) -> Table:
        if not isinstance(data, dict) or "device" not in data or "entries" not in data:
            raise TableError(f"{where}: a table is an object with \"device\" and \"entries\"")
        try:
            device = DeviceKey.from_json(data["device"], where)
        except ValueError as err:
            raise TableError(str(err)) from None
        raw = data["entries"]
        if not isinstance(raw, dict):
            raise TableError(f"{where}: \"entries\" must be an object of key text -> entry")
        entries = {}
        for text, value in raw.items():
            entry = Entry.from_json(value, f"{where}, entry {text!r}")
            if entry.key.text != text:
                raise TableError(f"{where}: entry {text!r} is filed under the wrong name: its key is "
                                 f"{entry.key.text!r}")
            entries[text] = entry
        return cls(device, entries)

    def merge(self, other: Table) -> int:
        """Take ``other``'s entries (same device); of two with one key the later measurement wins (``other``'s on
        the same date). Returns how many entries were added or replaced."""
        changed = 0
        for text, entry in other.entries.items():
            mine = self.entries.get(text)
            if mine is None or (entry.date >= mine.date and entry != mine):
                self.entries[text] = entry
                changed += 1
        return changed


def _check_header(data: object, where: str) -> dict[str, Any]:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TableError(f"{where} is not a gemmgen tuning table (its \"format\" is not {FORMAT!r})")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
        why = "written by a newer gemmgen" if newer else "of an unknown format version"
        raise TableError(f"{where} is {why} (format_version {version!r}; this gemmgen reads {FORMAT_VERSION})")
    return data


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as err:
        raise TableError(f"cannot read {str(path)!r}: {err.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TableError(f"{str(path)!r} is not valid JSON ({err}): delete it, or re-tune to write a new one") from None


def read_table(path: Path) -> Table:
    """One device's table file; TableError says what is wrong with a corrupt one."""
    return Table.from_json(_check_header(_read_json(path), repr(str(path))), repr(str(path)))


def load_tables(path: str | os.PathLike[str]) -> list[Table]:
    """The tables of a file: an export (``"tables"``), one table file, or an emitted package's plans.json (its
    ``"tuning"``); TableError for anything else."""
    path = Path(path)
    data = _read_json(path)
    if isinstance(data, dict) and "tuning" in data and data.get("format") != FORMAT:   # a package's plans.json
        data = data["tuning"]
    where = repr(str(path))
    _check_header(data, where)
    if "tables" in data:
        if not isinstance(data["tables"], list):
            raise TableError(f"{where}: \"tables\" must be a list of tables")
        return [Table.from_json(t, f"{where}, table {i}") for i, t in enumerate(data["tables"])]
    return [Table.from_json(data, where)]


def bundle_json(tables: list[Table]) -> dict[str, Any]:
    """An export of several tables, in one JSON object."""
    return {"format": FORMAT, "format_version": FORMAT_VERSION,
            "tables": [{k: v for k, v in t.to_json().items() if k in ("device", "entries")} for t in tables]}


# -- reading: a memo of parsed tables, checked against the file's size and time --------------------------------

_PARSED: dict[Path, tuple[tuple[int, int], Table | None]] = {}   # a cache (the only state kept): path -> parsed


def _signature(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def cached_table(path: Path) -> Table | None:
    """The table at ``path`` (None where there is none, or it is corrupt: then one warning per version of the
    file), parsed once per version of the file."""
    signature = _signature(path)
    if signature is None:
        return None
    memo = _PARSED.get(path)
    if memo is not None and memo[0] == signature:
        return memo[1]
    try:
        table: Table | None = read_table(path)
    except TableError as err:
        print(f"[gemmgen] ignoring the tuning table {err}", file=sys.stderr)
        table = None
    _PARSED[path] = (signature, table)
    return table


def lookup(device: DeviceKey, key: EntryKey) -> Entry | None:
    """The measured winner for ``key`` on ``device``, if one was recorded."""
    table = cached_table(table_path(device))
    return None if table is None else table.entries.get(key.text)


# -- writing --------------------------------------------------------------------------------------------------

def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _read_for_update(path: Path, device: DeviceKey) -> Table:
    """What is on disk now (the caller holds the lock); a corrupt file is moved aside, with a warning."""
    if not path.exists():
        return Table(device)
    try:
        table = read_table(path)
    except TableError as err:
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(path, aside)
        print(f"[gemmgen] the tuning table {err}; moved it to {aside} and started a new one", file=sys.stderr)
        return Table(device)
    if table.device != device:
        raise TableError(f"{str(path)!r} holds the table of another device ({table.device.describe()}) under this "
                         f"device's file name: delete it")
    return table


def merge_into_cache(table: Table) -> tuple[Path, int]:
    """Merge ``table``'s entries into the cache's table of its device (under the lock, atomically). Returns the
    file and how many entries were added or replaced."""
    path = table_path(table.device)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(_lock_path(path)):
        current = _read_for_update(path, table.device)
        changed = current.merge(table)
        write_atomically(path, json.dumps(current.to_json(), indent=1, sort_keys=False) + "\n")
    return path, changed


def record(device: DeviceKey, entry: Entry) -> Path:
    """Add (or replace) one entry in ``device``'s table."""
    path, _ = merge_into_cache(Table(device, {entry.key.text: entry}))
    return path


def cache_tables() -> list[Table]:
    """Every readable table in the cache (corrupt ones are named on stderr and left out)."""
    return [t for t in (cached_table(p) for p in table_files()) if t is not None]


def export_tables(dest: str | os.PathLike[str]) -> list[Table]:
    """Write every table of the cache into one file (``tune --export``); returns them. Refuses when there is none."""
    tables = cache_tables()
    if not tables:
        raise TableError(f"there is no tuning table to export in {tuning_dir()} (tune a shape first, or set "
                         "GEMMGEN_CACHE_DIR / GEMMGEN_TUNING_DIR to where the tables are)")
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    write_atomically(Path(dest), json.dumps(bundle_json(tables), indent=1) + "\n")
    return tables


def import_tables(src: str | os.PathLike[str]) -> list[tuple[Table, Path, int]]:
    """Merge the tables of ``src`` (an export, a table file, or a package's plans.json) into the cache, each into its
    own device's file: (table, file, entries added or replaced) per table. A table measured on another device is kept
    apart and used only where the device key matches (docs/tuning.md)."""
    tables = load_tables(src)
    return [(table, *merge_into_cache(table)) for table in tables]
