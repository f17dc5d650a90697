"""Ops with a fused epilogue, on CPU: everything but the CUDA kernel.

The op is ``ReferenceOp`` of tests/test_autograd_cpu.py (the real GemmOp registration and checks, torch on
CPU in place of the kernel, the epilogue applied by ``generator.runtime.evaluate``), plus the one check of
``GemmOp.run`` it leaves out: out='s aliasing (``EpilogueOp`` below). Covered here:

* registration: the schema per operand kind (Scalar, Row, Col, Matrix row/col, mixed, aux), from a traced
  function and from knobs; operands positionally and by keyword in the function's parameter order; wrong,
  missing, extra and repeated operands refused with the operand and the call signature;
* each operand check (length, dtype, device, strides, order, shape, scalar type), with the fix in the
  message, and the next correct call right;
* results against float64, twice: ``evaluate`` on the float64 product, and torch expressions written here;
* ``out=``: in place on the matrix operand, overlaps refused, refused for a plan with a second output;
* ``torch.library.opcheck`` and ``torch.compile(fullgraph=True)`` with a dynamic M;
* autograd of A, B and every tensor operand against float64 torch autograd, for every activation; both
  outputs of an aux plan; double backward; grad refused on ``out=``.

The kernels themselves are checked on the GPU by tests/gpu/test_epilogue.py.
"""
import re

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from generator import Gemm  # noqa: E402
from generator import epilogue as ep  # noqa: E402
from generator.runtime import GemmOp, jit_runtime  # noqa: E402
from generator.runtime.checks import TORCH_DTYPES  # noqa: E402
from generator.runtime.evaluate import evaluate, operand_values  # noqa: E402
from generator.runtime.operands import check_batchable, check_operands, check_out_aliasing, scale_blocks  # noqa: E402
from generator.spec.epilogue import BIAS_ACTIVATIONS, Epilogue, with_scales  # noqa: E402
from test_autograd_cpu import BOUND, ReferenceOp, operand, rel  # noqa: E402

NAMESPACE = "gemmgen_epilogue_cpu"
M, N, K = 33, 40, 24          # ragged, and M != N so that a row vector is not mistaken for a column vector


@pytest.fixture(scope="module", autouse=True)
def python_autograd_for_plain_ops():
    """The backward's plain ops (acc, dA, dB) take the Python formula: no nvcc build of the JIT runtime
    (test_autograd_cpu.py covers the C++ one). An epilogue op's own formula is Python either way."""
    mp = pytest.MonkeyPatch()
    mp.setattr(jit_runtime.RUNTIME, "register_autograd", lambda op, configs, epilogue=None: False)
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)   # reproducible, and still fresh inputs for every check within a test


class EpilogueOp(ReferenceOp):
    """ReferenceOp with the checks of GemmOp.run it leaves out: out='s aliasing, and the meta tensors' shape
    inference branch (GemmOp.run's own, which returns before any launch)."""

    def run(self, A, B, operands, out):
        if isinstance(A, torch.Tensor) and A.device.type == "meta":
            return GemmOp.run(self, A, B, operands, out)
        if out is not None:   # GemmOp.run's order: A and B, the operands, out, then out's aliasing
            problem = self._check(A, B)
            if problem.batch is not None:
                check_batchable(self.config)
            check_operands(self.config.epilogue, operands, A, problem.m, problem.n, problem.k)
            self._check_out(out, A, B)
            check_out_aliasing(self.config.epilogue, operands, out, self.config.layout.c, A, B)
        return super().run(A, B, operands, out)


def make(namespace=NAMESPACE, **plan) -> EpilogueOp:
    """The op of ``Gemm(arch=90, **plan)`` (bf16, tn unless given), registered once per name."""
    return EpilogueOp(Gemm(arch=90, **plan).config, namespace)


def ops_namespace(op):
    return getattr(getattr(torch.ops, op.namespace), op.name)


# -- epilogue functions ---------------------------------------------------------------------------

# Options as names: pyflakes reads a string inside an annotation as a forward reference.
MATRIX_COL = ep.Matrix(order="col")
MATRIX_COL_FP32 = ep.Matrix(dtype="fp32", order="col")

def gelu_col(acc, bias: ep.Col):
    return ep.gelu(acc + bias)


def leaky_row(acc, scale: ep.Row):
    return ep.leaky_relu(scale * acc, 0.2)


def sigmoid_matrix(acc, C: ep.Matrix):
    return ep.sigmoid(acc) + C


def tanh_scalar_col_matrix(acc, alpha: ep.Scalar, R: MATRIX_COL_FP32):
    return ep.tanh(alpha * acc) - R


def clamps(acc, bias: ep.Col, scale: ep.Row):
    return ep.clamp(acc + bias, -1.0, 1.5) + ep.clamp(scale * acc, lo=-0.5) + ep.clamp(acc, hi=0.25)


def clamp_by_operands(acc, lo: ep.Row, hi: ep.Col):
    return ep.clamp(acc, lo - 1.0, hi + 1.0)


def max_min_abs(acc, bias: ep.Col, C: MATRIX_COL):
    return ep.max(acc, bias) - ep.min(ep.abs(acc), C) + abs(acc - 1.0)


def division(acc, bias: ep.Col, alpha: ep.Scalar):
    return acc / (1.0 + ep.abs(bias)) + alpha / (2.0 + ep.abs(acc)) - 1.0 / (1.0 + ep.sigmoid(acc))


def neg_square(acc, scale: ep.Row):
    return -(acc - scale) ** 2 / 8.0 + 0.5 * acc


def fused(acc, bias: ep.Col, C: ep.Matrix, alpha: ep.Scalar, beta: ep.Scalar):
    return ep.silu(alpha * acc + bias) + beta * C


def reordered(acc, beta: ep.Scalar, C: ep.Matrix, alpha: ep.Scalar, bias: ep.Row):
    return alpha * acc + beta * C + bias


def with_aux(acc, bias: ep.Col):
    h = acc + bias
    return ep.gelu(h), h


def with_aux_rowwise(acc, scale: ep.Row, C: MATRIX_COL):
    z = scale * acc + C
    return ep.tanh(z), ep.relu(z) * 2.0


# id -> (plan, the same epilogue in torch: f(x = A @ B, *operands as the op takes them) in float64).
# Every activation and every operand kind; dtypes, layouts of A, B, D and output dtypes vary.
CASES = {
    "relu_knobs": (dict(activation="relu", bias="col"), lambda x, bias: F.relu(x + bias)),
    "leaky_relu_row": (dict(epilogue=leaky_row, dtype="fp16", layout="nt"),
                       lambda x, scale: F.leaky_relu(scale[:, None] * x, 0.2)),
    "gelu_col": (dict(epilogue=gelu_col, layout="nn"), lambda x, bias: F.gelu(x + bias)),
    "gelu_tanh_knobs": (dict(activation="gelu_tanh", bias="col", dtype="fp16", layout="tt"),
                        lambda x, bias: F.gelu(x + bias, approximate="tanh")),
    "silu_knobs_row_alpha": (dict(activation="swish", bias="row", alpha="scalar", layout_c="col"),
                             lambda x, bias, alpha: F.silu(alpha * x + bias[:, None])),
    "sigmoid_matrix_fp32_out": (dict(epilogue=sigmoid_matrix, out_dtype="fp32"),
                                lambda x, C: torch.sigmoid(x) + C),
    "tanh_scalar_col_matrix": (dict(epilogue=tanh_scalar_col_matrix, layout="nt"),
                               lambda x, alpha, R: torch.tanh(alpha * x) - R),
    "clamp": (dict(epilogue=clamps, dtype="fp16"),
              lambda x, bias, scale: (torch.clamp(x + bias, -1.0, 1.5) + torch.clamp(scale[:, None] * x, min=-0.5)
                                      + torch.clamp(x, max=0.25))),
    "clamp_by_operands": (dict(epilogue=clamp_by_operands, layout_c="col"),
                          lambda x, lo, hi: torch.minimum(torch.maximum(x, lo[:, None] - 1), hi + 1)),
    "max_min_abs": (dict(epilogue=max_min_abs, dtype="fp16", layout_c="col"),
                    lambda x, bias, C: torch.maximum(x, bias) - torch.minimum(x.abs(), C) + (x - 1).abs()),
    "division": (dict(epilogue=division, layout="tt"),
                 lambda x, bias, alpha: x / (1 + bias.abs()) + alpha / (2 + x.abs()) - 1 / (1 + torch.sigmoid(x))),
    "neg_square": (dict(epilogue=neg_square, out_dtype="fp16"),
                   lambda x, scale: -(x - scale[:, None]).square() / 8 + 0.5 * x),
    "knobs_all": (dict(activation="gelu", bias="col", alpha="scalar", beta="scalar"),
                  lambda x, bias, C, alpha, beta: F.gelu(alpha * x + beta * C + bias)),
    "knobs_constants": (dict(activation="tanh", alpha=0.5, beta=2.0, dtype="fp16", layout="nn"),
                        lambda x, C: torch.tanh(0.5 * x + 2 * C)),
    "fused": (dict(epilogue=fused, dtype="fp16", layout="nt"),
              lambda x, bias, C, alpha, beta: F.silu(alpha * x + bias) + beta * C),
}
AUX_CASES = {
    "aux_gelu": (dict(epilogue=with_aux), lambda x, bias: (F.gelu(x + bias), x + bias)),
    "aux_rowwise_dcol": (dict(epilogue=with_aux_rowwise, dtype="fp16", layout="nt", layout_c="col"),
                         lambda x, scale, C: (torch.tanh(scale[:, None] * x + C), 2 * F.relu(scale[:, None] * x + C))),
}


