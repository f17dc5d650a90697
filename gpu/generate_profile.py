"""Where the time of a generate() call goes, stock against replace_linear's model. For each batch size:

1. wall time of --rounds interleaved calls (benchmarks/bench.py interleaved_rounds) of the full generate() and of a
   prefill-only one (max_new_tokens=1), so the gap splits into prefill and per-decode-step time;
2. torch.profiler's table of one call of each model (CPU self time per op; with --compiled also the CUDA table), and
   a table of the difference per op over all rows (ours - stock, per generated token), which names the ops that
   add or remove host time;
3. cProfile of one call of each model, differenced per Python function (tottime, ours - stock, per token): host
   time no profiler op covers (dynamo's guards, CUDA-graph-tree bookkeeping, transformers' loop).

Eager (the default) runs the decode steps eagerly; --compiled compiles them the transformers way (CUDA graphs).
Writes $OUT/generate_profile_{stock,ours,diff,pydiff}_[compiled_]b<batch>.txt.

    python3 gpu/generate_profile.py --batches 1 --new-tokens 32
    python3 gpu/generate_profile.py --compiled --batches 1 --new-tokens 32 --rounds 7
"""
from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import generate as gen  # noqa: E402
from bench import interleaved_rounds  # noqa: E402

OUT = Path(os.environ.get("OUT", "."))
DIFF_ROWS = 40


def wall_split(calls: dict[str, Callable], prefills: dict[str, Callable], rounds: int,
               new_tokens: int) -> str:
    """Median wall time of the full call and of the prefill alone, per model, and the per-step decode time."""
    full = interleaved_rounds(calls, rounds, gen.wall_seconds)
    pre = interleaved_rounds(prefills, rounds, gen.wall_seconds)
    lines = [f"{'model':6s} {'full ms':>9s} {'prefill ms':>11s} {'decode us/step':>15s}"]
    med = {}
    for w in calls:
        f, p = statistics.median(full[w]) * 1e3, statistics.median(pre[w]) * 1e3
        med[w] = (f, p, (f - p) / max(new_tokens - 1, 1) * 1e3)
        lines.append(f"{w:6s} {f:9.3f} {p:11.3f} {med[w][2]:15.1f}")
    (fs, ps, ds), (fo, po, do) = med["stock"], med["ours"]
    lines.append(f"stock/ours: full {fs / fo:.3f}x, prefill {ps / po:.3f}x, decode step {ds / do:.3f}x; "
                 f"ours - stock: prefill {po - ps:+.3f} ms, decode {do - ds:+.1f} us/step")
    lines.append(f"all full: {full}\nall prefill: {pre}")
    return "\n".join(lines)


def op_times(fn: Callable, cuda: bool) -> tuple[dict[str, tuple[float, int]], str]:
    """{op: (self CPU us, calls)} over every row of one profiled call, and the printed table(s)."""
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        fn()
    events = prof.key_averages()
    sorts = ["self_cpu_time_total"] + (["self_cuda_time_total"] if cuda else [])
    table = "\n".join(events.table(sort_by=s, row_limit=40) for s in sorts)
    return {e.key: (e.self_cpu_time_total, e.count) for e in events}, table


def python_times(fn: Callable) -> dict[str, float]:
    """{function: tottime us} of one call under cProfile."""
    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    torch.cuda.synchronize()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    return {f"{Path(file).name}:{line}({name})": tt * 1e6 for (file, line, name), (_, _, tt, _, _) in stats.items()}


def diff_table(stock: dict[str, Any], ours: dict[str, Any], tokens: int, unit: str) -> str:
    """The rows whose time differs most between the two models, per generated token, and the total difference."""
    def us(v: Any) -> float:
        return v[0] if isinstance(v, tuple) else v

    def calls(v: Any) -> str:
        return str(v[1]) if isinstance(v, tuple) else ""

    keys = set(stock) | set(ours)
    delta = {k: us(ours.get(k, 0.0)) - us(stock.get(k, 0.0)) for k in keys}
    lines = [f"{'ours - stock ' + unit + ' per token':>26s} {'stock':>10s} {'ours':>10s} {'calls s/o':>11s}  name"]
    for k in sorted(keys, key=lambda k: -abs(delta[k]))[:DIFF_ROWS]:
        s, o = stock.get(k, 0.0), ours.get(k, 0.0)
        calls_both = calls(s) + "/" + calls(o)
        lines.append(f"{delta[k] / tokens:26.2f} {us(s):10.0f} {us(o):10.0f} {calls_both:>11s}  {k[:90]}")
    total = sum(delta.values())
    lines.append(f"total ours - stock: {total:.0f} {unit} ({total / tokens:+.2f} {unit} per token) over "
                 f"{sum(us(v) for v in stock.values()):.0f} {unit} of stock's")
    return "\n".join(lines)


def main() -> None:
    argv = sys.argv[1:]
    compiled = "--compiled" in argv
    args = gen.parse_args([a for a in argv if a != "--compiled"])
    config = gen.compile_config(args.compile_mode) if compiled else None
    tag = "compiled_" if compiled else ""
    stock = gen.load_stock(args)
    ours, _, _ = gen.with_generated_linears(stock)
    models = {"stock": stock, "ours": ours}
    torch.manual_seed(args.seed)
    for batch in args.batches:
        prompt = torch.randint(0, stock.config.vocab_size, (batch, args.prompt_len), device="cuda")
        calls = {w: gen.generate_fn(m, prompt, args.new_tokens, config) for w, m in models.items()}
        prefills = {w: gen.generate_fn(m, prompt, 1, config) for w, m in models.items()}
        for fn in [*calls.values(), *prefills.values()]:
            fn()
            fn()
        split = wall_split(calls, prefills, args.rounds, args.new_tokens)
        print(f"--- {tag}batch {batch}, {args.new_tokens} new tokens\n{split}", flush=True)
        ops, pys = {}, {}
        for w, fn in calls.items():
            ops[w], table = op_times(fn, compiled)
            (OUT / f"generate_profile_{w}_{tag}b{batch}.txt").write_text(table)
            print(f"--- {w} {tag}batch {batch}\n{table}", flush=True)
        for w, fn in calls.items():
            pys[w] = python_times(fn)
        tokens = args.new_tokens * batch
        for name, (s, o, unit) in {"diff": (ops["stock"], ops["ours"], "us self CPU"),
                                   "pydiff": (pys["stock"], pys["ours"], "us tottime")}.items():
            text = diff_table(s, o, tokens, unit)
            if name == "diff":
                text = split + "\n\n" + text
            (OUT / f"generate_profile_{name}_{tag}b{batch}.txt").write_text(text)
            print(f"--- {name} {tag}batch {batch}\n{text}", flush=True)


if __name__ == "__main__":
    main()
