"""Fuzzing: random GEMM calls of every form against a float64 reference, per kernel family x dtype.

    python3 gpu/fuzz.py                                      # sm80 + sm90 x bf16 + fp16, 500 cases each
    python3 gpu/fuzz.py --families sm90 --dtypes e4m3,int8   # also tf32, e4m3, e5m2, int8
    python3 gpu/fuzz.py --replay sm90:bf16:181404617183437   # one case again, printed in full
    python3 gpu/fuzz.py --dry-run                            # draw the cases and show them, no GPU
    compute-sanitizer --tool memcheck python3 gpu/fuzz.py --sample 10   # small cases only (build them first)

What is fixed: per family x dtype a small set of ops (``ops_for``: every layout, column-major D, other output
dtypes, five fused epilogues that between them use every operation and operand kind, a few schedules and tiles),
all built in one parallel ninja run before the first case, since a build is the cost. What each case draws from
its own seed (``draw_case``): which op; the call form (plain 2-D; batched 3-D with shared, broadcast and batch
stride 0 operands; sm90's grouped rows with empty and ragged groups, the same groups in masked slabs, and its list of
problems); M, N, K from 0 to 10^4, log-uniform with a bias to edges (1, 7, 8, 9, tile multiples +-1, 127/128/129,
...) under a cap on M*N*K;
the leading dimensions (tight, 16-byte padded, or padded off the 16-byte rule), base offsets and gaps between
matrices; a poisoned out= or none, out=C in place; the epilogue's scalars and the inputs' values.

Each case is checked against float64 (``generator.runtime.evaluate`` of the plan's epilogue on the float64
product): the relative error ||D - ref|| / ||ref|| of every problem (each matrix of a batch, each group, each
listed problem) within the dtype's bound (tests/gpu's), D's padding and the inputs untouched, the output's shape
and dtype. The denominator is at least a tenth of the norm of the expression without its activations (which run on
the hardware tanh for 16-bit outputs: their error is absolute in what they read), and at least the norm of that
expression at acc = sqrt(A^2 @ B^2) (a sum's rounding scales with it however much the sum cancels); for a plain GEMM
of more than a few elements it is ||ref|| itself. Padding and gaps are NaN, so a read outside a view shows.

A call the documentation says an op refuses (a batched call with a matrix operand or a second output, grouped
calls on sm80, ws, stream-K or fused-epilogue plans, a grouped operand off the 16-byte rule) is drawn now and then
on purpose; raising ValueError or TypeError there counts as "refused", never as passed. Any other exception, or a
refusal of a call the documentation allows, is a failure. Each failure prints the case and the command that
replays it; the exit status is 1 if any case failed.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests" / "gpu"))   # gpu_cases: the GPU tests' bounds and layouts

import torch  # noqa: E402

from generator import Gemm  # noqa: E402
from generator import epilogue as ep  # noqa: E402
from generator.spec.config import KernelConfig  # noqa: E402
from generator.runtime.evaluate import evaluate, operand_values  # noqa: E402
from generator.spec.epilogue import IDENTITY, MAINLOOP_KINDS, Epilogue, Expr, trace, with_scales  # noqa: E402

from gpu_cases import BOUND, LAYOUTS  # noqa: E402

FAMILIES = ("sm80", "sm90")
DTYPES = ("bf16", "fp16", "tf32", "e4m3", "e5m2", "int8")
DEFAULT_DTYPES = ("bf16", "fp16")
FORMS = ("plain", "batched", "grouped", "list", "masked", "grouped_k")
#: Grouped calls along K (B 2-D) are cases of their own seeds, at and above this one (case_seed gives 48 bits), so
#: that the draws of every other case, and the replay keys written down for them, stay as they were.
K_SEED_BASE = 1 << 48
#: How many cases along K a run adds per case of the other forms, per family (sm80: to check the refusal).
K_CASES = {"sm90": 1 / 8, "sm80": 1 / 50}

MAX_SIZE = 10_000
MAX_VOLUME = 1 << 32       # M*N*K of a call (times its batch, summed over a list): the biggest take ~1 ms each
MAX_ELEMENTS = 1 << 26     # elements of one operand or D (the float64 reference holds several such)
SAMPLE_MAX_VOLUME = 1 << 22   # --sample draws only cases this small: compute-sanitizer runs kernels 10-100x slower
EDGES = (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 319,
         320, 321, 511, 512, 513, 1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096, 4097, 8191, 8192, 8193, 9999,
         10000)
TILE_EDGES = (64, 128, 192, 256)   # every BM, BN and BK of the plans divides one of these
ALIGN_BYTES = 16                   # TMA's and cp.async's rule for base addresses, leading dimensions, strides
ELEM_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4, "e4m3": 1, "e5m2": 1, "int8": 1, "int32": 4}
DEFAULT_OUT = {"bf16": "bf16", "fp16": "fp16", "tf32": "fp32", "e4m3": "bf16", "e5m2": "bf16", "int8": "int32"}
FORM_WEIGHTS = {"sm90": {"plain": 0.40, "batched": 0.23, "grouped": 0.14, "list": 0.14, "masked": 0.09},
                # sm80 takes no grouped call: drawn rarely, to check that it is refused with a message
                "sm80": {"plain": 0.62, "batched": 0.32, "grouped": 0.02, "list": 0.02, "masked": 0.02}}
#: A masked call's slab: its largest group's rows and this many more (padding rows past every count).
SLAB_EXTRA = {0: 2, 1: 1, 7: 1, 64: 1}
BATCHES = {1: 1, 2: 3, 3: 3, 4: 2, 5: 1, 8: 2, 16: 1, 33: 1, 64: 0.5}
BATCH_MODES = {"3d": 0.5, "2d": 0.25, "bcast1": 0.1, "stride0": 0.15}   # how each operand of a batched call is held
GROUP_COUNTS = {1: 1, 2: 2, 3: 2, 4: 2, 5: 1, 8: 2, 9: 1, 16: 1}
LIST_COUNTS = {0: 0.2, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 8: 1, 12: 0.5}
REFUSAL_PROBES = 0.05   # how often a form is paired with an op that does not take it (the refusal is the check)
OUT_GIVEN = 0.7         # how often a poisoned out= is passed where the op takes one
IN_PLACE = 0.4          # how often out=C is passed where the epilogue's C allows it
FLOOR = 0.1             # the error's denominator is at least FLOOR x ||the epilogue without its activations||
ACC_FLOOR = 1.0         # ... and ACC_FLOOR x ||the same at acc = sqrt(A^2 @ B^2)||: a sum's rounding scales with it


# -- the epilogues (each in a few ops): together every operation and operand kind of generator.epilogue --------------

def ep_linear(acc, bias: ep.Col):
    """nn.Linear and GELU: the knobs' activation="gelu_tanh", bias="col"."""
    return ep.gelu_tanh(acc + bias)


def ep_residual(acc, C: ep.Matrix, alpha: ep.Scalar, beta: ep.Scalar):
    """alpha * acc + beta * C: the source operand (sm90: by TMA; sm80: in pairs); out=C in place."""
    return alpha * acc + beta * C


FP32_COL_MATRIX = ep.Matrix(dtype="fp32", order="col")
FP32_COL = ep.Col(dtype="fp32")


def ep_mixed(acc, R: FP32_COL_MATRIX, b: FP32_COL, lo: ep.Scalar):
    """Operands of their own dtype and order; clamp, tanh, max, min, abs, division, constants."""
    z = acc + b
    return ep.clamp(ep.tanh(z) + R, -0.75, 0.75) / 2.0 + ep.max(ep.abs(z), R) - ep.min(z, lo)


def ep_aux(acc, bias: ep.Row):
    """A second output (the pre-activation), a per-row bias, erf GELU."""
    h = acc + bias
    return ep.gelu(h), h


def ep_scaled(acc, scale: ep.Row, s: ep.ScalarTensor, alpha: ep.Scalar):
    """A one-element tensor read on the device; silu, leaky_relu, sigmoid, relu, negation, division."""
    z = acc * scale * s
    return ep.silu(z) + ep.leaky_relu(alpha * z, 0.1) + ep.sigmoid(z) - ep.relu(-z) / (1.0 + ep.abs(z))


def ep_silu(acc):
    """An activation alone: with fp8's and int8's scales it reads silu(acc * scale_a * scale_b)."""
    return ep.silu(acc)


EPILOGUES: dict[str, Callable | None] = {"identity": None, "linear": ep_linear, "residual": ep_residual,
                                         "mixed": ep_mixed, "aux": ep_aux, "scaled": ep_scaled, "silu": ep_silu}
ACTIVATIONS = frozenset({"relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"})


@functools.lru_cache(maxsize=None)
def describe_epilogue(name: str, scale: str | None) -> Epilogue:
    """The epilogue (operand dtypes unresolved) of a catalogue entry, with fp8's or int8's scales composed in."""
    fn = EPILOGUES[name]
    return with_scales(IDENTITY if fn is None else trace(fn), scale or "none")