def inputs(op, m=M, n=N, k=K, requires_grad=False):
    """Fresh A, B (in the plan's orders) and operand values; scalars and scales in [0.5, 2)."""
    cfg = op.config
    a = operand(m, k, cfg.layout.a.value, TORCH_DTYPES[cfg.dtype], requires_grad=requires_grad)
    b = operand(k, n, cfg.layout.b.value, TORCH_DTYPES[cfg.b_dtype], requires_grad=requires_grad)
    values = []
    for o in cfg.epilogue.operands:
        t = TORCH_DTYPES[o.dtype]
        if o.kind == "scalar":
            values.append(float(torch.empty(()).uniform_(0.5, 2.0)))
        elif o.kind == "scalar_tensor":
            values.append(torch.empty(1).uniform_(0.5, 2.0).requires_grad_(requires_grad))
        elif o.kind in ("row_blocks", "col_blocks"):
            shape = (m if o.kind == "row_blocks" else scale_blocks(n), scale_blocks(k))
            values.append(torch.empty(shape).uniform_(0.5, 2.0))
        elif o.kind in ("row", "col"):
            values.append(torch.randn(m if o.kind == "row" else n).to(t).requires_grad_(requires_grad))
        else:
            values.append(operand(m, n, o.order.value, t, requires_grad=requires_grad))
    return a, b, values


def evaluated(op, a, b, values):
    """(D, aux) of the plan's epilogue by generator.runtime.evaluate on the float64 product."""
    e = op.config.epilogue
    return evaluate(e, a.double() @ b.double(), operand_values(e, values, torch.float64))


def written(torch_fn, a, b, values):
    """The test's own torch expression in float64."""
    return torch_fn(a.double() @ b.double(), *(v.double() if isinstance(v, torch.Tensor) else v for v in values))


def bound(op) -> float:
    # fp8 inputs multiply exactly in fp32: the 16-bit output's rounding bounds the error
    return BOUND.get(TORCH_DTYPES[op.config.dtype], BOUND[torch.bfloat16])


def assert_close(got, ref, limit, what=""):
    assert got.shape == ref.shape, what
    err = rel(got, ref)
    assert err <= limit, f"{what}: rel err {err:.2e} > {limit}"


def check_call(op, torch_fn=None, m=M, n=N, k=K, **call):
    """One call on fresh inputs against both float64 references; returns the result."""
    a, b, values = inputs(op, m, n, k)
    got = op(a, b, *values, **call)
    d_ref, aux_ref = evaluated(op, a, b, values)
    refs = (d_ref,) if aux_ref is None else (d_ref, aux_ref)
    if torch_fn is not None:
        mine = written(torch_fn, a, b, values)
        mine = mine if isinstance(mine, tuple) else (mine,)
        for r, t in zip(refs, mine):   # the evaluator against the expression written by hand, float64 both
            assert torch.allclose(r, t, rtol=1e-12, atol=1e-12)
    outs = got if isinstance(got, tuple) else (got,)
    assert len(outs) == len(refs)
    for t, r in zip(outs, refs):
        assert t.dtype == op.out_dtype and t.stride() == op._empty_out(a, b).stride()
        assert_close(t, r, bound(op), op.name)
    return got


# -- 1. registration and schema ----------------------------------------------------------------------

@pytest.mark.parametrize("plan, operands, returns", [
    (dict(epilogue=lambda acc: ep.relu(acc)), "", "Tensor"),
    (dict(epilogue=division), ", Tensor bias, float alpha", "Tensor"),
    (dict(epilogue=leaky_row), ", Tensor scale", "Tensor"),
    (dict(epilogue=sigmoid_matrix), ", Tensor C", "Tensor"),
    (dict(epilogue=tanh_scalar_col_matrix), ", float alpha, Tensor R", "Tensor"),
    (dict(epilogue=fused), ", Tensor bias, Tensor C, float alpha, float beta", "Tensor"),
    (dict(epilogue=reordered), ", float beta, Tensor C, float alpha, Tensor bias", "Tensor"),
    (dict(epilogue=with_aux), ", Tensor bias", "(Tensor, Tensor)"),
    (dict(activation="relu", bias="row"), ", Tensor bias", "Tensor"),
    (dict(alpha="scalar"), ", float alpha", "Tensor"),
    (dict(activation="gelu", bias="col", alpha="scalar", beta="scalar"),
     ", Tensor bias, Tensor C, float alpha, float beta", "Tensor"),
    (dict(alpha=2.0, beta=0.5), ", Tensor C", "Tensor"),
], ids=["no_operands", "col_scalar", "row", "matrix", "scalar_col_matrix", "mixed", "parameter_order", "aux",
        "knobs_row", "knobs_scalar", "knobs_all", "knobs_constants"])
def test_schema_per_operand_kind(plan, operands, returns):
    op = make(**plan)
    qualname = f"{NAMESPACE}::{op.name}"
    assert ops_namespace(op) is op.op and "_ep_" in op.name
    assert str(op.op.default._schema) == f"{qualname}(Tensor A, Tensor B{operands}) -> {returns}"
    assert str(op.op.out._schema) == f"{qualname}.out(Tensor A, Tensor B{operands}, *, Tensor(a!) out) -> Tensor(a!)"
    for overload in (op.op.default, op.op.out):
        assert torch.Tag.needs_fixed_stride_order in overload.tags and torch.Tag.pt2_compliant_tag in overload.tags
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has(qualname, "Autograd") and has(f"{qualname}.out", "CompositeImplicitAutograd")
    assert has(f"{qualname}.out", "Autograd")   # the refusal of grad on out=


def test_knobs_and_the_same_function_are_one_op():
    def same(acc, bias: ep.Col, C: ep.Matrix, alpha: ep.Scalar, beta: ep.Scalar):
        return ep.gelu_tanh(alpha * acc + beta * C + bias)

    by_knobs = make(activation="gelu_tanh", bias="col", alpha="scalar", beta="scalar")
    by_function = make(epilogue=same)
    assert by_knobs.config == by_function.config and by_knobs.op is by_function.op
    # Operand dtypes None resolve to the output dtype
    assert [o.dtype.value for o in make(epilogue=fused, out_dtype="fp32").config.epilogue.operands] == \
        ["fp32", "fp32", "fp32", "fp32"]


def test_a_plan_with_both_a_function_and_knobs_is_refused():
    with pytest.raises(ValueError, match="both an epilogue function and the knobs activation"):
        Gemm(arch=90, epilogue=gelu_col, activation="relu")


def test_operands_positionally_and_by_keyword_in_parameter_order():
    op = make(epilogue=reordered)             # op(A, B, beta, C, alpha, bias)
    a, b, (beta, c, alpha, bias) = inputs(op)
    assert beta != alpha
    want = (a.double() @ b.double()) * alpha + beta * c.double() + bias.double()[:, None]
    positional = op(a, b, beta, c, alpha, bias)
    assert_close(positional, want, bound(op))
    for kwargs in (dict(bias=bias, alpha=alpha, C=c, beta=beta), dict(C=c, alpha=alpha, bias=bias)):
        args = (beta,) if "beta" not in kwargs else ()
        assert torch.equal(op(a, b, *args, **kwargs), positional)
    assert torch.equal(ops_namespace(op)(a, b, beta, c, alpha, bias), positional)
    assert torch.equal(ops_namespace(op)(a, b, bias=bias, alpha=alpha, C=c, beta=beta), positional)
    swapped = op(a, b, alpha, c, beta, bias)   # the scalars swapped: another result
    assert not torch.allclose(swapped.float(), positional.float())


