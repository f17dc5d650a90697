"""A transformer MLP block on generated kernels, eager and under torch.compile, next to the stock layers.

    python examples/mlp_block.py                     # d=4096, 4096 tokens, bf16, forward
    python examples/mlp_block.py --train             # also time forward + backward
    python examples/mlp_block.py --d 1024 --tokens 8192

The block is x -> Linear(d, 4d) -> GELU -> Linear(4d, d). ``generator.nn.replace_linear`` swaps both
Linear layers of a copy of the model for ``generator.nn.Linear`` (same weights): the first with its bias
and the GELU fused into the kernel's epilogue (the GELU module becomes nn.Identity), the second with its
bias fused. Four variants are timed: stock eager, stock compiled, ours
eager, ours compiled; each prints ms (median of CUDA-event timings after warmup), TFLOP/s, and the relative
difference ||y - y_stock|| / ||y_stock|| of its output from the stock eager one; the largest is printed last.

Without a GPU it plans the two layers' kernels for sm_90 (H100), prints the plans, says what it skipped,
and exits 0. Exit status 1 when a variant differs from the stock layers by more than the bf16 bound.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys

try:
    import torch
    from torch import nn
except ImportError:  # planning does not need torch
    torch = None

from generator import Gemm

REL_BOUND = 2e-2  # two bf16 results, each within 1e-2 of the exact one


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=4096, help="model width d; the hidden width is 4d (default 4096)")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per batch, the GEMMs' M (default 4096)")
    p.add_argument("--train", action="store_true", help="also time forward + backward")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per variant (default 20)")
    return p.parse_args()


def median_ms(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def mlp(d: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))


def run_on_gpu(args: argparse.Namespace) -> int:
    from generator.nn import replace_linear

    d, tokens = args.d, args.tokens
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    stock = mlp(d).to("cuda", torch.bfloat16)
    ours = copy.deepcopy(stock)
    swapped = replace_linear(ours, m=tokens)          # plans for this GPU with M = tokens; builds (cached)
    print(f"MLP block d={d}, hidden {4 * d}, {tokens} tokens, bf16 on {torch.cuda.get_device_name()}")
    print(f"replace_linear swapped {swapped} layers: {ours[0].op.name} (up), {ours[2].op.name} (down)\n")

    variants = {
        "stock eager": stock,
        "stock compiled": torch.compile(stock, fullgraph=True),
        "ours eager": ours,
        "ours compiled": torch.compile(ours, fullgraph=True),
    }
    x = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16)
    flops = 2 * tokens * d * (4 * d) * 2            # two GEMMs of 2*M*N*K each
    with torch.no_grad():
        y_ref = stock(x)
        rows, worst = [], 0.0
        for name, model in variants.items():
            y = model(x)                                   # the first call compiles
            diff = ((y.float() - y_ref.float()).norm() / y_ref.float().norm()).item()
            worst = max(worst, diff)
            ms = median_ms(lambda model=model: model(x), args.iters)
            rows.append((name, ms, diff))
    print(f"forward ({flops / 1e9:.1f} GFLOP)")
    print(f"  {'variant':<16} {'ms':>8} {'TFLOP/s':>8}  rel. difference from stock eager")
    for name, ms, diff in rows:
        print(f"  {name:<16} {ms:8.3f} {flops / ms / 1e9:8.1f}  {diff:.2e}")

    if args.train:
        train_flops = 3 * flops                         # forward, dx, dW
        g = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16)
        xg = x.detach().requires_grad_()

        def step(model):
            model(xg).backward(g)

        print(f"\nforward + backward ({train_flops / 1e9:.1f} GFLOP)")
        print(f"  {'variant':<16} {'ms':>8} {'TFLOP/s':>8}  rel. difference of dx from stock eager")
        stock.zero_grad(set_to_none=True)
        step(stock)
        dx_ref = xg.grad.clone()
        for name, model in variants.items():
            xg.grad = None
            step(model)
            diff = ((xg.grad.float() - dx_ref.float()).norm() / dx_ref.float().norm()).item()
            worst = max(worst, diff)
            ms = median_ms(lambda model=model: step(model), args.iters)
            print(f"  {name:<16} {ms:8.3f} {train_flops / ms / 1e9:8.1f}  {diff:.2e}")

    ok = worst <= REL_BOUND
    print(f"\nmax relative difference from the stock layers: {worst:.2e} (bound {REL_BOUND:.0e}) "
          f"{'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


def plan_without_gpu(args: argparse.Namespace) -> int:
    d, tokens = args.d, args.tokens
    print(f"MLP block d={d}, hidden {4 * d}, {tokens} tokens, bf16: the kernels replace_linear would plan "
          "for an H100 (sm_90):\n")
    for what, n, k, act in (("up   Linear(d, 4d) + GELU", 4 * d, d, "gelu"), ("down Linear(4d, d)", d, 4 * d, None)):
        plan = Gemm(dtype="bf16", layout="tn", arch=90, m=tokens, n=n, k=k, bias="col", activation=act)
        print(f"{what}: {plan.name}\n  why: {plan.why}")
    reason = "torch is not installed" if torch is None else "no CUDA GPU is visible"
    print(f"\nskipped: building the kernels, and running and timing the four variants (stock / ours, eager / "
          f"torch.compile) — {reason}")
    return 0


def main() -> int:
    args = parse_args()
    if torch is not None and torch.cuda.is_available():
        return run_on_gpu(args)
    return plan_without_gpu(args)


if __name__ == "__main__":
    sys.exit(main())
