"""Benchmark: grouped GEMM at real routing, the experts' layers of public mixture-of-experts models with tokens routed
uniformly, Dirichlet-skewed and Zipf-skewed, next to torch._grouped_mm and a loop of torch.mm (issue 35's table).

    python benchmarks/bench_moe.py [--models mixtral-8x7b,...] [--tokens 1,16,512,4096]
        [--routings uniform,dirichlet,zipf] [--seed 0] [--dtype bf16] [--rounds 3] [--masked] [--split-at 64,128]
        [--json $OUT/bench_moe.json]

Each model's MoE layer is (experts, top-k, hidden, intermediate), with an expert-parallel slice where the model is
served so (DeepSeek-V3: 256 experts, 32 of them on this GPU). Each token picks top-k distinct experts (``route``),
and an expert's group is the tokens that picked it, sorted by expert as a MoE layer gathers them:

    uniform     every expert equally likely (the groups differ by sampling noise only)
    dirichlet   expert popularity drawn from Dirichlet(--alpha, default 0.3): a few hot experts, several nearly idle
    zipf        popularity 1 / rank^--zipf-s (default 1.2), the ranks shuffled over the experts

Two grouped GEMMs per layer, layout tn as bench_grouped.py's (A the routed rows, B = W.transpose(1, 2)):
``up`` (the fused gate and up projections, N = 2 * intermediate, K = hidden) and ``down`` (N = hidden,
K = intermediate). Ours is op.grouped, the op planned by Gemm(dtype, "tn", m=mean rows per expert, n=N, k=K,
batch=E, ragged=True) (--uniform-plan: without ragged=True, as for equal groups); the columns and checks are
bench_grouped.py's (``measure_sizes``). The summary holds issue 35's targets: the geomean of ours /
torch._grouped_mm, the lowest row, and ours against the faster of _grouped_mm and the loop.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import (DTYPES, ORDERS, geomean, parse_candidates, parse_variants, timed_rounds, variant_of,  # noqa: E402
                   warm_up_gpu)
from bench_grouped import WRONG, Row, format_row, header, measure_sizes  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402


@dataclass(frozen=True)
class MoeLayer:
    """A model's routed experts (shared experts are dense layers: benchmarks/corpus.py has them)."""

    experts: int
    top_k: int
    hidden: int
    intermediate: int
    local_experts: int | None = None   # expert parallelism: this GPU holds experts [0, local_experts)

    @property
    def groups(self) -> int:
        return self.local_experts or self.experts

    def gemms(self) -> dict[str, tuple[int, int]]:
        """{name: (N, K)} of the layer's two grouped GEMMs."""
        return {"up": (2 * self.intermediate, self.hidden), "down": (self.hidden, self.intermediate)}


#: Public configurations (their config.json): 8 experts top-2, 60 top-4, 64 top-8, 128 top-8, 256 top-8 with 32 local.
MODELS = {
    "mixtral-8x7b": MoeLayer(experts=8, top_k=2, hidden=4096, intermediate=14336),
    "qwen1.5-moe-a2.7b": MoeLayer(experts=60, top_k=4, hidden=2048, intermediate=1408),
    "olmoe-1b-7b": MoeLayer(experts=64, top_k=8, hidden=2048, intermediate=1024),
    "qwen3-30b-a3b": MoeLayer(experts=128, top_k=8, hidden=2048, intermediate=768),
    "deepseek-v3-ep8": MoeLayer(experts=256, top_k=8, hidden=7168, intermediate=2048, local_experts=32),
}
ROUTINGS = ("uniform", "dirichlet", "zipf")


def popularity(routing: str, experts: int, generator: torch.Generator, alpha: float = 0.3,
               zipf_s: float = 1.2) -> torch.Tensor:
    """Each expert's weight in the router's choice (float64, sums to 1)."""
    if routing == "uniform":
        return torch.full((experts,), 1.0 / experts, dtype=torch.float64)
    if routing == "dirichlet":
        # Gamma(alpha) draws normalized; torch's Dirichlet takes no generator, so draw through one of its own seed.
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            weights = torch.distributions.Dirichlet(torch.full((experts,), float(alpha), dtype=torch.float64)).sample()
        return weights
    if routing == "zipf":
        ranks = torch.randperm(experts, generator=generator).to(torch.float64) + 1.0
        weights = ranks ** -zipf_s
        return weights / weights.sum()
    raise ValueError(f"routing {routing!r}: one of {', '.join(ROUTINGS)}")


