"""The epilogue description: tracing every supported operation, knobs == functions, names and digests,
and every refusal naming the function and the line.

No ``from __future__ import annotations`` here: the annotations below are evaluated objects, and
test_string_annotations_future_import covers the string form."""

import importlib.util
import inspect
import itertools
import math
import os
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from generator import epilogue as ep
from generator.spec.epilogue import ACC, Epilogue, EpilogueError, Expr, Operand, Value
from generator.spec.types import DType, Order

ROOT = Path(__file__).resolve().parent.parent
FILE = os.path.basename(__file__)


def opnd(name: str) -> Expr:
    return Expr("operand", name=name)


def const(value: float) -> Expr:
    return Expr("const", value=value)


def E(op: str, *args: Expr) -> Expr:  # noqa: N802  (reads like the S-expression)
    return Expr(op, args)


def line_of(fn, marker: str) -> int:
    """The source line of fn that contains marker."""
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, line in enumerate(lines) if marker in line]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def refused(fn, line: int, *fragments: str) -> str:
    """trace(fn) raises EpilogueError naming fn, the line and this file, plus each fragment."""
    with pytest.raises(EpilogueError) as info:
        ep.trace(fn)
    message = str(info.value)
    assert f"epilogue {fn.__name__}() line {line} ({FILE}): " in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


# -- every operation ------------------------------------------------------------------------------


@pytest.mark.parametrize("func, op", [
    (ep.relu, "relu"), (ep.gelu, "gelu"), (ep.gelu_tanh, "gelu_tanh"), (ep.silu, "silu"),
    (ep.sigmoid, "sigmoid"), (ep.tanh, "tanh"), (ep.abs, "abs"),
])
def test_unary_functions(func, op) -> None:
    desc = ep.trace(lambda acc: func(acc))
    assert desc.result == E(op, ACC) and desc.operands == () and desc.aux is None
    assert desc.text == f"{op}(acc)"


def test_leaky_relu_default_and_explicit_slope() -> None:
    assert ep.trace(lambda acc: ep.leaky_relu(acc)).result == E("leaky_relu", ACC, const(0.01))
    assert ep.trace(lambda acc: ep.leaky_relu(acc, 0.2)).result == E("leaky_relu", ACC, const(0.2))
    assert ep.trace(lambda acc: ep.leaky_relu(acc, slope=1)).result == E("leaky_relu", ACC, const(1.0))
    assert ep.trace(lambda acc: ep.leaky_relu(acc, 0.2)).text == "leaky_relu(acc, 0.2)"


def test_clamp_both_and_one_sided() -> None:
    def f(acc, lo: ep.Scalar):
        return ep.clamp(acc, lo, 6)

    assert ep.trace(f).result == E("clamp", ACC, opnd("lo"), const(6))
    assert ep.trace(lambda acc: ep.clamp(acc, 0, 6)).result == E("clamp", ACC, const(0), const(6))
    assert ep.trace(lambda acc: ep.clamp(acc, lo=-1)).result == E("clamp_min", ACC, const(-1))
    assert ep.trace(lambda acc: ep.clamp(acc, hi=6)).result == E("clamp_max", ACC, const(6))
    assert ep.trace(lambda acc: ep.clamp(acc, lo=-1)).text == "clamp(acc, lo=-1)"
    assert ep.trace(lambda acc: ep.clamp(acc, hi=6.5)).text == "clamp(acc, hi=6.5)"
    assert ep.trace(lambda acc: ep.clamp(acc, 0, 6)).text == "clamp(acc, 0, 6)"


def test_max_min_with_values_and_constants() -> None:
    def f(acc, floor: ep.Row):
        return ep.min(ep.max(acc, floor), 2.5)

    assert ep.trace(f).result == E("min", E("max", ACC, opnd("floor")), const(2.5))
    assert ep.trace(lambda acc: ep.max(0, acc)).result == E("max", const(0), ACC)
    assert ep.trace(f).text == "min(max(acc, floor), 2.5)"


@pytest.mark.parametrize("fn, expected", [
    (lambda acc: acc + 1, E("add", ACC, const(1))),
    (lambda acc: 1 + acc, E("add", const(1), ACC)),
    (lambda acc: acc - 2, E("sub", ACC, const(2))),
    (lambda acc: 2 - acc, E("sub", const(2), ACC)),
    (lambda acc: acc * 3, E("mul", ACC, const(3))),
    (lambda acc: 3.5 * acc, E("mul", const(3.5), ACC)),
    (lambda acc: acc / 4, E("div", ACC, const(4))),
    (lambda acc: 4 / acc, E("div", const(4), ACC)),
    (lambda acc: -acc, E("neg", ACC)),
    (lambda acc: +acc, ACC),
    (lambda acc: abs(acc), E("abs", ACC)),
    (lambda acc: acc ** 2, E("mul", ACC, ACC)),
    (lambda acc: acc * acc, E("mul", ACC, ACC)),
    (lambda acc: acc * -0.0 + acc, E("add", E("mul", ACC, const(0.0)), ACC)),  # -0.0 folds into 0.0
])
def test_operators_and_reflected_operators(fn, expected) -> None:
    assert ep.trace(fn).result == expected


def test_operators_between_values() -> None:
    def f(acc, r: ep.Row, c: ep.Col, m: ep.Matrix, s: ep.Scalar):
        return (acc - r) / c * m + s

    desc = ep.trace(f)
    assert desc.result == E("add", E("mul", E("div", E("sub", ACC, opnd("r")), opnd("c")), opnd("m")), opnd("s"))
    assert [o.kind for o in desc.operands] == ["row", "col", "matrix", "scalar"]
    assert desc.text == "(acc - r) / c * m + s"


def test_numpy_scalars_are_constants() -> None:
    np = pytest.importorskip("numpy")
    assert ep.trace(lambda acc: np.float32(0.5) * acc).result == E("mul", const(0.5), ACC)
    assert ep.trace(lambda acc: acc + np.int64(2)).result == E("add", ACC, const(2))


def test_shared_subexpression_is_one_node() -> None:
    def f(acc, bias: ep.Col):
        h = acc + bias
        return ep.sigmoid(h) * h

    def g(acc, bias: ep.Col):  # written out twice: structurally equal, the same node
        return ep.sigmoid(acc + bias) * (acc + bias)

    desc = ep.trace(f)
    h = E("add", ACC, opnd("bias"))
    assert desc.result == E("mul", E("sigmoid", h), h)
    assert desc.nodes() == (h, E("sigmoid", h), desc.result)
    assert ep.trace(g) == desc and ep.trace(g).nodes() == desc.nodes()


def test_aux_output() -> None:
    def f(acc, bias: ep.Col):
        pre = acc + bias
        return ep.gelu(pre), pre

    desc = ep.trace(f)
    pre = E("add", ACC, opnd("bias"))
    assert desc.result == E("gelu", pre) and desc.aux == pre
    assert desc.text == "D = gelu(acc + bias), aux = acc + bias"
    assert desc.nodes() == (pre, E("gelu", pre))
    assert desc.tag == "gelu_cbias_aux"
    assert desc != ep.trace(lambda acc: ep.gelu(acc))
    # (D, None) and a list are accepted too
    assert ep.trace(lambda acc: (ep.relu(acc), None)) == ep.trace(lambda acc: ep.relu(acc))
    assert ep.trace(lambda acc: [ep.relu(acc), acc]).aux == ACC


