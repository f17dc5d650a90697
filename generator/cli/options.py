"""The knob options and the argparse types of the command line: what ``--plan``, ``--tile``, ``--alpha``,
``--epilogue``, ``--shapes`` ... accept and how a bad value is refused (exit 2, with the valid choices), and
``_add_plan_options``, the knob options that plan, render, emit and tune share."""
from __future__ import annotations

import argparse
import math
import re
from typing import Callable

from ..spec.arch import ARCHS
from ..spec.config import FAMILIES, RASTERS, SM90_SCHEDULES
from ..spec.epilogue import ACTIVATIONS, SCALE_MODES
from ..spec.types import LAYOUTS, PLAN_OUTPUT_DTYPES, PLANNABLE_INPUT_DTYPES, Order

#: --plan keys: Gemm keyword arguments (tile, cluster also under their option names) and the op name.
PLAN_OPTION_KEYS = ("dtype", "out_dtype", "layout", "layout_a", "layout_b", "layout_c", "arch", "m", "n", "k",
                    "family", "tile", "warps", "stages", "raster_group", "schedule", "cluster", "raster",
                    "activation", "bias", "alpha", "beta", "scale", "fast_accum", "amax", "dtype_b", "interleave_k",
                    "op_name")
#: --activation's choices: the names generator.epilogue.ACTIVATIONS accepts.
ACTIVATION_CHOICES = tuple(name for name in ACTIVATIONS if isinstance(name, str))
BIAS_CHOICES = ("row", "col")
#: --plan keys spelled as their Gemm keyword argument.
_PLAN_KEY_ALIASES = {"tile_shape": "tile", "cluster_shape": "cluster"}


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
        elif key in ("fast_accum", "amax", "interleave_k"):
            if value.lower() not in ("true", "false", "1", "0"):
                raise argparse.ArgumentTypeError(f"{key}={value!r}: use true or false")
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
                   help="element type of A and B; tf32: fp32 tensors on the tensor cores, every layout (sm90: M/N-major "
                        "tiles transposed in shared memory); e4m3, e5m2, int8: sm90, layout tn (default: %(default)s)")
    g.add_argument("--out-dtype", default=None, choices=[d.value for d in PLAN_OUTPUT_DTYPES],
                   help="element type of D (default: the input dtype; fp32 for tf32, bf16 for fp8, int32 for int8)")
    g.add_argument("--dtype-b", default=None, choices=["e4m3", "e5m2"],
                   help="B's element type where it is not A's: fp8 e4m3 x e5m2 mixes (default: --dtype)")
    g.add_argument("--fast-accum", action="store_true", default=None,
                   help="fp8: sum all of K inside wgmma (torch's use_fast_accum), no promotion into fp32")
    g.add_argument("--interleave-k", action=argparse.BooleanOptionalAction, default=None,
                   help="fp8 (promoted), 64-row cooperative tiles: the two consumer warpgroups take alternate k tiles "
                        "(--no-interleave-k keeps the planner from choosing it; default: the planner's rule)")
    g.add_argument("--amax", action="store_true", default=None,
                   help="with --out-dtype e4m3 or e5m2: also return the amax of D (a 0-dim fp32, for delayed scaling)")
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

