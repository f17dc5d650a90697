"""The command line: ``python -m generator plan|render|emit|tune|bench|plot ...`` (also installed as ``gemmgen``).

``plan``, ``render`` and ``emit`` take the knobs of the Python API and need neither torch nor a GPU
(with ``--arch``); ``emit`` also takes several plans (``--plan``, ``--plans FILE``); ``bench`` runs
``benchmarks/bench.py`` of a source checkout; ``plot`` draws a benchmark's JSON (needs matplotlib, the
``plot`` extra, but neither torch nor a GPU); ``tune`` measures the configs around the planner's pick on the GPU and
keeps the winner in the tuning cache (``--export`` / ``--import`` move tables, without a GPU). A bad option value exits
with status 2 and a message on stderr that lists the valid choices, as does a knob the template or the
hardware cannot honour. The fused epilogue is given by the knobs (``--activation``, ``--bias``, ``--alpha``,
``--beta``) or by a Python function (``--epilogue module:function`` or ``path/to/file.py:function``).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import math
import os
import re
import runpy
import sys
from pathlib import Path
from typing import Callable, Sequence

from .spec.arch import ARCHS
from .spec.config import FAMILIES, RASTERS, SM90_SCHEDULES
from .spec.epilogue import ACTIVATIONS, KNOB_NAMES, SCALE_MODES, Epilogue, trace
from .spec.types import LAYOUTS, PLAN_OUTPUT_DTYPES, PLANNABLE_INPUT_DTYPES, Order

PROG = "python -m generator"
#: --plan keys: Gemm keyword arguments (tile, cluster also under their option names) and the op name.
PLAN_OPTION_KEYS = ("dtype", "out_dtype", "layout", "layout_a", "layout_b", "layout_c", "arch", "m", "n", "k",
                    "family", "tile", "warps", "stages", "raster_group", "schedule", "cluster", "raster",
                    "activation", "bias", "alpha", "beta", "scale", "fast_accum", "dtype_b", "op_name")
#: --activation's choices: the names generator.epilogue.ACTIVATIONS accepts.
ACTIVATION_CHOICES = tuple(name for name in ACTIVATIONS if isinstance(name, str))
BIAS_CHOICES = ("row", "col")
#: --plan keys spelled as their Gemm keyword argument.
_PLAN_KEY_ALIASES = {"tile_shape": "tile", "cluster_shape": "cluster"}

BENCH_SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"

TOP_EPILOG = f"""\
examples:
  {PROG} plan --dtype bf16 --layout tn --arch 80
  {PROG} plan --dtype bf16 --layout tn --arch 90
  {PROG} plan --dtype fp16 --layout nn --arch 90 --m 8192 --n 8192 --k 8192 --verbose
  {PROG} render --dtype bf16 --layout tn --arch 80 --tile 128x128x32 --stages 4 --out build/kernels
  {PROG} emit --dtype bf16 --layout tn --arch 90 --name my_gemms --out emitted/my_gemms
  {PROG} bench --set square --dtypes bf16
  {PROG} plot benchmarks/results/h200_bench_llm_rules.json --out llm.png

Layouts: first letter A (M x K), second B (K x N); 't' = row-major, 'n' = column-major (BLAS).
'tn' is torch's x @ W.t() for an nn.Linear weight W of shape (N, K). See docs/cli.md and docs/api.md.
"""

PLAN_EPILOG = f"""\
examples:
  {PROG} plan --dtype bf16 --layout tn --arch 80
  {PROG} plan --dtype bf16 --layout tn --arch 80 --m 128 --n 4096 --k 4096 --verbose
  {PROG} plan --dtype bf16 --layout tn --arch 90            (sm90 family: TMA, wgmma, clusters)
  {PROG} plan --arch 90 --tile 128x128x64 --schedule pingpong --cluster 1x2 --raster n --m 4096 --n 8192
  {PROG} plan --dtype fp16 --out-dtype fp32 --layout tt --arch 90 --family sm80 --tile 128x256x32 --warps 2x4 --stages 3
  {PROG} plan --arch 90 --activation gelu_tanh --bias col     (fused epilogue: D = gelu_tanh(acc + bias))
  {PROG} plan --arch 80 --alpha scalar --beta 0.5              (D = alpha * acc + 0.5 * C, alpha a runtime scalar)
  {PROG} plan --arch 90 --epilogue my_epilogues.py:fused       (a function of the accumulator; see generator.epilogue)

