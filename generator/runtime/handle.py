"""What the autograd formula and the JIT runtime need of a registered op (``op.GemmOp`` is the one
implementation): a Protocol, so that those modules sit below ``op`` in the imports and not beside it."""
from __future__ import annotations

from typing import Protocol, Sequence

import torch

from ..spec.config import KernelConfig


class OpHandle(Protocol):
    config: KernelConfig
    namespace: str
    name: str
    dtype: torch.dtype
    out_dtype: torch.dtype
    cpp_autograd: bool
    device_type: str  # the device type of the tensors its kernels take: "cuda" (the CPU tests' stand-ins: "cpu")

    def __call__(self, A: torch.Tensor, B: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor: ...

    def grouped(self, A: torch.Tensor, B: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor: ...

    def grouped_list(self, A: Sequence[torch.Tensor], B: Sequence[torch.Tensor]) -> list[torch.Tensor]: ...

    def derived(self, configs: Sequence[KernelConfig]) -> list[OpHandle]: ...