# -- the ops -----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpSpec:
    """One op of a family x dtype's fixed set: the Gemm knobs beyond dtype and family."""

    layout: str
    out: str | None = None             # None: the dtype's default D
    dcol: bool = False                 # D column-major (layout_c="col")
    epilogue: str = "identity"         # an EPILOGUES key
    scale: str | None = None           # fp8 / int8 scales
    variant: str = ""                  # names the knobs below in the key
    knobs: tuple[tuple[str, Any], ...] = ()
    stream_k: bool = False             # set on the config (not a Gemm knob), as gpu/sanitize.py does

    @property
    def key(self) -> str:
        parts = [self.layout, f"o{self.out}" if self.out else "", "dcol" if self.dcol else "",
                 f"s{self.scale}" if self.scale else "", "" if self.epilogue == "identity" else self.epilogue,
                 self.variant]
        return "_".join(p for p in parts if p)

    @property
    def a_row(self) -> bool:
        return self.layout[0] == "t"

    @property
    def b_row(self) -> bool:
        return self.layout[1] == "t"

    def description(self) -> Epilogue:
        return describe_epilogue(self.epilogue, self.scale)

    def out_dtype(self, dtype: str) -> str:
        return self.out or DEFAULT_OUT[dtype]

    def fits(self, family: str, form: str) -> bool:
        """Whether the documentation says this op takes calls of ``form`` (the draws prefer such ops)."""
        desc = self.description()
        if form == "batched":
            kinds = {o.kind for o in desc.operands}
            return "matrix" not in kinds and not kinds & set(MAINLOOP_KINDS) and desc.aux is None
        if form in ("grouped", "list", "masked", "grouped_k"):
            persistent = dict(self.knobs).get("schedule") != "ws" and not self.stream_k
            orders = {"list": True, "grouped_k": not self.a_row and self.b_row}.get(form, self.a_row)
            return family == "sm90" and desc.is_identity and persistent and orders
        return True

    def config(self, family: str, dtype: str, arch: int) -> KernelConfig:
        fn = EPILOGUES[self.epilogue]
        plan = Gemm(dtype, self.layout, arch=arch, family=family, out_dtype=self.out,
                    layout_c="col" if self.dcol else None, epilogue=fn, scale=self.scale, **dict(self.knobs))
        return replace(plan.config, stream_k=True) if self.stream_k else plan.config


def _sm90_variants(dtype: str) -> list[OpSpec]:
    """Schedules besides the planner's: pingpong, ws (no grouped calls), split-K (stream-K, fewer tiles than SMs); for
    16-bit inputs also a 1x2 cluster (A multicast) of 256-row tiles and 64-row pingpong tiles."""
    if dtype not in ("bf16", "fp16"):
        return [OpSpec("tn", variant="pp", knobs=(("schedule", "pingpong"),))]
    return [OpSpec("tn", variant="pp", knobs=(("schedule", "pingpong"), ("tile_shape", (128, 128, 64)),
                                              ("cluster_shape", (2, 1)))),
            OpSpec("tt", variant="ws", knobs=(("schedule", "ws"), ("tile_shape", (128, 128, 64)),
                                              ("cluster_shape", (1, 1)))),
            OpSpec("tn", variant="splitk", stream_k=True,
                   knobs=(("schedule", "cooperative"), ("tile_shape", (128, 64, 64)), ("cluster_shape", (1, 1)))),
            OpSpec("nt", variant="c1x2", knobs=(("schedule", "cooperative"), ("tile_shape", (256, 128, 64)),
                                                ("cluster_shape", (1, 2)))),
            OpSpec("tt", variant="pp64", knobs=(("schedule", "pingpong"), ("tile_shape", (64, 256, 64)),
                                                ("cluster_shape", (1, 1))))]


@functools.lru_cache(maxsize=None)
def ops_for(family: str, dtype: str) -> tuple[OpSpec, ...]:
    """The fixed op set of a family x dtype (empty where the family does not take the dtype: fp8 on sm80)."""
    if dtype in ("bf16", "fp16"):
        other = "fp16" if dtype == "bf16" else "bf16"
        specs = [OpSpec(layout) for layout in LAYOUTS]
        specs += [OpSpec("tn", out="fp32"), OpSpec("nt", out="fp32"), OpSpec("nn", out=other),
                  OpSpec("tt", dcol=True), OpSpec("nn", out="fp32", dcol=True)]
        specs += [OpSpec("tn", epilogue="linear"), OpSpec("tt", epilogue="residual"),
                  OpSpec("nn", out="fp32", epilogue="mixed"), OpSpec("nt", dcol=True, epilogue="aux"),
                  OpSpec("tn", out=other, epilogue="scaled")]
        if family == "sm90":
            return tuple(specs + _sm90_variants(dtype))
        return tuple(specs + [
            OpSpec("tn", variant="64x64", knobs=(("tile_shape", (64, 64, 32)), ("warps", (2, 2)))),
            OpSpec("nt", variant="128x128x64", knobs=(("tile_shape", (128, 128, 64)), ("warps", (2, 2)))),
            OpSpec("tt", variant="256x128", knobs=(("tile_shape", (256, 128, 32)), ("warps", (4, 2))))])
    if dtype == "tf32":   # every layout (sm90 transposes M/N-major tiles in shared memory: docs/dtypes.md)
        specs = [OpSpec(layout) for layout in LAYOUTS]
        specs += [OpSpec("tn", out="bf16"), OpSpec("nt", dcol=True), OpSpec("nn", epilogue="linear"),
                  OpSpec("tt", epilogue="residual")]
        return tuple(specs + (_sm90_variants(dtype) if family == "sm90" else []))
    if dtype in ("e4m3", "e5m2"):   # sm90 only, layout tn
        if family != "sm90":
            return ()
        return tuple([OpSpec("tn"), OpSpec("tn", out="fp32"), OpSpec("tn", out="fp16"), OpSpec("tn", dcol=True),
                      OpSpec("tn", scale="tensor"), OpSpec("tn", scale="row", epilogue="silu"),
                      OpSpec("tn", scale="block")] + _sm90_variants(dtype))
    if dtype == "int8":   # layout tn; int32 D (exact) or a float D with rowwise scales
        specs = [OpSpec("tn"), OpSpec("tn", out="fp32"), OpSpec("tn", dcol=True),
                 OpSpec("tn", out="bf16", scale="row", epilogue="silu")]
        return tuple(specs + (_sm90_variants(dtype) if family == "sm90" else []))
    raise ValueError(f"dtype {dtype!r}: choose from {', '.join(DTYPES)}")


def op_spec(family: str, dtype: str, key: str) -> OpSpec:
    return {s.key: s for s in ops_for(family, dtype)}[key]


def error_bound(dtype: str, out_dtype: str) -> float:
    """||D - ref|| / ||ref|| allowed: tests/gpu/gpu_cases.py's per input dtype for 16-bit inputs, but never below a
    bf16 D's (its rounding alone reaches 2^-9 on a problem of one element); test_tf32.py's, test_fp8.py's and
    test_int8.py's per D for the others (int32 D: exact)."""
    if dtype in ("bf16", "fp16"):
        return max(BOUND[TORCH[dtype]], BOUND[torch.bfloat16] if out_dtype == "bf16" else 0.0)
    if dtype == "tf32":
        return 1e-2 if out_dtype == "bf16" else 2e-3
    if dtype in ("e4m3", "e5m2"):
        return {"bf16": 1e-2, "fp16": 2e-3, "fp32": 5e-4}[out_dtype]
    return 0.0 if out_dtype == "int32" else 1e-2


# -- a case: views into padded buffers, sizes, operands ----------------------------------------------------------------

@dataclass(frozen=True)
class View:
    """A tensor as a view of a flat buffer whose other elements are padding (NaN): sizes, strides and the offset of
    its first element, all in elements."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @property
    def extent(self) -> int:
        """Elements of the buffer: the offset, then up to the view's last element."""
        if any(s == 0 for s in self.shape):
            return self.offset + 1
        return self.offset + 1 + sum((s - 1) * st for s, st in zip(self.shape, self.strides))

    def text(self) -> str:
        return (f"{'x'.join(map(str, self.shape)) or 'scalar'}/{','.join(map(str, self.strides))}"
                + (f"+{self.offset}" if self.offset else ""))


def matrix_view(rows: int, cols: int, row_major: bool, ld: int, offset: int = 0, batch: int | None = None,
                batch_stride: int = 0) -> View:
    shape, strides = (rows, cols), ((ld, 1) if row_major else (1, ld))
    if batch is None:
        return View(shape, strides, offset)
    return View((batch, *shape), (batch_stride, *strides), offset)


