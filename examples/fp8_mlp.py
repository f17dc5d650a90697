"""A Llama MLP block in fp8 with DeepSeek's block scales end to end, against the same block in bf16 on cuBLAS.

    python examples/fp8_mlp.py                            # hidden 4096, intermediate 14336, 4096 tokens
    python examples/fp8_mlp.py --tokens 1024 --hidden 2048 --intermediate 8192

The block is y = down(silu(gate(x)) * up(x)). The fp8 version (three generated kernels, each an fp8 GEMM with
1x128 scales of its activations and 128x128 scales of its weights):

    x8, sx = quantize(x, "e4m3", scale="block")                       # the block's input (the one quantize kernel)
    u = up_op(x8, Wu8.t(), sx, su)                                    # bf16
    h8, sh = gate_op(x8, Wg8.t(), sx, sg, u)                          # silu(acc) * u, quantized on store: e4m3
    y = down_op(h8, Wd8.t(), sh, sd)                                  # bf16

so the intermediate activation is written once, in fp8, with the scales the down projection reads, by the gate
GEMM's own epilogue. It is timed against the bf16 block on torch.matmul (cuBLAS) and against torch._scaled_mm
with rowwise scales and separate quantize kernels (torch has no 1x128 block scales on this GPU); each prints ms
(median of CUDA-event timings after warmup) and its relative difference from the bf16 block in float32.

Without a GPU it plans the three kernels for sm_90 (H100), prints them, says what it skipped, and exits 0. Exit
status 1 when the fp8 block differs from the bf16 one by more than fp8's bound.
"""
from __future__ import annotations

import argparse
import statistics
import sys

try:
    import torch
except ImportError:  # planning does not need torch
    torch = None

from generator import Gemm
from generator import epilogue as ep

#: ||y_fp8 - y_bf16|| / ||y_bf16||: three fp8 GEMMs whose inputs keep 3 mantissa bits (e4m3, relative spacing
#: 2^-3 at worst, about 2^-5 in the mean over a block's values), the errors adding up over the block.
REL_BOUND = 0.1


def silu_times_up(acc, up: ep.Matrix):
    """The gate GEMM's epilogue: silu of its sums times the up projection's output."""
    return ep.silu(acc) * up


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=4096, help="model width (default 4096)")
    p.add_argument("--intermediate", type=int, default=14336, help="MLP width (default 14336, Llama-3-8B's)")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per batch, the GEMMs' M (default 4096)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per variant (default 20)")
    return p.parse_args(argv)


def plans(hidden: int, intermediate: int, tokens: int, arch: int | None = None) -> dict[str, Gemm]:
    """The block's three fp8 kernels, planned for its shapes."""
    fp8 = dict(layout="tn", arch=arch, scale="block", m=tokens)
    return {"up": Gemm("e4m3", n=intermediate, k=hidden, **fp8),
            "gate": Gemm("e4m3", n=intermediate, k=hidden, epilogue=silu_times_up, out_dtype="e4m3", **fp8),
            "down": Gemm("e4m3", n=hidden, k=intermediate, **fp8)}


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


def rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x in e4m3 with one fp32 scale per row, as torch._scaled_mm's rowwise mode takes it ((rows, 1))."""
    from generator import quantize
    q, s = quantize(x, "e4m3", scale="row")
    return q, s[:, None]


