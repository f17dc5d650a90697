"""A mixture-of-experts block's training step on generated grouped kernels, next to the same block on
torch._grouped_mm.

    python examples/moe_block.py                                  # 64 experts, top-8, d 2048, intermediate 1024
    python examples/moe_block.py --experts 8 --top-k 2 --d 4096 --intermediate 14336 --tokens 4096
    python examples/moe_block.py --routing dirichlet --json out.json

The block (Mixtral's, OLMoE's, Qwen-MoE's): a router (Linear(d, E), softmax, the top-k experts of each token, their
weights renormalised), the routed rows sorted by expert (the groups), each expert's MLP as two grouped GEMMs (gate and
up fused, W1 (E, 2I, d); silu(gate) * up; down, W2 (E, d, I)), and each token's k results weighted and summed. The
routing can be skewed as real routers are (``--routing``: a fixed bias on the router's logits from a Dirichlet(0.3)
or Zipf(1.2) popularity, as benchmarks/bench_moe.py routes), so the groups are uneven and some may be empty.

Two copies of the block share the weights: ``ours`` runs the grouped GEMMs as ``op.grouped(rows, W.transpose(1, 2),
offsets)`` on ops planned by ``Gemm("bf16", "tn", n=, k=, batch=E, m=rows per expert, ragged=True)`` (their
backward: the grouped formula, docs/grouped.md), ``torch`` as ``torch._grouped_mm``. One training step is forward,
a loss, backward. The script checks that both copies' loss and every gradient agree within the bf16 bound, then times
the step of each (median of CUDA-event timings after warm-up, interleaved), and prints one table (and JSON with
``--json``).

Without a GPU it plans the two grouped GEMMs for sm_90 (H100), prints the plans, says what it skipped, and exits 0.
Exit status 1 when the copies disagree.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Callable

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # planning does not need torch
    torch = None

from generator import Gemm

REL_BOUND = 2e-2    # two bf16 results, each within 1e-2 of the exact one
ROUTINGS = ("uniform", "dirichlet", "zipf")

#: A grouped product: (rows sorted by group, W (E, N, K), int32 group ends) -> rows @ W[g].t() per group.
GroupedMM = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experts", type=int, default=64, help="experts E (default 64)")
    p.add_argument("--top-k", type=int, default=8, help="experts per token (default 8)")
    p.add_argument("--d", type=int, default=2048, help="model width (default 2048)")
    p.add_argument("--intermediate", type=int, default=1024, help="each expert's MLP width I (default 1024)")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per step (default 8192)")
    p.add_argument("--routing", choices=ROUTINGS, default="uniform", help="the router's skew (default uniform)")
    p.add_argument("--iters", type=int, default=20, help="timed steps per copy (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write the table's row and the checks here")
    p.add_argument("--profile", action="store_true",
                   help="also profile a few steps of each copy: GPU time per kernel and the step's busy share")
    return p.parse_args(argv)


def expected_rows(args: argparse.Namespace) -> int:
    """The rows an expert gets on average: what the grouped ops are planned for."""
    return max(1, args.tokens * args.top_k // args.experts)


def plans(args: argparse.Namespace, arch: int | None = None) -> tuple[Gemm, Gemm]:
    """The gate-and-up and the down grouped GEMMs' plans (``arch=90`` plans for an H100 without a GPU), for groups of
    about ``expected_rows`` rows that vary with the routing (``ragged=True``)."""
    m = expected_rows(args)
    up = Gemm("bf16", "tn", m=m, n=2 * args.intermediate, k=args.d, batch=args.experts, ragged=True, arch=arch)
    down = Gemm("bf16", "tn", m=m, n=args.d, k=args.intermediate, batch=args.experts, ragged=True, arch=arch)
    return up, down


def router_bias(experts: int, routing: str, generator: "torch.Generator") -> "torch.Tensor":
    """A fixed bias on the router's logits that makes expert e about popularity[e] times as likely (zeros: uniform)."""
    if routing == "uniform":
        return torch.zeros(experts)
    if routing == "dirichlet":
        popularity = torch.distributions.Dirichlet(torch.full((experts,), 0.3)).sample()
    else:
        ranks = torch.randperm(experts, generator=generator).float() + 1
        popularity = ranks ** -1.2
    return (popularity / popularity.sum()).clamp_min(1e-9).log()


