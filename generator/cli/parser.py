"""``build_parser``: the argparse parser of every command (bench's arguments belong to its script)."""
from __future__ import annotations

import argparse

from .help_text import (BENCH_EPILOG, EMIT_EPILOG, PLAN_EPILOG, PLOT_EPILOG, PROG, RENDER_EPILOG, TOP_EPILOG,
                      TUNE_EPILOG)
from .options import _add_plan_options, _plan_option, _positive_float, _positive_int, _shape_list


def _add_plot_parser(sub) -> None:
    from ..plot import KINDS  # matplotlib-free: plot imports matplotlib only when it draws

    plot = sub.add_parser("plot", help="draw a benchmark's JSON: ours vs cuBLAS, Triton, Inductor; a roofline",
                          description="Draw a results JSON of benchmarks/bench.py or inductor_compare.py into an "
                                      "image: TFLOP/s per shape and a roofline; one of bench_corpus.py: ours / "
                                      "cuBLAS against tokens per pass and layer kind. Needs matplotlib "
                                      "(pip install -e \".[plot]\"), not torch or a GPU.",
                          epilog=PLOT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    plot.add_argument("results", metavar="RESULTS.json", help="the JSON a benchmark wrote (--json)")
    plot.add_argument("--out", default=None, metavar="FILE.png",
                      help="image to write, its format from the suffix (.png, .svg, .pdf); default: "
                           "<RESULTS>.png in the current folder (<RESULTS>_<kind>.png for one kind)")
    plot.add_argument("--kind", default="both", choices=list(KINDS),
                      help="bars (TFLOP/s per shape and the ratios), roofline, or both side by side "
                           "(default: %(default)s); bands for a bench_corpus.py file (its default, and only kind)")
    plot.add_argument("--title", default=None, help="figure title (default: the GPU, the file's name and torch)")
    plot.add_argument("--dtype", action="append", default=None, metavar="DTYPE",
                      help="only the rows of this dtype (repeat for more; default: every row)")
    plot.add_argument("--dpi", type=_positive_int, default=100, help="resolution (default: %(default)s)")


def _add_tune_parser(sub) -> None:
    tune = sub.add_parser("tune", help="measure the configs around the planner's pick on the GPU; keep the winner",
                          description="Tune each shape: build the legal configs around the planner's pick in "
                                      "parallel, time them on the GPU side by side, keep the fastest correct one "
                                      "in the tuning cache and print every candidate's time. Needs torch and a GPU "
                                      "(--export and --import do not).",
                          epilog=TUNE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_plan_options(tune)
    t = tune.add_argument_group("tuning")
    t.add_argument("--shapes", type=_shape_list, default=None, metavar="MxNxK,...",
                   help="the problems to tune, e.g. 4096x4096x4096,512x4096x14336 (or one with --m --n --k)")
    t.add_argument("--budget", type=_positive_float, default=None, metavar="SECONDS",
                   help="per shape: past this many seconds (builds included) no further candidate or timing round "
                        "starts (the planner's pick is always timed)")
    t.add_argument("--max-candidates", type=_positive_int, default=None, metavar="N",
                   help="configs measured per shape, the pick included (default: 32)")
    t.add_argument("--force", action="store_true", help="measure again even where the cache has a winner")
    t.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    io = tune.add_argument_group("sharing tables (no GPU needed)")
    io.add_argument("--export", dest="export_file", default=None, metavar="FILE",
                    help="write every table of the tuning cache into FILE (after tuning --shapes, if given)")
    io.add_argument("--import", dest="import_file", default=None, metavar="FILE",
                    help="merge the tables of FILE (an export, a table, or a package's plans.json) into the cache; "
                         "a table of another GPU is kept apart and used only on such a GPU")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Plan, render and benchmark GEMM kernels (gemmgen).",
        epilog=TOP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="{plan,render,emit,tune,bench,plot}")
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
    emit = sub.add_parser("emit", help="write a pip-installable package (torch extension) with one op per plan",
                          description="Write a standalone, pip-installable package into --out: the rendered "
                                      "kernels, the headers they include, a torch extension binding with one op "
                                      "per plan, setup.py and pyproject.toml. Needs neither torch nor a GPU when "
                                      "every plan has an arch.",
                          epilog=EMIT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_plan_options(emit)
    many = emit.add_argument_group("several plans (the options above are their defaults)")
    many.add_argument("--plan", action="append", type=_plan_option, default=None, metavar="K=V,...",
                      help="one plan as key=value pairs, e.g. \"dtype=bf16,layout=tn,arch=90\"; repeat for more")
    many.add_argument("--plans", default=None, metavar="FILE",
                      help="a JSON file: a list of objects of Gemm keyword arguments (or emit's plans.json)")
    out = emit.add_argument_group("output")
    out.add_argument("--name", default=None, metavar="NAME",
                     help="package name, also the torch.ops namespace: lowercase letters, digits, '_' "
                          "(default: the --out folder's name)")
    out.add_argument("--op-name", action="append", default=None, metavar="OP",
                     help="op name, one per plan in order (default: gemm_<dtype>_<layout>...)")
    out.add_argument("--out", required=True, metavar="DIR",
                     help="folder to write the package into (created; a package emitted there before is replaced)")
    out.add_argument("--no-autograd", dest="autograd", action="store_false", default=None,
                     help="leave out the backward pass: the ops are not differentiable, and the package builds "
                          "only the planned kernels (by default it also builds up to 8 backward kernels per dtype "
                          "and arch; a --plans file written by emit keeps its own choice)")
    out.add_argument("--tuning", default=None, metavar="FILE",
                     help="a tuning table (tune --export's file, or a package's plans.json): the package also holds "
                          "the kernels measured fastest for its ops' requests and calls them for exactly the sizes "
                          "and GPU they won on")
    _add_tune_parser(sub)
    # bench's arguments belong to benchmarks/bench.py; main() forwards them before argparse sees them.
    sub.add_parser("bench", help="run benchmarks/bench.py (ours vs torch.matmul vs Triton); needs a GPU",
                   add_help=False, epilog=BENCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_plot_parser(sub)
    return parser