def route(layer: MoeLayer, tokens: int, routing: str, seed: int = 0, alpha: float = 0.3,
          zipf_s: float = 1.2) -> list[int]:
    """The rows of each of this GPU's experts: ``tokens`` tokens each pick ``layer.top_k`` distinct experts, drawn by
    the routing's popularity (seeded by seed, routing and the layer), counted per expert; with expert parallelism only
    the local experts' groups (their total is then what reached this GPU)."""
    generator = torch.Generator().manual_seed(hash_seed(seed, routing, layer))
    weights = popularity(routing, layer.experts, generator, alpha, zipf_s)
    picks = torch.multinomial(weights.expand(tokens, -1), layer.top_k, replacement=False, generator=generator)
    counts = torch.bincount(picks.flatten(), minlength=layer.experts)
    return counts[:layer.groups].tolist()


def hash_seed(seed: int, routing: str, layer: MoeLayer) -> int:
    """A stable seed per (seed, routing, layer): Python's hash() of a string changes between processes."""
    text = f"{seed}:{routing}:{layer.experts}:{layer.top_k}:{layer.hidden}:{layer.intermediate}"
    return sum((i + 1) * ord(c) for i, c in enumerate(text)) % (2**31 - 1)


@dataclass
class MoeRow:
    model: str
    gemm: str
    tokens: int
    routing: str
    smallest: int
    largest: int
    empty: int
    row: Row
    masked_ms: float | None = None   # --masked: op.masked on slabs of max_m rows (the largest group, rounded up to 64)
    masked_rel_error: float | None = None

    @property
    def vs_best(self) -> float:
        """Ours against the faster of torch._grouped_mm and the loop (time ratio: above 1 is ours faster)."""
        return min(r for r in (self.row.vs_grouped_mm, self.row.vs_loop) if r is not None)


class SplitByRows:
    """Per-group tile shapes approximated with today's kernels: the groups of more than ``rows`` rows through
    ``large`` (an op planned for them), the others through ``small`` (one planned for theirs), two launches back to
    back where one kernel holding both tile shapes would take one (measured far slower than the one launch: the small
    groups' launch runs alone, docs/grouped.md "Tiles that end inside their group"). Duck-types op.grouped for
    measure_sizes: the first call gathers each part's rows and weights (untimed: a per-group kernel reads them in
    place) and returns the whole D for the check; the timed calls run the two launches only."""

    def __init__(self, large, small, rows: int):
        self.large, self.small, self.rows = large, small, rows
        self.parts: tuple | None = None

    def grouped(self, a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor):
        if self.parts is not None and self.parts[0] == a.data_ptr():
            for op, x, w, ends in self.parts[1:]:
                op.grouped(x, w, ends)
            return None
        sizes = torch.diff(offsets.long(), prepend=offsets.new_zeros(1).long()).tolist()
        starts = [e - s for s, e in zip(sizes, offsets.tolist())]
        d = torch.empty(a.shape[0], b.shape[2], dtype=a.dtype, device=a.device)
        parts = [a.data_ptr()]
        for op, keep in ((self.large, lambda s: s > self.rows), (self.small, lambda s: s <= self.rows)):
            groups = [g for g, s in enumerate(sizes) if keep(s)]
            rows = torch.cat([torch.arange(starts[g], starts[g] + sizes[g], device=a.device) for g in groups])
            x = a[rows]
            w = b.transpose(1, 2)[groups].transpose(1, 2)   # (E', K, N), K-major as b
            ends = torch.tensor(sizes, dtype=torch.int32)[groups].cumsum(0).to(torch.int32).to(a.device)
            d[rows] = op.grouped(x, w, ends)
            parts.append((op, x, w, ends))
        self.parts = tuple(parts)
        return d


def split_sizes(sizes: list[int], rows: int) -> tuple[list[int], list[int]] | None:
    """(the groups of more than ``rows`` rows, the others), or None where one part would have no rows."""
    large = [s for s in sizes if s > rows]
    small = [s for s in sizes if s <= rows]
    return (large, small) if large and sum(small) else None


def part_shape(sizes: list[int], n: int, k: int) -> tuple[int, int, int, int]:
    """The (E, mean rows, N, K) entry a call of these groups is planned for."""
    return (len(sizes), max(1, round(sum(sizes) / len(sizes))), n, k)


