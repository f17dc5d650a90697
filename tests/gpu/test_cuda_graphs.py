"""CUDA graphs: every path of an op (fast, small-M, stream-K with its stream-ordered workspace, a fused epilogue,
fp8 scales) captured with torch.cuda.graph and replayed on new data in the same tensors, equal to eager calls; and
torch.compile(mode="reduce-overhead") (which captures graphs itself) over generator.nn.Linear. The repacked path's
capture is in test_repacked.py."""
from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from generator import Gemm, quantize  # noqa: E402
from generator.nn import Linear  # noqa: E402
from generator.runtime import compile_many  # noqa: E402

pytestmark = pytest.mark.gpu
IS_SM90 = torch.cuda.get_device_capability() >= (9, 0)

PLANS = {
    "sm80_fp16": dict(dtype="fp16", layout="tn", family="sm80"),
    "sm80_bias_gelu": dict(dtype="bf16", layout="tn", family="sm80", bias="col", activation="gelu"),
}
if IS_SM90:
    PLANS.update({
        "sm90_bf16": dict(dtype="bf16", layout="tn", family="sm90"),
        "sm90_bias_gelu": dict(dtype="bf16", layout="tn", family="sm90", bias="col", activation="gelu"),
        "sm90_e4m3_tensor": dict(dtype="e4m3", layout="tn", scale="tensor", out_dtype="bf16", family="sm90"),
    })


@pytest.fixture(scope="module")
def ops():
    configs = {key: Gemm(**kw).config for key, kw in PLANS.items()}
    if IS_SM90:   # stream-K: a workspace allocated and freed in the stream at every call
        configs["sm90_stream_k"] = replace(Gemm("bf16", "tn", schedule="cooperative", cluster_shape=(1, 1),
                                                tile_shape=(128, 64, 64)).config, stream_k=True)
    return dict(zip(configs, compile_many(list(configs.values()), namespace="gemmgen_graph_test")))


def fresh(op, key: str, m: int, n: int, k: int) -> tuple:
    """New random arguments of the op for an m x n x k problem."""
    x, w = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
    if "e4m3" in key:
        a, sa = quantize(x, "e4m3", scale="tensor")
        q, sb = quantize(w, "e4m3", scale="tensor")
        return a, q.t(), sa, sb
    args = (x.to(op.dtype), w.to(op.dtype).t())
    return args + ((torch.randn(n, device="cuda").to(op.dtype),) if "bias" in key else ())


@pytest.mark.parametrize("m", [8, 300])   # the small-M kernel where the plan has it, then the fast one
def test_capture_and_replay(ops, m):
    for key, op in ops.items():
        n, k = 1024, 512
        args = fresh(op, key, m, n, k)
        out = op._empty_out(args[0], args[1])
        op(*args, out=out)   # build and warm up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            op(*args, out=out)
        for _ in range(2):
            for static, new in zip(args, fresh(op, key, m, n, k)):
                static.copy_(new)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, op(*args)), f"{key} M={m} ({op.path(*args)}): replay differs from eager"


def test_compile_reduce_overhead_linear():
    """torch.compile(mode="reduce-overhead") over two generator.nn.Linear layers (GELU in the first one's epilogue,
    so that the graph holds only our ops and the results are bit-comparable): the compiled (graph-replayed) forward
    equals the eager one on each new batch, decode and prefill sizes alike."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 256)).to("cuda", torch.bfloat16)
    model[0], model[1] = Linear(model[0], activation="gelu"), Linear(model[1])
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for m in (4, 4, 4, 300, 300, 300):
            x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
            got = compiled(x).clone()   # a graph's output is overwritten by its next replay
            assert torch.equal(got, model(x)), f"M={m}"
