"""Where the time of a generate() step goes, stock against replace_linear's model: torch.profiler's table for one
greedy generate() of each model, after warm-up calls, plus the wall time of --rounds interleaved calls
(benchmarks/bench.py interleaved_rounds). Eager (the default): the CPU table (self time per op, top rows), since
examples/generate.py's batch-1 eager row is host-bound; this says which ops our layers add or remove there. With
--compiled (the decode step compiled the transformers way, CUDA graphs): the CPU table and the CUDA table (GPU time
per kernel), which says what the replayed graph's kernels cost against cuBLAS's. Writes
$OUT/generate_profile_{stock,ours}_b<batch>.txt (_compiled_b<batch> with --compiled).

    python3 gpu/generate_profile.py --batches 1 --new-tokens 32
    python3 gpu/generate_profile.py --compiled --batches 1 --new-tokens 32
"""
from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import generate as gen  # noqa: E402
from bench import interleaved_rounds  # noqa: E402

OUT = Path(os.environ.get("OUT", "."))


def main() -> None:
    argv = sys.argv[1:]
    compiled = "--compiled" in argv
    args = gen.parse_args([a for a in argv if a != "--compiled"])
    config = gen.compile_config(args.compile_mode) if compiled else None
    tag = "compiled_" if compiled else ""
    stock = gen.load_stock(args)
    ours, swapped, _ = gen.with_generated_linears(stock)
    models = {"stock": stock, "ours": ours}
    torch.manual_seed(args.seed)
    for batch in args.batches:
        prompt = torch.randint(0, stock.config.vocab_size, (batch, args.prompt_len), device="cuda")
        calls = {w: gen.generate_fn(m, prompt, args.new_tokens, config) for w, m in models.items()}
        for fn in calls.values():
            fn()
            fn()
        times = interleaved_rounds(calls, args.rounds, gen.wall_seconds)
        med = {w: statistics.median(t) for w, t in times.items()}
        print(f"{tag}batch {batch}: median s stock {med['stock']:.4f} ours {med['ours']:.4f} "
              f"ratio {med['stock'] / med['ours']:.3f}x; all: {times}", flush=True)
        for w, fn in calls.items():
            activities = [torch.profiler.ProfilerActivity.CPU]
            activities += [torch.profiler.ProfilerActivity.CUDA] if compiled else []
            with torch.profiler.profile(activities=activities) as prof:
                fn()
            sorts = ["self_cpu_time_total"] + (["self_cuda_time_total"] if compiled else [])
            table = "\n".join(prof.key_averages().table(sort_by=sort, row_limit=40) for sort in sorts)
            (OUT / f"generate_profile_{w}_{tag}b{batch}.txt").write_text(table)
            print(f"--- {w} {tag}batch {batch}\n{table}", flush=True)


if __name__ == "__main__":
    main()
