"""Fused epilogues against torch's own, side by side in one run (bf16, layout tn: x @ W.t() as nn.Linear).

    python benchmarks/bench_epilogue.py [--shapes 4096x4096x4096,...] [--rounds 3] [--no-inductor]
                                        [--family sm80] [--json out.json]
    python benchmarks/bench_epilogue.py --corpus-up 512,1024,2048,4096 --no-inductor   (the corpus' MLP-up layers)

Columns, TFLOP/s of the GEMM (2MNK / time), do_bench medians over interleaved rounds:
  ours_plain         our plain GEMM, the planner's kernel for the shape
  ours_gelu_tanh     ours with bias (per column) + gelu_tanh fused
  ours_silu          ours with bias + silu fused
  ours_axpby         ours with 2.0 * acc + 0.5 * C fused (C bf16, M x N)
  ours_bias          ours with acc + bias (what reading the vector costs; compare addmm_bias)
  ours_gelu_tanh_only  ours with gelu_tanh(acc) (what the activation's math costs, no operand)
  addmm_act_gelu     torch._addmm_activation(b, x, W.t(), use_gelu=True): cuBLASLt's fused bias + GELU
  addmm_bias         torch.addmm(b, x, W.t())
  addmm_beta_c       torch.addmm(C, x, W.t(), beta=0.5, alpha=2.0)
  unfused_gelu_tanh  F.gelu(x @ W.t() + b, approximate="tanh")
  unfused_silu       F.silu(x @ W.t() + b)
  inductor_gelu_tanh torch.compile(mode="max-autotune-no-cudagraphs") of gelu(linear(x, W, b), "tanh")
  inductor_silu      the same with silu
and the ratios the issue sets targets on. Each fused result is checked against a float32 reference first.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import parse_shapes, tflops, timed_rounds, warm_up_gpu  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

DEFAULT_SHAPES = "4096x4096x4096,8192x8192x8192,4096x14336x4096,128x4096x4096"
ALPHA, BETA = 2.0, 0.5
EPILOGUES = {
    "plain": {},
    "gelu_tanh": {"activation": "gelu_tanh", "bias": "col"},
    "silu": {"activation": "silu", "bias": "col"},
    "axpby": {"alpha": ALPHA, "beta": BETA},
    "bias": {"bias": "col"},                       # acc + bias: what the loads alone cost (vs addmm_bias)
    "gelu_tanh_only": {"activation": "gelu_tanh"},  # no operand: what the activation's math alone costs
}
BOUND = 1e-2


def compiled(activation: str):
    import torch._inductor.config as inductor_config

    inductor_config.max_autotune_gemm_backends = "ATEN,TRITON"
    if activation == "gelu_tanh":
        return torch.compile(lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"),
                             mode="max-autotune-no-cudagraphs", dynamic=False)
    return torch.compile(lambda x, w, b: F.silu(F.linear(x, w, b)), mode="max-autotune-no-cudagraphs", dynamic=False)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref).norm() / ref.norm()).item()


def measure_shape(m: int, n: int, k: int, ops: dict, with_inductor: bool, rounds: int) -> dict:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    wt = w.t()
    acc = x.float() @ w.float().t()
    refs = {"gelu_tanh": F.gelu(acc + b.float(), approximate="tanh"), "silu": F.silu(acc + b.float()),
            "axpby": ALPHA * acc + BETA * c.float(), "plain": acc, "bias": acc + b.float(),
            "gelu_tanh_only": F.gelu(acc, approximate="tanh")}
    calls = {"ours_plain": lambda: ops["plain"](x, wt), "ours_gelu_tanh": lambda: ops["gelu_tanh"](x, wt, b),
             "ours_silu": lambda: ops["silu"](x, wt, b), "ours_axpby": lambda: ops["axpby"](x, wt, c),
             "ours_bias": lambda: ops["bias"](x, wt, b), "ours_gelu_tanh_only": lambda: ops["gelu_tanh_only"](x, wt)}
    errors = {name: rel_err(fn(), refs[name.removeprefix("ours_")]) for name, fn in calls.items()}
    bad = {name: e for name, e in errors.items() if not e <= BOUND}
    if bad:
        raise SystemExit(f"{m}x{n}x{k}: relative error over {BOUND}: {bad}")
    calls.update({
        "addmm_act_gelu": lambda: torch._addmm_activation(b, x, wt, use_gelu=True),
        "addmm_bias": lambda: torch.addmm(b, x, wt),
        "addmm_beta_c": lambda: torch.addmm(c, x, wt, beta=BETA, alpha=ALPHA),
        "unfused_gelu_tanh": lambda: F.gelu(x @ wt + b, approximate="tanh"),
        "unfused_silu": lambda: F.silu(x @ wt + b),
    })
    compile_s = {}
    if with_inductor:
        for act in ("gelu_tanh", "silu"):
            fn = compiled(act)
            start = time.perf_counter()
            fn(x, w, b)
            compile_s[act] = round(time.perf_counter() - start, 1)
            calls[f"inductor_{act}"] = (lambda f: lambda: f(x, w, b))(fn)
    warm_up_gpu(1.0)
    ms = timed_rounds(calls, rounds)
    row = {"shape": [m, n, k], **{name: round(tflops(m, n, k, t), 1) for name, t in ms.items()},
           "rel_err": {k_: round(v, 5) for k_, v in errors.items()}, "inductor_compile_s": compile_s,
           "kernels": {name: op.name for name, op in ops.items()}}
    ratio = {}
    for act in ("gelu_tanh", "silu"):
        ratio[f"{act}_vs_plain"] = ms["ours_plain"] / ms[f"ours_{act}"]
        if with_inductor:
            ratio[f"{act}_vs_inductor"] = ms[f"inductor_{act}"] / ms[f"ours_{act}"]
    ratio["gelu_tanh_vs_addmm_act"] = ms["addmm_act_gelu"] / ms["ours_gelu_tanh"]
    ratio["silu_vs_addmm_act"] = ms["addmm_act_gelu"] / ms["ours_silu"]
    ratio["axpby_vs_addmm_beta_c"] = ms["addmm_beta_c"] / ms["ours_axpby"]
    ratio["axpby_vs_plain"] = ms["ours_plain"] / ms["ours_axpby"]
    ratio["bias_vs_addmm_bias"] = ms["addmm_bias"] / ms["ours_bias"]
    row["ratios"] = {k_: round(v, 3) for k_, v in ratio.items()}
    torch._dynamo.reset()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--corpus-up", default=None, metavar="TOKENS",
                    help="instead of --shapes: every MLP-up layer of the shape corpus (benchmarks/corpus.py: mlp_up, "
                         "mlp_gate_up, expert_up, shared_up) at these token counts, e.g. 512,1024,2048")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--family", default=None, help="sm80 or sm90 (default: the planner's)")
    ap.add_argument("--knobs", default="",
                    help="Gemm knobs for every plan, e.g. 'schedule=pingpong,tile_shape=128x128x64'")
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    family = {"family": args.family} if args.family else {}
    family.update(parse_knobs(args.knobs))
    shapes = corpus_up_shapes([int(t) for t in args.corpus_up.split(",")]) if args.corpus_up else \
        parse_shapes(args.shapes)
    plans = {(s, name): Gemm("bf16", "tn", m=s[0], n=s[1], k=s[2], **family, **knobs)
             for s in shapes for name, knobs in EPILOGUES.items()}
    unique = {p.name: p.config for p in plans.values()}
    start = time.perf_counter()
    built = dict(zip(unique, compile_many(list(unique.values()), namespace="gemmgen")))
    print(f"built {len(unique)} kernels in {time.perf_counter() - start:.1f} s", flush=True)
    rows = []
    for shape in shapes:
        ops = {name: built[plans[(shape, name)].name] for name in EPILOGUES}
        row = measure_shape(*shape, ops, not args.no_inductor, args.rounds)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "family": args.family, "rows": rows}, indent=1))
    return 0


UP_KINDS = ("mlp_up", "mlp_gate_up", "expert_up", "shared_up")


def corpus_up_shapes(tokens: list[int]) -> list[tuple[int, int, int]]:
    """The distinct (M, N, K) of the corpus' MLP-up layers (the layers a bias + activation follows) at ``tokens``."""
    import corpus
    return corpus.forward_shapes(tokens=tokens, layer_kinds=UP_KINDS)


def parse_knobs(text: str) -> dict[str, object]:
    """'schedule=pingpong,stages=4' -> {'schedule': 'pingpong', 'stages': 4} (integers where they parse)."""
    knobs: dict[str, object] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        knobs[key.strip()] = int(value) if value.strip().isdigit() else value.strip()
    return knobs


def print_table(rows: list[dict]) -> None:
    cols = [c for c in ("ours_plain", "ours_gelu_tanh", "ours_silu", "ours_axpby", "ours_bias", "ours_gelu_tanh_only",
                        "addmm_act_gelu", "addmm_bias",
                        "addmm_beta_c", "unfused_gelu_tanh", "unfused_silu", "inductor_gelu_tanh", "inductor_silu")
            if c in rows[0]]
    print("| shape | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for r in rows:
        print(f"| {'x'.join(map(str, r['shape']))} | " + " | ".join(f"{r[c]:.1f}" for c in cols) + " |")
    keys = list(rows[0]["ratios"])
    print("\n| shape | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for r in rows:
        print(f"| {'x'.join(map(str, r['shape']))} | " + " | ".join(f"{r['ratios'][k]:.3f}" for k in keys) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
