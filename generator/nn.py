"""A drop-in ``nn.Linear`` whose matmul runs on a kernel of this generator, and a function that swaps
every ``nn.Linear`` of a model for it.

    from generator.nn import replace_linear
    model = model.to("cuda", torch.bfloat16)
    replace_linear(model)                 # returns how many layers it swapped
    model(x).sum().backward()             # forward and backward (dA, dB) on generated kernels

The module shares the original layer's ``weight`` and ``bias`` Parameters (same objects, same
``state_dict`` keys), so an optimizer built before or after the swap trains them. The bias is added in
the kernel's epilogue, and ``replace_linear`` also fuses an activation module that directly follows a
Linear inside an ``nn.Sequential`` (the activation module becomes ``nn.Identity``).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .gemm import DEFAULT_NAMESPACE, Gemm, op_key
from .runtime import BucketedOp, GemmOp, compile_many, leading_dim
from .spec.epilogue import activation_name
from .spec.types import INPUT_DTYPES, Order, parse_dtype

__all__ = ["Linear", "plan_linear", "replace_linear"]

#: Activation modules replace_linear fuses into the Linear before them, by the epilogue's name for each.
_FUSABLE = {nn.ReLU: "relu", nn.SiLU: "silu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh"}
#: The same activations in torch, for the fallback path of Linear.
_TORCH_ACTIVATIONS = {None: lambda y: y, "relu": F.relu, "gelu": F.gelu,
                      "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"), "silu": F.silu,
                      "sigmoid": torch.sigmoid, "tanh": torch.tanh}


def fusable_activation(module: nn.Module) -> str | None:
    """The epilogue activation equal to ``module`` (an nn.ReLU, nn.GELU, ...), or None if it has none."""
    if isinstance(module, nn.GELU):
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    if type(module) in _FUSABLE:
        return _FUSABLE[type(module)]
    return None


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
                activation: str | Callable[..., Any] | None = None, namespace: str = DEFAULT_NAMESPACE) -> Gemm:
    """The plan for ``act(x @ W.t() + b)`` of this layer: layout "tn" (x row-major, W.t() column-major), the
    bias (if the layer has one) and ``activation`` in the epilogue, planned for N = out_features,
    K = in_features and M = ``m`` (default: a large M)."""
    dtype_ = _compute_dtype(linear, dtype)
    n, k = linear.out_features, linear.in_features
    hints = dict(m=m, n=n, k=k) if n > 0 and k > 0 else {}
    bias = "col" if linear.bias is not None else None
    return Gemm(dtype=dtype_, layout="tn", arch=arch, namespace=namespace, bias=bias, activation=activation,
                **hints)


class Linear(nn.Module):
    """``y = act(x @ W.t() + b)`` on one generated kernel; the same Parameters as ``linear``.

    * **Weights**: ``self.weight`` and ``self.bias`` are the wrapped layer's Parameter objects, so
      training updates the original layer too, and ``state_dict`` keys are ``nn.Linear``'s.
    * **dtype**: the kernel's input dtype; default the weight's (fp16 or bf16). With a different
      ``dtype`` (e.g. bf16 for an fp32 model) x and W are cast on each call, like autocast, and the
      output is cast back to x's dtype.
    * **Shapes**: inputs (..., K) are reshaped to (M, K) and back; a row-major view is used as it is,
      anything else is made contiguous first.
    * **A kernel per bucket of M**: without ``m``, the layer's op (``Gemm.compile_buckets``) holds kernels
      planned for each bucket of M (``gemm.M_BUCKETS``) and for larger M (N = out_features, K = in_features),
      built together when the layer is made, never in the middle of a forward pass; each call takes its batch's
      kernel (and, at most 16 rows, the small-M kernel within it): prefill and decode of one model each get
      theirs.
      ``self.op.path(x, W.t())`` names it. With ``m=`` (e.g. a fixed token count) the layer holds the one
      kernel planned for that M. Under torch.compile the graph calls one op over every bucket's kernel, which
      picks per call in C++ (one graph for any M, no recompiles; ``runtime.buckets.BucketSetOp``).
    * **Bias and activation**: the bias is added in the kernel's epilogue (no separate add);
      ``activation=`` ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", or the function, ``ep.relu``)
      is applied there too.
    * **Fallback**: inputs the kernel cannot take (not on the weights' CUDA device, or of a dtype other
      than the compute or weight dtype) run ``torch.nn.functional.linear`` instead, with a warning the
      first time.
    * **Autograd**: dx and dW come from the op's registered backward (kernels of this generator).
    """

    def __init__(self, linear: nn.Linear, *, dtype: object = None, arch: object = None, m: int | None = None,
                 activation: str | Callable[..., Any] | None = None, op: GemmOp | BucketedOp | None = None) -> None:
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
        if callable(activation):    # ep.relu -> "relu"; another function is refused there
            activation = activation_name(activation)
        if activation not in _TORCH_ACTIVATIONS:
            choices = ", ".join(repr(a) for a in _TORCH_ACTIVATIONS)
            raise ValueError(f"activation={activation!r}: use one of {choices}")
        self.activation = activation
        if op is None:
            plan = plan_linear(linear, dtype=dtype, arch=arch, m=m, activation=activation)
            op = plan.compile() if m is not None else plan.compile_buckets()
        elif op.config.layout.blas != "tn":
            raise ValueError(f"{op!r} has layout {op.config.layout.blas!r}; Linear computes x @ W.t(): plan with layout='tn'")
        expected = plan_linear(linear, dtype=op.dtype, arch=op.config.arch, activation=activation).config.epilogue
        if op.config.epilogue != expected:
            raise ValueError(f"{op!r} computes {op.config.epilogue.text}; this layer needs {expected.text}: plan it "
                             "with generator.nn.plan_linear(layer, activation=...)")
        self.op = op
        self.compute_dtype = op.dtype
        self._warned = False

    def extra_repr(self) -> str:
        act = f", activation={self.activation!r}" if self.activation else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
                f"{act}, op={self.op.name}")

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
        w = self.weight
        if self._takes_as_is(x, w):
            return self._run_as_is(x, w)
        return self._forward_general(x)

    def _takes_as_is(self, x: torch.Tensor, w: torch.Tensor) -> bool:
        """The common call, told by cheap tensor properties: x on the weights' CUDA device, both in the compute
        dtype and contiguous. It skips the general path's checks and conversions and the op's argument binding
        (a decoding step is host-bound: every microsecond per layer shows)."""
        return (x.is_cuda and x.dtype == self.compute_dtype and w.dtype == self.compute_dtype and x.device == w.device
                and x.dim() > 0 and x.shape[-1] == self.in_features and x.is_contiguous() and w.is_contiguous())

    def _run_as_is(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x2 = x.view(-1, self.in_features)
        op = self.op.op_for_rows(x2.shape[0]) if isinstance(self.op, BucketedOp) else self.op
        bias = self.bias
        if bias is None:
            y = op.op.default(x2, w.t())
        else:
            y = op.op.default(x2, w.t(), bias if bias.dtype == op.out_dtype else bias.to(op.out_dtype))
        y = y.view(*x.shape[:-1], self.out_features)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def _forward_general(self, x: torch.Tensor) -> torch.Tensor:
        """Any input: the fallback to torch for what the kernel cannot take, casts, copies of non-row-major views."""
        reason = self._cannot_take(x)
        if reason is not None:
            if not self._warned:
                self._warned = True
                warnings.warn(f"generator.nn.Linear({self.in_features}, {self.out_features}): {reason}; "
                              "using torch.nn.functional.linear", stacklevel=2)
            return _TORCH_ACTIVATIONS[self.activation](F.linear(x, self.weight, self.bias))
        w = self.weight if self.weight.dtype == self.compute_dtype else self.weight.to(self.compute_dtype)
        if leading_dim(w, Order.row) is None:
            w = w.contiguous()
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != self.compute_dtype:
            x2 = x2.to(self.compute_dtype)
        if leading_dim(x2, Order.row) is None:
            x2 = x2.contiguous()
        if self.bias is None:
            y = self.op(x2, w.t())
        else:
            y = self.op(x2, w.t(), self.bias.to(self.op.out_dtype))
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if y.dtype == x.dtype else y.to(x.dtype)


def _swappable(module: nn.Module) -> bool:
    # nn.Linear, or a subclass that keeps its forward (e.g. NonDynamicallyQuantizableLinear); a subclass
    # with its own forward (LoRA adapters, quantized layers) computes something else and is left alone.
    return isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward


def _fused_activations(model: nn.Module, layers: dict[int, nn.Linear]) -> dict[int, tuple[nn.Module, str, str]]:
    """Linear layers followed, inside an nn.Sequential, by an activation module the epilogue has:
    {id(layer): (sequential, the activation's child name, epilogue activation)}. A layer used in more than
    one place keeps its activations unfused (each use would need its own)."""
    uses: dict[int, int] = {}
    for parent in model.modules():
        for child in parent.children():
            uses[id(child)] = uses.get(id(child), 0) + 1
    found = {}
    for parent in model.modules():
        if not isinstance(parent, nn.Sequential):
            continue
        children = list(parent.named_children())
        for (_, child), (next_name, follower) in zip(children, children[1:]):
            act = fusable_activation(follower)
            if id(child) in layers and act is not None and uses[id(child)] == 1 and uses[id(follower)] == 1:
                found[id(child)] = (parent, next_name, act)
    return found


def replace_linear(model: nn.Module, *, dtype: object = None, arch: object = None, m: int | None = None,
                   fuse_activations: bool = True) -> int:
    """Swap every ``nn.Linear`` inside ``model`` for ``generator.nn.Linear``, in place; returns the count.

    Biases go into the kernels' epilogue; with ``fuse_activations`` (default) an activation module that
    directly follows a Linear in an ``nn.Sequential`` (ReLU, GELU, SiLU, Sigmoid, Tanh) is fused into it and
    replaced by ``nn.Identity``. Layers of equal (out_features, in_features, dtype, bias, activation)
    share one op; all distinct kernels are built in one parallel ninja run (cached). ``dtype``, ``arch``
    and ``m`` as for ``Linear``; every layer's compute dtype is checked before anything is swapped.
    ``model`` itself is not replaced when it is a Linear: wrap it with ``Linear(model)``.
    """
    parents = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if _swappable(child)]
    layers = {id(child): child for _, _, child in parents}
    fused = _fused_activations(model, layers) if fuse_activations else {}
    activation = {key: fused[key][2] if key in fused else None for key in layers}
    plans = {key: plan_linear(layer, dtype=dtype, arch=arch, m=m, activation=activation[key])
             for key, layer in layers.items()}
    # Without m, each layer's op holds a kernel per bucket of M (Gemm.compile_buckets); layers of equal
    # buckets share one op.
    # An op is its kernel and the problem its backward kernels are planned for (op_key).
    bounded = {key: tuple((bound, op_key(p)) for bound, p in (plan.bucket_plans() if m is None else [(None, plan)]))
               for key, plan in plans.items()}
    keys = list(dict.fromkeys(op for pairs in bounded.values() for _, op in pairs))
    built = dict(zip(keys, compile_many([config for config, _ in keys], namespace=DEFAULT_NAMESPACE,
                                        problems=[problem for _, problem in keys]))) if keys else {}
    shared = {pairs: built[pairs[0][1]] if m is not None else BucketedOp.from_built(pairs, built)
              for pairs in set(bounded.values())}
    new = {key: Linear(layer, activation=activation[key], op=shared[bounded[key]]) for key, layer in layers.items()}
    for parent, name, child in parents:
        setattr(parent, name, new[id(child)])
    for sequential, name, _ in fused.values():
        setattr(sequential, name, nn.Identity())
    return len(layers)
