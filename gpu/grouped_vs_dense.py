"""Probe: what the grouped kernel costs against dense calls on the same rows, and what a group's rows cost at decode
sizes. Two parts, each checked against float32:

* ``large``: Mixtral's 8 groups of 1024 rows each, and of the rows bench_moe.py's uniform routing of 4096 tokens
  gives them (1008-1072), on its fused gate and up projection and its down projection, timed in interleaved rounds:
  ours grouped (the ragged plan bench_moe.py uses, and the same with a 1x1 cluster), ours as E dense calls
  (the op planned for one group's rows), ours as one dense call of all E x R rows on one expert's weight (the main
  loop's rate at this N and K with no groups), torch.mm's loop and torch._grouped_mm. Separates a cost of the
  grouped machinery (grouped against E dense calls of ours) from the dense main loop's (ours against torch.mm's).
* ``rows``: 8 groups with rows among 128 (Qwen3-30B-A3B's experts, a token's top-8), each holding r = 1 ... 128
  rows, on the kernel planned for one expected row (held fixed), timed as CUDA graph replays. Where the time stays
  flat as r grows, the rows a 64-row tile computes beyond a group's own are not what a call costs (the call streams
  its experts' weights): a form that computes fewer of them (the swapped form) cannot gain there.

    python3 gpu/grouped_vs_dense.py [--parts large,rows] [--rounds 3] [--json $OUT/grouped_vs_dense.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench import timed_rounds  # noqa: E402
from bench_grouped import ends, rel_error, tflops  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

#: (name, N, K) of the ``large`` part: Mixtral-8x7B's fused gate and up projection and its down projection
LARGE_SHAPES = (("up", 28672, 4096), ("down", 4096, 14336))
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
#: the ``large`` part's groups: Mixtral's 8 experts, equal and as routed (bench_moe.py, 4096 tokens, uniform)
LARGE_SIZES = {"equal": [1024] * 8, "routed": [1009, 1072, 1025, 1015, 1012, 1008, 1035, 1016]}
ROWS_EXPERTS, ROWS_ACTIVE, ROWS_N, ROWS_K = 128, 8, 1536, 2048   # Qwen3-30B-A3B's up projection, one token's top-8


def large_part(rounds: int) -> list[dict]:
    experts, rows = 8, 1024   # (the plans': the groups' expected rows)
    plans = {}
    for name, n, k in LARGE_SHAPES:
        plans[(name, "grouped")] = Gemm("bf16", "tn", m=rows, n=n, k=k, batch=experts, ragged=True)
        plans[(name, "grouped_1x1")] = Gemm("bf16", "tn", m=rows, n=n, k=k, batch=experts, ragged=True,
                                            cluster_shape=(1, 1))
        plans[(name, "dense")] = Gemm("bf16", "tn", m=rows, n=n, k=k)
        plans[(name, "one_weight")] = Gemm("bf16", "tn", m=experts * rows, n=n, k=k)
    configs = list(dict.fromkeys(p.config for p in plans.values()))
    built = dict(zip(configs, compile_many(configs, namespace="gemmgen_probe")))
    plans_of = ("grouped", "grouped_1x1", "dense", "one_weight")
    out = []
    for (name, n, k), (label, sizes) in ((s, z) for s in LARGE_SHAPES for z in LARGE_SIZES.items()):
        grouped, grouped_1x1, dense, one = (built[plans[(name, w)].config]
                                            for w in ("grouped", "grouped_1x1", "dense", "one_weight"))
        total, bounds = sum(sizes), list(zip([0] + ends(sizes)[:-1], ends(sizes)))
        a = torch.randn(total, k, device="cuda").bfloat16()
        b = torch.randn(experts, n, k, device="cuda").bfloat16().transpose(1, 2)
        offsets = torch.tensor(ends(sizes), dtype=torch.int32, device="cuda")
        parts = [(a[s:e], b[g]) for g, (s, e) in enumerate(bounds)]
        d = torch.empty(total, n, dtype=torch.bfloat16, device="cuda")
        outs = [d[s:e] for s, e in bounds]
        ref = torch.cat([x.float() @ w.float() for x, w in parts])

        def ours_dense():
            for (x, w), o in zip(parts, outs):
                dense(x, w, out=o)
            return d

        def mm_loop():
            for (x, w), o in zip(parts, outs):
                torch.mm(x, w, out=o)
            return d

        calls = {"ours_grouped": lambda: grouped.grouped(a, b, offsets),
                 "ours_grouped_1x1": lambda: grouped_1x1.grouped(a, b, offsets), "ours_dense_loop": ours_dense,
                 "mm_loop": mm_loop, "grouped_mm": lambda: torch._grouped_mm(a, b, offs=offsets)}
        errors = {who: rel_error(fn(), ref) for who, fn in calls.items()}
        one_ref = a.float() @ b[0].float()
        errors["ours_one_weight"] = rel_error(one(a, b[0]), one_ref)
        calls["ours_one_weight"] = lambda: one(a, b[0])
        del ref, one_ref
        ms = timed_rounds(calls, rounds)
        row = {"gemm": name, "groups": label, "sizes": sizes, "n": n, "k": k,
               "kernels": {w: built[plans[(name, w)].config].name for w in plans_of},
               "ms": ms, "tflops": {who: tflops(total, n, k, t) for who, t in ms.items()}, "rel_error": errors}
        out.append(row)
        print(f"{label} groups of {min(sizes)}-{max(sizes)} rows x {n} x {k} ({name}): " + ", ".join(
            f"{who} {row['tflops'][who]:.0f}" for who in ms) + " TFLOP/s; errors " +
            ", ".join(f"{e:.1e}" for e in errors.values()), flush=True)
    return out


def rows_part() -> list[dict]:
    from triton.testing import do_bench_cudagraph

    plan = Gemm("bf16", "tn", m=1, n=ROWS_N, k=ROWS_K, batch=ROWS_EXPERTS, ragged=True)
    (op,) = compile_many([plan.config], namespace="gemmgen_probe")
    w = torch.randn(ROWS_EXPERTS, ROWS_N, ROWS_K, device="cuda").bfloat16()
    b = w.transpose(1, 2)
    active = list(range(0, ROWS_EXPERTS, ROWS_EXPERTS // ROWS_ACTIVE))[:ROWS_ACTIVE]
    weight_bytes = ROWS_ACTIVE * ROWS_N * ROWS_K * 2
    out = []
    for r in ROWS:
        sizes = [r if g in active else 0 for g in range(ROWS_EXPERTS)]
        offsets = torch.tensor(ends(sizes), dtype=torch.int32, device="cuda")
        a = torch.randn(sum(sizes), ROWS_K, device="cuda").bfloat16()
        ref = torch.cat([a[i * r:(i + 1) * r].float() @ b[g].float() for i, g in enumerate(active)])
        row = {"rows": r, "kernel": op.name, "rel_error": rel_error(op.grouped(a, b, offsets), ref)}
        for who, fn in {"ours": lambda: op.grouped(a, b, offsets),
                        "grouped_mm": lambda: torch._grouped_mm(a, b, offs=offsets)}.items():
            fn()
            torch.cuda.synchronize()
            row[f"{who}_graph_us"] = do_bench_cudagraph(fn, rep=200) * 1e3
            row[f"{who}_weight_tb_s"] = weight_bytes / (row[f"{who}_graph_us"] * 1e-6) / 1e12
        out.append(row)
        print(f"{ROWS_ACTIVE} of {ROWS_EXPERTS} groups x {r:4} rows (N {ROWS_N}, K {ROWS_K}): ours "
              f"{row['ours_graph_us']:6.1f} us ({row['ours_weight_tb_s']:.2f} TB/s of weights), _grouped_mm "
              f"{row['grouped_mm_graph_us']:6.1f} us; rel.err {row['rel_error']:.1e}  {op.name}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="large,rows")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "grouped_vs_dense.json"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("grouped_vs_dense: needs a CUDA GPU", file=sys.stderr)
        return 2
    parts = args.parts.split(",")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if "large" in parts:
        result["large"] = large_part(args.rounds)
    if "rows" in parts:
        result["rows"] = rows_part()
    Path(args.json).write_text(json.dumps(result, indent=1))
    bad = [r for part in ("large", "rows") for r in result.get(part, [])
           if max(r["rel_error"].values() if isinstance(r["rel_error"], dict) else [r["rel_error"]]) > 1e-2]
    if bad:
        print(f"WRONG: {len(bad)} rows above 1e-2", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
