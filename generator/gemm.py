"""Gemm: the user's plan. Holds the user's knobs, asks the planner for the rest, and refuses at
assignment any override the template or the hardware cannot honour (the plan stays as it was).

    plan = Gemm(dtype="bf16", layout="tn", arch=80)
    plan.stages = 3          # re-planned and checked now, not at compile time
    op = plan.compile()      # render -> build (cached) -> torch op

At arch 90 the plan is of the sm90 family (TMA, wgmma) unless ``family="sm80"`` is given; its knobs
are ``schedule``, ``cluster_shape`` and ``raster`` instead of ``warps``.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .planner import Estimate, Knobs, Problem, check_family, choose
from .planner.backward import PlanGradient, same_backward
from .render import render
from .spec.arch import ArchSpec, arch_spec, detect_arch
from .spec.config import RASTERS, SM90_SCHEDULES, SMALL_M_MAX_ROWS, KernelConfig, takes_small_m
from .spec.describe import describe
from .spec.epilogue import KNOB_NAMES, SCALE_MODES, Epilogue, activation_name, from_knobs, trace, with_scales
from .spec.types import (PLAN_OUTPUT_DTYPES, PLANNABLE_INPUT_DTYPES, DType, Layout, default_out_dtype, parse_dtype,
                         parse_input_dtype, parse_layout, unquantized)

if TYPE_CHECKING:
    from .runtime.buckets import BucketedOp
    from .runtime.op import GemmOp
    from .tune import Space, TunedChoice, TuneResult

DEFAULT_NAMESPACE = "gemmgen"

#: Rows of A up to which an M-bucketed op (Gemm.compile_buckets) keeps a kernel planned for that M; above the
#: last, the plan's own (large-M, 4096-row) kernel. Calls of at most 16 rows take the small-M kernel within any of them.
#: Neighbouring bounds whose plans agree (kernel and backward) merge, so the grid is as fine as the planner's picks
#: change: a bound every 128 rows (one row of 128-row tiles) up to 1024, where a tile row more or less moves the waves
#: most, then every 256 and 512 rows. Why so fine: a call takes the kernel planned for the top of its bucket, and a tile
#: that fits the top can misfit the rows below it (384 rows are 3 rows of tiles: on the 512-row plan's 2x1 clusters a
#: quarter of the cluster rows is padding). Measured on the corpus of real models' layers (H100, 58 layers, the old
#: grid 64, 128, 256, 512, 1024, 2048): 384 tokens read 0.78x cuBLAS and 768 0.86x, against 0.92-0.94x at 256, 512
#: and 1024 (h100_corpus_fwd_estimate_beside_table.json). The cost model, over every 32nd M from 64 to 4096 on those
#: layers, puts the bucket's kernel 6.8 % behind the plan for the exact M on the old grid (p90 30 %) and 1.5 % on this
#: one (p90 5 %), at 7.7 kernels a layer against 5.2 (benchmarks/bucket_grid.py). And 112: up to it two 64-row tile rows
#: whose second is partial take 64x128 pingpong on layers of 4225-6144 columns, where at 128 rows the 128x64
#: cooperative tile stays (planner.sm90.two_tile_rows_tile: 1.14-1.32x at 80-112 rows, 0.965x at 128; a new kernel
#: for 3 of the corpus' 58 layers, the others' 112-row plans merge with their 128-row ones).
M_BUCKETS = (64, 112, 128, 192, 256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584)


def op_key(plan: Gemm) -> tuple[KernelConfig, Problem | None]:
    """What tells two plans' ops apart: the kernel, and the problem its backward kernels are planned for (the size
    hints; generator.planner.backward.backward_configs). ``compile_many(configs, problems=...)`` builds them."""
    return plan.config, plan.problem


def _ragged_arg(ragged: object, m: int | None, batch: int) -> bool:
    """``ragged`` checked: a bool, and with it the expected rows per group (m) and the groups (batch > 1)."""
    if not isinstance(ragged, bool):
        raise TypeError(f"ragged={ragged!r} must be True or False")
    if ragged and (m is None or batch < 2):
        raise ValueError("ragged=True plans for the groups of a grouped call: give m (the expected rows per group, "
                         "e.g. tokens * top_k // experts) and batch (the number of groups), e.g. "
                         "Gemm('bf16', 'tn', m=256, n=N, k=K, batch=E, ragged=True)")
    return ragged


def _positive_or_none(value: object, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{what}={value!r}: give a positive integer problem size, or leave it out")
    return value


def _int_tuple(value: object, length: int, what: str, example: str) -> tuple[int, ...]:
    parts = value.lower().split("x") if isinstance(value, str) else value
    try:
        items = tuple(int(v) for v in parts)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        items = ()
    if len(items) != length or any(i < 1 for i in items):
        raise ValueError(f"{what}={value!r}: give {length} positive integers, e.g. {what}={example}")
    return items


def _integer(value: object, what: str, example: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what}={value!r}: give an integer, e.g. {what}={example}")
    return value


def _boolean(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what}={value!r}: give True or False")
    return value


def _choice(value: object, what: str, choices: tuple[str, ...]) -> str:
    """A string knob; its value is judged by the planner (check_config), type errors here."""
    if not isinstance(value, str):
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{what}={value!r}: give one of {listed}")
    return value


# Gemm keyword / property name -> (Knobs field, parser of the user's value).
_KNOB_PARSERS: dict[str, tuple[str, Callable[[object], object]]] = {
    "family": ("family", check_family),
    "tile_shape": ("tile", lambda v: _int_tuple(v, 3, "tile_shape", "(128, 128, 32)")),
    "warps": ("warps", lambda v: _int_tuple(v, 2, "warps", "(2, 2)")),
    "stages": ("stages", lambda v: _integer(v, "stages", "4")),
    "raster_group": ("raster_group", lambda v: _integer(v, "raster_group", "8")),
    "schedule": ("schedule", lambda v: _choice(v, "schedule", SM90_SCHEDULES)),
    "cluster_shape": ("cluster", lambda v: _int_tuple(v, 2, "cluster_shape", "(2, 1)")),
    "raster": ("raster", lambda v: _choice(v, "raster", RASTERS)),
    "fast_accum": ("fast_accum", lambda v: _boolean(v, "fast_accum")),
    "amax": ("amax", lambda v: _boolean(v, "amax")),
    "interleave_k": ("interleave_k", lambda v: _boolean(v, "interleave_k")),
}


@dataclass(frozen=True)
class EpilogueKnobs:
    """The simple epilogue knobs: ``act(alpha * acc + beta * C + bias)`` (see generator.epilogue.from_knobs)."""

    activation: str | None = None           # canonical: a name or function (ep.relu) given is stored as "relu"
    bias: str | None = None                 # "row" (length M) or "col" (length N)
    alpha: float | str | None = None        # a number compiled in, or "scalar" (a runtime argument)
    beta: float | str | None = None         # None: no C; a number, or "scalar"

    def __post_init__(self) -> None:
        # One spelling per activation, so ep.relu, "relu" and "RELU" make equal requests and read back alike.
        object.__setattr__(self, "activation", activation_name(self.activation))

    def epilogue(self) -> Epilogue:
        return from_knobs(activation=self.activation, bias=self.bias, alpha=self.alpha, beta=self.beta)


@dataclass(frozen=True)
class _Request:
    """Everything the user asked for; the config is a pure function of this."""

    dtype: DType
    out_dtype: DType
    layout: Layout
    spec: ArchSpec
    sm_count: int
    problem: Problem | None
    knobs: Knobs
    epilogue_fn: Epilogue | None = None     # the traced epilogue= function (or Epilogue), if one was given
    epilogue_knobs: EpilogueKnobs = EpilogueKnobs()
    scale: str = "none"                     # the quantized operands' scales: none, tensor, row or block
    dtype_b: DType | None = None            # B's type where it differs from A's (fp8: e4m3 x e5m2)

    def epilogue(self) -> Epilogue:
        """The epilogue this request asks for, its scales composed in (``with_scales``: scale_a and scale_b
        come first among the operands), its dtypes resolved to the output dtype."""
        if self.epilogue_fn is not None and self.epilogue_knobs != EpilogueKnobs():
            set_knobs = ", ".join(k for k in KNOB_NAMES if getattr(self.epilogue_knobs, k) is not None)
            raise ValueError(f"this plan has both an epilogue function and the knobs {set_knobs}: put everything in "
                             "the function, or set epilogue=None and use the knobs")
        chosen = self.epilogue_fn if self.epilogue_fn is not None else self.epilogue_knobs.epilogue()
        return with_scales(chosen, self.scale).resolved(unquantized(self.out_dtype))


def _dtype_b_arg(value: object, dtype: DType) -> DType | None:
    """dtype_b=: B's element type where it is not A's (fp8 e4m3 x e5m2); A's own type means None."""
    if value is None:
        return None
    dtype_b = parse_dtype(value, what="dtype_b", allowed=PLANNABLE_INPUT_DTYPES)
    return None if dtype_b is dtype else dtype_b


