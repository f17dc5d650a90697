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

import math
import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .gemm import DEFAULT_NAMESPACE, Gemm, op_key, plan_gradient
from .runtime import BucketedOp, GemmOp, compile_many, leading_dim
from .runtime.sharding import (ShardingRefusal, check_mesh, dtensor_api, free, grad_placements, is_dtensor,
                               is_partial, is_replicate, is_shard, operand_placements, operand_refusal,
                               product_placements, shard)
from .spec.epilogue import activation_name
from .spec.types import INPUT_DTYPES, Order, parse_dtype

__all__ = ["Linear", "plan_linear", "replace_linear"]

#: Activation modules replace_linear fuses into the Linear before them, by the epilogue's name for each.
_FUSABLE = {nn.ReLU: "relu", nn.SiLU: "silu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh"}
#: The same activations in torch, for the fallback path of Linear.
#: The fix a NotLinear refusal names for a row-parallel layer with a fused activation.
_ROW_PARALLEL_ACTIVATION = ("A row-parallel layer takes no fused activation: make it without activation= "
                            "(replace_linear(model, fuse_activations=False)) and keep the activation module after it")
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


class Linear(nn.Linear):
    """``y = act(x @ W.t() + b)`` on one generated kernel; the same Parameters as ``linear``.

    * **An nn.Linear**: a subclass, so that what takes an ``nn.Linear`` takes it (``parallelize_module``'s
      ColwiseParallel and RowwiseParallel, ``isinstance`` checks); ``replace_linear`` never wraps it again.
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
    * **Tensor parallel**: with DTensor inputs or weights (``parallelize_module`` with ColwiseParallel,
      RowwiseParallel, SequenceParallel-style row shards) each rank runs the kernel on its local shards, with the
      placements of the op's sharding rules (``generator.runtime.sharding``); a row-parallel bias is added once,
      and a row-parallel layer takes no fused activation. See ``_forward_dtensor`` and docs/torch.md.
    """

    def __init__(self, linear: nn.Linear, *, dtype: object = None, arch: object = None, m: int | None = None,
                 activation: str | Callable[..., Any] | None = None, op: GemmOp | BucketedOp | None = None) -> None:
        # nn.Module's __init__, not nn.Linear's: that one would allocate weights of its own; the layer's are taken.
        nn.Module.__init__(self)
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

    def _cannot_take(self, x: torch.Tensor, w: torch.Tensor) -> str | None:
        """Why the kernel cannot take ``x`` with the weight ``w`` (None if it can)."""
        if x.device.type != self.op.device_type or x.device != w.device:
            return f"input on {x.device}, weights on {w.device}; the kernel runs on the weights' CUDA device"
        if x.dtype not in (self.compute_dtype, w.dtype):
            return f"input is {x.dtype}; the kernel computes in {self.compute_dtype} (weights {w.dtype})"
        if x.dim() < 1 or x.shape[-1] != w.shape[1]:
            return f"input shape {tuple(x.shape)} does not end in in_features={w.shape[1]}"
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        # The exact types first: a plain tensor and Parameter skip the two isinstance checks (~0.3 us a layer).
        if not (type(x) is torch.Tensor and type(w) is nn.Parameter) and (is_dtensor(w) or is_dtensor(x)):
            return self._forward_dtensor(x, w)
        if self._takes_as_is(x, w):
            return self._run_as_is(x, w, self.bias)
        return self._forward_general(x, w, self.bias)

    def _forward_local(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The layer on plain tensors: the whole layer's, or one rank's shards of x, W and the bias (the sizes are
        ``w``'s, which is a shard's under tensor parallelism)."""
        if self._takes_as_is(x, w):
            return self._run_as_is(x, w, bias)
        return self._forward_general(x, w, bias)

    def _takes_as_is(self, x: torch.Tensor, w: torch.Tensor) -> bool:
        """The common call, told by cheap tensor properties: x on the weights' CUDA device, both in the compute
        dtype and contiguous. It skips the general path's checks and conversions and the op's argument binding
        (a decoding step is host-bound: every microsecond per layer shows)."""
        return (x.is_cuda and x.dtype == self.compute_dtype and w.dtype == self.compute_dtype and x.device == w.device
                and x.dim() > 0 and x.shape[-1] == w.shape[1] and x.is_contiguous() and w.is_contiguous())

    def _run_as_is(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2 = x.view(-1, w.shape[1])
        op = self.op.op_for_rows(x2.shape[0]) if isinstance(self.op, BucketedOp) else self.op
        if bias is None:
            y = op.op.default(x2, w.t())
        else:
            y = op.op.default(x2, w.t(), bias if bias.dtype == op.out_dtype else bias.to(op.out_dtype))
        y = y.view(*x.shape[:-1], w.shape[0])
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def _forward_general(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Any input: the fallback to torch for what the kernel cannot take, casts, copies of non-row-major views."""
        reason = self._cannot_take(x, w)
        if reason is not None:
            if not self._warned:
                self._warned = True
                warnings.warn(f"generator.nn.Linear({self.in_features}, {self.out_features}): {reason}; "
                              "using torch.nn.functional.linear", stacklevel=2)
            return _TORCH_ACTIVATIONS[self.activation](F.linear(x, w, bias))
        if w.dtype != self.compute_dtype:
            w = w.to(self.compute_dtype)
        if leading_dim(w, Order.row) is None:
            w = w.contiguous()
        x2 = x.reshape(-1, w.shape[1])
        if x2.dtype != self.compute_dtype:
            x2 = x2.to(self.compute_dtype)
        if leading_dim(x2, Order.row) is None:
            x2 = x2.contiguous()
        if bias is None:
            y = self.op(x2, w.t())
        else:
            y = self.op(x2, w.t(), bias.to(self.op.out_dtype))
        y = y.reshape(*x.shape[:-1], w.shape[0])
        return y if y.dtype == x.dtype else y.to(x.dtype)

    # -- tensor parallel: DTensor inputs and weights ---------------------------------------------------------------

    def _forward_dtensor(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x, W and the bias as DTensors (``parallelize_module``): the op's sharding rules (the op's A = x, B = W.t())
        give the output's placements and what each operand is taken as; each rank then runs ``_forward_local`` on its
        local shards, whose autograd is the op's own formula on plain tensors (no DTensor inside it), and the local
        gradients leave as DTensors placed as that backward computes them (``grad_placements``). Nothing is gathered:
        what the rules do not take is refused with the fix. (Not the op's DTensor dispatch: its epilogue formula's
        backward does not take DTensors yet, and a row-parallel bias needs ``_added_once``.)"""
        mesh = self._check_dtensors(x, w)
        a = tuple(_as_a(p, x.dim()) for p in x.placements)
        b = tuple(_as_b(p) for p in w.placements)
        rows = (x.numel() // x.shape[-1] if x.shape[-1] else 0, x.shape[-1])
        # No try/except around the rules: torch 2.11's dynamo cannot trace a re-raise (``raise ... from``).
        product = product_placements(f"{self._name} (the op's A = x, B = W.t())", self.op.config.epilogue, (a, rows),
                                     (b, (w.shape[1], w.shape[0])), not_linear_fix=_ROW_PARALLEL_ACTIVATION)
        roles = product.roles
        taken_x = tuple(p if t == q else _x_of(t, x.dim()) for p, q, t in zip(x.placements, a, product.a))
        taken_w = tuple(_as_b(t) for t in product.b)
        x_local = _local(x, taken_x, roles)
        w_local = _local(w, taken_w, roles)
        bias = None if self.bias is None else self._bias_local(self.bias, roles)
        y = self._forward_local(x_local, w_local, bias)
        placements = tuple(_y_of(r, p, x.dim()) for r, p in zip(roles, x.placements))
        shape = (*x.shape[:-1], w.shape[0])
        return dtensor_api().DTensor.from_local(y, mesh, placements, run_check=False, shape=torch.Size(shape),
                                                stride=_contiguous_strides(shape))

    @property
    def _name(self) -> str:
        return f"generator.nn.Linear({self.in_features}, {self.out_features})"

    def _check_dtensors(self, x: torch.Tensor, w: torch.Tensor) -> Any:
        """The mesh of x, W and the bias; refuses a plain tensor among DTensors, two meshes, another device's mesh."""
        name = self._name
        if not is_dtensor(x):
            raise ShardingRefusal(f"{name}: the weight is a DTensor but x is a torch.Tensor: pass x as a DTensor "
                                  "(DTensor.from_local(x, mesh, [Replicate()])), or parallelize the layer with "
                                  "ColwiseParallel or RowwiseParallel, whose input hooks do")
        for t, what in ((w, "the weight"), (self.bias, "the bias")):
            if t is not None and not is_dtensor(t):
                raise ShardingRefusal(f"{name}: x is a DTensor but {what} is a torch.Tensor: distribute the layer's "
                                      "parameters (parallelize_module does), or pass x.to_local()")
            if t is not None:
                check_mesh(name, self.op.device_type, x.device_mesh, t.device_mesh, what, first="x")
        return x.device_mesh

    def _bias_local(self, bias: torch.Tensor, roles: tuple[str, ...]) -> torch.Tensor:
        """This rank's bias: its shard where the output is sharded on N (sliced where it is whole); where the output
        is a partial sum (row-parallel), the whole bias on the first rank of those mesh dimensions and zeros on the
        others (``_added_once``); else the whole bias."""
        ep = self.op.config.epilogue
        wanted = operand_placements(self._name, ep, roles)["bias"]   # (plan_linear's epilogue names it so)
        if free(bias.placements, wanted):
            return _local(bias, wanted, roles)
        if all(free([p], [w]) or (is_partial(w) and is_replicate(p))
               for p, w in zip(bias.placements, wanted)):
            return _added_once(bias, wanted, roles)
        raise operand_refusal(self._name, ep, "bias", bias.placements, wanted, roles)


def _as_a(p: Any, rank: int) -> Any:
    """x's placement as the op's A (M, K): a shard of x's last dimension is K's, of any other M's (the rows)."""
    return shard(1 if p.dim % rank == rank - 1 else 0) if is_shard(p) else p


def _as_b(p: Any) -> Any:
    """W's placement as the op's B = W.t() (K, N), and back: W's rows are N, its columns K."""
    return shard(1 - p.dim % 2) if is_shard(p) else p


def _x_of(a: Any, rank: int) -> Any:
    """x's placement for an A the rules slice on K (a whole x against a weight sharded on in_features)."""
    return shard(rank - 1) if is_shard(a) else a


def _y_of(role: str, x_placement: Any, rank: int) -> Any:
    """The output's placement on a mesh dimension: rows sharded as x's are (any of its leading dimensions), N on
    the last, a partial sum, or whole."""
    dt = dtensor_api()
    if role == "m":
        return x_placement
    if role == "n":
        return shard(rank - 1)
    return dt.partial if role == "partial" else dt.replicate


def _local(t: torch.Tensor, placements: tuple[Any, ...], roles: tuple[str, ...]) -> torch.Tensor:
    """This rank's part of DTensor ``t`` taken as ``placements`` (sliced where it is whole: no communication), with the
    gradient that the local backward gives it placed by ``grad_placements``."""
    if tuple(t.placements) != placements:
        t = t.redistribute(t.device_mesh, placements)
    return t.to_local(grad_placements=grad_placements(placements, roles))


def _added_once(bias: torch.Tensor, wanted: tuple[Any, ...], roles: tuple[str, ...]) -> torch.Tensor:
    """This rank's share of a whole bias where the output is a partial sum: the bias on the first rank of those mesh
    dimensions and zeros on the others, so that the reduction adds it once (DTensor's Replicate -> Partial would give
    every rank bias / size, rounded). It is a table of one row per rank, the bias and then zeros, sharded by rows: each
    rank takes its row, and the bias's gradient, the first rank's, reaches the Replicate parameter through DTensor's
    gather of the table (every row even, so the shapes agree on every rank)."""
    partial = [i for i, p in enumerate(wanted) if is_partial(p)]
    rows = math.prod([bias.device_mesh.size(i) for i in partial])
    row = bias.unsqueeze(0)
    table = torch.cat([row, row.new_zeros((rows - 1, row.shape[1]))])
    placements = tuple(shard(0) if i in partial else shard(1) if is_shard(p) else p
                       for i, p in enumerate(wanted))
    return _local(table, placements, roles).squeeze(0)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A row-major tensor's strides (the layer's output is row-major on every rank)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _swappable(module: nn.Module) -> bool:
    # nn.Linear, or a subclass that keeps its forward (e.g. NonDynamicallyQuantizableLinear); a subclass
    # with its own forward (LoRA adapters, quantized layers) computes something else and is left alone. Our Linear
    # is such a subclass (its forward is the kernel's): never wrapped again, nor a subclass of it.
    return (isinstance(module, nn.Linear) and not isinstance(module, Linear)
            and type(module).forward is nn.Linear.forward)


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
                                        problems=[problem for _, problem in keys],
                                        plan_gradient=plan_gradient()))) if keys else {}
    shared = {pairs: built[pairs[0][1]] if m is not None else BucketedOp.from_built(pairs, built)
              for pairs in set(bounded.values())}
    new = {key: Linear(layer, activation=activation[key], op=shared[bounded[key]]) for key, layer in layers.items()}
    for parent, name, child in parents:
        setattr(parent, name, new[id(child)])
    for sequential, name, _ in fused.values():
        setattr(sequential, name, nn.Identity())
    return len(layers)