SIGNATURE = "op(A, B, bias, C, alpha, beta)"


@pytest.mark.parametrize("call, fragments", [
    (lambda op, a, b, v: op(a, b, *v[:3]), ("missing epilogue operand(s) beta", SIGNATURE)),
    (lambda op, a, b, v: op(a, b), ("missing epilogue operand(s) bias, C, alpha, beta", SIGNATURE)),
    (lambda op, a, b, v: op(a, b, v[0], v[1]), ("missing epilogue operand(s) alpha, beta", SIGNATURE)),
    (lambda op, a, b, v: op(a, b, *v, 1.0), ("the op takes 6 operands", SIGNATURE, "got 7 positional")),
    (lambda op, a, b, v: op(a, b, *v, gamma=1.0), ("no operand 'gamma'", "bias, C, alpha, beta", SIGNATURE)),
    (lambda op, a, b, v: op(a, b, *v[:3], beta=v[3], bais=v[0]), ("no operand 'bais'", SIGNATURE)),
    (lambda op, a, b, v: op(a, b, *v, alpha=1.0), ("operand 'alpha' given twice", SIGNATURE)),
    (lambda op, a, b, v: op(a, b, v[0], v[1], v[2], v[3], bias=v[0]), ("operand 'bias' given twice", SIGNATURE)),
], ids=["missing_one", "missing_all", "missing_two", "extra", "unknown_keyword", "misspelt", "twice_scalar",
        "twice_tensor"])
def test_wrong_missing_extra_and_repeated_operands(call, fragments):
    op = make(epilogue=fused)
    a, b, values = inputs(op)
    with pytest.raises(TypeError) as info:
        call(op, a, b, values)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    check_call(op)


def test_an_op_without_operands_says_so():
    op = make(activation="relu")
    a, b, _ = inputs(op)
    with pytest.raises(TypeError, match=r"no operand 'bias': its epilogue takes no operands \(op\(A, B\)\)"):
        op(a, b, bias=torch.zeros(N, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"the op takes 2 operands, op\(A, B\); got 3 positional"):
        op(a, b, torch.zeros(N, dtype=torch.bfloat16))


# -- 2. operand checks: each names the fix, and the next call is right ------------------------------------

def _strided(v):
    return torch.randn(2 * v.shape[0]).to(v.dtype)[::2]


def rowwise_fn(acc, scale: ep.Row, R: MATRIX_COL_FP32):
    return ep.clamp(scale * acc + R, -2.0, 2.0)


def rowwise_scalar_fn(acc, alpha: ep.Scalar, scale: ep.Row):
    return alpha * acc * scale


BAD_PLANS = {"fused": dict(epilogue=fused), "rowwise": dict(epilogue=rowwise_fn, layout="nt"),
             "rowwise_scalar": dict(epilogue=rowwise_scalar_fn)}

# id -> (plan of BAD_PLANS, the bad values from good ones, exception, fragments of the message, whether
# torch.ops reaches the op's check: the dispatcher converts a bool or a tensor given for a float argument
# itself, and refuses a list, None or a str for a Tensor or float with its own message)
BAD = {
    "col_too_short": ("fused", lambda v: (v[0][:-1], *v[1:]), ValueError,
                      ["bias has length 39", f"length N (B's columns) = {N}"], True),
    "col_given_m": ("fused", lambda v: (torch.randn(M).bfloat16(), *v[1:]), ValueError,
                    ["bias has length 33", f"= {N}"], True),
    "row_given_n": ("rowwise", lambda v: (torch.randn(N).bfloat16(), *v[1:]), ValueError,
                    ["scale has length 40", f"length M (A's rows) = {M}"], True),
    "vector_2d": ("fused", lambda v: (v[0][None, :], *v[1:]), ValueError, ["bias must be 1-D (N,)"], True),
    "vector_a_list": ("fused", lambda v: (v[0].tolist(), *v[1:]), TypeError,
                      ["bias must be a torch.Tensor of shape (N,), got list"], False),
    "col_wrong_dtype": ("fused", lambda v: (v[0].float(), *v[1:]), TypeError,
                        ["bias is torch.float32", "reads it as bf16", "pass bias.to(torch.bfloat16) or declare it "
                         "with dtype='float32'"], True),
    "col_float64": ("fused", lambda v: (v[0].double(), *v[1:]), TypeError,
                    ["bias is torch.float64", "reads it as bf16: pass bias.to(torch.bfloat16)"], True),
    "matrix_wrong_dtype": ("rowwise", lambda v: (v[0], v[1].bfloat16()), TypeError,
                           ["R is torch.bfloat16", "reads it as fp32", "pass R.to(torch.float32) or declare it with "
                            "dtype='bfloat16'"], True),
    "col_on_meta": ("fused", lambda v: (v[0].to("meta"), *v[1:]), ValueError,
                    ["bias is on meta but A and B on cpu", "pass bias.to('cpu')"], True),
    "matrix_on_meta": ("fused", lambda v: (v[0], v[1].to("meta"), *v[2:]), ValueError,
                       ["C is on meta but A and B on cpu", "pass C.to('cpu')"], True),
    "col_strided": ("fused", lambda v: (_strided(v[0]), *v[1:]), ValueError,
                    ["bias has stride 2", "pass bias.contiguous()"], True),
    "row_strided": ("rowwise", lambda v: (_strided(v[0]), v[1]), ValueError,
                    ["scale has stride 2", "pass scale.contiguous()"], True),
    "matrix_col_major_for_row": ("fused", lambda v: (v[0], v[1].t().contiguous().t(), *v[2:]), ValueError,
                                 ["(column-major)", "reads it row-major", "pass C.contiguous() or declare it "
                                  "ep.Matrix(order='col')"], True),
    "matrix_row_major_for_col": ("rowwise", lambda v: (v[0], v[1].contiguous()), ValueError,
                                 ["(row-major)", "reads it col-major", "pass R.t().contiguous().t() or declare it "
                                  "ep.Matrix(order='row')"], True),
    "matrix_neither_order": ("fused", lambda v: (v[0], torch.randn(M, 2 * N).bfloat16()[:, ::2], *v[2:]),
                             ValueError, ["(neither row- nor column-major)", "reads it row-major: pass C.contiguous()"],
                             True),
    "matrix_wrong_shape": ("fused", lambda v: (v[0], v[1][:-1], *v[2:]), ValueError,
                           ["C has shape (32, 40)", f"M x N operand of D: ({M}, {N})"], True),
    "matrix_transposed": ("fused", lambda v: (v[0], torch.randn(N, M).bfloat16(), *v[2:]), ValueError,
                          ["C has shape (40, 33)", f"({M}, {N})"], True),
    "matrix_1d": ("fused", lambda v: (v[0], v[1][0], *v[2:]), ValueError, ["C must be 2-D (M, N)"], True),
    "scalar_tensor": ("fused", lambda v: (v[0], v[1], torch.tensor(v[2]), v[3]), TypeError,
                      ["alpha is a runtime scalar", "got Tensor", "use float(t)"], False),
    "scalar_bool": ("fused", lambda v: (*v[:3], True), TypeError,
                    ["beta is a runtime scalar", "pass a Python number, got bool"], False),
    "scalar_none": ("fused", lambda v: (*v[:3], None), TypeError, ["beta is a runtime scalar", "got NoneType"], False),
    "scalar_string": ("rowwise_scalar", lambda v: ("2.0", *v[1:]), TypeError,
                      ["alpha is a runtime scalar", "got str"], False),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_operands_are_refused_with_the_fix_and_the_next_call_is_right(case):
    key, bad, error, fragments, via_ops = BAD[case]
    op = make(**BAD_PLANS[key])
    a, b, values = inputs(op)
    calls = [lambda *v: op(a, b, *v), lambda *v: op(a, b, *v, out=op._empty_out(a, b))]
    if via_ops:   # the checks in the op's kernels, for a call through torch.ops
        calls += [lambda *v: ops_namespace(op)(a, b, *v), lambda *v: ops_namespace(op).out(a, b, *v, out=op._empty_out(a, b))]
    for call in calls:
        with pytest.raises(error) as info:
            call(*bad(values))
        message = str(info.value)
        for fragment in fragments:
            assert fragment in message, message
        if "declare" not in " ".join(fragments):
            assert "declare" not in message, message   # no fix that cannot work (dtype='float64', ...)
        check_call(op)          # the process stays usable: the next correct call is right


def test_a_scalar_through_torch_ops_is_converted_by_the_dispatcher():
    """Noted, not ours to change: torch.ops converts a bool or a one-element tensor given for a float argument
    before the op sees it; op(...) refuses both (above)."""
    op = make(epilogue=rowwise_scalar_fn)
    a, b, (alpha, scale) = inputs(op)
    want = ops_namespace(op)(a, b, 1.0, scale)
    assert torch.equal(ops_namespace(op)(a, b, True, scale), want)
    assert torch.equal(ops_namespace(op)(a, b, torch.tensor(1.0), scale), want)


def test_bad_a_and_b_with_operands():
    op = make(epilogue=fused)
    a, b, values = inputs(op)
    with pytest.raises(ValueError, match="K must agree"):
        op(a, b[:-1], *values)
    with pytest.raises(TypeError, match="this plan computes bf16"):
        op(a.half(), b, *values)
    with pytest.raises(ValueError, match="layout_a='row'"):
        op(a.t().contiguous().t(), b, *values)
    check_call(op)


def test_meta_tensors_give_the_output_shapes():
    for plan in (dict(epilogue=fused), dict(epilogue=with_aux_rowwise, layout_c="col")):
        op = make(**plan)
        a, b, values = inputs(op)
        meta = [v.to("meta") if isinstance(v, torch.Tensor) else v for v in values]
        got = op(a.to("meta"), b.to("meta"), *meta)
        for t in (got if isinstance(got, tuple) else (got,)):
            assert t.device.type == "meta" and t.shape == (M, N) and t.stride() == op._empty_out(a, b).stride()
        with pytest.raises(ValueError, match="is on cpu but A and B on meta"):
            op(a.to("meta"), b.to("meta"), *values)
    op = make(epilogue=fused)
    a, b, values = inputs(op)
    out = torch.empty(M, N, dtype=torch.bfloat16, device="meta")
    meta = [v.to("meta") if isinstance(v, torch.Tensor) else v for v in values]
    assert op(a.to("meta"), b.to("meta"), *meta, out=out) is out


# -- 3. results against float64 --------------------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES) + list(AUX_CASES))
def test_results_against_float64(case):
    plan, torch_fn = {**CASES, **AUX_CASES}[case]
    op = make(**plan)
    for m, n, k in ((M, N, K), (1, 7, 5), (17, 1, 9), (64, 48, 32)):
        check_call(op, torch_fn, m, n, k)


def test_k_zero_is_the_epilogue_of_zero():
    op = make(epilogue=fused)
    check_call(op, CASES["fused"][1], M, N, 0)


def test_empty_outputs():
    op = make(epilogue=fused)
    for m, n in ((0, N), (M, 0)):
        a, b, values = inputs(op, m, n, K)
        assert op(a, b, *values).shape == (m, n)


def test_one_plan_many_calls_fresh_inputs():
    op = make(activation="gelu", bias="col", alpha="scalar", beta="scalar")
    for _ in range(5):
        check_call(op, CASES["knobs_all"][1])


# -- 4. out= -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("plan", [dict(epilogue=fused), dict(epilogue=max_min_abs, layout_c="col"),
                                  dict(epilogue=sigmoid_matrix, out_dtype="fp32")], ids=["row_d", "col_d", "fp32"])
