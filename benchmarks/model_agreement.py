"""How often the sm90 cost model ranks two measured kernels as the GPU did: a check for a planner change against
pairs already timed, before any device time is spent on it.

    python benchmarks/model_agreement.py benchmarks/results/h100_corpus_fwd_finer_buckets_beside_old_grid_*.json

Reads ``bench_corpus.py --alt-buckets`` results (bf16 ``tn``, 132 SMs): every GEMM whose call took one kernel on the
op of one grid and another on the op of the other is a pair with a measured winner (ours_ms against alt_ms). Each
kernel is rebuilt from its name with the planner's knobs (tile, cluster, schedule, stages; raster and stream-K set
after), and ``planner.estimate`` costs both at the GEMM's own size. Prints the pairs the model ranks against the
measurement and a summary line; ``--json`` writes them.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from generator import Gemm  # noqa: E402
from generator.planner import Problem, estimate  # noqa: E402
from generator.spec.arch import arch_spec  # noqa: E402
from generator.spec.config import SM90_SCHEDULE_TAGS, KernelConfig  # noqa: E402

SM_COUNT = 132
#: A name's schedule tag -> the schedule (KernelConfig.name writes SM90_SCHEDULE_TAGS).
SCHEDULES = {tag: schedule for schedule, tag in SM90_SCHEDULE_TAGS.items()}
# sm90_<dtype>_<layout>_<BM>x<BN>x<BK>_c<CM>x<CN>_s<stages>_<schedule>[_sk]_g<group><raster> (KernelConfig.name of an
# sm90 plan with its input dtype as output and no epilogue).
SM90_NAME = re.compile(r"sm90_(?P<dtype>[a-z0-9]+)_(?P<layout>[nt]{2})_(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)"
                       r"_c(?P<cm>\d)x(?P<cn>\d)_s(?P<stages>\d+)"
                       r"_(?P<schedule>" + "|".join(SCHEDULES) + r")(?P<sk>_sk)?_g(?P<group>\d+)(?P<raster>[mn])$")


def config_of(name: str, m: int, n: int, k: int) -> KernelConfig:
    """The sm90 config called ``name`` (a bench_corpus kernel name; a backward op's ``_bwd_...`` suffix is dropped),
    planned for M x N x K."""
    match = SM90_NAME.match(name.split("_bwd")[0])
    if match is None:
        raise ValueError(f"{name!r} is not a plain sm90 kernel name (sm90_<dtype>_<layout>_<tile>_c.._s.._<schedule>"
                         f"_g..): only those are rebuilt")
    g = match.groupdict()
    plan = Gemm(g["dtype"], g["layout"], arch=90, m=m, n=n, k=k,
                tile_shape=(int(g["bm"]), int(g["bn"]), int(g["bk"])), cluster_shape=(int(g["cm"]), int(g["cn"])),
                schedule=SCHEDULES[g["schedule"]], stages=int(g["stages"]))
    return replace(plan.config, stream_k=bool(g["sk"]), raster=g["raster"], raster_group=int(g["group"]))


@dataclass
class Pair:
    m: int
    n: int
    k: int
    kernel: str
    other: str
    measured: float   # other's time / kernel's time: above 1, kernel was faster
    modelled: float   # other's cost / kernel's cost

    @property
    def agrees(self) -> bool:
        return (self.measured > 1) == (self.modelled > 1)


def pairs_of(rows: list[dict]) -> list[Pair]:
    """One pair per distinct GEMM whose two columns ran different kernels."""
    spec = arch_spec(90)
    pairs, seen = [], set()
    for r in rows:
        key = (r["m"], r["n"], r["k"])
        if key in seen or not r.get("alt_kernel") or not r.get("alt_ms"):
            continue
        seen.add(key)
        if r["kernel"].split("_bwd")[0] == r["alt_kernel"].split("_bwd")[0]:
            continue
        problem = Problem(*key)
        cost = {name: estimate(config_of(name, *key), spec, SM_COUNT, problem).cost
                for name in (r["kernel"], r["alt_kernel"])}
        pairs.append(Pair(*key, r["kernel"], r["alt_kernel"], r["alt_ms"] / r["ours_ms"],
                          cost[r["alt_kernel"]] / cost[r["kernel"]]))
    return pairs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="bench_corpus.py --alt-buckets JSON files")
    ap.add_argument("--json", default=None, help="write the pairs here")
    args = ap.parse_args(argv)
    rows = [row for path in args.results for row in json.loads(Path(path).read_text())["rows"]]
    pairs = pairs_of(rows)
    wrong = [p for p in pairs if not p.agrees]
    for p in sorted(wrong, key=lambda p: (p.m, p.n, p.k)):
        print(f"{p.m:6d} {p.n:6d} {p.k:6d}  {p.kernel.split('_bwd')[0]:44s} vs {p.other.split('_bwd')[0]:44s} "
              f"measured {p.measured:.3f}  modelled {p.modelled:.3f}")
    lost = sum(abs(math.log(p.measured)) for p in wrong)
    print(f"the model ranks {len(pairs) - len(wrong)} of {len(pairs)} pairs as measured; the {len(wrong)} it ranks "
          f"wrongly cost {lost:.2f} in summed |log(time ratio)|")
    if args.json:
        Path(args.json).write_text(json.dumps([vars(p) for p in pairs], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
