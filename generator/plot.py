"""Plots of benchmark results: ``python -m generator plot RESULTS.json --out FILE.png``.

Reads the JSON that ``benchmarks/bench.py`` or ``benchmarks/inductor_compare.py`` wrote and draws, per
shape, our TFLOP/s next to cuBLAS, Triton and Inductor (whichever the file measured) with the ratios
beneath, and a roofline: TFLOP/s against arithmetic intensity, under the HBM bandwidth and the tensor
cores' peak. A ``benchmarks/bench_corpus.py`` file ("benchmark": "corpus") is drawn as bands instead:
ours / cuBLAS against the token count, one panel per pass (fwd, dX, dW), one line per layer kind. Needs
matplotlib (``pip install -e ".[plot]"``) but neither torch nor a GPU, so results copied off the GPU
machine (which has no network to install matplotlib) are drawn anywhere.

This is a tool downstream of the benchmarks: nothing in the package imports it but the command line.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Hashable, Mapping, Sequence, TypeVar

INSTALL_HINT = 'pip install -e ".[plot]"'
KINDS = ("both", "bars", "roofline", "bands")
#: The kinds each file draws: bench.py's per-shape rows, and bench_corpus.py's rows ("bands"; "both" its default).
SHAPE_KINDS = ("both", "bars", "roofline")
CORPUS_KINDS = ("both", "bands")
#: A corpus row's passes, in panel order: the forward GEMM and the backward's grad-input and grad-weight GEMMs.
PASSES = ("fwd", "dX", "dW")
#: Where ours / cuBLAS should stay at or above: the dashed line of the bands.
TARGET_FLOOR = 0.92
LAYER_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")

#: A row's TFLOP/s columns and the name each is drawn under, in drawing order (ours first).
SERIES_COLUMNS = {
    "ours_tflops": "ours",
    "cublas_tflops": "cuBLAS",
    "triton_tflops": "Triton",
    "triton_mma_sync_tflops": "Triton mma.sync",
    "inductor_tflops": "Inductor",
}
COLOURS = {"ours": "#1f77b4", "cuBLAS": "#7f7f7f", "Triton": "#ff7f0e", "Triton mma.sync": "#bcbd22",
           "Inductor": "#2ca02c"}
RATIO_MARKERS = {"cuBLAS": "o", "Triton": "s", "Triton mma.sync": "D", "Inductor": "^"}
RATIO_TICKS = (0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.05, 1.1, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0)
#: The roofline shows ours and the vendor library only: more series hide the points under each other.
ROOFLINE_SERIES = ("ours", "cuBLAS")

#: Bytes per element of A and B, and of D where it differs (fp8 writes bf16, int8 int32, tf32 reads fp32).
INPUT_BYTES = {"fp16": 2, "bf16": 2, "tf32": 4, "fp32": 4, "e4m3": 1, "e5m2": 1, "int8": 1, "fp64": 8}
OUTPUT_BYTES = {"e4m3": 2, "e5m2": 2, "int8": 4}


@dataclass(frozen=True)
class Ceilings:
    """What bounds a GEMM on one GPU: HBM bandwidth (TB/s) and dense tensor-core peak (TFLOP/s) per dtype."""

    device: str            # matched as a substring of the results' device name
    hbm_tbps: float
    hbm_source: str        # how the bandwidth was obtained, shown in its label
    peak_tflops: Mapping[str, float]


# Dense (no 2:4 sparsity) tensor-core peaks of the H100 SXM5 datasheet; the H200 has the same SMs and clocks.
HOPPER_SXM_PEAKS = MappingProxyType({"fp16": 989.4, "bf16": 989.4, "tf32": 494.7, "e4m3": 1978.9, "e5m2": 1978.9,
                                     "int8": 1978.9, "fp64": 66.9})
DEVICE_CEILINGS = (
    # The H100's device-to-device copy: ../shared/bench/h100_anchors_features.json, "bw.copy_GBps" = 3003.7
    # (datasheet 3.35 TB/s). Copying is the most a kernel that reads A and B and writes D can stream.
    Ceilings("H100", 3.0037, "measured copy", HOPPER_SXM_PEAKS),
    # No copy was measured on the lent H200: its datasheet HBM3e bandwidth.
    Ceilings("H200", 4.8, "datasheet", HOPPER_SXM_PEAKS),
)


def ceilings_for(device: str) -> Ceilings | None:
    return next((c for c in DEVICE_CEILINGS if c.device.lower() in device.lower()), None)


@dataclass(frozen=True)
class Point:
    """One row of a results file: a problem and the TFLOP/s each implementation reached on it."""

    m: int
    n: int
    k: int
    dtype: str
    tflops: Mapping[str, float] = field(default_factory=dict)   # series name -> TFLOP/s; only those measured
    batch: int = 1

    def label(self, with_dtype: bool = False) -> str:
        shape = f"{self.m}x{self.n}x{self.k}"
        shape = shape if self.batch == 1 else f"{self.batch}x[{shape}]"
        return f"{shape} {self.dtype}" if with_dtype else shape

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def bytes(self) -> float:
        """A and B read once and D written once: the least traffic to HBM the problem needs."""
        size_in = INPUT_BYTES[self.dtype]
        size_out = OUTPUT_BYTES.get(self.dtype, size_in)
        return self.batch * ((self.m * self.k + self.k * self.n) * size_in + self.m * self.n * size_out)

    @property
    def intensity(self) -> float:
        """FLOP per byte of HBM traffic (the batch cancels)."""
        return self.flops / self.bytes

    def ratio(self, baseline: str) -> float | None:
        """Ours over a baseline's TFLOP/s (its time over ours): > 1 where ours is faster."""
        if "ours" not in self.tflops or baseline not in self.tflops:
            return None
        return self.tflops["ours"] / self.tflops[baseline]


