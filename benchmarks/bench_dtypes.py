"""Benchmark the data types beyond 16-bit: our kernels next to torch's own kernel of the same type, in one run.

    python benchmarks/bench_dtypes.py [--modes fp8_tensor,fp8_tensor_fast,fp8_row,fp8_block,tf32,tf32_nt] [--shapes ...]
        [--rounds 3] [--json out.json] [--variant t192=tile_shape:128x192x128,cluster_shape:1x2 ...]

--variant adds rows with the planner's choice overridden by Gemm knobs (name=knob:value,...; a tuple as AxBxC;
tile:BMxBN is tile_shape with each type's BK), labelled mode@name, next to the planner's own rows: the
measurements behind the planner's fp8/int8/tf32 tables. define:MACRO=VALUE (several joined by +) builds the
variant's kernels with those preprocessor switches of the templates' experiments instead (as gpu/ab_variants.py,
which takes no epilogue operands), e.g. --variant trim=define:GEMMGEN_SOME_SWITCH=1; stream_k:1 sets
KernelConfig.stream_k (not planned yet), e.g. --variant sk=stream_k:1,schedule:cooperative,cluster_shape:1x1;
interleave_k:1 is Gemm's interleave_k=True (a 64-row cooperative tile with K interleaved), e.g. --variant
ik96=tile:64x96,interleave_k:1; interleave_k:0 is interleave_k=False, the planner's pick without its interleaved-K
rule (planner rule 22), the A/B of that rule.

Rows (layout tn: A row-major M x K, B = W.t() of a row-major N x K weight W, as torch._scaled_mm and
torch._int_mm take them):
  fp8_tensor  e4m3 -> bf16, one fp32 scale per operand, k tiles promoted into fp32
                                                         vs torch._scaled_mm, and its use_fast_accum=True
  fp8_tensor_fast  the same with fast_accum=True (all of K inside wgmma)  vs the same two
  fp8_row     e4m3 -> bf16, a scale per row of A / col of B  vs torch._scaled_mm rowwise
  fp8_block   e4m3 -> bf16, 1x128 scales of A, 128x128 of B  vs torch._scaled_mm blockwise and our fp8_tensor
  int8        int8 -> int32                              vs torch._int_mm
  tf32        fp32 in, tf32 tensor cores, fp32 out       vs torch.matmul with TF32 allowed
  tf32_nn, tf32_nt, tf32_tt   the same in the other layouts (A column-major for nn and nt, B row-major for nt and tt:
              the sm90 kernel transposes those tiles in shared memory)  vs torch.matmul on the same strided tensors
Times are triton.testing.do_bench medians (ms), measured --rounds times in interleaved order, the median of the
rounds kept; TFLOP/s (TOPS for int8) = 2*M*N*K / time. Every row is also checked against a float64 reference of
the same quantized inputs and scales, so a fast wrong kernel cannot hide here.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import parse_shapes, tflops  # noqa: E402
from generator import Gemm, quantize  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from generator.spec.config import KernelConfig, sm90_block_k  # noqa: E402
from generator.spec.types import DType  # noqa: E402

TF32_MODES = {"tf32": "tn", "tf32_nn": "nn", "tf32_nt": "nt", "tf32_tt": "tt"}   # mode -> layout
MODES = ("fp8_tensor", "fp8_tensor_fast", "fp8_row", "fp8_block", "int8", *TF32_MODES)
DEFAULT_MODES = MODES
SHAPES = "8192x8192x8192,4096x14336x4096,4096x4096x4096,128x4096x4096"
#: ||D - ref|| / ||ref|| a row must meet (the tests' bounds; bf16 output rounding dominates fp8's).
BOUNDS = {"fp8_tensor": 1e-2, "fp8_tensor_fast": 1e-2, "fp8_row": 1e-2, "fp8_block": 1e-2, "int8": 0.0,
          **{mode: 2e-3 for mode in TF32_MODES}}


@dataclass
class Row:
    mode: str
    m: int
    n: int
    k: int
    kernel: str
    ours_ms: float
    ours_tflops: float
    baselines: dict[str, float]          # name -> TFLOP/s
    ratios: dict[str, float]             # name -> ours / baseline
    rel_error: float


@dataclass
class Case:
    """One mode at one shape: our call, the baselines' calls, and the float64 reference of our output."""

    plan: Gemm
    args: tuple
    baselines: dict[str, Callable[[], torch.Tensor]]
    reference: Callable[[], torch.Tensor]


#: Variant knobs that are not Gemm's: template switches (define) and config fields not yet planned (stream_k).
CONFIG_ONLY_KNOBS = ("define", "stream_k")


