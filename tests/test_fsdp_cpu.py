"""FSDP2 without a GPU (issue 37, item 1): ``fully_shard`` of an MLP whose nn.Linear layers replace_linear swapped for
generator.nn.Linear, trained on two CPU processes over gloo, in bf16 and with fp32 parameters under
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``:

* the first forward and backward under FSDP2 against the unsharded model (both ranks' batches, gradients averaged as
  FSDP2 reduces them): each rank's loss and every parameter's gradient (gathered with full_tensor) within the bf16
  bounds, the gradients placed as their parameters (Shard(0)), and the reference ops ran (no torch fallback);
* a few AdamW steps of ours against the stock model under FSDP2: the per-step losses and the gradient norms
  (clip_grad_norm_'s total norm) within the bf16 bound;
* a checkpoint through torch.distributed.checkpoint (dcp.save of get_model_state_dict / get_optimizer_state_dict,
  dcp.load into a fresh FSDP2 model with our layers): the keys are the stock model's, the loaded parameters and AdamW
  moments equal the saved ones, and the next step's loss equals the saved model's.

Why two processes and not LocalTensorMode in this one (as tests/test_distributed.py does for tensor parallelism): FSDP2
frees and reallocates the unsharded parameters with ``untyped_storage().resize_()``, which a LocalTensor (a wrapper
without storage) refuses, and it takes each rank's shard by ``ProcessGroup.rank()``, which the fake group answers 0 for
every simulated rank (so every rank would hold rank 0's shard; loading the shards afterwards goes through FSDP2's
reset_sharded_param, which reads the storage's data pointer: refused too). Seen with torch 2.14. gloo runs the real
collectives instead (about 15 s for both variants, mostly the two processes' start and imports).

The ops are test_autograd_cpu's ReferenceOp (the real registration, checks and autograd formulas, C++ or Python;
torch.matmul on CPU in place of the kernel). tests/gpu/test_fsdp.py runs the kernels, on a Llama, on two GPUs over NCCL.
"""
from __future__ import annotations

import copy
import socket
import warnings

import pytest

torch = pytest.importorskip("torch")
if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):   # pragma: no cover
    pytest.skip("this torch has no torch.distributed with gloo", allow_module_level=True)

from torch import nn  # noqa: E402

from fsdp_checkpoint import check_checkpoint, full  # noqa: E402
from test_autograd_cpu import BOUND, rel  # noqa: E402

BF16 = torch.bfloat16
WORLD, D, TOKENS, STEPS, LR = 2, 16, (4, 8), 3, 1e-2
NAMESPACE = "gemmgen_fsdp"
#: The gradients (and their norm) go through two GEMMs more than the loss: twice the bound, as tests/gpu/ has it.
GRAD_BOUND = 2 * BOUND[BF16]
VARIANTS = ("bf16", "mixed")


class Block(nn.Module):
    """x + Linear(4d, d)(GELU(Linear(d, 4d)(x))): the GELU is fused into the first layer by replace_linear."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


def mlp(seed: int, variant: str) -> nn.Sequential:
    """Two blocks and a head, bf16 parameters or (variant "mixed") fp32 ones."""
    torch.manual_seed(seed)
    model = nn.Sequential(Block(D), Block(D), nn.Linear(D, D))
    return model.to(BF16) if variant == "bf16" else model


def batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s (input, target): the same for the stock model and ours; each rank its own (data parallel)."""
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(*TOKENS, D, generator=gen), torch.randn(*TOKENS, D, generator=gen)


