"""Where a list call of 128 small problems (64 x 768 x 2048, bf16) spends its time on the host: the op as users call
it, the torch.ops overload, the overload below autograd, the offsets form on the same rows, and the allocation of 128
outputs alone (docs/grouped.md, "The list form's kernel"). Prints host time (until the calls are queued) and wall time
per call; then a cProfile of the Python side, and torch.profiler's CPU table of calls below autograd (the aten ops the
C++ kernel runs inside, e.g. the outputs' allocations, beside its own time).
    python3 gpu/list_host_time.py
"""
from __future__ import annotations

import cProfile
import io
import pstats
import time
from typing import Callable

import torch

from generator import Gemm

PROBLEMS, M, N, K = 128, 64, 768, 2048


def per_call_us(fn: Callable[[], object], calls: int = 200) -> tuple[float, float]:
    """(host, wall) microseconds per call: until `calls` calls were queued, and until they ran."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    queued = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    return (queued - start) / calls * 1e6, (done - start) / calls * 1e6


def main() -> None:
    op = Gemm("bf16", "tn", arch=90, m=M, n=N, k=K, batch=PROBLEMS).compile()
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    As = [torch.randn(M, K, **bf16) for _ in range(PROBLEMS)]
    Ws = [torch.randn(N, K, **bf16) for _ in range(PROBLEMS)]
    Bs = [w.t() for w in Ws]
    x, W = torch.cat(As), torch.stack(Ws).transpose(1, 2)
    offsets = torch.arange(1, PROBLEMS + 1, device="cuda", dtype=torch.int32) * M
    overload = getattr(getattr(torch.ops, op.namespace), op.name).grouped_list

    def below_autograd() -> list[torch.Tensor]:
        with torch._C._AutoDispatchBelowAutograd():
            return overload(As, Bs)

    cases: list[tuple[str, Callable[[], object]]] = [
        ("op.grouped_list", lambda: op.grouped_list(As, Bs)),
        ("torch.ops grouped_list", lambda: overload(As, Bs)),
        ("below autograd", below_autograd),
        ("offsets form", lambda: op.grouped(x, W, offsets)),
        (f"{PROBLEMS} x torch.empty", lambda: [torch.empty(M, N, **bf16) for _ in range(PROBLEMS)]),
        (f"one empty + {PROBLEMS} views", lambda: torch.empty(PROBLEMS, M, N, **bf16).unbind(0)),
    ]
    for name, fn in cases:
        host, wall = per_call_us(fn)
        print(f"{name:28s} host {host:8.1f} us/call   wall {wall:8.1f} us/call")
    with torch.no_grad():
        host, wall = per_call_us(lambda: op.grouped_list(As, Bs))
    print(f"{'op.grouped_list no_grad':28s} host {host:8.1f}   wall {wall:8.1f}")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(100):
        op.grouped_list(As, Bs)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(14)
    print(text.getvalue())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            below_autograd()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
