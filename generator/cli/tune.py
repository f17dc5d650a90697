"""``tune``: measure the configs around the planner's pick for each shape on the GPU and keep the winner;
``--export`` / ``--import`` move the tuning tables (no GPU needed)."""
from __future__ import annotations

import argparse

from .common import _error, _plan_kwargs


def _tune_shapes(args: argparse.Namespace) -> list[tuple[int, ...]]:
    if args.shapes:
        if any(v is not None for v in (args.m, args.n, args.k)):
            raise ValueError("give the problems either as --shapes or as --m --n --k, not both")
        return args.shapes
    if all(v is not None for v in (args.m, args.n, args.k)):
        return [(args.m, args.n, args.k)]
    if any(v is not None for v in (args.m, args.n, args.k)):
        raise ValueError("--m, --n and --k go together (or use --shapes MxNxK,...)")
    return []


def cmd_tune(args: argparse.Namespace) -> int:
    from ..gemm import Gemm
    from ..tune import current_device, export_tables, import_tables

    shapes = _tune_shapes(args)
    if not shapes and args.import_file is None and args.export_file is None:
        raise ValueError("tune needs --shapes MxNxK,... (the problems to tune), or --export FILE / --import FILE")
    if args.import_file is not None:
        for table, path, changed in import_tables(args.import_file):
            print(f"imported {changed} of {len(table.entries)} entr{'y' if len(table.entries) == 1 else 'ies'} into "
                  f"{path}: {table.device.describe()}")
    if shapes:
        device = current_device()
        if device is None:
            return _error("tune times kernels on a CUDA GPU, and torch sees none here: run it on the GPU machine "
                          "(--export and --import work without one; plans on a GPU of a matching table take its "
                          "winners)")
        kwargs = {k: v for k, v in _plan_kwargs(args).items() if k not in ("m", "n", "k")}
        for m, n, k in shapes:
            plan = Gemm(**kwargs, m=m, n=n, k=k)
            result = plan.tune(budget_s=args.budget, max_candidates=args.max_candidates, progress=not args.quiet,
                               force=args.force)
            print(result.format(), flush=True)
    if args.export_file is not None:
        tables = export_tables(args.export_file)
        entries = sum(len(t.entries) for t in tables)
        print(f"exported {len(tables)} table(s), {entries} entr{'y' if entries == 1 else 'ies'}, to {args.export_file}")
    return 0

