"""generator.render.epilogue_python: the Python source of an epilogue (an emitted package's autograd formula
differentiates it). Executed here on float64 CPU tensors, it must give what ``generator.runtime.evaluate`` gives
(the JIT ops' formula and the GPU tests' reference), bit for bit, and so must its gradients; every operation,
every operand kind, a second output, numbers as arguments, and operand names that would shadow the function's
own names."""
from __future__ import annotations

import pytest

from generator import epilogue as ep
from generator.render.epilogue_python import python_function
from generator.spec.epilogue import Epilogue, Expr, Operand, with_scales

torch = pytest.importorskip("torch")
F = pytest.importorskip("torch.nn.functional")

from generator.runtime.evaluate import evaluate, operand_values  # noqa: E402

M, N = 7, 5   # M != N: a row vector cannot pass for a column vector
COL_MATRIX = ep.Matrix(order="col")
FP32_ROW = ep.Row(dtype="fp32")


def fused(acc, bias: ep.Col, C: ep.Matrix, alpha: ep.Scalar, beta: ep.Scalar):
    return ep.silu(alpha * acc + bias) + beta * C


def gelu_aux(acc, bias: ep.Col):
    h = acc + bias
    return ep.gelu(h), h


def row_clamp(acc, scale: FP32_ROW, lo: ep.Scalar):
    return ep.clamp(scale * acc, lo, 3.0) - ep.leaky_relu(acc, 0.2)


def one_sided(acc, floor: ep.Row, C: COL_MATRIX):
    return ep.clamp(acc / C, lo=floor) + ep.clamp(acc, hi=0.5) * ep.max(acc, floor) - ep.min(0.25, acc)


def functions(acc, s: ep.Scalar, t: ep.Scalar):
    # -x, abs, tanh, sigmoid, gelu_tanh, relu; numbers on both sides; a node of scalars alone (s * t)
    return ep.tanh(-acc) + abs(acc - 1.5) * ep.sigmoid(acc) + ep.gelu_tanh(2.0 / (acc * acc + 1.0)) + \
        ep.relu(acc) * (s * t) - ep.abs(s)


def activations(acc, bias: ep.Col):
    h = 0.5 * acc + bias
    return ep.leaky_relu(h), ep.silu(h) + ep.relu(-h)


def _keyword_names() -> Epilogue:
    """Operands named like the function's own names (torch, F, float) and a keyword: the spec allows them."""
    names = ("torch", "F", "float", "lambda")
    operands = (Operand("torch", "col"), Operand("F", "scalar"), Operand("float", "row"), Operand("lambda", "matrix"))
    acc = Expr("acc")
    total = acc
    for name in names:
        total = Expr("add", (total, Expr("mul", (acc, Expr("operand", name=name)))))
    return Epilogue(operands, total)


EPILOGUES = {fn.__name__: ep.trace(fn).resolved("fp32")
             for fn in (fused, gelu_aux, row_clamp, one_sided, functions, activations)}
EPILOGUES["keyword_names"] = _keyword_names().resolved("fp32")
EPILOGUES["relu_knob"] = ep.from_knobs(activation="relu", bias="row", alpha="scalar", beta="scalar").resolved("bf16")
# fp8 scales: one-element tensors in the expression, fp32 vectors, and per-block scales it never reads
EPILOGUES["scaled_tensor"] = with_scales(ep.trace(fused), "tensor").resolved("fp32")
EPILOGUES["scaled_row"] = with_scales(ep.trace(gelu_aux), "row").resolved("fp32")
EPILOGUES["scaled_block"] = with_scales(ep.trace(gelu_aux), "block").resolved("fp32")


def test_every_operation_is_covered():
    used = {node.op for e in EPILOGUES.values() for node in e.nodes()}
    from generator.spec.epilogue import OPS

    assert used == set(OPS) - {"acc", "operand", "const"}, set(OPS) - used


def load(source: str, fn_name: str, **modules):
    """The rendered function, defined where only the given module names (and builtins) exist."""
    namespace = dict(modules)
    exec(compile(source, f"<{fn_name}>", "exec"), namespace)
    return namespace[fn_name]


def random_operands(e: Epilogue) -> list:
    values = []
    for o in e.operands:
        if o.kind == "scalar":
            values.append(float(torch.empty(()).uniform_(0.5, 2.0)))
        elif o.kind == "scalar_tensor":   # shape (1,) or (): both are taken
            values.append(torch.empty((1,) if o.name == "scale_a" else (), dtype=torch.float64).uniform_(0.5, 2.0))
        elif o.kind in ("row_blocks", "col_blocks"):
            values.append(torch.empty(M if o.kind == "row_blocks" else 1, 1, dtype=torch.float64).uniform_(0.5, 2.0))
        elif o.kind in ("row", "col"):
            values.append(torch.randn(M if o.kind == "row" else N, dtype=torch.float64))
        elif o.order.value == "row":
            values.append(torch.randn(M, N, dtype=torch.float64) + 3.0)   # away from 0: a divisor in one_sided
        else:
            values.append((torch.randn(N, M, dtype=torch.float64) + 3.0).t())
    return values