def _scale_arg(value: object) -> str:
    if value is None:
        return "none"
    if value not in SCALE_MODES:
        listed = ", ".join(repr(c) for c in SCALE_MODES)
        raise ValueError(f"scale={value!r}: give one of {listed} (fp8 block scales: 'block', 1x128 of A and "
                         "128x128 of B)")
    return value


def _epilogue_arg(value: object) -> Epilogue | None:
    """epilogue=: a function of the accumulator (traced now), an Epilogue, or None (the knobs decide)."""
    if value is None or isinstance(value, Epilogue):
        return value
    if callable(value):
        return trace(value)
    raise ValueError(f"epilogue={value!r}: give a function of the accumulator and its operands, e.g. "
                     "def f(acc, bias: ep.Col): return ep.relu(acc + bias) (see generator.epilogue)")


#: print(plan)'s "tuned:" line for a plan that no measurement answers: neither the user's tuning cache nor a shipped
#: dispatch table holds its problem on this GPU.
UNTUNED_LINE = "no, estimated (no measured winner for this problem on this GPU; plan.tune() measures)"


def _space(request: _Request) -> Space:
    """What tuning needs of a request: the planner's inputs but the problem."""
    from .tune import Space

    return Space(dtype=request.dtype, out_dtype=request.out_dtype, layout=request.layout, spec=request.spec,
                 sm_count=request.sm_count, knobs=request.knobs, epilogue=request.epilogue(), dtype_b=request.dtype_b)