def loss_of(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, target = data
    return nn.functional.mse_loss(model(x.to(BF16)).float(), target)   # (bf16: what FSDP2's policy would cast to)


def ours(model: nn.Module) -> nn.Module:
    """``model`` with our layers on reference ops (the kernels take bf16: an fp32 model computes in bf16, as FSDP2's
    policy gathers its weights)."""
    from generator.nn import Linear, replace_linear

    assert replace_linear(model, arch=90, m=TOKENS[0] * TOKENS[1], dtype=BF16) == 5
    assert isinstance(model[0].mlp[0], Linear) and model[0].mlp[0].activation == "gelu"
    return model


def shard(model: nn.Module, variant: str) -> torch.optim.Optimizer:
    """fully_shard on each block, then on the model (its head in the root's group); AdamW on the sharded parameters."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import init_device_mesh

    mesh = init_device_mesh("cpu", (WORLD,))
    policy = MixedPrecisionPolicy() if variant == "bf16" else MixedPrecisionPolicy(param_dtype=BF16,
                                                                                 reduce_dtype=torch.float32)
    for block in model[:2]:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return torch.optim.AdamW(model.parameters(), lr=LR)


def step(model: nn.Module, opt: torch.optim.Optimizer, data: tuple) -> tuple[float, float]:
    """One training step: (this rank's loss, the total gradient norm before clipping)."""
    opt.zero_grad(set_to_none=True)
    loss = loss_of(model, data)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    opt.step()
    return loss.item(), full(norm).item()


def check_against_unsharded(sharded: nn.Module, reference: nn.Module, rank: int, what: str) -> None:
    """The sharded model's first forward and backward against the unsharded bf16 one on both ranks' batches (FSDP2
    averages the ranks' gradients)."""
    losses = [loss_of(reference, batch(r)) for r in range(WORLD)]
    (sum(losses) / WORLD).backward()
    loss = loss_of(sharded, batch(rank))
    loss.backward()
    assert rel(loss, losses[rank]) <= BOUND[BF16], f"rank {rank} {what}: loss {loss.item()} vs {losses[rank].item()}"
    for (name, p), p_ref in zip(sharded.named_parameters(), reference.parameters()):
        assert p.grad.placements == p.placements, f"{what} {name}: gradient placed {p.grad.placements}"
        err = rel(full(p.grad), p_ref.grad)
        assert err <= GRAD_BOUND, f"rank {rank} {what} {name}: gradient rel error {err:.3g}"


def _rank(rank: int, port: int, path: str, formula: str) -> None:
    """One rank: both variants in one process group (a process's start and imports are most of a variant's time)."""
    import torch.distributed as dist

    import test_autograd_cpu
    from generator import nn as gnn
    from generator.runtime import jit_runtime

    # This process's ops: reference ops (no GPU, no nvcc), differentiated by the JIT runtime's C++ formulas (built by
    # the test, loaded here from the build cache) or by the Python ones.
    gnn.compile_many = lambda configs, **kw: [test_autograd_cpu.ReferenceOp(c, NAMESPACE) for c in configs]
    if formula == "python":
        jit_runtime.RUNTIME.register_autograd = lambda op, configs, epilogue=None: False
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        for variant in VARIANTS:
            _train_and_check(rank, variant, f"{path}_{variant}", formula)
    finally:
        dist.destroy_process_group()


def _train_and_check(rank: int, variant: str, path: str, formula: str) -> None:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    import test_autograd_cpu

    stock = mlp(0, variant)
    reference = copy.deepcopy(stock).to(BF16)                # unsharded, computing in bf16 as the sharded one
    model_keys = tuple(stock.state_dict())
    mine = ours(copy.deepcopy(stock))
    layers = [m for m in mine.modules() if hasattr(m, "op")]
    assert layers and all(m.op.cpp_autograd == (formula == "cpp") for m in layers), formula
    opts = {"stock": shard(stock, variant), "ours": shard(mine, variant)}
    with warnings.catch_warnings():   # our ops, not the torch fallback, on the gathered weights
        warnings.filterwarnings("error", message=".*using torch.nn.functional.linear")
        test_autograd_cpu.CALLS = []
        check_against_unsharded(mine, reference, rank, variant)
        assert test_autograd_cpu.CALLS, f"{variant}: the reference ops never ran"
        for i in range(STEPS):
            loss, norm = step(mine, opts["ours"], batch(rank))
            loss_ref, norm_ref = step(stock, opts["stock"], batch(rank))
            what = f"rank {rank} {variant} step {i}"
            assert abs(loss - loss_ref) <= BOUND[BF16] * abs(loss_ref), f"{what}: loss {loss} vs stock {loss_ref}"
            assert abs(norm - norm_ref) <= GRAD_BOUND * norm_ref, f"{what}: norm {norm} vs stock {norm_ref}"
        stock_keys = (model_keys, tuple(get_optimizer_state_dict(stock, opts["stock"])["state"]))
        assert tuple(get_model_state_dict(stock)) == model_keys

        def make() -> tuple[nn.Module, torch.optim.Optimizer]:
            fresh = ours(mlp(1, variant))
            return fresh, shard(fresh, variant)

        data = batch(rank)
        check_checkpoint(mine, opts["ours"], make, stock_keys, path, rank, lambda m, o: step(m, o, data)[0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("formula", ["cpp", "python"])
def test_fsdp2_mlp_with_our_layers(tmp_path, formula):
    """bf16 parameters, then fp32 ones under the mixed-precision policy (VARIANTS), on two gloo ranks; the layers
    differentiated by the C++ formulas (the GELU layer's closed form, gemm_autograd.h) or by the Python ones."""
    from generator.runtime import jit_runtime

    if formula == "cpp" and not jit_runtime.RUNTIME.ensure():
        pytest.skip(f"the JIT runtime did not build here: {jit_runtime.RUNTIME.failure}")
    torch.multiprocessing.spawn(_rank, args=(_free_port(), str(tmp_path / "ckpt"), formula), nprocs=WORLD, join=True)
