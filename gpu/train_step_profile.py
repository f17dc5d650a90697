"""One GPU's training step of tests/gpu/test_fsdp.py's MLP stack (4 residual blocks of Linear(d, 4d) -> GELU ->
Linear(4d, d), then Linear(d, d); bf16, AdamW, 4 x 256 tokens), stock against replace_linear's layers (GELU fused,
and not), without FSDP: the step time (median of interleaved steps, benchmarks/bench.py interleaved_rounds), then
torch.profiler's tables for one step of each, CPU self time and the CUDA kernels. Says whether the FSDP2 MLP stack's
gap (docs/torch.md) is our layers' own. Writes $OUT/train_step_profile_<variant>.txt.

    python3 gpu/train_step_profile.py
"""
from __future__ import annotations

import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench import interleaved_rounds  # noqa: E402
from generator.nn import replace_linear  # noqa: E402
from test_fsdp_cpu import Block  # noqa: E402  (the FSDP2 tests' MLP stack block)

OUT = Path(os.environ.get("OUT", "."))
D, BLOCKS, TOKENS, STEPS, WARMUP = 512, 4, 1024, 30, 5


def wall_ms(step) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def step_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x).float(), y.float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
    return step


def main() -> None:
    torch.manual_seed(0)
    stock = nn.Sequential(*[Block(D) for _ in range(BLOCKS)], nn.Linear(D, D)).cuda().to(torch.bfloat16)
    models = {"stock": stock}
    for fuse in (True, False):
        ours = copy.deepcopy(stock)
        replace_linear(ours, m=TOKENS, fuse_activations=fuse)
        models["ours fused gelu" if fuse else "ours"] = ours
    x = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(TOKENS, D, device="cuda", dtype=torch.bfloat16)
    steps = {name: step_fn(m, x, y) for name, m in models.items()}
    for step in steps.values():
        for _ in range(WARMUP):
            step()
    times = interleaved_rounds(steps, STEPS, wall_ms)
    base = statistics.median(times["stock"])
    for name, t in times.items():
        print(f"{name:16s} step {statistics.median(t):7.3f} ms (stock / this {base / statistics.median(t):.3f}x)")
    for name, step in steps.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        avg = prof.key_averages()
        text = (avg.table(sort_by="self_cpu_time_total", row_limit=30) + "\n"
                + avg.table(sort_by="self_cuda_time_total", row_limit=20))
        (OUT / f"train_step_profile_{name.replace(' ', '_')}.txt").write_text(text)
        print(f"--- {name}\n{avg.table(sort_by='self_cuda_time_total', row_limit=12)}", flush=True)


if __name__ == "__main__":
    main()