def parse_variant(text: str) -> tuple[str, dict[str, object]]:
    """'name=knob:value,...' -> (name, Gemm keyword arguments); values AxBxC become tuples, digits ints."""
    name, _, spec = text.partition("=")
    knobs: dict[str, object] = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition(":")
        if "x" in value and value.replace("x", "").isdigit():
            knobs[key] = tuple(int(v) for v in value.split("x"))
        else:
            knobs[key] = int(value) if value.isdigit() else value
    return name, knobs


def plan_for(mode: str, m: int, n: int, k: int, knobs: dict[str, object] | None = None) -> Gemm:
    knobs = {key: value for key, value in (knobs or {}).items() if key not in CONFIG_ONLY_KNOBS}
    if "interleave_k" in knobs:   # (parse_variant reads 0 / 1; Gemm takes a bool)
        knobs["interleave_k"] = bool(knobs["interleave_k"])
    if "tile" in knobs:
        dtype = DType("e4m3" if mode.startswith("fp8") else "tf32" if mode in TF32_MODES else mode)
        knobs["tile_shape"] = (*knobs.pop("tile"), sm90_block_k(dtype))
    hints = dict(arch=90, m=m, n=n, k=k, **knobs)
    if mode.startswith("fp8"):
        scale = mode.removeprefix("fp8_").removesuffix("_fast")
        return Gemm("e4m3", "tn", out_dtype="bf16", scale=scale, fast_accum=mode.endswith("_fast"), **hints)
    if mode == "int8":
        return Gemm("int8", "tn", out_dtype="int32", **hints)
    return Gemm("tf32", TF32_MODES[mode], **hints)


def fp8_case(mode: str, plan: Gemm, m: int, n: int, k: int) -> Case:
    scale = mode.removeprefix("fp8_").removesuffix("_fast")
    x, w = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
    a, sa = quantize(x, "e4m3", scale=scale)
    q, sw = quantize(w, "e4m3", scale=scale, block=(128, 128) if scale == "block" else None)
    b = q.t()
    ref_a, ref_b = dequantized(a, sa, scale, (1, 128)), dequantized(q, sw, scale, (128, 128)).t()
    baselines: dict[str, Callable[[], torch.Tensor]] = {}
    if scale == "tensor":
        baselines["scaled_mm"] = lambda: torch._scaled_mm(a, b, sa, sw, out_dtype=torch.bfloat16)
        baselines["scaled_mm_fast"] = lambda: torch._scaled_mm(a, b, sa, sw, out_dtype=torch.bfloat16,
                                                               use_fast_accum=True)
    elif scale == "row":
        baselines["scaled_mm_row"] = lambda: torch._scaled_mm(a, b, sa[:, None], sw[None, :], out_dtype=torch.bfloat16)
    elif scale == "block":
        blockwise = scaled_mm_blockwise(a, b, sa, sw, lambda: ref_a @ ref_b)
        if blockwise is not None:
            baselines["scaled_mm_block"] = blockwise
    return Case(plan, (a, b, sa, sw), baselines, lambda: ref_a @ ref_b)


def scaled_mm_blockwise(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sw: torch.Tensor,
                        reference: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor] | None:
    """torch._scaled_mm with DeepSeek's 1x128 x 128x128 scales (cuBLAS >= 12.9 on sm90), or None where this torch
    or shape has none. cuBLAS wants the 1x128 scales M-major (stride (1, M)) and W's (N/128, K/128) block scales as
    their transpose; `quantize()` gives both row-major, so A's are copied once here, outside the timing. The result is
    checked against the float64 reference: a scale layout cuBLAS read wrongly would give a plausible time and a
    wrong product."""
    sa_m_major = sa.t().contiguous().t()
    call = lambda: torch._scaled_mm(a, b, sa_m_major, sw.t(), out_dtype=torch.bfloat16)  # noqa: E731
    try:
        error = rel_error(call(), reference())
    except RuntimeError as exc:   # torch < 2.9, CUDA < 12.9, or K/128 not a multiple of 4 (cuBLAS pads to 4 blocks)
        print(f"no blockwise torch._scaled_mm at {tuple(a.shape)} x {tuple(b.shape)}: {str(exc).splitlines()[0]}")
        return None
    if error > BOUNDS["fp8_block"]:
        print(f"blockwise torch._scaled_mm off by {error:.1e} at {tuple(a.shape)} x {tuple(b.shape)}: not compared")
        return None
    return call


def dequantized(q: torch.Tensor, s: torch.Tensor, scale: str, block: tuple[int, int]) -> torch.Tensor:
    """q * s in float64, each scale spread over its block (generator.dequantize's convention)."""
    from generator import dequantize
    return dequantize(q, s, scale=scale, block=block if scale == "block" else None).double()


def int8_case(plan: Gemm, m: int, n: int, k: int) -> Case:
    a = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8).t()
    return Case(plan, (a, b), {"int_mm": lambda: torch._int_mm(a, b)}, lambda: a.double() @ b.double())