def effective_ld(view: View, row_major: bool) -> int:
    """The leading dimension the 16-byte rule is judged by (generator/runtime/checks.py leading_dim): with one row
    (column) of a row-major (column-major) matrix, the other size, as for a vector."""
    rows, cols = view.shape[-2:]
    if row_major:
        return view.strides[-2] if rows > 1 else max(cols, 1)
    return view.strides[-1] if cols > 1 else max(rows, 1)


def breaks_16_bytes(view: View, row_major: bool, elem: int) -> bool:
    """Whether a matrix (or each of a 3-D one's) is off the 16-byte rule: base address (buffers start aligned),
    leading dimension, stride between matrices (a batch of one has none)."""
    stride = view.strides[0] if len(view.shape) == 3 and view.shape[0] > 1 else 0
    return any(x * elem % ALIGN_BYTES for x in (view.offset, effective_ld(view, row_major), stride))


@dataclass(frozen=True)
class OperandDraw:
    """One epilogue operand of a case: a scalar's value, a one-element tensor's shape and value, or a vector's,
    matrix's or per-block scales' view."""

    name: str
    kind: str
    value: float = 0.0
    view: View | None = None

    def text(self) -> str:
        if self.kind == "scalar":
            return f"{self.name}={self.value:g}"
        shown = self.view.text() if self.view is not None else ""
        return f"{self.name}={shown}" + (f"={self.value:g}" if self.kind == "scalar_tensor" else "")


@dataclass(frozen=True)
class Case:
    """One call, all of it drawn from ``seed``: which op, the form, the sizes, every operand's storage. The inputs'
    values come from a torch generator seeded with the same seed."""

    family: str
    dtype: str
    seed: int
    op: str                                   # the OpSpec key
    form: str                                 # FORMS
    problems: tuple[tuple[int, int, int], ...]   # (M, N, K): one; a grouped (masked) call's per group; a list's each
    batch: int = 0                            # batched: D's number of matrices; masked: the slab (max_m)
    a: tuple[View, ...] = ()                  # one; a list call's each
    b: tuple[View, ...] = ()
    out: View | None = None                   # a poisoned out=; None: the op allocates D
    operands: tuple[OperandDraw, ...] = ()
    in_place: bool = False                    # out=C: the epilogue's C is D
    input_scale: float = 1.0                  # A's values are randn times this (1/sqrt(K): an accumulator near 1)

    @property
    def key(self) -> str:
        return f"{self.family}:{self.dtype}:{self.seed}"

    @property
    def volume(self) -> int:
        if self.form in ("grouped", "masked", "grouped_k"):
            return sum(m * n * k for m, n, k in self.problems)
        return sum(m * n * k for m, n, k in self.problems) * max(self.batch, 1)

    def text(self) -> str:
        if self.form == "grouped_k":
            m, n = self.problems[0][:2] if self.problems else (0, 0)
            sizes = f"groups along K={[p[2] for p in self.problems]} M={m} N={n}"
        elif self.form in ("grouped", "masked"):
            n, k = self.problems[0][1:]
            sizes = f"groups={[p[0] for p in self.problems]} N={n} K={k}"
            if self.form == "masked":
                sizes += f" max_m={self.batch}"
        elif self.form == "list":
            sizes = "problems=" + (" ".join(f"{m}x{n}x{k}" for m, n, k in self.problems) or "none")
        else:
            m, n, k = self.problems[0]
            sizes = f"M={m} N={n} K={k}" + (f" batch={self.batch}" if self.form == "batched" else "")
        parts = [self.key, f"op={self.op}", self.form, sizes, "A=" + " ".join(v.text() for v in self.a),
                 "B=" + " ".join(v.text() for v in self.b)]
        if self.in_place:
            parts.append("out=C")
        elif self.out is not None:
            parts.append(f"out={self.out.text()}")
        parts += [o.text() for o in self.operands]
        if self.input_scale != 1.0:
            parts.append(f"A*{self.input_scale:.3g}")
        return " ".join(parts)


def case_seed(master: int, family: str, dtype: str, index: int) -> int:
    """Case ``index``'s own seed: replaying it needs nothing else."""
    digest = hashlib.sha256(f"gemmgen-fuzz:{master}:{family}:{dtype}:{index}".encode()).digest()
    return int.from_bytes(digest[:6], "big")


def parse_key(key: str) -> tuple[str, str, int]:
    """'sm90:bf16:1234' -> ('sm90', 'bf16', 1234)."""
    try:
        family, dtype, seed = key.split(":")
        if family not in FAMILIES or dtype not in DTYPES:
            raise ValueError
        return family, dtype, int(seed)
    except ValueError:
        raise ValueError(f"replay key {key!r}: give family:dtype:seed, e.g. sm90:bf16:1234 (families "
                         f"{', '.join(FAMILIES)}; dtypes {', '.join(DTYPES)})") from None


# -- drawing -----------------------------------------------------------------------------------------------------------

