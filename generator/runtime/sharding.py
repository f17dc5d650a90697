"""Tensor parallelism: the DTensor sharding rules of the registered ops (``torch.distributed.tensor``).

``registration._register`` hands every op to ``register_rules``, which registers a strategy for its default overload
with DTensor's sharding propagator. A call with DTensor operands then runs the op's own kernel on each rank's local
tensors, the operands as they are: the strategy reads their placements and names the output's, and offers no other
placements, so DTensor never gathers or reshards an operand for it. What the rules do not take is refused, with the
fix, as a ``ShardingRefusal``. The rules, per mesh dimension, for D = epilogue(A @ B), A (M, K), B (K, N) (3-D: a
batch of problems):

    A              B              D
    Replicate      Replicate      Replicate
    Shard(M)       Replicate      Shard(M)        rows: sequence or data parallel
    Replicate      Shard(N)       Shard(N)        column-parallel (B = W.t() of a ColwiseParallel layer)
    Shard(K)       Shard(K)       Partial         row-parallel: each rank holds a partial sum of acc
    Partial        Replicate      Partial         (or the other way round): a partial sum times a whole
    Shard(batch)   Shard(batch)   Shard(batch)    (or one of them Replicate)

A Replicate operand against one sharded on a dimension it has too (K, the batch; e.g. the whole gradient that
autograd hands the dA op of a row-parallel product) is taken as its local slice of it: Replicate -> Shard costs no
communication, and is the only change the rules make to an operand (a 2-D operand, or a batch of 1, serves every
problem of a sharded batch as it is). Any other pair is refused: e.g. A Shard(K) with B Shard(N), which would need a
gather.

A Partial D is a sum over the ranks only where the epilogue is linear in acc (``partial_operands``): identity,
``alpha * acc``, ``acc * row_scale``; and ``acc + bias`` or ``alpha * acc + beta * C`` when the added operand is Partial
too (each rank holding a share of it, e.g. the whole on one rank and zeros on the others, so that it is added once).
An activation (or any nonlinear function of acc) must follow the reduction: refused. Epilogue operands follow D: a
per-column vector (bias) is Shard(0) where D is sharded on N, a per-row vector where D is on M, a matrix like D;
anything else Replicate. Per-block fp8 scales are taken only where D is Replicate.

``generator.nn.Linear`` takes DTensors its own way: the same rules name the output's placements, and each rank runs
the layer on its local tensors, whose autograd is the op's formula on plain tensors (``grad_placements`` places the
local gradients); see nn.py. A direct DTensor call of an op differentiates through the op's formula on DTensors, whose
dA and dB ops (and a fused epilogue's accumulator op) have these rules too: plain ops with the C++ or the Python
formula, and ops with a fused epilogue (the Python formula).

The DTensor classes are imported with the first op's registration (``load``), not with this module: an
``import generator`` stays free of ``torch.distributed.tensor``; where torch has no distributed package, no rules.
"""
from __future__ import annotations

import functools
import itertools
from typing import Any, NamedTuple, Sequence

import torch

from ..spec.epilogue import MAINLOOP_KINDS, SHAPES, Epilogue, Expr

#: DTensor's classes once ``load`` imported them (None: not imported, or no torch.distributed).
_DT: Any = None

#: One mesh dimension's product: (A's role, B's role) -> D's, each "replicate", "partial" or the name of the sharded
#: dimension (m, n, k, batch). A whole operand against one sharded on a dimension it has too (K, the batch) is taken
#: as its local slice of that dimension (Replicate -> Shard: no communication), as autograd's whole gradients need.
#: A pair that is not here is refused.
_PRODUCT = {
    ("replicate", "replicate"): "replicate",
    ("m", "replicate"): "m",
    ("replicate", "n"): "n",
    ("k", "k"): "partial",
    ("replicate", "k"): "partial",
    ("k", "replicate"): "partial",
    ("partial", "replicate"): "partial",
    ("replicate", "partial"): "partial",
    ("batch", "batch"): "batch",
    ("batch", "replicate"): "batch",   # B one matrix for every problem (2-D or a batch of 1), or its slice
    ("replicate", "batch"): "batch",
}
RULES = ("A Replicate and B Shard(N) (column-parallel, D Shard(N)); A and B Shard(K) (row-parallel, D Partial, for an "
         "epilogue linear in acc; a Replicate one is sliced on K); A Shard(M) and B Replicate (D Shard(M)); a Partial "
         "and a Replicate one (D Partial, linear epilogues); a batch sharded on one or both; or both Replicate")
