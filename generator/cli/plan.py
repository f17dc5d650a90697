"""``plan`` (print the planned config and why) and ``render`` (write its CUDA sources into a folder)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import _make_plan


def cmd_plan(args: argparse.Namespace) -> int:
    plan = _make_plan(args)
    print(plan)
    if args.verbose:
        rejected = plan.rejected
        print(f"rejected:     {len(rejected) or 'none'}")
        for line in rejected:
            print(f"  {line}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from ..render import templates_dir

    plan = _make_plan(args)
    files = plan.render()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        print(path)
    print(f"# {plan.name}: the sources include headers from {templates_dir()} (nvcc -I that folder)",
          file=sys.stderr)
    return 0