At --arch 90 the sm90 family is planned (knobs --schedule, --cluster, --raster); --family sm80 plans
the cp.async/mma.sync family there instead (knob --warps).
"""

RENDER_EPILOG = f"""\
examples:
  {PROG} render --dtype bf16 --layout tn --arch 80 --out build/kernels
  {PROG} render --dtype fp16 --layout nt --arch 90 --tile 128x128x64 --stages 4 --out /tmp/k
  {PROG} render --dtype bf16 --layout tn --arch 90 --schedule pingpong --cluster 1x1 --out /tmp/k
  {PROG} render --arch 90 --activation silu --bias col --out /tmp/k

The .cu files include plain CUDA headers from the templates folder: compile them with
nvcc -I <that folder> (render prints it on stderr).
"""

EMIT_EPILOG = f"""\
examples:
  {PROG} emit --dtype bf16 --layout tn --arch 90 --name my_gemms --out emitted/my_gemms
  {PROG} emit --plan "dtype=bf16,layout=tn,arch=90" --plan "dtype=fp16,layout=nn,arch=80" \\
      --name my_gemms --out emitted/my_gemms
  {PROG} emit --arch 80 --plan dtype=bf16 --plan "dtype=fp16,out_dtype=fp32,op_name=mm_f32" --out emitted/mm80
  {PROG} emit --arch 90 --plan "schedule=pingpong,cluster=1x1" --plan "family=sm80,layout=nt" --out emitted/mm90
  {PROG} emit --plans plans.json --name my_gemms --out emitted/my_gemms
  {PROG} emit --arch 90 --plan "activation=gelu_tanh,bias=col" --plan "alpha=scalar,beta=scalar" --out emitted/ep90

Writes a pip-installable package (torch extension) with one op per plan into --out; then
  pip install --no-build-isolation emitted/my_gemms
  python -c "import my_gemms; help(my_gemms)"
A --plan is comma-separated key=value pairs: {', '.join(PLAN_OPTION_KEYS)}
(tile=128x128x32, warps=2x4, cluster=2x1, activation=relu, bias=col, alpha=scalar). The knobs given as
options (--arch, --dtype, ...) are the defaults of every --plan and --plans entry. --plans takes a JSON list
of objects of Gemm keyword arguments (the plans.json that emit writes into a package is one). Op names
default to gemm_<dtype>_<layout> (+ _o<out dtype>, + _dcol). --name defaults to the --out folder's name.
The ops are differentiable (the package also holds the backward kernels); --no-autograd leaves that out.
Needs neither torch nor a GPU. A plan with a fused epilogue (--activation, --bias, --alpha, --beta, or
--epilogue; activation=..., bias=... in a --plan) makes an op that takes the epilogue's operands after A and
B (gemm_<dtype>_<layout>_<epilogue tag>); it is differentiable too (in A, B and its tensor operands).
"""

PLOT_EPILOG = f"""\
examples:
  {PROG} plot benchmarks/results/h200_bench_llm_rules.json --out llm.png
  {PROG} plot benchmarks/results/h200_bench_llm_rules.json --kind roofline --out roofline.png
  {PROG} plot benchmarks/results/h100_sm90_bench_llm.json --dtype bf16 --kind bars --title "H100, bf16"
  {PROG} plot corpus.json --kind bands --dtype bf16 --out corpus.png

