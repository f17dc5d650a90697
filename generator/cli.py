"""The command line: ``python -m generator plan|render|bench ...`` (also installed as ``gemmgen``).

``plan`` and ``render`` take the knobs of the Python API and need neither torch nor a GPU (with
``--arch``); ``bench`` runs ``benchmarks/bench.py`` of a source checkout. A bad option value exits
with status 2 and a message on stderr that lists the valid choices, as does a knob the template or the
hardware cannot honour.
"""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path
from typing import Callable, Sequence

from .arch import ARCHS
from .types import INPUT_DTYPES, LAYOUTS, OUTPUT_DTYPES, Order

PROG = "python -m generator"
BENCH_SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"

TOP_EPILOG = f"""\
examples:
  {PROG} plan --dtype bf16 --layout tn --arch 80
  {PROG} plan --dtype fp16 --layout nn --arch 90 --m 8192 --n 8192 --k 8192 --verbose
  {PROG} render --dtype bf16 --layout tn --arch 80 --tile 128x128x32 --stages 4 --out build/kernels
  {PROG} bench --set square --dtypes bf16

Layouts: first letter A (M x K), second B (K x N); 't' = row-major, 'n' = column-major (BLAS).
'tn' is torch's x @ W.t() for an nn.Linear weight W of shape (N, K). See README.md.
"""

PLAN_EPILOG = f"""\
examples:
  {PROG} plan --dtype bf16 --layout tn --arch 80
  {PROG} plan --dtype bf16 --layout tn --arch 80 --m 128 --n 4096 --k 4096 --verbose
  {PROG} plan --dtype fp16 --out-dtype fp32 --layout tt --arch 90 --tile 128x256x32 --warps 2x4 --stages 3
"""

RENDER_EPILOG = f"""\
examples:
  {PROG} render --dtype bf16 --layout tn --arch 80 --out build/kernels
  {PROG} render --dtype fp16 --layout nt --arch 90 --tile 128x128x64 --stages 4 --out /tmp/k

The .cu files include plain CUDA headers from the templates folder: compile them with
nvcc -I <that folder> (render prints it on stderr).
"""

BENCH_EPILOG = f"""\
examples:
  {PROG} bench --set square --dtypes bf16
  {PROG} bench --help        (the benchmark's own options)

Runs benchmarks/bench.py of a source checkout with the remaining arguments; needs torch and a GPU.
"""


# -- argument types ---------------------------------------------------------------------------------

def _shape(parts: int, example: str) -> Callable[[str], tuple[int, ...]]:
    """An argparse type for 'MxNxK' / 'MxN': positive integers joined by 'x'."""

    def parse(text: str) -> tuple[int, ...]:
        items = text.lower().split("x")
        try:
            values = tuple(int(i) for i in items)
        except ValueError:
            values = ()
        if len(values) != parts or any(v < 1 for v in values):
            raise argparse.ArgumentTypeError(f"{text!r} is not {parts} positive integers joined by 'x', e.g. {example}")
        return values

    parse.__name__ = "x".join("MNK"[:parts])  # what argparse says in "invalid ... value"
    return parse


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to compute")
    g.add_argument("--dtype", default="bf16", choices=[d.value for d in INPUT_DTYPES],
                   help="element type of A and B (default: %(default)s)")
    g.add_argument("--out-dtype", default=None, choices=[d.value for d in OUTPUT_DTYPES],
                   help="element type of D (default: the input dtype)")
    g.add_argument("--layout", default="tn", choices=list(LAYOUTS),
                   help="storage of A then B, BLAS letters: 't' = row-major, 'n' = column-major "
                        "(default: %(default)s, torch's x @ W.t())")
    orders = [o.value for o in Order]
    g.add_argument("--layout-a", default=None, choices=orders, help="storage of A (M x K); overrides --layout")
    g.add_argument("--layout-b", default=None, choices=orders, help="storage of B (K x N); overrides --layout")
    g.add_argument("--layout-c", default=None, choices=orders, help="storage of D (M x N) (default: row)")
    g.add_argument("--arch", type=int, default=None, choices=sorted(ARCHS),
                   help="compute capability to plan for, e.g. 80 (A100) or 90 (H100); "
                        "default: the visible GPU's (needs torch and a GPU)")
    g.add_argument("--m", type=_positive_int, default=None, metavar="M", help="problem size hint: rows of A and D")
    g.add_argument("--n", type=_positive_int, default=None, metavar="N", help="problem size hint: columns of B and D")
    g.add_argument("--k", type=_positive_int, default=None, metavar="K", help="problem size hint: the reduction length")
    k = p.add_argument_group("knobs (each left to the planner unless given)")
    k.add_argument("--tile", type=_shape(3, "128x128x32"), default=None, metavar="MxNxK",
                   help="thread-block tile BMxBNxBK, e.g. 128x128x32")
    k.add_argument("--warps", type=_shape(2, "2x2"), default=None, metavar="MxN",
                   help="warp grid WMxWN, e.g. 2x2 (4 warps) or 2x4 (8 warps)")
    k.add_argument("--stages", type=int, default=None, metavar="S", help="shared-memory pipeline stages, e.g. 4")
    k.add_argument("--raster-group", type=int, default=None, metavar="G",
                   help="block rows walked together for L2 reuse, e.g. 8")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Plan, render and benchmark GEMM kernels (gemmgen).",
        epilog=TOP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="{plan,render,bench}")
    sub.required = True
    plan = sub.add_parser("plan", help="print the planned kernel config and its name",
                          description="Print the config the planner picks (with a 'name: <kernel name>' line) "
                                      "and why. Needs neither torch nor a GPU when --arch is given.",
                          epilog=PLAN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_plan_options(plan)
    plan.add_argument("--verbose", "-v", action="store_true",
                      help="also list the candidate configs the planner rejected, with the reason")
    render = sub.add_parser("render", help="write the kernel's CUDA sources to a folder",
                            description="Render the planned kernel's CUDA sources into --out and print their "
                                        "paths. Needs neither torch nor a GPU when --arch is given.",
                            epilog=RENDER_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_plan_options(render)
    render.add_argument("--out", required=True, metavar="DIR", help="folder to write the sources into (created)")
    # bench's arguments belong to benchmarks/bench.py; main() forwards them before argparse sees them.
    sub.add_parser("bench", help="run benchmarks/bench.py (ours vs torch.matmul vs Triton); needs a GPU",
                   add_help=False, epilog=BENCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser


# -- commands ---------------------------------------------------------------------------------------

def _error(message: str, status: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return status


def _make_plan(args: argparse.Namespace):
    from .gemm import Gemm

    try:
        return Gemm(args.dtype, args.layout, arch=args.arch, out_dtype=args.out_dtype,
                    layout_a=args.layout_a, layout_b=args.layout_b, layout_c=args.layout_c,
                    m=args.m, n=args.n, k=args.k, tile_shape=args.tile, warps=args.warps,
                    stages=args.stages, raster_group=args.raster_group)
    except RuntimeError as err:
        if args.arch is None:  # the GPU could not be detected: say how to do without one
            choices = " or ".join(f"--arch {a}" for a in (80, 90))
            raise RuntimeError(f"{err} (on the command line: {choices})") from None
        raise


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
    from .render import templates_dir

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
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "render":
            return cmd_render(args)
    except (ValueError, RuntimeError) as err:
        return _error(str(err))
    except OSError as err:
        return _error(str(err), status=1)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