#: D's roles as messages say them.
_ROLE_TEXT = {"replicate": "whole (Replicate)", "partial": "a partial sum (Partial)", "m": "sharded on M",
              "n": "sharded on N", "batch": "sharded on the batch"}
#: The dimensions each kind of epilogue operand has, in the op's names (per-block scales: none that may be sharded).
_OPERAND_DIMS = {"row": ("m",), "col": ("n",), "matrix": ("m", "n"), "scalar_tensor": ()}


class ShardingRefusal(NotImplementedError, ValueError):
    """DTensor operands whose placements no rule takes, with the fix. A NotImplementedError, which DTensor's dispatch
    passes on as it is (it wraps other errors in a RuntimeError), and a ValueError: the arguments are what is wrong."""


class NotLinear(ShardingRefusal):
    """A partial sum of acc (A and B sharded on K) through an epilogue that is not linear in acc."""


def load() -> bool:
    """Import DTensor's classes (once); False where this torch has no distributed package (no DTensor can exist)."""
    global _DT
    if _DT is None:
        if not torch.distributed.is_available():
            return False
        import torch.distributed.tensor as dt
        from torch.distributed.tensor._dtensor_spec import DTensorSpec
        from torch.distributed.tensor._op_schema import OpSpec, OpStrategy

        # The placements the rules hand out are made here, once: under torch.compile the DTensor path then reads
        # placements and makes none (torch 2.11's dynamo gives a placement made in a compiled frame another type).
        _DT = type("DTensorClasses", (), dict(DTensor=dt.DTensor, Shard=dt.Shard, Replicate=dt.Replicate,
                                              Partial=dt.Partial, DTensorSpec=DTensorSpec, OpSpec=OpSpec,
                                              OpStrategy=OpStrategy, shards=tuple(dt.Shard(d) for d in range(8)),
                                              replicate=dt.Replicate(), partial=dt.Partial(),
                                              other_shards=_subclasses(dt.Shard), other_partials=_subclasses(dt.Partial)))
    return True


def _subclasses(cls: type) -> tuple[type, ...]:
    """Every subclass of ``cls`` defined so far (strided shards, masked or norm partials: placements the rules refuse)."""
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return tuple(found)


# The placement tests below use isinstance, not ``type(p) is``: under torch 2.11's dynamo a placement made inside the
# compiled frame (ColwiseParallel's input hook makes a Replicate()) has a type that is not its class.

def shard(dim: int) -> Any:
    """Shard(dim), one of those made at ``load`` (a dimension past them, rare, made here)."""
    return _DT.shards[dim] if dim < len(_DT.shards) else _DT.Shard(dim)


def is_replicate(p: Any) -> bool:
    return isinstance(p, _DT.Replicate)


def is_shard(p: Any) -> bool:
    """A plain Shard (not a strided one)."""
    return isinstance(p, _DT.Shard) and not isinstance(p, _DT.other_shards)


def is_partial(p: Any) -> bool:
    """A plain Partial of any reduction (not a masked one)."""
    return isinstance(p, _DT.Partial) and not isinstance(p, _DT.other_partials)


def dtensor_api() -> Any:
    """DTensor's classes, once ``load`` imported them: .DTensor, .Shard, .Replicate, .Partial (None before)."""
    return _DT


def is_dtensor(t: object) -> bool:
    """Whether ``t`` is a DTensor (False before any op was registered: no DTensor classes imported, none to meet)."""
    return _DT is not None and isinstance(t, _DT.DTensor)


# -- which epilogues a partial sum of acc passes through ----------------------------------------------------------

def _degree(node: Expr, partial: frozenset[str], memo: dict[Expr, int | None]) -> int | None:
    """0: free of acc and of the ``partial`` operands; 1: linear in them (homogeneous); None: neither."""
    if node in memo:
        return memo[node]
    if node.op == "acc":
        return 1
    if node.op == "const":
        return 0
    if node.op == "operand":
        return 1 if node.name in partial else 0
    args = [_degree(a, partial, memo) for a in node.args]
    if None in args:
        degree = None
    elif node.op in ("add", "sub"):
        degree = args[0] if args[0] == args[1] else None   # acc + bias with a whole bias: affine, not linear
    elif node.op == "neg":
        degree = args[0]
    elif node.op == "mul":
        degree = sum(args) if sum(args) <= 1 else None
    elif node.op == "div":
        degree = args[0] if args[1] == 0 else None
    else:   # activations, clamp, max, min, abs: linear only in what they do not touch
        degree = 0 if not any(args) else None
    memo[node] = degree
    return degree


