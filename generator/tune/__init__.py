"""Measured tuning: ``tune(problem)`` enumerates the KernelConfigs around the planner's pick, builds them in
parallel, times them on the GPU side by side and caches the winner (DESIGN.md); a plan created for a problem that
has a cached winner uses it (``lookup_choice``), and says so.

    plan = Gemm("bf16", "tn", m=4096, n=4096, k=4096)
    result = plan.tune()          # or: python -m generator tune --dtype bf16 --layout tn --shapes 4096x4096x4096
    print(result.format())        # every candidate's time; print(plan) now has a "tuned:" line

Above the runtime in the stages (it builds and calls ops), below ``gemm`` (which calls it) and ``emit`` (which embeds
its tables). Importing it needs no torch: the measuring half (``measure``, ``timing``) is imported by a run.
The file format, the key and what invalidates an entry: docs/tuning.md.
"""
from .cache import (FORMAT, FORMAT_VERSION, Entry, EntryKey, Table, TableError, export_tables, import_tables,
                    load_tables, tuning_dir)
from .candidates import DEFAULT_MAX_CANDIDATES, Space, candidates, neighbours
from .device import DeviceKey, current_device
from .result import Candidate, TunedChoice, TuneResult
from .tuner import TUNED_ENV, NoGpuError, entry_key, lookup_choice, lookup_wanted, tune, tuned_plan

__all__ = ["DEFAULT_MAX_CANDIDATES", "FORMAT", "FORMAT_VERSION", "TUNED_ENV", "Candidate", "DeviceKey", "Entry",
           "EntryKey", "NoGpuError", "Space", "Table", "TableError", "TuneResult", "TunedChoice", "candidates",
           "current_device", "entry_key", "export_tables", "import_tables", "load_tables", "lookup_choice",
           "lookup_wanted", "neighbours", "tune", "tuned_plan", "tuning_dir"]
