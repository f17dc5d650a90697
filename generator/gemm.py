"""Gemm: the user's plan. Holds the user's knobs, asks the planner for the rest, and refuses at
assignment any override the template or the hardware cannot honour (the plan stays as it was).

    plan = Gemm(dtype="bf16", layout="tn", arch=80)
    plan.stages = 3          # re-planned and checked now, not at compile time
    op = plan.compile()      # render -> build (cached) -> torch op
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .arch import ArchSpec, arch_spec, detect_arch
from .config import KernelConfig
from .planner import Estimate, Knobs, Problem, choose
from .render import render
from .types import OUTPUT_DTYPES, DType, Layout, parse_dtype, parse_layout

if TYPE_CHECKING:
    from .op import GemmOp

DEFAULT_NAMESPACE = "gemmgen"


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


class Gemm:
    """A planned GEMM, D = A @ B. See the README for layouts; every knob below may be overridden.

    Knobs: ``tile_shape`` (BM, BN, BK), ``warps`` (WM, WN), ``stages``, ``raster_group``,
    ``out_dtype``. ``arch=None`` plans for the visible GPU.
    """

    def __init__(self, dtype: object = "bf16", layout: object = "tn", *, arch: object = None,
                 out_dtype: object = None, layout_a: object = None, layout_b: object = None,
                 layout_c: object = None, m: int | None = None, n: int | None = None, k: int | None = None,
                 tile_shape: object = None, warps: object = None, stages: int | None = None,
                 raster_group: int | None = None, namespace: str = DEFAULT_NAMESPACE) -> None:
        dtype_ = parse_dtype(dtype)
        if arch is None:
            spec, sm_count = detect_arch()
        else:
            spec = arch_spec(arch)
            sm_count = spec.sm_count
        hints = [_positive_or_none(v, w) for v, w in ((m, "m"), (n, "n"), (k, "k"))]
        problem = Problem(*(h or d for h, d in zip(hints, (4096, 4096, 4096)))) if any(hints) else None
        if not isinstance(namespace, str) or not namespace.isidentifier():
            raise ValueError(f"namespace={namespace!r} must be a Python identifier, e.g. 'gemmgen'")
        self.namespace = namespace
        request = _Request(
            dtype=dtype_,
            out_dtype=parse_dtype(out_dtype, what="out_dtype", allowed=OUTPUT_DTYPES) if out_dtype else dtype_,
            layout=parse_layout(layout, layout_a=layout_a, layout_b=layout_b, layout_c=layout_c),
            spec=spec, sm_count=sm_count, problem=problem, knobs=Knobs())
        self._set_request(request)
        for knob, value in (("tile_shape", tile_shape), ("warps", warps), ("stages", stages),
                            ("raster_group", raster_group)):
            if value is not None:
                setattr(self, knob, value)

    # -- planning -------------------------------------------------------------------------------

    def _set_request(self, request: _Request) -> None:
        """Plan for ``request``; on a ValueError the plan keeps its previous state."""
        best, rejected = choose(request.dtype, request.out_dtype, request.layout, request.spec,
                                knobs=request.knobs, problem=request.problem, sm_count=request.sm_count)
        self._request, self._estimate, self._rejected = request, best, rejected

    def _with_knobs(self, **changes: object) -> None:
        self._set_request(replace(self._request, knobs=replace(self._request.knobs, **changes)))

    @property
    def config(self) -> KernelConfig:
        return self._estimate.config

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def why(self) -> str:
        return self._estimate.reason

    @property
    def estimate(self) -> Estimate:
        return self._estimate

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
        self._set_request(replace(self._request, out_dtype=parse_dtype(value, what="out_dtype", allowed=OUTPUT_DTYPES)))

    @property
    def tile_shape(self) -> tuple[int, int, int]:
        return self.config.tile

    @tile_shape.setter
    def tile_shape(self, value: object) -> None:
        self._with_knobs(tile=_int_tuple(value, 3, "tile_shape", "(128, 128, 32)"))

    @property
    def warps(self) -> tuple[int, int]:
        return self.config.warps

    @warps.setter
    def warps(self, value: object) -> None:
        self._with_knobs(warps=_int_tuple(value, 2, "warps", "(2, 2)"))

    @property
    def stages(self) -> int:
        return self.config.stages

    @stages.setter
    def stages(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"stages={value!r}: give an integer, e.g. stages=4")
        self._with_knobs(stages=value)

    @property
    def raster_group(self) -> int:
        return self.config.raster_group

    @raster_group.setter
    def raster_group(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"raster_group={value!r}: give an integer, e.g. raster_group=8")
        self._with_knobs(raster_group=value)

    # -- output -----------------------------------------------------------------------------------

    def __str__(self) -> str:
        return f"{self.config.describe()}\nwhy:          {self.why}"

    def __repr__(self) -> str:
        return f"Gemm({self.name})"

    def render(self) -> dict[str, str]:
        """The kernel's CUDA sources, {file name: text}; needs neither torch nor a GPU."""
        return render(self.config)

    def compile(self, *, verbose: bool = False) -> GemmOp:
        """Render, build (cached) and load the kernel; returns the op, also at torch.ops.<namespace>.<name>."""
        from .op import compile_op

        return compile_op(self.config, namespace=self.namespace, verbose=verbose)

    def emit(self, out: str | os.PathLike[str], name: str | None = None, *, op_name: str | None = None) -> Path:
        """Write a pip-installable package with this plan's op into the folder ``out`` (see generator.emit).

        ``name`` (the package and torch.ops namespace) defaults to the folder's name; ``op_name`` to
        ``gemm_<dtype>_<layout>``. Needs neither torch nor a GPU.
        """
        from .emit import default_package_name, emit

        return emit(self, name=default_package_name(out) if name is None else name, out=out, op_names=[op_name])
