"""The FSDP2 checkpoint check that tests/test_fsdp_cpu.py (gloo, reference ops) and tests/gpu/test_fsdp.py (NCCL, the
kernels) share: torch.distributed.checkpoint's save of a model with our layers and its optimizer, and its load into a
fresh one."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered whole; a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def check_checkpoint(saved: nn.Module, opt: torch.optim.Optimizer, make: Callable[[], tuple], stock_keys: tuple,
                     path: str, rank: int, next_loss: Callable[[nn.Module, torch.optim.Optimizer], float]) -> None:
    """dcp.save of ``saved`` and ``opt``, dcp.load into the fresh (model, optimizer) that ``make`` gives: the state
    dicts' keys are the stock model's (``stock_keys``: the model's, the optimizer state's), every parameter and AdamW
    moment loads exactly, and the next step's loss (``next_loss``, the same data for both) equals the saved model's."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

    dcp.save({"model": get_model_state_dict(saved), "optim": get_optimizer_state_dict(saved, opt)}, checkpoint_id=path)
    fresh, fresh_opt = make()
    state = {"model": get_model_state_dict(fresh), "optim": get_optimizer_state_dict(fresh, fresh_opt)}
    model_keys, optim_keys = stock_keys
    assert tuple(state["model"]) == model_keys, f"model keys {list(state['model'])}, the stock model's {model_keys}"
    assert tuple(state["optim"]["state"]) == optim_keys, f"optimizer keys {list(state['optim']['state'])}"
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(fresh, state["model"])
    set_optimizer_state_dict(fresh, fresh_opt, state["optim"])
    for (name, p), q in zip(fresh.named_parameters(), saved.parameters()):
        assert torch.equal(full(p), full(q)), f"rank {rank}: loaded {name} differs from the saved one"
        for key, value in fresh_opt.state[p].items():   # AdamW's step, exp_avg, exp_avg_sq
            assert torch.equal(full(value), full(opt.state[q][key])), f"rank {rank}: loaded {name}'s {key} differs"
    loaded, kept = next_loss(fresh, fresh_opt), next_loss(saved, opt)
    assert loaded == kept, f"rank {rank}: next-step loss {loaded} loaded, {kept} saved"