def planned(cases: list[tuple[str, str, int, str, list[int], int, int]], dtype: str,
            candidates: list = (), ragged: bool = True, variants: list[dict] = ()) -> tuple[dict, dict]:
    """{(E, mean rows, N, K): op}, each planned as bench_grouped.py plans an E x T x N x K entry, and {shape: {name:
    op}} of the ``variants`` (parse_variants' field changes to the pick) and ``candidates`` (parse_candidates' tuples:
    the same hints with the tile, cluster, schedule and stages fixed); those the planner refuses for the shape are left
    out, said once; one parallel build."""
    shapes = sorted({part_shape(sizes, n, k) for *_, sizes, n, k in cases})
    plans = {s: Gemm(dtype, "tn", m=s[1], n=s[2], k=s[3], batch=s[0], ragged=ragged and s[0] > 1) for s in shapes}
    others: dict[tuple, list] = {s: [] for s in shapes}
    for s in shapes:
        for fields in variants:
            try:
                variant = variant_of(plans[s].config, fields)
            except ValueError as refused:
                print(f"  {s}: skip {fields}: {refused}", file=sys.stderr)
                continue
            if variant != plans[s].config:
                others[s].append(variant)
        for candidate in candidates:
            if candidate.stream_k:
                raise SystemExit("--candidates: grouped calls take no stream-K (drop :sk)")
            try:
                cfg = Gemm(dtype, "tn", m=s[1], n=s[2], k=s[3], batch=s[0], ragged=ragged and s[0] > 1,
                           **candidate.hints()).config
            except ValueError as refused:
                print(f"  {s}: skip {candidate}: {refused}", file=sys.stderr)
                continue
            if cfg != plans[s].config:
                others[s].append(cfg)
    configs = list(dict.fromkeys([p.config for p in plans.values()] + [c for cs in others.values() for c in cs]))
    built = dict(zip(configs, compile_many(configs, namespace="gemmgen")))
    return ({s: built[p.config] for s, p in plans.items()},
            {s: {c.name: built[c] for c in cs} for s, cs in others.items()})


def built_with_flags(ops: dict, flags: str) -> dict:
    """{shape: op}: each of ``ops``' kernels built again with ``flags`` (shell words) added to nvcc's (part of the build
    cache's key), in a namespace of its own, so that both builds run in one process."""
    configs = list(dict.fromkeys(op.config for op in ops.values()))
    built = dict(zip(configs, compile_many(configs, namespace="gemmgen_flags", extra_flags=tuple(shlex.split(flags)))))
    return {s: built[op.config] for s, op in ops.items()}