Reads the JSON of benchmarks/bench.py --json or benchmarks/inductor_compare.py --json and draws per shape the
TFLOP/s of ours, cuBLAS, Triton and Inductor (those the file has) with ours / each beneath, and a roofline
(TFLOP/s against FLOP per byte of A, B and D, under the GPU's HBM bandwidth and tensor-core peak).
A benchmarks/bench_corpus.py file ("benchmark": "corpus") is drawn as bands (its only kind): ours / cuBLAS
against tokens, a panel per pass (fwd, dX, dW), a line per layer kind, the geomean and min of every row.
Needs matplotlib: pip install -e ".[plot]". Neither torch nor a GPU.
"""

TUNE_EPILOG = f"""\
examples:
  {PROG} tune --dtype bf16 --layout tn --shapes 4096x4096x4096,512x4096x14336
  {PROG} tune --dtype fp16 --layout tn --family sm80 --shapes 8192x8192x8192 --budget 60 --max-candidates 16
  {PROG} tune --export tuning.json            (every table of the tuning cache, for another machine)
  {PROG} tune --import tuning.json            (then plans of those shapes on a matching GPU take the winners)
  {PROG} emit --dtype bf16 --layout tn --arch 90 --tuning tuning.json --out emitted/my_gemms

Per shape: the legal configs around the planner's pick (its neighbours in tile, stages, cluster, schedule, raster
and split-K/stream-K, then the next best by estimate) are built in one parallel run, checked against a reference
and timed side by side (L2 flushed, interleaved rounds, medians); the winner is kept in the tuning cache
(<cache>/tuning/, docs/tuning.md), so a plan of that request and shape on this GPU uses it from then on
(GEMMGEN_TUNED=0 turns that off), and a second tune of the shape answers from the cache. Needs torch and a GPU,
except --export and --import.
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


def _coefficient(text: str) -> float | str:
    """An argparse type for --alpha/--beta: a finite number (compiled into the kernel) or 'scalar'."""
    if text.strip().lower() == "scalar":
        return "scalar"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or 'scalar' (a number is compiled into the "
                                         "kernel, e.g. 0.5; 'scalar' makes it a runtime argument of the op)")
    return value


def _epilogue_spec(text: str) -> str:
    """An argparse type for --epilogue: 'module:function' or 'path/to/file.py:function' (checked for form
    here; imported and traced after parsing, see _load_epilogue)."""
    target, sep, attr = text.rpartition(":")
    if not sep or not target or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", attr):
        raise argparse.ArgumentTypeError(f"{text!r} is not module:function or path/to/file.py:function "
                                         "(e.g. my_epilogues:fused or ./my_epilogues.py:fused)")
    return text


_epilogue_spec.__name__ = "epilogue"


def _plan_option(text: str) -> dict[str, object]:
    """An argparse type for --plan "dtype=bf16,layout=tn,arch=90": a dict of Gemm keyword arguments
    (plus op_name). Keys and choice-valued values are checked here, so a bad one exits 2 with the choices."""
    choices: dict[str, list[str]] = {
        "dtype": [d.value for d in PLANNABLE_INPUT_DTYPES], "out_dtype": [d.value for d in PLAN_OUTPUT_DTYPES],
        "layout": list(LAYOUTS), "layout_a": [o.value for o in Order], "layout_b": [o.value for o in Order],
        "layout_c": [o.value for o in Order], "arch": [str(a) for a in sorted(ARCHS)],
        "family": list(FAMILIES), "schedule": list(SM90_SCHEDULES), "raster": list(RASTERS),
        "activation": list(ACTIVATION_CHOICES), "bias": list(BIAS_CHOICES), "scale": list(SCALE_MODES),
        "dtype_b": ["e4m3", "e5m2"],
    }
    shapes = {"tile": _shape(3, "128x128x32"), "warps": _shape(2, "2x2"), "cluster": _shape(2, "2x1")}
    entry: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip().replace("-", "_"), value.strip()
        key = _PLAN_KEY_ALIASES.get(key, key)
        if not sep or key not in PLAN_OPTION_KEYS:
            raise argparse.ArgumentTypeError(
                f"{item!r} is not key=value with a key of {', '.join(PLAN_OPTION_KEYS)} "
                f"(e.g. --plan \"dtype=bf16,layout=tn,arch=90\")")
        if key in entry:
            raise argparse.ArgumentTypeError(f"{key!r} is given twice in {text!r}")
        if key in choices and value not in choices[key]:
            listed = ", ".join(repr(c) if key != "arch" else c for c in choices[key])
            raise argparse.ArgumentTypeError(f"{key}={value!r} is not a valid choice (choose from {listed})")
        if key in shapes:
            entry[{"tile": "tile_shape", "cluster": "cluster_shape"}.get(key, key)] = shapes[key](value)
        elif key in ("arch", "m", "n", "k"):
            entry[key] = int(value) if key == "arch" else _positive_int(value)
        elif key in ("alpha", "beta"):
            try:
                entry[key] = _coefficient(value)
            except argparse.ArgumentTypeError as err:
                raise argparse.ArgumentTypeError(f"{key}={err}") from None
        elif key == "fast_accum":
            if value.lower() not in ("true", "false", "1", "0"):
                raise argparse.ArgumentTypeError(f"fast_accum={value!r}: use true or false")
            entry[key] = value.lower() in ("true", "1")
        elif key in ("stages", "raster_group"):
            try:
                entry[key] = int(value)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{key}={value!r} is not an integer") from None
        else:
            entry[key] = value
    if not entry:
        raise argparse.ArgumentTypeError(f"{text!r} names no knob; e.g. --plan \"dtype=bf16,layout=tn,arch=90\"")
    return entry


