"""Build once per machine: several processes (the ranks torchrun starts on one node) ask for one model's kernels at
once from an empty build cache, and each reports when its ops are ready and how many kernels it built itself.

    python3 benchmarks/build_once.py --procs 8 --model llama3-8b --json /tmp/build_once.json

Two runs side by side, each from empty caches:

* ``shared``: every process uses one build cache, as ranks of one machine do (GEMMGEN_CACHE_DIR, or ~/.cache/gemmgen).
  The builder's per-kernel file locks (generator/toolchain/builder.py) make the first process to ask build each
  kernel and the others wait for it and load its result.
* ``separate``: each process has a cache of its own: what every rank would do if nothing were shared (each builds
  every kernel; the machine's cores are split between them). ``--skip-separate`` leaves it out.

Each process runs ``generator.nn.replace_linear`` on a stand-in of the model: one bias-free ``nn.Linear`` (on the meta
device: no memory) per distinct (N, K) of its linear layers, which builds the forward kernels of every M bucket of
every layer in one parallel ninja run, and the JIT runtime. The backward kernels are built on a layer's first
backward, with the same locks. Planning uses ``--arch`` so that the run needs no GPU: building and loading a kernel
library needs nvcc and torch only.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import corpus  # noqa: E402

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def layer_shapes(model: str) -> list[tuple[int, int]]:
    """The distinct (N, K) of the model's linear layers (y = x @ W.t(), W of N x K)."""
    return list(dict.fromkeys((n, k) for _, n, k in corpus.forward_shapes([model], [1])))


def worker(cache: str, shapes: list[tuple[int, int]], dtype: str, arch: int, start: mp.Barrier,
           results: mp.Queue) -> None:
    """One rank: swap the stand-in model's layers (every bucket's kernel built), counting the kernels this process
    compiled itself."""
    os.environ["GEMMGEN_CACHE_DIR"] = cache
    import torch
    from generator.nn import replace_linear
    from generator.toolchain import builder

    built: list[str] = []
    run_ninja = builder._run_ninja

    def counting_run_ninja(todo, **kwargs):   # the targets this process builds (not the ones it waited for)
        built.extend(t.req.name for t in todo)
        return run_ninja(todo, **kwargs)

    builder._run_ninja = counting_run_ninja
    start.wait()
    t0 = time.perf_counter()
    model = torch.nn.Sequential(*(torch.nn.Linear(k, n, bias=False, device="meta", dtype=getattr(torch, DTYPES[dtype]))
                                  for n, k in shapes))
    replace_linear(model, arch=arch)
    results.put({"pid": os.getpid(), "ready_s": time.perf_counter() - t0, "built": len(built),
                 "kernels": len({b.op.config.name for layer in model for b in layer.op.buckets})})


def run(procs: int, shapes: list[tuple[int, int]], dtype: str, arch: int, shared: bool, root: Path) -> dict:
    """Start ``procs`` ranks at once (a barrier), each on the shared cache or on its own; wait for all."""
    ctx = mp.get_context("spawn")
    start, results = ctx.Barrier(procs), ctx.Queue()
    caches = [str(root / ("shared" if shared else f"rank{i}")) for i in range(procs)]
    workers = [ctx.Process(target=worker, args=(cache, shapes, dtype, arch, start, results)) for cache in caches]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    rows = [results.get() for _ in workers]
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    ready = [r["ready_s"] for r in rows]
    return {"mode": "shared" if shared else "separate", "procs": procs, "wall_s": wall,
            "ready_s": {"min": min(ready), "median": statistics.median(ready), "max": max(ready)},
            "kernels_built": sum(r["built"] for r in rows), "kernels_per_rank": rows[0]["kernels"], "ranks": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--model", default="llama3-8b", help="a corpus model (benchmarks/corpus.py)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--arch", type=int, default=90, choices=[80, 90])
    ap.add_argument("--skip-separate", action="store_true", help="time the shared cache only")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    shapes = layer_shapes(args.model)
    print(f"{args.model}: {len(shapes)} distinct linear layers, {args.procs} processes, {os.cpu_count()} cores",
          flush=True)
    summary = []
    with tempfile.TemporaryDirectory(prefix="gemmgen-build-once-") as tmp:
        for shared in ([True] if args.skip_separate else [True, False]):
            result = run(args.procs, shapes, args.dtype, args.arch, shared, Path(tmp) / str(shared))
            summary.append(result)
            r = result["ready_s"]
            print(f"{result['mode']:>8}: all ready in {result['wall_s']:.1f} s (per rank {r['min']:.1f}-{r['max']:.1f} s, "
                  f"median {r['median']:.1f}); kernels compiled {result['kernels_built']} "
                  f"({result['kernels_per_rank']} ops' kernels per rank, and the JIT runtime)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "cores": os.cpu_count(), "runs": summary},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