@dataclass(frozen=True)
class Results:
    """The plottable rows of one results file."""

    source: str
    device: str
    points: tuple[Point, ...]
    skipped: int = 0       # rows without a shape, a known dtype or our TFLOP/s (e.g. grouped rows)
    torch: str = ""

    @property
    def series(self) -> tuple[str, ...]:
        present = {s for p in self.points for s in p.tflops}
        return tuple(s for s in SERIES_COLUMNS.values() if s in present)

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.dtype for p in self.points))

    SKIPPED_WHY: ClassVar[str] = "without a shape, dtype or ours_tflops"

    def only(self, dtypes: Sequence[str]) -> Results:
        """The rows of the given dtypes; ValueError names the dtypes the file has."""
        _check_dtypes(self.source, self.dtypes, dtypes)
        kept = tuple(p for p in self.points if p.dtype in dtypes)
        return Results(self.source, self.device, kept, self.skipped, self.torch)


def _check_dtypes(source: str, present: Sequence[str], wanted: Sequence[str]) -> None:
    """ValueError naming the file's dtypes where a wanted one has no rows."""
    unknown = [d for d in wanted if d not in present]
    if unknown:
        raise ValueError(f"{source} has no {', '.join(unknown)} rows (its dtypes: {', '.join(present)})")


@dataclass(frozen=True)
class CorpusRow:
    """One row of a bench_corpus.py file: a model's layer GEMM in one pass at one token count."""

    model: str
    layer: str             # the layer kind (q, kv, mlp_up, ...): any string
    pass_: str             # fwd, dX or dW
    tokens: int            # M of the forward GEMM (dW's inner dimension)
    dtype: str
    ratio: float           # ours / cuBLAS (cuBLAS's time over ours): > 1 where ours is faster


@dataclass(frozen=True)
class Corpus:
    """The plottable rows of a benchmarks/bench_corpus.py file ("benchmark": "corpus")."""

    source: str
    device: str
    rows: tuple[CorpusRow, ...]
    skipped: int = 0       # rows without a known pass, a layer, tokens, a dtype or the ratio
    torch: str = ""

    SKIPPED_WHY: ClassVar[str] = f"without a pass of {', '.join(PASSES)}, a layer, tokens, a dtype or vs_cublas"

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.dtype for r in self.rows))

    @property
    def passes(self) -> tuple[str, ...]:
        return tuple(p for p in PASSES if any(r.pass_ == p for r in self.rows))

    @property
    def layers(self) -> tuple[str, ...]:
        """The layer kinds in the order the file first has them."""
        return tuple(dict.fromkeys(r.layer for r in self.rows))

    def only(self, dtypes: Sequence[str]) -> Corpus:
        """The rows of the given dtypes; ValueError names the dtypes the file has."""
        _check_dtypes(self.source, self.dtypes, dtypes)
        kept = tuple(r for r in self.rows if r.dtype in dtypes)
        return Corpus(self.source, self.device, kept, self.skipped, self.torch)


