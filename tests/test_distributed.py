"""Tensor parallelism without a GPU (issue 37, item 2): the sharding rules of generator.runtime.sharding, the ops
called with DTensors, and generator.nn.Linear under parallelize_module (ColwiseParallel, RowwiseParallel).

The ranks are simulated in this one process on a fake process group (torch's "fake" backend, FakeStore), world size
2, on a CPU mesh, in two ways:

* this process as rank 0: collectives do nothing, so these tests check what DTensor hands rank 0 and what comes back,
  the output's placements, its local shape and the local GEMM's numbers (rank 0's shards by torch.matmul);
* under LocalTensorMode (torch.distributed._local_tensor), where every tensor holds both ranks' values and the
  collectives do their arithmetic: a tensor-parallel model's output and gradients are compared with the single-device
  model's (skipped where this torch has no LocalTensorMode).

The ops are test_autograd_cpu's ReferenceOp: the real registration (schema, fake, autograd formula, and now the
DTensor strategy), the real argument checks, and torch.matmul on CPU tensors in place of the kernel (so the mesh is a
CPU mesh and the op's device type "cpu"). tests/gpu/test_tensor_parallel.py runs the kernels on two GPUs with NCCL.
"""
from __future__ import annotations

import contextlib
import copy

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():   # pragma: no cover
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh  # noqa
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from generator import Gemm  # noqa: E402
from generator import epilogue as ep  # noqa: E402
from generator import nn as gnn  # noqa: E402
from generator.nn import Linear, plan_linear, replace_linear  # noqa: E402
from generator.runtime import jit_runtime, sharding  # noqa: E402
from generator.runtime.sharding import NotLinear, ShardingRefusal, grad_placements, partial_operands  # noqa: E402
from generator.spec.epilogue import from_knobs, trace  # noqa: E402
from test_autograd_cpu import BOUND, ReferenceOp, formula, rel  # noqa: E402,F401  (formula: a fixture)

try:
    from torch.distributed._local_tensor import LocalTensorMode
except ImportError:   # pragma: no cover
    LocalTensorMode = None
needs_local_tensor = pytest.mark.skipif(LocalTensorMode is None, reason="this torch has no LocalTensorMode")

NAMESPACE = "gemmgen_tp"
WORLD = 2
BF16 = torch.bfloat16


@pytest.fixture(scope="module", autouse=True)
def fake_group():
    """World size 2, this process rank 0, collectives that do nothing (unless LocalTensorMode does them)."""
    if dist.is_initialized():   # pragma: no cover
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
    sharding.load()
    yield
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def python_formula(request, monkeypatch):
    """The ops registered here take generator.runtime.autograd's Python formula (no JIT runtime build); the op-level
    backward test runs both formulas through test_autograd_cpu's ``formula`` fixture instead."""
    if "formula" not in request.fixturenames:
        monkeypatch.setattr(jit_runtime.RUNTIME, "register_autograd", lambda op, configs, epilogue=None: False)


@pytest.fixture
def mesh():
    return init_device_mesh("cpu", (WORLD,))


@contextlib.contextmanager
def all_ranks():
    """Both ranks at once (LocalTensorMode), with a CPU mesh made inside it."""
    with LocalTensorMode(WORLD):
        yield init_device_mesh("cpu", (WORLD,))


def ref_op(layout: str = "tn", namespace: str = NAMESPACE, **kw) -> ReferenceOp:
    return ReferenceOp(Gemm(dtype="bf16", layout=layout, arch=90, **kw).config, namespace)


def ref_linear(layer: nn.Linear, activation: str | None = None) -> Linear:
    return Linear(layer, activation=activation,
                  op=ReferenceOp(plan_linear(layer, arch=90, activation=activation).config, NAMESPACE))


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(BF16)


