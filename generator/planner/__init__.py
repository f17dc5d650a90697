"""The planner: enumerate the legal configs for an architecture, dtype and layout, estimate each one's
time with a small analytic model, keep the cheapest. Every choice is explainable in one line.

``choose`` resolves the kernel family (sm90 at arch 90, sm80 below it, unless the user fixes it) and
hands the request to that family's module (``sm80``, ``sm90``); ``common`` holds what they share.
``backward`` derives the backward pass's kernels from a forward config; ``shipped`` lists the kernels
the planner picks for the benchmark shapes. Pure Python: no torch, no GPU, no files written.
"""
from __future__ import annotations

from dataclasses import replace

from ..spec.arch import ArchSpec, arch_spec
from ..spec.config import KernelConfig, check_config
from ..spec.epilogue import IDENTITY, Epilogue
from ..spec.types import DType, Layout
from . import sm80, sm90
from .common import DEFAULT_PROBLEM, Estimate, Knobs, Problem, check_family, resolve_family
from .sm80 import choose_sm80
from .sm90 import choose_sm90

__all__ = ["DEFAULT_PROBLEM", "Estimate", "Knobs", "Problem", "check_family", "choose", "estimate", "plan", "ranked"]


def choose(dtype: DType, out_dtype: DType, layout: Layout, spec: ArchSpec, *, knobs: Knobs = Knobs(),
           problem: Problem | None = None, sm_count: int | None = None,
           epilogue: Epilogue = IDENTITY, dtype_b: DType | None = None) -> tuple[Estimate, list[str]]:
    """The cheapest legal config, and one line per candidate that was filtered out.

    With every knob of a candidate fixed by the user, an illegal combination raises ValueError
    (check_config's sentence); otherwise illegal candidates are dropped with their reason.
    ``problem`` None plans for a large square problem (the user gave no size hints). ``epilogue``: the fused
    epilogue, its dtypes resolved (``Epilogue.resolved(out_dtype)``). ``dtype_b``: B's type where it differs from
    A's (fp8 e4m3 x e5m2).
    """
    sm_count = sm_count or spec.sm_count
    family_choose = choose_sm90 if resolve_family(knobs, spec) == "sm90" else choose_sm80
    best, rejected = family_choose(dtype, out_dtype, layout, spec, knobs=knobs, problem=problem, sm_count=sm_count,
                                   epilogue=epilogue, dtype_b=dtype_b)
    if knobs.amax:
        best = replace(best, config=with_amax(best.config), reason=f"{best.reason}; and the amax of D",
                       model=best.model and with_amax(best.model))
    return best, rejected


def with_amax(cfg: KernelConfig) -> KernelConfig:
    """``cfg`` also recording the amax of its quantized D (KernelConfig.amax; check_config says why it cannot)."""
    cfg = replace(cfg, amax=True)
    check_config(cfg)
    return cfg


def plan(dtype: DType, layout: Layout, arch: int, *, family: str | None = None, out_dtype: DType | None = None,
         problem: Problem | None = None) -> KernelConfig:
    """The planner's config for a request with no knob fixed but the family: what ``Gemm(dtype, layout,
    arch=arch, family=family)`` plans (the backward kernels and the shipped list are planned so)."""
    spec = arch_spec(arch)
    best, _ = choose(dtype, out_dtype or dtype, layout, spec, knobs=Knobs(family=family), problem=problem,
                     sm_count=spec.sm_count)
    return best.config


def estimate(cfg: KernelConfig, spec: ArchSpec, sm_count: int, problem: Problem) -> Estimate:
    """The cost model of ``cfg``'s family for ``problem`` (what ``choose`` weighs the candidates by)."""
    family_estimate = sm90.estimate if cfg.family == "sm90" else sm80.estimate
    return family_estimate(cfg, spec, sm_count, problem)


def ranked(dtype: DType, out_dtype: DType, layout: Layout, spec: ArchSpec, *, knobs: Knobs = Knobs(),
           problem: Problem, sm_count: int | None = None, epilogue: Epilogue = IDENTITY,
           dtype_b: DType | None = None) -> list[Estimate]:
    """Every candidate that ``choose`` weighs for this request and check_config accepts, with its estimate, cheapest
    first (equal costs in the planner's order of preference). Measured tuning starts from the first few of them."""
    sm_count = sm_count or spec.sm_count
    if resolve_family(knobs, spec) == "sm90":
        configs = sm90.candidates(dtype, out_dtype, layout, spec, knobs, problem, sm_count)
    else:
        configs = sm80.candidates(dtype, out_dtype, layout, spec, knobs, problem)
    legal = []
    for cfg in (replace(c, epilogue=epilogue, dtype_b=dtype_b, amax=bool(knobs.amax)) for c in configs):
        try:
            check_config(cfg)
        except ValueError:
            continue
        legal.append(estimate(cfg, spec, sm_count, problem))
    return sorted(legal, key=lambda est: est.cost)   # sorted() is stable: ties keep the planner's order
