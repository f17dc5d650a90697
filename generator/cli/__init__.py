"""The command line: ``python -m generator plan|render|emit|tune|bench|plot ...`` (also installed as ``gemmgen``).

``plan``, ``render`` and ``emit`` take the knobs of the Python API and need neither torch nor a GPU
(with ``--arch``); ``emit`` also takes several plans (``--plan``, ``--plans FILE``); ``bench`` runs
``benchmarks/bench.py`` of a source checkout; ``plot`` draws a benchmark's JSON (needs matplotlib, the
``plot`` extra, but neither torch nor a GPU); ``tune`` measures the configs around the planner's pick on the GPU and
keeps the winner in the tuning cache (``--export`` / ``--import`` move tables, without a GPU). A bad option value exits
with status 2 and a message on stderr that lists the valid choices, as does a knob the template or the
hardware cannot honour. The fused epilogue is given by the knobs (``--activation``, ``--bias``, ``--alpha``,
``--beta``) or by a Python function (``--epilogue module:function`` or ``path/to/file.py:function``).

Its modules, each importing only those above it:

    options   the knob options (_add_plan_options) and the argparse types (--plan, --tile, --alpha, --epilogue, ...)
    help_text PROG and the examples at the end of each command's --help
    parser    build_parser: every command's arguments
    epilogue  --epilogue module:function: import and trace the function
    common    the plan the knob options give (_make_plan, _plan_kwargs), the no-GPU hint, the error exit
    plan      cmd_plan, cmd_render
    emit      cmd_emit
    tune      cmd_tune
    plot      cmd_plot

This module holds ``main`` and ``bench`` (forwarded to benchmarks/bench.py before argparse sees its arguments), and
re-exports the public names; ``from generator.cli import main`` is the way in.
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Sequence

from .common import _error
from .emit import cmd_emit
from .help_text import (BENCH_EPILOG, EMIT_EPILOG, PLAN_EPILOG, PLOT_EPILOG, PROG, RENDER_EPILOG, TOP_EPILOG,
                      TUNE_EPILOG)
from .epilogue import _resolve_epilogue
from .options import ACTIVATION_CHOICES, BIAS_CHOICES, PLAN_OPTION_KEYS
from .parser import build_parser
from .plan import cmd_plan, cmd_render
from .plot import cmd_plot
from .tune import cmd_tune

__all__ = [
    "ACTIVATION_CHOICES", "BENCH_EPILOG", "BENCH_SCRIPT", "BIAS_CHOICES", "EMIT_EPILOG", "PLAN_EPILOG",
    "PLAN_OPTION_KEYS", "PLOT_EPILOG", "PROG", "RENDER_EPILOG", "TOP_EPILOG", "TUNE_EPILOG", "build_parser",
    "cmd_bench", "cmd_emit", "cmd_plan", "cmd_plot", "cmd_render", "cmd_tune", "main",
]

BENCH_SCRIPT = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "bench.py"


def cmd_bench(argv: Sequence[str]) -> int:
    if not BENCH_SCRIPT.is_file():
        print(f"error: bench needs {BENCH_SCRIPT}, which is part of a source checkout of gemmgen; "
              "run it from a clone of the repository (pip install -e .)", file=sys.stderr)
        return 2
    namespace = runpy.run_path(str(BENCH_SCRIPT), run_name="gemmgen_bench")
    main = namespace.get("main")
    if main is None:  # a script without main(argv): run it as a script
        saved = sys.argv
        sys.argv = [str(BENCH_SCRIPT), *argv]
        try:
            runpy.run_path(str(BENCH_SCRIPT), run_name="__main__")
        except SystemExit as exit_:
            return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        finally:
            sys.argv = saved
        return 0
    saved = sys.argv
    sys.argv = [f"{PROG} bench", *argv]  # what the script's argparse prints as its name
    try:
        status = main(list(argv))
    except SystemExit as exit_:  # argparse's --help and errors
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        sys.argv = saved
    return status if isinstance(status, int) else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return cmd_bench(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)  # a bad value: usage and the valid choices on stderr, exit 2
    try:
        if args.command in ("plan", "render", "emit", "tune"):
            _resolve_epilogue(args)
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "render":
            return cmd_render(args)
        if args.command == "emit":
            return cmd_emit(args)
        if args.command == "plot":
            return cmd_plot(args)
        if args.command == "tune":
            return cmd_tune(args)
    except (ValueError, RuntimeError) as err:
        return _error(str(err))
    except OSError as err:
        return _error(str(err), status=1)
    parser.error(f"unknown command {args.command!r}")
    return 2

