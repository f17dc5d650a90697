"""The dispatch tables shipped with gemmgen: the winners of tuning runs over the shape corpus of real models' layers
(``benchmarks/tune_corpus.py``) on one GPU model, one file per GPU under ``generator/tune/tables/``, in the tuning
cache's export format (docs/tuning.md).

A plan with size hints that the user's own tuning cache does not answer takes the table's winner for its request
(dtypes, layout, epilogue, fixed knobs), its N, K and batch, and its band of rows: an entry measured at ``m`` rows
answers every M in (m/2, m] (an entry at 256 serves M = 129-256; ``benchmarks/tune_corpus.py`` checks a winner inside
that band before it ships it).
An entry answers only a plan whose estimate picks the kernel it was measured against (``estimate_kernel``): its
winner beat that pick, not whatever a later planner or another row count picks, so a planner change retires the
entries it touches instead of overriding a new pick with an old measurement. Shapes the table does not hold keep the
estimate. ``print(plan)`` then says "from the <GPU> table".

A table holds for its GPU model, not for one machine: it is matched on the GPU's name, SM count, compute
capability and the config space's version (``DeviceKey`` minus driver, CUDA and torch, which the user's own
measurements are keyed on as well). ``GEMMGEN_TUNED=0`` turns the tables off with the cache.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .cache import REQUEST_FIELDS, Entry, EntryKey, Table, TableError, load_tables
from .device import DeviceKey

#: Where the shipped tables live (package data).
TABLES_DIR = Path(__file__).resolve().parent / "tables"
#: The DeviceKey fields a shipped table must share with the GPU it answers for.
MODEL_FIELDS = ("gpu", "sm_count", "cc", "config_space")


@dataclass(frozen=True)
class ShippedTable:
    """One GPU model's winners, by request and layer: {(request text, n, k, batch): [(m, entry), ...] by m}."""

    device: DeviceKey
    layers: dict[tuple[str, int, int, int], tuple[tuple[int, Entry], ...]]

    @classmethod
    def of(cls, table: Table) -> ShippedTable:
        layers: dict[tuple[str, int, int, int], list[tuple[int, Entry]]] = {}
        for entry in table.entries.values():
            layers.setdefault(layer_key(entry.key), []).append((entry.key.m, entry))
        return cls(table.device, {key: tuple(sorted(rows, key=lambda r: r[0])) for key, rows in layers.items()})

    def answer(self, key: EntryKey) -> Entry | None:
        """The entry whose band of rows holds ``key.m``: the smallest measured m >= key.m, if key.m > m / 2."""
        for m, entry in self.layers.get(layer_key(key), ()):
            if m >= key.m:
                return entry if key.m * 2 > m else None
        return None

    @property
    def label(self) -> str:
        return f"the {short_gpu_name(self.device.gpu)} table"


def layer_key(key: EntryKey) -> tuple[str, int, int, int]:
    """What an entry answers for besides its band of rows: the request and the layer's N, K and batch."""
    request = "/".join(str(getattr(key, f)) for f in REQUEST_FIELDS)
    return request, key.n, key.k, key.batch


def short_gpu_name(gpu: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100': the model, as people name it."""
    words = [w for w in gpu.replace("NVIDIA", "").split() if w]
    return words[0] if words else gpu


def same_model(table: DeviceKey, device: DeviceKey) -> bool:
    return all(getattr(table, f) == getattr(device, f) for f in MODEL_FIELDS)


@lru_cache(maxsize=1)
def shipped_tables() -> tuple[ShippedTable, ...]:
    """Every table shipped in TABLES_DIR (read once per process: package data does not change under it). A file
    that cannot be read is a packaging error, raised with its name."""
    tables = []
    for path in sorted(TABLES_DIR.glob("*.json")) if TABLES_DIR.is_dir() else []:
        try:
            tables += [ShippedTable.of(t) for t in load_tables(path)]
        except TableError as err:
            raise TableError(f"the shipped dispatch table {err}") from None
    return tuple(tables)


def shipped_answer(device: DeviceKey, key: EntryKey) -> tuple[Entry, str] | None:
    """The shipped winner for ``key`` on ``device``'s GPU model and the table's label, or None."""
    for table in shipped_tables():
        if same_model(table.device, device):
            entry = table.answer(key)
            if entry is not None:
                return entry, table.label
    return None
