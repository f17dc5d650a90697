"""What the planner's families share: the problem, the user's fixed knobs, the estimate, the choice of
family, and ``pick``, which keeps the cheapest legal candidate. Each family's module (``sm80``, ``sm90``)
enumerates its candidates and estimates their cost; ``generator.planner.choose`` dispatches to one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..spec.arch import ArchSpec
from ..spec.config import FAMILIES, KernelConfig, check_config, sm80_knob_sentence, sm90_knob_sentence

# Without m/n/k hints, plan for a large square problem: the case the big tiles are made for.
DEFAULT_PROBLEM = (4096, 4096, 4096)


@dataclass(frozen=True)
class Problem:
    """The size the planner plans for: ``batch`` problems of M x N x K (a batched GEMM's tiles are all its
    problems' tiles). ``ragged``: the problems are a grouped call's groups, whose rows vary around ``m`` (the expected
    rows per group, as DeepGEMM's expected_m): each group's last tile row is then about half empty."""

    m: int
    n: int
    k: int
    batch: int = 1
    ragged: bool = False


@dataclass(frozen=True)
class Estimate:
    config: KernelConfig
    cost: float           # relative time; lower is better
    reason: str           # one line: why this config costs what it costs
    # The pick before the rules layered on it moved it (planner.sm90 choose_sm90: the filling width, the ring's
    # staging), where they did: what the shipped dispatch tables' entries were measured against. None: ``config``.
    model: KernelConfig | None = None

    @property
    def model_config(self) -> KernelConfig:
        return self.config if self.model is None else self.model


@dataclass(frozen=True)
class Knobs:
    """What the user fixed; None leaves the choice to the planner."""

    tile: tuple[int, int, int] | None = None
    warps: tuple[int, int] | None = None          # sm80 only
    stages: int | None = None
    raster_group: int | None = None
    family: str | None = None                     # None: the architecture's default family
    schedule: str | None = None                   # sm90 only
    cluster: tuple[int, int] | None = None        # sm90 only
    raster: str | None = None                     # sm90 only
    fast_accum: bool | None = None                # fp8 only: True sums all of K inside wgmma (no promotion)
    amax: bool | None = None                      # a quantized D: True also returns the amax of D
    interleave_k: bool | None = None              # promoted fp8, 64-row cooperative: warpgroups on alternate k tiles


# What a fused epilogue adds to a tile's time, in units of K (a tile costs BM*BN*(K + overhead)): reading
# an M x N operand costs about what writing D costs, which the sm90 model puts at 64 k for a 16-bit D
# (planner/sm90.py OVERHEAD_K); vectors are read once per tile and cost next to nothing. An estimate: it only
# has to rank tiles, and every candidate of a plan pays it alike but for the schedule that hides it.
MATRIX_OPERAND_OVERHEAD_K_PER_BYTE = 32


def epilogue_overhead_k(cfg: KernelConfig) -> int:
    """The per-tile overhead of ``cfg``'s epilogue, in units of K (see MATRIX_OPERAND_OVERHEAD_K_PER_BYTE)."""
    ep = cfg.epilogue
    matrices = [op.dtype.bytes for op in ep.operands_of_kind("matrix")]
    if ep.aux is not None:
        matrices.append(cfg.out_dtype.bytes)
    return MATRIX_OPERAND_OVERHEAD_K_PER_BYTE * sum(matrices)


def default_family(spec: ArchSpec) -> str:
    """sm90 (TMA, wgmma) where it exists, i.e. on sm_90a, for every dtype and layout; sm80 (cp.async, mma.sync)
    everywhere else."""
    return "sm90" if spec.cc == 90 else "sm80"


def check_family(value: object) -> str | None:
    """A family knob as the user may give it: "sm80", "sm90" or None (the architecture's default)."""
    if value is not None and value not in FAMILIES:
        raise ValueError(f"family={value!r}: use 'sm80' (cp.async + mma.sync, arch 80 and newer), 'sm90' "
                         f"(TMA + wgmma, arch 90) or None (the architecture's default)")
    return value  # type: ignore[return-value]


def resolve_family(knobs: Knobs, spec: ArchSpec) -> str:
    """The family to plan, refusing a fixed knob that belongs to the other family."""
    sm90_knobs = (("schedule", knobs.schedule), ("cluster_shape", knobs.cluster), ("raster", knobs.raster))
    family = check_family(knobs.family) or default_family(spec)
    if family == "sm80":
        for knob, value in sm90_knobs:
            if value is not None:
                raise ValueError(sm90_knob_sentence(knob, spec.cc))
    elif knobs.warps is not None:
        raise ValueError(sm80_knob_sentence("warps"))
    return family


def pick(configs: Sequence[KernelConfig], estimate_fn: Callable[[KernelConfig], Estimate],
         refuse: Callable[[KernelConfig], str | None] = lambda cfg: None) -> tuple[Estimate, list[str]]:
    """The cheapest of ``configs`` that check_config (and ``refuse``, a planner-level rule) accepts; the
    first one wins a tie, so candidates come in order of preference.

    A single candidate (every knob fixed) raises its refusal as it is; when every candidate is refused
    for the same reason, that reason is raised once; otherwise all of them, one line each."""
    rejected: list[str] = []
    best: Estimate | None = None
    for cfg in configs:
        try:
            check_config(cfg)
            reason = refuse(cfg)
            if reason is not None:
                raise ValueError(reason)
        except ValueError as err:
            if len(configs) == 1:
                raise
            rejected.append(f"{cfg.name}: {err}")
            continue
        est = estimate_fn(cfg)
        if best is None or est.cost < best.cost:
            best = est
    if best is None:
        reasons = list(dict.fromkeys(line.split(": ", 1)[1] for line in rejected))
        if len(reasons) == 1:  # the same knob failed everywhere (e.g. stages=9): say it once
            raise ValueError(reasons[0])
        raise ValueError("no config is legal for these knobs:\n  " + "\n  ".join(rejected))
    return best, rejected
