"""What a tuning run gives back (``TuneResult``: every candidate's row, the winner, the gain) and what a plan holds
of it (``TunedChoice``). Pure data: no torch."""
from __future__ import annotations

from dataclasses import dataclass

from ..planner import Problem
from ..spec.config import KernelConfig
from .cache import Entry
from .device import DeviceKey


@dataclass(frozen=True)
class TunedChoice:
    """A measured winner as a plan uses it: the config rebuilt on the plan's request, and its record."""

    config: KernelConfig
    entry: Entry
    device: DeviceKey
    source: str = ""    # a shipped dispatch table's label ("the H100 table"); "" for the user's tuning cache

    def line(self) -> str:
        """One line for print(plan): the winner, its time and the estimate's pick's, where and when."""
        e = self.entry
        pick = "the estimate's pick" if e.kernel != e.estimate_kernel else "the estimate's pick itself"
        if self.source:
            k = e.key
            return (f"{e.kernel}, from {self.source} (measured at {k.m}x{k.n}x{k.k}: {e.ms:.4g} ms vs "
                    f"{e.estimate_ms:.4g} ms for {pick}, {100 * e.gain:+.1f} %, {e.date[:10]})")
        return (f"{e.kernel}, {e.ms:.4g} ms vs {e.estimate_ms:.4g} ms for {pick} ({100 * e.gain:+.1f} %), measured on "
                f"{self.device.gpu} {e.date[:10]} ({e.candidates} candidates)")


@dataclass(frozen=True)
class Candidate:
    """One row of a tuning run: a config, its median time (None: not timed) and why not, or what was wrong."""

    config: KernelConfig
    ms: float | None
    error: float | None = None      # ||D - reference|| / ||reference||
    note: str = ""


@dataclass(frozen=True)
class TuneResult:
    """What ``tune`` found: the winner, every candidate's row, the gain over the estimate's pick."""

    winner: KernelConfig
    pick: KernelConfig
    problem: Problem
    ms: float
    pick_ms: float
    table: tuple[Candidate, ...]
    from_cache: bool
    seconds: float
    device: DeviceKey
    entry: Entry
    notes: tuple[str, ...] = ()

    @property
    def gain(self) -> float:
        """The winner's speed-up over the estimate's pick, minus 1."""
        return self.pick_ms / self.ms - 1.0

    @property
    def choice(self) -> TunedChoice:
        return TunedChoice(self.winner, self.entry, self.device)

    def tflops(self, ms: float) -> float:
        p = self.problem
        return 2.0 * p.m * p.n * p.k * p.batch / (ms * 1e-3) / 1e12

    def format(self) -> str:
        """The table a person reads: each candidate's time, TFLOP/s and speed against the estimate's pick."""
        p = self.problem
        shape = f"{p.m}x{p.n}x{p.k}" + (f" x{p.batch}" if p.batch > 1 else "")
        head = (f"{shape} {self.pick.dtype_tag} {self.pick.layout.tag} on {self.device.gpu}: "
                + (f"from the tuning cache ({self.seconds:.2f} s; measured {self.entry.date}, "
                   f"{self.entry.candidates} candidates)" if self.from_cache else
                   f"{len(self.table)} candidates in {self.seconds:.1f} s"))
        width = max([len(c.config.name) for c in self.table] + [len(self.winner.name), 9])
        lines = [head, f"    {'candidate':{width}}  {'ms':>9}  {'TFLOP/s':>8}  {'vs pick':>7}"]
        timed = sorted((c for c in self.table if c.ms is not None), key=lambda c: c.ms)
        for c in timed + [c for c in self.table if c.ms is None]:
            mark = "*" if c.config.name == self.winner.name else " "
            ms = f"{c.ms:9.4f}" if c.ms is not None else f"{'-':>9}"
            rate = f"{self.tflops(c.ms):8.1f}" if c.ms is not None else f"{'-':>8}"
            vs = f"{self.pick_ms / c.ms:7.3f}" if c.ms is not None else f"{'-':>7}"
            notes = [n for n in ("estimate's pick" if c.config.name == self.pick.name else "", c.note) if n]
            lines.append(f"  {mark} {c.config.name:{width}}  {ms}  {rate}  {vs}" + (f"  ({'; '.join(notes)})"
                                                                                   if notes else ""))
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(f"winner: {self.winner.name}, {self.ms:.4f} ms ({self.tflops(self.ms):.1f} TFLOP/s), "
                     f"{self.pick_ms / self.ms:.3f}x the estimate's pick ({100 * self.gain:+.1f} %)")
        return "\n".join(lines)
