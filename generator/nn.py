"""A drop-in ``nn.Linear`` whose matmul runs on a kernel of this generator, and a function that swaps
every ``nn.Linear`` of a model for it.

    from generator.nn import replace_linear
    model = model.to("cuda", torch.bfloat16)
    replace_linear(model)                 # returns how many layers it swapped
    model(x).sum().backward()             # forward and backward (dA, dB) on generated kernels

The module shares the original layer's ``weight`` and ``bias`` Parameters (same objects, same
``state_dict`` keys), so an optimizer built before or after the swap trains them.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .gemm import DEFAULT_NAMESPACE, Gemm
from .runtime import GemmOp, compile_many, leading_dim
from .spec.types import INPUT_DTYPES, Order, parse_dtype

__all__ = ["Linear", "plan_linear", "replace_linear"]


def _compute_dtype(linear: nn.Linear, dtype: object) -> torch.dtype:
    weight_dtype = linear.weight.dtype
    if dtype is None:
        if weight_dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(
                f"{linear} has {weight_dtype} weights; the kernels take fp16 or bf16: convert the model "
                "(model.to(torch.bfloat16)) or pass dtype=torch.bfloat16 to compute in bf16 (inputs and "
                "weights are then cast on each call, as autocast does)")
        return weight_dtype
    return getattr(torch, parse_dtype(dtype, allowed=INPUT_DTYPES).torch_name)


def plan_linear(linear: nn.Linear, *, dtype: object = None, arch: object = None, m: int | None = None,
                namespace: str = DEFAULT_NAMESPACE) -> Gemm:
    """The plan for ``x @ W.t()`` of this layer: layout "tn" (x row-major, W.t() column-major),
    planned for N = out_features, K = in_features and M = ``m`` (default: a large M)."""
    dtype_ = _compute_dtype(linear, dtype)
    n, k = linear.out_features, linear.in_features
    hints = dict(m=m, n=n, k=k) if n > 0 and k > 0 else {}
    return Gemm(dtype=dtype_, layout="tn", arch=arch, namespace=namespace, **hints)


class Linear(nn.Module):
    """``y = x @ W.t() + b`` with the matmul on a generated kernel; the same Parameters as ``linear``.

    * **Weights**: ``self.weight`` and ``self.bias`` are the wrapped layer's Parameter objects, so
      training updates the original layer too, and ``state_dict`` keys are ``nn.Linear``'s.
    * **dtype**: the kernel's input dtype; default the weight's (fp16 or bf16). With a different
      ``dtype`` (e.g. bf16 for an fp32 model) x and W are cast on each call, like autocast, and the
      output is cast back to x's dtype.
    * **Shapes**: inputs (..., K) are reshaped to (M, K) and back; a row-major view is used as it is,
      anything else is made contiguous first.
    * **One plan per layer, not per call**: the kernel is planned once for N = out_features,
      K = in_features and M = ``m`` (default: a large M), not per (M, N, K) bucket. The tile choice
      depends mostly on N and K; one op per layer keeps torch.compile to one graph for every M (a
      dynamic M traces one op and does not recompile) and never builds a kernel in the middle of a
      forward pass. Pass ``m=`` (e.g. the token count) when M is known and small.
    * **Bias**: added by a separate elementwise add after the matmul (torch.compile fuses it into the
      next elementwise work), because the kernels' epilogue has no bias yet; once it has one, the bias
      moves into the kernel.
    * **Fallback**: inputs the kernel cannot take (not on the weights' CUDA device, or of a dtype other
      than the compute or weight dtype) run ``torch.nn.functional.linear`` instead, with a warning the
      first time.
    * **Autograd**: dx and dW come from the op's registered backward (kernels of this generator).
    """

    def __init__(self, linear: nn.Linear, *, dtype: object = None, arch: object = None, m: int | None = None,
                 op: GemmOp | None = None) -> None:
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"Linear wraps a torch.nn.Linear, got {type(linear).__name__}")
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        if linear.bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = linear.bias
        if op is None:
            op = plan_linear(linear, dtype=dtype, arch=arch, m=m).compile()
        elif op.config.layout.blas != "tn":
            raise ValueError(f"{op!r} has layout {op.config.layout.blas!r}; Linear computes x @ W.t(): plan with layout='tn'")
        self.op = op
        self.compute_dtype = op.dtype
        self._warned = False

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"op={self.op.name}")

    def _cannot_take(self, x: torch.Tensor) -> str | None:
        """Why the kernel cannot take ``x`` (None if it can)."""
        w = self.weight
        if x.device.type != self.op.device_type or x.device != w.device:
            return f"input on {x.device}, weights on {w.device}; the kernel runs on the weights' CUDA device"
        if x.dtype not in (self.compute_dtype, w.dtype):
            return f"input is {x.dtype}; the kernel computes in {self.compute_dtype} (weights {w.dtype})"
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            return f"input shape {tuple(x.shape)} does not end in in_features={self.in_features}"
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        reason = self._cannot_take(x)
        if reason is not None:
            if not self._warned:
                self._warned = True
                warnings.warn(f"generator.nn.Linear({self.in_features}, {self.out_features}): {reason}; "
                              "using torch.nn.functional.linear", stacklevel=2)
            return F.linear(x, self.weight, self.bias)
        w = self.weight if self.weight.dtype == self.compute_dtype else self.weight.to(self.compute_dtype)
        if leading_dim(w, Order.row) is None:
            w = w.contiguous()
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != self.compute_dtype:
            x2 = x2.to(self.compute_dtype)
        if leading_dim(x2, Order.row) is None:
            x2 = x2.contiguous()
        y = self.op(x2, w.t())
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if y.dtype == x.dtype else y.to(x.dtype)


def _swappable(module: nn.Module) -> bool:
    # nn.Linear, or a subclass that keeps its forward (e.g. NonDynamicallyQuantizableLinear); a subclass
    # with its own forward (LoRA adapters, quantized layers) computes something else and is left alone.
    return isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward


def replace_linear(model: nn.Module, *, dtype: object = None, arch: object = None, m: int | None = None) -> int:
    """Swap every ``nn.Linear`` inside ``model`` for ``generator.nn.Linear``, in place; returns the count.

    Layers of equal (out_features, in_features, dtype) share one op; all distinct kernels are built
    in one parallel ninja run (cached). ``dtype``, ``arch`` and ``m`` as for ``Linear``; every layer's
    compute dtype is checked before anything is swapped. ``model`` itself is not replaced when it is
    a Linear: wrap it with ``Linear(model)``.
    """
    parents = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if _swappable(child)]
    layers = list({id(child): child for _, _, child in parents}.values())
    plans = {id(layer): plan_linear(layer, dtype=dtype, arch=arch, m=m) for layer in layers}
    configs = list(dict.fromkeys(p.config for p in plans.values()))
    ops = dict(zip(configs, compile_many(configs, namespace=DEFAULT_NAMESPACE))) if configs else {}
    new = {id(layer): Linear(layer, op=ops[plans[id(layer)].config]) for layer in layers}
    for parent, name, child in parents:
        setattr(parent, name, new[id(child)])
    return len(layers)
