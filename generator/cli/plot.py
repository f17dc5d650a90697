"""``plot``: draw a benchmark's results JSON into an image (generator.plot does the drawing)."""
from __future__ import annotations

import argparse
from pathlib import Path


def cmd_plot(args: argparse.Namespace) -> int:
    from ..plot import Corpus, PlotOptions, check_kind, default_out, load_results, plot

    results = load_results(args.results)   # a missing or malformed file: ValueError, exit 2
    check_kind(results, args.kind)         # bands for a corpus file only, bars and roofline for any other
    if args.dtype:
        results = results.only(args.dtype)
    out = Path(args.out) if args.out is not None else default_out(args.results, args.kind)
    drawn = plot(results, out, PlotOptions(kind=args.kind, title=args.title, dpi=args.dpi))
    skipped = f" ({results.skipped} row(s) {results.SKIPPED_WHY} left out)" if results.skipped else ""
    if isinstance(results, Corpus):
        what, kind = f"{len(results.rows)} corpus row(s) ({', '.join(results.passes)})", "bands"
    else:
        what, kind = f"{len(results.points)} shape(s)", args.kind
    print(f"{drawn.out}: {what} of {results.device}, {kind}{skipped}")
    return 0