def measure_masked(op, sizes: list[int], n: int, k: int, dname: str, rounds: int, order: str) -> tuple[float, float]:
    """(ms, rel. error) of op.masked over the same groups laid out in slabs of max_m rows (the largest group rounded
    up to 64), against the float32 product of each group's rows; the rows past the counts hold NaN in A."""
    dtype = DTYPES[dname]
    slab = max(64, -(-max(sizes) // 64) * 64)
    a = torch.randn(len(sizes), slab, k, device="cuda").to(dtype)
    for g, count in enumerate(sizes):
        a[g, count:] = float("nan")
    b = torch.randn(len(sizes), n, k, device="cuda").to(dtype).transpose(1, 2)
    counts = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    d = op.masked(a, b, counts)
    err = 0.0
    for g, count in enumerate(sizes):
        if count:
            ref = a[g, :count].float() @ b[g].float()
            err = max(err, ((d[g, :count].float() - ref).norm() / ref.norm()).item())
    ms = timed_rounds({"masked": lambda: op.masked(a, b, counts)}, rounds, order)["masked"]
    return ms, err


def p10(values: list[float]) -> float:
    """The 10th percentile as the tables quote it: the value a tenth of the way up the sorted list (the lowest
    below ten values)."""
    ordered = sorted(values)
    return ordered[len(ordered) // 10]


def ratios(rows: list[MoeRow], tag: str = "") -> dict[str, float]:
    """Geomean, p10 and lowest of ours / torch._grouped_mm and of ours / the faster of it and the loop."""
    summary = {}
    vs_gmm = [r.row.vs_grouped_mm for r in rows if r.row.vs_grouped_mm]
    if vs_gmm:
        summary[f"{tag}geomean ours/torch._grouped_mm"] = round(geomean(vs_gmm), 4)
        summary[f"{tag}p10 ours/torch._grouped_mm"] = round(p10(vs_gmm), 4)
        summary[f"{tag}min ours/torch._grouped_mm"] = round(min(vs_gmm), 4)
    if rows:
        best = [r.vs_best for r in rows]
        summary[f"{tag}geomean ours/best of (_grouped_mm, loop)"] = round(geomean(best), 4)
        summary[f"{tag}p10 ours/best of (_grouped_mm, loop)"] = round(p10(best), 4)
        summary[f"{tag}min ours/best of (_grouped_mm, loop)"] = round(min(best), 4)
    return summary


def summarize(rows: list[MoeRow]) -> dict[str, float]:
    """Issue 35's figures over every row, then per token count (where there are several)."""
    summary = ratios(rows)
    counts = sorted({r.tokens for r in rows})
    for tokens in counts if len(counts) > 1 else ():
        summary.update(ratios([r for r in rows if r.tokens == tokens], f"{tokens} tokens: "))
    # --candidates: the fastest of the pick and the candidates per row, what one better tile per call would read
    best = [r.row.grouped_mm_ms / min([r.row.ours_ms, *r.row.extra_ms.values()])
            for r in rows if r.row.extra_ms and r.row.grouped_mm_ms]
    for name in sorted({n for r in rows for n in r.row.extra_ms if n.startswith("split@")}):
        split = [r.row.ours_ms / r.row.extra_ms[name] for r in rows if name in r.row.extra_ms]
        summary[f"geomean pick/{name} ({len(split)} rows)"] = round(geomean(split), 4)
        summary[f"max pick/{name}"] = round(max(split), 4)
    if best:
        summary["geomean fastest candidate/torch._grouped_mm"] = round(geomean(best), 4)
        summary["min fastest candidate/torch._grouped_mm"] = round(min(best), 4)
    return summary


def parse_list(text: str, allowed: tuple[str, ...] | None, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in items if allowed is not None and x not in allowed]
    if unknown or not items:
        raise ValueError(f"{what}: {', '.join(unknown) or 'none given'}; choose from {', '.join(allowed or ())}")
    return items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="comma list of: " + ", ".join(MODELS))
    parser.add_argument("--tokens", default="1,16,512,4096",
                        help="tokens routed per layer call (comma list): decode steps and prefills")
    parser.add_argument("--routings", default=",".join(ROUTINGS), help="comma list of: " + ", ".join(ROUTINGS))
    parser.add_argument("--gemms", default="up,down", help="comma list of: up, down")
    parser.add_argument("--alpha", type=float, default=0.3, help="Dirichlet concentration (smaller: more skewed)")
    parser.add_argument("--zipf-s", type=float, default=1.2, help="Zipf exponent (larger: more skewed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--order", choices=sorted(ORDERS), default="balanced")
    parser.add_argument("--masked", action="store_true",
                        help="also time op.masked (DeepGEMM's masked layout) on the same groups in slabs")
    parser.add_argument("--candidates", default="", help="sm90 kernels timed beside the pick on every row, "
                        "TILE:CLUSTER:pp|coop[:sN],... (e.g. 64x128x64:1x1:pp,128x128x64:2x1:coop): which tile wins "
                        "at which routing")
    parser.add_argument("--variants", default="", help="the pick with KernelConfig fields changed, timed beside it: "
                        "FIELD=VALUE[+FIELD=VALUE],... (e.g. raster_group=1)")
    parser.add_argument("--split-at", default="", help="rows (comma list): also time each call as two launches, "
                        "the groups of more rows and the rest, each planned for its own (what per-group tile shapes "
                        "could gain at most, less one launch)")
    parser.add_argument("--flags-variant", default="", help="nvcc flags (e.g. -DGEMMGEN_SM90_TRIM_EMPTY_BLOCKS=0): "
                        "each pick built again with them added (a template's switch) and timed beside it in the same "
                        "rounds as 'flags', the A/B of a switch without a second run's noise")
    parser.add_argument("--uniform-plan", action="store_true",
                        help="plan as for equal groups (no ragged=True hint: the plan before routing was weighed)")
    parser.add_argument("--json", default=None, help="default $OUT/bench_moe.json or ./bench_moe.json")
    args = parser.parse_args(argv)
    try:
        models = parse_list(args.models, tuple(MODELS), "--models")
        routings = parse_list(args.routings, ROUTINGS, "--routings")
        gemms = parse_list(args.gemms, ("up", "down"), "--gemms")
        tokens = [int(t) for t in parse_list(args.tokens, None, "--tokens")]
        split_at = [int(r) for r in parse_list(args.split_at, None, "--split-at")] if args.split_at else []
    except ValueError as err:
        parser.error(str(err))
    if any(t < 1 for t in tokens) or args.rounds < 1 or args.alpha <= 0 or args.zipf_s <= 0:
        parser.error("--tokens, --rounds, --alpha and --zipf-s must be positive")
    cases = [(model, gemm, t, routing, route(MODELS[model], t, routing, args.seed, args.alpha, args.zipf_s),
              *MODELS[model].gemms()[gemm])
             for model in models for t in tokens for routing in routings for gemm in gemms]
    idle = [c for c in cases if not sum(c[4])]
    for model, gemm, t, routing, *_ in idle:   # (expert parallelism: every token went to other GPUs' experts)
        print(f"{model} {gemm} {t} tokens {routing}: no rows routed to these experts, nothing to time", file=sys.stderr)
    cases = [c for c in cases if sum(c[4])]
    if not torch.cuda.is_available():
        print("bench_moe: needs a CUDA GPU; none is visible (the routed group sizes follow)", file=sys.stderr)
        for model, gemm, t, routing, sizes, n, k in cases:
            print(f"{model} {gemm} {t} tokens {routing}: {sizes}", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; {args.dtype}, layout tn, "
          f"do_bench median of {args.rounds} interleaved rounds")
    split_cases = [(*c[:4], part, *c[5:]) for rows_at in split_at for c in cases
                   for part in (split_sizes(c[4], rows_at) or ())]
    ops, candidate_ops = planned(cases + split_cases, args.dtype, parse_candidates(args.candidates),
                                 ragged=not args.uniform_plan, variants=parse_variants(args.variants))
    picks = {s: ops[s] for s in {part_shape(sizes, n, k) for *_, sizes, n, k in cases}}
    flag_ops = built_with_flags(picks, args.flags_variant) if args.flags_variant else {}
    warm_up_gpu()
    rows = []
    print(f"{'model':<18} {'gemm':<4} {'tokens':>6} {'routing':<9} {'min':>5} {'max':>5} {'empty':>5} | " + header())
    for model, gemm, t, routing, sizes, n, k in cases:
        shape = part_shape(sizes, n, k)
        extra = dict(candidate_ops[shape])
        if shape in flag_ops:
            extra["flags"] = flag_ops[shape]
        for rows_at in split_at:
            parts = split_sizes(sizes, rows_at)
            if parts:
                extra[f"split@{rows_at}"] = SplitByRows(*(ops[part_shape(p, n, k)] for p in parts), rows_at)
        row = measure_sizes(shape, sizes, ops[shape], args.dtype, args.rounds, args.order, extra=extra)
        moe = MoeRow(model, gemm, t, routing, min(sizes), max(sizes), sizes.count(0), row)
        if args.masked:
            moe.masked_ms, moe.masked_rel_error = measure_masked(ops[shape], sizes, n, k, args.dtype, args.rounds,
                                                                 args.order)
        rows.append(moe)
        masked = (f" | masked {moe.masked_ms:.4f} ms ({row.ours_ms / moe.masked_ms:.3f}x ours), rel.err "
                  f"{moe.masked_rel_error:.1e}" if moe.masked_ms else "")
        print(f"{model:<18} {gemm:<4} {t:>6} {routing:<9} {moe.smallest:>5} {moe.largest:>5} {moe.empty:>5} | "
              + format_row(row) + masked, flush=True)
        for name, ms in sorted(row.extra_ms.items(), key=lambda item: item[1]):
            vs = f"{row.grouped_mm_ms / ms:.3f}x _grouped_mm" if row.grouped_mm_ms else ""
            print(f"    {name:<46} {ms:.4f} ms {row.ours_ms / ms:.3f}x the pick {vs} rel.err "
                  f"{row.extra_rel_error[name]:.1e}", flush=True)
    summary = summarize(rows)
    for key, value in summary.items():
        print(f"{key}: {value}")
    out = Path(args.json) if args.json else Path(os.environ.get("OUT", ".")) / "bench_moe.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": args.dtype,
                               "seed": args.seed, "alpha": args.alpha, "zipf_s": args.zipf_s,
                               "models": {m: asdict(MODELS[m]) for m in models},
                               "rows": [{**{k: v for k, v in asdict(r).items() if k != "row"}, "vs_best": r.vs_best,
                                         **asdict(r.row)} for r in rows],
                               "summary": summary}, indent=1))
    print(f"wrote {out}")
    wrong = [f"{r.model} {r.gemm} {r.tokens} {r.routing}" for r in rows
             if not r.row.rel_error <= WRONG or (r.masked_rel_error is not None and not r.masked_rel_error <= WRONG)
             or any(not e <= WRONG for e in r.row.extra_rel_error.values())]
    if wrong:
        print(f"{len(wrong)} row(s) WRONG (rel.err > {WRONG}): " + ", ".join(wrong), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