def half(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Rank 0's shard of ``t`` on ``dim`` (torch.chunk's, as DTensor's Shard)."""
    return t.chunk(WORLD, dim)[0]


def product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b (+ bias) as the reference op computes it: fp32 accumulation, one rounding to bf16."""
    acc = a.float() @ b.float()
    return (acc if bias is None else acc + bias.float()).to(BF16)


# -- the rules, on placements ---------------------------------------------------------------------------------------

def _aux(acc, bias: ep.Col):
    return acc + bias, acc


def _scaled(acc, scale: ep.Row, alpha: ep.Scalar):
    return alpha * acc * scale


def _c_and_bias(acc, bias: ep.Col, C: ep.Matrix, beta: ep.Scalar):
    return acc + beta * C + bias


@pytest.mark.parametrize("epilogue, partial", [
    (from_knobs(), frozenset()),
    (from_knobs(alpha="scalar"), frozenset()),
    (from_knobs(bias="col"), frozenset({"bias"})),
    (trace(_c_and_bias), frozenset({"bias", "C"})),
    (trace(_scaled), frozenset()),                   # a whole factor: Replicate
    (trace(_aux), frozenset({"bias"})),             # aux = acc is linear too
    (from_knobs(activation="gelu"), None),
    (from_knobs(activation="relu", bias="col"), None),
], ids=["identity", "alpha", "bias", "C_and_bias", "row_scale", "aux", "gelu", "relu_bias"])
def test_which_epilogues_pass_a_partial_sum(epilogue, partial):
    assert partial_operands(epilogue) == partial


IDENTITY = from_knobs()
R, P = Replicate(), Partial()


@pytest.mark.parametrize("a, b, roles, a_taken, b_taken", [
    ([R], [R], ("replicate",), [R], [R]),
    ([Shard(0)], [R], ("m",), [Shard(0)], [R]),
    ([R], [Shard(1)], ("n",), [R], [Shard(1)]),
    ([Shard(1)], [Shard(0)], ("partial",), [Shard(1)], [Shard(0)]),
    ([R], [Shard(0)], ("partial",), [Shard(1)], [Shard(0)]),      # the whole A sliced on K: no communication
    ([Shard(1)], [R], ("partial",), [Shard(1)], [Shard(0)]),
    ([P], [R], ("partial",), [P], [R]),
    ([Shard(0), R], [R, Shard(1)], ("m", "n"), [Shard(0), R], [R, Shard(1)]),   # a 2-D mesh: rows and columns
], ids=["replicate", "rows", "colwise", "rowwise", "rowwise_a_sliced", "rowwise_b_sliced", "partial_a", "mesh_2d"])
def test_the_product_rules(a, b, roles, a_taken, b_taken):
    got = sharding.product_placements("op", IDENTITY, (a, (8, 16)), (b, (16, 12)))
    assert got == (roles, tuple(a_taken), tuple(b_taken))


def test_batch_rules():
    three, two = (4, 8, 16), (16, 12)
    assert sharding.product_placements("op", IDENTITY, ([Shard(0)], three), ([R], two)).roles == ("batch",)
    got = sharding.product_placements("op", IDENTITY, ([Shard(0)], three), ([R], (4, 16, 12)))
    assert got.roles == ("batch",) and got.b == (Shard(0),)      # a whole batch of B: its slice
    assert sharding.product_placements("op", IDENTITY, ([Shard(0)], three), ([R], (1, 16, 12))).b == (R,)
    assert sharding.output_placements(("batch",), 3) == (Shard(0),)
    assert sharding.output_placements(("m", "n", "partial"), 3) == (Shard(1), Shard(2), P)


def test_the_rules_refuse_what_would_need_a_gather_or_a_nonlinear_sum():
    with pytest.raises(ShardingRefusal, match=r"A \(8, 16\) is Shard\(1\) \(K\) and B \(16, 12\) is Shard\(1\) \(N\), "
                                              r"which no rule takes .* Redistribute A or B"):
        sharding.product_placements("op", IDENTITY, ([Shard(1)], (8, 16)), ([Shard(1)], (16, 12)))
    with pytest.raises(NotLinear, match=r"D = gelu\(acc\) is not linear in acc.*Shard B on N instead"):
        sharding.product_placements("op", from_knobs(activation="gelu"), ([Shard(1)], (8, 16)), ([Shard(0)], (16, 12)))
    with pytest.raises(ShardingRefusal, match=r"Partial sums only"):
        sharding.product_placements("op", IDENTITY, ([Partial("max")], (8, 16)), ([R], (16, 12)))
    assert issubclass(ShardingRefusal, NotImplementedError) and issubclass(ShardingRefusal, ValueError)


def test_epilogue_operands_follow_d():
    bias = from_knobs(bias="col")
    assert sharding.operand_placements("op", bias, ("n",)) == {"bias": (Shard(0),)}
    assert sharding.operand_placements("op", bias, ("m",)) == {"bias": (R,)}
    assert sharding.operand_placements("op", bias, ("partial", "n")) == {"bias": (P, Shard(0))}
    assert sharding.operand_placements("op", trace(_c_and_bias), ("m",)) == {"bias": (R,), "C": (Shard(0),)}
    assert sharding.operand_placements("op", trace(_scaled), ("partial",)) == {"scale": (R,)}


def test_gradient_placements_of_the_local_backward():
    # a shard's gradient is its shard's; a Partial input's is whole; a whole input's is a partial sum unless D is whole
    assert grad_placements([Shard(0), R, R, P], ("n", "n", "replicate", "partial")) == (Shard(0), P, R, R)


# -- ops called with DTensors (rank 0 of a fake group) ---------------------------------------------------------------

def test_colwise_call_runs_the_local_gemm_on_each_shard(mesh):
    op = ref_op(bias="col")
    x, w, b = randn(8, 16), randn(12, 16), randn(12)
    d = op(distribute_tensor(x, mesh, [R]), distribute_tensor(w, mesh, [Shard(0)]).t(),
           distribute_tensor(b, mesh, [Shard(0)]))
    assert isinstance(d, DTensor) and d.placements == (Shard(1),) and d.shape == (8, 12)
    assert d.to_local().shape == (8, 6)
    assert torch.equal(d.to_local(), product(x, half(w, 0).t(), half(b, 0)))


def test_rowwise_call_gives_a_partial_sum(mesh):
    op = ref_op()
    x, w = randn(8, 16), randn(12, 16)
    d = op(distribute_tensor(x, mesh, [Shard(1)]), distribute_tensor(w, mesh, [Shard(1)]).t())
    assert d.placements == (P,) and d.to_local().shape == (8, 12)
    assert torch.equal(d.to_local(), product(half(x, 1), half(w, 1).t()))
    sliced = op(distribute_tensor(x, mesh, [R]), distribute_tensor(w, mesh, [Shard(1)]).t())   # x sliced on K
    assert sliced.placements == (P,) and torch.equal(sliced.to_local(), d.to_local())


def test_rowwise_call_takes_a_partial_bias(mesh):
    op = ref_op(bias="col")
    x, w, b = randn(8, 16), randn(12, 16), randn(12)
    share = DTensor.from_local(b, mesh, [P], run_check=False)   # rank 0's share: the whole bias
    d = op(distribute_tensor(x, mesh, [Shard(1)]), distribute_tensor(w, mesh, [Shard(1)]).t(), share)
    assert d.placements == (P,)
    assert torch.equal(d.to_local(), product(half(x, 1), half(w, 1).t(), b))
    refusal = (r"bias \(col, \(N,\)\) is Replicate\(\) on mesh dimension 0, where D is a partial sum \(Partial\); it "
               r"must be Partial\(\): pass it as a Partial")
    with pytest.raises(ShardingRefusal, match=refusal):
        op(distribute_tensor(x, mesh, [Shard(1)]), distribute_tensor(w, mesh, [Shard(1)]).t(),
           distribute_tensor(b, mesh, [R]))


def test_row_and_batch_shards(mesh):
    op = ref_op()
    x, w = randn(8, 16), randn(12, 16)
    d = op(distribute_tensor(x, mesh, [Shard(0)]), distribute_tensor(w, mesh, [R]).t())
    assert d.placements == (Shard(0),) and d.to_local().shape == (4, 12)
    assert torch.equal(d.to_local(), product(half(x, 0), w.t()))
    xb = randn(4, 8, 16)
    d = op(distribute_tensor(xb, mesh, [Shard(0)]), distribute_tensor(w, mesh, [R]).t())
    assert d.placements == (Shard(0),) and d.to_local().shape == (2, 8, 12)
    assert torch.equal(d.to_local(), product(half(xb, 0), w.t()))


def test_a_second_output_is_placed_as_d(mesh):
    op = ref_op(epilogue=_aux)
    x, w, b = randn(8, 16), randn(12, 16), randn(12)
    d, aux = op(distribute_tensor(x, mesh, [R]), distribute_tensor(w, mesh, [Shard(0)]).t(),
                distribute_tensor(b, mesh, [Shard(0)]))
    assert d.placements == aux.placements == (Shard(1),) and aux.to_local().shape == (8, 6)
    assert torch.equal(aux.to_local(), product(x, half(w, 0).t()))


def test_op_refusals_name_the_fix(mesh):
    x, w = randn(8, 16), randn(12, 16)
    rowwise = (distribute_tensor(x, mesh, [Shard(1)]), distribute_tensor(w, mesh, [Shard(1)]).t())
    relu = ref_op(activation="relu")
    with pytest.raises(NotLinear, match=r"D = relu\(acc\) is not linear in acc"):
        relu(*rowwise)
    plain = ref_op()
    with pytest.raises(ShardingRefusal, match=r"is Shard\(1\) \(K\) and B \(16, 12\) is Shard\(1\) \(N\)"):
        plain(distribute_tensor(x, mesh, [Shard(1)]), distribute_tensor(w, mesh, [Shard(0)]).t())
    cuda_op = ref_op(namespace=NAMESPACE + "_cuda")
    cuda_op.device_type = "cuda"   # as a real op. DTensor runs the op's fake before its strategy: the fake refuses
    with pytest.raises(RuntimeError, match=r"A is on cpu; this op runs on CUDA tensors: pass A.cuda\(\)"):
        cuda_op(*rowwise)
    with pytest.raises(ShardingRefusal, match=r"\.grouped: grouped calls take no DTensor operands.*to_local"):
        plain.grouped(distribute_tensor(x, mesh, [R]), distribute_tensor(randn(2, 16, 12), mesh, [R]),
                      distribute_tensor(torch.tensor([4, 8], dtype=torch.int32), mesh, [R]))


def test_out_overload_decomposes_into_the_rules(mesh):
    op = ref_op()
    x, w = randn(8, 16), randn(12, 16)
    out = distribute_tensor(torch.zeros(8, 12, dtype=BF16), mesh, [Shard(1)])
    got = op(distribute_tensor(x, mesh, [R]), distribute_tensor(w, mesh, [Shard(0)]).t(), out=out)
    assert got.placements == (Shard(1),) and torch.equal(out.to_local(), product(x, half(w, 0).t()))


@needs_local_tensor
@pytest.mark.parametrize("x_placement, w_placement, d_placement, dx, dw", [
    (R, Shard(0), Shard(1), P, Shard(0)),            # column-parallel: x's gradient sums over N's shards
    (Shard(1), Shard(1), P, Shard(1), Shard(1)),     # row-parallel
    (Shard(0), R, Shard(0), Shard(0), P),            # rows: W's gradient sums over the rows' shards
], ids=["colwise", "rowwise", "rows"])
def test_a_plain_op_differentiates_on_dtensors(formula, x_placement, w_placement, d_placement, dx, dw):  # noqa: F811
    """A direct DTensor call of an op without epilogue: its formula (C++ or Python) runs the dA and dB ops on
    DTensors, by their rules too; the gradients match torch's in float32."""
    op = ref_op(namespace=formula)
    assert op.cpp_autograd == (formula == "gemmgen_reference")   # (test_autograd_cpu's namespaces)
    x, w, g = randn(8, 16), randn(12, 16), randn(8, 12)
    with all_ranks() as mesh:
        xd = distribute_tensor(x, mesh, [x_placement]).requires_grad_()
        wd = distribute_tensor(w, mesh, [w_placement]).requires_grad_()
        d = op(xd, wd.t())
        assert d.placements == (d_placement,)
        d.backward(distribute_tensor(g, mesh, [d_placement if d_placement != P else R]))
        assert xd.grad.placements == (dx,) and wd.grad.placements == (dw,)
        x_ref, w_ref = x.float().requires_grad_(), w.float().requires_grad_()
        (x_ref @ w_ref.t()).backward(g.float())
        assert rel(d.full_tensor(), x.float() @ w.float().t()) <= BOUND[BF16]
        assert rel(xd.grad.full_tensor(), x_ref.grad) <= BOUND[BF16]
        assert rel(wd.grad.full_tensor(), w_ref.grad) <= BOUND[BF16]


@needs_local_tensor
@pytest.mark.parametrize("knobs", [dict(bias="col"), dict(bias="col", activation="gelu_tanh")], ids=["bias", "gelu"])
def test_a_fused_epilogue_op_differentiates_on_dtensors(knobs):
    """Column-parallel, with the bias sharded along: the epilogue's Python formula on DTensors (a bias alone reads no
    acc, and its zero accumulator is made like A, a DTensor; gelu recomputes acc by the accumulator op's rules)."""
    op = ref_op(**knobs)
    x, w, b, g = randn(8, 16), randn(12, 16), randn(12), randn(8, 12)
    with all_ranks() as mesh:
        xd = distribute_tensor(x, mesh, [R]).requires_grad_()
        wd = distribute_tensor(w, mesh, [Shard(0)]).requires_grad_()
        bd = distribute_tensor(b, mesh, [Shard(0)]).requires_grad_()
        d = op(xd, wd.t(), bd)
        assert d.placements == (Shard(1),)
        d.backward(distribute_tensor(g, mesh, [Shard(1)]))
        refs = [t.float().requires_grad_() for t in (x, w, b)]
        h = refs[0] @ refs[1].t() + refs[2]
        y = torch.nn.functional.gelu(h, approximate="tanh") if "activation" in knobs else h
        y.backward(g.float())
        assert rel(d.full_tensor(), y.detach()) <= BOUND[BF16]
        for got, ref in zip((xd, wd, bd), refs):
            assert rel(got.grad.full_tensor(), ref.grad) <= BOUND[BF16]


# -- generator.nn.Linear ----------------------------------------------------------------------------------------------

def test_linear_is_an_nn_linear_with_the_layers_parameters():
    layer = nn.Linear(16, 8).to(BF16)
    ours = ref_linear(layer)
    assert isinstance(ours, nn.Linear)
    assert ours.weight is layer.weight and ours.bias is layer.bias
    assert list(ours.state_dict()) == list(layer.state_dict()) == ["weight", "bias"]
    assert [p for p in ours.parameters()] == [layer.weight, layer.bias]
    x = randn(3, 16)
    assert torch.equal(ours(x), product(x, layer.weight.t(), layer.bias))


def test_replace_linear_leaves_user_subclasses_and_ours_alone(monkeypatch):
    monkeypatch.setattr(gnn, "compile_many", lambda configs, *, namespace, verbose=False, problems=None, plan_gradient=None:
                        [ReferenceOp(c, NAMESPACE) for c in configs])

    class Lora(nn.Linear):          # its own forward: computes something else
        def forward(self, x):
            return super().forward(x) * 2

    class Plain(nn.Linear):         # nn.Linear's forward: swapped, as NonDynamicallyQuantizableLinear is
        pass

    class OursToo(Linear):          # a subclass of ours (its forward is ours)
        pass

    ours = ref_linear(nn.Linear(8, 8).to(BF16))
    mine = OursToo(nn.Linear(8, 8).to(BF16), op=ours.op)
    model = nn.Sequential(nn.Linear(8, 8), Lora(8, 8), Plain(8, 8), ours, mine).to(BF16)
    assert replace_linear(model, arch=90) == 2
    assert type(model[0]) is Linear and type(model[1]) is Lora and type(model[2]) is Linear
    assert model[3] is ours and model[4] is mine
    assert replace_linear(model, arch=90) == 0      # nothing left to swap: ours are never wrapped again


def tp_mlp(bias: bool = True, fuse: bool = False) -> tuple[nn.Sequential, nn.Sequential]:
    """(the stock bf16 MLP Linear(16, 32) -> GELU -> Linear(32, 8), the same with our layers)."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(16, 32, bias=bias), nn.GELU(), nn.Linear(32, 8, bias=bias)).to(BF16)
    ours = copy.deepcopy(base)
    if fuse:   # replace_linear fuses the GELU into the column-parallel layer
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gnn, "compile_many", lambda configs, *, namespace, verbose=False, problems=None, plan_gradient=None:
                       [ReferenceOp(c, NAMESPACE) for c in configs])
            assert replace_linear(ours, arch=90) == 2 and ours[0].activation == "gelu"
    else:
        ours[0], ours[2] = ref_linear(ours[0]), ref_linear(ours[2])
    return base, ours


PLAN = {"0": ColwiseParallel(), "2": RowwiseParallel()}


def test_parallelize_module_takes_our_linear(mesh):
    """Rank 0 of a fake group: the weights are sharded (no NotImplementedError for a non-nn.Linear), rank 0 runs its
    shards, and its output is its partial sum plus the bias once (the fake all-reduce adds nothing)."""
    base, ours = tp_mlp()
    parallelize_module(ours, mesh, PLAN)
    w0, b0, w2, b2 = (p.detach() for p in base.parameters())
    assert ours[0].weight.placements == (Shard(0),) and ours[0].weight.to_local().shape == (16, 16)
    assert ours[2].weight.placements == (Shard(1),) and ours[2].weight.to_local().shape == (8, 16)
    x = randn(3, 5, 16).requires_grad_()
    y = ours(x)
    assert type(y) is not DTensor and y.shape == (3, 5, 8)   # use_local_output: the reduced, replicated output
    h = torch.nn.functional.gelu(product(x.detach(), half(w0, 0).t(), half(b0, 0)))
    assert rel(y, product(h, half(w2, 1).t(), b2)) <= BOUND[BF16]
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert ours[0].weight.grad.placements == (Shard(0),) and ours[2].weight.grad.placements == (Shard(1),)
    assert ours[2].bias.grad.placements == (R,) and ours[0].bias.grad.placements == (Shard(0),)


@needs_local_tensor
@pytest.mark.parametrize("bias, fuse", [(True, False), (False, False), (True, True)],
                         ids=["bias", "no_bias", "fused_gelu"])
def test_tensor_parallel_mlp_matches_the_single_device_one(bias, fuse):
    """Both ranks (LocalTensorMode): column- then row-parallel, forward and backward; the row-parallel bias is added
    once (not once per rank), the parameters' gradients keep their placements and match the stock model's."""
    base, ours = tp_mlp(bias, fuse)
    x = randn(4, 5, 16)
    g = randn(4, 5, 8)
    x_ref = x.clone().requires_grad_()
    y_ref = base(x_ref)
    y_ref.backward(g)
    with all_ranks() as mesh:
        parallelize_module(ours, mesh, PLAN)
        x_tp = x.clone().requires_grad_()
        y = ours(x_tp)
        y.backward(g)
        assert rel(y, y_ref) <= BOUND[BF16]
        assert rel(x_tp.grad, x_ref.grad) <= BOUND[BF16]
        for (name, p), p_ref in zip(ours.named_parameters(), base.parameters()):
            assert p.grad.placements == p.placements, name
            assert rel(p.grad.full_tensor(), p_ref.grad) <= BOUND[BF16], name


@needs_local_tensor
def test_sequence_parallel_mlp_matches_the_single_device_one():
    """The sequence-parallel plan: each rank holds its part of the sequence, all-gathered into the column-parallel
    layer; the row-parallel layer's partial sums (its bias added once) reduce-scattered back onto the sequence."""
    base, ours = tp_mlp()
    x, g = randn(4, 6, 16), randn(4, 6, 8)
    x_ref = x.clone().requires_grad_()
    y_ref = base(x_ref)
    y_ref.backward(g)
    with all_ranks() as mesh:
        parallelize_module(ours, mesh, {"0": ColwiseParallel(input_layouts=Shard(1)),
                                        "2": RowwiseParallel(output_layouts=Shard(1))})
        x_sp = distribute_tensor(x, mesh, [Shard(1)]).to_local().requires_grad_()
        y = ours(x_sp)
        assert y.shape == (4, 3, 8)
        y.backward(distribute_tensor(g, mesh, [Shard(1)]).to_local())
        assert rel(DTensor.from_local(y, mesh, [Shard(1)]).full_tensor(), y_ref) <= BOUND[BF16]
        assert rel(DTensor.from_local(x_sp.grad, mesh, [Shard(1)]).full_tensor(), x_ref.grad) <= BOUND[BF16]
        for (name, p), p_ref in zip(ours.named_parameters(), base.parameters()):
            assert p.grad.placements == p.placements, name
            assert rel(p.grad.full_tensor(), p_ref.grad) <= BOUND[BF16], name


@needs_local_tensor
def test_rows_sharded_on_a_leading_dimension():
    """Sequence parallel: x (batch, seq, K) sharded on seq with a replicated weight: the output is sharded as x is, and
    the weight's gradient is a partial sum over the shards of the rows."""
    torch.manual_seed(1)
    layer = nn.Linear(16, 8).to(BF16)
    ours = ref_linear(copy.deepcopy(layer))
    x, g = randn(2, 6, 16), randn(2, 6, 8)
    x_ref = x.clone().requires_grad_()
    layer(x_ref).backward(g)
    with all_ranks() as mesh:
        ours.weight = nn.Parameter(distribute_tensor(ours.weight.detach(), mesh, [R]))
        ours.bias = nn.Parameter(distribute_tensor(ours.bias.detach(), mesh, [R]))
        xd = distribute_tensor(x, mesh, [Shard(1)]).requires_grad_()
        y = ours(xd)
        assert y.placements == (Shard(1),) and y.to_local().shape == (2, 3, 8)
        assert rel(y.full_tensor(), layer(x)) <= BOUND[BF16]
        y.backward(distribute_tensor(g, mesh, [Shard(1)]))
        assert xd.grad.placements == (Shard(1),) and ours.weight.grad.placements == (P,)
        assert rel(xd.grad.full_tensor(), x_ref.grad) <= BOUND[BF16]
        assert rel(ours.weight.grad.full_tensor(), layer.weight.grad) <= BOUND[BF16]
        assert rel(ours.bias.grad.full_tensor(), layer.bias.grad) <= BOUND[BF16]


def test_linear_refusals_name_the_fix(mesh):
    _, fused = tp_mlp(fuse=True)
    parallelize_module(fused, mesh, {"0": RowwiseParallel()})    # a fused GELU on a row-parallel layer
    with pytest.raises(NotLinear, match=r"not linear in acc.*make it without activation= \(replace_linear\(model, "
                                        r"fuse_activations=False\)\)"):
        fused(randn(3, 16))
    _, ours = tp_mlp()
    layer = ours[0]
    layer.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), mesh, [Shard(0)]))
    layer.bias = nn.Parameter(distribute_tensor(layer.bias.detach(), mesh, [Shard(0)]))
    with pytest.raises(ShardingRefusal, match=r"the weight is a DTensor but x is a torch.Tensor: pass x as a DTensor"):
        layer(randn(3, 16))
    with pytest.raises(ShardingRefusal, match=r"A \(3, 16\) is Shard\(1\) \(K\) and B \(16, 32\) is Shard\(1\) \(N\), "
                                              r"which no rule takes"):
        layer(distribute_tensor(randn(3, 16), mesh, [Shard(1)]))
    layer.op.device_type = "cuda"   # as a real op (an instance attribute): the mesh is the wrong kind
    with pytest.raises(ShardingRefusal, match=r"cpu mesh; this op runs on cuda tensors"):
        layer(distribute_tensor(randn(3, 16), mesh, [R]))


def test_compiled_tensor_parallel_model(mesh):
    """torch.compile (fullgraph, aot_eager: no C++ compiler needed) traces the DTensor path of our layers, forward
    and backward, and gives rank 0 the eager model's numbers."""
    _, ours = tp_mlp()
    parallelize_module(ours, mesh, PLAN)
    x = randn(4, 5, 16)
    x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_eager = ours(x_eager)
    y_eager.sum().backward()
    grads = [p.grad.to_local().clone() for p in ours.parameters()]
    ours.zero_grad()
    y = torch.compile(ours, backend="aot_eager", fullgraph=True)(x_compiled)
    y.sum().backward()
    assert torch.equal(y, y_eager) and torch.equal(x_compiled.grad, x_eager.grad)
    for p, g in zip(ours.parameters(), grads):
        assert torch.equal(p.grad.to_local(), g)