# -- reading ----------------------------------------------------------------------------------------

def _number(value: Any) -> float | None:
    """A finite positive measurement, or None (a column the run left out is null or absent)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _count(value: Any) -> int | None:
    """A positive int (not a bool), or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _shape(row: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """bench.py's m, n, k or inductor_compare.py's "shape": [m, n, k]."""
    dims = [row.get(key) for key in ("m", "n", "k")]
    if any(d is None for d in dims):
        dims = row.get("shape")
    if not isinstance(dims, (list, tuple)) or len(dims) != 3:
        return None
    if not all(_count(d) is not None for d in dims):
        return None
    return dims[0], dims[1], dims[2]


def parse_point(row: Any) -> Point | None:
    """A row as a Point, or None where it lacks a shape, a dtype this module knows or our TFLOP/s."""
    if not isinstance(row, Mapping):
        return None
    shape, dtype = _shape(row), row.get("dtype")
    tflops = {name: v for column, name in SERIES_COLUMNS.items() if (v := _number(row.get(column))) is not None}
    if shape is None or dtype not in INPUT_BYTES or "ours" not in tflops:
        return None
    return Point(*shape, dtype=dtype, tflops=tflops, batch=_count(row.get("batch")) or 1)


def parse_results(data: Any, source: str = "results") -> Results:
    """Results from the decoded JSON of bench.py or inductor_compare.py: {"device", "torch", "rows": [...]}."""
    rows = data.get("rows") if isinstance(data, Mapping) else None
    if not isinstance(rows, list):
        raise ValueError(f"{source}: not a benchmark result (expected a JSON object with a \"rows\" list, as "
                         "benchmarks/bench.py --json and benchmarks/inductor_compare.py --json write)")
    points = tuple(p for p in map(parse_point, rows) if p is not None)
    if not points:
        raise ValueError(f"{source}: none of its {len(rows)} rows has m, n, k (or shape), a dtype of "
                         f"{', '.join(INPUT_BYTES)} and ours_tflops: nothing to plot")
    device = data.get("device")
    return Results(source, device if isinstance(device, str) else "unknown GPU", points,
                   skipped=len(rows) - len(points), torch=str(data.get("torch") or ""))


def is_corpus(data: Any) -> bool:
    """Whether decoded JSON is bench_corpus.py's: its top-level "benchmark" is "corpus"."""
    return isinstance(data, Mapping) and data.get("benchmark") == "corpus"


def _corpus_ratio(row: Mapping[str, Any]) -> float | None:
    """vs_cublas, or cuBLAS's time over ours where the row has the times but not the ratio."""
    ratio = _number(row.get("vs_cublas"))
    if ratio is None and (ours := _number(row.get("ours_ms"))) and (cublas := _number(row.get("cublas_ms"))):
        ratio = cublas / ours
    return ratio


def parse_corpus_row(row: Any) -> CorpusRow | None:
    """A corpus row, or None where it lacks a known pass, a layer, tokens, a dtype or the ratio."""
    if not isinstance(row, Mapping):
        return None
    layer, dtype, model = row.get("layer"), row.get("dtype"), row.get("model")
    tokens, ratio = _count(row.get("tokens")), _corpus_ratio(row)
    known = row.get("pass") in PASSES and isinstance(layer, str) and layer != "" and isinstance(dtype, str)
    if not known or tokens is None or ratio is None:
        return None
    return CorpusRow(model if isinstance(model, str) else "", layer, row["pass"], tokens, dtype, ratio)


def parse_corpus(data: Mapping[str, Any], source: str = "results") -> Corpus:
    """A Corpus from the decoded JSON of bench_corpus.py: {"benchmark": "corpus", "device", "torch", "rows"}."""
    rows = data.get("rows")
    if not isinstance(rows, list):
        raise ValueError(f"{source}: a corpus file (\"benchmark\": \"corpus\") without a \"rows\" list")
    parsed = tuple(r for r in map(parse_corpus_row, rows) if r is not None)
    if not parsed:
        raise ValueError(f"{source}: none of its {len(rows)} corpus rows has a pass of {', '.join(PASSES)}, a layer, "
                         "tokens, a dtype and vs_cublas: nothing to plot")
    device = data.get("device")
    return Corpus(source, device if isinstance(device, str) else "unknown GPU", parsed,
                  skipped=len(rows) - len(parsed), torch=str(data.get("torch") or ""))


def load_results(path: str | Path) -> Results | Corpus:
    """Read a results file, a Corpus where it is bench_corpus.py's; ValueError (with the path and why) where it is
    missing or not one."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    return parse_corpus(data, str(path)) if is_corpus(data) else parse_results(data, str(path))


# -- drawing ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlotOptions:
    kind: str = "both"               # both, bars or roofline; both or bands for a corpus file
    title: str | None = None         # default: the device, the file's name and torch
    dpi: int = 100


@dataclass(frozen=True)
class Drawn:
    """What was drawn, for the caller to report and the tests to check."""

    out: Path
    shapes: tuple[str, ...]                                    # the bars' labels, left to right
    series: tuple[str, ...]                                    # the bars' series
    roofline: Mapping[str, tuple[tuple[float, float], ...]]    # series -> (FLOP/B, TFLOP/s) points
    ceilings: Ceilings | None


@dataclass(frozen=True)
class DrawnBands:
    """What a corpus plot drew: per pass, the layer kinds' lines and the line over every row."""

    out: Path
    passes: tuple[str, ...]                                         # the panels, left to right
    layers: tuple[str, ...]                                         # the layer kinds, in legend order
    lines: Mapping[tuple[str, str], tuple[tuple[int, float], ...]]  # (pass, layer) -> (tokens, geomean)
    overall: Mapping[str, tuple[tuple[int, float, float], ...]]     # pass -> (tokens, geomean, min) of every row


def _figure_class():
    """matplotlib's Figure, imported only here: a Figure saves itself through the Agg canvas without pyplot,
    so no global backend is set (the GPU machine and CI have no display)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise RuntimeError(f"plotting needs matplotlib, which is not installed: {INSTALL_HINT} "
                           "(or pip install matplotlib)") from None
    return Figure


def _default_title(results: Results | Corpus) -> str:
    torch = f", torch {results.torch}" if results.torch else ""
    return f"{results.device}: {Path(results.source).name}{torch}"


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _ratio_ticks(low: float, high: float, count: int = 7) -> list[float]:
    """Round ratios within [low, high] for a log axis, 1 always, outward from 1 no closer than 1/count of the
    range (a log axis over 0.7-4 has no room for 0.9, 1.1 and 1.25 side by side)."""
    gap = math.log(high / low) / count
    ticks = [1.0]
    for side in (sorted(t for t in RATIO_TICKS if 1 < t <= high), sorted((t for t in RATIO_TICKS if low <= t < 1),
                                                                         reverse=True)):
        last = 1.0
        for t in side:
            if abs(math.log(t / last)) >= gap:
                ticks.append(t)
                last = t
    return sorted(ticks)


def _draw_tflops(ax, results: Results) -> None:
    """Grouped bars: one group per shape, one bar per series that measured it."""
    series = results.series
    width = 0.8 / len(series)
    for j, name in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(results.points))]
        ax.bar(xs, [p.tflops.get(name, 0.0) for p in results.points], width, label=name, color=COLOURS[name])
    ax.set_ylabel("TFLOP/s")
    # head room for the legend above the tallest bar
    ax.set_ylim(0, 1.15 * max(max(p.tflops.values()) for p in results.points))
    ax.legend(loc="upper left", ncols=len(series), fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _draw_ratios(ax, results: Results) -> None:
    """Ours over each baseline per shape, on a log axis: 2x faster sits as far above 1 as 2x slower below,
    and a far baseline (Triton at small M) squeezes the band near 1 less than on a linear one."""
    every_ratio = [1.0]
    for name in results.series[1:]:
        pairs = [(i, r) for i, p in enumerate(results.points) if (r := p.ratio(name)) is not None]
        if pairs:
            xs, ratios = zip(*pairs)
            every_ratio += ratios
            ax.plot(xs, ratios, linestyle="none", marker=RATIO_MARKERS[name], markersize=4, color=COLOURS[name],
                    label=f"ours / {name} (geomean {_geomean(ratios):.3f})")
    ax.axhline(1.0, color="black", linewidth=0.8)
    low, high = min(every_ratio) / 1.06, max(every_ratio) * 1.06
    ax.set_yscale("log")
    ax.set_ylim(low, high * (high / low) ** 0.5)   # the top half-decade-ish left for the legend
    ticks = _ratio_ticks(low, high)
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_ylabel("ours / baseline\n(> 1: ours faster)", fontsize=8)
    ax.legend(loc="upper left", fontsize=7, ncols=3)
    ax.grid(axis="y", alpha=0.3)


def _draw_bars(ax_tflops, ax_ratio, results: Results) -> tuple[str, ...]:
    """TFLOP/s per shape above, ratios beneath, the shapes labelled on the lower axis; returns the labels."""
    _draw_tflops(ax_tflops, results)
    _draw_ratios(ax_ratio, results)
    labels = tuple(p.label(with_dtype=len(results.dtypes) > 1) for p in results.points)
    few = len(labels) <= 6   # few labels fit side by side (the dtype beneath the shape); many only upright
    ticks = [label.replace(" ", "\n") for label in labels] if few else labels
    ax_ratio.set_xticks(range(len(labels)), ticks, rotation=0 if few else 90, fontsize=8 if few else 7)
    ax_ratio.set_xlim(-0.6, len(labels) - 0.4)
    return labels


def _draw_ceilings(ax, results: Results, ceilings: Ceilings, x_range: tuple[float, float]) -> None:
    """The roof: HBM bandwidth times intensity up to the ridge, then the tensor cores' peak, per dtype."""
    lo, hi = x_range
    peaks: dict[float, list[str]] = {}
    for dtype in results.dtypes:
        if dtype in ceilings.peak_tflops:
            peaks.setdefault(ceilings.peak_tflops[dtype], []).append(dtype)
    bw = ceilings.hbm_tbps  # TB/s x FLOP/B = TFLOP/s
    for peak, dtypes in sorted(peaks.items()):
        ridge = peak / bw
        ax.plot([lo, ridge, hi], [bw * lo, peak, peak], color="black", linewidth=1.2)
        ax.axvline(ridge, color="black", linestyle=":", linewidth=0.8)
        ax.text(hi, peak * 1.06, f"{'/'.join(dtypes)} tensor-core peak {peak:.0f} TFLOP/s (dense, datasheet)",
                ha="right", va="bottom", fontsize=8)
        ax.text(ridge * 1.08, 0.03, f"ridge {ridge:.0f} FLOP/B", fontsize=7, rotation=90, va="bottom",
                transform=ax.get_xaxis_transform())
    # Above and left of a point on the rising slope: the line stays below and right of the text.
    x = min(peaks) / bw * 0.7
    ax.annotate(f"HBM {bw:.1f} TB/s\n({ceilings.hbm_source})", xy=(x, bw * x), xytext=(-4, 4),
                textcoords="offset points", ha="right", va="bottom", fontsize=8)


def _peaks(results: Results, ceilings: Ceilings | None) -> list[float]:
    """The tensor-core peaks of the file's dtypes that the GPU's ceilings know."""
    if ceilings is None:
        return []
    return [ceilings.peak_tflops[d] for d in results.dtypes if d in ceilings.peak_tflops]


def _draw_roofline(ax, results: Results, ceilings: Ceilings | None) -> dict[str, tuple[tuple[float, float], ...]]:
    drawn: dict[str, tuple[tuple[float, float], ...]] = {}
    for name in ROOFLINE_SERIES:
        pts = tuple((p.intensity, p.tflops[name]) for p in results.points if name in p.tflops)
        if pts:
            xs, ys = zip(*pts)
            ax.scatter(xs, ys, s=22 if name == "ours" else 30, label=name, marker="o" if name == "ours" else "x",
                       color=COLOURS[name], linewidths=1, zorder=3)
            drawn[name] = pts
    intensities = [p.intensity for p in results.points]
    peaks = _peaks(results, ceilings)
    # widen to the ridge so the bend of the roof shows even where every point is on one side of it
    ridges = [peak / ceilings.hbm_tbps for peak in peaks] if ceilings is not None else []
    x_range = (min([min(intensities) / 2, *(r / 4 for r in ridges)]),
               max([max(intensities) * 2, *(r * 4 for r in ridges)]))
    if ceilings is not None and peaks:
        _draw_ceilings(ax, results, ceilings, x_range)
    else:
        ax.text(0.02, 0.98, f"no ceilings known for {results.device}", transform=ax.transAxes, va="top", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*x_range)
    ys = [y for pts in drawn.values() for _, y in pts]
    ax.set_ylim(min(ys) / 3, max(ys + peaks) * 2)
    ax.set_xlabel("arithmetic intensity, FLOP / byte (A + B + D once)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(which="both", alpha=0.2)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("roofline", fontsize=10)
    return drawn


def _bars_width(results: Results) -> float:
    """Inches for the bars: enough for one rotated label per shape."""
    return min(24.0, max(6.0, 1.5 + 0.12 * len(results.points) * max(2, len(results.series))))


def check_kind(results: Results | Corpus, kind: str) -> None:
    """ValueError where the file cannot be drawn as kind: bands only for a corpus file, bars and roofline only
    for a per-shape one."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not one of {', '.join(KINDS)}")
    if isinstance(results, Corpus) and kind not in CORPUS_KINDS:
        raise ValueError(f"{results.source} is a corpus file (benchmarks/bench_corpus.py), drawn as ours / cuBLAS "
                         f"against tokens: --kind {kind} draws per-shape files (bench.py); use --kind bands or both")
    if isinstance(results, Results) and kind not in SHAPE_KINDS:
        raise ValueError(f"--kind {kind} draws a corpus file (benchmarks/bench_corpus.py); {results.source} is a "
                         f"per-shape file: use --kind {', '.join(SHAPE_KINDS[1:])} or {SHAPE_KINDS[0]}")


def plot(results: Results | Corpus, out: str | Path, options: PlotOptions = PlotOptions()) -> Drawn | DrawnBands:
    """Draw the results into out (the format from its suffix: .png, .svg, .pdf): a corpus file as bands, any
    other as bars and a roofline."""
    check_kind(results, options.kind)
    if isinstance(results, Corpus):
        return plot_bands(results, out, options)
    Figure = _figure_class()
    bars, roof = options.kind in ("both", "bars"), options.kind in ("both", "roofline")
    bars_w, roof_w = (_bars_width(results) if bars else 0.0), (6.5 if roof else 0.0)
    fig = Figure(figsize=(bars_w + roof_w, 6.5 if bars else 5.5), layout="constrained")
    columns = [w for w in (bars_w, roof_w) if w]
    grid = fig.add_gridspec(2, len(columns), height_ratios=(3, 1.6), width_ratios=columns)
    shapes: tuple[str, ...] = ()
    roofline: dict[str, tuple[tuple[float, float], ...]] = {}
    ceilings = ceilings_for(results.device)
    if bars:
        ax_tflops = fig.add_subplot(grid[0, 0])
        ax_ratio = fig.add_subplot(grid[1, 0], sharex=ax_tflops)
        ax_tflops.tick_params(labelbottom=False)
        shapes = _draw_bars(ax_tflops, ax_ratio, results)
    if roof:
        roofline = _draw_roofline(fig.add_subplot(grid[:, len(columns) - 1]), results, ceilings)
    fig.suptitle(options.title or _default_title(results), fontsize=11)
    out = Path(out)
    fig.savefig(out, dpi=options.dpi)
    return Drawn(out, shapes, results.series if bars else (), roofline, ceilings if roof else None)


# -- a corpus: ours / cuBLAS against tokens -----------------------------------------------------------

K = TypeVar("K", bound=Hashable)


def _grouped(rows: Sequence[CorpusRow], key: Callable[[CorpusRow], K]) -> dict[K, list[float]]:
    groups: dict[K, list[float]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row.ratio)
    return groups


def layer_geomeans(corpus: Corpus) -> dict[tuple[str, str, int], float]:
    """(pass, layer, tokens) -> the geomean of ours / cuBLAS over the rows there (the models and dtypes)."""
    groups = _grouped(corpus.rows, lambda r: (r.pass_, r.layer, r.tokens))
    return {key: _geomean(ratios) for key, ratios in groups.items()}


def pass_spread(corpus: Corpus) -> dict[tuple[str, int], tuple[float, float]]:
    """(pass, tokens) -> (geomean, min) of ours / cuBLAS over every row there."""
    groups = _grouped(corpus.rows, lambda r: (r.pass_, r.tokens))
    return {key: (_geomean(ratios), min(ratios)) for key, ratios in groups.items()}


def _draw_pass(ax, corpus: Corpus, pass_: str, geomeans: Mapping[tuple[str, str, int], float],
               overall: Sequence[tuple[int, float, float]]) -> dict[str, tuple[tuple[int, float], ...]]:
    """One panel: a line per layer kind, the geomean of every row thick and black over a band down to the min."""
    lines: dict[str, tuple[tuple[int, float], ...]] = {}
    for i, layer in enumerate(corpus.layers):
        pts = tuple(sorted((t, g) for (p, l, t), g in geomeans.items() if p == pass_ and l == layer))
        if pts:
            ax.plot(*zip(*pts), color=f"C{i % 10}", marker=LAYER_MARKERS[i % len(LAYER_MARKERS)], markersize=3,
                    linewidth=1, label=layer)
            lines[layer] = pts
    tokens, means, lows = zip(*overall)
    ax.fill_between(tokens, lows, means, color="black", alpha=0.12, linewidth=0, label="min .. geomean, every row")
    ax.plot(tokens, lows, color="black", linestyle="none", marker="v", markersize=4, label="min, every row")
    ax.plot(tokens, means, color="black", linewidth=2.5, label="geomean, every row", zorder=4)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(TARGET_FLOOR, color="tab:red", linestyle="--", linewidth=1, label=f"target floor {TARGET_FLOOR:g}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(tokens, [str(t) for t in tokens], rotation=0 if len(tokens) <= 8 else 45, fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("tokens (M of the forward GEMM)")
    rows = sum(r.pass_ == pass_ for r in corpus.rows)
    ax.set_title(f"{pass_}: {rows} row(s)", fontsize=10)
    ax.grid(which="major", alpha=0.3)
    return lines


def _ratio_axis(ax, values: Sequence[float]) -> None:
    """The shared y axis: ours / cuBLAS on a log scale, 1 and the target floor always in range."""
    low, high = min(*values, TARGET_FLOOR) / 1.06, max(*values, 1.0) * 1.06
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    ticks = _ratio_ticks(low, high)
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_ylabel("ours / cuBLAS (> 1: ours faster)")


def plot_bands(corpus: Corpus, out: str | Path, options: PlotOptions = PlotOptions()) -> DrawnBands:
    """A corpus file: one panel per pass, ours / cuBLAS against tokens per layer kind and over every row."""
    Figure = _figure_class()
    passes, geomeans, spread = corpus.passes, layer_geomeans(corpus), pass_spread(corpus)
    overall = {p: tuple(sorted((t, g, m) for (q, t), (g, m) in spread.items() if q == p)) for p in passes}
    fig = Figure(figsize=(1.5 + 4.5 * len(passes), 5.0), layout="constrained")
    axes = fig.subplots(1, len(passes), sharey=True, squeeze=False)[0]
    lines: dict[tuple[str, str], tuple[tuple[int, float], ...]] = {}
    for ax, pass_ in zip(axes, passes):
        drawn = _draw_pass(ax, corpus, pass_, geomeans, overall[pass_])
        lines.update({(pass_, layer): pts for layer, pts in drawn.items()})
    _ratio_axis(axes[0], [*geomeans.values(), *(low for _, low in spread.values())])   # shared by every panel
    handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="outside right upper", fontsize=8)
    fig.suptitle(options.title or _default_title(corpus), fontsize=11)
    out = Path(out)
    fig.savefig(out, dpi=options.dpi)
    return DrawnBands(out, passes, corpus.layers, lines, overall)


def default_out(source: str | Path, kind: str = "both") -> Path:
    """<results name>.png in the current folder (_bars / _roofline where only one is drawn)."""
    stem = Path(source).stem
    return Path(f"{stem}.png" if kind == "both" else f"{stem}_{kind}.png")
