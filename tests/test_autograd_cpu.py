"""torch integration without a GPU: fake tensors, backward layouts, and the op registration itself.

Two kinds of op appear here:

* real ops, built with nvcc for sm_90 (skipped without nvcc): their fake implementations run under
  FakeTensorMode on cuda-device fake tensors, which needs no GPU;
* ``ReferenceOp``: a GemmOp whose kernel library is replaced by ``torch.matmul`` on CPU tensors, registered
  through exactly the same code (``registration._register``: schemas, tags, fake, ``.out`` decomposition, autograd
  formula with backward ops planned from the forward config). The formula is the JIT runtime's C++ one
  (templates/torch/gemm_autograd.h, built here with nvcc) or, where the runtime is missing, generator.runtime.autograd's
  Python one: the ``formula`` fixture runs the tests that differentiate through both. Its argument checks are the real ones, so
  a backward operand in the wrong storage order fails here as it would on the GPU. It lets opcheck,
  torch.compile and autograd exercise the registration on a machine without a GPU; the kernels
  themselves are checked by tests/gpu/test_torch_integration.py (opcheck on real ops needs a GPU).
"""
from __future__ import annotations

import copy
import itertools
import pickle
import warnings
from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from generator import Gemm, KernelConfig  # noqa: E402
from generator.runtime import jit_runtime  # noqa: E402
from generator.runtime.autograd import backward_configs, backward_layouts, grad_ops  # noqa: E402
from generator.runtime import GemmOp  # noqa: E402
from generator.runtime.evaluate import evaluate, operand_values  # noqa: E402
from generator.runtime.checks import check_group_ends, grouped_alignment_refusal, order_of  # noqa: E402
from generator.runtime.operands import check_batchable, check_operands  # noqa: E402
from generator.spec.epilogue import BIAS_ACTIVATIONS  # noqa: E402
from generator.spec.types import DType, Order  # noqa: E402

NAMESPACE = "gemmgen_reference"
LAYOUTS = ("tn", "tt", "nn", "nt")
BOUND = {torch.bfloat16: 1e-2, torch.float16: 5e-3}

#: Where a test records the reference ops' launches (``calls`` fixture): None, or a list of Call.
CALLS: list | None = None


class Call(NamedTuple):
    """One launch of a reference op: its layout tag (e.g. "nt_dcol"), the form ("plain", "grouped", "list") and its
    operands (a list call's: lists)."""

    layout: str
    form: str
    A: Any
    B: Any


def _record(op, form, A, B):
    if CALLS is not None:
        CALLS.append(Call(op.config.layout.tag, form, A, B))


class ReferenceOp(GemmOp):
    """The real GemmOp registration and checks, with torch.matmul on CPU in place of the kernel. Grouped and list
    calls make the real ones' checks first, the refusals of the plan and of operands off the 16-byte rule included."""

    device_type = "cpu"

    def __init__(self, config: KernelConfig, namespace: str = NAMESPACE) -> None:
        super().__init__(config, library=None, namespace=namespace)

    def run(self, A, B, operands, out):
        _record(self, "plain", A, B)
        problem = self._check(A, B)             # dtype, device, K, batch, and the planned storage orders
        ep = self.config.epilogue
        if problem.batch is not None:
            check_batchable(self.config)
        check_operands(ep, operands, A, problem.m, problem.n, problem.k)
        if out is not None:
            self._check_out(out, A, B)
        D = self._empty_out(A, B) if out is None else out
        acc = A.float() @ B.float()             # fp32 accumulation, one rounding: as the kernel (batched: matmul's)
        d, aux = evaluate(ep, acc, operand_values(ep, operands, torch.float32))
        D.copy_(d.to(self.out_dtype))
        if aux is None:
            return D
        aux_out = self._empty_out(A, B)
        aux_out.copy_(aux.to(self.out_dtype))
        return D, aux_out

    def run_grouped(self, A, B, offsets):
        if B.dim() == 2:
            return self.run_grouped_k(A, B, offsets)
        _record(self, "grouped", A, B)
        self._refuse_grouped_plan()
        problem = self._check_grouped(A, B, offsets)   # ranks, dtypes, devices, K, offsets, storage orders
        if problem.m > 0 and problem.n > 0 and problem.k > 0:   # the 16-byte rule, as GemmOp.run_grouped
            for what, t, order, ld, stride in (("A", A, self.config.layout.a, problem.lda, 0),
                                               ("B", B, self.config.layout.b, problem.ldb, problem.batch_stride_b)):
                refusal = grouped_alignment_refusal(what, t, order, ld, stride)
                if refusal is not None:
                    raise ValueError(refusal)
        check_group_ends(offsets.tolist(), problem.m)
        D = self._empty_grouped_out(A, B)
        start = 0
        for g, end in enumerate(offsets.tolist()):   # each group's rows by its matrix, fp32 accumulation
            D[start:end] = (A[start:end].float() @ B[g].float()).to(self.out_dtype)
            start = end
        return D

    def run_grouped_k(self, A, B, offsets):
        _record(self, "grouped_k", A, B)
        self._refuse_grouped_k_plan()
        problem = self._check_grouped_k(A, B, offsets)   # ranks, dtypes, devices, K, offsets, storage orders
        if problem.m > 0 and problem.n > 0 and problem.k > 0:
            for what, t, order, ld in (("A", A, self.config.layout.a, problem.lda),
                                       ("B", B, self.config.layout.b, problem.ldb)):
                refusal = grouped_alignment_refusal(what, t, order, ld, 0)
                if refusal is not None:
                    raise ValueError(refusal)
        check_group_ends(offsets.tolist(), problem.k, along_k=True)
        D = self._empty_grouped_k_out(A, B, offsets)
        start = 0
        for g, end in enumerate(offsets.tolist()):   # each group's K range, fp32 accumulation
            D[g] = (A[:, start:end].float() @ B[start:end].float()).to(self.out_dtype)
            start = end
        return D

    def run_grouped_list(self, A, B):
        _record(self, "list", A, B)
        self._refuse_grouped_list_plan()
        problems = self._check_list(A, B)   # lengths, ranks, dtypes, devices, K, storage orders
        self._check_list_alignment(A, B, problems)
        D = self._empty_list_out(A, B)
        for a, b, d in zip(A, B, D):         # each problem by its own matrices, fp32 accumulation
            d.copy_((a.float() @ b.float()).to(self.out_dtype))
        return D

    def derived(self, configs):
        return [ReferenceOp(c, self.namespace) for c in configs]


def reference_op(layout="tn", dtype="bf16", namespace=NAMESPACE, **kw) -> ReferenceOp:
    return ReferenceOp(Gemm(dtype=dtype, layout=layout, arch=90, **kw).config, namespace)


@pytest.fixture(params=["cpp", "python"])
def formula(request, monkeypatch):
    """The namespace of reference ops whose autograd formula is the C++ one or the Python fallback."""
    if request.param == "python":
        monkeypatch.setattr(jit_runtime.RUNTIME, "register_autograd", lambda op, configs, epilogue=None: False)
        return NAMESPACE + "_py"
    if not jit_runtime.RUNTIME.ensure():
        pytest.skip(f"the JIT runtime did not build here: {jit_runtime.RUNTIME.failure}")
    return NAMESPACE


def formula_op(namespace, layout="tn", **kw) -> ReferenceOp:
    op = reference_op(layout, namespace=namespace, **kw)
    assert op.cpp_autograd == (namespace == NAMESPACE)
    return op


def operand(rows, cols, order, dtype, device="cpu", requires_grad=False):
    t = torch.randn(rows, cols, device=device) if order == "row" else torch.randn(cols, rows, device=device).t()
    return t.to(dtype).requires_grad_(requires_grad)


def operands(layout, m, n, k, dtype, **kw):
    return (operand(m, k, "row" if layout[0] == "t" else "col", dtype, **kw),
            operand(k, n, "row" if layout[1] == "t" else "col", dtype, **kw))


def rel(got, ref) -> float:
    ref = ref.double()
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# -- backward layouts: a pure function -----------------------------------------------------------------

@pytest.mark.parametrize("layout, grad_a, grad_b", [
    # dA = dD @ B.t() written in A's order; dB = A.t() @ dD written in B's order; dD row-major.
    ("tn", "tt", "nt_dcol"),     # x @ W.t(): dx = dy @ W (both row-major), dW.t() = x.t() @ dy
    ("tt", "tn", "nt"),
    ("nn", "tt_dcol", "tt_dcol"),
    ("nt", "tn_dcol", "tt"),
])
def test_backward_layouts_for_a_row_major_gradient(layout, grad_a, grad_b):
    got = backward_layouts(layout)
    assert (got[0].tag, got[1].tag) == (grad_a, grad_b)
    assert backward_layouts(layout, "row") == got


@pytest.mark.parametrize("layout, grad_a, grad_b", [
    ("tn", "nt", "nn_dcol"),
    ("tt", "nn", "nn"),
    ("nn", "nt_dcol", "tn_dcol"),
    ("nt", "nn_dcol", "tn"),
])
def test_backward_layouts_for_a_column_major_gradient(layout, grad_a, grad_b):
    got = backward_layouts(layout, Order.col)
    assert (got[0].tag, got[1].tag) == (grad_a, grad_b)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_layouts_follow_from_the_transposes(layout):
    # Derive by hand from strides: B.t() flips B's order, A.t() flips A's; outputs keep A's and B's.
    fwd = Gemm("bf16", layout, arch=80).layout
    flip = {Order.row: Order.col, Order.col: Order.row}
    for g in Order:
        grad_a, grad_b = backward_layouts(fwd, g)
        assert (grad_a.a, grad_a.b, grad_a.c) == (g, flip[fwd.b], fwd.a)
        assert (grad_b.a, grad_b.b, grad_b.c) == (flip[fwd.a], g, fwd.b)


