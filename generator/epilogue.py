"""Fused epilogues: what the GEMM does to its fp32 accumulator ``acc = A @ B`` before D is stored.

Write it as a Python function, or with knobs; both give one frozen, hashable ``Epilogue`` that becomes part
of the kernel's config and name::

    from generator import epilogue as ep

    def fused(acc, bias: ep.Col, C: ep.Matrix, alpha: ep.Scalar, beta: ep.Scalar):
        return ep.silu(alpha * acc + bias) + beta * C

    desc = ep.trace(fused)          # Epilogue; desc.text == "silu(alpha * acc + bias) + beta * C"

    def same(acc, bias: ep.Col):
        return ep.gelu_tanh(acc + bias)
    assert ep.trace(same) == ep.from_knobs(activation="gelu_tanh", bias="col")   # equal, same hash and name

The function
    Its first parameter is the accumulator (any name). Every other parameter is an extra operand of the op,
    annotated with its kind; the op takes them positionally in this order, after A and B. ``trace`` calls
    the function once on symbolic values, so the body must be straight-line arithmetic: no ``if`` on values,
    no comparisons, no ``and``/``or``, no builtin ``max``/``min``, no ``math``/``torch`` functions (each is
    refused with the function's name, line and the fix). Plain Python numbers are constants compiled into
    the kernel (use a Scalar for a value that changes between calls). Every operand must be used, and D must
    use the accumulator. String annotations (``from __future__ import annotations``) are resolved in the
    function's module. Lambdas work too (they cannot annotate, so only without operands:
    ``ep.trace(lambda acc: ep.relu(acc))``).

Operand kinds (annotations; bare or called with options)
    ``Scalar``                       a runtime fp32 scalar argument of the op (a Python number)
    ``ScalarTensor``                 a one-element fp32 tensor, shape (1,) or (), on A's device: read by the
                                     kernel on the device (no host sync: works in CUDA graphs and under
                                     torch.compile), e.g. an fp8 per-tensor scale; used like a Scalar
    ``Row(dtype=None)``              a per-row vector, shape (M,): one value per row of D
    ``Col(dtype=None)``              a per-column vector, shape (N,): one value per column (nn.Linear's bias)
    ``Matrix(dtype=None, order="row")``  an M x N matrix, row-major or ``order="col"`` (column-major)
    ``dtype=None`` means "the GEMM's output dtype" (``Epilogue.resolved(out_dtype)`` fills it in); an explicit
    dtype is fp16, bf16 or fp32 (a torch dtype works too). All arithmetic is done in fp32.

Operations
    ``+ - * /`` between values and numbers (either side), unary ``-``, ``abs(x)``, ``x ** 2`` (as x * x);
    ``ep.relu``, ``ep.leaky_relu(x, slope=0.01)`` (constant slope), ``ep.gelu`` (erf form),
    ``ep.gelu_tanh`` (tanh approximation), ``ep.silu``, ``ep.sigmoid``, ``ep.tanh``,
    ``ep.clamp(x, lo=None, hi=None)`` (a side left None is not clamped), ``ep.max(a, b)``, ``ep.min(a, b)``,
    ``ep.abs(x)``. A subexpression used twice is computed once.

Second output
    Return ``(D, aux)`` to also store ``aux``, an M x N tensor with D's dtype and order, e.g. the
    pre-activation for the backward pass: ``h = acc + bias; return ep.gelu(h), h``. aux must use the
    accumulator and differ from D.

Knobs
    ``from_knobs(activation=None, bias=None, alpha=None, beta=None, c_dtype=None, c_order=None,
    bias_dtype=None)`` is ``act(alpha * acc + beta * C + bias)``, the same Epilogue as that function:
    alpha/beta None leave the factor (beta None: no C at all), a number compiles it in (1 leaves it out),
    ``"scalar"`` makes it a runtime Scalar operand named ``alpha``/``beta``; bias ``"row"``/``"col"`` adds a
    Row/Col operand named ``bias``; C is a Matrix operand named ``C`` (``c_dtype``, ``c_order``). Operands in
    the order bias, C, alpha, beta. ``ACTIVATIONS`` lists the accepted activation names (None/"identity"/
    "none" for none, aliases "gelu_erf" -> gelu, "swish" -> silu); the functions ``relu`` ... ``tanh`` of
    this module are accepted too (``activation=ep.relu`` is ``activation="relu"``; ``leaky_relu`` with its
    default slope), any other function is refused (write it as an epilogue function).

The description
    ``Epilogue.operands``, ``.result`` (D's ``Expr``), ``.aux``; ``.text`` (infix formula), ``.describe()``
    (lines for a plan), ``.canonical`` / ``.digest`` (seed-independent identity), ``.tag`` /
    ``.name_suffix`` (kernel-name token), ``.nodes()`` (non-leaf nodes in evaluation order),
    ``.resolved(out_dtype)``, ``.scale_mode``. ``IDENTITY`` stores the accumulator as is.

fp8 scales
    ``Gemm(..., scale=...)`` composes the epilogue with the scales of A and B
    (``generator.spec.epilogue.with_scales``): the op then takes ``scale_a, scale_b`` right after A and B, per
    tensor (ScalarTensors; every acc becomes ``acc * scale_a * scale_b``), per row of A and column of B (fp32
    Row and Col; likewise), or per block (A's per row and 128-wide K block, (M, ceil(K/128)); B's per 128 x 128
    block, (ceil(N/128), ceil(K/128)); fp32, row-major; applied by the kernel's main loop, the expression is
    unchanged). The per-block kinds are not annotations: an expression cannot read them.
"""
from .spec.epilogue import (ACTIVATIONS, IDENTITY, Col, Epilogue, EpilogueError, Matrix, Row, Scalar, ScalarTensor,
                            abs, clamp, from_knobs, gelu, gelu_tanh, leaky_relu, max, min, relu, sigmoid, silu, tanh,
                            trace)

__all__ = [
    "ACTIVATIONS", "IDENTITY", "Col", "Epilogue", "EpilogueError", "Matrix", "Row", "Scalar", "ScalarTensor", "abs",
    "clamp", "from_knobs", "gelu", "gelu_tanh", "leaky_relu", "max", "min", "relu", "sigmoid", "silu", "tanh", "trace",
]