def _pick(rng: random.Random, weights: dict) -> Any:
    return rng.choices(list(weights), list(weights.values()))[0]


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    if hi <= lo:
        return lo
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def draw_size(rng: random.Random, zero: float = 0.02) -> int:
    """A size from 0 to MAX_SIZE: an edge, a tile multiple +-1, or log-uniform; 0 rarely."""
    r = rng.random()
    if r < zero:
        return 0
    if r < 0.4:
        return rng.choice(EDGES)
    if r < 0.6:
        tile = rng.choice(TILE_EDGES)
        return min(MAX_SIZE, max(1, tile * log_uniform(rng, 1, MAX_SIZE // tile) + rng.choice((-1, 0, 1))))
    return log_uniform(rng, 1, MAX_SIZE)


def fit(rng: random.Random, dims: Sequence[int], batch: int = 1, volume: int = MAX_VOLUME) -> tuple[int, int, int]:
    """M, N, K within the caps: the largest is redrawn below half of itself until they hold."""
    dims = list(dims)
    while True:
        m, n, k = dims
        if batch * m * n * k <= volume and batch * max(m * n, m * k, k * n) <= MAX_ELEMENTS:
            return m, n, k
        i = max(range(3), key=lambda j: dims[j])
        dims[i] = log_uniform(rng, 1, max(1, dims[i] // 2))


def draw_ld(rng: random.Random, inner: int, elem: int, aligned: bool = False) -> int:
    """A leading dimension for rows of ``inner`` elements: tight, padded to 16 bytes, or padded off the rule."""
    per = max(1, ALIGN_BYTES // elem)
    tight = max(inner, 1)
    padded = -(-tight // per) * per
    if aligned:
        return padded + per * rng.choice((0, 0, 0, 1, 4))
    r = rng.random()
    if r < 0.4:
        return tight
    if r < 0.75:
        return padded + per * rng.choice((0, 0, 1, 3))
    return tight + rng.randint(1, 2 * per + 1)


def draw_offset(rng: random.Random, elem: int, aligned: bool = False) -> int:
    """Elements before a view's first: mostly 16-byte aligned (0 or a few chunks), sometimes not."""
    per = max(1, ALIGN_BYTES // elem)
    if aligned or rng.random() < 0.8:
        return per * rng.choice((0, 0, 0, 1, 2))
    return rng.randint(1, 2 * per - 1)


def draw_gap(rng: random.Random, elem: int, aligned: bool = False) -> int:
    """Elements of padding between the matrices of a 3-D operand."""
    per = max(1, ALIGN_BYTES // elem)
    r = rng.random()
    if r < 0.5:
        return 0
    if aligned or r < 0.8:
        return per * rng.randint(1, 4)
    return rng.randint(1, 2 * per)


def draw_matrix(rng: random.Random, rows: int, cols: int, row_major: bool, elem: int, aligned: bool = False,
                batch: int | None = None, mode: str = "3d") -> View:
    """A (rows, cols) matrix, or a (batch, rows, cols) stack held as ``mode``: '3d' (matrices a stride apart),
    'bcast1' (a batch of one), 'stride0' (one matrix, batch stride 0)."""
    inner, outer = (cols, rows) if row_major else (rows, cols)
    ld, offset = draw_ld(rng, inner, elem, aligned), draw_offset(rng, elem, aligned)
    if batch is None:
        return matrix_view(rows, cols, row_major, ld, offset)
    if mode == "stride0":
        return matrix_view(rows, cols, row_major, ld, offset, batch, 0)
    stride = max(outer, 1) * ld + draw_gap(rng, elem, aligned)
    return matrix_view(rows, cols, row_major, ld, offset, 1 if mode == "bcast1" else batch, stride)


def _pick_op(rng: random.Random, specs: Sequence[OpSpec], family: str, form: str) -> OpSpec:
    fitting = [s for s in specs if s.fits(family, form)]
    if fitting and rng.random() >= REFUSAL_PROBES:
        return rng.choice(fitting)
    return rng.choice(list(specs))


def _draw_plain(rng: random.Random, spec: OpSpec, elem: int) -> dict:
    m, n, k = fit(rng, [draw_size(rng) for _ in range(3)])
    return dict(problems=((m, n, k),), a=(draw_matrix(rng, m, k, spec.a_row, elem),),
                b=(draw_matrix(rng, k, n, spec.b_row, elem),))


def _draw_batched(rng: random.Random, spec: OpSpec, elem: int) -> dict:
    batch = _pick(rng, BATCHES)
    a_mode, b_mode = (_pick(rng, BATCH_MODES) for _ in range(2))
    if a_mode == b_mode == "2d":
        a_mode = "3d"
    # D has `batch` matrices where an operand has (3-D or batch stride 0), one where only batches of one are 3-D
    count = batch if {a_mode, b_mode} & {"3d", "stride0"} else 1
    m, n, k = fit(rng, [draw_size(rng) for _ in range(3)], batch=count)
    a = draw_matrix(rng, m, k, spec.a_row, elem, batch=None if a_mode == "2d" else count, mode=a_mode)
    b = draw_matrix(rng, k, n, spec.b_row, elem, batch=None if b_mode == "2d" else count, mode=b_mode)
    return dict(problems=((m, n, k),), batch=count, a=(a,), b=(b,))


def _group_size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.2:
        return 0
    if r < 0.3:
        return 1
    if r < 0.6:
        return rng.choice([e for e in EDGES if e <= 1025])
    return log_uniform(rng, 1, 4096)


def _shrink_until(rng: random.Random, dims: list[int], sizes: list[int], fits: Callable[[], bool]) -> None:
    """Redraw the largest of ``dims`` and the group ``sizes`` (in place; ``dims`` first on a tie) below half of itself
    until ``fits()``."""
    while not fits():
        biggest = max(*dims, *sizes)
        if biggest in dims:
            i = dims.index(biggest)
            dims[i] = log_uniform(rng, 1, max(1, dims[i] // 2))
        else:
            sizes[sizes.index(biggest)] = log_uniform(rng, 1, max(1, biggest // 2))


def _draw_grouped(rng: random.Random, spec: OpSpec, elem: int, slab_extra: int | None = None) -> dict:
    """A grouped call's groups, N, K, A and B; with ``slab_extra`` (a masked call) the rows A and D hold are every
    group's slab of max(sizes) + slab_extra rows, which the element bound applies to."""
    sizes = [_group_size(rng) for _ in range(_pick(rng, GROUP_COUNTS))]
    nk = [draw_size(rng), draw_size(rng)]

    def fits() -> bool:
        (n, k), total = nk, sum(sizes)
        rows = total if slab_extra is None else len(sizes) * (max(sizes) + slab_extra)
        return total * n * k <= MAX_VOLUME and max(rows * k, rows * n, len(sizes) * k * n) <= MAX_ELEMENTS

    _shrink_until(rng, nk, sizes, fits)
    n, k = nk
    aligned = rng.random() < 0.9   # off the 16-byte rule a grouped call is refused
    a = draw_matrix(rng, sum(sizes), k, spec.a_row, elem, aligned)
    b = draw_matrix(rng, k, n, spec.b_row, elem, aligned, batch=len(sizes))
    return dict(problems=tuple((s, n, k) for s in sizes), a=(a,), b=(b,))


def _draw_grouped_k(rng: random.Random, spec: OpSpec, elem: int) -> dict:
    """A grouped call along K: the groups' values of K (a group may be empty, start anywhere), M, N, A (M, K) and
    B (K, N), one matrix each."""
    sizes = [_group_size(rng) for _ in range(_pick(rng, GROUP_COUNTS))]
    mn = [draw_size(rng), draw_size(rng)]

    def fits() -> bool:
        (m, n), k = mn, sum(sizes)
        return m * n * k <= MAX_VOLUME and max(m * k, k * n, len(sizes) * m * n) <= MAX_ELEMENTS

    _shrink_until(rng, mn, sizes, fits)
    m, n = mn
    aligned = rng.random() < 0.9   # off the 16-byte rule the call is refused
    k = sum(sizes)
    return dict(problems=tuple((m, n, size) for size in sizes), a=(draw_matrix(rng, m, k, spec.a_row, elem, aligned),),
                b=(draw_matrix(rng, k, n, spec.b_row, elem, aligned),))


def _draw_masked(rng: random.Random, spec: OpSpec, elem: int) -> dict:
    """A grouped draw's groups, N and K, the rows held in slabs of max_m (the largest group and some padding rows),
    A (E, max_m, K) the slabs back to back: a masked call's operands."""
    extra = _pick(rng, SLAB_EXTRA)
    fields = _draw_grouped(rng, spec, elem, slab_extra=extra)
    sizes = [p[0] for p in fields["problems"]]
    n, k = fields["problems"][0][1:]
    slab = max(sizes) + extra
    step = ALIGN_BYTES // elem
    if k >= step and k % step and rng.random() < 0.9:   # A's rows are K apart: mostly on the 16-byte rule
        k -= k % step
        fields.update(problems=tuple((s, n, k) for s in sizes),
                      b=(draw_matrix(rng, k, n, spec.b_row, elem, True, batch=len(sizes)),))
    # in the op's order (a column-major A is a refusal probe: grouped calls take A row-major)
    ld = max(k if spec.a_row else slab, 1)
    a = matrix_view(slab, k, spec.a_row, ld, batch=len(sizes), batch_stride=max(slab if spec.a_row else k, 1) * ld)
    return dict(fields, a=(a,), batch=slab)


def _draw_list(rng: random.Random, spec: OpSpec, elem: int) -> dict:
    count = _pick(rng, LIST_COUNTS)
    problems = tuple(fit(rng, [draw_size(rng, zero=0.08) for _ in range(3)], volume=MAX_VOLUME // max(count, 1))
                     for _ in range(count))
    aligned = rng.random() < 0.9
    return dict(problems=problems,
                a=tuple(draw_matrix(rng, m, k, spec.a_row, elem, aligned) for m, _, k in problems),
                b=tuple(draw_matrix(rng, k, n, spec.b_row, elem, aligned) for _, n, k in problems))


def _draw_operand(rng: random.Random, o: Any, m: int, n: int, k: int, out_dtype: str) -> OperandDraw:
    if o.kind == "scalar":
        return OperandDraw(o.name, o.kind, value=round(rng.choice((-1, 1)) * rng.uniform(0.5, 2.0), 4))
    if o.kind == "scalar_tensor":
        shape = rng.choice(((), (1,)))
        return OperandDraw(o.name, o.kind, value=round(rng.uniform(0.5, 2.0), 4), view=View(shape, (1,) * len(shape)))
    elem = ELEM_BYTES[o.dtype.value if o.dtype is not None else out_dtype]
    if o.kind in ("row", "col"):
        return OperandDraw(o.name, o.kind, view=View((m if o.kind == "row" else n,), (1,), draw_offset(rng, elem)))
    if o.kind == "matrix":
        row_major = o.order is None or o.order.value == "row"
        return OperandDraw(o.name, o.kind, view=draw_matrix(rng, m, n, row_major, elem))
    blocks_k = -(-k // 128)   # per-block scales: contiguous fp32, (M, K/128) of A and (N/128, K/128) of B
    rows = m if o.kind == "row_blocks" else -(-n // 128)
    return OperandDraw(o.name, o.kind, view=View((rows, blocks_k), (max(blocks_k, 1), 1)))


def _draw_epilogue(rng: random.Random, spec: OpSpec, dtype: str, fields: dict) -> dict:
    """Operands, out= (poisoned, or C itself, or none) of a plain or batched call."""
    m, n, k = fields["problems"][0]
    out_dtype = spec.out_dtype(dtype)
    desc = spec.description()
    operands = tuple(_draw_operand(rng, o, m, n, k, out_dtype) for o in desc.operands)
    # out=C: each element of C is read by the thread that writes it to D (same dtype and order as D)
    sources = [d for d, o in zip(operands, desc.operands) if o.kind == "matrix" and o.name == "C" and o.dtype is None
               and (o.order is None or o.order.value == "row") != spec.dcol]
    if fields.get("batch", 0) == 0 and sources and rng.random() < IN_PLACE:
        return dict(operands=operands, in_place=True, out=sources[0].view)
    out = None
    if desc.aux is None and rng.random() < OUT_GIVEN:
        count = fields.get("batch") or None
        out = draw_matrix(rng, m, n, not spec.dcol, ELEM_BYTES[out_dtype], batch=count)
    return dict(operands=operands, out=out)


def draw_case(family: str, dtype: str, seed: int) -> Case:
    """The case of ``seed``: the same on every machine (it depends on no plan, arch or GPU)."""
    rng = random.Random(seed)
    specs = ops_for(family, dtype)
    if not specs:
        raise ValueError(f"the {family} family takes no {dtype} plans")
    form = "grouped_k" if seed >= K_SEED_BASE else _pick(rng, FORM_WEIGHTS[family])
    spec = _pick_op(rng, specs, family, form)
    drawer = {"plain": _draw_plain, "batched": _draw_batched, "grouped": _draw_grouped, "list": _draw_list,
              "masked": _draw_masked, "grouped_k": _draw_grouped_k}[form]
    fields = drawer(rng, spec, ELEM_BYTES[dtype])
    if form in ("plain", "batched"):
        fields.update(_draw_epilogue(rng, spec, dtype, fields))
    k = max((p[2] for p in fields["problems"]), default=0)
    if dtype in ("bf16", "fp16", "tf32") and k > 0 and rng.random() < 0.5:
        fields["input_scale"] = round(1 / math.sqrt(k), 6)
    return Case(family=family, dtype=dtype, seed=seed, op=spec.key, form=form, **fields)


def draw_cases(master: int, family: str, dtype: str, count: int) -> list[Case]:
    """``count`` cases of the drawn forms, then K_CASES[family] as many grouped calls along K (their own seeds)."""
    seeds = [case_seed(master, family, dtype, i) for i in range(count)]
    seeds += [K_SEED_BASE + seed for seed in seeds[:math.ceil(count * K_CASES[family])]]
    return [draw_case(family, dtype, seed) for seed in seeds]


def sample_indices(cases: Sequence[Case], count: int, master: int) -> list[int]:
    """``count`` small cases (volume <= SAMPLE_MAX_VOLUME) for a compute-sanitizer run, of ops that take their form
    (kernels run rather than refusals), taken from each form in turn; a smaller count gives a subset of a larger
    one's (the racecheck sample lies in the memcheck one)."""
    by_form: dict[str, list[int]] = {}
    for i, case in enumerate(cases):
        if case.volume <= SAMPLE_MAX_VOLUME and op_spec(case.family, case.dtype, case.op).fits(case.family, case.form):
            by_form.setdefault(case.form, []).append(i)
    rng = random.Random(f"sample:{master}")
    for indices in by_form.values():
        rng.shuffle(indices)
    chosen: list[int] = []
    while len(chosen) < count and any(by_form.values()):
        for form in FORMS:
            if by_form.get(form) and len(chosen) < count:
                chosen.append(by_form[form].pop(0))
    return sorted(chosen)


def expected_refusal(case: Case, cfg: KernelConfig) -> str | None:
    """Why the documentation says the op refuses this call (README, docs/batched.md, docs/grouped.md), else None."""
    desc = cfg.epilogue
    if case.form == "batched":
        kinds = {o.kind for o in desc.operands}
        if "matrix" in kinds:
            return "a batched call takes no matrix operand"
        if kinds & set(MAINLOOP_KINDS):
            return "a batched call takes no per-block scales"
        return "a batched call stores no second output" if desc.aux is not None else None
    if case.form == "plain":
        return None
    if not desc.is_identity:
        return "grouped calls take plans without a fused epilogue"
    if cfg.family != "sm90":
        return "grouped calls run on the sm90 family"
    if cfg.schedule not in ("cooperative", "pingpong") or cfg.stream_k:
        return "grouped calls run on the persistent schedules without stream-K"
    elem = ELEM_BYTES[case.dtype]
    a_row, b_row = cfg.layout.a.value == "row", cfg.layout.b.value == "row"
    if case.form in ("grouped", "masked") and not a_row:
        return "grouped calls (offsets) take A row-major"
    if case.form == "grouped_k" and (a_row or not b_row):
        return "grouped calls along K take A column-major and B row-major"
    if case.form == "grouped_k":
        works = [(case.problems[0][0], case.problems[0][1], sum(p[2] for p in case.problems))] if case.problems else []
    elif case.form == "grouped":
        works = [(sum(p[0] for p in case.problems), *case.problems[0][1:])]
    elif case.form == "masked":   # A's slabs as one matrix
        works = [(len(case.problems) * case.batch, *case.problems[0][1:])]
    else:
        works = list(case.problems)
    for (m, n, k), a, b in zip(works, case.a, case.b):
        if m and n and k and (breaks_16_bytes(a, a_row, elem) or breaks_16_bytes(b, b_row, elem)):
            return "a grouped call's A and B keep the 16-byte rule"
    return None


# -- running a case ----------------------------------------------------------------------------------------------------

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32,
         "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "int8": torch.int8, "int32": torch.int32}
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
INT_PAD = {torch.int8: 100, torch.int32: -(2**31)}   # integer padding and poison: a read or a miss shows in the sums


@dataclass
class Outcome:
    status: str                  # "passed", "refused" or "failed"
    error: float = 0.0           # the worst relative error of the case's problems and outputs
    bound: float = 0.0
    path: str = ""
    message: str = ""
    fatal: bool = False          # the CUDA context is lost: no later case can run
    predicted: str | None = None   # the documented refusal the case was drawn to meet, if any


def _pad_buffer(extent: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    if dtype in INT_PAD:
        return torch.full((extent,), INT_PAD[dtype], dtype=dtype, device=device)
    return torch.full((extent,), float("nan"), device=device).to(dtype)


def materialize(view: View, dtype: torch.dtype, gen: torch.Generator | None, device: str,
                scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): the view's elements random (randn times ``scale``; int8 uniform), the rest padding; with
    ``gen`` None the view is padding too (a poisoned out)."""
    buf = _pad_buffer(view.extent, dtype, device)
    t = buf.as_strided(view.shape, view.strides, view.offset)
    if gen is not None:
        shared = len(view.shape) == 3 and view.strides[0] == 0 and view.shape[0] > 1
        target = t[:1] if shared else t   # batch stride 0: one matrix to write
        if dtype == torch.int8:
            values = torch.randint(-128, 128, target.shape, generator=gen, device=device, dtype=dtype)
        else:
            values = (torch.randn(target.shape, generator=gen, device=device) * scale).to(dtype)
        target.copy_(values)
    return buf, t


def to64(t: torch.Tensor) -> torch.Tensor:
    return t.float().double() if t.dtype in FLOAT8 else t.double()


def padding_intact(buf: torch.Tensor, view: View) -> bool:
    """Whether every element of ``buf`` outside ``view`` still holds the padding."""
    probe = buf.clone()
    probe.as_strided(view.shape, view.strides, view.offset).fill_(INT_PAD.get(buf.dtype, float("nan")))
    if buf.dtype in INT_PAD:
        return bool((probe == INT_PAD[buf.dtype]).all())
    return bool(torch.isnan(probe.float()).all())


def unchanged(buf: torch.Tensor, snapshot: torch.Tensor) -> bool:
    return torch.equal(buf.view(torch.uint8), snapshot.view(torch.uint8))


def _linear(node: Expr | None) -> Expr | None:
    """The expression with its activations left out: the scale of the values the activations read."""
    if node is None or node.is_leaf:
        return node
    if node.op in ACTIVATIONS:
        return _linear(node.args[0])
    return replace(node, args=tuple(_linear(a) for a in node.args))


def magnitude(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sqrt(A^2 @ B^2): each element's scale of acc = A @ B whatever the signs (its expected size for random ones),
    which the rounding of the sum scales with, however much the sum itself cancels."""
    return torch.matmul(a.square(), b.square()).sqrt()


def relative_error(got: torch.Tensor, ref: torch.Tensor, floors: Sequence[tuple[float, torch.Tensor]] = (),
                   on_cpu: bool = False) -> float:
    """max over the problems (leading dimensions) of ||got - ref|| / max(||ref||, w ||floor|| for each (w, floor));
    a problem whose denominator is 0 must be exact; anything not finite is infinitely wrong. ``on_cpu``: the norms
    on the CPU (under racecheck, whose reports of torch's own reduction kernels would hide ours)."""
    if got.numel() == 0:
        return 0.0
    if on_cpu:
        got, ref, floors = got.cpu(), ref.cpu(), [(w, f.cpu()) for w, f in floors]
    g = got.double()
    if not bool(torch.isfinite(g).all()):
        return math.inf
    diff, den = (g - ref).norm(dim=(-2, -1)), ref.norm(dim=(-2, -1))
    for weight, floor in floors:
        den = torch.maximum(den, weight * floor.norm(dim=(-2, -1)))
    exact = torch.where(diff == 0, torch.zeros_like(diff), torch.full_like(diff, math.inf))
    return float(torch.where(den > 0, diff / den.clamp_min(1e-300), exact).max())


class Run:
    """One case's tensors, the call and the checks; the inputs come from a torch generator seeded with the case's
    seed, so a replay sees the same values."""

    def __init__(self, case: Case, op: Any, device: str, norms_on_cpu: bool = False) -> None:
        self.case, self.op, self.device, self.norms_on_cpu = case, op, device, norms_on_cpu
        self.cfg: KernelConfig = op.config
        self.dtype, self.out_dtype = TORCH[case.dtype], op.out_dtype
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(case.seed)
        self.inputs: list[tuple[str, torch.Tensor, torch.Tensor]] = []   # (what, buffer, snapshot): kept as they were
        self.problems: list[str] = []

    def matrix(self, what: str, view: View, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
        buf, t = materialize(view, dtype, self.gen, self.device, scale)
        self.inputs.append((what, buf, buf.clone()))
        return t

    def epilogue_values(self) -> tuple[list[Any], dict[str, torch.Tensor]]:
        """The epilogue's operands in the op's order, and the buffers of its tensors, by name."""
        values, buffers = [], {}
        for draw, o in zip(self.case.operands, self.cfg.epilogue.operands):
            assert draw.name == o.name, (draw.name, o.name)
            if draw.kind == "scalar":
                values.append(draw.value)
            elif draw.kind == "scalar_tensor":
                values.append(torch.full(draw.view.shape, draw.value, dtype=torch.float32, device=self.device))
            elif draw.kind in MAINLOOP_KINDS:   # per-block scales: positive fp32
                values.append(torch.rand(draw.view.shape, generator=self.gen, device=self.device) * 1.5 + 0.5)
            else:
                buf, t = materialize(draw.view, TORCH[o.dtype.value], self.gen, self.device)
                values.append(t)
                buffers[draw.name] = buf
        return values, buffers

    def accumulator(self, A: torch.Tensor, B: torch.Tensor, values: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """acc = A @ B in float64 (fp8 per-block scales applied), and its magnitude."""
        a, b = to64(A), to64(B)
        if self.cfg.epilogue.scale_mode == "block":   # dequantized as the main loop applies the scales
            kinds = [o.kind for o in self.cfg.epilogue.operands]
            sa, sb = (values[kinds.index(kind)].double() for kind in ("row_blocks", "col_blocks"))
            k, n = a.shape[-1], b.shape[-1]
            a = a * sa.repeat_interleave(128, 1)[:, :k]
            b = b * sb.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k].t()
        return torch.matmul(a, b), magnitude(a, b)

    def references(self, acc: torch.Tensor, mag: torch.Tensor,
                   values: Sequence[Any]) -> list[tuple[torch.Tensor, list]]:
        """(ref, floors) of D and of aux: the plan's epilogue in float64; the same without its activations, at acc
        and at acc's magnitude (``relative_error``)."""
        desc = self.cfg.epilogue
        if desc.is_identity:
            return [(acc, [(ACC_FLOOR, mag)])]
        vals = operand_values(desc, values, torch.float64)
        refs = evaluate(desc, acc, vals)
        linear = SimpleNamespace(result=_linear(desc.result), aux=_linear(desc.aux))
        floors = zip(evaluate(linear, acc, vals), evaluate(linear, mag, vals))
        return [(r, [(FLOOR, f), (ACC_FLOOR, g)]) for r, (f, g) in zip(refs, floors) if r is not None]

    def check_output(self, what: str, got: Any, shape: tuple[int, ...]) -> bool:
        if not isinstance(got, torch.Tensor):
            self.problems.append(f"{what} is a {type(got).__name__}, not a tensor")
            return False
        if tuple(got.shape) != shape or got.dtype != self.out_dtype:
            self.problems.append(f"{what} is {tuple(got.shape)} {got.dtype}; expected {shape} {self.out_dtype}")
            return False
        return True

    def poison_allocator(self, shapes: Sequence[tuple[int, ...]]) -> None:
        """Blocks of the outputs' sizes full of poison, freed at once: the caching allocator is likely to hand them
        to the op's outputs, so an element the kernel never writes reads as poison (as gpu/sanitize.py does)."""
        for shape in shapes:
            _pad_buffer(max(math.prod(shape), 1), self.out_dtype, self.device)

    # -- the forms: each returns the call and a check of its result (the worst error) --------------------------------

    def plain(self) -> tuple[Callable[[], Any], Callable[[], str], Callable[[Any], float]]:
        case = self.case
        A = self.matrix("A", case.a[0], self.dtype, case.input_scale)
        B = self.matrix("B", case.b[0], self.dtype)
        values, buffers = self.epilogue_values()
        out_buf, out = None, None
        if case.in_place:
            names = [o.name for o in self.cfg.epilogue.operands]
            out_buf, out = buffers.pop("C"), values[names.index("C")]
        elif case.out is not None:
            out_buf, out = materialize(case.out, self.out_dtype, None, self.device)
        for name, buf in buffers.items():
            self.inputs.append((name, buf, buf.clone()))
        refs = self.references(*self.accumulator(A, B, values), values)   # before the call: out=C overwrites C
        m, n, _ = case.problems[0]
        shape = (case.batch, m, n) if case.form == "batched" else (m, n)
        if out is None:
            self.poison_allocator([shape] * len(refs))

        def call() -> Any:
            return self.op(A, B, *values) if out is None else self.op(A, B, *values, out=out)

        def check(result: Any) -> float:
            outputs = list(result) if isinstance(result, (tuple, list)) else [result]
            if len(outputs) != len(refs):
                self.problems.append(f"the op returned {len(outputs)} outputs; the plan has {len(refs)}")
                return math.inf
            if out is not None and (not isinstance(outputs[0], torch.Tensor)
                                    or outputs[0].data_ptr() != out.data_ptr()):
                self.problems.append("the op did not return out=")
            if out_buf is not None and not padding_intact(out_buf, case.out):
                self.problems.append("wrote past D into its padding (or between its matrices)")
            worst = 0.0
            for what, got, (ref, floors) in zip(("D", "aux"), outputs, refs):
                if self.check_output(what, got, shape):
                    worst = max(worst, relative_error(got, ref, floors, self.norms_on_cpu))
            return worst

        return call, lambda: self.op.path(A, B, *values), check

    def grouped_inputs(self, sizes: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, list[int], torch.Tensor]:
        """A and B of a grouped call (rows or along K), its groups' ends and the offsets tensor of them."""
        case = self.case
        A = self.matrix("A", case.a[0], self.dtype, case.input_scale)
        B = self.matrix("B", case.b[0], self.dtype)
        ends = [sum(sizes[:g + 1]) for g in range(len(sizes))]
        return A, B, ends, torch.tensor(ends, dtype=torch.int32, device=self.device)

    def grouped(self) -> tuple[Callable[[], Any], Callable[[], str], Callable[[Any], float]]:
        case = self.case
        sizes = [p[0] for p in case.problems]
        A, B, ends, offsets = self.grouped_inputs(sizes)
        a64, b64 = to64(A), to64(B)
        refs = [(a64[end - size:end] @ b64[g], magnitude(a64[end - size:end], b64[g]))
                for g, (size, end) in enumerate(zip(sizes, ends))]
        shape = (sum(sizes), case.problems[0][1])
        self.poison_allocator([shape])

        def check(D: Any) -> float:
            if not self.check_output("D", D, shape):
                return math.inf
            return max([relative_error(D[end - size:end], ref, [(ACC_FLOOR, mag)], self.norms_on_cpu)
                        for size, end, (ref, mag) in zip(sizes, ends, refs)], default=0.0)

        return (lambda: self.op.grouped(A, B, offsets)), (lambda: self.op.path(A, B, offsets=offsets)), check

    def grouped_k(self) -> tuple[Callable[[], Any], Callable[[], str], Callable[[Any], float]]:
        """op.grouped with B 2-D: D (E, M, N), D[g] = A[:, group g] @ B[group g]; an empty group's matrix is zeros."""
        sizes = [p[2] for p in self.case.problems]
        A, B, ends, offsets = self.grouped_inputs(sizes)
        a64, b64 = to64(A), to64(B)
        refs = [(a64[:, end - size:end] @ b64[end - size:end], magnitude(a64[:, end - size:end], b64[end - size:end]))
                for size, end in zip(sizes, ends)]
        shape = (len(sizes), A.shape[0], B.shape[1])
        self.poison_allocator([shape])

        def check(D: Any) -> float:
            if not self.check_output("D", D, shape):
                return math.inf
            worst = 0.0
            for g, (size, (ref, mag)) in enumerate(zip(sizes, refs)):
                if size == 0 and D[g].numel() and bool(D[g].ne(0).any()):
                    self.problems.append(f"group {g} has no values of K but its matrix of D is not zeros")
                    return math.inf
                if size:
                    worst = max(worst, relative_error(D[g], ref, [(ACC_FLOOR, mag)], self.norms_on_cpu))
            return worst

        return (lambda: self.op.grouped(A, B, offsets)), (lambda: self.op.path(A, B, offsets=offsets)), check

    def masked(self) -> tuple[Callable[[], Any], Callable[[], str], Callable[[Any], float]]:
        """op.masked: the rows of each slab past its count hold the padding value (NaN for floats), which no valid row
        may read; D's rows past the counts are not checked (the op leaves them unwritten)."""
        case = self.case
        buf, A = materialize(case.a[0], self.dtype, self.gen, self.device, case.input_scale)
        counts = [p[0] for p in case.problems]
        for g, count in enumerate(counts):
            A[g, count:] = INT_PAD[self.dtype] if self.dtype in INT_PAD else float("nan")
        self.inputs.append(("A", buf, buf.clone()))
        B = self.matrix("B", case.b[0], self.dtype)
        counts_t = torch.tensor(counts, dtype=torch.int32, device=self.device)
        a64, b64 = to64(A), to64(B)
        refs = [(a64[g, :count] @ b64[g], magnitude(a64[g, :count], b64[g])) for g, count in enumerate(counts)]
        shape = (len(counts), case.batch, case.problems[0][1])
        self.poison_allocator([shape])

        def check(D: Any) -> float:
            if not self.check_output("D", D, shape):
                return math.inf
            return max([relative_error(D[g, :count], ref, [(ACC_FLOOR, mag)], self.norms_on_cpu)
                        for g, (count, (ref, mag)) in enumerate(zip(counts, refs)) if count], default=0.0)

        return (lambda: self.op.masked(A, B, counts_t)), (lambda: "masked"), check

    def listed(self) -> tuple[Callable[[], Any], Callable[[], str], Callable[[Any], float]]:
        case = self.case
        As = [self.matrix(f"A[{i}]", v, self.dtype, case.input_scale) for i, v in enumerate(case.a)]
        Bs = [self.matrix(f"B[{i}]", v, self.dtype) for i, v in enumerate(case.b)]
        refs = [(to64(a) @ to64(b), magnitude(to64(a), to64(b))) for a, b in zip(As, Bs)]
        self.poison_allocator([(m, n) for m, n, _ in case.problems])

        def check(Ds: Any) -> float:
            if not isinstance(Ds, list) or len(Ds) != len(refs):
                self.problems.append(f"the op returned {type(Ds).__name__} {Ds!r:.80}; expected a list of {len(refs)}")
                return math.inf
            worst = 0.0
            for i, (D, (ref, mag), (m, n, _)) in enumerate(zip(Ds, refs, case.problems)):
                if self.check_output(f"D[{i}]", D, (m, n)):
                    worst = max(worst, relative_error(D, ref, [(ACC_FLOOR, mag)], self.norms_on_cpu))
            return worst

        return (lambda: self.op(As, Bs)), (lambda: self.op.path(As, Bs)), check


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _is_fatal(exc: BaseException) -> bool:
    """A CUDA error leaves the context unusable: every later call would fail for this one's sake."""
    text = f"{type(exc).__name__}: {exc}"
    return "CUDA error" in text or "AcceleratorError" in text or "illegal" in text.lower()


def run_case(case: Case, op: Any, device: str = "cuda", norms_on_cpu: bool = False) -> Outcome:
    """Call ``op`` as ``case`` draws it; compare with float64; sort the result into passed, refused or failed."""
    bound = error_bound(case.dtype, op.config.out_dtype.value)
    predicted = expected_refusal(case, op.config)
    run = Run(case, op, device, norms_on_cpu)
    try:
        form = {"plain": run.plain, "batched": run.plain, "grouped": run.grouped, "list": run.listed,
                "masked": run.masked, "grouped_k": run.grouped_k}[case.form]
        call, path_of, check = form()
    except Exception as exc:   # the harness's own error: say so, do not blame the op
        return Outcome("failed", bound=bound, message=f"could not prepare the case: {type(exc).__name__}: {exc}",
                       fatal=_is_fatal(exc), predicted=predicted)
    path = ""
    try:
        path = path_of() if predicted is None else ""
        result = call()
        _sync(device)
    except (ValueError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if predicted is not None:
            return Outcome("refused", bound=bound, message=first[:300], predicted=predicted)
        return Outcome("failed", bound=bound, path=path, message=f"refused a documented call: {type(exc).__name__}: "
                                                                   f"{first}")
    except Exception as exc:
        return Outcome("failed", bound=bound, path=path, message=f"{type(exc).__name__}: {exc}", fatal=_is_fatal(exc),
                       predicted=predicted)
    try:
        error = check(result)
        run.problems += [f"the call wrote into its input {what}" for what, buf, snapshot in run.inputs
                         if not unchanged(buf, snapshot)]
    except Exception as exc:
        return Outcome("failed", bound=bound, path=path, message=f"checking the result raised {type(exc).__name__}: "
                                                                   f"{exc}", fatal=_is_fatal(exc), predicted=predicted)
    if error > bound:
        run.problems.append(f"relative error {error:.3g} > bound {bound:.0e}"
                            + (" (non-finite: unwritten or NaN read from padding)" if math.isinf(error) else ""))
    status = "failed" if run.problems else "passed"
    return Outcome(status, error=error, bound=bound, path=path, message="; ".join(run.problems), predicted=predicted)


# -- the fuzz ----------------------------------------------------------------------------------------------------------

@dataclass
class Tally:
    family: str
    dtype: str
    cases: int = 0
    passed: int = 0
    refused: int = 0
    failed: int = 0
    worst_ratio: float = 0.0          # error / bound of the worst case that ran (for an exact bound: 0 or inf)
    worst_key: str = ""
    accepted_predicted: int = 0       # drawn to be refused, yet run (and checked like any other)
    paths: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)

    def add(self, case: Case, outcome: Outcome) -> None:
        self.cases += 1
        setattr(self, outcome.status, getattr(self, outcome.status) + 1)
        if outcome.status == "refused":
            self.refusals[outcome.predicted] += 1
            return
        self.accepted_predicted += outcome.predicted is not None and outcome.status == "passed"
        self.paths[f"{case.form}:{outcome.path or '?'}"] += 1
        ratio = outcome.error / outcome.bound if outcome.bound else (0.0 if outcome.error == 0 else math.inf)
        if ratio >= self.worst_ratio:
            self.worst_ratio, self.worst_key = ratio, case.key

    def as_dict(self) -> dict:
        out = asdict(self)
        out["worst_ratio"] = None if math.isinf(self.worst_ratio) else round(self.worst_ratio, 4)
        out["paths"], out["refusals"] = dict(self.paths), dict(self.refusals)
        return out


def replay_command(case: Case) -> str:
    return f"python3 gpu/fuzz.py --replay {case.key}"


def report_failure(case: Case, outcome: Outcome, op_name: str) -> dict:
    print(f"FAIL {case.text()}\n     kernel {op_name} path {outcome.path or '?'}: {outcome.message}\n"
          f"     replay: {replay_command(case)}", flush=True)
    return {"key": case.key, "replay": replay_command(case), "op": op_name, "message": outcome.message,
            "error": None if math.isinf(outcome.error) else outcome.error, "bound": outcome.bound,
            "path": outcome.path, "case": asdict(case)}


def distribution(cases: Sequence[Case]) -> dict[str, dict]:
    """What the cases cover: forms, ops, size ranges, edges hit, the storage features."""
    sizes: Counter = Counter()
    edges: Counter = Counter()
    features: Counter = Counter()
    for case in cases:
        elem = ELEM_BYTES[case.dtype]
        for p in case.problems:
            for s in p:
                sizes[next(label for label, top in (("0", 0), ("1-16", 16), ("17-128", 128), ("129-1024", 1024),
                                                    ("1025-10000", MAX_SIZE)) if s <= top)] += 1
                edges[s] += s in EDGES
        spec = op_spec(case.family, case.dtype, case.op)
        for view, row in [(v, spec.a_row) for v in case.a] + [(v, spec.b_row) for v in case.b]:
            features["operand off the 16-byte rule"] += breaks_16_bytes(view, row, elem)
            features["operand with a padded leading dimension"] += effective_ld(view, row) > max(
                view.shape[-1] if row else view.shape[-2], 1)
            if len(view.shape) == 3:
                features["batch stride 0"] += view.strides[0] == 0 and view.shape[0] > 1
                features["3-D batch of one"] += view.shape[0] == 1
        features["2-D operand of a batched call"] += case.form == "batched" and min(len(v.shape) for v in
                                                                                       case.a + case.b) == 2
        features["empty group or problem"] += case.form in ("grouped", "list", "masked", "grouped_k") and any(
            0 in p if case.form == "list" else p[2 if case.form == "grouped_k" else 0] == 0 for p in case.problems)
        features["K = 0"] += any(p[2] == 0 for p in case.problems)
        features["out= poisoned"] += case.out is not None and not case.in_place
        features["out=C in place"] += case.in_place
        features["input scale 1/sqrt(K)"] += case.input_scale != 1.0
    top_edges = dict(sorted(((str(k), v) for k, v in edges.items() if v), key=lambda kv: -kv[1])[:20])
    return {"forms": dict(Counter(c.form for c in cases)), "ops": dict(Counter(c.op for c in cases)),
            "sizes (M, N, K)": dict(sizes), "edges drawn (top 20)": top_edges, "features": dict(features)}


def print_distribution(title: str, dist: dict[str, dict]) -> None:
    print(title)
    for name, counts in dist.items():
        print(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


def print_summary(tallies: Sequence[Tally]) -> None:
    print(f"\n{'family':7} {'dtype':6} {'cases':>6} {'passed':>7} {'refused':>8} {'failed':>7} "
          f"{'max err/bound':>14}  worst case")
    for t in tallies:
        ratio = "inf" if math.isinf(t.worst_ratio) else f"{t.worst_ratio:.3f}"
        print(f"{t.family:7} {t.dtype:6} {t.cases:6} {t.passed:7} {t.refused:8} {t.failed:7} {ratio:>14}  "
              f"{t.worst_key}")
    for t in tallies:
        if t.paths:
            print(f"  {t.family} {t.dtype} paths: " + ", ".join(f"{k} {v}" for k, v in sorted(t.paths.items())))
        if t.refusals:
            print(f"  {t.family} {t.dtype} refused as documented: "
                  + "; ".join(f"{k} ({v})" for k, v in t.refusals.items()))
        if t.accepted_predicted:
            print(f"  {t.family} {t.dtype}: {t.accepted_predicted} case(s) drawn to be refused ran and passed")


def gpu_arch() -> int | None:
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def plan_all(combos: Sequence[tuple[str, str]], needed: dict, arch: int) -> dict[tuple[str, str, str], KernelConfig]:
    """The configs of the ops the cases use, planned for ``arch``; (family, dtype, op key) -> config."""
    return {(family, dtype, key): op_spec(family, dtype, key).config(family, dtype, arch)
            for family, dtype in combos for key in sorted(needed[(family, dtype)])}


def build_ops(configs: dict[tuple[str, str, str], KernelConfig], namespace: str) -> dict:
    """Every config's op, built in one parallel ninja run (cached)."""
    from generator.runtime import compile_many

    unique = {c.name: c for c in configs.values()}
    built = dict(zip(unique, compile_many(list(unique.values()), namespace=namespace)))
    return {key: built[c.name] for key, c in configs.items()}


def parse_list(text: str, allowed: Sequence[str], what: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"--{what} {text!r}: choose from {', '.join(allowed)}")
    return items


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Random GEMM calls of every form against float64 (issue 22).")
    p.add_argument("--cases", type=int, default=500,
                   help="cases per family x dtype (default 500), and K_CASES as many grouped calls along K")
    p.add_argument("--seed", type=int, default=0, help="master seed; case i's own seed derives from it")
    p.add_argument("--families", type=lambda s: parse_list(s, FAMILIES, "families"), default=FAMILIES,
                   help="comma-separated (default sm80,sm90)")
    p.add_argument("--dtypes", type=lambda s: parse_list(s, DTYPES, "dtypes"), default=DEFAULT_DTYPES,
                   help=f"comma-separated from {','.join(DTYPES)} (default bf16,fp16)")
    p.add_argument("--sample", type=int, default=None, metavar="K",
                   help=f"run only K small cases (volume <= 2^{SAMPLE_MAX_VOLUME.bit_length() - 1}) per family x "
                        "dtype, every form in turn: for compute-sanitizer")
    p.add_argument("--replay", nargs="+", metavar="FAMILY:DTYPE:SEED", help="run these cases only, printed in full")
    p.add_argument("--dry-run", action="store_true", help="draw and plan the cases, print them; no GPU needed")
    p.add_argument("--show", type=int, default=8, help="cases printed per family x dtype by --dry-run (-1: all)")
    p.add_argument("--build-only", action="store_true", help="build the ops the cases use, run nothing")
    p.add_argument("--verbose", action="store_true", help="print every case and its outcome")
    p.add_argument("--json", type=Path, default=None, help="write the summary, failures and coverage here")
    p.add_argument("--arch", type=int, default=None, help="--dry-run: plan for this arch (default: the GPU's, or 90)")
    p.add_argument("--namespace", default="gemmgen_fuzz", help="torch.ops namespace of the ops")
    return p.parse_args(argv)


def selected_cases(args: argparse.Namespace) -> dict[tuple[str, str], list[tuple[int, Case]]]:
    """(family, dtype) -> [(index, case)]: the replayed ones, or the drawn ones (a sample of them)."""
    if args.replay:
        chosen: dict[tuple[str, str], list[tuple[int, Case]]] = {}
        for key in args.replay:
            family, dtype, seed = parse_key(key)
            chosen.setdefault((family, dtype), []).append((-1, draw_case(family, dtype, seed)))
        return chosen
    chosen = {}
    for family in args.families:
        for dtype in args.dtypes:
            if not ops_for(family, dtype):
                print(f"{family} x {dtype}: the family takes no such plans (fp8 runs on sm90); skipped")
                continue
            cases = draw_cases(args.seed, family, dtype, args.cases)
            indices = sample_indices(cases, args.sample, args.seed) if args.sample is not None else range(len(cases))
            chosen[(family, dtype)] = [(i, cases[i]) for i in indices]
    return chosen


def dry_run(chosen: dict, arch: int, show: int) -> int:
    needed = {combo: {c.op for _, c in cases} for combo, cases in chosen.items()}
    configs = plan_all(list(chosen), needed, arch)
    for (family, dtype), cases in chosen.items():
        refused = Counter(r for _, case in cases if (r := expected_refusal(case, configs[(family, dtype, case.op)])))
        names = {configs[(family, dtype, k)].name for k in needed[(family, dtype)]}
        print(f"\n== {family} x {dtype}: {len(cases)} cases on {len(names)} kernels (planned for sm_{arch}); "
              f"drawn to be refused: {sum(refused.values())}")
        for i, case in cases[: len(cases) if show < 0 else show]:
            print(f"  [{i}] {case.text()}")
        print_distribution("  coverage:", distribution([c for _, c in cases]))
        if refused:
            print("  expected refusals: " + "; ".join(f"{k} ({v})" for k, v in refused.items()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        chosen = selected_cases(args)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    arch = (args.arch or gpu_arch() or 90) if args.dry_run else gpu_arch()
    if arch is None:
        print("no CUDA GPU: use --dry-run to see the cases", file=sys.stderr)
        return 2
    if arch != 90 and any(family == "sm90" for family, _ in chosen):
        print(f"sm_{arch}: the sm90 family needs a Hopper GPU; its cases are skipped")
        chosen = {combo: cases for combo, cases in chosen.items() if combo[0] != "sm90"}
    if args.dry_run:
        return dry_run(chosen, arch, args.show)
    needed = {combo: {c.op for _, c in cases} for combo, cases in chosen.items()}
    device = torch.cuda.get_device_name()
    t0 = time.perf_counter()
    configs = plan_all(list(chosen), needed, arch)
    try:
        ops = build_ops(configs, args.namespace)
    except Exception as exc:   # a kernel that does not build fails the run; ninja built the others (cached)
        print(f"building the ops failed: {type(exc).__name__}: {exc}", flush=True)
        return 1
    build_s = time.perf_counter() - t0
    print(f"{len({c.name for c in configs.values()})} kernels ready in {build_s:.1f} s "
          f"({device}, torch {torch.__version__}, seed {args.seed})", flush=True)
    if args.build_only:
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    tallies, failures, fatal = [], [], False
    t0 = time.perf_counter()
    for (family, dtype), cases in chosen.items():
        tally = Tally(family, dtype)
        tallies.append(tally)
        for index, case in cases:
            if fatal:
                break
            op = ops[(family, dtype, case.op)]
            outcome = run_case(case, op, norms_on_cpu=args.sample is not None)   # a sample: under a sanitizer
            tally.add(case, outcome)
            if args.verbose or args.replay or args.sample is not None:
                extra = f" path {outcome.path}" if outcome.path else ""
                print(f"[{index}] {case.text()}\n     {op.name}: {outcome.status}{extra} error {outcome.error:.3g} "
                      f"(bound {outcome.bound:.0e}) {outcome.message}", flush=True)
            if outcome.status == "failed":
                failures.append(report_failure(case, outcome, op.name))
            if outcome.fatal:
                print("the CUDA context is lost: the run stops here (replay the case above alone)", flush=True)
                fatal = True
        print(f"{family} x {dtype}: {tally.cases} cases, {tally.failed} failed", flush=True)
    run_s = time.perf_counter() - t0
    print_summary(tallies)
    print(f"build {build_s:.1f} s, cases {run_s:.1f} s")
    if args.json is not None:
        report = {"seed": args.seed, "cases": args.cases, "sample": args.sample, "arch": arch,
                  "device": device, "torch": torch.__version__,
                  "build_seconds": round(build_s, 1), "run_seconds": round(run_s, 1), "stopped_early": fatal,
                  "summary": [t.as_dict() for t in tallies], "failures": failures,
                  "coverage": {f"{f}:{d}": distribution([c for _, c in cases]) for (f, d), cases in chosen.items()}}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 1 if failures or fatal else 0


if __name__ == "__main__":
    sys.exit(main())