def test_backward_configs_keep_dtype_and_arch_and_write_the_input_dtype():
    fwd = Gemm("fp16", "tn", arch=80, out_dtype="fp32").config
    grad_a, grad_b = backward_configs(fwd)
    for cfg, tag in ((grad_a, "tt"), (grad_b, "nt_dcol")):
        assert (cfg.arch, cfg.dtype, cfg.out_dtype, cfg.layout.tag) == (80, DType.fp16, DType.fp16, tag)
        assert f"_fp16_{tag}_" in cfg.name


def test_sm90_tf32_weight_gradient_is_computed_as_its_transpose():
    """dW of an sm90 tf32 linear layer (nt with a column-major D) is computed as its transpose, nt with a row-major D
    stored by TMA, as for 16-bit inputs (planner.backward.writes_transposed); its fp32 output stays."""
    grad_a, grad_b = backward_configs(Gemm("fp32", "tn", arch=90).config)
    assert grad_a.layout.tag == "tt" and grad_b.layout.tag == "nt" and grad_b.out_dtype is DType.fp32


@pytest.mark.parametrize("family", ["sm80", "sm90"])
def test_backward_configs_keep_the_family(family):
    """At arch 90 the backward kernels are of the forward op's family, also when it was forced to sm80."""
    fwd = Gemm("bf16", "tn", arch=90, family=family, schedule="pingpong" if family == "sm90" else None).config
    for cfg in (*backward_configs(fwd), *backward_configs(fwd, Order.col)):
        assert (cfg.arch, cfg.family) == (90, family)
        assert cfg.name.startswith(f"{family}_bf16_")


# -- real ops: fake tensors on the cuda device ------------------------------------------------------------

@pytest.fixture(scope="module")
def real_ops(build_cache):
    from generator.runtime import compile_many

    plans = {"row": Gemm("bf16", "tn", arch=90), "col": Gemm("bf16", "nt", arch=90, layout_c="col")}
    return dict(zip(plans, compile_many([p.config for p in plans.values()], namespace="gemmgen")))


def test_fake_tensors_propagate_through_both_overloads(real_ops):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    op = real_ops["row"]
    with FakeTensorMode():
        a, b = operands("tn", 100, 48, 32, torch.bfloat16, device="cuda")
        d = op(a, b)
        d_ops = getattr(torch.ops.gemmgen, op.name)(a, b)
        out = torch.empty(100, 48, dtype=torch.bfloat16, device="cuda")
        d_out = getattr(torch.ops.gemmgen, op.name).out(a, b, out=out)
        d_call = op(a, b, out=out)
    for t in (d, d_ops):
        assert isinstance(t, FakeTensor) and t.device.type == "cuda"
        assert (tuple(t.shape), t.stride(), t.dtype) == ((100, 48), (48, 1), torch.bfloat16)
    assert d_out is out and d_call is out