def partial_operands(ep: Epilogue) -> frozenset[str] | None:
    """For acc Partial (A and B sharded on K): the fewest tensor operands that must be Partial too for D (and aux) to
    be the sum of the ranks' D and aux, the others being whole factors (Replicate); None where none do (D not linear
    in acc: an activation of it, acc * acc). A small search (an epilogue has a few operands), not cached: torch.compile
    traces it into a constant, and would warn that it skips an lru_cache."""
    tensors = [o.name for o in ep.operands if o.kind != "scalar" and o.kind not in MAINLOOP_KINDS]
    roots = [root for root in (ep.result, ep.aux) if root is not None]
    for size in range(len(tensors) + 1):
        for chosen in itertools.combinations(tensors, size):
            if all(_degree(root, frozenset(chosen), {}) == 1 for root in roots):
                return frozenset(chosen)
    return None


# -- the rules, on placements ---------------------------------------------------------------------------------------

def _dims(shape: Sequence[int], operand: str) -> tuple[str, ...]:
    """The names of A's, B's or D's dimensions: (m, k), (k, n), (m, n), with a leading batch for a 3-D one."""
    names = {"A": ("m", "k"), "B": ("k", "n"), "D": ("m", "n")}[operand]
    return names if len(shape) < 3 else ("batch", *names)


def _role(placement: Any, dims: tuple[str, ...], name: str, what: str, mesh_dim: int) -> str:
    """"replicate", "partial" or the name of the sharded dimension; other placements (a Partial other than a sum,
    strided or masked shards) are refused."""
    if is_replicate(placement):
        return "replicate"
    if is_partial(placement) and placement.reduce_op == "sum":
        return "partial"
    if is_shard(placement):
        return dims[placement.dim % len(dims)]
    raise ShardingRefusal(f"{name}: {what} is {placement} on mesh dimension {mesh_dim}, which these rules do not take "
                          "(Shard, Replicate and Partial sums only): redistribute it first")


def describe(placement: Any, dims: tuple[str, ...] = ()) -> str:
    """A placement as messages name it: 'Shard(1) (K)', 'Replicate()', 'Partial()' (a sum)."""
    if is_shard(placement) and dims:
        return f"Shard({placement.dim % len(dims)}) ({dims[placement.dim % len(dims)].upper()})"
    if is_partial(placement) and placement.reduce_op == "sum":
        return "Partial()"
    return repr(placement)


class Product(NamedTuple):
    """One call's sharding: D's role on each mesh dimension ("replicate", "partial", "m", "n", "batch"), and the
    placements A and B are taken in (theirs, but for a whole operand sliced where the other is sharded on a dimension
    it has too)."""

    roles: tuple[str, ...]
    a: tuple[Any, ...]
    b: tuple[Any, ...]


def _taken(role: str, other: str, dims: tuple[str, ...], shape: Sequence[int], placement: Any) -> Any:
    """How a whole operand (``role`` replicate) is taken against the other's ``other``: sliced on K or the batch where
    the other is sharded on it (a 3-D operand with a batch of 1 serves every problem as it is)."""
    if role != "replicate" or other not in ("k", "batch"):
        return placement
    if other == "batch" and (len(shape) < 3 or shape[0] == 1):
        return placement
    return shard(dims.index(other))