_plan_option.__name__ = "plan"  # argparse says "invalid plan value"


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to compute")
    g.add_argument("--dtype", default="bf16", choices=[d.value for d in PLANNABLE_INPUT_DTYPES],
                   help="element type of A and B; tf32: fp32 tensors on the tensor cores (sm90: layout tn; sm80: "
                        "every layout); e4m3, e5m2, int8: sm90, layout tn (default: %(default)s)")
    g.add_argument("--out-dtype", default=None, choices=[d.value for d in PLAN_OUTPUT_DTYPES],
                   help="element type of D (default: the input dtype; fp32 for tf32, bf16 for fp8, int32 for int8)")
    g.add_argument("--dtype-b", default=None, choices=["e4m3", "e5m2"],
                   help="B's element type where it is not A's: fp8 e4m3 x e5m2 mixes (default: --dtype)")
    g.add_argument("--fast-accum", action="store_true", default=None,
                   help="fp8: sum all of K inside wgmma (torch's use_fast_accum), no promotion into fp32")
    g.add_argument("--scale", default=None, choices=list(SCALE_MODES),
                   help="scales of fp8 A and B, taken by the op after them: tensor (one each), row (per row of A / "
                        "column of B), block (1x128 of A, 128x128 of B)")
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
    k.add_argument("--family", default=None, choices=list(FAMILIES),
                   help="kernel family: sm80 (cp.async, mma.sync; arch 80 and newer) or sm90 (TMA, wgmma; "
                        "arch 90); default: sm90 at --arch 90, sm80 below")
    k.add_argument("--tile", type=_shape(3, "128x128x32"), default=None, metavar="MxNxK",
                   help="thread-block tile BMxBNxBK, e.g. 128x128x32 (sm80) or 128x256x64 (sm90)")
    k.add_argument("--warps", type=_shape(2, "2x2"), default=None, metavar="MxN",
                   help="sm80: warp grid WMxWN, e.g. 2x2 (4 warps) or 2x4 (8 warps)")
    k.add_argument("--stages", type=int, default=None, metavar="S", help="shared-memory pipeline stages, e.g. 4")
    k.add_argument("--raster-group", type=int, default=None, metavar="G",
                   help="tile rows (sm90 --raster n: columns) walked together for L2 reuse, e.g. 8")
    k.add_argument("--schedule", default=None, choices=list(SM90_SCHEDULES),
                   help="sm90: ws (one tile per block), cooperative (persistent, two warpgroups per tile) or "
                        "pingpong (persistent, warpgroups on alternate tiles)")
    k.add_argument("--cluster", type=_shape(2, "2x1"), default=None, metavar="MxN",
                   help="sm90: thread-block cluster, 1x1, 2x1 (blocks along M share B) or 1x2 (share A)")
    k.add_argument("--raster", default=None, choices=list(RASTERS),
                   help="sm90: tile order, m (down M through --raster-group rows, then along N) or n "
                        "(along N through --raster-group columns, then down M)")
    e = p.add_argument_group("fused epilogue: D = act(alpha * acc + beta * C + bias), or --epilogue FN "
                             "(default: none, D = acc = A @ B)")
    e.add_argument("--activation", default=None, choices=ACTIVATION_CHOICES, metavar="NAME",
                   help=f"applied last: {', '.join(ACTIVATION_CHOICES)} (gelu_erf = gelu, swish = silu)")
    e.add_argument("--bias", default=None, choices=BIAS_CHOICES,
                   help="add a vector operand 'bias': col (length N, as nn.Linear's) or row (length M)")
    e.add_argument("--alpha", type=_coefficient, default=None, metavar="X|scalar",
                   help="scale acc by a number compiled into the kernel, or 'scalar' (a runtime argument of the op)")
    e.add_argument("--beta", type=_coefficient, default=None, metavar="X|scalar",
                   help="add beta * C, C an M x N operand: a number compiled in, or 'scalar' (a runtime argument)")
    e.add_argument("--epilogue", type=_epilogue_spec, default=None, metavar="MODULE:FUNCTION",
                   help="a Python function of the accumulator and annotated operands (see generator.epilogue), "
                        "from an importable module (my_epilogues:fused) or a file (path/to/file.py:fused); "
                        "instead of the four knobs above")


