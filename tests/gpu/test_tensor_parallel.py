"""Tensor parallelism on two GPUs (issue 37, item 2): an MLP of generator.nn.Linear layers, Linear(d, 4d) -> GELU ->
Linear(4d, d) in bf16, parallelized with parallelize_module (ColwiseParallel, then RowwiseParallel) over NCCL on two
ranks, against the same layers on one GPU: the output, the input's gradient and every parameter's gradient (gathered
with full_tensor) within the bf16 bound (gpu_cases.BOUND; the row-parallel layer's partial sums are rounded to bf16
before they are added, as torch's own nn.Linear's are); and the compiled TP model (torch.compile, Inductor) against the
eager one (fullgraph: the DTensor path traces whole). With biases (the row-parallel one added once) and without, and with the GELU fused into the column-parallel
layer's epilogue (replace_linear's default).

Two processes, one per GPU, started by torch.multiprocessing.spawn (no torchrun); a failed assertion in either fails
the test with that rank's traceback. The kernels are built (and the backward ones too, by a first backward pass) in
this process before the ranks start, so that each rank loads them from the build cache. The CPU side of this (the
rules, placements, the bias added once, refusals) is tests/test_distributed.py, which runs in CI.
"""
from __future__ import annotations

import copy
import os
import socket
import warnings

import pytest

torch = pytest.importorskip("torch")

from gpu_cases import BOUND  # noqa: E402

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2 and torch.distributed.is_available()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs (torch.cuda.device_count() >= 2) and "
                                                      "torch.distributed with NCCL")]

D_MODEL, TOKENS = 512, (4, 128)
#: The gradients go through two GEMMs more than the output: twice the bound.
GRAD_BOUND = 2 * BOUND[torch.bfloat16]
VARIANTS = {"bias": dict(bias=True, fuse=False), "no_bias": dict(bias=False, fuse=False),
            "fused_gelu": dict(bias=True, fuse=True)}


def mlp(bias: bool, fuse: bool, device: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the stock model, ours) on ``device``, from the same seed on every rank."""
    from torch import nn

    from generator.nn import replace_linear

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL, bias=bias), nn.GELU(),
                         nn.Linear(4 * D_MODEL, D_MODEL, bias=bias)).to(device, torch.bfloat16)
    ours = copy.deepcopy(base)
    assert replace_linear(ours, m=TOKENS[0] * TOKENS[1], fuse_activations=fuse) == 2
    return base, ours


def inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return (torch.randn(*TOKENS, D_MODEL, device=device, dtype=torch.bfloat16),
            torch.randn(*TOKENS, D_MODEL, device=device, dtype=torch.bfloat16))


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def run(model: torch.nn.Module, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list]:
    """(output, dx, the parameters' gradients, gathered where they are DTensors), from a fresh backward."""
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    y = model(x)
    y.backward(g)
    grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
    return y.detach(), x.grad, grads


def check(what: str, got: tuple, ref: tuple, rank: int) -> None:
    (y, dx, grads), (y_ref, dx_ref, grads_ref) = got, ref
    assert rel(y, y_ref) <= BOUND[torch.bfloat16], f"rank {rank} {what}: output rel error {rel(y, y_ref):.3g}"
    assert rel(dx, dx_ref) <= GRAD_BOUND, f"rank {rank} {what}: dx rel error {rel(dx, dx_ref):.3g}"
    for i, (g, g_ref) in enumerate(zip(grads, grads_ref)):
        err = rel(g, g_ref)
        assert err <= GRAD_BOUND, f"rank {rank} {what}: parameter {i}'s gradient rel error {err:.3g}"


def _rank(rank: int, port: int, variant: str) -> None:
    """One rank: the TP model against the single-GPU one (eager), then the compiled TP model against the eager one."""
    import torch.distributed as dist
    from torch.distributed.tensor import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    os.environ["NCCL_NVLS_ENABLE"] = "0"   # (NVLink multicast stays off on the lent machines)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        device = f"cuda:{rank}"
        _, ours = mlp(**VARIANTS[variant], device=device)
        x, g = inputs(device)
        single = run(ours, x, g)                       # our layers on this one GPU
        mesh = init_device_mesh("cuda", (2,))
        parallelize_module(ours, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        assert ours[0].weight.to_local().shape == (2 * D_MODEL, D_MODEL)
        with warnings.catch_warnings():   # the kernels, not the torch fallback, on each rank's shards
            warnings.filterwarnings("error", message=".*using torch.nn.functional.linear")
            eager = run(ours, x, g)
            check(f"{variant} TP eager vs one GPU", eager, single, rank)
            compiled = run(torch.compile(ours, fullgraph=True), x, g)   # a graph break would hide a refusal
            check(f"{variant} TP compiled vs eager", compiled, eager, rank)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def built():
    """Every kernel the ranks run, forward and backward, built here (one process) into the build cache."""
    for variant in VARIANTS.values():
        _, ours = mlp(**variant, device="cuda:0")
        run(ours, *inputs("cuda:0"))
    torch.cuda.synchronize()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tensor_parallel_mlp_matches_one_gpu(built, variant):
    torch.multiprocessing.spawn(_rank, args=(_free_port(), variant), nprocs=2, join=True)