def test_fake_output_of_a_column_major_d_has_the_real_strides(real_ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = real_ops["col"]
    with FakeTensorMode():
        a, b = operands("nt", 100, 48, 32, torch.bfloat16, device="cuda")
        d = op(a, b)
        out = torch.empty(48, 100, dtype=torch.bfloat16, device="cuda").t()
        assert op(a, b, out=out) is out
    assert (tuple(d.shape), d.stride()) == ((100, 48), (1, 100))


def test_meta_tensors_give_the_output_shape(real_ops):
    op = real_ops["col"]
    a, b = operands("nt", 100, 48, 32, torch.bfloat16, device="meta")
    d = op(a, b)
    assert d.device.type == "meta" and (tuple(d.shape), d.stride()) == ((100, 48), (1, 100))
    out = torch.empty(48, 100, dtype=torch.bfloat16, device="meta").t()
    assert op(a, b, out=out) is out


def test_fake_checks_refuse_what_the_kernel_would(real_ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = real_ops["row"]
    with FakeTensorMode():
        a, b = operands("tn", 64, 48, 32, torch.bfloat16, device="cuda")
        with pytest.raises(ValueError, match="K must agree"):
            op(a, b[:16])
        with pytest.raises(TypeError, match="this plan computes bf16"):
            op(a.half(), b)
        with pytest.raises(ValueError, match="out has shape"):
            op(a, b, out=torch.empty(64, 47, dtype=torch.bfloat16, device="cuda"))
        with pytest.raises(TypeError, match="this plan writes bf16"):
            op(a, b, out=torch.empty(64, 48, dtype=torch.float32, device="cuda"))


def test_real_op_registration(real_ops):
    op = real_ops["row"]
    qualname = f"gemmgen::{op.name}"
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has(qualname, "Autograd")                       # register_autograd on the default overload
    assert has(f"{qualname}.out", "CompositeImplicitAutograd")  # the .out decomposition (fake, functionalization)
    for overload in (op.op.default, op.op.out):
        assert torch.Tag.needs_fixed_stride_order in overload.tags
        assert torch.Tag.pt2_compliant_tag in overload.tags


def test_backward_ops_are_registered_with_the_forward_op(real_ops):
    # Registered now (a compiled backward loaded from torch.compile's cache in a new process calls them
    # by name), built on their first launch.
    for op in real_ops.values():
        for order in Order:
            for grad_op in grad_ops(op, order):
                assert grad_op.config.dtype is op.config.dtype and grad_op.config.arch == op.config.arch
                assert hasattr(torch.ops.gemmgen, grad_op.name)
                assert torch._C._dispatch_has_kernel_for_dispatch_key(f"gemmgen::{grad_op.name}", "Autograd")


def test_an_op_registered_unbuilt_builds_on_first_use(real_ops, monkeypatch, tmp_path):
    from generator.runtime import registered_op

    monkeypatch.setenv("GEMMGEN_CACHE_DIR", str(tmp_path))
    op = registered_op(Gemm("fp16", "tt", arch=90).config, "gemmgen_lazy")
    assert not op.built and hasattr(torch.ops.gemmgen_lazy, op.name)
    assert registered_op(op.config, "gemmgen_lazy") is op
    assert op.library.path.is_file() and op.built
    again = Gemm("fp16", "tt", arch=90, namespace="gemmgen_lazy").compile()
    assert again.op is op.op


def test_op_copies_share_the_handle_and_pickle_by_config(real_ops):
    op = real_ops["row"]
    assert copy.deepcopy(op) is op
    again = pickle.loads(pickle.dumps(op))   # rebuilds from the cache and finds the registered op
    assert again.config == op.config and again.op is op.op


# -- the registration, with torch.matmul in place of the kernel --------------------------------------------

@pytest.mark.parametrize("layout, dtype", list(itertools.product(("tn", "nt"), (torch.bfloat16, torch.float16))))
def test_opcheck_on_the_registration(layout, dtype, formula):
    # opcheck on the real kernels is in tests/gpu/test_torch_integration.py; this checks our use of
    # torch.library (schema, fake, autograd registration, AOT dispatch) on CPU.
    op = formula_op(formula, layout, dtype=dtype)
    for m, n, k in ((64, 48, 32), (127, 33, 65)):
        a, b = operands(layout, m, n, k, dtype, requires_grad=True)
        torch.library.opcheck(op.op.default, (a, b))
        torch.library.opcheck(op.op.default, (a.detach(), b.detach()))
        torch.library.opcheck(op.op.out, (a.detach(), b.detach()), {"out": torch.empty(m, n, dtype=dtype)})


def test_opcheck_on_the_registration_col_major_d_and_fp32_out():
    col = reference_op("tn", layout_c="col")
    a, b = operands("tn", 65, 33, 40, torch.bfloat16, requires_grad=True)
    torch.library.opcheck(col.op.default, (a, b))
    torch.library.opcheck(col.op.out, (a.detach(), b.detach()), {"out": torch.empty(33, 65, dtype=torch.bfloat16).t()})
    fp32 = reference_op("tn", out_dtype="fp32")
    torch.library.opcheck(fp32.op.default, (a, b))


class _Block(nn.Module):
    def __init__(self, op, via):
        super().__init__()
        self.op, self.via = op, via
        self.weight = nn.Parameter(torch.randn(48, 32, dtype=torch.bfloat16))

    def forward(self, x):
        if self.via == "call":
            y = self.op(x, self.weight.t())
        else:
            y = getattr(getattr(torch.ops, self.op.namespace), self.op.name)(x, self.weight.t())
        return torch.nn.functional.gelu(y) * 2


@pytest.mark.parametrize("via", ["call", "torch.ops"])
def test_compile_fullgraph_dynamic_m_compiles_once(via, formula):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    block = _Block(formula_op(formula, "tn"), via)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(block, backend=counter, fullgraph=True)
    with torch.no_grad():
        for m in (64, 100, 37):
            x = torch.randn(m, 32, dtype=torch.bfloat16)
            torch._dynamo.mark_dynamic(x, 0)
            assert torch.equal(compiled(x), block(x))
    assert counter.frame_count == 1
    for m in (64, 100, 37):    # training: one more graph (joint forward/backward), again for every M
        x = torch.randn(m, 32, dtype=torch.bfloat16, requires_grad=True)
        torch._dynamo.mark_dynamic(x, 0)
        x_eager = x.detach().clone().requires_grad_()
        compiled(x).sum().backward()
        grad_w = block.weight.grad
        block.weight.grad = None
        block(x_eager).sum().backward()
        assert torch.equal(x.grad, x_eager.grad) and torch.equal(grad_w, block.weight.grad)
        block.weight.grad = None
    assert counter.frame_count == 2


def test_compile_fullgraph_out_overload():
    op = reference_op("tn")

    def f(a, b):
        out = torch.empty(a.shape[0], b.shape[1], dtype=torch.bfloat16)
        op(a, b, out=out)
        return out + 1

    torch._dynamo.reset()
    a, b = operands("tn", 40, 24, 16, torch.bfloat16)
    assert torch.equal(torch.compile(f, backend="aot_eager", fullgraph=True)(a, b), f(a, b))


def test_out_overload_refuses_grad_like_aten(formula):
    op = formula_op(formula, "tn")
    a, b = operands("tn", 8, 8, 8, torch.bfloat16, requires_grad=True)
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        op(a, b, out=torch.empty(8, 8, dtype=torch.bfloat16))
    with torch.no_grad():
        op(a, b, out=torch.empty(8, 8, dtype=torch.bfloat16))


GRADS = ("contiguous", "column-major", "sliced", "expanded")


def _upstream(kind, m, n, dtype):
    if kind == "contiguous":
        return torch.randn(m, n).to(dtype)
    if kind == "column-major":
        return torch.randn(n, m).to(dtype).t()
    if kind == "sliced":                      # row-major, leading dimension n + 3, odd offset: unaligned
        return torch.randn(m, n + 3).to(dtype)[:, 1:n + 1]
    return torch.randn(()).to(dtype).expand(m, n)   # strides (0, 0): neither order, made contiguous


@pytest.mark.parametrize("layout, layout_c, out_dtype", list(itertools.product(LAYOUTS, ("row", "col"), (None, "fp32"))))
def test_autograd_matches_float64(layout, layout_c, out_dtype, formula):
    # gradcheck needs float64 and the kernels take fp16/bf16 only: compare against a float64 reference.
    dtype = torch.bfloat16
    op = formula_op(formula, layout, layout_c=layout_c, out_dtype=out_dtype)
    for (m, n, k), kind in itertools.product(((64, 48, 32), (37, 19, 23), (1, 5, 7)), GRADS):
        a, b = operands(layout, m, n, k, dtype, requires_grad=True)
        a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
        d = op(a, b)
        g = _upstream(kind, m, n, d.dtype)
        d.backward(g)
        # The backward kernels multiply in the op's input dtype: an fp32 upstream gradient goes in rounded to it, and
        # the reference takes the same rounded values (else a tiny K's cancellation turns that rounding into >1 %).
        (a64 @ b64).backward(g.to(dtype).double())
        for got, ref, t in ((a.grad, a64.grad, a), (b.grad, b64.grad, b)):
            assert got.dtype == dtype and got.shape == t.shape
            assert rel(got, ref) <= BOUND[dtype], (layout, layout_c, out_dtype, m, n, k, kind)


def test_a_graph_node_only_where_a_gradient_is_wanted(formula):
    op = formula_op(formula, "tn")
    a, b = operands("tn", 8, 6, 4, torch.bfloat16, requires_grad=True)
    node = op(a, b).grad_fn
    assert node is not None and (formula != NAMESPACE or "GemmFunction" in node.name())
    with torch.no_grad():
        assert op(a, b).grad_fn is None
    assert op(a.detach(), b.detach()).grad_fn is None
    only_b = op(a.detach(), b)
    only_b.float().sum().backward()
    assert b.grad is not None and b.grad.shape == b.shape


def test_backward_ops_are_made_once_per_gradient_order():
    op = reference_op("tt")
    first = grad_ops(op, Order.row)
    a, b = operands("tt", 16, 8, 8, torch.bfloat16, requires_grad=True)
    op(a, b).backward(torch.ones(16, 8, dtype=torch.bfloat16))
    op(a, b).backward(torch.ones(16, 8, dtype=torch.bfloat16))
    assert grad_ops(op, Order.row) == first
    assert [o.config.layout.tag for o in first] == ["tn", "nt"]


def test_double_backward(formula):
    op = formula_op(formula, "tn")
    a, b = operands("tn", 16, 8, 12, torch.bfloat16, requires_grad=True)
    (grad_a,) = torch.autograd.grad(op(a, b).float().pow(2).sum(), a, create_graph=True)
    grad_a.float().sum().backward()
    a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
    (g64,) = torch.autograd.grad((a64 @ b64).pow(2).sum(), a64, create_graph=True)
    g64.sum().backward()
    assert rel(b.grad, b64.grad) <= 2e-2


# -- batched calls (3-D A or B) on the registration -----------------------------------------------------------

def batched(batch, rows, cols, order, dtype=torch.bfloat16, **kw):
    """A (batch, rows, cols) operand, each matrix stored in order, packed; batch None: a 2-D one."""
    if batch is None:
        return operand(rows, cols, order, dtype, **kw)
    t = torch.randn(batch, rows, cols) if order == "row" else torch.randn(batch, cols, rows).transpose(1, 2)
    return t.to(dtype).requires_grad_(kw.get("requires_grad", False))


def batched_operands(layout, batches, m, n, k, dtype=torch.bfloat16, **kw):
    """A and B of a layout, with A's and B's batch sizes (None: 2-D)."""
    orders = ["row" if letter == "t" else "col" for letter in layout]
    return batched(batches[0], m, k, orders[0], dtype, **kw), batched(batches[1], k, n, orders[1], dtype, **kw)


#: (A's batch, B's batch): None is a 2-D operand, 1 a batch of 1 broadcast against the other's.
BATCHES = [(3, None), (None, 3), (3, 3), (1, 3), (3, 1)]


def batched_refusal(op, wanting):
    return (f"{op.name}: batched calls (3-D A or B) have no backward pass yet, but {wanting} require(s) grad: call it "
            "under torch.no_grad() or with detached tensors, or call it once per problem with 2-D tensors")


@pytest.mark.parametrize("batches", BATCHES)
def test_batched_calls_refuse_grad_and_run_without_it(formula, batches):
    """Both formulas (C++ and Python) refuse a batched call that would need a gradient, naming the inputs; without
    grad mode, or with detached inputs, it runs (against float64), and 2-D calls still differentiate."""
    op = formula_op(formula, "tn")
    a, b = batched_operands("tn", batches, 16, 8, 12, requires_grad=True)
    for x, y, wanting in ((a, b, "A, B"), (a, b.detach(), "A"), (a.detach(), b, "B")):
        with pytest.raises(RuntimeError) as info:
            op(x, y)
        assert batched_refusal(op, wanting) in str(info.value), str(info.value)
    with torch.no_grad():
        d = op(a, b)
    assert d.grad_fn is None and d.shape == torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (16, 8)
    assert rel(d, a.detach().double() @ b.detach().double()) <= BOUND[torch.bfloat16]
    assert torch.equal(op(a.detach(), b.detach()), d)
    a2, b2 = operands("tn", 16, 8, 12, torch.bfloat16, requires_grad=True)
    op(a2, b2).float().sum().backward()
    assert a2.grad is not None and b2.grad is not None


@pytest.mark.parametrize("layout, layout_c", [("tn", "row"), ("nt", "col")])
def test_opcheck_on_batched_calls(layout, layout_c):
    """Schema, fake (3-D D, the batch sizes symbolic in test_aot_dispatch_dynamic) and the .out decomposition."""
    op = reference_op(layout, layout_c=layout_c)
    for batches in BATCHES:
        a, b = batched_operands(layout, batches, 33, 40, 24)
        torch.library.opcheck(op.op.default, (a, b))
        out = op._empty_out(a, b)
        assert out.dim() == 3 and out.stride()[1:] == ((40, 1) if layout_c == "row" else (1, 33))
        torch.library.opcheck(op.op.out, (a, b), {"out": out})


@pytest.mark.parametrize("batches", [(3, None), (3, 3)], ids=["A 3-D", "both 3-D"])
def test_compile_fullgraph_dynamic_batch_compiles_once(batches):
    """A dynamic batch (and M) is traced once: no guard specializes it (batch sizes that must agree are a run-time
    assertion, a batch of 1 is not assumed)."""
    op = reference_op("tn")
    counter = _compile_counter()
    compiled = torch.compile(lambda a, b: op(a, b).float() * 2, backend=counter, fullgraph=True)
    with torch.no_grad():
        for batch, m in ((2, 64), (5, 37), (3, 100)):
            a, b = batched_operands("tn", [batch if x is not None else None for x in batches], m, 24, 32)
            torch._dynamo.mark_dynamic(a, 0)
            torch._dynamo.mark_dynamic(a, 1)
            if b.dim() == 3:
                torch._dynamo.mark_dynamic(b, 0)
            got = compiled(a, b)
            assert got.shape == (batch, m, 24) and torch.equal(got, op(a, b).float() * 2)
    assert counter.frame_count == 1


# -- grouped calls (.grouped) on the registration ---------------------------------------------------------------

def grouped_operands(layout, sizes, n, k, dtype=torch.bfloat16, **kw):
    """A (sum(sizes), K), B (E, K, N) of a layout (each matrix in its order) and offsets."""
    orders = ["row" if letter == "t" else "col" for letter in layout]
    a = operand(sum(sizes), k, orders[0], dtype, **kw)
    b = batched(len(sizes), k, n, orders[1], dtype, **kw)
    offsets = torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32)
    return a, b, offsets


def grouped_reference(a, b, offsets):
    ends = [0, *offsets.tolist()]
    return torch.cat([a[s:e].double() @ b[g].double() for g, (s, e) in enumerate(zip(ends, ends[1:]))])


def test_grouped_calls_without_grad_build_no_graph(formula):
    """Without grad mode, or with detached inputs, a grouped call goes below autograd: the kernel's result, no node."""
    op = formula_op(formula, "tn")
    a, b, offsets = grouped_operands("tn", [5, 0, 17, 18], 24, 32, requires_grad=True)
    with torch.no_grad():
        d = op.grouped(a, b, offsets)
    assert d.grad_fn is None and d.shape == (40, 24) and d.stride() == (24, 1)
    assert rel(d, grouped_reference(a.detach(), b.detach(), offsets)) <= BOUND[torch.bfloat16]
    assert torch.equal(op.grouped(a.detach(), b.detach(), offsets), d)
    assert op.grouped(a.detach(), b.detach(), offsets).grad_fn is None


@pytest.mark.parametrize("layout, layout_c", [("tn", "row"), ("tt", "col")])
def test_opcheck_on_grouped_calls(layout, layout_c):
    """Schema, fake (D (total_M, N) in the plan's order; E and the sizes symbolic in test_aot_dispatch_dynamic) and
    the Autograd kernel's registration of .grouped."""
    op = reference_op(layout, layout_c=layout_c)
    for sizes in ([5, 0, 17, 18], [40], [0, 0]):
        a, b, offsets = grouped_operands(layout, sizes, 24, 32)
        torch.library.opcheck(op.op.grouped, (a, b, offsets))
        d = op.grouped(a, b, offsets)
        assert d.shape == (sum(sizes), 24)
        if sum(sizes):
            assert d.stride() == ((24, 1) if layout_c == "row" else (1, sum(sizes)))
            assert rel(d, grouped_reference(a, b, offsets)) <= BOUND[torch.bfloat16]


def test_compile_fullgraph_grouped_call_with_dynamic_sizes_compiles_once():
    """A dynamic total_M and number of groups trace once: no size of D depends on the offsets' values."""
    op = reference_op("tn")
    counter = _compile_counter()
    compiled = torch.compile(lambda a, b, o: op.grouped(a, b, o).float() * 2, backend=counter, fullgraph=True)
    for sizes in ([5, 0, 17, 18], [7, 30], [3, 3, 3, 3, 50]):
        a, b, offsets = grouped_operands("tn", sizes, 24, 32)
        for t in (a, b, offsets):
            torch._dynamo.mark_dynamic(t, 0)
        got = compiled(a, b, offsets)
        assert got.shape == (sum(sizes), 24) and torch.equal(got, op.grouped(a, b, offsets).float() * 2)
    assert counter.frame_count == 1


# -- list calls (.grouped_list) on the registration ----------------------------------------------------------------

#: (M, K, N) of a list call's problems.
LIST_SIZES = [(5, 32, 24), (17, 8, 40), (0, 16, 8), (33, 40, 16)]


def ruled_operand(rows, cols, order, dtype, requires_grad=False):
    """A (rows, cols) matrix stored in ``order`` on the 16-byte rule of list calls: its leading dimension the inner
    size rounded up to 8 elements (a view of a wider buffer where that pads it; packed where it does not)."""
    inner, outer = (cols, rows) if order == "row" else (rows, cols)
    buffer = torch.randn(outer, -(-inner // 8) * 8).to(dtype)[:, :inner]
    return (buffer if order == "row" else buffer.t()).requires_grad_(requires_grad)


def list_operands(layout, sizes=LIST_SIZES, dtype=torch.bfloat16, **kw):
    """A[i] (M_i, K_i) and B[i] (K_i, N_i) of a layout, on the 16-byte rule (``ruled_operand``)."""
    orders = ["row" if letter == "t" else "col" for letter in layout]
    return ([ruled_operand(m, k, orders[0], dtype, **kw) for m, k, _ in sizes],
            [ruled_operand(k, n, orders[1], dtype, **kw) for _, k, n in sizes])


def test_list_calls_without_grad_build_no_graph(formula):
    """Without grad mode, or with detached inputs, a list call goes below autograd: the kernel's results, no nodes."""
    op = formula_op(formula, "nt")
    a, b = list_operands("nt", requires_grad=True)
    detached = ([t.detach() for t in a], [t.detach() for t in b])
    with torch.no_grad():
        d = op(a, b)
    assert [t.grad_fn for t in d] == [None] * 4 and [tuple(t.shape) for t in d] == [(m, n) for m, _, n in LIST_SIZES]
    for got, x, y in zip(d, *detached):
        if got.numel():
            assert rel(got, x.double() @ y.double()) <= BOUND[torch.bfloat16]
    assert all(torch.equal(u, v) for u, v in zip(op.grouped_list(*detached), d))
    assert all(t.grad_fn is None for t in op.grouped_list(*detached))


@pytest.mark.parametrize("layout, layout_c", [("tn", "row"), ("nt", "col")])
def test_opcheck_on_list_calls(layout, layout_c):
    """Schema, fake (each D[i] (M_i, N_i) in the plan's order; the sizes symbolic in test_aot_dispatch_dynamic) and
    the Autograd kernel's registration of .grouped_list."""
    op = reference_op(layout, layout_c=layout_c)
    # opcheck copies the operands packed: a column-major A's leading dimension is then M, which must keep the 16-byte
    # rule (its rows a multiple of 8)
    ruled = LIST_SIZES if layout[0] == "t" else [(-(-m // 8) * 8, k, n) for m, k, n in LIST_SIZES]
    for sizes in (ruled, [(40, 16, 24)], []):
        a, b = list_operands(layout, sizes)
        torch.library.opcheck(op.op.grouped_list, (a, b))
        d = op.grouped_list(a, b)
        assert [tuple(t.shape) for t in d] == [(m, n) for m, _, n in sizes]
        for got, x, y in zip(d, a, b):
            if got.numel():
                assert got.stride() == ((got.shape[1], 1) if layout_c == "row" else (1, got.shape[0]))
                assert rel(got, x.double() @ y.double()) <= BOUND[torch.bfloat16]


def test_compile_fullgraph_list_call_compiles_once_for_new_sizes():
    """A list call traces: its fake gives each D[i]'s shape; dynamic sizes of the same number of problems trace once."""
    op = reference_op("tn")
    counter = _compile_counter()
    compiled = torch.compile(lambda a, b: [d.float() * 2 for d in op(a, b)], backend=counter, fullgraph=True)
    for sizes in ([(5, 32, 24), (17, 8, 40)], [(7, 16, 8), (9, 24, 16)], [(30, 40, 16), (3, 16, 32)]):
        a, b = list_operands("tn", sizes)
        for t in (*a, *b):
            torch._dynamo.mark_dynamic(t, 0)
            torch._dynamo.mark_dynamic(t, 1)
        got = compiled(a, b)
        assert all(torch.equal(g, d.float() * 2) for g, d in zip(got, op(a, b)))
    assert counter.frame_count == 1


def _compile_counter():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    return CompileCounterWithBackend("aot_eager")


# -- the backward of grouped and list calls (generator/runtime/grouped_formula.py: grouped_backward, list_backward) ---

#: Group sizes of the offsets form's backward: ragged with an empty group, one group, 17 groups (several empty), every
#: group empty, empty groups first and last.
GROUPED_SIZES = {"ragged": [5, 0, 17, 18], "E=1": [40], "E=17": [3, 0, 0, 8, 1, 16, 0, 5, 2, 7, 0, 0, 9, 4, 1, 0, 6],
                 "no rows": [0, 0], "empty first and last": [0, 12, 20, 0]}


@pytest.fixture
def calls():
    """The reference ops' launches while the test runs (Call: layout tag, form, operands)."""
    global CALLS
    CALLS = []
    try:
        yield CALLS
    finally:
        CALLS = None


def autograd_kernel_at(qualname: str) -> str:
    """Where the Autograd kernel of ``qualname`` was registered (the dispatcher's table)."""
    return torch._C._dispatch_dump(qualname).split("Autograd[alias]: registered at ")[1].split("\n")[0]


def grouped_grads64(a, b, offsets, g):
    """dA and dB of the grouped product in float64, for the gradient g."""
    a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
    grouped_reference(a64, b64, offsets).backward(g.double())
    return a64.grad, b64.grad


def assert_grad(got, ref, t, what, bound=BOUND[torch.bfloat16]):
    """A gradient of t: its dtype and shape, its matrices stored in t's order, within ``bound`` of float64's."""
    assert got is not None, what
    assert got.dtype == t.dtype and got.shape == t.shape, (what, got.dtype, tuple(got.shape))
    if min(t.shape[-2:]) > 1 and (t.is_contiguous() or t.transpose(-1, -2).is_contiguous()):
        # (AccumulateGrad stores the gradient of a padded view, which is not dense, row-major)
        assert order_of(got) == order_of(t), (what, got.stride(), t.stride())
    assert rel(got, ref) <= bound, (what, rel(got, ref))


def test_grouped_overloads_take_the_python_formulas(formula):
    """Whichever formula the default overload has (the JIT runtime's C++ one or Python's), the Autograd kernels of
    .grouped and .grouped_list are generator/runtime/autograd.py's, through torch.library.register_autograd: the
    runtime registers none for them, which would shadow them."""
    op = formula_op(formula, "tn")
    qualname = f"{formula}::{op.name}"
    assert ("jit_runtime.cpp" in autograd_kernel_at(qualname)) == (formula == NAMESPACE)
    for overload in ("grouped", "grouped_list"):
        assert "jit_runtime.cpp" not in autograd_kernel_at(f"{qualname}.{overload}"), overload
    a, b, offsets = grouped_operands("tn", [5, 0, 17, 18], 24, 32, requires_grad=True)
    assert "grouped" in type(op.grouped(a, b, offsets).grad_fn).__name__
    la, lb = list_operands("tn", requires_grad=True)
    assert all("grouped_list" in type(d.grad_fn).__name__ for d in op(la, lb))


@pytest.mark.parametrize("layout, layout_c, out_dtype", [("tn", "row", None), ("tt", "row", None),
                                                         ("tn", "col", None), ("tt", "col", "fp32")])
def test_grouped_backward_matches_float64(layout, layout_c, out_dtype, formula):
    """dA and dB of op.grouped against float64, for ragged, empty and single groups, E = 17, every kind of upstream
    gradient (contiguous, column-major, sliced: off the 16-byte rule, expanded: neither order); each gradient in its
    input's dtype, shape and strides; offsets gets none."""
    op = formula_op(formula, layout, layout_c=layout_c, out_dtype=out_dtype)
    for (label, sizes), kind in itertools.product(GROUPED_SIZES.items(), GRADS):
        a, b, offsets = grouped_operands(layout, sizes, 24, 32, requires_grad=True)
        d = op.grouped(a, b, offsets)
        g = _upstream(kind, *d.shape, d.dtype)
        d.backward(g)
        ref_a, ref_b = grouped_grads64(a, b, offsets, g)
        assert_grad(a.grad, ref_a, a, (label, kind, "dA"))
        assert_grad(b.grad, ref_b, b, (label, kind, "dB"))
        assert offsets.grad is None


@pytest.mark.parametrize("layout, da, db", [("tn", "tt", "nt"), ("tt", "tn", "nt")])
def test_grouped_backward_is_one_grouped_call_for_da_and_one_along_k_for_db(calls, layout, da, db):
    """dA = dA-op.grouped(dD, B.transpose(1, 2), offsets) (B's memory, no copy); dB: one grouped call along K on the
    dB op, dB-op.grouped(A.t(), dD, offsets) (views of A and dD: the groups split the reduction, nothing is read on
    the host), the empty group's dB[g] zeros. For tn the column-major dB is computed as its transpose,
    dB-op.grouped(dD.t(), A, offsets) (planner.backward.writes_transposed)."""
    op = reference_op(layout)
    sizes = [5, 0, 17, 18]
    a, b, offsets = grouped_operands(layout, sizes, 24, 32, requires_grad=True)
    d = op.grouped(a, b, offsets)
    g = torch.randn(40, 24, dtype=torch.bfloat16)
    calls.clear()
    d.backward(g)
    assert [(c.layout, c.form) for c in calls] == [(da, "grouped"), (db, "grouped_k")]
    grad_a_call, grad_b_call = calls
    assert torch.equal(grad_a_call.A, g) and grad_a_call.B.shape == (4, 24, 32)
    assert grad_a_call.B.data_ptr() == b.data_ptr() and torch.equal(grad_a_call.B, b.detach().transpose(1, 2))
    left, right = (grad_b_call.B.t(), grad_b_call.A.t()) if layout == "tn" else (grad_b_call.A, grad_b_call.B)
    assert left.shape == (32, 40) and left.data_ptr() == a.data_ptr() and torch.equal(left, a.detach().t())
    assert right.shape == (40, 24) and right.data_ptr() == g.data_ptr()
    assert torch.equal(b.grad[1], torch.zeros(32, 24, dtype=torch.bfloat16))
    ref_a, ref_b = grouped_grads64(a, b, offsets, g)
    assert_grad(a.grad, ref_a, a, "dA")
    assert_grad(b.grad, ref_b, b, "dB")


def test_grouped_backward_computes_only_what_is_needed(calls):
    """Only A requires grad: the dA call alone; only B: the dB call (along K) alone."""
    op = reference_op("tn")
    a, b, offsets = grouped_operands("tn", [5, 0, 17, 18], 24, 32)
    g = torch.randn(40, 24, dtype=torch.bfloat16)
    for which, want in (("A", [("tt", "grouped")]), ("B", [("nt", "grouped_k")])):
        x, y = (a.requires_grad_(), b) if which == "A" else (a.detach(), b.requires_grad_())
        d = op.grouped(x, y, offsets)
        calls.clear()
        d.backward(g)
        assert [(c.layout, c.form) for c in calls] == want, which
    ref_a, ref_b = grouped_grads64(a, b, offsets, g)
    assert_grad(a.grad, ref_a, a, "dA")
    assert_grad(b.grad, ref_b, b, "dB")


def test_grouped_backward_falls_back_to_plain_calls_where_the_plans_refuse(calls, monkeypatch):
    """dA and dB ops that take no grouped (list) call (an sm80 plan, ws, stream-K: grouped_refusal,
    grouped_list_refusal): one plain call per group with rows, into dA's rows and dB's matrices."""
    from generator.runtime import autograd

    monkeypatch.setattr(autograd, "grouped_refusal", lambda cfg: "this plan takes no grouped call")
    monkeypatch.setattr(autograd, "grouped_list_refusal", lambda cfg: "this plan takes no list call")
    op = reference_op("tn")
    a, b, offsets = grouped_operands("tn", [5, 0, 17, 18], 24, 32, requires_grad=True)
    d = op.grouped(a, b, offsets)
    g = torch.randn(40, 24, dtype=torch.bfloat16)
    calls.clear()
    d.backward(g)
    assert [(c.layout, c.form) for c in calls] == [("tt", "plain")] * 3 + [("nt", "plain")] * 3
    assert [tuple(c.A.shape) for c in calls] == [(5, 24), (17, 24), (18, 24), (24, 5), (24, 17), (24, 18)]
    ref_a, ref_b = grouped_grads64(a, b, offsets, g)
    assert_grad(a.grad, ref_a, a, "dA")
    assert_grad(b.grad, ref_b, b, "dB")


def test_grouped_backward_falls_back_where_operands_break_the_16_byte_rule(calls):
    """A gradient off the 16-byte rule (a slice of a wider buffer: unaligned base and leading dimension) is taken as it
    is: the grouped dA call and the list call would refuse it, so every group with rows is a plain call (the plain
    op repacks it or runs the unaligned kernel); the result is the same."""
    op = reference_op("tn")
    a, b, offsets = grouped_operands("tn", [5, 0, 17, 18], 24, 32, requires_grad=True)
    d = op.grouped(a, b, offsets)
    g = torch.randn(40, 27).to(torch.bfloat16)[:, 1:25]
    calls.clear()
    d.backward(g)
    assert [(c.layout, c.form) for c in calls] == [("tt", "plain")] * 3 + [("nt", "plain")] * 3
    assert calls[0].A.data_ptr() == g.data_ptr()   # no copy of the gradient
    ref_a, ref_b = grouped_grads64(a, b, offsets, g)
    assert_grad(a.grad, ref_a, a, "dA")
    assert_grad(b.grad, ref_b, b, "dB")


def test_grouped_double_backward():
    """The dA and dB ops' .grouped and .grouped_list have the same formulas: a gradient of the gradient (dB's call
    along K included)."""
    op = reference_op("tn")
    a, b, offsets = grouped_operands("tn", [5, 0, 17, 18], 16, 24, requires_grad=True)
    (grad_a,) = torch.autograd.grad(op.grouped(a, b, offsets).float().pow(2).sum(), a, create_graph=True)
    grad_a.float().sum().backward()
    a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
    (g64,) = torch.autograd.grad(grouped_reference(a64, b64, offsets).pow(2).sum(), a64, create_graph=True)
    g64.sum().backward()
    assert rel(b.grad, b64.grad) <= 2e-2 and rel(a.grad, a64.grad) <= 2e-2


def k_grouped_operands(sizes, m, n, requires_grad=False):
    """A (M, K) column-major, B (K, N) row-major (layout nt, the plans that take groups along K), offsets along K."""
    k = sum(sizes)
    a = torch.randn(k, m).bfloat16().t().requires_grad_(requires_grad)
    b = torch.randn(k, n).bfloat16().requires_grad_(requires_grad)
    return a, b, torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32)


def k_grouped_reference(a, b, sizes, g):
    """dA and dB of D[e] = A[:, group e] @ B[group e] for dD = g, in float64."""
    a64, b64, g64 = a.detach().double(), b.detach().double(), g.double()
    ends = [0, *itertools.accumulate(sizes)]
    ref_a, ref_b = torch.zeros_like(a64), torch.zeros_like(b64)
    for e, (s, t) in enumerate(zip(ends, ends[1:])):
        ref_a[:, s:t] = g64[e] @ b64[s:t].t()
        ref_b[s:t] = a64[:, s:t].t() @ g64[e]
    return ref_a, ref_b


@pytest.mark.parametrize("kind", ["row", "col"])
def test_grouped_k_backward_is_two_grouped_calls_of_rows(calls, kind):
    """Along K: dB = dB-op.grouped(A.t(), dD, offsets) and dA = dA-op.grouped(B, dD.transpose(1, 2), offsets).t() (the
    nt forward's dA op, tn, computes its gradient's transpose), no value read on the host; a column-major dD is made
    row-major first. Against float64, empty groups included."""
    op = reference_op("nt")
    sizes = [5, 0, 17, 18, 0]
    a, b, offsets = k_grouped_operands(sizes, 24, 32, requires_grad=True)
    d = op.grouped(a, b, offsets)
    assert d.shape == (5, 24, 32)
    g = torch.randn(5, 24, 32).bfloat16() if kind == "row" else torch.randn(5, 32, 24).bfloat16().transpose(1, 2)
    calls.clear()
    d.backward(g)
    assert [(c.layout, c.form) for c in calls] == [("tn", "grouped"), ("tt", "grouped")], calls
    grad_a_call, grad_b_call = calls
    assert grad_a_call.A.data_ptr() == b.data_ptr() and grad_b_call.A.data_ptr() == a.data_ptr()
    ref_a, ref_b = k_grouped_reference(a, b, sizes, g)
    assert_grad(a.grad, ref_a, a, "dA")
    assert_grad(b.grad, ref_b, b, "dB")


def test_grouped_k_backward_falls_back_to_plain_calls_per_group(calls, monkeypatch):
    """Where the dA and dB ops refuse grouped calls: one plain call per group with values of K, the same gradients."""
    from generator.runtime import autograd

    monkeypatch.setattr(autograd, "grouped_refusal", lambda cfg: "this plan takes no grouped call")
    op = reference_op("nt")
    sizes = [5, 0, 17, 18]
    a, b, offsets = k_grouped_operands(sizes, 24, 32, requires_grad=True)
    d = op.grouped(a, b, offsets)
    g = torch.randn(4, 24, 32).bfloat16()
    calls.clear()
    d.backward(g)
    assert [(c.layout, c.form) for c in calls] == [("tn", "plain")] * 3 + [("tt", "plain")] * 3, calls
    ref_a, ref_b = k_grouped_reference(a, b, sizes, g)
    assert_grad(a.grad, ref_a, a, "dA")
    assert_grad(b.grad, ref_b, b, "dB")


#: opcheck's tests that run a backward eagerly: its AOT ones trace the backward with fake tensors, which the grouped
#: formulas refuse (test_traced_grouped_backward_is_refused_with_the_workaround).
EAGER_OPCHECKS = ("test_schema", "test_autograd_registration", "test_faketensor")


def test_opcheck_on_grouped_and_list_calls_that_require_grad():
    """opcheck's autograd registration checks on the overloads whose inputs require grad."""
    op = reference_op("tn")
    a, b, offsets = grouped_operands("tn", [5, 0, 17, 18], 24, 32, requires_grad=True)
    torch.library.opcheck(op.op.grouped, (a, b, offsets), test_utils=EAGER_OPCHECKS)
    la, lb = list_operands("tn", requires_grad=True)
    torch.library.opcheck(op.op.grouped_list, (la, lb), test_utils=EAGER_OPCHECKS)


def test_traced_grouped_backward_is_refused_with_the_workaround():
    """A backward traced with fake tensors (torch.compile training through a grouped call) cannot read the group
    ends or the operands' addresses: refused at the trace, naming the workaround, which works (the grouped call in a
    torch.compiler.disable'd function: a graph break, eager autograd there); the forward alone compiles."""
    op = reference_op("tn")
    a, b, offsets = grouped_operands("tn", [5, 0, 17, 18], 24, 32, requires_grad=True)
    compiled = torch.compile(lambda x, y, o: op.grouped(x, y, o).float().sum(), backend="aot_eager", fullgraph=True)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"\.grouped: the backward of a grouped call reads the group sizes .*"
                                        r"torch\.compiler\.disable"):
        compiled(a, b, offsets).backward()
    la, lb = list_operands("tn", requires_grad=True)
    compiled = torch.compile(lambda x, y: sum(d.float().sum() for d in op(x, y)), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match=r"\.grouped_list: the backward of a grouped call"):
        compiled(la, lb).backward()
    torch._dynamo.reset()
    with torch.no_grad():
        assert torch.equal(torch.compile(lambda x, y, o: op.grouped(x, y, o), backend="aot_eager")(a, b, offsets),
                           op.grouped(a, b, offsets))

    @torch.compiler.disable
    def experts(x, w, o):   # the workaround: the grouped call (and its backward) outside the compiled graphs
        return op.grouped(x, w, o)

    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w, o: (experts(x * 2, w, o).float() * 3).sum(), backend="aot_eager")
    compiled(a, b, offsets).backward()
    ref_a, ref_b = grouped_grads64((a * 2).detach(), b, offsets, torch.full((40, 24), 3.0, dtype=torch.bfloat16))
    assert_grad(a.grad, 2 * ref_a, a, "dA")
    assert_grad(b.grad, ref_b, b, "dB")


#: (M, K, N) of the list form's backward: LIST_SIZES (an M = 0 problem among them) and a K = 0 problem.
LIST_GRAD_SIZES = [*LIST_SIZES, (9, 0, 16)]


def list_grads64(a, b, grads):
    """[dA_i], [dB_i] of the list call in float64 (None where grads[i] is None)."""
    out_a, out_b = [], []
    for x, y, g in zip(a, b, grads):
        x64, y64 = (t.detach().double().requires_grad_() for t in (x, y))
        if g is not None:
            (x64 @ y64).backward(g.double())
        out_a.append(x64.grad)
        out_b.append(y64.grad)
    return out_a, out_b


@pytest.mark.parametrize("layout", LAYOUTS)
def test_list_backward_matches_float64(layout, formula):
    """dA_i and dB_i of a list call against float64, all four layouts, every kind of upstream gradient, an M = 0 and
    a K = 0 problem: each in its input's dtype, shape and strides."""
    op = formula_op(formula, layout)
    for kind in GRADS:
        a, b = list_operands(layout, LIST_GRAD_SIZES, requires_grad=True)
        d = op(a, b)
        grads = [_upstream(kind, *t.shape, t.dtype) for t in d]
        torch.autograd.backward(d, grads)
        ref_a, ref_b = list_grads64(a, b, grads)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_grad(x.grad, ref_a[i], x, (kind, f"dA[{i}]"))
            assert_grad(y.grad, ref_b[i], y, (kind, f"dB[{i}]"))


def test_list_backward_is_one_list_call_per_gradient_op(calls):
    """One list call on the dA op and one on the dB op, with (dD_i, B_i.t()) and (A_i.t(), dD_i) (views, no copies)
    of the problems with work (the M = 0 problem launches nothing). nt's column-major dA_i is computed as its
    transpose: problems (B_i, dD_i.t()) (planner.backward.writes_transposed)."""
    op = reference_op("nt")
    a, b = list_operands("nt", requires_grad=True)
    d = op(a, b)
    grads = [torch.randn_like(t) for t in d]
    calls.clear()
    torch.autograd.backward(d, grads)
    assert [(c.layout, c.form) for c in calls] == [("tn", "list"), ("tt", "list")]
    grad_a_call, grad_b_call = calls
    work = [0, 1, 3]
    assert [x.data_ptr() for x in grad_a_call.B] == [grads[i].data_ptr() for i in work]
    assert [y.data_ptr() for y in grad_a_call.A] == [b[i].data_ptr() for i in work]
    assert [x.data_ptr() for x in grad_b_call.A] == [a[i].data_ptr() for i in work]
    assert [tuple(x.shape) for x in grad_b_call.A] == [(k, m) for m, k, _ in (LIST_SIZES[i] for i in work)]
    assert a[2].grad.shape == (0, 16) and torch.equal(b[2].grad, torch.zeros(16, 8, dtype=torch.bfloat16))


def test_list_backward_only_where_gradients_flow(calls):
    """Problems whose output has no gradient, or whose inputs do not require grad, are not computed: None (torch
    leaves .grad unset); only A[0] and B[3] require grad, only D[0] and D[3] are used."""
    op = reference_op("tn")
    a, b = list_operands("tn")
    a[0].requires_grad_()
    b[3].requires_grad_()
    b[1].requires_grad_()   # its output, D[1], gets no gradient
    d = op(a, b)
    calls.clear()
    (d[0].float().sum() + d[3].float().pow(2).sum()).backward()
    assert [(c.layout, c.form, len(c.A)) for c in calls] == [("tt", "list", 1), ("nt", "list", 1)]
    assert b[1].grad is None
    ref_a, ref_b = list_grads64(a, b, [torch.ones_like(d[0]), None, None, 2 * d[3].detach()])
    assert_grad(a[0].grad, ref_a[0], a[0], "dA[0]")
    assert_grad(b[3].grad, ref_b[3], b[3], "dB[3]")


def test_list_backward_per_gradient_order_and_per_problem_fallback(calls):
    """A column-major gradient takes the dA and dB ops of that order (a second list call each); a gradient off the
    16-byte rule takes a plain call for its problem alone."""
    op = reference_op("tn")
    a, b = list_operands("tn", [(16, 32, 24), (8, 16, 40), (24, 8, 16)], requires_grad=True)
    d = op(a, b)
    grads = [torch.randn(16, 24).to(torch.bfloat16), torch.randn(40, 8).to(torch.bfloat16).t(),
             torch.randn(24, 19).to(torch.bfloat16)[:, 1:17]]   # row-major, column-major, off the rule (row)
    calls.clear()
    torch.autograd.backward(d, grads)
    assert [(c.layout, c.form) for c in calls] == [
        ("tt", "list"), ("tt", "plain"), ("nt", "list"), ("nt", "plain"),   # row-major gradients: 0, 2
        ("nt", "list"), ("tt", "list")]                                     # the column-major one: 1
    assert [len(c.A) for c in calls if c.form == "list"] == [1, 1, 1, 1]
    ref_a, ref_b = list_grads64(a, b, grads)
    for i in range(3):
        assert_grad(a[i].grad, ref_a[i], a[i], f"dA[{i}]")
        assert_grad(b[i].grad, ref_b[i], b[i], f"dB[{i}]")


def test_list_backward_falls_back_to_plain_calls_where_the_plans_refuse(calls, monkeypatch):
    from generator.runtime import autograd

    monkeypatch.setattr(autograd, "grouped_list_refusal", lambda cfg: "this plan takes no list call")
    op = reference_op("tt")
    a, b = list_operands("tt", requires_grad=True)
    d = op(a, b)
    grads = [torch.randn_like(t) for t in d]
    calls.clear()
    torch.autograd.backward(d, grads)
    assert [(c.layout, c.form) for c in calls] == [("tn", "plain")] * 3 + [("nt", "plain")] * 3
    ref_a, ref_b = list_grads64(a, b, grads)
    for i in range(4):
        assert_grad(a[i].grad, ref_a[i], a[i], f"dA[{i}]")
        assert_grad(b[i].grad, ref_b[i], b[i], f"dB[{i}]")


def test_list_double_backward():
    op = reference_op("tn")
    a, b = list_operands("tn", [(16, 24, 8), (8, 16, 24)], requires_grad=True)
    loss = sum(t.float().pow(2).sum() for t in op(a, b))
    grads = torch.autograd.grad(loss, a, create_graph=True)
    sum(g.float().sum() for g in grads).backward()
    for x, y in zip(a, b):
        x64, y64 = (t.detach().double().requires_grad_() for t in (x, y))
        (g64,) = torch.autograd.grad((x64 @ y64).pow(2).sum(), x64, create_graph=True)
        g64.sum().backward()
        assert rel(y.grad, y64.grad) <= 2e-2 and rel(x.grad, x64.grad) <= 2e-2


def test_quantized_grouped_calls_refuse_grad_as_the_plain_op():
    """fp8 (and int8) ops have no backward: a grouped or list call that would need a gradient is refused at the call,
    in the words of the default overload's refusal."""
    op = reference_op("tn", dtype="e4m3")
    a = torch.randn(8, 32).to(torch.float8_e4m3fn).requires_grad_()
    b = torch.randn(2, 24, 32).to(torch.float8_e4m3fn).transpose(1, 2)
    offsets = torch.tensor([3, 8], dtype=torch.int32)
    with pytest.raises(RuntimeError) as info:
        op.grouped(a, b, offsets)
    assert str(info.value).startswith(f"{op.name}.grouped multiplies e4m3 operands and has no backward pass, but A "
                                      "require(s) grad: call it under torch.no_grad(), or pass A.detach()")
    with pytest.raises(RuntimeError) as info:
        op([a.detach(), a], [b[0], b[1]])
    assert str(info.value).startswith(f"{op.name}.grouped_list multiplies e4m3 operands and has no backward pass, "
                                      "but A[1] require(s) grad")


def test_tf32_grouped_and_list_backward_copy_into_the_k_major_orders():
    """tf32's sm90 backward kernels read A and B K-major only (layout tn): the formulas copy each operand stored
    otherwise (B.transpose(1, 2) per matrix, each group's slices), and the gradients are fp32."""
    op = ReferenceOp(Gemm("fp32", "tn", arch=90).config, NAMESPACE + "_tf32")
    a, b, offsets = grouped_operands("tn", [5, 0, 17, 18], 24, 32, dtype=torch.float32, requires_grad=True)
    d = op.grouped(a, b, offsets)
    g = torch.randn_like(d)
    d.backward(g)
    ref_a, ref_b = grouped_grads64(a, b, offsets, g)
    assert_grad(a.grad, ref_a, a, "dA", bound=1e-5)
    assert_grad(b.grad, ref_b, b, "dB", bound=1e-5)
    la, lb = list_operands("tn", dtype=torch.float32, requires_grad=True)
    grads = [torch.randn_like(t) for t in op(la, lb)]
    torch.autograd.backward(op(la, lb), grads)
    ref_a, ref_b = list_grads64(la, lb, grads)
    for i in range(len(la)):
        assert_grad(la[i].grad, ref_a[i], la[i], f"dA[{i}]", bound=1e-5)
        assert_grad(lb[i].grad, ref_b[i], lb[i], f"dB[{i}]", bound=1e-5)


# -- generator.nn with the reference op --------------------------------------------------------------------

def _reference_linear(layer):
    from generator.nn import Linear, plan_linear

    return Linear(layer, op=ReferenceOp(plan_linear(layer, arch=90).config))


def test_linear_shares_parameters_and_trains_like_nn_linear():
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16, bias=False)).to(torch.bfloat16)
    ours = copy.deepcopy(base)
    ours[0], ours[2] = _reference_linear(ours[0]), _reference_linear(ours[2])
    assert list(ours.state_dict()) == list(base.state_dict())
    x = torch.randn(3, 5, 32, dtype=torch.bfloat16)
    y, y_ref = ours(x), base(x)
    assert y.shape == (3, 5, 16) and rel(y, y_ref) <= BOUND[torch.bfloat16]
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    for p, p_ref in zip(ours.parameters(), base.parameters()):
        assert rel(p.grad, p_ref.grad) <= 2 * BOUND[torch.bfloat16]


def test_linear_wraps_the_same_parameter_objects():
    layer = nn.Linear(8, 4).to(torch.bfloat16)
    ours = _reference_linear(layer)
    assert ours.weight is layer.weight and ours.bias is layer.bias
    assert "op=sm90_bf16_tn_" in repr(ours)  # planned for arch 90: the sm90 family


def test_linear_falls_back_with_one_warning():
    from generator.nn import Linear, plan_linear

    layer = nn.Linear(8, 4).to(torch.bfloat16)
    real_like = Linear(layer, op=ReferenceOp(plan_linear(layer, arch=90).config))
    real_like.op.device_type = "cuda"   # as a real op: CPU inputs are not its to take (instance attribute)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = real_like(x)
        real_like(x)
    assert torch.equal(y, torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert len(caught) == 1 and "using torch.nn.functional.linear" in str(caught[0].message)


def test_linear_refuses_fp32_weights_without_a_compute_dtype():
    from generator.nn import plan_linear

    with pytest.raises(ValueError, match="pass dtype=torch.bfloat16"):
        plan_linear(nn.Linear(8, 4), arch=90)
    assert plan_linear(nn.Linear(8, 4), arch=90, dtype="bf16").dtype is DType.bf16


def test_replace_linear_swaps_every_plain_linear(monkeypatch):
    import generator.nn as gnn
    from generator.tune import tuned_plan

    built = []

    def fake_compile_many(configs, *, namespace, verbose=False, problems=None, plan_gradient=None):
        assert plan_gradient is tuned_plan   # the backward chosen as compile_buckets' ops choose it (the tables too)
        built.append(list(zip(configs, problems)))
        return [ReferenceOp(c) for c in configs]

    monkeypatch.setattr(gnn, "compile_many", fake_compile_many)

    class Custom(nn.Linear):        # its own forward: left alone
        def forward(self, x):
            return super().forward(x) * 2

    shared = nn.Linear(16, 16)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), shared, nn.Sequential(shared, nn.Linear(16, 16)),
                          Custom(16, 4)).to(torch.bfloat16)
    weights = [model[0].weight, shared.weight]
    assert gnn.replace_linear(model, arch=90) == 3
    assert isinstance(model[0], gnn.Linear) and model[2] is model[3][0] and isinstance(model[3][1], gnn.Linear)
    assert type(model[4]) is Custom
    assert model[0].weight is weights[0] and model[2].weight is weights[1]
    assert len(built) == 1 and len(built[0]) == len(set(built[0]))   # one build, each op once
    assert model[2].op is model[3][1].op                 # equal shapes share one op
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    assert model(x).shape == (4, 4)


