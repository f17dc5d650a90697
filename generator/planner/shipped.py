"""The shipped configs: every kernel the planner picks for the benchmark shapes, per architecture.

These are the kernels CI compiles with nvcc (ptxas must report no spills) and the ones a user gets
without overriding a knob for the shapes the project measures. The list is a pure function of the
planner and ``benchmarks/shapes.json``; it needs neither torch nor a GPU. At arch 90 that is the sm90
family; ``family="sm80"`` gives the sm80 kernels planned for arch 90 (what ``Gemm(..., family="sm80")``
builds there).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ..spec.config import KernelConfig
from ..spec.types import INPUT_DTYPES, LAYOUTS, parse_layout
from . import Problem, plan

#: Architectures whose shipped configs CI compiles: sm_80 and sm_90a.
SHIPPED_ARCHS = (80, 90)
#: The shape lists of shapes.json that the shipped configs cover.
SHAPE_GROUPS = ("square", "llm", "ragged")


def shapes_path() -> Path:
    return Path(__file__).resolve().parents[2] / "benchmarks" / "shapes.json"


@lru_cache(maxsize=1)
def benchmark_shapes() -> tuple[tuple[int, int, int], ...]:
    """Every [M, N, K] of the shape groups, in file order, without repeats."""
    data = json.loads(shapes_path().read_text())
    shapes: dict[tuple[int, int, int], None] = {}
    for group in SHAPE_GROUPS:
        for m, n, k in data[group]:
            shapes[(int(m), int(n), int(k))] = None
    return tuple(shapes)


def shipped_configs(arch: int, family: str | None = None) -> list[KernelConfig]:
    """The planner's choices for each benchmark shape and for no hint, for fp16 and bf16 inputs
    (output dtype = input dtype) and all four layouts; deduplicated, sorted by kernel name.
    ``family`` None: the architecture's default family."""
    problems: list[Problem | None] = [None] + [Problem(m, n, k) for m, n, k in benchmark_shapes()]
    found: dict[str, KernelConfig] = {}
    for dtype in INPUT_DTYPES:
        for layout in LAYOUTS:
            for problem in problems:
                cfg = plan(dtype, parse_layout(layout), arch, family=family, problem=problem)
                found[cfg.name] = cfg
    return [found[name] for name in sorted(found)]
