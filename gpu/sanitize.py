"""One small ragged problem per sm90 schedule (and cluster shape), per sm80 epilogue, fused epilogues of both
families (a per-row and a per-column vector, an M x N operand and a scalar), fp8 with each kind of scales
and accumulation, int8, the small-M kernel (a few rows of A), a batched call per family (3 problems, one operand
shared with batch stride 0, the other's matrices a few rows apart), a grouped call (sm90: 4 experts of 0, 77, 130
and 1 rows, B's experts a few rows apart), a list call (sm90: ragged problems, an odd N, K = 0) and split-K (a
cooperative stream-K plan with fewer tiles than SMs), for compute-sanitizer:

    compute-sanitizer --tool memcheck  python3 gpu/sanitize.py
    compute-sanitizer --tool racecheck python3 gpu/sanitize.py

Kernels are built before the checked launches (a build launches nothing). D is written into a
NaN-poisoned buffer whose row pitch keeps the 16-byte rule, so that the epilogues through shared memory
(sm90's TMA stores, sm80's staged 16-byte stores) are what runs, and once more contiguous (pitch N, the
direct stores). Exits non-zero when a result is wrong; the sanitizer's own summary says whether it found
errors.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from generator import Gemm  # noqa: E402
from generator import epilogue as ep  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from generator.runtime.evaluate import evaluate, operand_values  # noqa: E402

# (schedule, tile, cluster, layout): each schedule, each cluster shape, K-major and M/N-major operands.
CASES = (
    ("cooperative", (128, 256, 64), (2, 1), "tn"),
    ("cooperative", (128, 128, 64), (1, 2), "nt"),
    ("ws", (128, 128, 64), (1, 1), "nn"),
    ("pingpong", (64, 256, 64), (1, 1), "tt"),
    ("pingpong", (128, 128, 64), (2, 1), "tn"),
    ("cooperative", (128, 256, 64), (2, 2), "nt"),
    ("pingpong", (64, 128, 64), (4, 1), "tn"),
    ("ws", (128, 128, 64), (1, 4), "tt"),       # 3 tile columns: the cluster's fourth block has no tile
)
M, N, K = 193, 321, 200   # ragged in all three, several tiles and k tiles, pingpong turns taken


def operand(rows: int, cols: int, row_major: bool) -> torch.Tensor:
    if row_major:
        return torch.randn(rows, -(-cols // 8) * 8, device="cuda").bfloat16()[:, :cols]
    return torch.randn(cols, -(-rows // 8) * 8, device="cuda").bfloat16()[:, :rows].t()


# (tile, warps, layout, output dtype): the sm80 family, 16-bit and fp32 output through the staged epilogue.
SM80_CASES = (((128, 256, 32), (2, 4), "tn", "bf16"), ((64, 64, 32), (2, 2), "nn", "fp32"))


def fused(acc, bias: ep.Col, scale: ep.Row, C: ep.Matrix, alpha: ep.Scalar):
    return ep.gelu_tanh(alpha * acc * scale + bias) + C


# Fused epilogues: every operand kind, read next to the TMA store (sm90) and the staged store (sm80).
EPILOGUE_CASES = ({"family": "sm90", "schedule": "cooperative"}, {"family": "sm90", "schedule": "pingpong"},
                  {"family": "sm80"})


def epilogue_operands(op, a: torch.Tensor, b: torch.Tensor) -> tuple:
    m, n = a.shape[0], b.shape[1]
    dt = op.out_dtype
    # C with a 16-byte row pitch: sm90 loads it by TMA into the staging buffers, sm80 reads it in pairs.
    c = torch.randn(m, -(-n // 8) * 8, device="cuda").to(dt)[:, :n]
    return torch.randn(n, device="cuda").to(dt), torch.randn(m, device="cuda").to(dt), c, 0.5


# fp8 (layout tn): per-block scales (promotion reading them), promoted per tensor on pingpong, fast accumulation.
FP8_CASES = ({"scale": "block", "cluster_shape": (2, 1)},
             {"scale": "tensor", "schedule": "pingpong", "tile_shape": (64, 128, 128)},
             {"scale": "row", "fast_accum": True, "cluster_shape": (1, 2)})
K8 = 336   # two whole k tiles of 128 and a ragged one; rows of 336 bytes keep TMA's 16-byte rule


def fp8_operands(scale: str) -> tuple:
    """A, B (= W.t()), scale_a, scale_b, and the float64 product of the dequantized operands."""
    from generator import dequantize, quantize
    x, w = torch.randn(M, K8, device="cuda"), torch.randn(N, K8, device="cuda")
    a, sa = quantize(x, "e4m3", scale=scale)
    q, sw = quantize(w, "e4m3", scale=scale, block=(128, 128) if scale == "block" else None)
    blocks = ((1, 128), (128, 128)) if scale == "block" else (None, None)
    ref = dequantize(a, sa, scale, blocks[0]).double() @ dequantize(q, sw, scale, blocks[1]).double().t()
    return (a, q.t(), sa, sw), ref


def check_fp8(ops) -> int:
    failures = 0
    for op, knobs in zip(ops, FP8_CASES):
        args, ref = fp8_operands(knobs["scale"])
        assert op.path(*args) == "fast"
        buf = torch.full((M, N + 8), float("nan"), dtype=op.out_dtype, device="cuda")
        d = op(*args, out=buf[:, :N])
        torch.cuda.synchronize()
        err = ((d.double() - ref).norm() / ref.norm()).item()
        ok = err <= 1e-2 and bool(torch.isnan(buf[:, N:]).all())
        failures += not ok
        print(f"{op.name}: {M}x{N}x{K8} rel error {err:.3g} {'ok' if ok else 'WRONG'}", flush=True)
    return failures


def check_int8(op) -> int:
    """int8 -> int32 (exact) on a ragged problem: equal to the float64 product."""
    a = torch.randint(-128, 128, (M, K8), device="cuda", dtype=torch.int8)
    b = torch.randint(-128, 128, (N, K8), device="cuda", dtype=torch.int8).t()
    assert op.path(a, b) == "fast"
    buf = torch.full((M, N + 4), -(2**31), dtype=torch.int32, device="cuda")
    d = op(a, b, out=buf[:, :N])
    torch.cuda.synchronize()
    ok = torch.equal(d.double(), a.double() @ b.double()) and bool((buf[:, N:] == -(2**31)).all())
    print(f"{op.name}: {M}x{N}x{K8} {'exact ok' if ok else 'WRONG'}", flush=True)
    return 0 if ok else 1


def main() -> int:
    configs = [Gemm("bf16", lay, schedule=s, tile_shape=t, cluster_shape=c).config for s, t, c, lay in CASES]
    configs += [Gemm("bf16", lay, family="sm80", tile_shape=t, warps=w, out_dtype=od).config
                for t, w, lay, od in SM80_CASES]
    plain = len(configs)
    configs += [Gemm("bf16", "tn", epilogue=fused, **knobs).config for knobs in EPILOGUE_CASES]
    fp8 = [Gemm("e4m3", "tn", **knobs).config for knobs in FP8_CASES]
    int8 = [Gemm("int8", "tn", cluster_shape=(2, 1)).config, Gemm("int8", "tn", family="sm80").config]
    split = [replace(Gemm("bf16", "tn", schedule="cooperative", tile_shape=(128, 64, 64), cluster_shape=(1, 1)).config,
                     stream_k=True)]
    ops = compile_many(configs + fp8 + int8 + split, namespace="gemmgen_sanitize")
    failures = check_split_k(ops[-1])
    ops = ops[:-1]
    failures += check_fp8(ops[len(configs):len(configs) + len(fp8)])
    failures += sum(check_int8(op) for op in ops[len(configs) + len(fp8):])
    for index, (op, cfg) in enumerate(zip(ops, configs)):
        a = operand(M, K, cfg.layout.a.value == "row")
        b = operand(K, N, cfg.layout.b.value == "row")
        values = () if index < plain else epilogue_operands(op, a, b)
        assert op.path(a, b, *values) == "fast"
        acc = a.double() @ b.double()
        ref = acc if not values else evaluate(cfg.epilogue, acc, operand_values(cfg.epilogue, values, torch.float64))[0]
        for pitch in (-(-N // 8) * 8 + 8, N):
            failures += not poisoned_call(op, a, b, values, ref, pitch, f"{op.name}: {M}x{N}x{K} D pitch {pitch}")
    tn = {cfg.family: op for op, cfg in reversed(list(zip(ops, configs[:plain]))) if cfg.layout.blas == "tn"}
    failures += check_small_m(list(tn.values()))   # the first tn op of each family
    failures += check_batched(tn)
    if "sm90" in tn:
        failures += check_grouped(tn["sm90"])
        failures += check_list(tn["sm90"])
    return 1 if failures else 0


def check_list(op) -> int:
    """One list call (op.grouped_list, the default sm90 tn plan): ragged problems, an empty one (no launch for it), one
    with an odd N (its D breaks the 16-byte rule: direct stores) and K = 0 (zeros); each D_i against float64."""
    problems = [(77, 136, 200), (0, 64, 64), (130, 21, 72), (1, 512, 136), (5, 64, 0)]
    As = [operand(m, k, True) for m, _, k in problems]
    Bs = [operand(k, n, False) for _, n, k in problems]
    for m, n, _ in problems:
        torch.full((max(m, 1), n), float("nan"), dtype=op.out_dtype, device="cuda")   # freed at once
    Ds = op.grouped_list(As, Bs)
    torch.cuda.synchronize()
    worst, ok = 0.0, len(Ds) == len(problems)
    for a, b, d in zip(As, Bs, Ds):
        ref = a.double() @ b.double()
        ok = ok and d.shape == ref.shape and bool(torch.isfinite(d).all())
        if ref.numel() and ref.norm() > 0:
            worst = max(worst, ((d.double() - ref).norm() / ref.norm()).item())
        elif d.numel():
            ok = ok and not bool(d.any())
    ok = ok and worst <= 1e-2
    print(f"{op.name} (list): {problems} worst rel error {worst:.3g} {'ok' if ok else 'WRONG'}", flush=True)
    return 0 if ok else 1


def check_split_k(op) -> int:
    """Split-K (a cooperative stream-K plan with fewer tiles than SMs): 128x256 in 128x64 tiles is 4 units, each cut
    into as many parts as there are k tiles (32), the owner adding 31 partial tiles from the workspace."""
    m, n, k = 128, 256, 2048
    a, b = operand(m, k, True), operand(k, n, False)
    return 0 if poisoned_call(op, a, b, (), a.double() @ b.double(), n + 8, f"{op.name} (split-K): {m}x{n}x{k}") else 1


def poisoned_call(op, a: torch.Tensor, b: torch.Tensor, values: tuple, ref: torch.Tensor, pitch: int,
                  label: str) -> bool:
    """D written into a NaN buffer of row pitch `pitch`: within 1e-2 of `ref`, and the columns past N untouched.
    A batched `ref` (batch, M, N): each problem within 1e-2 of its own."""
    *batch, m, n = ref.shape
    buf = torch.full((*batch, m, pitch), float("nan"), dtype=op.out_dtype, device="cuda")
    d = op(a, b, *values, out=buf[..., :n])
    torch.cuda.synchronize()
    err = ((d.double() - ref).norm(dim=(-2, -1)) / ref.norm(dim=(-2, -1))).max().item()
    ok = err <= 1e-2 and bool(torch.isnan(buf[..., n:]).all())
    print(f"{label} rel error {err:.3g} {'ok' if ok else 'WRONG'}", flush=True)
    return ok


def batched_operand(batch: int, rows: int, cols: int, row_major: bool, gap: int) -> torch.Tensor:
    """(batch, rows, cols), each matrix as operand() stores it (leading dimension padded to 16 bytes), `gap` more
    leading dimensions of NaN between the matrices (so a wrong batch stride reads NaN)."""
    outer, inner = (rows, cols) if row_major else (cols, rows)
    ld = -(-inner // 8) * 8
    buf = torch.full((batch, outer + gap, ld), float("nan"), device="cuda").bfloat16()
    buf[:, :outer] = torch.randn(batch, outer, ld, device="cuda").bfloat16()
    return buf[:, :outer, :inner] if row_major else buf[:, :outer, :inner].transpose(1, 2)


def check_batched(ops: dict) -> int:
    """One batched call per family (the given tn ops): 3 ragged problems, D (3, M, N) in a NaN-poisoned buffer. sm90:
    A (3, M, K) with its matrices 2 rows apart and B 2-D (batch stride 0); sm80: A 2-D and B (3, K, N) 3 columns
    apart. Neither A's matrices back to back with a shared B, so the batch is not folded into M."""
    failures = 0
    batch, m, n, k = 3, 77, 130, 100
    for family, op in ops.items():
        if family == "sm90":
            a, b = batched_operand(batch, m, k, True, gap=2), operand(k, n, False)
        else:
            a, b = operand(m, k, True), batched_operand(batch, k, n, False, gap=3)
        assert op.path(a, b) == "fast", op.name
        label = f"{op.name} (batched): {batch}x{m}x{n}x{k} A {tuple(a.stride())} B {tuple(b.stride())}"
        failures += not poisoned_call(op, a, b, (), a.double() @ b.double(), -(-n // 8) * 8 + 8, label)
    return failures


def check_grouped(op) -> int:
    """One grouped call (op.grouped, the default sm90 tn plan): E = 4 groups of [0, 77, 130, 1] rows (empty first, one
    row last), N = 136, K = 200; A (208, K) row-major, B (4, K, N) K-major with 2 rows of NaN between the experts (a
    wrong expert stride reads NaN). D is the op's own (no out=): a NaN block of its size is freed just before the call
    (the caching allocator is likely to hand it to D), so an unwritten row reads NaN. Each group within 1e-2 of its
    float64 product."""
    sizes, n, k = [0, 77, 130, 1], 136, 200
    ends = [sum(sizes[:g + 1]) for g in range(len(sizes))]
    a, b = operand(sum(sizes), k, True), batched_operand(len(sizes), k, n, False, gap=2)
    offsets = torch.tensor(ends, dtype=torch.int32, device="cuda")
    torch.full((sum(sizes), n), float("nan"), dtype=op.out_dtype, device="cuda")   # freed at once
    d = op.grouped(a, b, offsets)
    torch.cuda.synchronize()
    ok, worst = d.shape == (sum(sizes), n) and bool(torch.isfinite(d).all()), 0.0
    for g, (start, end) in enumerate(zip([0] + ends[:-1], ends)):
        if end > start:
            ref = a[start:end].double() @ b[g].double()
            worst = max(worst, ((d[start:end].double() - ref).norm() / ref.norm()).item())
    ok = ok and worst <= 1e-2
    print(f"{op.name} (grouped): E={len(sizes)} sizes {sizes} N={n} K={k} B {tuple(b.stride())} worst group rel error "
          f"{worst:.3g} {'ok' if ok else 'WRONG'}", flush=True)
    return 0 if ok else 1


def check_small_m(ops) -> int:
    """The small-M kernel (common/gemm_small_m.cuh) of the given tn ops: one and two n8 halves of A's rows, a K
    that ends inside a 16-byte chunk, D in a NaN-poisoned buffer."""
    failures = 0
    for op in ops:
        for m in (5, 13):
            a, b = operand(m, K - 3, True), operand(K - 3, N, False)
            assert op.path(a, b) == "small_m", op.name
            label = f"{op.name} (small_m): {m}x{N}x{K - 3}"
            failures += not poisoned_call(op, a, b, (), a.double() @ b.double(), N + 8, label)
    return failures


if __name__ == "__main__":
    sys.exit(main())