def tf32_case(plan: Gemm, m: int, n: int, k: int) -> Case:
    """fp32 A (M x K) and B (K x N) stored as the plan's layout says: 't' row-major, 'n' column-major."""
    layout = plan.config.layout
    a = torch.randn(m, k, device="cuda") if layout.a_k_major else torch.randn(k, m, device="cuda").t()
    b = torch.randn(n, k, device="cuda").t() if layout.b_k_major else torch.randn(k, n, device="cuda")

    def cublas_tf32() -> torch.Tensor:
        torch.backends.cuda.matmul.allow_tf32 = True
        return a @ b

    return Case(plan, (a, b), {"cublas_tf32": cublas_tf32}, lambda: a.double() @ b.double())


def build_ops(work: list, knobs_by_variant: dict[str, dict[str, object]]) -> list:
    """One op per row of ``work``: the planner's and knob variants' in one parallel build; a variant with
    preprocessor switches (define:...) built apart with them, its ops in a namespace of their own."""
    def defines(name: str) -> tuple[str, ...]:
        return tuple(f"-D{d}" for d in str(knobs_by_variant[name].get("define", "")).split("+") if d)

    def config(i: int) -> KernelConfig:
        name, plan = work[i][1], work[i][-1]
        return replace(plan.config, stream_k=True) if knobs_by_variant[name].get("stream_k") else plan.config

    ops: list = [None] * len(work)
    # the plain rows (every variant without switches) in one build, then each switched variant's rows in one build
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, (_, name, *_) in enumerate(work):
        groups.setdefault(defines(name), []).append(i)
    for flags, rows in groups.items():
        namespace = "gemmgen_bench_dtypes" + (f"_{work[rows[0]][1]}" if flags else "")
        for i, op in zip(rows, compile_many([config(i) for i in rows], namespace=namespace, extra_flags=flags)):
            ops[i] = op
    return ops


def make_case(mode: str, plan: Gemm, m: int, n: int, k: int) -> Case:
    if mode.startswith("fp8"):
        return fp8_case(mode, plan, m, n, k)
    return int8_case(plan, m, n, k) if mode == "int8" else tf32_case(plan, m, n, k)


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).norm() / ref.norm()).item()


def measure(mode: str, m: int, n: int, k: int, op, case: Case, rounds: int) -> Row:
    from triton.testing import do_bench
    ours = lambda: op(*case.args)  # noqa: E731
    error = rel_error(ours(), case.reference())
    calls = {"ours": ours, **case.baselines}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):
        names = list(calls) if r % 2 == 0 else list(reversed(calls))   # interleaved: no column always first
        for name in names:
            times[name].append(do_bench(calls[name], warmup=50, rep=300))
    ms = {name: statistics.median(t) for name, t in times.items()}
    base = {name: tflops(m, n, k, ms[name]) for name in case.baselines}
    ours_tflops = tflops(m, n, k, ms["ours"])
    return Row(mode, m, n, k, op.name, ms["ours"], ours_tflops, base,
               {name: ours_tflops / value for name, value in base.items()}, error)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"any of {', '.join(MODES)}")
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--variant", action="append", default=[], help="name=knob:value,... (see above)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(sorted(unknown))}: choose from {', '.join(MODES)}")
    shapes = parse_shapes(args.shapes)
    variants = [("", {})] + [parse_variant(v) for v in args.variant]
    work = [(mode, name, shape, plan_for(mode, *shape, knobs)) for mode in modes for shape in shapes
            for name, knobs in variants]
    ops = build_ops(work, dict(variants))
    rows: list[Row] = []
    ok = True
    for (mode, name, (m, n, k), plan), op in zip(work, ops):
        row = measure(mode, m, n, k, op, make_case(mode, plan, m, n, k), args.rounds)
        if name:
            row.mode = f"{mode}@{name}"
        # our fp8_block kernel beside our own per-tensor kernel at the same shape: what the block scales cost
        if mode == "fp8_block":
            peer = next((r for r in rows if r.mode == "fp8_tensor" and (r.m, r.n, r.k) == (m, n, k)), None)
            if peer is not None:
                row.baselines["ours_fp8_tensor"] = peer.ours_tflops
                row.ratios["ours_fp8_tensor"] = row.ours_tflops / peer.ours_tflops
        ok &= row.rel_error <= BOUNDS[mode]
        rows.append(row)
        base = "  ".join(f"{name} {value:7.1f} ({row.ratios[name]:.3f}x)" for name, value in row.baselines.items())
        print(f"{row.mode:10s} {m}x{n}x{k:<6d} ours {row.ours_tflops:7.1f}  {base}  err {row.rel_error:.1e}  "
              f"{row.kernel}", flush=True)
    if args.json:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": args.rounds}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
    if not ok:
        print("some rows exceed their error bound (BOUNDS)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