def test_out_is_written_and_returned(plan):
    op = make(**plan)
    a, b, values = inputs(op)
    out = op._empty_out(a, b).fill_(float("nan"))
    got = op(a, b, *values, out=out)
    assert got is out
    assert_close(out, evaluated(op, a, b, values)[0], bound(op))
    out2 = op._empty_out(a, b)
    assert ops_namespace(op).out(a, b, *values, out=out2) is out2 and torch.equal(out2, out)


def residual(acc, C: ep.Matrix):
    return acc + C


def residual_col(acc, C: MATRIX_COL):
    return 2.0 * acc - C


@pytest.mark.parametrize("plan", [dict(epilogue=residual), dict(epilogue=residual_col, layout="nt", layout_c="col"),
                                  dict(epilogue=fused)], ids=["row", "col", "fused"])
def test_out_may_be_the_matrix_operand_itself(plan):
    op = make(**plan)
    for _ in range(2):
        a, b, values = inputs(op)
        c = values[[o.name for o in op.config.epilogue.operands].index("C")]
        want = evaluated(op, a, b, values)[0]          # from C before it is overwritten
        assert op(a, b, *values, out=c) is c
        assert_close(c, want, bound(op))


def test_out_with_a_wider_leading_dimension_and_the_same_operand():
    op = make(epilogue=residual)
    a, b, _ = inputs(op)
    c = torch.randn(M, N + 8).bfloat16()[:, 3:N + 3]     # ld = N + 8, odd offset
    want = a.double() @ b.double() + c.double()
    assert op(a, b, c, out=c) is c
    assert_close(c, want, bound(op))


def test_out_overlaps_are_refused():
    op = make(epilogue=fused)
    a, b, (bias, c, alpha, beta) = inputs(op)
    # A (M, K) row-major and out in one buffer, out's first column on A's last
    wide = torch.randn(M, K + N).bfloat16()
    with pytest.raises(ValueError, match="out shares memory with A: .* pass a separate out"):
        op(wide[:, :K], b, bias, c, alpha, beta, out=wide[:, K - 1:K - 1 + N])
    # B (K, N) column-major (layout tn: B = w.t()) and out in one buffer, overlapping by one row of w
    flat = torch.randn(N * K + M * N).bfloat16()
    w = flat[:N * K].view(N, K)
    with pytest.raises(ValueError, match="out shares memory with B: .* pass a separate out"):
        op(a, w.t(), bias, c, alpha, beta, out=flat[N * K - K:N * K - K + M * N].view(M, N))
    # out on C shifted by one row: a partial overlap
    buf = torch.randn(M + 1, N).bfloat16()
    with pytest.raises(ValueError, match="out shares memory with C without being the same tensor: .* pass out=C "
                                         r"itself \(same strides and dtype\) or a separate out"):
        op(a, b, bias, buf[:M], alpha, beta, out=buf[1:])
    # out on C's first element with other strides, both row-major: C's rows (ld N + 1) overlap out's (ld N)
    plain = make(epilogue=residual)
    sa, sb, _ = inputs(plain)
    base = torch.randn(M * (N + 1)).bfloat16()
    c_wide, out_narrow = base.as_strided((M, N), (N + 1, 1)), base.as_strided((M, N), (N, 1))
    with pytest.raises(ValueError, match="out shares memory with C without being the same tensor"):
        plain(sa, sb, c_wide, out=out_narrow)
    # a vector operand inside out
    out = torch.randn(M, N).bfloat16()
    with pytest.raises(ValueError, match="out shares memory with bias without being the same tensor"):
        op(a, b, out[0], c, alpha, beta, out=out)
    check_call(op)
    check_call(plain)


def test_out_next_to_its_operands_in_one_buffer_is_fine():
    """Slices of one buffer that do not overlap are not refused (an arena of activations)."""
    op = make(epilogue=fused)
    a, b, (bias, c, alpha, beta) = inputs(op)
    flat = torch.randn(M * K + M * N + N * K + N + M * N).bfloat16()
    sizes = [M * K, M * N, N * K, N, M * N]
    a_, out, w, bias_, c_ = flat.split(sizes)
    a_, out, w, c_ = a_.view(M, K), out.view(M, N), w.view(N, K), c_.view(M, N)
    for t, v in ((a_, a), (w, b.t()), (bias_, bias), (c_, c)):
        t.copy_(v)
    want = evaluated(op, a_, w.t(), [bias_, c_, alpha, beta])[0]
    assert op(a_, w.t(), bias_, c_, alpha, beta, out=out) is out
    assert_close(out, want, bound(op))


def test_out_on_a_plan_with_a_second_output_is_refused():
    op = make(epilogue=with_aux)
    a, b, (bias,) = inputs(op)
    out = torch.empty(M, N, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"second output \(aux\), which out= cannot receive: call it without out="):
        op(a, b, bias, out=out)
    with pytest.raises(ValueError, match=r"second output \(aux\), which out= cannot receive: call the op without out="):
        ops_namespace(op).out(a, b, bias, out=out)
    check_call(op, AUX_CASES["aux_gelu"][1])


def test_out_on_a_plan_with_a_second_output_is_refused_under_fake_tensors_and_compile():
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = make(epilogue=with_aux)
    a, b, (bias,) = inputs(op)
    out = torch.empty(M, N, dtype=torch.bfloat16)
    message = r"second output \(aux\), which out= cannot receive"
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(t) for t in (a, b, bias, out)]
        with pytest.raises(ValueError, match=message):   # .out's decomposition: the same refusal
            ops_namespace(op).out(*fakes[:3], out=fakes[3])
    for f in (lambda a, b, bias, out: op(a, b, bias, out=out),
              lambda a, b, bias, out: ops_namespace(op).out(a, b, bias, out=out)):
        torch._dynamo.reset()
        with pytest.raises(Exception) as info:
            torch.compile(f, backend="aot_eager", fullgraph=True)(a, b, bias, out)
        assert "second output (aux), which out= cannot receive" in str(info.value)