def product_placements(name: str, ep: Epilogue, a: tuple[Sequence[Any], Sequence[int]],
                       b: tuple[Sequence[Any], Sequence[int]], not_linear_fix: str | None = None) -> Product:
    """D's roles and A's and B's placements as taken, from A's and B's (placements, global shape); refuses pairs no
    rule takes, and a Partial D of an epilogue that is not linear in acc (with ``not_linear_fix`` where the caller
    knows a better fix than the op's)."""
    (a_placements, a_shape), (b_placements, b_shape) = a, b
    a_dims, b_dims = _dims(a_shape, "A"), _dims(b_shape, "B")
    roles, a_taken, b_taken = [], [], []
    for i, (pa, pb) in enumerate(zip(a_placements, b_placements)):
        ra, rb = _role(pa, a_dims, name, "A", i), _role(pb, b_dims, name, "B", i)
        out = _PRODUCT.get((ra, rb))
        if out is None:
            raise ShardingRefusal(
                f"{name}: on mesh dimension {i}, A {tuple(a_shape)} is {describe(pa, a_dims)} and B {tuple(b_shape)} "
                f"is {describe(pb, b_dims)}, which no rule takes (the op computes on each rank's shards; it never "
                f"gathers an operand). The rules: {RULES}. Redistribute A or B to one of these first "
                "(t.redistribute(mesh, placements))")
        if out == "partial" and partial_operands(ep) is None:
            raise NotLinear(
                f"{name}: on mesh dimension {i} each rank holds a partial sum of acc (A {describe(pa, a_dims)}, B "
                f"{describe(pb, b_dims)}), but D = {ep.text} is not linear in acc: the sum of the ranks' D would not "
                "be D. " + (not_linear_fix or "Shard B on N instead (column-parallel), or plan the op without the "
                            "nonlinear part and apply it after the reduction (D.redistribute(placements=[Replicate()]))"))
        roles.append(out)
        a_taken.append(_taken(ra, rb, a_dims, a_shape, pa))
        b_taken.append(_taken(rb, ra, b_dims, b_shape, pb))
    return Product(tuple(roles), tuple(a_taken), tuple(b_taken))


def free(got: Sequence[Any], wanted: Sequence[Any]) -> bool:
    """Whether an operand placed ``got`` is taken as ``wanted`` without communication: equal, or sliced (Replicate ->
    Shard). Replicate -> Partial would divide it by the mesh size (a bias added in shares), and anything else
    gathers: both refused."""
    return all(g == w or (is_replicate(g) and is_shard(w)) for g, w in zip(got, wanted))


def output_placements(roles: Sequence[str], rank: int) -> tuple[Any, ...]:
    """D's placements (rank 2, or 3 for a batch) from its roles."""
    dims = ("batch", "m", "n")[3 - rank:]
    return tuple(_DT.replicate if r == "replicate" else _DT.partial if r == "partial" else shard(dims.index(r))
                 for r in roles)


