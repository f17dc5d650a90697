"""Where a split-K call's time goes, block by block: each consumer warpgroup's segment start, main loop end, partial
tile's flag raised, flags seen and store end from the GPU's global timer (-DGEMMGEN_SM90_EXPERIMENT_SK_TIMELINE=1,
written into args.aux), with the exchange and without it (-DGEMMGEN_SM90_EXPERIMENT_SK_NO_FIXUP=1, wrong
sums). Per shape and kernel: the
spread of the blocks' starts, of their main loops' lengths, how long after a tile's last part finished its main loop
the tile was stored, and the call's span (first start to last store). docs/sm90.md, "What a split's partial sums cost".

    python3 gpu/sk_timeline.py --kernel 128x64x64:1x1:cooperative:8:sk --shapes 256x512x7168
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import torch  # noqa: E402

from ab_variants import family_configs, inputs, launch, parse_sm90_kernel  # noqa: E402
from bench import parse_shapes  # noqa: E402
from generator.runtime import KernelLibrary, build_request  # noqa: E402
from generator.toolchain import build_many  # noqa: E402

WORDS = 8              # Kernel::kTimelineWords
START, MAIN, WAITED, STORED, SM, PUBLISHED = range(6)
MAX_BLOCKS = 1024
VARIANTS = {"exchange": "-DGEMMGEN_SM90_EXPERIMENT_SK_TIMELINE=1",
            "nofix": "-DGEMMGEN_SM90_EXPERIMENT_SK_TIMELINE=1 -DGEMMGEN_SM90_EXPERIMENT_SK_NO_FIXUP=1"}


def spans(timeline: torch.Tensor) -> list[dict]:
    """The recorded segments: one per (block, consumer) that ran one, times in ns from the earliest start."""
    t = timeline.view(MAX_BLOCKS, -1, WORDS).cpu()
    rows = [dict(block=blk, consumer=c, sm=int(t[blk, c, SM]), start=int(t[blk, c, START]), main=int(t[blk, c, MAIN]),
                 published=int(t[blk, c, PUBLISHED]), waited=int(t[blk, c, WAITED]),
                 stored=int(t[blk, c, STORED]))
            for blk in range(t.shape[0]) for c in range(t.shape[1]) if t[blk, c, START] > 0]
    t0 = min(r["start"] for r in rows)
    for r in rows:
        for key in ("start", "main", "published", "waited", "stored"):
            r[key] = r[key] - t0 if r[key] > 0 else None
    return rows


def summary(rows: list[dict], parts: int) -> dict:
    def q(values: list[float]) -> str:
        v = sorted(values)
        if not v:
            return "-"
        return f"min {v[0] / 1e3:.2f} med {statistics.median(v) / 1e3:.2f} max {v[-1] / 1e3:.2f} us"

    out = {"starts": q([r["start"] for r in rows]),
           "main_loops": q([r["main"] - r["start"] for r in rows]),
           "main_ends": q([r["main"] for r in rows]),
           "span_us": max((r["stored"] or r["main"]) for r in rows) / 1e3}
    stored = [r for r in rows if r["stored"] is not None]
    if stored:
        # per tile (parts consecutive blocks): its last part's main loop end -> its last store
        tiles: dict[tuple[int, int], list[dict]] = {}
        for r in rows:
            tiles.setdefault((r["block"] // parts, r["consumer"]), []).append(r)
        after = [max(x["stored"] or 0 for x in g) - max(x["main"] for x in g) for g in tiles.values()]
        skew = [max(x["main"] for x in g) - min(x["main"] for x in g) for g in tiles.values()]
        out["tile_skew"] = q(skew)
        out["after_last_part"] = q(after)
        out["publish"] = q([r["published"] - r["main"] for r in rows if r["published"] is not None])
        out["poll"] = q([r["waited"] - (r["published"] or r["main"]) for r in rows if r["waited"] is not None])
        out["add_store"] = q([r["stored"] - r["waited"] for r in stored if r["waited"] is not None])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", action="append", type=parse_sm90_kernel, required=True,
                    metavar="TILE:CLUSTER:SCHEDULE:STAGES:sk")
    ap.add_argument("--shapes", default="256x512x7168")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="another build to time (its flags beside the timeline's), e.g. "
                         "b=-DSWITCH=1 (a template switch)")
    ap.add_argument("--runs", type=int, default=20, help="launches before the one recorded (warm caches, clocks)")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "sk_timeline.json"))
    args = ap.parse_args(argv)
    configs = family_configs("sm90", args.dtype, "tn", 90, args.kernel)
    variants = dict(VARIANTS)
    for v in args.variant:
        name, flags = v.split("=", 1)
        variants[name] = f"{VARIANTS['exchange']} {flags}"
    requests = [dataclasses.replace(req, extra_flags=req.extra_flags + tuple(flags.split()))
                for flags in variants.values() for req in (build_request(c) for c in configs)]
    results = build_many(requests)
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    report = []
    for (m, n, k) in parse_shapes(args.shapes):
        for i, cfg in enumerate(configs):
            units = -(-m // cfg.tile[0]) * -(-n // cfg.tile[1])
            parts = max(1, min(sm_count // units, -(-k // cfg.tile[2])))
            for j, variant in enumerate(variants):
                lib = KernelLibrary.load(results[j * len(configs) + i].library, cfg.name)
                a, b, d = inputs(cfg, m, n, k)
                timeline = torch.zeros(MAX_BLOCKS * 2 * WORDS, dtype=torch.int64, device="cuda")
                for _ in range(args.runs):
                    launch(lib, cfg, a, b, d, timeline)
                timeline.zero_()
                launch(lib, cfg, a, b, d, timeline)
                torch.cuda.synchronize()
                rows = spans(timeline)
                s = summary(rows, parts)
                print(f"{m}x{n}x{k} {cfg.name} {variant}: {parts} parts, {len(rows)} segments")
                for key, value in s.items():
                    print(f"    {key:16} {value}")
                report.append({"shape": f"{m}x{n}x{k}", "kernel": cfg.name, "variant": variant, "parts": parts,
                               "summary": s, "segments": rows})
    Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