def outputs_and_grads(run, e: Epilogue, acc, values):
    """(D, aux) of ``run(acc, values)`` and the gradients of acc and the tensor operands for fixed upstream
    gradients of D and aux."""
    acc = acc.clone().requires_grad_()
    values = [v.clone().requires_grad_() if isinstance(v, torch.Tensor) else v for v in values]
    d, aux = run(acc, values)
    outs = [t for t in (d, aux) if t is not None]
    gen = torch.Generator().manual_seed(1)
    upstream = [torch.randn(M, N, dtype=torch.float64, generator=gen) for _ in outs]
    wanted = [acc, *(v for v in values if isinstance(v, torch.Tensor))]
    grads = torch.autograd.grad(outs, wanted, upstream, allow_unused=True)
    return [d, aux], list(grads)


@pytest.mark.parametrize("name", EPILOGUES)
def test_the_function_computes_what_evaluate_computes(name):
    e = EPILOGUES[name]
    source = python_function(e, f"_epilogue_{name}")
    fn = load(source, f"_epilogue_{name}", torch=torch, F=F)
    torch.manual_seed(0)
    acc, values = torch.randn(M, N, dtype=torch.float64) * 2.0, random_operands(e)
    ours, our_grads = outputs_and_grads(lambda a, v: fn(a, *v), e, acc, values)
    theirs, their_grads = outputs_and_grads(
        lambda a, v: evaluate(e, a, operand_values(e, v, torch.float64)), e, acc, values)
    assert (ours[1] is None) == (e.aux is None) == (theirs[1] is None)
    for got, ref in zip(ours + our_grads, theirs + their_grads):
        assert (got is None) == (ref is None)
        if got is not None:
            assert got.shape == ref.shape and got.dtype == ref.dtype == torch.float64
            assert torch.equal(got, ref), (name, (got - ref).abs().max())
    # bf16 operands in an fp32 accumulator: cast to acc's dtype first, as operand_values does
    low = [v.to(torch.bfloat16) if isinstance(v, torch.Tensor) else v for v in values]
    for got, ref in zip(fn(acc.float(), *low), evaluate(e, acc.float(), operand_values(e, low, torch.float32))):
        assert (got is None and ref is None) or (got.dtype == torch.float32 and torch.equal(got, ref))


def test_the_source_is_readable_and_names_nothing_else():
    source = python_function(EPILOGUES["fused"], "_epilogue_fused", torch_module="_torch", functional_module="_F")
    assert source == (
        "def _epilogue_fused(acc, ep_bias, ep_C, ep_alpha, ep_beta):\n"
        '    """D = silu(alpha * acc + bias) + beta * C, with torch operations: returns (D, aux or None)."""\n'
        "    like = dict(dtype=acc.dtype, device=acc.device)\n"
        "    ep_bias = ep_bias.to(acc.dtype)[None, :]\n"
        "    ep_C = ep_C.to(acc.dtype)\n"
        "    ep_alpha = float(ep_alpha)\n"
        "    ep_beta = float(ep_beta)\n"
        "    t0 = _torch.tensor(ep_alpha, **like) * acc\n"
        "    t1 = t0 + ep_bias\n"
        "    t2 = _F.silu(t1)\n"
        "    t3 = _torch.tensor(ep_beta, **like) * ep_C\n"
        "    t4 = t2 + t3\n"
        "    return t4.expand_as(acc), None\n")
    # the module names given are the only ones it needs
    fn = load(source, "_epilogue_fused", _torch=torch, _F=F)
    acc = torch.randn(M, N, dtype=torch.float64)
    assert fn(acc, *random_operands(EPILOGUES["fused"]))[0].shape == (M, N)
    aux = python_function(EPILOGUES["gelu_aux"], "f")
    assert "like = " not in aux and aux.endswith("    return t1.expand_as(acc), t0.expand_as(acc)\n")
    assert "F.leaky_relu(acc, 0.2)" in python_function(EPILOGUES["row_clamp"], "f")   # the slope stays a float
    assert python_function(EPILOGUES["fused"], "f") == python_function(EPILOGUES["fused"], "f")   # deterministic


def test_only_the_accumulator_as_D():
    e = ep.trace(lambda acc: (acc, ep.relu(acc)))
    fn = load(python_function(e, "f"), "f", torch=torch, F=F)
    acc = torch.randn(M, N, dtype=torch.float64)
    d, aux = fn(acc)
    assert torch.equal(d, acc) and torch.equal(aux, torch.relu(acc))


@pytest.mark.parametrize("bad", ["", "1x", "a-b", "lambda", "caf\u00e9", None])
def test_names_are_checked(bad):
    for kwargs in ({"fn_name": bad}, {"fn_name": "f", "torch_module": bad}, {"fn_name": "f", "functional_module": bad}):
        with pytest.raises(ValueError, match="must be an ASCII Python identifier"):
            python_function(EPILOGUES["fused"], **kwargs)


def test_scales_in_the_source():
    tensor = python_function(EPILOGUES["scaled_tensor"], "f")
    assert tensor.startswith("def f(acc, ep_scale_a, ep_scale_b, ep_bias, ep_C, ep_alpha, ep_beta):\n")
    assert "    ep_scale_a = ep_scale_a.to(acc.dtype).reshape(())\n" in tensor
    assert "    t0 = acc * ep_scale_a\n    t1 = t0 * ep_scale_b\n" in tensor
    block = python_function(EPILOGUES["scaled_block"], "f")   # parameters in the op's order, never read
    assert block.startswith("def f(acc, ep_scale_a, ep_scale_b, ep_bias):\n")
    assert block.count("ep_scale_a") == block.count("ep_scale_b") == 1