def operand_placements(name: str, ep: Epilogue, roles: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """The placements each tensor operand of the epilogue must have, by name, where D has ``roles``."""
    partial = partial_operands(ep) if "partial" in roles else frozenset()
    wanted = {}
    for operand in ep.operands:
        if operand.kind == "scalar":
            continue
        dims = _OPERAND_DIMS.get(operand.kind)
        if dims is None and any(r != "replicate" for r in roles):
            raise ShardingRefusal(f"{name}: {operand.name} holds per-block scales, which these rules do not shard: "
                                  "replicate A and B, or call the op on the local tensors (t.to_local())")
        wanted[operand.name] = tuple(
            _DT.partial if r == "partial" and operand.name in partial
            else shard(dims.index(r)) if dims and r in dims else _DT.replicate for r in roles)
    return wanted


def operand_refusal(name: str, ep: Epilogue, operand: str, got: Sequence[Any], wanted: Sequence[Any],
                    roles: Sequence[str]) -> ShardingRefusal:
    """The refusal of an epilogue operand placed otherwise than D's roles need (``operand_placements``)."""
    op = ep.operand(operand)
    i = next(i for i, (g, w) in enumerate(zip(got, wanted)) if not free([g], [w]))
    if is_partial(wanted[i]):
        fix = ("pass it as a Partial DTensor holding each rank's share (generator.nn.Linear gives a row-parallel bias "
               "whole to the first rank of the mesh dimension and zeros to the others, so that it is added once), or "
               "call the op without it and add it after the reduction")
    elif is_shard(wanted[i]):
        fix = f"shard it as D's {roles[i].upper()} is (distribute_tensor(t, mesh, [Shard({wanted[i].dim})]))"
    else:
        fix = "replicate it (t.redistribute(placements=[Replicate()]))"
    return ShardingRefusal(f"{name}: {operand} ({op.kind}, {SHAPES[op.kind]}) is {describe(got[i])} on mesh dimension "
                           f"{i}, where D is {_ROLE_TEXT[roles[i]]}; it must be {describe(wanted[i])}: {fix}")


def grad_placements(placements: Sequence[Any], roles: Sequence[str]) -> tuple[Any, ...]:
    """The placements of the gradient that the local backward gives an operand of ``placements`` (A, B or an epilogue
    operand) of a product whose D has ``roles``: a shard's own gradient is that shard's; a Partial operand's is whole
    (each rank's dD is the whole one); a whole operand's is whole only where D is, else a partial sum (the backward
    sums over the shards of D, or multiplies a partial sum)."""
    return tuple(_DT.replicate if is_partial(p)
                 else (_DT.replicate if r == "replicate" else _DT.partial) if is_replicate(p)
                 else p for p, r in zip(placements, roles))


def check_mesh(name: str, device_type: str, mesh: Any, other: Any = None, what: str = "", first: str = "A") -> None:
    """Every operand on one mesh (``what``'s ``other`` and ``first``'s ``mesh``), of the device type the op runs on."""
    if other is not None and other != mesh:
        raise ShardingRefusal(f"{name}: {first} and {what} are DTensors on different device meshes ({mesh} and "
                              f"{other}): put every operand on one mesh")
    if mesh.device_type != device_type:
        raise ShardingRefusal(f"{name}: its operands are DTensors on a {mesh.device_type} mesh; this op runs on "
                              f"{device_type} tensors: build the mesh with init_device_mesh({device_type!r}, ...)")


# -- registration with DTensor --------------------------------------------------------------------------------------

def _spec(arg: object) -> object:
    """An argument of the strategy's schema as a DTensorSpec (DTensor wraps each in an OpStrategy of one spec)."""
    return arg.strategies[0].output_spec if isinstance(arg, _DT.OpStrategy) else arg


def _strategy(op: Any, op_schema: Any) -> Any:
    """The one OpSpec of a call of ``op`` (a GemmOp): D by the rules, the operands as they are or sliced."""
    names = [a.name for a in op_schema.op._schema.arguments]
    positional = [_spec(a) for a in op_schema.args_schema]
    given = dict(zip(names, positional)) | {k: _spec(v) for k, v in op_schema.kwargs_schema.items()}
    A, B = given["A"], given["B"]
    ep = op.config.epilogue
    check_mesh(op.name, op.device_type, A.mesh, B.mesh, "B")
    product = product_placements(op.name, ep, (A.placements, A.shape), (B.placements, B.shape))
    taken = {"A": product.a, "B": product.b}
    for operand, wanted in operand_placements(op.name, ep, product.roles).items():
        spec = given.get(operand)
        if isinstance(spec, _DT.DTensorSpec):
            check_mesh(op.name, op.device_type, A.mesh, spec.mesh, operand)
            if not free(spec.placements, wanted):
                raise operand_refusal(op.name, ep, operand, spec.placements, wanted, product.roles)
            taken[operand] = wanted
    d = _DT.DTensorSpec(A.mesh, output_placements(product.roles, max(len(A.shape), len(B.shape))))
    inputs = [_DT.DTensorSpec(a.mesh, taken.get(n, a.placements), a.tensor_meta)
              for n, a in zip(names, positional) if isinstance(a, _DT.DTensorSpec)]
    return _DT.OpStrategy([_DT.OpSpec(output_specs=(d, d) if ep.aux is not None else d, input_specs=inputs,
                                      redistribute_cost=[[0.0] for _ in inputs])])


def _refuse_grouped(op: Any, overload: str) -> Any:
    def strategy(op_schema: Any) -> Any:
        raise ShardingRefusal(f"{op.name}.{overload}: grouped calls take no DTensor operands (there are no rules for "
                              "a mixture of experts' rows yet): call it on the local tensors (t.to_local()) and wrap "
                              "the result with DTensor.from_local")
    return strategy


def register_rules(op: Any, grouped: bool) -> None:
    """Register the strategy of ``op``'s default overload with DTensor, and a refusal for its grouped overloads. The
    .out overload has none of its own: DTensor decomposes it (CompositeImplicitAutograd) into the default one and
    a copy into ``out``."""
    if not load():
        return
    from torch.distributed.tensor import DTensor

    propagator = DTensor._op_dispatcher.sharding_propagator
    overloads = getattr(getattr(torch.ops, op.namespace), op.name)
    propagator.register_op_strategy(overloads.default, functools.partial(_strategy, op))
    if grouped:
        for overload in ("grouped", "grouped_list", "masked"):
            propagator.register_op_strategy(getattr(overloads, overload), _refuse_grouped(op, overload))
