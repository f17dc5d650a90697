"""Stream-K on the GPU (KernelConfig.stream_k, sm90 cooperative and pingpong): a partial last wave of tiles cut into
equal shares, and a small M whose tiles are fewer than the SMs (every tile's k tiles split among clusters), for 16-bit,
fp8 (promoted, per-block scales) and tf32 inputs; against a float64 reference, NaN-poisoned outputs, and
bit-identical results across repeated runs (the partial sums are added in a fixed order)."""
from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("stream-K is built for the sm90 family (an H100-class GPU)", allow_module_level=True)

from generator import Gemm, dequantize, quantize  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

pytestmark = pytest.mark.gpu

PLANS = {
    "bf16": dict(dtype="bf16"),
    "bf16_c1x1_128x64": dict(dtype="bf16", tile_shape=(128, 64, 64), cluster_shape=(1, 1)),
    "e4m3_block": dict(dtype="e4m3", scale="block", tile_shape=(128, 64, 128), cluster_shape=(1, 1)),
    "tf32": dict(dtype="tf32", tile_shape=(128, 64, 32), cluster_shape=(1, 1)),
    # pingpong: the consumers take alternate segments (the planner's split-K for at most 64 rows), with a cluster
    "bf16_pp_64x128": dict(dtype="bf16", tile_shape=(64, 128, 64), cluster_shape=(1, 1), schedule="pingpong"),
    # 64x64 pingpong: the planner's split for at most 64 rows over a long K (planner few_rows_long_k)
    "bf16_pp_64x64": dict(dtype="bf16", tile_shape=(64, 64, 64), cluster_shape=(1, 1), schedule="pingpong"),
    "bf16_pp_128x128_c2x1": dict(dtype="bf16", tile_shape=(128, 128, 64), cluster_shape=(2, 1),
                                 schedule="pingpong"),
    # a vocabulary head's dX at a few hundred tokens: 2x1 clusters split along K (planner LONG_K_SPLIT_CLUSTERS)
    "bf16_coop_128x256_c2x1": dict(dtype="bf16", tile_shape=(128, 256, 64), cluster_shape=(2, 1)),
    # a 64-row cooperative tile: its consumers split each segment's tile along N
    "bf16_coop_64x128": dict(dtype="bf16", tile_shape=(64, 128, 64), cluster_shape=(1, 1)),
    # an N tile that is no multiple of 64 (D stored directly)
    "bf16_coop_128x144": dict(dtype="bf16", tile_shape=(128, 144, 64), cluster_shape=(1, 1)),
    "e4m3_block_pp": dict(dtype="e4m3", scale="block", tile_shape=(64, 128, 128), cluster_shape=(1, 1),
                          schedule="pingpong"),
}
#: Small M (fewer tiles than SMs: all cut; bf16 at M = 1 takes the small-M kernel, M = 17 stream-K), a partial last
#: wave, ragged sizes with a ragged last k tile; 20 tiles of 64x64 (256 x 320) and of 128x64 (256 x 640) on 132 SMs:
#: 6 parts each, so the owner adds 5 contributors' tiles, more than it loads at once (Kernel::kPartsInFlight).
SHAPES = [(128, 4096, 4096), (1, 1000, 2048), (17, 1000, 2048), (2048, 4096, 512), (300, 520, 1104),
          (256, 320, 4096), (256, 640, 4096)]
BOUND = {"bf16": 1e-2, "e4m3": 1e-2, "tf32": 2e-3}


@pytest.fixture(scope="module")
def ops():
    configs = {key: replace(Gemm(layout="tn", arch=90, **{"schedule": "cooperative", **kw}).config, stream_k=True)
               for key, kw in PLANS.items()}
    return dict(zip(configs, compile_many(list(configs.values()), namespace="gemmgen_stream_k_test")))


def operands(dtype: str, m: int, n: int, k: int):
    """The op's arguments and their float64 product."""
    x, w = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
    if dtype == "e4m3":
        a, sa = quantize(x, "e4m3", scale="block")
        q, sw = quantize(w, "e4m3", scale="block", block=(128, 128))
        ref = (dequantize(a, sa, scale="block", block=(1, 128)).double()
               @ dequantize(q, sw, scale="block", block=(128, 128)).double().t())
        return (a, q.t(), sa, sw), ref
    t = {"bf16": torch.bfloat16, "tf32": torch.float32}[dtype]
    a, b = x.to(t), w.to(t).t()
    return (a, b), a.double() @ b.double()


@pytest.mark.parametrize("key", list(PLANS))
def test_against_float64_and_repeatable(ops, key):
    op = ops[key]
    assert "_sk_" in op.name
    dtype = PLANS[key]["dtype"]
    for m, n, k in SHAPES:
        args, ref = operands(dtype, m, n, k)
        out = op._empty_out(args[0], args[1]).fill_(float("nan"))
        op(*args, out=out)
        assert torch.isfinite(out).all(), f"{op.name} {m}x{n}x{k}: unwritten elements"
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err <= BOUND[dtype], f"{op.name} {m}x{n}x{k}: {err:.2e} > {BOUND[dtype]}"
        for _ in range(3):   # the owner adds the parts in cluster order: the same bits every run
            assert torch.equal(op(*args), out), f"{op.name} {m}x{n}x{k}: differs between runs"


def test_k_zero(ops):
    op = ops["bf16"]
    a = torch.randn(70, 0, device="cuda").bfloat16()
    b = torch.randn(0, 90, device="cuda").bfloat16()
    assert (op(a, b) == 0).all()


def test_streams_and_graphs_keep_their_flags_apart(ops):
    """Split-K on two streams at once, each raising the flags its stream keeps to epochs of its own, and a captured
    graph (zeroed flags of its own) replayed between them: every result is the bits of a call run alone. A launch that
    took another's flags or an earlier epoch for its own would add a part before it is written, and the sum moves."""
    op = ops["bf16_pp_64x128"]
    # 64 x 1024 x 8192: 16 tiles of 64x128 in 8+ parts each (the slices' sum); 128 x 4096 x 4096: the owner's sum
    cases = [operands("bf16", m, n, k)[0] for m, n, k in ((64, 1024, 8192), (128, 4096, 4096))]
    alone = [op(*args) for args in cases]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    graph_out = op._empty_out(*cases[0][:2])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(*cases[0], out=graph_out)
    rounds = 12
    outs = [[[op._empty_out(*args[:2]).fill_(float("nan")) for args in cases] for _ in range(rounds)] for _ in streams]
    graph_outs = [torch.full_like(graph_out, float("nan")) for _ in range(rounds)]
    torch.cuda.synchronize()
    for r in range(rounds):
        for s, stream in enumerate(streams):
            with torch.cuda.stream(stream):
                for args, out in zip(cases, outs[s][r]):
                    op(*args, out=out)
                if s == 0:
                    graph.replay()
                    graph_outs[r].copy_(graph_out)
    torch.cuda.synchronize()
    for s in range(len(streams)):
        for r in range(rounds):
            for i, want in enumerate(alone):
                assert torch.equal(outs[s][r][i], want), f"stream {s}, round {r}, case {i}: differs from a call alone"
    for r in range(rounds):
        assert torch.equal(graph_outs[r], alone[0]), f"graph replay {r}: differs from a call alone"

