"""Measured winners (``emit --tuning``): the calls of an op, of exact sizes on one GPU, that a tuning table's winner
takes instead of the op's kernel (``routes``), each run by a private op of the package (``tuned_op_name``)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from ..spec.config import KernelConfig, check_config
from ..tune.cache import EntryKey, Table, apply_fields
from .names import check_identifier
from .ops import EmittedOp


def tuned_op_name(config: KernelConfig) -> str:
    """The private op that runs a measured winner's kernel: ``_tuned_<kernel name>``."""
    return check_identifier(f"_tuned_{config.name}", "tuned op name", "_tuned_sm90_bf16_tn_128x128x64_c1x1_s6_pp_g8m")


@dataclass(frozen=True)
class Route:
    """A call of exactly M x N x K by an op, on one GPU, that takes a measured winner's kernel instead of the op's."""

    gpu: str
    sm_count: int
    m: int
    n: int
    k: int
    config: KernelConfig
    ms: float
    estimate_ms: float


def _matches(entry_key: EntryKey, cfg: KernelConfig) -> bool:
    """Whether a tuning entry was measured for ``cfg``'s request (arch, family, dtypes, layout, epilogue) on a single
    problem, whatever its sizes."""
    return (entry_key.arch == cfg.arch and entry_key.family == cfg.family and entry_key.dtype == cfg.dtype_tag
            and entry_key.out_dtype == cfg.out_dtype.value and entry_key.layout == cfg.layout.tag
            and entry_key.epilogue == cfg.epilogue.name_suffix and entry_key.batch == 1)


def routes(op: EmittedOp, tables: Sequence[Table]) -> list[Route]:
    """The calls of ``op`` that a measured winner of ``tables`` takes: per GPU and exact size, the fastest entry
    measured for the op's request whose winner is another kernel than the op's (rebuilt on the op's config and
    checked: an entry that no longer names the same kernel is left out). Sorted, so the package is deterministic."""
    best: dict[tuple[str, int, int, int, int], Route] = {}
    for table in tables:
        for entry in table.entries.values():
            if not _matches(entry.key, op.config):
                continue
            try:
                winner = apply_fields(op.config, entry.config)
                check_config(winner)
            except (TypeError, ValueError):
                continue
            if winner.name != entry.kernel or winner.name == op.config.name:
                continue
            where = (table.device.gpu, table.device.sm_count, entry.key.m, entry.key.n, entry.key.k)
            if where not in best or entry.ms < best[where].ms:
                best[where] = Route(*where, winner, entry.ms, entry.estimate_ms)
    return [best[where] for where in sorted(best)]


def _routes_context(found: list[Route]) -> list[dict[str, Any]]:
    """TUNED's entries of one op in __init__.py: per GPU (its name as a Python string literal), its shapes."""
    devices: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in found:
        devices.setdefault((r.gpu, r.sm_count), []).append(
            {"m": r.m, "n": r.n, "k": r.k, "op": tuned_op_name(r.config), "ms": f"{r.ms:.4g}",
             "estimate_ms": f"{r.estimate_ms:.4g}"})
    # json.dumps of a str is a valid Python string literal: a GPU name read from a table cannot break the code
    return [{"gpu": json.dumps(gpu, ensure_ascii=True), "sm_count": int(sms), "shapes": shapes}
            for (gpu, sms), shapes in devices.items()]