def test_replace_linear_checks_every_layer_before_swapping():
    import generator.nn as gnn

    model = nn.Sequential(nn.Linear(8, 8).to(torch.bfloat16), nn.Linear(8, 8))
    with pytest.raises(ValueError, match="float32 weights"):
        gnn.replace_linear(model, arch=90)
    assert type(model[0]) is nn.Linear


def test_replace_linear_folds_biases_and_fuses_the_following_activation(monkeypatch):
    import generator.nn as gnn

    monkeypatch.setattr(gnn, "compile_many", lambda configs, *, namespace, verbose=False, problems=None, plan_gradient=None:
                        [ReferenceOp(c) for c in configs])
    torch.manual_seed(1)
    base = nn.Sequential(nn.Linear(24, 40), nn.GELU(approximate="tanh"), nn.Linear(40, 40), nn.SiLU(),
                         nn.Linear(40, 8, bias=False), nn.Tanh(), nn.Linear(8, 8), nn.Softplus()).to(torch.bfloat16)
    ours = copy.deepcopy(base)
    assert gnn.replace_linear(ours, arch=90) == 4
    acts = [layer.activation for layer in ours if isinstance(layer, gnn.Linear)]
    assert acts == ["gelu_tanh", "silu", "tanh", None]              # Softplus has no epilogue: left as a module
    assert [type(m) for m in ours][1:6:2] == [nn.Identity] * 3 and isinstance(ours[7], nn.Softplus)
    biases = [layer.op.config.epilogue.operands for layer in ours if isinstance(layer, gnn.Linear)]
    assert [tuple(o.kind for o in ops) for ops in biases] == [("col",), ("col",), (), ("col",)]
    x = torch.randn(6, 24, dtype=torch.bfloat16, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y, y_ref = ours(x), base(x_ref)
    assert rel(y, y_ref) <= 2 * BOUND[torch.bfloat16]
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    assert rel(x.grad, x_ref.grad) <= 3 * BOUND[torch.bfloat16]
    for p, p_ref in zip(ours.parameters(), base.parameters()):
        assert rel(p.grad, p_ref.grad) <= 3 * BOUND[torch.bfloat16]
    unfused = copy.deepcopy(base)
    gnn.replace_linear(unfused, arch=90, fuse_activations=False)
    assert isinstance(unfused[1], nn.GELU) and unfused[0].activation is None


def test_linear_activation_knob_and_its_refusals():
    from generator.nn import Linear, plan_linear

    layer = nn.Linear(8, 4).to(torch.bfloat16)
    with pytest.raises(ValueError, match="activation='gleu'"):
        Linear(layer, activation="gleu", op=ReferenceOp(plan_linear(layer, arch=90).config))
    with pytest.raises(ValueError, match="this layer needs"):
        Linear(layer, activation="relu", op=ReferenceOp(plan_linear(layer, arch=90).config))
    ours = Linear(layer, activation="relu", op=ReferenceOp(plan_linear(layer, arch=90, activation="relu").config))
    x = torch.randn(5, 8, dtype=torch.bfloat16)
    assert rel(ours(x), torch.relu(torch.nn.functional.linear(x, layer.weight, layer.bias))) <= BOUND[torch.bfloat16]
    from generator import epilogue as ep

    by_fn = Linear(layer, activation=ep.relu, op=ours.op)            # the function is its name
    assert by_fn.activation == "relu" and plan_linear(layer, arch=90, activation=ep.relu).config == ours.op.config
    with pytest.raises(ValueError, match=r"ep\.relu.*plan\.epilogue = fn"):
        Linear(layer, activation=torch.relu, op=ours.op)


def test_wrong_input_dtype_names_only_fixes_that_exist(real_ops):
    # Re-planning with the tensor's dtype is offered only for a dtype a plan can take (fp16, bf16, fp32 as tf32).
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = real_ops["row"]
    with FakeTensorMode():
        a, b = operands("tn", 64, 48, 32, torch.bfloat16, device="cuda")
        with pytest.raises(TypeError) as err:
            op(a.double(), b)
        assert str(err.value) == "A is torch.float64; this plan computes bf16: pass A.to(torch.bfloat16)"
        with pytest.raises(TypeError) as err:
            op(a.float(), b)                       # fp32 tensors: a tf32 plan takes them
        assert str(err.value).endswith("pass A.to(torch.bfloat16) or plan with dtype='float32'")
        with pytest.raises(TypeError) as err:
            op(a, b.half())
        assert str(err.value).endswith("pass B.to(torch.bfloat16) or plan with dtype='float16'")


# -- tf32: fp32 tensors, read in every layout by both families --------------------------------------------

@pytest.mark.parametrize("layout_c", ["row", "col"])
def test_tf32_autograd_matches_float64_for_every_gradient_order(layout_c):
    # The Python formula (the C++ one is not registered for tf32 JIT ops), for every order of the gradient.
    op = ReferenceOp(Gemm("fp32", "tn", arch=90, layout_c=layout_c).config, NAMESPACE + "_tf32")
    assert not op.cpp_autograd
    for (m, n, k), kind in itertools.product(((64, 48, 32), (37, 19, 23)), GRADS):
        a, b = operands("tn", m, n, k, torch.float32, requires_grad=True)
        a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
        d = op(a, b)
        g = _upstream(kind, m, n, d.dtype)
        d.backward(g)
        (a64 @ b64).backward(g.double())
        for got, ref, t in ((a.grad, a64.grad, a), (b.grad, b64.grad, b)):
            assert got.dtype == torch.float32 and got.shape == t.shape
            assert rel(got, ref) <= 1e-5, (layout_c, m, n, k, kind)   # the reference op multiplies in fp32


def test_tf32_backward_kernels_keep_the_gradient_layouts():
    # Both families read tf32 in every layout: dA and dB take the layouts of 16-bit types (on sm90 a column-major
    # gradient computed as its transpose, planner.backward.writes_transposed), and write fp32.
    from generator.planner.backward import transposed_layout
    for arch, family in ((80, "sm80"), (90, "sm80"), (90, "sm90")):
        for layout in LAYOUTS:
            cfg = Gemm("fp32", layout, arch=arch, family=family).config
            for order in ("row", "col"):
                grads = backward_configs(cfg, order)
                expected = backward_layouts(layout, order)
                if family == "sm90":
                    expected = tuple(transposed_layout(g) if g.c is Order.col else g for g in expected)
                assert tuple(g.layout for g in grads) == expected
                assert all((g.family, g.dtype, g.out_dtype) == (family, DType.tf32, DType.fp32) for g in grads)


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("layout", ["nt", "tn"])
def test_tf32_autograd_copies_no_operand(layout, arch, monkeypatch):
    # The Python formula (tf32) hands each operand to its kernel as it is stored: no copy into K-major order.
    from generator.runtime import autograd

    stored_as_is = autograd._in_order

    def in_order(t, order):
        out = stored_as_is(t, order)
        assert out is t, f"{layout}: an operand was copied into {order.value}-major order"
        return out

    monkeypatch.setattr(autograd, "_in_order", in_order)
    op = ReferenceOp(Gemm("fp32", layout, arch=arch).config, NAMESPACE + f"_tf32_sm{arch}")
    assert not op.cpp_autograd
    for (m, n, k), kind in itertools.product(((64, 48, 32), (37, 19, 23)), ("contiguous", "column-major")):
        a, b = operands(layout, m, n, k, torch.float32, requires_grad=True)
        a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
        g = _upstream(kind, m, n, torch.float32)
        op(a, b).backward(g)
        (a64 @ b64).backward(g.double())
        for got, ref, t in ((a.grad, a64.grad, a), (b.grad, b64.grad, b)):
            assert got.dtype == torch.float32 and got.shape == t.shape and got.stride() == t.stride()
            assert rel(got, ref) <= 1e-5, (layout, m, n, k, kind)


# -- a Linear layer's epilogue, activation(acc + bias): the C++ closed form -------------------------------------------

#: (activation, bias) of every epilogue Epilogue.bias_activation recognises (the identity takes the plain formula).
LINEAR_EPILOGUES = [(act, bias) for act in (None, *BIAS_ACTIVATIONS) for bias in (None, "col") if act or bias]


def linear_call(op, m=37, n=24, k=40, requires_grad=True):
    """x (m, k), W (n, k) and the bias if the op takes one, bf16; the call's output, the leaves and an upstream."""
    x = torch.randn(m, k).bfloat16().requires_grad_(requires_grad)
    w = torch.randn(n, k).bfloat16().requires_grad_(requires_grad)
    values = [torch.randn(n).bfloat16().requires_grad_(requires_grad) for _ in op.config.epilogue.operands]
    return op(x, w.t(), *values), (x, w, *values), torch.randn(m, n).bfloat16()


@pytest.mark.parametrize("activation, bias", LINEAR_EPILOGUES)
def test_linear_epilogue_cpp_formula_gives_the_python_formulas_gradients(activation, bias, monkeypatch):
    """gemm_autograd.h's LinearEpilogueFunction runs the torch ops of autograd.py's closed form on the same values
    (relu: on acc recomputed in fp32, the general path's): the same gradients, bit for bit."""
    if not jit_runtime.RUNTIME.ensure():
        pytest.skip(f"the JIT runtime did not build here: {jit_runtime.RUNTIME.failure}")
    cpp = formula_op(NAMESPACE, activation=activation, bias=bias)
    node = linear_call(cpp)[0].grad_fn
    assert "LinearEpilogueFunction" in node.name()
    monkeypatch.setattr(jit_runtime.RUNTIME, "register_autograd", lambda op, configs, epilogue=None: False)
    python = formula_op(NAMESPACE + "_py", activation=activation, bias=bias)
    torch.manual_seed(1)
    out, leaves, upstream = linear_call(cpp)
    got = torch.autograd.grad(out, leaves, upstream)
    torch.manual_seed(1)
    out, leaves, upstream = linear_call(python)
    want = torch.autograd.grad(out, leaves, upstream)
    for name, g, w, t in zip(("x", "W", "bias"), got, want, leaves):
        assert g.dtype == t.dtype and g.shape == t.shape and torch.equal(g, w), name


@pytest.mark.parametrize("activation", ["gelu_tanh", "relu", None])
def test_linear_epilogue_double_backward_against_float64(activation, formula):
    """Under create_graph the C++ formula recomputes acc with a graph (the accumulator op), so second derivatives
    reach x, W and the bias."""
    op = formula_op(formula, activation=activation, bias="col")
    out, leaves, _ = linear_call(op, 16, 8, 12)
    (grad_x,) = torch.autograd.grad(out.float().pow(2).sum(), leaves[0], create_graph=True)
    got = torch.autograd.grad(grad_x.float().pow(2).sum(), leaves)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    pre = leaves64[0] @ leaves64[1].t() + leaves64[2]
    act = {"gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu, None: lambda t: t}[activation]
    (g64,) = torch.autograd.grad(act(pre).pow(2).sum(), leaves64[0], create_graph=True)
    want = torch.autograd.grad(g64.pow(2).sum(), leaves64)
    for name, g, w in zip(("x", "W", "bias"), got, want):
        assert rel(g, w) <= 3e-2, name


def test_linear_epilogue_formula_builds_a_node_only_where_a_gradient_is_wanted(formula):
    op = formula_op(formula, activation="silu", bias="col")
    x, w, bias = linear_call(op)[1]
    with torch.no_grad():
        assert op(x, w.t(), bias).grad_fn is None
    assert op(x.detach(), w.detach().t(), bias.detach()).grad_fn is None
    (grad_bias,) = torch.autograd.grad(op(x.detach(), w.detach().t(), bias).float().sum(), bias)
    pre = x.double() @ w.double().t() + bias.double()
    assert rel(grad_bias, (torch.sigmoid(pre) * (1 + pre * (1 - torch.sigmoid(pre)))).sum(0)) <= BOUND[torch.bfloat16]


def test_linear_epilogue_batched_calls_refuse_grad_naming_the_bias(formula):
    op = formula_op(formula, activation="gelu", bias="col")
    x, w, bias = (torch.randn(3, 16, 12).bfloat16(), torch.randn(8, 12).bfloat16(),
                  torch.randn(8).bfloat16().requires_grad_())
    with pytest.raises(RuntimeError) as caught:
        op(x, w.t(), bias)
    assert batched_refusal(op, op.config.epilogue.operands[0].name) in str(caught.value)
    with torch.no_grad():
        assert op(x, w.t(), bias).shape == (3, 16, 8)


def test_compile_fullgraph_trains_through_the_linear_epilogue_formula(formula):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    op = formula_op(formula, activation="gelu_tanh", bias="col")
    x, w, bias = linear_call(op, 32, 24, 40)[1]

    def step(x, w, bias):
        return op(x, w.t(), bias).float().pow(2).sum()

    counter = CompileCounterWithBackend("aot_eager")
    got = torch.autograd.grad(torch.compile(step, backend=counter, fullgraph=True)(x, w, bias), (x, w, bias))
    want = torch.autograd.grad(step(x, w, bias), (x, w, bias))
    assert counter.frame_count == 1
    for g, wt in zip(got, want):
        assert torch.equal(g, wt)