def test_aux_with_own_operand() -> None:
    def f(acc, bias: ep.Col, scale: ep.Scalar):
        return ep.relu(acc + bias), scale * acc

    desc = ep.trace(f)
    assert desc.aux == E("mul", opnd("scale"), ACC)
    assert [o.name for o in desc.operands] == ["bias", "scale"]


def test_lambda_and_any_accumulator_name() -> None:
    assert ep.trace(lambda x: ep.relu(x)) == ep.trace(lambda acc: ep.relu(acc))
    assert ep.trace(lambda acc: acc) == ep.IDENTITY


# Kinds with options as module-level aliases, the way to keep string options out of annotations.
FP32_MATRIX = ep.Matrix(dtype="fp32")
COL_MATRIX = ep.Matrix(order="col")
FP32_COL_MATRIX = ep.Matrix(dtype="fp32", order="col")


def test_quoted_annotations_in_this_file() -> None:
    def f(acc, bias: "ep.Col", C: "FP32_MATRIX"):
        return acc + bias + C

    desc = ep.trace(f)
    assert desc.operands == (Operand("bias", "col"), Operand("C", "matrix", DType.fp32, Order.row))


def _import_source(tmp_path: Path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_string_annotations_future_import(tmp_path) -> None:
    module = _import_source(tmp_path, "user_epilogues", """\
        from __future__ import annotations
        from generator import epilogue as ep
        from generator.epilogue import Row

        def fused(acc, bias: ep.Col, C: ep.Matrix(order="col"), alpha: ep.Scalar, r: Row(dtype="bf16")):
            return ep.silu(alpha * acc + bias) + C * r

        def broken(acc, bias: ep.Col, C: Missing):
            return acc + bias + C
        """)
    desc = ep.trace(module.fused)
    assert [(o.name, o.kind, o.dtype, o.order) for o in desc.operands] == [
        ("bias", "col", None, None), ("C", "matrix", None, Order.col), ("alpha", "scalar", DType.fp32, None),
        ("r", "row", DType.bf16, None)]
    with pytest.raises(EpilogueError) as info:
        ep.trace(module.broken)
    assert "epilogue broken() line 8 (user_epilogues.py): " in str(info.value)
    assert "'Missing'" in str(info.value) and "NameError" in str(info.value)


# -- operand kinds --------------------------------------------------------------------------------


def test_operand_kinds_bare_and_called() -> None:
    assert ep.Matrix() == ep.Matrix
    assert ep.Scalar() == ep.Scalar
    assert ep.Matrix(dtype="fp32", order="col").operand("C") == Operand("C", "matrix", DType.fp32, Order.col)
    assert ep.Row(dtype="bf16").operand("r") == Operand("r", "row", DType.bf16)
    assert ep.Col(dtype="torch.float16").operand("c").dtype is DType.fp16  # a torch dtype, by its str()
    assert ep.Col(dtype="float32").operand("c").dtype is DType.fp32
    assert ep.Scalar.operand("s").dtype is DType.fp32
    assert repr(ep.Matrix(dtype="bf16", order="col")) == "ep.Matrix(dtype='bf16', order='col')"
    assert repr(ep.Col) == "ep.Col"


@pytest.mark.parametrize("make, fragment", [
    (lambda: ep.Scalar(dtype="fp16"), "ep.Scalar takes no options"),
    (lambda: ep.Row(order="col"), "only ep.Matrix takes order"),
    (lambda: ep.Col(dtype="fp64"), "not a data type"),
    (lambda: ep.Matrix(dtype="int8"), "dtype of ep.Matrix='int8' is not supported here; supported: 'fp16', 'bf16', 'fp32'"),
    (lambda: ep.Matrix(order="diagonal"), "not a storage order"),
    (lambda: Operand("x", "tensor"), "not one of scalar, row, col, matrix"),
    (lambda: Operand("A", "row"), "reserved"),
    (lambda: Operand("bïas", "row"), "ASCII identifier"),
    (lambda: Operand("s", "scalar", DType.bf16), "fp32"),
])
def test_operand_kind_refusals(make, fragment) -> None:
    with pytest.raises(EpilogueError, match=re.escape(fragment)):
        make()


def test_matrix_operand_order_defaults_to_row() -> None:
    assert Operand("C", "matrix") == Operand("C", "matrix", None, Order.row)
    assert Operand("C", "matrix", "bf16", "col") == Operand("C", "matrix", DType.bf16, Order.col)


# -- knobs == functions ---------------------------------------------------------------------------


def test_spec_examples() -> None:
    def same(acc, bias: ep.Col):
        return ep.gelu_tanh(acc + bias)

    knobs = ep.from_knobs(activation="gelu_tanh", bias="col")
    assert ep.trace(same) == knobs and hash(ep.trace(same)) == hash(knobs)

    def f(acc, bias: ep.Col, C: ep.Matrix, alpha: ep.Scalar, beta: ep.Scalar):
        return ep.silu(alpha * acc + beta * C + bias)

    knobs = ep.from_knobs(activation="silu", bias="col", alpha="scalar", beta="scalar")
    assert ep.trace(f) == knobs
    assert ep.trace(f).name_suffix == knobs.name_suffix and ep.trace(f).digest == knobs.digest


def _natural_function(activation, bias, alpha, beta):
    """The function a user would write for these knobs, as source text, traced."""
    params, x = ["acc"], "acc"
    if bias:
        params.append(f"bias: ep.{'Row' if bias == 'row' else 'Col'}")
    if beta is not None:
        params.append("C: ep.Matrix")
    if alpha is not None and alpha != 1:
        x = f"{'alpha' if alpha == 'scalar' else repr(alpha)} * acc"
    if beta is not None:
        x += " + " + ("C" if beta == 1 else f"{'beta' if beta == 'scalar' else repr(beta)} * C")
    if bias:
        x += " + bias"
    params += [f"{name}: ep.Scalar" for name, k in (("alpha", alpha), ("beta", beta)) if k == "scalar"]
    body = f"ep.{activation}({x})" if activation not in (None, "identity") else x
    namespace = {"ep": ep}
    exec(f"def natural({', '.join(params)}):\n    return {body}\n", namespace)  # noqa: S102
    return ep.trace(namespace["natural"])


@pytest.mark.parametrize("activation, bias, alpha, beta", list(itertools.product(
    [None, "identity", "relu", "gelu_tanh", "leaky_relu", "sigmoid"],
    [None, "row", "col"],
    [None, 1, 2.5, "scalar"],
    [None, 1, 0.5, "scalar"],
)))
def test_knobs_equal_the_natural_function(activation, bias, alpha, beta) -> None:
    knobs = ep.from_knobs(activation=activation, bias=bias, alpha=alpha, beta=beta)
    traced = _natural_function(activation, bias, alpha, beta)
    assert knobs == traced
    assert hash(knobs) == hash(traced)
    assert (knobs.canonical, knobs.digest, knobs.name_suffix) == (traced.canonical, traced.digest,
                                                                  traced.name_suffix)


def test_knob_dtypes_and_order_equal_annotation_options() -> None:
    # Options as enums inside the annotation: pyflakes reads string literals in annotations as names.
    def f(acc, bias: ep.Row(dtype=DType.bf16), C: ep.Matrix(dtype=DType.fp32, order=Order.col), beta: ep.Scalar):
        return ep.gelu(2 * acc + beta * C + bias)

    knobs = ep.from_knobs(activation="gelu_erf", bias="row", alpha=2, beta="scalar", c_dtype="float32",
                          c_order="col", bias_dtype="torch.bfloat16")
    assert ep.trace(f) == knobs and ep.trace(f).digest == knobs.digest


def test_knob_aliases_and_identity() -> None:
    assert ep.from_knobs(activation="swish") == ep.from_knobs(activation="silu")
    assert ep.from_knobs(activation="GELU_ERF") == ep.from_knobs(activation="gelu")
    for act in (None, "identity", "none"):
        assert ep.from_knobs(activation=act) is not None and ep.from_knobs(activation=act).is_identity
    assert {"relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", None, "identity", "none",
            "gelu_erf", "swish"} <= set(ep.ACTIVATIONS)
    assert ep.from_knobs(alpha=1, beta=None) == ep.IDENTITY
    assert ep.from_knobs(activation="leaky_relu") == ep.trace(lambda acc: ep.leaky_relu(acc))


ACTIVATION_FUNCTIONS = ("relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")


@pytest.mark.parametrize("name", ACTIVATION_FUNCTIONS)
def test_activation_function_is_its_name(name) -> None:
    """plan.activation = ep.relu (as CUTLASS's plan.activation = cutlass.epilogue.relu) is "relu" everywhere."""
    from generator import Gemm

    fn = getattr(ep, name)
    assert ep.from_knobs(activation=fn, bias="col") == ep.from_knobs(activation=name, bias="col")
    by_fn, by_name = Gemm("bf16", "tn", arch=90, activation=fn), Gemm("bf16", "tn", arch=90, activation=name)
    assert by_fn.config == by_name.config and by_fn.activation == name
    plan = Gemm("bf16", "tn", arch=80)
    plan.activation = fn
    assert plan.activation == name and plan.config == Gemm("bf16", "tn", arch=80, activation=name).config


def test_activation_reads_back_canonical() -> None:
    from generator import Gemm

    plan = Gemm("bf16", "tn", arch=90, activation="SWISH")
    assert plan.activation == "silu"
    plan.activation = "none"
    assert plan.activation is None and plan.epilogue.is_identity
    assert ep.from_knobs(activation=ep.leaky_relu) == ep.trace(lambda acc: ep.leaky_relu(acc, 0.01))


@pytest.mark.parametrize("fn", [ep.clamp, ep.max, lambda acc: ep.relu(acc), math.tanh],
                         ids=["ep.clamp", "ep.max", "lambda", "math.tanh"])
def test_activation_refuses_other_functions(fn) -> None:
    from generator import Gemm

    with pytest.raises(ValueError, match=r"ep\.relu, ep\.leaky_relu.*'gelu_erf', 'swish'.*plan\.epilogue = fn"):
        ep.from_knobs(activation=fn)
    plan = Gemm("bf16", "tn", arch=90, activation="gelu")
    with pytest.raises(ValueError, match="activation=.*epilogue="):
        plan.activation = fn
    assert plan.activation == "gelu"            # a refused value leaves the plan as it was
    with pytest.raises(ValueError, match="epilogue="):
        Gemm("bf16", "tn", arch=90, activation=fn)


@pytest.mark.parametrize("knobs, fragment", [
    (dict(activation="softmax"), "'relu'"),
    (dict(bias="matrix"), "'row', 'col'"),
    (dict(alpha="runtime"), "'scalar'"),
    (dict(beta=True), "'scalar'"),
    (dict(alpha=math.inf), "finite number"),
    (dict(alpha=0), "alpha=0"),
    (dict(beta=0), "beta=None"),
    (dict(c_dtype="fp32"), "only read when beta"),
    (dict(bias_dtype="fp32"), "without bias"),
    (dict(beta=1, c_dtype="fp64"), "c_dtype"),
    (dict(beta=1, c_order="diag"), "c_order"),
    (dict(bias="col", bias_dtype="int8"), "bias_dtype"),
])
def test_bad_knobs(knobs, fragment) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        ep.from_knobs(**knobs)


# -- identity, digests, names ---------------------------------------------------------------------


def _assorted() -> list[Epilogue]:
    def aux(acc, bias: ep.Col):
        return ep.relu(acc + bias), acc + bias

    def two(acc, bias: ep.Col):
        return ep.relu(acc + bias)

    def two_rev(acc, bias: ep.Col):
        return ep.relu(bias + acc)

    def row(acc, bias: ep.Row):
        return ep.relu(acc + bias)

    def named(acc, shift: ep.Col):
        return ep.relu(acc + shift)

    def bf16(acc, bias: ep.Col(dtype="bf16")):
        return ep.relu(acc + bias)

    def colc(acc, C: COL_MATRIX):
        return acc + C

    return [
        ep.IDENTITY, ep.from_knobs(activation="relu"), ep.from_knobs(activation="gelu"),
        ep.from_knobs(activation="gelu_tanh", bias="col"), ep.from_knobs(activation="gelu_tanh", bias="row"),
        ep.from_knobs(alpha=2), ep.from_knobs(alpha=2.5), ep.from_knobs(alpha="scalar"), ep.from_knobs(beta=1),
        ep.trace(aux), ep.trace(two), ep.trace(two_rev), ep.trace(row), ep.trace(named), ep.trace(bf16),
        ep.trace(colc), ep.trace(lambda acc: ep.leaky_relu(acc, 0.1)), ep.trace(lambda acc: ep.leaky_relu(acc)),
        ep.trace(lambda acc: ep.clamp(acc, lo=0)), ep.trace(lambda acc: ep.clamp(acc, hi=0)),
        ep.trace(lambda acc: ep.max(acc, 0)), ep.trace(lambda acc: acc - 1), ep.trace(lambda acc: 1 - acc),
        ep.from_knobs(bias="col").resolved(DType.bf16), ep.from_knobs(bias="col").resolved(DType.fp16),
    ]


def test_different_expressions_have_different_digests_and_names() -> None:
    descs = _assorted()
    assert len(set(descs)) == len(descs)
    assert len({d.digest for d in descs}) == len(descs)
    assert len({d.name_suffix for d in descs}) == len(descs)


def test_identity() -> None:
    assert ep.IDENTITY == Epilogue((), ACC) and ep.IDENTITY.is_identity
    assert ep.IDENTITY.name_suffix == "" and ep.IDENTITY.text == "acc" and ep.IDENTITY.nodes() == ()
    assert ep.from_knobs() is not ep.IDENTITY and ep.from_knobs() == ep.IDENTITY
    assert not ep.from_knobs(activation="relu").is_identity


def test_canonical_and_tag_formats() -> None:
    knobs = ep.from_knobs(activation="gelu_tanh", bias="col")
    assert knobs.canonical == "(epilogue (operands (bias col out -)) (D (gelu_tanh (add acc bias))) (aux none))"
    assert knobs.tag == "gelutanh_cbias"
    assert re.fullmatch(r"_ep_gelutanh_cbias_[0-9a-f]{8}", knobs.name_suffix)

    def fused(acc, bias: ep.Col, C: ep.Matrix, alpha: ep.Scalar, beta: ep.Scalar):
        return ep.silu(alpha * acc + bias) + beta * C

    desc = ep.trace(fused)
    assert desc.canonical == ("(epilogue (operands (bias col out -) (C matrix out row) (alpha scalar fp32 -) "
                              "(beta scalar fp32 -)) (D (add (silu (add (mul alpha acc) bias)) (mul beta C))) "
                              "(aux none))")
    assert desc.tag == "silu_cbias_mC_salpha_sbeta"
    assert desc.text == "silu(alpha * acc + bias) + beta * C"
    assert ep.trace(lambda acc: ep.leaky_relu(acc, 1e-5)).canonical.endswith("(D (leaky_relu acc 1e-05)) (aux none))")


def test_tag_charset_and_length() -> None:
    def long(acc, a_very_long_operand_name: ep.Col, another_quite_long_name: ep.Matrix, third_one: ep.Scalar):
        h = ep.tanh(ep.sigmoid(ep.gelu(acc + a_very_long_operand_name)))
        return ep.clamp(ep.abs(h) * third_one, 0, 1) + another_quite_long_name, h

    for desc in [*_assorted(), ep.trace(long), ep.trace(lambda acc: acc * 2)]:
        assert re.fullmatch(r"[A-Za-z0-9_]{1,40}", desc.tag), desc.tag
        if not desc.is_identity:
            assert re.fullmatch(r"_ep_[A-Za-z0-9_]+_[0-9a-f]{8}", desc.name_suffix), desc.name_suffix
    assert ep.trace(lambda acc: acc * 2).tag == "expr"


DIGEST_SCRIPT = """
from generator import epilogue as ep
def fused(acc, bias: ep.Col, C: ep.Matrix, alpha: ep.Scalar, beta: ep.Scalar):
    return ep.silu(alpha * acc + bias) + beta * C
for d in (ep.trace(fused), ep.from_knobs(activation="gelu_tanh", bias="col", beta=0.5).resolved("bf16")):
    print(d.digest, d.name_suffix, d.canonical)
"""


def test_digest_is_stable_across_processes() -> None:
    namespace: dict = {}
    outputs = []
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        run = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        outputs.append(run.stdout)
    import contextlib
    import io
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(DIGEST_SCRIPT, namespace)  # noqa: S102
    assert outputs[0] == outputs[1] == buffer.getvalue()


def test_hashable_and_picklable() -> None:
    descs = _assorted()
    table = {d: i for i, d in enumerate(descs)}
    for i, d in enumerate(descs):
        back = pickle.loads(pickle.dumps(d))
        assert back == d and hash(back) == hash(d) and table[back] == i and back.digest == d.digest


# -- resolved, describe, text, nodes, helpers -----------------------------------------------------


def test_resolved() -> None:
    def f(acc, bias: ep.Col, C: FP32_COL_MATRIX, s: ep.Scalar):
        return s * acc + C + bias

    desc = ep.trace(f)
    r = desc.resolved(DType.bf16)
    assert [o.dtype for o in r.operands] == [DType.bf16, DType.fp32, DType.fp32]
    assert r.operand("C").order is Order.col and r.result == desc.result
    assert desc.resolved("torch.float16").operand("bias").dtype is DType.fp16
    assert r.digest != desc.digest and r.resolved(DType.fp16) == r  # resolved once, stays
    assert ep.IDENTITY.resolved("fp32") == ep.IDENTITY
    with pytest.raises(ValueError):
        desc.resolved("fp64")


def test_describe() -> None:
    def f(acc, bias: ep.Col, r: ep.Row(dtype=DType.fp32), C: COL_MATRIX, alpha: ep.Scalar):
        h = alpha * acc + bias * r + C
        return ep.relu(h), h

    lines = ep.trace(f).resolved("bf16").describe()
    assert lines == [
        "D = relu(alpha * acc + bias * r + C)",
        "aux = alpha * acc + bias * r + C  (second output, M x N, dtype and order of D)",
        "bias: per-column vector (N,), bf16",
        "r: per-row vector (M,), fp32",
        "C: matrix (M, N), column-major, bf16",
        "alpha: runtime scalar (fp32)",
    ]
    assert ep.from_knobs(beta=1).describe()[1] == "C: matrix (M, N), row-major, output dtype"


@pytest.mark.parametrize("fn, text", [
    (lambda acc: acc + 1 + 2, "acc + 1 + 2"),
    (lambda acc: acc + (1 + acc), "acc + (1 + acc)"),
    (lambda acc: acc - (acc - 1), "acc - (acc - 1)"),
    (lambda acc: (acc + 1) * 2, "(acc + 1) * 2"),
    (lambda acc: acc * (2 * acc), "acc * (2 * acc)"),
    (lambda acc: acc / (acc * 2), "acc / (acc * 2)"),
    (lambda acc: acc * 2 / 3, "acc * 2 / 3"),
    (lambda acc: -(acc + 1), "-(acc + 1)"),
    (lambda acc: -acc * 2, "-acc * 2"),
    (lambda acc: acc * -2, "acc * -2"),
    (lambda acc: acc - -2.5, "acc - -2.5"),
    (lambda acc: -(-acc), "-(-acc)"),
    (lambda acc: (acc + 1) ** 2, "(acc + 1) * (acc + 1)"),
    (lambda acc: ep.tanh(acc * 0.5) * 0.5 + 0.5, "tanh(acc * 0.5) * 0.5 + 0.5"),
    (lambda acc: abs(acc - 1e-7), "abs(acc - 1e-07)"),
])
def test_text_minimal_parentheses(fn, text) -> None:
    assert ep.trace(fn).text == text


def test_text_evaluates_back_to_the_same_expression() -> None:
    """The text is a faithful formula: evaluated with the ep functions it rebuilds the same DAG."""
    for desc in _assorted():
        scope = {name: getattr(ep, name) for name in ep.__all__ if name.islower()}
        scope.update(acc=Value(ACC), **{o.name: Value(Expr("operand", name=o.name)) for o in desc.operands})
        if desc.aux is None:
            assert eval(desc.text, scope).expr == desc.result, desc.text  # noqa: S307
        else:
            d_text, aux_text = desc.text.removeprefix("D = ").split(", aux = ")
            assert eval(d_text, scope).expr == desc.result and eval(aux_text, scope).expr == desc.aux  # noqa: S307


def test_nodes_topological_and_distinct() -> None:
    def f(acc, bias: ep.Col, C: ep.Matrix):
        h = acc + bias
        g = ep.gelu(h)
        return g * h + g, ep.relu(h) + C

    desc = ep.trace(f)
    nodes = desc.nodes()
    assert len(nodes) == len(set(nodes)) == 6
    assert all(not n.is_leaf for n in nodes)
    position = {n: i for i, n in enumerate(nodes)}
    for n in nodes:
        assert all(a.is_leaf or position[a] < position[n] for a in n.args)
    assert nodes[:4] == (E("add", ACC, opnd("bias")), E("gelu", E("add", ACC, opnd("bias"))),
                         E("mul", nodes[1], nodes[0]), E("add", nodes[2], nodes[1]))


def test_operand_helpers() -> None:
    desc = ep.from_knobs(activation="relu", bias="row", alpha="scalar", beta="scalar")
    assert [o.name for o in desc.operands] == ["bias", "C", "alpha", "beta"]
    assert desc.operand("C") == Operand("C", "matrix")
    assert [o.name for o in desc.operands_of_kind("scalar")] == ["alpha", "beta"]
    assert desc.operands_of_kind("col") == ()
    with pytest.raises(KeyError, match="bias, C, alpha, beta"):
        desc.operand("D")
    with pytest.raises(ValueError):
        desc.operands_of_kind("vector")


def test_direct_construction_is_validated() -> None:
    with pytest.raises(EpilogueError, match="not used"):
        Epilogue((Operand("bias", "col"),), ACC)
    with pytest.raises(EpilogueError, match="undeclared"):
        Epilogue((), E("add", ACC, opnd("bias")))
    with pytest.raises(EpilogueError, match="accumulator"):
        Epilogue((Operand("bias", "col"),), opnd("bias"))
    with pytest.raises(EpilogueError, match="repeat"):
        Epilogue((Operand("b", "col"), Operand("b", "row")), E("add", ACC, opnd("b")))
    with pytest.raises(EpilogueError, match="same expression"):
        Epilogue((), E("relu", ACC), E("relu", ACC))
    with pytest.raises(EpilogueError, match="takes 2"):
        Expr("add", (ACC,))
    with pytest.raises(EpilogueError, match="unknown epilogue op"):
        Expr("exp", (ACC,))
    with pytest.raises(EpilogueError, match="slope must be a constant"):
        Expr("leaky_relu", (ACC, ACC))
    with pytest.raises(EpilogueError, match="not finite"):
        Expr("const", value=math.nan)


def test_module_does_not_import_torch() -> None:
    code = ("import sys\nfrom generator import epilogue as ep\n"
            "ep.trace(lambda acc: ep.relu(acc)); ep.from_knobs(bias='col').describe()\n"
            "assert 'torch' not in sys.modules\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


# -- refusals: each names the function, the line and the file ---------------------------------------


def test_refuse_var_args() -> None:
    def f(acc, *rest):
        return acc

    refused(f, f.__code__.co_firstlineno, "*rest is not supported")


def test_refuse_var_kwargs() -> None:
    def f(acc, **named):
        return acc

    refused(f, f.__code__.co_firstlineno, "**named is not supported")


def test_refuse_keyword_only() -> None:
    def f(acc, *, bias: ep.Col):
        return acc + bias

    refused(f, f.__code__.co_firstlineno, "keyword-only parameter 'bias'")


def test_refuse_default() -> None:
    def f(acc, bias: ep.Col = None):
        return acc + bias

    refused(f, f.__code__.co_firstlineno, "parameter 'bias' has a default value")


def test_refuse_missing_annotation() -> None:
    def f(acc, bias):
        return acc + bias

    refused(f, f.__code__.co_firstlineno, "parameter 'bias' has no annotation", "ep.Col")


def test_refuse_lambda_with_operand() -> None:
    fn = lambda acc, bias: acc + bias  # noqa: E731
    refused(fn, line_of(fn, "lambda acc, bias"), "parameter 'bias' has no annotation")


def test_refuse_unknown_annotation() -> None:
    def f(acc, bias: int):
        return acc + bias

    refused(f, f.__code__.co_firstlineno, "parameter 'bias' is annotated", "not an operand kind")


@pytest.mark.parametrize("name", ["A", "B", "out"])
def test_refuse_op_argument_names(name) -> None:
    namespace = {"ep": ep}
    exec(f"def f(acc, {name}: ep.Matrix):\n    return acc + {name}\n", namespace)  # noqa: S102
    with pytest.raises(EpilogueError, match=rf"epilogue f\(\) line 1 \(<string>\): parameter '{name}' clashes "
                                            rf"with the op's own argument {name}"):
        ep.trace(namespace["f"])


def test_refuse_reserved_operand_name() -> None:
    def f(x, acc: ep.Col):
        return x + acc

    refused(f, f.__code__.co_firstlineno, "'acc'", "reserved")


def test_refuse_annotated_accumulator() -> None:
    def f(C: ep.Matrix, acc):
        return acc + C

    refused(f, f.__code__.co_firstlineno, "is the accumulator")


def test_refuse_no_parameters() -> None:
    def f():
        return 1

    refused(f, f.__code__.co_firstlineno, "first parameter")


def test_refuse_unused_parameter() -> None:
    def fused(acc, bias: ep.Col, C: ep.Matrix):
        return ep.relu(acc + bias)

    refused(fused, fused.__code__.co_firstlineno,
            "parameter 'C' is not used: remove it, or the op would require it for nothing")


def test_refuse_result_without_accumulator() -> None:
    def f(acc, bias: ep.Col):
        return ep.relu(bias)  # return line

    refused(f, line_of(f, "# return line"), "does not use the accumulator 'acc'")


def test_refuse_aux_without_accumulator() -> None:
    def f(acc, bias: ep.Col):
        return acc + bias, bias * 2  # return line

    refused(f, line_of(f, "# return line"), "aux (the second output) does not use the accumulator")


def test_refuse_aux_equal_to_d() -> None:
    def f(acc, bias: ep.Col):
        h = acc + bias
        return h, h  # return line

    refused(f, line_of(f, "# return line"), "aux is the same expression as D")


@pytest.mark.parametrize("body, fragment", [
    ("return None", "returned NoneType for D"),
    ("return 1.0", "returned float for D"),
    ("return acc, acc, acc", "returned 3 values"),
    ("return acc, 1", "returned int for aux"),
])
def test_refuse_bad_return(body, fragment) -> None:
    namespace = {"ep": ep}
    exec(f"def g(acc):\n    x = 1\n    {body}\n", namespace)  # noqa: S102
    with pytest.raises(EpilogueError, match=re.escape(f"epilogue g() line 3 (<string>): {fragment}")):
        ep.trace(namespace["g"])


def test_refuse_missing_return() -> None:
    def f(acc):
        ep.relu(acc)  # last line

    refused(f, line_of(f, "# last line"), "returned NoneType for D")


def test_refuse_bool_constant() -> None:
    def f(acc):
        h = acc * 2
        return h + True  # bad

    refused(f, line_of(f, "# bad"), "bool constants are not supported")


def test_refuse_bool_constant_in_function() -> None:
    def f(acc):
        return ep.max(acc, False)  # bad

    refused(f, line_of(f, "# bad"), "bool constants are not supported")


def test_refuse_comparison_in_if() -> None:
    def f(acc):
        h = acc + 1
        if h > 0:  # bad
            return h
        return -h

    refused(f, line_of(f, "# bad"), "comparisons", "ep.max", "ep.min", "ep.clamp", "ep.relu")


def test_refuse_truth_test() -> None:
    def f(acc):
        return acc and acc * 2  # bad

    refused(f, line_of(f, "# bad"), "truth value", "ep.max")


def test_refuse_equality() -> None:
    def f(acc, bias: ep.Col):
        return acc if acc == bias else bias  # bad

    refused(f, line_of(f, "# bad"), "comparisons")


@pytest.mark.parametrize("builtin", [max, min])
def test_refuse_builtin_max_min(builtin) -> None:
    def f(acc):
        return builtin(acc, 0)  # bad

    refused(f, line_of(f, "# bad"), "builtins max()/min()", "use ep.max, ep.min")


def test_refuse_math_function() -> None:
    def f(acc):
        h = acc + 1
        return math.exp(h)  # bad

    refused(f, line_of(f, "# bad"), "math.exp/torch.exp", "cannot take a traced value",
            "the supported functions are ep.relu")


def test_refuse_float_conversion() -> None:
    def f(acc):
        return acc * float(acc)  # bad

    refused(f, line_of(f, "# bad"), "cannot take a traced value")


def test_refuse_torch_function() -> None:
    torch = pytest.importorskip("torch")

    def f(acc):
        return torch.exp(acc)  # bad

    def g(acc):
        return torch.nn.functional.relu(acc)  # bad

    refused(f, line_of(f, "# bad"), "torch.exp cannot take a traced value", "ep.relu")
    refused(g, line_of(g, "# bad"), "torch.nn.functional.relu cannot take a traced value")


def test_refuse_numpy_function() -> None:
    np = pytest.importorskip("numpy")

    def f(acc):
        return np.exp(acc)  # bad

    refused(f, line_of(f, "# bad"), "cannot take a traced value", "ep.relu")


def test_refuse_tensor_method() -> None:
    def f(acc):
        return acc.exp()  # bad

    refused(f, line_of(f, "# bad"), "no attribute 'exp'", "ep.relu")


@pytest.mark.parametrize("expr, fragment", [
    ("acc // 2", "unsupported operand type(s) for //"),
    ("acc % 2", "unsupported operand type(s) for %"),
    ("acc @ acc", "unsupported operand type(s) for @"),
    ("acc + 'x'", "unsupported operand type(s) for +"),
    ("acc ** 3", "only x ** 2"),
    ("acc ** acc", "only x ** 2"),
    ("2 ** acc", "cannot be an exponent"),
    ("acc / 0", "division by the constant 0"),
    ("acc * float('inf')", "not finite"),
    ("acc + 10 ** 400", "not finite"),
    ("acc + 1j", "unsupported operand"),
    ("ep.clamp(acc)", "needs lo, hi or both"),
    ("ep.clamp(acc, 6, 0)", "lo is above hi"),
    ("ep.leaky_relu(acc, acc)", "slope must be a number"),
    ("ep.relu('acc')", "takes a traced value or a number, not str"),
    ("ep.relu(acc)[0]", "not subscriptable"),
])
def test_refuse_unsupported_expressions(expr, fragment) -> None:
    namespace = {"ep": ep}
    exec(f"def g(acc):\n    h = acc\n    return {expr}\n", namespace)  # noqa: S102
    with pytest.raises(EpilogueError) as info:
        ep.trace(namespace["g"])
    message = str(info.value)
    assert message.startswith("epilogue g() line 3 (<string>): ") and fragment in message, message


def test_refuse_failure_in_helper_points_at_the_call() -> None:
    def helper(x):
        return x > 0

    def f(acc):
        y = acc * 2
        return helper(y)  # bad

    refused(f, line_of(f, "# bad"), "comparisons")


def test_refuse_other_exceptions_keep_the_cause() -> None:
    def f(acc):
        raise RuntimeError("boom")  # bad

    with pytest.raises(EpilogueError) as info:
        ep.trace(f)
    assert f"epilogue f() line {line_of(f, '# bad')} ({FILE}): raised RuntimeError: boom" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_refuse_too_large() -> None:
    def f(acc):
        for _ in range(10):
            acc = acc * acc
        return acc  # return line

    refused(f, line_of(f, "# return line"), "too large")


def test_refuse_non_callable() -> None:
    with pytest.raises(EpilogueError, match="needs a function"):
        ep.trace("acc + 1")


# -- JSON (an emitted package's plans.json records a function epilogue so) ------------------------------

def fused(acc, bias: ep.Col, C: ep.Matrix, alpha: ep.Scalar, beta: ep.Scalar):
    return ep.silu(alpha * acc + bias) + beta * C


FP32_ROW = ep.Row(dtype="fp32")
FP16_COL_MAJOR = ep.Matrix(dtype="fp16", order="col")


def _every_op(acc, s: ep.Scalar, r: FP32_ROW, c: ep.Col, m: FP16_COL_MAJOR):
    z = s * acc + r - c / 3.0
    w = ep.clamp(ep.leaky_relu(-z, 0.2), -1.5, m) + ep.clamp(z, lo=0.0) * ep.clamp(z, hi=1e-30)
    y = ep.max(ep.gelu(w), ep.min(ep.gelu_tanh(z), ep.silu(m))) + ep.abs(ep.sigmoid(z)) - ep.tanh(ep.relu(w))
    return y, z * z


def test_json_round_trip() -> None:
    import json

    from generator.spec.epilogue import epilogue_from_json, epilogue_to_json

    for desc in [*_assorted(), ep.trace(fused), ep.trace(_every_op), ep.trace(_every_op).resolved(DType.bf16)]:
        data = epilogue_to_json(desc)
        text = json.dumps(data, sort_keys=True)
        assert json.dumps(epilogue_to_json(desc), sort_keys=True) == text          # deterministic
        again = epilogue_from_json(json.loads(text))
        assert again == desc and again.canonical == desc.canonical and again.digest == desc.digest
        assert epilogue_from_json(text) == desc                                    # the JSON text works too
    # a node shared by D and aux is listed once
    data = epilogue_to_json(ep.trace(_every_op))
    assert len(data["nodes"]) == len({json.dumps(n, sort_keys=True) for n in data["nodes"]})
    assert data["nodes"][data["D"]]["op"] == "sub" and data["aux"] is not None


@pytest.mark.parametrize("change, fragment", [
    (lambda d: d.pop("nodes"), "has no nodes"),
    (lambda d: d.update(extra=1), "unknown key(s) 'extra'"),
    (lambda d: d.update(D=99), "D is 99, not the index of an earlier node"),
    (lambda d: d.update(D=True), "D is True"),
    (lambda d: d["nodes"][2].update(args=[2, 0]), "an argument of node 2 is 2"),
    (lambda d: d["nodes"][2].update(op="pow"), "node 2 has op 'pow'"),
    (lambda d: d["nodes"][2].update(args=[0]), "op 'mul' takes 2 expression argument(s)"),
    (lambda d: d["nodes"].append({"op": "const", "value": "1"}), "value '1' is not a number"),
    (lambda d: d["nodes"][0].update(name="gamma"), "reads undeclared operand(s) gamma"),
    (lambda d: d["operands"][0].update(kind="vector"), "operand kind 'vector'"),
    (lambda d: d["operands"][1].update(order="diagonal"), "order"),
    (lambda d: d["operands"].pop(), "reads undeclared operand(s) beta"),
    (lambda d: d.update(operands={}), "'operands' must be a list"),
])
def test_json_refusals_say_what_is_wrong(change, fragment) -> None:
    from generator.spec.epilogue import epilogue_from_json, epilogue_to_json

    data = epilogue_to_json(ep.trace(fused))
    change(data)
    with pytest.raises(EpilogueError) as info:
        epilogue_from_json(data)
    assert fragment in str(info.value)
    with pytest.raises(EpilogueError, match="not valid JSON"):
        epilogue_from_json("{")


# -- what the backward needs ----------------------------------------------------------------------

def _bias(acc, bias: ep.Col):
    return acc + bias


def _axpby(acc, C: ep.Matrix, alpha: ep.Scalar, beta: ep.Scalar):
    return (alpha * acc + beta * C) / 2.0 - acc


def _scaled(acc, scale: ep.Row):
    return acc * scale                      # d(scale) reads acc


def _gelu(acc, bias: ep.Col):
    return ep.gelu(acc + bias)


def _relu_of_bias(acc, bias: ep.Col):
    return acc + ep.relu(bias)              # the kink is in an operand only


def _clamped(acc):
    return ep.clamp(acc, -1.0, 1.0)


@pytest.mark.parametrize("fn, reads_acc, smooth", [
    (_bias, False, True), (_axpby, False, True), (_scaled, True, True), (_gelu, True, True),
    (_relu_of_bias, False, True), (_clamped, True, False),
])
def test_what_the_backward_reads(fn, reads_acc, smooth) -> None:
    e = ep.trace(fn)
    assert e.backward_reads_acc == reads_acc
    assert e.smooth_in_acc == smooth


def test_saving_config_stores_acc_for_smooth_epilogues_that_read_it() -> None:
    from generator import Gemm
    from generator.planner.backward import saving_config

    cfg = Gemm("bf16", "tn", arch=90, activation="gelu_tanh", bias="col").config
    saving = saving_config(cfg)
    assert saving.epilogue.aux == ACC and saving.epilogue.result == cfg.epilogue.result
    assert saving.tile == cfg.tile and saving.name != cfg.name
    for knobs in ({"activation": "relu", "bias": "col"}, {"bias": "col"}, {"alpha": 2.0, "beta": 0.5}, {}):
        assert saving_config(Gemm("bf16", "tn", arch=90, **knobs).config) is None


# -- fp8 scales: scalar tensors, per-block scales, with_scales ----------------------------------------

from generator.spec.epilogue import (  # noqa: E402
    KINDS, MAINLOOP_KINDS, SCALE_BLOCK, SCALE_MODES, SHAPES, OperandKind, with_scales,
)

SCALED_BASES = {
    "identity": ep.IDENTITY,
    "gelu_bias": ep.from_knobs(activation="gelu", bias="col"),
    "alpha_c": ep.from_knobs(alpha="scalar", beta=0.5),
}


def _scaled_acc() -> Expr:
    return E("mul", E("mul", ACC, opnd("scale_a")), opnd("scale_b"))


def test_scalar_tensor_is_an_annotation_used_like_a_scalar() -> None:
    assert ep.ScalarTensor.operand("s") == Operand("s", "scalar_tensor", DType.fp32)
    assert ep.ScalarTensor() == ep.ScalarTensor and repr(ep.ScalarTensor) == "ep.ScalarTensor"
    assert "ScalarTensor" in ep.__all__

    def f(acc, s: ep.ScalarTensor, bias: ep.Col):
        return ep.relu(s * acc + bias) / s

    desc = ep.trace(f)
    assert desc.operands[0] == Operand("s", "scalar_tensor", DType.fp32) and desc.operands[0].shape == "(1,)"
    assert desc.text == "relu(s * acc + bias) / s"
    assert desc.describe()[1] == "s: one-element tensor (1,), fp32, read on the device"
    assert desc.resolved("bf16").operand("s").dtype is DType.fp32 and desc.tag == "relu_ts_cbias"
    assert desc.operands_of_kind("scalar_tensor") == (desc.operands[0],)


@pytest.mark.parametrize("make, fragment", [
    (lambda: ep.ScalarTensor(dtype="bf16"), "ep.ScalarTensor takes no options: it is always fp32"),
    (lambda: Operand("s", "scalar_tensor", DType.fp16), "scalar_tensor operand 's' is fp32"),
    (lambda: Operand("s", "row_blocks", DType.bf16), "row_blocks operand 's' is fp32"),
    (lambda: Operand("s", "col_blocks", order="row"), "only a matrix has a storage order"),
    (lambda: OperandKind("row_blocks"), "operand annotation kind 'row_blocks' is not one of"),
])
def test_new_kinds_refusals(make, fragment) -> None:
    with pytest.raises(EpilogueError, match=re.escape(fragment)):
        make()


def test_new_kinds_shapes_dtypes_and_descriptions() -> None:
    assert SHAPES["row_blocks"] == "(M, ceil(K/128))" and SHAPES["col_blocks"] == "(ceil(N/128), ceil(K/128))"
    assert set(SHAPES) == set(KINDS)
    for kind in ("scalar_tensor", *MAINLOOP_KINDS):
        op = Operand("s", kind)
        assert op.dtype is DType.fp32 and op.order is None and op.shape == SHAPES[kind]
    assert Operand("s", "row_blocks").describe() == (
        "s: per-block scales of A (M, ceil(K/128)), fp32, row-major (main loop)")
    assert Operand("s", "col_blocks").describe() == (
        "s: per-block scales of B (ceil(N/128), ceil(K/128)), fp32, row-major (main loop)")


def test_scale_block_is_the_kernels_constant() -> None:
    header = (ROOT / "templates" / "common" / "gemm_args.h").read_text()
    assert re.search(r"#define GEMMGEN_SCALE_BLOCK_K (\d+)", header).group(1) == str(SCALE_BLOCK) == "128"


def test_with_scales_none_is_the_epilogue_itself() -> None:
    for base in SCALED_BASES.values():
        assert with_scales(base, "none") is base and base.scale_mode == "none"


@pytest.mark.parametrize("mode, kinds", [("tensor", ("scalar_tensor", "scalar_tensor")), ("row", ("row", "col"))])
@pytest.mark.parametrize("base", list(SCALED_BASES))
def test_with_scales_in_the_epilogue(mode, kinds, base) -> None:
    plain = SCALED_BASES[base]
    scaled = with_scales(plain, mode)
    assert [(o.name, o.kind, o.dtype) for o in scaled.operands[:2]] == [
        ("scale_a", kinds[0], DType.fp32), ("scale_b", kinds[1], DType.fp32)]
    assert scaled.operands[2:] == plain.operands      # the op takes A, B, scale_a, scale_b, then the user's
    # every acc became acc * scale_a * scale_b, one node of the DAG
    assert not any(n == ACC for n in scaled.nodes())
    assert sum(n == _scaled_acc() for n in scaled.nodes()) == 1
    assert scaled.result == _substitute_acc(plain.result)
    assert scaled.scale_mode == mode


def _substitute_acc(root: Expr) -> Expr:
    if root == ACC:
        return _scaled_acc()
    return Expr(root.op, tuple(_substitute_acc(a) for a in root.args), root.value, root.name)


def test_with_scales_tensor_text_and_aux() -> None:
    def f(acc, bias: ep.Col):
        h = acc + bias
        return ep.gelu(h), h

    scaled = with_scales(ep.trace(f), "tensor")
    assert scaled.text == "D = gelu(acc * scale_a * scale_b + bias), aux = acc * scale_a * scale_b + bias"
    assert scaled.aux == E("add", _scaled_acc(), opnd("bias"))
    assert with_scales(ep.IDENTITY, "tensor").text == "acc * scale_a * scale_b"


@pytest.mark.parametrize("base", list(SCALED_BASES))
def test_with_scales_block_leaves_the_expression(base) -> None:
    plain = SCALED_BASES[base]
    scaled = with_scales(plain, "block")
    assert [(o.name, o.kind) for o in scaled.operands[:2]] == [("scale_a", "row_blocks"), ("scale_b", "col_blocks")]
    assert scaled.operands[2:] == plain.operands
    assert (scaled.result, scaled.aux, scaled.text) == (plain.result, plain.aux, plain.text)
    assert scaled.scale_mode == "block" and not scaled.is_identity


def test_scaled_equals_the_same_function_and_hashes_alike() -> None:
    def by_hand(acc, scale_a: ep.ScalarTensor, scale_b: ep.ScalarTensor, bias: ep.Col):
        return ep.gelu(acc * scale_a * scale_b + bias)

    scaled = with_scales(SCALED_BASES["gelu_bias"], "tensor")
    assert ep.trace(by_hand) == scaled and hash(ep.trace(by_hand)) == hash(scaled)
    assert ep.trace(by_hand).scale_mode == "tensor"
    for mode in SCALE_MODES[1:]:
        again = with_scales(ep.from_knobs(activation="gelu", bias="col"), mode)
        assert again == with_scales(SCALED_BASES["gelu_bias"], mode) and hash(again) == hash(
            with_scales(SCALED_BASES["gelu_bias"], mode))
        assert pickle.loads(pickle.dumps(again)) == again
    descs = [with_scales(b, m) for b in SCALED_BASES.values() for m in SCALE_MODES]
    assert len(set(descs)) == len({d.digest for d in descs}) == len(descs)


def test_scale_mode_is_recognised_only_where_with_scales_made_it() -> None:
    def other_order(acc, scale_a: ep.ScalarTensor, scale_b: ep.ScalarTensor):
        return scale_a * acc * scale_b           # another expression: not with_scales' composition

    def reads_a_scale_again(acc, scale_a: ep.ScalarTensor, scale_b: ep.ScalarTensor):
        return acc * scale_a * scale_b + scale_a

    def swapped(acc, scale_b: ep.ScalarTensor, scale_a: ep.ScalarTensor):
        return acc * scale_a * scale_b

    def row_scales_of_other_dtype(acc, scale_a: ep.Row(dtype="bf16"), scale_b: ep.Col(dtype="fp32")):
        return acc * scale_a * scale_b

    for fn in (other_order, reads_a_scale_again, swapped, row_scales_of_other_dtype):
        desc = ep.trace(fn)
        assert desc.scale_mode == "none" and not desc.tag.startswith("scale_"), fn.__name__


def test_scaled_tags_and_names() -> None:
    identity = with_scales(ep.IDENTITY, "tensor")
    assert identity.canonical == ("(epilogue (operands (scale_a scalar_tensor fp32 -) (scale_b scalar_tensor fp32 -)) "
                                  "(D (mul (mul acc scale_a) scale_b)) (aux none))")
    assert identity.tag == "scale_tensor"
    assert re.fullmatch(r"_ep_scale_tensor_[0-9a-f]{8}", identity.name_suffix)
    assert with_scales(ep.IDENTITY, "row").tag == "scale_row"
    assert with_scales(ep.IDENTITY, "block").tag == "scale_block"
    assert with_scales(SCALED_BASES["gelu_bias"], "row").tag == "scale_row_gelu_cbias"
    assert with_scales(SCALED_BASES["alpha_c"], "block").tag == "scale_block_mC_salpha"
    for desc in (with_scales(b, m) for b in SCALED_BASES.values() for m in SCALE_MODES):
        assert re.fullmatch(r"[A-Za-z0-9_]{1,40}", desc.tag), desc.tag


def test_scaled_identity_name_is_stable_across_processes() -> None:
    code = ("from generator.spec.epilogue import IDENTITY, with_scales\n"
            "print(with_scales(IDENTITY, 'tensor').name_suffix, with_scales(IDENTITY, 'block').name_suffix)\n")
    names = set()
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, run.stderr
        names.add(run.stdout)
    assert names == {f"{with_scales(ep.IDENTITY, 'tensor').name_suffix} "
                     f"{with_scales(ep.IDENTITY, 'block').name_suffix}\n"}


def test_scaled_resolved_and_json() -> None:
    from generator.spec.epilogue import epilogue_from_json, epilogue_to_json

    for mode in SCALE_MODES:
        scaled = with_scales(SCALED_BASES["gelu_bias"], mode).resolved("bf16")
        assert scaled == with_scales(SCALED_BASES["gelu_bias"].resolved("bf16"), mode)
        assert all(o.dtype is DType.fp32 for o in scaled.operands if o.name.startswith("scale_"))
        assert epilogue_from_json(epilogue_to_json(scaled)) == scaled and scaled.scale_mode == mode


@pytest.mark.parametrize("call, fragment", [
    (lambda: with_scales(ep.IDENTITY, "channel"),
     "scale mode 'channel' is not one of 'none', 'tensor', 'row', 'block'"),
    (lambda: with_scales(ep.trace(_uses_scale_a), "row"),
     "the epilogue has an operand named 'scale_a', which the scales of A and B take (scale_a, scale_b): rename"),
    (lambda: with_scales(with_scales(ep.IDENTITY, "tensor"), "tensor"),
     "the epilogue is already scaled (scale mode 'tensor'): apply with_scales once"),
    (lambda: with_scales(with_scales(ep.IDENTITY, "block"), "row"), "already scaled (scale mode 'block')"),
])
def test_with_scales_refusals(call, fragment) -> None:
    with pytest.raises(EpilogueError, match=re.escape(fragment)):
        call()


def _uses_scale_a(acc, scale_a: ep.Row):
    return acc + scale_a


def test_block_scales_are_the_main_loops_not_the_expressions() -> None:
    a, b = Operand("scale_a", "row_blocks"), Operand("scale_b", "col_blocks")
    assert Epilogue((a, b), ACC).scale_mode == "block"      # not "used": the main loop reads them
    with pytest.raises(EpilogueError, match=re.escape(
            "operand 'scale_a' holds per-block scales (row_blocks), which the kernel's main loop applies to each K "
            "block of acc; the expression cannot read them: remove scale_a from the expression")):
        Epilogue((a, b), E("mul", ACC, opnd("scale_a")))
    with pytest.raises(EpilogueError, match=r"per-block scales come as one pair.*1 and 0: build it with "
                                            r"with_scales\(epilogue, 'block'\)"):
        Epilogue((a,), ACC)
    with pytest.raises(EpilogueError, match="this epilogue has 1 and 2"):
        Epilogue((a, b, Operand("other", "col_blocks")), ACC)


def test_a_linear_layers_epilogue_is_recognised_and_nothing_else():
    from generator.spec.epilogue import BiasActivation
    assert ep.from_knobs(bias="col", activation="gelu").bias_activation == BiasActivation("gelu", "bias")
    assert ep.from_knobs(bias="col").bias_activation == BiasActivation(None, "bias")
    assert ep.from_knobs(activation="silu").bias_activation == BiasActivation("silu", None)
    def swapped(acc, b: ep.Col):
        return ep.relu(b + acc)
    assert ep.trace(swapped).bias_activation == BiasActivation("relu", "b")
    for other in (ep.from_knobs(), ep.from_knobs(bias="row", activation="gelu"),
                  ep.from_knobs(bias="col", activation="sigmoid"), ep.from_knobs(bias="col", alpha="scalar")):
        assert other.bias_activation is None, other.text