def route(logits: "torch.Tensor", top_k: int) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """Top-k routing of (T, E) logits: the token of each routed row, sorted by expert (stable: by token within an
    expert); its weight; the int32 group ends, one per expert."""
    experts = logits.shape[1]
    probs = logits.float().softmax(dim=-1)
    weights, picked = probs.topk(top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    order = picked.flatten().argsort(stable=True)
    tokens = order // top_k
    ends = torch.bincount(picked.flatten(), minlength=experts).cumsum(0).to(torch.int32)
    return tokens, weights.flatten()[order], ends


def moe_block(x: "torch.Tensor", router: "torch.Tensor", bias: "torch.Tensor", w1: "torch.Tensor",
              w2: "torch.Tensor", top_k: int, up: GroupedMM, down: GroupedMM) -> "torch.Tensor":
    """The block's output (T, d) for x (T, d): route, the experts' MLP as two grouped products, combine."""
    tokens, weights, ends = route(x @ router.t() + bias, top_k)
    rows = x[tokens]
    gate, lin = up(rows, w1, ends).chunk(2, dim=-1)
    h = down(F.silu(gate) * lin, w2, ends)
    return torch.zeros_like(x).index_add_(0, tokens, (h.float() * weights[:, None]).to(x.dtype))


def ours(op) -> GroupedMM:
    return lambda rows, w, ends: op.grouped(rows, w.transpose(1, 2), ends)


def torch_grouped_mm(rows: "torch.Tensor", w: "torch.Tensor", ends: "torch.Tensor") -> "torch.Tensor":
    return torch._grouped_mm(rows, w.transpose(1, 2), offs=ends)


def rel(a: "torch.Tensor", b: "torch.Tensor") -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def kernel_times(step: Callable[[], object], steps: int = 3) -> dict:
    """GPU time per kernel over `steps` training steps (ms per step, the largest first) and the share of the steps'
    wall time the GPU was busy (low: the step waits on the host)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(steps):
            step()
        end.record()
        end.synchronize()
    per_kernel = {e.key: e.device_time_total / 1e3 / steps for e in prof.key_averages() if e.device_time_total > 0}
    busy = sum(per_kernel.values())
    return {"kernels_ms": dict(sorted(per_kernel.items(), key=lambda kv: -kv[1])), "gpu_busy_ms": busy,
            "wall_ms": start.elapsed_time(end) / steps}


def print_profile(name: str, prof: dict, top: int = 10) -> None:
    print(f"{name}: GPU busy {prof['gpu_busy_ms']:.3f} of {prof['wall_ms']:.3f} ms per step (profiled)")
    for kernel, ms in list(prof["kernels_ms"].items())[:top]:
        print(f"  {ms:8.3f} ms  {kernel[:110]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if torch is None or not torch.cuda.is_available():
        for what, plan in zip(("gate and up", "down"), plans(args, arch=90)):
            print(f"# {what}: {args.experts} experts x ~{expected_rows(args)} rows\n{plan}\n")
        print("no CUDA GPU here: planned the block's two grouped GEMMs for sm_90 (above); skipped building them, "
              "the training steps, the checks against torch._grouped_mm and the timings")
        return 0
    torch.manual_seed(args.seed)   # (the Dirichlet popularity draws from the global generator)
    gen = torch.Generator().manual_seed(args.seed)
    dev = torch.device("cuda")
    E, d, inter = args.experts, args.d, args.intermediate
    params = {
        "router": torch.randn(E, d, generator=gen) / d ** 0.5,
        "w1": torch.randn(E, 2 * inter, d, generator=gen) / d ** 0.5,
        "w2": torch.randn(E, d, inter, generator=gen) / inter ** 0.5,
    }
    bias = router_bias(E, args.routing, gen).to(dev)
    x0 = torch.randn(args.tokens, d, generator=gen).to(dev, torch.bfloat16)
    copies = {name: {k: v.to(dev, torch.bfloat16).requires_grad_() for k, v in params.items()}
              for name in ("ours", "torch")}
    up_op, down_op = (p.compile() for p in plans(args))
    products = {"ours": (ours(up_op), ours(down_op)), "torch": (torch_grouped_mm, torch_grouped_mm)}

    def step(name: str) -> tuple["torch.Tensor", "torch.Tensor"]:
        p = copies[name]
        for t in p.values():
            t.grad = None
        x = x0.detach().requires_grad_()
        y = moe_block(x, p["router"], bias, p["w1"], p["w2"], args.top_k, *products[name])
        loss = y.float().pow(2).mean()
        loss.backward()
        return loss.detach(), x.grad

    losses, dx = {}, {}
    for name in copies:
        losses[name], dx[name] = step(name)
    checks = {"loss": rel(losses["ours"], losses["torch"]), "dx": rel(dx["ours"], dx["torch"])}
    checks.update({f"d{k}": rel(copies["ours"][k].grad, copies["torch"][k].grad) for k in params})
    _, _, ends = route(x0 @ copies["torch"]["router"].detach().t() + bias, args.top_k)
    sizes = torch.diff(ends, prepend=ends.new_zeros(1)).tolist()

    times: dict[str, list[float]] = {name: [] for name in copies}
    for _ in range(3):                      # warm-up: builds the backward kernels, allocator
        for name in copies:
            step(name)
    for _ in range(args.iters):             # interleaved, so that clocks and temperature drift alike
        for name in copies:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(name)
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    ms = {name: statistics.median(v) for name, v in times.items()}
    profiles = {name: kernel_times(lambda name=name: step(name)) for name in copies} if args.profile else {}
    worst = max(checks.values())
    print(f"MoE block: {E} experts, top-{args.top_k}, d {d}, intermediate {inter}, {args.tokens} tokens, "
          f"{args.routing} routing (groups of {min(sizes)} to {max(sizes)} rows, {sizes.count(0)} empty)")
    print(f"kernels: {up_op.name} | {down_op.name}")
    print("| copy | training step ms | torch / copy |\n|---|---|---|")
    for name in copies:
        print(f"| {name} | {ms[name]:.3f} | {ms['torch'] / ms[name]:.3f} |")
    print("agreement with torch._grouped_mm (rel. difference): "
          + ", ".join(f"{k} {v:.1e}" for k, v in checks.items()) + f" (bound {REL_BOUND})")
    for name, prof in profiles.items():
        print_profile(name, prof)
    if args.json:
        args.json.write_text(json.dumps({
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args) | {"json": None},
            "group_sizes": sizes, "ours_ms": ms["ours"], "torch_ms": ms["torch"], "speedup": ms["torch"] / ms["ours"],
            "kernels": [up_op.name, down_op.name], "checks": checks, "profiles": profiles}, indent=1))
    return 0 if worst <= REL_BOUND else 1


if __name__ == "__main__":
    sys.exit(main())
