"""Host time of torch.compile's guards on a stack of Linear layers, stock nn.Linear against replace_linear's layers.

A compiled call (every decode step of examples/generate.py's compiled rows) first checks the guards dynamo installed
on everything the traced code read: for a Linear layer, its parameters, and for ours also the attributes and methods
its forward reads (the op, the compute dtype, its helper methods). This times the guard check of one compiled forward
(``guard_manager.check`` of its cache entry, the best of 3 loops of 1000 calls right after its compile, and
the best of 21 once both are compiled, stock's and ours interleaved: the two read 20-40x apart, for a reason not
found) and counts the guard tree's lines. It runs on the
CPU with the tests' reference ops (test_autograd_cpu.ReferenceOp), so it measures the guards' cost, not a GPU step.
CPU tensors take the layer's general path; ``--path fast`` drops the CUDA test from ``Linear._takes_as_is`` so that
they take the code a CUDA call takes (the guards a GPU model gets).

    python benchmarks/guard_time.py [--layers 56] [--width 64] [--path fast]
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
import test_autograd_cpu  # noqa: E402
from generator import nn as gnn  # noqa: E402

STOCK: nn.Module | None = None
OURS: nn.Module | None = None


def forward_stock(x: torch.Tensor) -> torch.Tensor:
    return STOCK(x)


def forward_ours(x: torch.Tensor) -> torch.Tensor:
    return OURS(x)


def takes_as_is_on_any_device(self: gnn.Linear, x: torch.Tensor, w: torch.Tensor) -> bool:
    """Linear._takes_as_is without its CUDA test."""
    return (x.dtype == self.compute_dtype and w.dtype == self.compute_dtype and x.device == w.device and x.dim() > 0
            and x.shape[-1] == w.shape[1] and x.is_contiguous() and w.is_contiguous())


def best_us(fn, reps: int) -> float:
    for _ in range(50):
        fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - start) / reps * 1e6)
    return min(times)


def main() -> None:
    global STOCK, OURS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=56)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--path", choices=("general", "fast"), default="general")
    args = p.parse_args()
    if args.path == "fast":
        gnn.Linear._takes_as_is = takes_as_is_on_any_device
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    gnn.compile_many = lambda configs, **kw: [test_autograd_cpu.ReferenceOp(c, "gemmgen_guards") for c in configs]
    torch.manual_seed(0)
    stock = nn.Sequential(*[nn.Linear(args.width, args.width, bias=False) for _ in range(args.layers)])
    stock = stock.to(torch.bfloat16)
    ours = copy.deepcopy(stock)
    gnn.replace_linear(ours, arch=90, dtype=torch.bfloat16)
    x = torch.randn(1, args.width, dtype=torch.bfloat16)
    STOCK, OURS = stock, ours
    guards, frame, first = {}, {"x": x}, {}
    with torch.no_grad():
        torch._dynamo.reset()
        for name, fn in (("stock", forward_stock), ("ours", forward_ours)):
            torch.compile(fn, backend="eager", fullgraph=True)(x)
            guards[name] = _debug_get_cache_entry_list(fn.__code__)[-1].guard_manager
            assert guards[name].check(frame)
            first[name] = best_us(lambda: guards[name].check(frame), reps=1000)   # noqa: B023
    best = {name: float("inf") for name in guards}
    for _ in range(7):   # interleaved rounds: the machine's speed drifts between runs by more than the difference
        for name, check in guards.items():
            best[name] = min(best[name], best_us(lambda: check.check(frame), reps=1000))   # noqa: B023
    for name in guards:
        print(f"{name:6s} {args.layers} layers, {args.path} path: guard check {first[name]:.2f} us right after its "
              f"compile, {best[name]:.2f} us once both are compiled (interleaved); guard tree "
              f"{len(str(guards[name]).splitlines())} lines", flush=True)

if __name__ == "__main__":
    main()