def test_out_checks_still_apply():
    op = make(epilogue=fused)
    a, b, values = inputs(op)
    with pytest.raises(ValueError, match="out has shape"):
        op(a, b, *values, out=torch.empty(M, N - 1, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="this plan writes bf16"):
        op(a, b, *values, out=torch.empty(M, N))
    with pytest.raises(ValueError, match="this plan writes D row-major"):
        op(a, b, *values, out=torch.empty(N, M, dtype=torch.bfloat16).t())
    with pytest.raises(TypeError, match="out must be a torch.Tensor, got NoneType"):   # .out never allocates
        ops_namespace(op).out(a, b, *values, out=None)
    check_call(op)


# -- 5. opcheck and torch.compile ------------------------------------------------------------------------

OPCHECK_PLANS = {
    "bias_gelu": dict(activation="gelu", bias="col"),
    "alpha_beta_c": dict(activation="silu", bias="row", alpha="scalar", beta="scalar", layout="nt"),
    "col_matrix_fp32_dcol": dict(epilogue=tanh_scalar_col_matrix, layout_c="col", dtype="fp16"),
    "aux": dict(epilogue=with_aux),
}


@pytest.mark.parametrize("key", list(OPCHECK_PLANS))
def test_opcheck(key):
    op = make(**OPCHECK_PLANS[key])
    for requires_grad in (True, False):
        a, b, values = inputs(op, requires_grad=requires_grad)
        torch.library.opcheck(op.op.default, (a, b, *values))
    if op.config.epilogue.aux is None:
        a, b, values = inputs(op)
        torch.library.opcheck(op.op.out, (a, b, *values), {"out": op._empty_out(a, b)})


def _compiled_counter():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    return CompileCounterWithBackend("aot_eager")


@pytest.mark.parametrize("via", ["call", "torch.ops"])
def test_compile_fullgraph_dynamic_m(via):
    op = make(activation="gelu_tanh", bias="col", alpha="scalar", beta="scalar")
    target = op if via == "call" else ops_namespace(op)
    w = torch.randn(N, K).bfloat16().requires_grad_()
    bias = torch.randn(N).bfloat16().requires_grad_()

    def f(x, c):
        return target(x, w.t(), bias, c, 0.75, 1.5).float() * 2

    counter = _compiled_counter()
    compiled = torch.compile(f, backend=counter, fullgraph=True)
    with torch.no_grad():
        for m in (64, 100, 37):
            x, c = torch.randn(m, K).bfloat16(), torch.randn(m, N).bfloat16()
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(c, 0)
            assert torch.equal(compiled(x, c), f(x, c))
    assert counter.frame_count == 1
    for m in (64, 100, 37):    # training: one more graph (forward and backward), again for every M
        x = torch.randn(m, K).bfloat16().requires_grad_()
        c = torch.randn(m, N).bfloat16().requires_grad_()
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(c, 0)
        g = torch.randn(m, N)
        got = torch.autograd.grad(compiled(x, c), (x, w, bias, c), g)
        want = torch.autograd.grad(f(x, c), (x, w, bias, c), g)
        for name, gt, wt in zip(("x", "w", "bias", "C"), got, want):
            assert torch.equal(gt, wt), name
    assert counter.frame_count == 2


def test_compile_fullgraph_aux_and_out():
    aux_op = make(epilogue=with_aux)
    out_op = make(epilogue=fused)
    w = torch.randn(N, K).bfloat16()

    def f(x, bias, c):
        d, h = aux_op(x, w.t(), bias)
        out = torch.empty(x.shape[0], N, dtype=torch.bfloat16)
        out_op(x, w.t(), bias, c, 0.5, 2.0, out=out)
        return d.float() + h.float() * out.float()

    counter = _compiled_counter()
    compiled = torch.compile(f, backend=counter, fullgraph=True)
    for m in (40, 17):
        x, c = torch.randn(m, K).bfloat16(), torch.randn(m, N).bfloat16()
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(c, 0)
        bias = torch.randn(N).bfloat16()
        assert torch.equal(compiled(x, bias, c), f(x, bias, c))
    assert counter.frame_count == 1


def test_compile_refuses_a_bad_operand_with_the_same_message():
    op = make(epilogue=fused)

    def f(x, w, bias, c):
        return op(x, w.t(), bias, c, 1.0, 1.0)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    x, w, c = torch.randn(M, K).bfloat16(), torch.randn(N, K).bfloat16(), torch.randn(M, N).bfloat16()
    with pytest.raises(Exception, match=r"bias\.to\(torch\.bfloat16\)"):
        compiled(x, w, torch.randn(N), c)
    bias = torch.randn(N).bfloat16()
    assert torch.equal(compiled(x, w, bias, c), f(x, w, bias, c))


def test_fake_implementation_checks_operand_sizes():
    """Under fake tensors (torch.compile's tracing) a wrong vector length or matrix shape is refused at once;
    with a dynamic M the check is a run-time assertion, and the graph is still compiled once for every M."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = make(epilogue=fused)
    a, b, (bias, c, alpha, beta) = inputs(op)
    with FakeTensorMode() as mode:
        fa, fb, fbias, fc = (mode.from_tensor(t) for t in (a, b, bias, c))
        with pytest.raises(ValueError, match=r"bias has shape .*it must be \(N,\)"):
            op.op.default(fa, fb, fbias[:-1], fc, alpha, beta)
        with pytest.raises(ValueError, match=r"C has shape .*it must be \(M, N\)"):
            op.op.default(fa, fb, fbias, fc[:-1], alpha, beta)
        d = op.op.default(fa, fb, fbias, fc, alpha, beta)
        assert tuple(d.shape) == (M, N)


# -- 6. autograd ---------------------------------------------------------------------------------------

def grads_against_float64(op, torch_fn, m=M, n=N, k=K):
    a, b, values = inputs(op, m, n, k, requires_grad=True)
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    outs = op(a, b, *values)
    outs = outs if isinstance(outs, tuple) else (outs,)
    upstream = [torch.randn(m, n).to(t.dtype) for t in outs]
    got = torch.autograd.grad(outs, (a, b, *tensors), upstream)
    leaves = [t.detach().double().requires_grad_() for t in (a, b, *tensors)]
    it = iter(leaves[2:])
    values64 = [next(it) if isinstance(v, torch.Tensor) else v for v in values]
    want = torch_fn(leaves[0] @ leaves[1], *values64)
    want = want if isinstance(want, tuple) else (want,)
    want = torch.autograd.grad(want, leaves, [g.double() for g in upstream])
    names = ["A", "B"] + [o.name for o in op.config.epilogue.operands if o.kind != "scalar"]
    for name, t, gt, wt in zip(names, (a, b, *tensors), got, want):
        assert gt.dtype == t.dtype and gt.shape == t.shape, name
        assert_close(gt, wt, 2 * bound(op), f"{op.name} d{name}")


@pytest.mark.parametrize("case", list(CASES) + list(AUX_CASES))
def test_autograd_against_float64(case):
    plan, torch_fn = {**CASES, **AUX_CASES}[case]
    op = make(**plan)
    for m, n, k in ((M, N, K), (5, 3, 7)):
        grads_against_float64(op, torch_fn, m, n, k)


@pytest.mark.parametrize("activation", [None, *BIAS_ACTIVATIONS])
@pytest.mark.parametrize("bias", [None, "col"])
def test_a_linear_layers_epilogue_takes_the_closed_form_with_the_general_paths_values(activation, bias,
                                                                                      monkeypatch):
    """activation(acc + bias) (Epilogue.bias_activation) skips tracing the epilogue in the backward; its gradients
    equal those of the general path (the epilogue differentiated by torch's autograd): to fp32 rounding where they
    take the same values (no activation; relu, whose acc is recomputed in fp32), else to the rounding of acc + bias
    to bf16, where the closed form takes the activation's derivative as torch's Linear + GELU does."""
    if activation is None and bias is None:
        pytest.skip("the identity epilogue has the plain formula")
    op = make(activation=activation, bias=bias)
    assert op.config.epilogue.bias_activation is not None
    monkeypatch.setattr(Epilogue, "bias_activation", property(lambda self: None))
    general_op = make(NAMESPACE + "_general", activation=activation, bias=bias)   # registered without the form
    a, b, values = inputs(op, requires_grad=True)
    leaves = (a, b, *values)
    upstream = torch.randn(M, N).bfloat16()
    closed = torch.autograd.grad(op(a, b, *values), leaves, upstream)
    general = torch.autograd.grad(general_op(a, b, *values), leaves, upstream)
    bound = 1e-6 if activation in (None, "relu") else 2 ** -8
    for name, got, want in zip(("A", "B", "bias"), closed, general):
        assert got.dtype == want.dtype and rel(got, want) < bound, name


def test_aux_gradients_flow_from_either_output():
    op = make(epilogue=with_aux)
    a, b, (bias,) = inputs(op, requires_grad=True)
    d, h = op(a, b, bias)
    g = torch.randn(M, N).bfloat16()
    leaves = [t.detach().double().requires_grad_() for t in (a, b, bias)]
    h64 = leaves[0] @ leaves[1] + leaves[2]
    for out, out64 in ((d, F.gelu(h64)), (h, h64)):   # one output only: the other's gradient is zero
        got = torch.autograd.grad(out, (a, b, bias), g, retain_graph=True)
        want = torch.autograd.grad(out64, leaves, g.double(), retain_graph=True)
        for gt, wt in zip(got, want):
            assert_close(gt, wt, 2 * bound(op))


def test_only_the_wanted_gradients():
    op = make(epilogue=fused)
    a, b, (bias, c, alpha, beta) = inputs(op)
    bias.requires_grad_()
    d = op(a, b, bias, c, alpha, beta)
    (g_bias,) = torch.autograd.grad(d.float().sum(), bias)
    x = (a.double() @ b.double()) * alpha + bias.detach().double()
    want = (torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x)))).sum(0)
    assert_close(g_bias, want, 2 * bound(op))
    with torch.no_grad():
        assert op(a, b, bias, c, alpha, beta).grad_fn is None
    assert op(a, b, bias.detach(), c, alpha, beta).grad_fn is None


def test_double_backward_against_float64():
    op = make(activation="gelu_tanh", bias="col")
    a, b, (bias,) = inputs(op, 16, 8, 12, requires_grad=True)
    (grad_a,) = torch.autograd.grad(op(a, b, bias).float().pow(2).sum(), a, create_graph=True)
    got = torch.autograd.grad(grad_a.float().pow(2).sum(), (a, b, bias))
    leaves = [t.detach().double().requires_grad_() for t in (a, b, bias)]
    (g64,) = torch.autograd.grad(F.gelu(leaves[0] @ leaves[1] + leaves[2], approximate="tanh").pow(2).sum(),
                                 leaves[0], create_graph=True)
    want = torch.autograd.grad(g64.pow(2).sum(), leaves)
    assert_close(grad_a, g64, 2e-2, "dA")
    for name, gt, wt in zip(("A", "B", "bias"), got, want):
        assert gt is not None, name
        assert_close(gt, wt, 3e-2, f"d(dA)/d{name}")


def test_out_refuses_grad_like_aten():
    op = make(epilogue=fused)
    a, b, values = inputs(op)
    for which in range(3):   # A, B, or only the bias
        tensors = [a.clone(), b.clone(), values[0].clone()]
        tensors[which].requires_grad_()
        with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
            op(tensors[0], tensors[1], tensors[2], *values[1:], out=op._empty_out(a, b))
        with torch.no_grad():
            out = op._empty_out(a, b)
            assert op(tensors[0], tensors[1], tensors[2], *values[1:], out=out) is out
    check_call(op)


@pytest.mark.parametrize("plan, saves, recomputes", [
    (dict(activation="gelu_tanh", bias="col"), True, False),    # smooth: the forward stores acc, the backward reads it
    (dict(epilogue=gelu_col, layout="nn"), True, False),
    (dict(activation="relu", bias="col"), False, True),          # a kink: acc recomputed in fp32
    (dict(epilogue=with_aux), False, True),                      # a second output of its own: recomputed
    (dict(bias="col"), False, False),                            # affine in acc: no accumulator needed
    (dict(alpha=2.0, beta=0.5), False, False),
])
def test_kernels_of_a_training_step(plan, saves, recomputes, monkeypatch):
    op = make(**plan)
    launched = []
    run = ReferenceOp.run

    def recording_run(self, A, B, operands, out):
        launched.append(self.config)
        return run(self, A, B, operands, out)

    monkeypatch.setattr(ReferenceOp, "run", recording_run)
    a, b, values = inputs(op, requires_grad=True)
    with torch.no_grad():
        op(a, b, *values)
    assert launched == [op.config]           # no gradient wanted: the op's own kernel
    launched.clear()
    out = op(a, b, *values)
    d = out[0] if isinstance(out, tuple) else out
    forward = launched[0].epilogue
    assert (forward.aux is not None and forward.aux.op == "acc" and forward.result == op.config.epilogue.result) == saves
    assert saves or launched[0] == op.config
    launched.clear()
    d.float().sum().backward()
    acc_launches = [c for c in launched if c.epilogue.is_identity and c.out_dtype.value == "fp32"]
    assert len(acc_launches) == int(recomputes), [c.name for c in launched]
    assert a.grad is not None and b.grad is not None


def test_compiled_training_step_matches_eager():
    # Under torch.compile the op's Autograd kernel is traced: the saving kernel in the forward graph, the
    # epilogue's derivative and dA, dB in the backward graph. AOTAutograd's trace is what this checks; Inductor's
    # code generation for CPU tensors (20 s of C++ compiles on the CI's cores) is not gemmgen's, and the GPU tests
    # run Inductor on the real kernels (tests/gpu/test_emitted_epilogue.py, test_fp8.py).
    op = make(activation="gelu_tanh", bias="col")
    a, b, (bias,) = inputs(op, requires_grad=True)
    compiled = torch.compile(lambda a, b, bias: op(a, b, bias), backend="aot_eager", fullgraph=True, dynamic=True)
    g = torch.randn(M, N).bfloat16()
    out = compiled(a, b, bias)
    assert torch.equal(out, op(a, b, bias))
    got = torch.autograd.grad(out, (a, b, bias), g)
    want = torch.autograd.grad(op(a, b, bias), (a, b, bias), g)
    # The closed form takes gelu's derivative at acc + bias rounded to bf16, as torch's Linear + GELU does; Inductor
    # (on the GPU) fuses the add into the derivative's kernel and keeps it in fp32: the bound allows that rounding.
    for name, x, y in zip(("A", "B", "bias"), got, want):
        assert x.dtype == y.dtype and rel(x, y) < 2 ** -7, name


# -- 7. fp8 scales: one-element scale tensors, fp32 row/column scales, per-block scales ------------------------
# Per tensor and per row are applied by the epilogue (acc * scale_a * scale_b), so the reference computes them;
# per-block scales are the kernel's main loop's (tests/gpu/test_fp8.py checks their results): here, their checks.

SCALED_PLANS = {
    "tensor": dict(epilogue=with_scales(ep.from_knobs(activation="gelu", bias="col"), "tensor")),
    "row": dict(epilogue=with_scales(ep.trace(leaky_row), "row"), layout_c="col"),
    "block": dict(dtype="e4m3", epilogue=with_scales(ep.from_knobs(bias="col"), "block")),
    # int8 dequantized by rows (SmoothQuant's W8A8), and fp8 of two formats
    "int8_row": dict(dtype="int8", out_dtype="bf16", epilogue=with_scales(ep.IDENTITY, "row")),
    "mixed_fp8": dict(dtype="e5m2", dtype_b="e4m3", epilogue=with_scales(ep.IDENTITY, "tensor")),
}
SCALED_CASES = {
    "tensor": lambda x, sa, sb, bias: F.gelu(x * sa * sb + bias),
    "row": lambda x, sa, sb, scale: F.leaky_relu(scale[:, None] * (x * sa[:, None] * sb), 0.2),
}


@pytest.mark.parametrize("key, operands", [
    ("tensor", ", Tensor scale_a, Tensor scale_b, Tensor bias"),
    ("row", ", Tensor scale_a, Tensor scale_b, Tensor scale"),
    ("block", ", Tensor scale_a, Tensor scale_b, Tensor bias"),
])
def test_scaled_schema(key, operands):
    op = make(**SCALED_PLANS[key])
    assert f"_ep_scale_{key}_" in op.name
    assert str(op.op.default._schema) == f"{NAMESPACE}::{op.name}(Tensor A, Tensor B{operands}) -> Tensor"


@pytest.mark.parametrize("key", list(SCALED_CASES))
def test_scaled_results_against_float64(key):
    op = make(**SCALED_PLANS[key])
    for m, n, k in ((M, N, K), (1, 7, 5), (17, 1, 9)):
        check_call(op, SCALED_CASES[key], m, n, k)


def test_a_scale_tensor_may_be_0_d_or_strided():
    op = make(**SCALED_PLANS["tensor"])
    a, b, (sa, sb, bias) = inputs(op)
    want = op(a, b, sa, sb, bias)
    assert torch.equal(op(a, b, sa.reshape(()), sb, bias), want)
    assert torch.equal(op(a, b, sa, torch.stack([sb[0], sb[0] + 1])[:1], bias), want)      # a view of a larger one
    assert torch.equal(ops_namespace(op)(a, b, sa.reshape(()), sb.reshape(()), bias), want)


@pytest.mark.parametrize("key", list(SCALED_CASES))
def test_scaled_autograd_against_float64(key):
    grads_against_float64(make(**SCALED_PLANS[key]), SCALED_CASES[key])


def test_block_scales_reach_the_launch_with_their_leading_dimension():
    op = make(**SCALED_PLANS["block"])
    a, b, (sa, sb, bias) = inputs(op, M, 300, 260)
    assert sa.shape == (M, 3) and sb.shape == (3, 3)
    padded = torch.empty(M, 8)[:, :3].copy_(sa)              # a leading dimension of 8
    slots = check_operands(op.config.epilogue, [padded, sb, bias], a, M, 300, 260)
    assert slots[0] == (padded.data_ptr(), 8, 0.0) and slots[1] == (sb.data_ptr(), 3, 0.0)
    assert op(a, b, padded, sb, bias).shape == (M, 300)


def _col_major(t):
    return t.t().contiguous().t()


# id -> (plan of SCALED_PLANS, the bad values from good ones, exception, the message, whether torch.ops reaches the
# op's check). Each message names the fix. K = 24 and N = 40: one 128-wide block along K and N.
BAD_SCALES = {
    "tensor_a_float": ("tensor", lambda v: (2.0, *v[1:]), TypeError,
                       "scale_a must be a torch.Tensor of shape (1,), got float", False),
    "tensor_two_elements": ("tensor", lambda v: (torch.ones(2), *v[1:]), ValueError,
                            "scale_a has shape (2,); a per-tensor scale is one element, shape (1,) or (): pass a "
                            "one-element fp32 tensor", True),
    "tensor_2d": ("tensor", lambda v: (v[0], torch.ones(1, 1), v[2]), ValueError,
                  "scale_b has shape (1, 1); a per-tensor scale is one element, shape (1,) or (): pass a one-element "
                  "fp32 tensor", True),
    "tensor_empty": ("tensor", lambda v: (torch.ones(0), *v[1:]), ValueError, "scale_a has shape (0,)", True),
    "tensor_fp16": ("tensor", lambda v: (v[0].half(), *v[1:]), TypeError,
                    "scale_a is torch.float16; this plan's epilogue reads it as fp32: pass scale_a.to(torch.float32)",
                    True),
    "tensor_on_meta": ("tensor", lambda v: (v[0], v[1].to("meta"), v[2]), ValueError,
                       "scale_b is on meta but A and B on cpu: pass scale_b.to('cpu')", True),
    "row_scale_bf16": ("row", lambda v: (v[0].bfloat16(), *v[1:]), TypeError,
                       "scale_a is torch.bfloat16; this plan's epilogue reads it as fp32: pass "
                       "scale_a.to(torch.float32)", True),
    "row_scale_b_short": ("row", lambda v: (v[0], v[1][:-1], v[2]), ValueError,
                          f"scale_b has length {N - 1}; a per-col vector has one value per column of D: length N "
                          f"(B's columns) = {N}", True),
    "block_a_shape": ("block", lambda v: (torch.ones(M, 2), *v[1:]), ValueError,
                      f"scale_a has shape ({M}, 2); per-block scales of A are (M, ceil(K/128)) = ({M}, 1) for this "
                      "call", True),
    "block_b_shape": ("block", lambda v: (v[0], torch.ones(N, 1), v[2]), ValueError,
                      f"scale_b has shape ({N}, 1); per-block scales of B are (ceil(N/128), ceil(K/128)) = (1, 1) for "
                      "this call", True),
    "block_a_1d": ("block", lambda v: (v[0][:, 0], *v[1:]), ValueError,
                   f"scale_a must be 2-D (M, ceil(K/128)); got shape ({M},)", True),
    "block_a_bf16": ("block", lambda v: (v[0].bfloat16(), *v[1:]), TypeError,
                     "scale_a is torch.bfloat16; this plan's epilogue reads it as fp32: pass scale_a.to(torch.float32)",
                     True),
    "block_a_list": ("block", lambda v: (v[0].tolist(), *v[1:]), TypeError,
                     "scale_a must be a torch.Tensor of shape (M, ceil(K/128)), got list", False),
}


@pytest.mark.parametrize("case", list(BAD_SCALES))
def test_bad_scales_are_refused_with_the_fix(case):
    key, bad, error, message, via_ops = BAD_SCALES[case]
    op = make(**SCALED_PLANS[key])
    a, b, values = inputs(op)
    calls = [lambda *v: op(a, b, *v), lambda *v: op(a, b, *v, out=op._empty_out(a, b))]
    if via_ops:
        calls += [lambda *v: ops_namespace(op)(a, b, *v)]
    for call in calls:
        with pytest.raises(error) as info:
            call(*bad(values))
        assert message in str(info.value) and "declare" not in str(info.value), str(info.value)
    assert op(a, b, *values).shape == (M, N)   # the next correct call is right


def test_block_scales_must_be_row_major():
    op = make(**SCALED_PLANS["block"])
    a, b, (sa, sb, bias) = inputs(op, M, N, 200)               # two K blocks
    with pytest.raises(ValueError, match=re.escape(
            f"scale_a has strides (1, {M}) (column-major); the kernel reads per-block scales row-major: pass "
            "scale_a.contiguous()")):
        op(a, b, _col_major(sa), sb, bias)
    assert op(a, b, _col_major(sa).contiguous(), sb, bias).shape == (M, N)


def test_k_zero_takes_empty_block_scales():
    op = make(**SCALED_PLANS["block"])
    a, b, (sa, sb, bias) = inputs(op, M, N, 0)
    assert sa.shape == (M, 0) and sb.shape == (1, 0)
    assert op(a, b, sa, sb, bias).shape == (M, N)


def test_fake_implementation_checks_scale_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    block, tensor = make(**SCALED_PLANS["block"]), make(**SCALED_PLANS["tensor"])
    a, b, (sa, sb, bias) = inputs(block)
    ta, tb, (tsa, tsb, tbias) = inputs(tensor)
    with FakeTensorMode() as mode:
        fa, fb, fsa, fsb, fbias = (mode.from_tensor(t) for t in (a, b, sa, sb, bias))
        with pytest.raises(ValueError, match=re.escape(f"scale_a has shape ({M - 1}, 1); per-block scales of A are "
                                                       f"(M, ceil(K/128)) = ({M}, 1) for this call")):
            block.op.default(fa, fb, fsa[:-1], fsb, fbias)
        assert tuple(block.op.default(fa, fb, fsa, fsb, fbias).shape) == (M, N)
        fta, ftb, ftbias = (mode.from_tensor(t) for t in (ta, tb, tbias))
        with pytest.raises(ValueError, match="a per-tensor scale is one element"):
            tensor.op.default(fta, ftb, mode.from_tensor(torch.ones(3)), mode.from_tensor(tsb), ftbias)


@pytest.mark.parametrize("key", list(SCALED_PLANS))
def test_scaled_opcheck(key):
    op = make(**SCALED_PLANS[key])
    a, b, values = inputs(op)
    # test_schema multiplies the inputs, which torch does not do for fp8 on the CPU
    tests = {} if op.config.dtype.value in ("bf16", "fp16") else {
        "test_utils": ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")}
    torch.library.opcheck(op.op.default, (a, b, *values), **tests)
    torch.library.opcheck(op.op.out, (a, b, *values), {"out": op._empty_out(a, b)}, **tests)


@pytest.mark.parametrize("key", list(SCALED_PLANS))
def test_scaled_compile_fullgraph_dynamic_m(key):
    """Scale tensors stay on the device (no .item(), no graph break); per-block scales' (M, ceil(K/128)) is a
    run-time assertion for a dynamic M, so one graph serves every M."""
    op = make(**SCALED_PLANS[key])
    _, b, values = inputs(op)

    def f(x, sa, *rest):
        return op(x, b, sa, *rest).float() * 2

    counter = _compiled_counter()
    compiled = torch.compile(f, backend=counter, fullgraph=True)
    with torch.no_grad():
        for m in (64, 100, 37):
            x, _, fresh = inputs(op, m=m)
            torch._dynamo.mark_dynamic(x, 0)
            for o, v in zip(op.config.epilogue.operands, fresh):
                if o.kind in ("row", "row_blocks"):   # per row of A: dynamic with it
                    torch._dynamo.mark_dynamic(v, 0)
            assert torch.equal(compiled(x, *fresh), f(x, *fresh))
    assert counter.frame_count == 1


@pytest.mark.parametrize("key", ["block", "int8_row", "mixed_fp8"])
def test_quantized_ops_refuse_grad_and_run_without_it(key):
    """fp8 and int8 are forward only: a call that would need a gradient is refused when it runs, not answered
    with a result that has none; without grad mode (or with detached inputs) the same call runs."""
    op = make(**SCALED_PLANS[key])
    a, b, values = inputs(op)
    wanting = [v.clone().requires_grad_() if i == 0 else v for i, v in enumerate(values)]
    with pytest.raises(RuntimeError, match=f"{op.name} multiplies {op.config.dtype.value} operands and has no "
                                           "backward pass, but scale_a require"):
        op(a, b, *wanting)
    with torch.no_grad():
        assert op(a, b, *wanting).shape == (a.shape[0], b.shape[1])


# -- 8. batched calls (3-D A or B): shared scalars, scales and vectors; refusals -------------------------------

BATCH = 3
#: (A's batch, B's batch): None a 2-D operand, 1 a batch of 1 broadcast against the other's.
BATCHES = [(BATCH, None), (None, BATCH), (BATCH, BATCH), (1, BATCH), (BATCH, 1)]
#: The cases whose operands a batched call takes (no matrix operand, no second output).
BATCHABLE_CASES = [key for key, (plan, _) in CASES.items()
                   if all(o.kind != "matrix" for o in make(**plan).config.epilogue.operands)]


def batched_inputs(op, batches, m=M, n=N, k=K):
    """Fresh A and B of the batch sizes (None: 2-D), each matrix in the plan's order, packed; and operand values."""
    cfg = op.config
    _, _, values = inputs(op, m, n, k)

    def one(batch, rows, cols, order, dtype):
        if batch is None:
            return operand(rows, cols, order, dtype)
        t = torch.randn(batch, rows, cols) if order == "row" else torch.randn(batch, cols, rows).transpose(1, 2)
        return t.to(dtype)   # (a dense tensor keeps its strides)

    return (one(batches[0], m, k, cfg.layout.a.value, TORCH_DTYPES[cfg.dtype]),
            one(batches[1], k, n, cfg.layout.b.value, TORCH_DTYPES[cfg.b_dtype]), values)


def batched_reference(op, a, b, values):
    """(D, aux) of the epilogue on the float64 batched product, each problem as torch.matmul broadcasts them."""
    e = op.config.epilogue
    return evaluate(e, a.double() @ b.double(), operand_values(e, values, torch.float64))


@pytest.mark.parametrize("case", BATCHABLE_CASES + list(SCALED_CASES))
def test_batched_results_against_float64(case):
    plan = {**CASES, **{k: (SCALED_PLANS[k], f) for k, f in SCALED_CASES.items()}}[case][0]
    op = make(**plan)
    for batches in BATCHES:
        a, b, values = batched_inputs(op, batches)
        want = batched_reference(op, a, b, values)[0]
        got = op(a, b, *values)
        assert got.stride() == op._empty_out(a, b).stride() and got.shape == (BATCH, M, N)
        meta = op(a.to("meta"), b.to("meta"), *(v.to("meta") if isinstance(v, torch.Tensor) else v for v in values))
        assert (meta.device.type, meta.shape, meta.stride()) == ("meta", got.shape, got.stride())
        assert_close(got, want, bound(op), f"{op.name} {batches}")
        # out= with its matrices 5 lines apart
        lines = (M + 5, N) if op.config.layout.c.value == "row" else (N + 5, M)
        padded = torch.full((BATCH, *lines), float("nan"), dtype=op.out_dtype)
        out = padded[:, :M] if op.config.layout.c.value == "row" else padded[:, :N].transpose(1, 2)
        assert op(a, b, *values, out=out) is out
        assert_close(out, want, bound(op), f"{op.name} {batches} out=")
        assert torch.isnan(padded[:, M:] if op.config.layout.c.value == "row" else padded[:, N:]).all()


# id -> (plan, the message of a batched call's refusal)
BATCH_REFUSED = {
    "matrix": (dict(epilogue=fused), "a batched call (3-D A or B) takes no matrix operand 'C': call the op once per "
                                     "problem with 2-D tensors, or plan without it"),
    "aux": (dict(epilogue=with_aux), "a batched call (3-D A or B) cannot store the plan's second output (aux): call "
                                     "the op once per problem with 2-D tensors, or plan without it"),
    "block_scales": (SCALED_PLANS["block"], "a batched call (3-D A or B) takes no per-block scales 'scale_a': call the "
                                            "op once per problem with 2-D tensors, or plan with scale='tensor' or "
                                            "scale='row'"),
}


@pytest.mark.parametrize("key", list(BATCH_REFUSED))
def test_batched_calls_refuse_per_problem_operands_with_the_fix(key):
    """op(...), torch.ops and .out alike; meta and fake tensors too (the refusal depends on ranks only); the next
    2-D call is right."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    plan, message = BATCH_REFUSED[key]
    op = make(**plan)
    for batches in ((BATCH, None), (None, BATCH), (1, 1)):
        a, b, values = batched_inputs(op, batches)
        calls = [lambda *v: op(a, b, *v), lambda *v: ops_namespace(op)(a, b, *v),
                 lambda *v: op(a.to("meta"), b.to("meta"), *(x.to("meta") if isinstance(x, torch.Tensor) else x
                                                               for x in v))]
        if op.config.epilogue.aux is None:
            calls += [lambda *v: ops_namespace(op).out(a, b, *v, out=torch.empty(a.shape[0], M, N, dtype=op.out_dtype))]
        for call in calls:
            with pytest.raises(ValueError) as info:
                call(*values)
            assert str(info.value) == message
        with FakeTensorMode() as mode:
            fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in (a, b, *values)]
            with pytest.raises(ValueError, match=re.escape(message)):
                ops_namespace(op)(*fakes)
    if key != "block_scales":   # (fp8: no CPU reference product here)
        check_call(op)
    else:
        assert op(*inputs(op)[:2], *inputs(op)[2]).shape == (M, N)


def test_batched_epilogue_calls_refuse_grad_naming_the_inputs():
    op = make(activation="gelu_tanh", bias="col", alpha="scalar")
    a, b, (bias, alpha) = batched_inputs(op, (BATCH, None))
    for wanting in ("A", "bias", "B, bias"):
        x, y, v = (t.detach().clone().requires_grad_(name in wanting)
                   for t, name in ((a, "A"), (b, "B"), (bias, "bias")))
        with pytest.raises(RuntimeError) as info:
            op(x, y, v, alpha)
        assert str(info.value) == (f"{op.name}: batched calls (3-D A or B) have no backward pass yet, but {wanting} "
                                   "require(s) grad: call it under torch.no_grad() or with detached tensors, or call "
                                   "it once per problem with 2-D tensors")
    with torch.no_grad():
        d = op(a, b, bias, alpha)
    assert d.grad_fn is None
    assert_close(d, batched_reference(op, a.detach(), b.detach(), [bias.detach(), alpha])[0], bound(op))


def test_batched_compile_fullgraph_dynamic_batch_and_m():
    """Shared vectors and a scalar under torch.compile: one graph for every batch size and M."""
    op = make(epilogue=clamp_by_operands, layout_c="col")     # a per-row and a per-column vector
    counter = _compiled_counter()
    compiled = torch.compile(lambda a, b, lo, hi: op(a, b, lo, hi).float() - 1, backend=counter, fullgraph=True)
    with torch.no_grad():
        for batch, m in ((2, 64), (5, 37), (4, 100)):
            a, b, (lo, hi) = batched_inputs(op, (batch, batch), m=m)
            for t, dims in ((a, (0, 1)), (b, (0,)), (lo, (0,))):
                for dim in dims:
                    torch._dynamo.mark_dynamic(t, dim)
            got = compiled(a, b, lo, hi)
            assert got.shape == (batch, m, N) and torch.equal(got, op(a, b, lo, hi).float() - 1)
    assert counter.frame_count == 1