def _add_plot_parser(sub) -> None:
    from .plot import KINDS  # matplotlib-free: plot imports matplotlib only when it draws

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


def _shape_list(text: str) -> list[tuple[int, ...]]:
    """An argparse type for --shapes: MxNxK,MxNxK,..."""
    return [_shape(3, "4096x4096x4096")(part.strip()) for part in text.split(",") if part.strip()]


_shape_list.__name__ = "shapes"


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


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


# -- commands ---------------------------------------------------------------------------------------

def _error(message: str, status: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return status


def _plan_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """The Gemm keyword arguments that the knob options give."""
    return dict(dtype=args.dtype, layout=args.layout, arch=args.arch, out_dtype=args.out_dtype,
                layout_a=args.layout_a, layout_b=args.layout_b, layout_c=args.layout_c,
                m=args.m, n=args.n, k=args.k, family=args.family, tile_shape=args.tile, warps=args.warps,
                stages=args.stages, raster_group=args.raster_group, schedule=args.schedule,
                cluster_shape=args.cluster, raster=args.raster, activation=args.activation, bias=args.bias,
                alpha=args.alpha, beta=args.beta, epilogue=args.epilogue, scale=args.scale,
                fast_accum=args.fast_accum, dtype_b=args.dtype_b)


def _one_line(err: BaseException) -> str:
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__


def _import_epilogue_target(target: str, spec: str) -> object:
    """The module of --epilogue's left part: a .py file (loaded from its path) or an importable module
    (the current folder first on the path, as for python -m)."""
    is_file = target.endswith(".py") or "/" in target or os.sep in target
    if is_file:
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"--epilogue {spec!r}: no such file {target!r}")
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
        name = f"_gemmgen_epilogue_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"
        extra_path, what = str(path.resolve().parent), f"the file {target!r}"
    else:
        name, extra_path, what = target, os.getcwd(), f"the module {target!r}"
    added = extra_path not in sys.path
    if added:
        sys.path.insert(0, extra_path)
    try:
        if not is_file:
            return importlib.import_module(target)
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ImportError(f"cannot load {target!r} as a Python module")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module  # string annotations and dataclasses look their module up here
        try:
            loader_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    except Exception as err:
        raise ValueError(f"--epilogue {spec!r}: cannot import {what}: {type(err).__name__}: "
                         f"{_one_line(err)}") from None
    finally:
        if added and extra_path in sys.path:
            sys.path.remove(extra_path)