def run_on_gpu(args: argparse.Namespace) -> int:
    from generator import quantize
    from generator.runtime import compile_many

    d, inter, tokens = args.hidden, args.intermediate, args.tokens
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.randn(tokens, d, device="cuda").bfloat16()
    wg, wu = (torch.randn(inter, d, device="cuda") / d ** 0.5 for _ in range(2))
    wd = torch.randn(d, inter, device="cuda") / inter ** 0.5
    wg, wu, wd = wg.bfloat16(), wu.bfloat16(), wd.bfloat16()

    planned = plans(d, inter, tokens)
    up_op, gate_op, down_op = compile_many([p.config for p in planned.values()], namespace="gemmgen_fp8_mlp")
    print(f"Llama MLP block: hidden {d}, intermediate {inter}, {tokens} tokens on {torch.cuda.get_device_name()}")
    for (what, plan), op in zip(planned.items(), (up_op, gate_op, down_op)):
        print(f"  {what:<5} {op.name}")

    # weights quantized once, ahead of time (128x128 blocks), as a served model stores them
    (wg8, sg), (wu8, su), (wd8, sd) = (quantize(w, "e4m3", scale="block", block=(128, 128)) for w in (wg, wu, wd))

    def fp8_block():
        x8, sx = quantize(x, "e4m3", scale="block")
        u = up_op(x8, wu8.t(), sx, su)
        h8, sh = gate_op(x8, wg8.t(), sx, sg, u)
        return down_op(h8, wd8.t(), sh, sd)

    def bf16_block():
        return (torch.nn.functional.silu(x @ wg.t()) * (x @ wu.t())) @ wd.t()

    (wg8r, sgr), (wu8r, sur), (wd8r, sdr) = (rowwise(w) for w in (wg, wu, wd))

    def scaled_mm_block():
        x8, sx = rowwise(x)
        g = torch._scaled_mm(x8, wg8r.t(), scale_a=sx, scale_b=sgr.t(), out_dtype=torch.bfloat16)
        u = torch._scaled_mm(x8, wu8r.t(), scale_a=sx, scale_b=sur.t(), out_dtype=torch.bfloat16)
        h8, sh = rowwise(torch.nn.functional.silu(g) * u)
        return torch._scaled_mm(h8, wd8r.t(), scale_a=sh, scale_b=sdr.t(), out_dtype=torch.bfloat16)

    with torch.no_grad():
        ref = ((torch.nn.functional.silu(x.float() @ wg.float().t()) * (x.float() @ wu.float().t()))
               @ wd.float().t())
        rows = []
        for name, block in (("bf16, cuBLAS", bf16_block), ("fp8, torch._scaled_mm rowwise", scaled_mm_block),
                            ("fp8 block scales, ours", fp8_block)):
            y = block()
            diff = ((y.float() - ref).norm() / ref.norm()).item()
            rows.append((name, median_ms(block, args.iters), diff))
        # where the fp8 block's time goes: each of its four kernels (or torch ops) alone
        x8, sx = quantize(x, "e4m3", scale="block")
        u = up_op(x8, wu8.t(), sx, su)
        h8, sh = gate_op(x8, wg8.t(), sx, sg, u)
        stages = {"quantize(x)": lambda: quantize(x, "e4m3", scale="block"),
                  "up": lambda: up_op(x8, wu8.t(), sx, su),
                  "gate, silu * up, quantized": lambda: gate_op(x8, wg8.t(), sx, sg, u),
                  "down": lambda: down_op(h8, wd8.t(), sh, sd)}
        stage_ms = {name: median_ms(call, args.iters) for name, call in stages.items()}
    flops = 2 * tokens * d * inter * 3
    base = rows[0][1]
    print(f"\n  {'block':<30} {'ms':>8} {'TFLOP/s':>8} {'speedup':>8}  rel. difference from float32")
    for name, ms, diff in rows:
        print(f"  {name:<30} {ms:8.3f} {flops / ms / 1e9:8.1f} {base / ms:7.2f}x  {diff:.2e}")
    print("\n  the fp8 block's kernels alone:")
    for name, ms in stage_ms.items():
        gemm = 2 * tokens * d * inter if name != "quantize(x)" else 0
        print(f"  {name:<30} {ms:8.3f}" + (f" {gemm / ms / 1e9:8.1f} TFLOP/s" if gemm else ""))
    worst = rows[-1][2]
    ok = worst <= REL_BOUND
    print(f"\nfp8 block's relative difference from float32: {worst:.2e} (bound {REL_BOUND:.0e}) "
          f"{'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


def plan_without_gpu(args: argparse.Namespace) -> int:
    print(f"Llama MLP block in fp8 (hidden {args.hidden}, intermediate {args.intermediate}, {args.tokens} tokens): "
          "the kernels for an H100 (sm_90):\n")
    for what, plan in plans(args.hidden, args.intermediate, args.tokens, arch=90).items():
        print(f"{what}: {plan.name}\n  why: {plan.why}")
    reason = "torch is not installed" if torch is None else "no CUDA GPU is visible"
    print(f"\nskipped: building the kernels, and running and timing the block (ours, bf16 cuBLAS, torch._scaled_mm) "
          f"— {reason}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if torch is not None and torch.cuda.is_available():
        return run_on_gpu(args)
    return plan_without_gpu(args)


if __name__ == "__main__":
    sys.exit(main())