def _lookup_tuned(request: _Request, best: Estimate) -> TunedChoice | None:
    """The tuning cache's winner for the request's problem on this GPU, else the shipped dispatch table's for its
    band of rows (a plan without size hints has no problem to look up; without a table this costs one directory
    listing)."""
    if request.problem is None:
        return None
    from .tune import lookup_choice

    return lookup_choice(_space(request), request.problem, best.config, best.model)


def plan_gradient() -> PlanGradient:
    """How a compiled op chooses its backward kernels: as the forward does, the measured winner where the tuning cache
    or the shipped table answers the gradient's own problem, else the estimate (planner.backward.PlanGradient)."""
    from .tune import tuned_plan

    return tuned_plan


class Gemm:
    """A planned GEMM, D = A @ B. See the README for layouts; every knob below may be overridden.

    Knobs: ``tile_shape`` (BM, BN, BK), ``stages``, ``raster_group``, ``out_dtype`` (with 'e4m3' / 'e5m2', ``amax=True``
    also returns the amax of D), ``family``
    ("sm80" / "sm90"; default: sm90 at arch 90, sm80 below); sm80 only: ``warps`` (WM, WN); sm90
    only: ``schedule`` ("ws" / "cooperative" / "pingpong"), ``cluster_shape`` (e.g. (2, 1) or "2x1"),
    ``raster`` ("m" / "n"). ``arch=None`` plans for the visible GPU. Size hints: ``m``, ``n``, ``k`` (one
    problem's) and ``batch`` (how many problems a batched call multiplies at once: 3-D A or B, see the README);
    ``ragged=True`` with ``batch`` and ``m``: the problems are a grouped call's groups (``op.grouped``, a mixture of
    experts' routed rows) whose rows vary around ``m``, the expected rows per group (as DeepGEMM's expected_m), so the
    plan counts each group's last tile row as half empty and sizes its tiles for the larger groups.
    """

    def __init__(self, dtype: object = "bf16", layout: object = "tn", *, arch: object = None,
                 out_dtype: object = None, layout_a: object = None, layout_b: object = None,
                 layout_c: object = None, m: int | None = None, n: int | None = None, k: int | None = None,
                 batch: int | None = None, tile_shape: object = None, warps: object = None, stages: int | None = None,
                 raster_group: int | None = None, family: str | None = None, schedule: str | None = None,
                 cluster_shape: object = None, raster: str | None = None, epilogue: object = None,
                 activation: str | Callable[..., Any] | None = None, bias: str | None = None,
                 alpha: float | str | None = None, beta: float | str | None = None, scale: str | None = None,
                 fast_accum: bool | None = None, amax: bool | None = None, dtype_b: object = None,
                 interleave_k: bool | None = None, ragged: bool = False,
                 namespace: str = DEFAULT_NAMESPACE) -> None:
        dtype_ = parse_input_dtype(dtype)
        if arch is None:
            spec, sm_count = detect_arch()
        else:
            spec = arch_spec(arch)
            sm_count = spec.sm_count
        hints = [_positive_or_none(v, w) for v, w in ((m, "m"), (n, "n"), (k, "k"))]
        batch_ = _positive_or_none(batch, "batch") or 1
        problem = (Problem(*(h or d for h, d in zip(hints, (4096, 4096, 4096))), batch_, _ragged_arg(ragged, m, batch_))
                   if any(hints) or batch_ > 1 else None)
        if not isinstance(namespace, str) or not namespace.isidentifier():
            raise ValueError(f"namespace={namespace!r} must be a Python identifier, e.g. 'gemmgen'")
        self.namespace = namespace
        given = dict(family=family, tile_shape=tile_shape, warps=warps, stages=stages, raster_group=raster_group,
                     schedule=schedule, cluster_shape=cluster_shape, raster=raster, fast_accum=fast_accum,
                     amax=amax, interleave_k=interleave_k)
        # All knobs at once: a combination is judged as a whole (schedule="pingpong" with a tile that
        # only pingpong takes is fine, whatever the order of the keywords).
        knobs = Knobs(**{_KNOB_PARSERS[k][0]: _KNOB_PARSERS[k][1](v) for k, v in given.items() if v is not None})
        request = _Request(
            dtype=dtype_,
            out_dtype=(parse_dtype(out_dtype, what="out_dtype", allowed=PLAN_OUTPUT_DTYPES) if out_dtype else
                       default_out_dtype(dtype_)),
            layout=parse_layout(layout, layout_a=layout_a, layout_b=layout_b, layout_c=layout_c),
            spec=spec, sm_count=sm_count, problem=problem, knobs=knobs, epilogue_fn=_epilogue_arg(epilogue),
            epilogue_knobs=EpilogueKnobs(activation=activation, bias=bias, alpha=alpha, beta=beta),
            scale=_scale_arg(scale), dtype_b=_dtype_b_arg(dtype_b, dtype_))
        self._set_request(request)

    # -- planning -------------------------------------------------------------------------------

    def _set_request(self, request: _Request) -> None:
        """Plan for ``request``; on a ValueError the plan keeps its previous state."""
        best, rejected = choose(request.dtype, request.out_dtype, request.layout, request.spec,
                                knobs=request.knobs, problem=request.problem, sm_count=request.sm_count,
                                epilogue=request.epilogue(), dtype_b=request.dtype_b)
        tuned = _lookup_tuned(request, best)
        self._request, self._estimate, self._rejected, self._tuned = request, best, rejected, tuned

    def _with_knobs(self, **changes: object) -> None:
        self._set_request(replace(self._request, knobs=replace(self._request.knobs, **changes)))

    def _set_knob(self, knob: str, value: object) -> None:
        field_name, parse = _KNOB_PARSERS[knob]
        self._with_knobs(**{field_name: parse(value)})

    @property
    def config(self) -> KernelConfig:
        """The kernel this plan builds: the measured winner where one is recorded for its problem (``tuned``), else
        the estimate's pick."""
        return self._tuned.config if self._tuned is not None else self._estimate.config

    @property
    def tuned(self) -> TunedChoice | None:
        """The measured winner this plan uses (``tune()``, or the tuning cache's record for its problem on this
        GPU), or None: the plan is the estimate's. GEMMGEN_TUNED=0 turns the cache's records off."""
        return self._tuned

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def why(self) -> str:
        """One line: why the planner chose this config (and, for a problem of at most 16 rows, which kernel its
        calls take instead; not for ragged groups, whose grouped calls never do)."""
        problem = self._request.problem
        if self._tuned is not None and self._tuned.config != self._estimate.config:
            return f"measured (see tuned:); the estimate picked {self._estimate.config.name}: {self._estimate.reason}"
        if problem is None or problem.ragged or not takes_small_m(self.config, problem.m, problem.n, problem.k,
                                                 self._request.spec.sm_count):
            return self._estimate.reason
        elem = self.config.dtype.bytes
        floor_us = problem.n * problem.k * elem / self._request.spec.hbm_bytes_per_s * 1e6
        return (f"M = {problem.m} <= {SMALL_M_MAX_ROWS}: calls take the small-M kernel, which streams B once "
                f"({problem.n}x{problem.k}, {problem.n * problem.k * elem / 1e6:.1f} MB: {floor_us:.1f} us at the "
                f"HBM's {self._request.spec.hbm_bytes_per_s / 1e12:.2f} TB/s), not a tile of 64 or more mostly empty "
                f"rows; this config serves calls with more rows: {self._estimate.reason}")

    @property
    def estimate(self) -> Estimate:
        return self._estimate

    @property
    def problem(self) -> Problem | None:
        """The size hints this plan was made for (m, n, k and batch, 4096 standing for a hint not given), or None
        for a plan without any."""
        return self._request.problem

    @property
    def rejected(self) -> list[str]:
        """One line per candidate config the planner filtered out, with the reason."""
        return list(self._rejected)

    # -- knobs ------------------------------------------------------------------------------------

    @property
    def dtype(self) -> DType:
        return self._request.dtype

    @property
    def layout(self) -> Layout:
        return self._request.layout

    @property
    def arch(self) -> int:
        return self._request.spec.cc

    @property
    def out_dtype(self) -> DType:
        return self._request.out_dtype

    @out_dtype.setter
    def out_dtype(self, value: object) -> None:
        out_dtype = parse_dtype(value, what="out_dtype", allowed=PLAN_OUTPUT_DTYPES)
        self._set_request(replace(self._request, out_dtype=out_dtype))

    @property
    def family(self) -> str:
        """"sm80" or "sm90". Assign None to go back to the architecture's default."""
        return self.config.family

    @family.setter
    def family(self, value: str | None) -> None:
        self._set_knob("family", value)

    @property
    def tile_shape(self) -> tuple[int, int, int]:
        return self.config.tile

    @tile_shape.setter
    def tile_shape(self, value: object) -> None:
        self._set_knob("tile_shape", value)

    @property
    def warps(self) -> tuple[int, int] | None:
        """sm80: the warp grid (WM, WN); None for the sm90 family (3 warpgroups, fixed)."""
        return self.config.warps

    @warps.setter
    def warps(self, value: object) -> None:
        self._set_knob("warps", value)

    @property
    def stages(self) -> int:
        return self.config.stages

    @stages.setter
    def stages(self, value: int) -> None:
        self._set_knob("stages", value)

    @property
    def raster_group(self) -> int:
        return self.config.raster_group

    @raster_group.setter
    def raster_group(self, value: int) -> None:
        self._set_knob("raster_group", value)

    @property
    def schedule(self) -> str:
        """sm90: "ws", "cooperative" or "pingpong"; "" for the sm80 family."""
        return self.config.schedule

    @schedule.setter
    def schedule(self, value: str) -> None:
        self._set_knob("schedule", value)

    @property
    def cluster_shape(self) -> tuple[int, int]:
        """sm90: the thread-block cluster (along M, along N); (1, 1) for the sm80 family."""
        return self.config.cluster

    @cluster_shape.setter
    def cluster_shape(self, value: object) -> None:
        self._set_knob("cluster_shape", value)

    @property
    def dtype_b(self) -> DType:
        """B's element type: the plan's dtype, or (fp8) the other format, e.g. Gemm("e5m2", dtype_b="e4m3")."""
        return self.config.b_dtype

    @property
    def fast_accum(self) -> bool:
        """fp8: True sums all of K inside wgmma (torch's use_fast_accum: faster, its additions keep fewer bits than
        fp32); False (the default) promotes each k tile into fp32 accumulators, as cuBLAS does without it."""
        return self.config.fast_accum

    @fast_accum.setter
    def fast_accum(self, value: bool) -> None:
        self._set_knob("fast_accum", value)

    @property
    def interleave_k(self) -> bool:
        """fp8 (promoted), a 64-row cooperative tile: True has its two consumer warpgroups take alternate k tiles of
        the whole tile (one promoting while the other's wgmmas run) instead of half its columns each; False keeps
        the planner from choosing it (its rule 22 takes it for one-wave picks at 1-512 rows, docs/planner.md)."""
        return self.config.interleave_k

    @interleave_k.setter
    def interleave_k(self, value: bool) -> None:
        self._set_knob("interleave_k", value)

    @property
    def amax(self) -> bool:
        """A quantized D (out_dtype 'e4m3' or 'e5m2'): True also returns the amax of D, the largest |value| the
        epilogue gave before quantization (a 0-dim fp32 tensor, the op's third output), for delayed scaling."""
        return self.config.amax

    @amax.setter
    def amax(self, value: bool) -> None:
        self._set_knob("amax", value)

    @property
    def raster(self) -> str:
        """sm90: the order tiles are walked in, "m" or "n" (see README); "m" for the sm80 family."""
        return self.config.raster

    @raster.setter
    def raster(self, value: str) -> None:
        self._set_knob("raster", value)

    # -- epilogue -----------------------------------------------------------------------------------

    @property
    def epilogue(self) -> Epilogue:
        """The fused epilogue (resolved); assign a function of the accumulator, an Epilogue, or None."""
        return self.config.epilogue

    @epilogue.setter
    def epilogue(self, value: object) -> None:
        self._set_request(replace(self._request, epilogue_fn=_epilogue_arg(value)))

    def _set_epilogue_knob(self, knob: str, value: object) -> None:
        knobs = replace(self._request.epilogue_knobs, **{knob: value})
        self._set_request(replace(self._request, epilogue_knobs=knobs))

    @property
    def activation(self) -> str | None:
        """The activation knob: relu, leaky_relu, gelu, gelu_tanh, silu, sigmoid, tanh or None. Set a name
        (aliases "swish", "gelu_erf"; any case) or the function itself (``plan.activation = ep.relu``, as in
        the CUTLASS Python interface); it reads back as the canonical name ("relu"). Any other function goes
        in ``plan.epilogue = fn``."""
        return self._request.epilogue_knobs.activation

    @activation.setter
    def activation(self, value: str | Callable[..., Any] | None) -> None:
        self._set_epilogue_knob("activation", value)

    @property
    def bias(self) -> str | None:
        """The bias knob: "col" (a vector of length N, as nn.Linear's), "row" (length M) or None."""
        return self._request.epilogue_knobs.bias

    @bias.setter
    def bias(self, value: str | None) -> None:
        self._set_epilogue_knob("bias", value)

    @property
    def alpha(self) -> float | str | None:
        """acc is scaled by alpha: a number (compiled in), "scalar" (a runtime argument) or None."""
        return self._request.epilogue_knobs.alpha

    @alpha.setter
    def alpha(self, value: float | str | None) -> None:
        self._set_epilogue_knob("alpha", value)

    @property
    def beta(self) -> float | str | None:
        """beta * C is added (C an M x N operand): a number, "scalar" (a runtime argument) or None (no C)."""
        return self._request.epilogue_knobs.beta

    @beta.setter
    def beta(self, value: float | str | None) -> None:
        self._set_epilogue_knob("beta", value)

    @property
    def scale(self) -> str:
        """How A and B are scaled (fp8, int8): "none"; "tensor" (D = acc * scale_a * scale_b, one-element fp32
        tensors); "row" (scale_a (M,), scale_b (N,)); "block" (fp8: scale_a (M, ceil(K/128)), one per row and
        128-wide k block; scale_b (ceil(N/128), ceil(K/128)), one per 128 x 128 block of B). The op takes
        scale_a and scale_b after A and B; generator.quantize makes them."""
        return self._request.scale

    @scale.setter
    def scale(self, value: str | None) -> None:
        self._set_request(replace(self._request, scale=_scale_arg(value)))

    # -- output -----------------------------------------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        # A misspelt knob (plan.tile = ..., plan.cluster = ...) would otherwise become a new attribute and
        # be ignored without a word, and the plan would build something else than asked for.
        if not name.startswith("_") and name != "namespace" and not isinstance(getattr(Gemm, name, None), property):
            knobs = sorted(n for n, v in vars(Gemm).items() if isinstance(v, property) and v.fset is not None)
            close = difflib.get_close_matches(name, knobs, n=1, cutoff=0.5)
            near = f"did you mean {close[0]!r}? " if close else ""
            raise AttributeError(f"Gemm has no knob {name!r}: {near}the knobs are {', '.join(knobs)}")
        super().__setattr__(name, value)

    def __str__(self) -> str:
        # The config is the same on every part of its arch; the gpu line says whose SMs and HBM the why counts.
        gpu = self._request.spec.gpu.describe()
        tuned = self._tuned.line() if self._tuned is not None else UNTUNED_LINE
        return f"{describe(self.config)}\ngpu:          {gpu}\nwhy:          {self.why}\ntuned:        {tuned}"

    def __repr__(self) -> str:
        return f"Gemm({self.name})"

    def render(self) -> dict[str, str]:
        """The kernel's CUDA sources, {file name: text}; needs neither torch nor a GPU."""
        return render(self.config)

    def tune(self, m: int | None = None, n: int | None = None, k: int | None = None, *, batch: int | None = None,
             budget_s: float | None = None, max_candidates: int | None = None, progress: bool = True,
             force: bool = False) -> TuneResult:
        """Measure the legal configs around the estimate's pick for the problem ``m`` x ``n`` x ``k`` (default: this
        plan's size hints) on this GPU and use the fastest correct one: from now on ``config`` is the winner (and
        ``compile()`` builds it), ``print(plan)`` says ``tuned: ...``. The winner is recorded in the tuning cache,
        so later plans of the same request and problem on this GPU take it without measuring; a recorded winner is
        answered at once, without building or measuring (``force=True`` measures again).

        Up to ``max_candidates`` (default 32) configs are built in one parallel run and timed side by side on fresh
        random operands, each checked against a reference first (docs/tuning.md). ``budget_s``: past this many
        seconds (builds included) no further candidate or round starts. ``progress``: bars on stderr. Giving a size
        that differs from the plan's hints re-plans the plan for it (its knobs stay as set). Needs torch and a GPU.
        """
        from .tune import DEFAULT_MAX_CANDIDATES, tune

        given = [_positive_or_none(v, w) for v, w in ((m, "m"), (n, "n"), (k, "k"))]
        current = self._request.problem
        if current is None and None in given:
            raise ValueError("tune() needs the problem size: give m, n and k (this plan has no size hints), e.g. "
                             "plan.tune(m=4096, n=4096, k=4096)")
        base = current or Problem(1, 1, 1)
        problem = Problem(given[0] or base.m, given[1] or base.n, given[2] or base.k,
                          _positive_or_none(batch, "batch") or base.batch, base.ragged)   # (timed as equal groups)
        if problem != current:
            self._set_request(replace(self._request, problem=problem))
        result = tune(_space(self._request), problem, self._estimate.config, namespace=self.namespace,
                      budget_s=budget_s, max_candidates=max_candidates or DEFAULT_MAX_CANDIDATES, progress=progress,
                      force=force)
        self._tuned = result.choice
        return result

    def tune_buckets(self, bounds: Sequence[int] = M_BUCKETS, *, budget_s: float | None = None,
                     max_candidates: int | None = None, progress: bool = True, force: bool = False) -> list[TuneResult]:
        """Tune the plan of every M bucket (``bucket_plans``: M = each bound, N and K as this plan's hints, 4096
        where none was given), and this plan itself where it has size hints (the bucket of larger M); the options
        as ``tune``'s, ``budget_s`` per bucket. ``compile_buckets()`` then builds the winners: each bucket's plan
        finds its own in the tuning cache (unless GEMMGEN_TUNED=0)."""
        problem = self._request.problem
        n, k = (problem.n, problem.k) if problem is not None else (4096, 4096)
        plans = [self._replanned(Problem(bound, n, k)) for bound in bounds] + ([self] if problem is not None else [])
        return [plan.tune(budget_s=budget_s, max_candidates=max_candidates, progress=progress, force=force)
                for plan in plans]

    def compile(self, *, verbose: bool = False) -> GemmOp:
        """Render, build (cached) and load the kernel; returns the op, also at torch.ops.<namespace>.<name>."""
        from .runtime.op import compile_op

        return compile_op(self.config, namespace=self.namespace, verbose=verbose, problem=self._request.problem,
                          plan_gradient=plan_gradient())

    def bucket_plans(self, bounds: Sequence[int] = M_BUCKETS) -> list[tuple[int | None, Gemm]]:
        """The plans of an M-bucketed op: this plan re-planned for M = each bound (N and K as this plan's hints,
        4096 where none was given; every knob set here stays set), then this plan for any larger M (max_m None).
        Neighbouring buckets that plan the same kernel, and the same backward kernels for their problems, are merged
        into the larger one."""
        if list(bounds) != sorted(set(bounds)) or any(not isinstance(b, int) or b < 1 for b in bounds):
            raise ValueError(f"bounds={tuple(bounds)}: give distinct positive row counts in increasing order, e.g. "
                             f"{M_BUCKETS}")
        problem = self._request.problem
        n, k = (problem.n, problem.k) if problem is not None else (4096, 4096)
        plans: list[tuple[int | None, Gemm]] = [(bound, self._replanned(Problem(bound, n, k))) for bound in bounds]
        plans.append((None, self))
        # Neighbours merge where they run one kernel with one backward (a differentiable op plans its backward for its
        # bucket's problem: at a long K, dX of 512 rows wants other tiles than dX of 4096).
        merged = [pair for pair, after in zip(plans, plans[1:])
                  if pair[1].config != after[1].config
                  or not same_backward(pair[1].config, pair[1].problem, after[1].problem, plan_gradient())]
        return merged + [plans[-1]]

    def _replanned(self, problem: Problem) -> Gemm:
        """A copy of this plan, every knob as set here, planned for ``problem``."""
        plan = object.__new__(Gemm)
        plan.namespace = self.namespace
        plan._set_request(replace(self._request, problem=problem))
        return plan

    def compile_buckets(self, bounds: Sequence[int] = M_BUCKETS, *, verbose: bool = False) -> BucketedOp:
        """One op with a kernel per bucket of M (``bucket_plans``), chosen per call by A's rows; the kernels are
        built in one parallel run (cached). ``op.path(A, B)`` names the kernel a call takes."""
        from .runtime import BucketedOp, compile_many

        bounded = [(bound, op_key(plan)) for bound, plan in self.bucket_plans(bounds)]
        keys = list(dict.fromkeys(key for _, key in bounded))
        ops = compile_many([config for config, _ in keys], namespace=self.namespace, verbose=verbose,
                           problems=[problem for _, problem in keys], plan_gradient=plan_gradient())
        return BucketedOp.from_built(bounded, dict(zip(keys, ops)))

    def emit(self, out: str | os.PathLike[str], name: str | None = None, *, op_name: str | None = None,
             autograd: bool = True, tuning: str | os.PathLike[str] | None = None) -> Path:
        """Write a pip-installable package with this plan's op into the folder ``out`` (see generator.emit).

        ``name`` (the package and torch.ops namespace) defaults to the folder's name; ``op_name`` to
        ``gemm_<dtype>_<layout>``; ``autograd=False`` leaves out the backward kernels (the op is then not
        differentiable); ``tuning``: a tuning table file whose winners for this plan's request the package embeds
        (docs/tuning.md). Needs neither torch nor a GPU.
        """
        from .emit import default_package_name, emit

        name = default_package_name(out) if name is None else name
        return emit(self, name=name, out=out, op_names=[op_name], autograd=autograd, tuning=tuning)