def _load_epilogue(spec: str) -> Epilogue:
    """--epilogue module:function / path/to/file.py:function: import it and trace the function.
    Raises ValueError (the CLI exits 2) with a one-line message for every way this can fail."""
    target, _, attr = spec.rpartition(":")
    fn: object = _import_epilogue_target(target, spec)
    for part in attr.split("."):
        if not hasattr(fn, part):
            functions = sorted(k for k, v in getattr(fn, "__dict__", {}).items()
                               if callable(v) and not k.startswith("_")
                               and getattr(v, "__module__", None) == getattr(fn, "__name__", None))
            listed = f" (its functions: {', '.join(functions)})" if functions else ""
            raise ValueError(f"--epilogue {spec!r}: {target!r} has no attribute {attr!r}{listed}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise ValueError(f"--epilogue {spec!r}: {attr} is not a function of the accumulator (its type is "
                         f"{type(fn).__name__})")
    try:
        return trace(fn)
    except Exception as err:  # EpilogueError (a ValueError) says why and how to fix it; anything else is a bug in fn
        kind = "" if isinstance(err, ValueError) else f"{type(err).__name__}: "
        raise ValueError(f"--epilogue {spec!r}: {kind}{_one_line(err)}") from None


def _resolve_epilogue(args: argparse.Namespace) -> None:
    """Refuse --epilogue with the knobs, then replace args.epilogue (module:function) by its Epilogue."""
    if args.epilogue is None:
        return
    knobs = [f"--{k}" for k in KNOB_NAMES if getattr(args, k) is not None]
    if knobs:
        raise ValueError(f"--epilogue cannot be combined with {', '.join(knobs)}: use one or the other (put the "
                         "activation, bias and scales into the function, or drop --epilogue and use the knobs)")
    args.epilogue = _load_epilogue(args.epilogue)


def _no_gpu_hint(err: RuntimeError) -> RuntimeError:
    """arch=None could not detect the GPU: say how to do without one on the command line."""
    choices = " or ".join(f"--arch {a}" for a in (80, 90))
    return RuntimeError(f"{err} (on the command line: {choices})")


def _make_plan(args: argparse.Namespace):
    from .gemm import Gemm

    try:
        return Gemm(**_plan_kwargs(args))
    except RuntimeError as err:
        if args.arch is None:
            raise _no_gpu_hint(err) from None
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


def _check_plan_options(entries: list[dict[str, object]], args: argparse.Namespace) -> None:
    """A --plan's epilogue knobs (activation=, ...) cannot be combined with --epilogue, as the options cannot."""
    for j, entry in enumerate(entries):
        knobs = [f"{k}=" for k in KNOB_NAMES if k in entry]
        if knobs and args.epilogue is not None:
            raise ValueError(f"--plan {j}: {', '.join(knobs)} cannot be combined with --epilogue: use one or the "
                             "other")


def cmd_emit(args: argparse.Namespace) -> int:
    from .emit import backward_ops, default_package_name, emit, resolve_ops
    from .plans import load_plans_file, plans_file_autograd, plans_from_entries

    defaults = {k: v for k, v in _plan_kwargs(args).items() if v is not None}
    plans, op_names = [], []
    try:
        if args.plans is not None:
            plans, op_names = load_plans_file(args.plans, defaults)
        if args.plan:
            _check_plan_options(args.plan, args)
            more, more_names = plans_from_entries(args.plan, defaults, where="--plan")
            plans, op_names = plans + more, op_names + more_names
        if not plans:
            plans, op_names = [_make_plan(args)], [None]
    except RuntimeError as err:
        raise _no_gpu_hint(err) from None
    if args.op_name is not None:
        if len(args.op_name) != len(plans):
            raise ValueError(f"--op-name is given {len(args.op_name)} time(s) for {len(plans)} plan(s): "
                             "give one per plan, in order, or none")
        op_names = args.op_name
    name = args.name if args.name is not None else default_package_name(args.out)
    ops = resolve_ops(plans, op_names)
    autograd = args.autograd
    if autograd is None:   # no --no-autograd: what the plans file says (emit's plans.json does), else True
        autograd = plans_file_autograd(args.plans) if args.plans is not None else None
        autograd = True if autograd is None else autograd
    out = emit(plans, name=name, out=args.out, op_names=op_names, autograd=autograd, tuning=args.tuning)
    print(f"{out}: package {name}, {len(ops)} op(s):")
    for op in ops:
        epilogue = op.config.epilogue
        fused = "" if epilogue.is_identity else f", D = {epilogue.text}"
        inputs = op.config.dtype_tag.replace("x", " x ")
        print(f"  {name}.{op.name}  ({inputs} -> {op.config.out_dtype.value}, layout "
              f"{op.config.layout.tag}{fused}, kernel {op.config.name}, sm_{op.config.arch})")
    forward_only = [op.name for op in ops if not op.differentiable]
    if not autograd:
        why = "--no-autograd" if args.autograd is False else 'the plans file says "autograd": false'
        print(f"autograd: none ({why}): the ops are not differentiable")
    else:
        if len(forward_only) < len(ops):
            print(f"autograd: differentiable, with {len(backward_ops(ops))} backward kernel(s) in the package "
                  "(--no-autograd leaves them out)")
        if forward_only:
            print(f"autograd: forward only (fp8 and int8 refuse inputs that require grad): {', '.join(forward_only)}")
    print(f"install: pip install --no-build-isolation {out}")
    return 0


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
    from .gemm import Gemm
    from .tune import current_device, export_tables, import_tables

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


def cmd_plot(args: argparse.Namespace) -> int:
    from .plot import Corpus, PlotOptions, check_kind, default_out, load_results, plot

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


if __name__ == "__main__":
    sys.exit(main())
