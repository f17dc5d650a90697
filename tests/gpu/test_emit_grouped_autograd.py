"""The backward of an emitted package's grouped calls on the GPU: emit a bf16 ``tn`` sm90 plan with its backward
kernels, pip-install the package (--no-build-isolation --no-deps), import it, and check dA and dB of both grouped
forms, ``<op>.grouped(A, B, offsets)`` and ``<op>(As, Bs)`` (``.grouped_list``), computed by the package's copy of
gemmgen's formulas (``<package>/_grouped_formula.py``, registered by its ``__init__.py``; docs/grouped.md, "Backward"):

* against float64, ||got - ref|| / ||ref|| <= 1e-2 over each gradient and over each group (problem); ragged groups
  with empty ones (an empty group's dB[g] exactly zero), empty first and last groups, a list with an M = 0 problem;
* each gradient in its input's dtype, shape and storage order, packed, and finite: the operands' leading dimensions are
  padded with NaN (a wrong leading dimension reads NaN) and, since grouped calls have no out=, NaN-filled blocks of each
  gradient's size go back to torch's caching allocator just before the backward (an unwritten element likely reads NaN);
* the calls the formulas make (recorded with a TorchDispatchMode): the grouped dA call and the dB list call, one list
  call each for the list form, plain calls per group where the gradient breaks the 16-byte rule;
* bit-equal to the JIT op of the same plan (the same formula on the same kernels).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import gpu_cases  # noqa: E402
from gpu_cases import IS_SM90, nan_padded, rel_error64 as rel_error  # noqa: E402
from generator import Gemm, emit  # noqa: E402
from generator.planner.backward import backward_closure, backward_configs  # noqa: E402
from generator.runtime import compile_many  # noqa: E402
from generator.spec.grouped import grouped_list_refusal, grouped_refusal  # noqa: E402
from generator.spec.types import Order  # noqa: E402
from toolchain import find_cuda_home, pip_install_and_import  # noqa: E402

pytestmark = pytest.mark.gpu

PACKAGE = "gemmgen_gpu_grouped_grad"
JIT_NAMESPACE = "gemmgen_gpu_grouped_grad_jit"
OP = "gemm_bf16_tn"
DTYPE = torch.bfloat16
BOUND = 1e-2

#: (label, group sizes, N, K) of the offsets form: ragged with an empty group, 17 groups (several empty), empty groups
#: first and last.
OFFSETS_CASES = [
    ("ragged", [5, 0, 17, 130, 1], 72, 64),
    ("E=17", [3, 0, 0, 8, 1, 160, 0, 5, 2, 7, 0, 0, 129, 4, 1, 0, 64], 72, 200),
    ("empty first and last", [0, 128, 64, 0], 200, 64),
]
#: (M, K, N) per problem of the list form: ragged, a 1-row problem, M = 0.
LIST_SIZES = [(5, 64, 72), (130, 200, 8), (0, 64, 16), (17, 8, 200), (1, 72, 64)]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The package (one op, OP, with its backward ops), installed and imported; the JIT op of the same plan."""
    if not IS_SM90:
        pytest.skip("the grouped kernels need an sm_90 GPU")
    cuda_home = find_cuda_home()
    if cuda_home is None:
        pytest.skip("nvcc not found (set CUDA_HOME): cannot build the emitted package")
    root = tmp_path_factory.mktemp("emitted_grouped")
    plan = Gemm("bf16", "tn", arch=90)
    pkg = emit([plan], name=PACKAGE, out=root / PACKAGE, op_names=[OP])
    module, _ = pip_install_and_import(pkg, PACKAGE, root, cuda_home)
    backward = [c for c in backward_closure([plan.config]).values() if c != plan.config]
    jit = compile_many([plan.config, *backward], namespace=JIT_NAMESPACE)[0]   # one ninja run
    grad_a, grad_b = backward_configs(plan.config, Order.row)
    # the paths the tests expect: the dA op takes grouped calls, the dB op list calls
    assert grouped_refusal(grad_a) is None and grouped_list_refusal(grad_b) is None, (grad_a.name, grad_b.name)
    return {"module": module, "plan": plan, "jit": jit, "grad_a": f"_grad_{grad_a.name}",
            "grad_b": f"_grad_{grad_b.name}"}


class PackageCalls(TorchDispatchMode):
    """The package's ops called while it is on: (op, overload), e.g. ("_grad_sm90_..._tt_...", "grouped")."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, _, rest = func.name().partition("::")
        if namespace == PACKAGE:
            op, _, overload = rest.partition(".")
            self.calls.append((op, overload or "default"))
        return func(*args, **(kwargs or {}))


# -- operands and checks -------------------------------------------------------------------------------------------

def stored(rows: int, cols: int, order: str) -> torch.Tensor:
    return nan_padded(rows, cols, order, DTYPE)


def experts(count: int, rows: int, cols: int, order: str) -> torch.Tensor:
    return nan_padded(rows, cols, order, DTYPE, count)


def bounds(sizes: list[int]) -> list[tuple[int, int]]:
    ends, total = [], 0
    for s in sizes:
        ends.append((total, total + s))
        total += s
    return ends


def poison(*shapes) -> None:
    gpu_cases.poison(DTYPE, *shapes)


def check_grad(got, ref, t, what: str) -> None:
    gpu_cases.check_grad(got, ref, t, what, BOUND)


# -- the offsets form ----------------------------------------------------------------------------------------------

def grouped_inputs(sizes: list[int], n: int, k: int):
    a = stored(sum(sizes), k, "row").requires_grad_()
    b = experts(len(sizes), k, n, "col").requires_grad_()   # tn: each B[g] (K, N) column-major
    offsets = torch.tensor([e for _, e in bounds(sizes)], dtype=torch.int32, device="cuda")
    return a, b, offsets


def grouped_grads(fn, a, b, offsets, g):
    """(dA, dB) of fn(a, b, offsets) for dD = g, with NaN blocks of their sizes freed just before; the package's
    calls made by the backward."""
    d = fn(a, b, offsets)
    assert d.grad_fn is not None
    poison((max(a.shape[0], 1), a.shape[1]), tuple(b.shape))
    with PackageCalls() as mode:
        got = torch.autograd.grad(d, (a, b), g)
    torch.cuda.synchronize()
    return got, mode.calls


def grouped_reference(a, b, g, sizes):
    a64, b64, g64 = a.detach().double(), b.detach().double(), g.double()
    ref_a, ref_b = torch.zeros_like(a64), torch.zeros_like(b64)
    for e, (start, end) in enumerate(bounds(sizes)):
        if end > start:
            ref_a[start:end] = g64[start:end] @ b64[e].t()
            ref_b[e] = a64[start:end].t() @ g64[start:end]
    return ref_a, ref_b


@pytest.mark.parametrize("label, sizes, n, k", OFFSETS_CASES, ids=[c[0] for c in OFFSETS_CASES])
def test_grouped_backward_matches_float64_and_the_jit_op(installed, label, sizes, n, k):
    fn, jit = installed["module"].gemm_bf16_tn.grouped, installed["jit"].grouped
    a, b, offsets = grouped_inputs(sizes, n, k)
    g = torch.randn(sum(sizes), n, device="cuda").to(DTYPE)
    (grad_a, grad_b), calls = grouped_grads(fn, a, b, offsets, g)
    assert calls == [(installed["grad_a"], "grouped"), (installed["grad_b"], "grouped")], calls   # dB: along K
    ref_a, ref_b = grouped_reference(a, b, g, sizes)
    check_grad(grad_a, ref_a, a, f"{label}: dA")
    check_grad(grad_b, ref_b, b, f"{label}: dB")
    for e, (start, end) in enumerate(bounds(sizes)):
        if end > start:
            assert rel_error(grad_a[start:end], ref_a[start:end]) <= BOUND, f"{label}: dA of group {e}"
            assert rel_error(grad_b[e], ref_b[e]) <= BOUND, f"{label}: dB[{e}]"
        else:
            assert torch.equal(grad_b[e], torch.zeros_like(grad_b[e])), f"{label}: dB[{e}] of an empty group"
    jit_a, jit_b = torch.autograd.grad(jit(a, b, offsets), (a, b), g)
    assert torch.equal(grad_a, jit_a) and torch.equal(grad_b, jit_b), f"{label}: differs from the JIT op"


def test_grouped_backward_of_an_unaligned_gradient_takes_plain_calls(installed):
    """A gradient off the 16-byte rule (a slice of a wider buffer) is taken as it is: one plain call per group with
    rows on the dA op and on the dB op, the same gradients."""
    fn = installed["module"].gemm_bf16_tn.grouped
    label, sizes, n, k = OFFSETS_CASES[0]
    a, b, offsets = grouped_inputs(sizes, n, k)
    g = torch.randn(sum(sizes), n + 3, device="cuda").to(DTYPE)[:, 1:n + 1]
    (grad_a, grad_b), calls = grouped_grads(fn, a, b, offsets, g)
    groups = sum(1 for s in sizes if s)
    assert calls == [(installed["grad_a"], "default")] * groups + [(installed["grad_b"], "default")] * groups, calls
    ref_a, ref_b = grouped_reference(a, b, g, sizes)
    check_grad(grad_a, ref_a, a, "unaligned dD: dA")
    check_grad(grad_b, ref_b, b, "unaligned dD: dB")


def test_grouped_calls_without_grad_build_no_graph(installed):
    fn = installed["module"].gemm_bf16_tn.grouped
    a, b, offsets = grouped_inputs([5, 0, 17], 72, 64)
    with torch.no_grad():
        assert fn(a, b, offsets).grad_fn is None
    assert fn(a.detach(), b.detach(), offsets).grad_fn is None
    line = torch._C._dispatch_dump(f"{PACKAGE}::{OP}.grouped").split("Autograd[alias]: registered at ")[1]
    assert "torch/library.py" in line.split("\n")[0], line   # __init__.py's formula, not binding.cpp's refusal


# -- the list form -------------------------------------------------------------------------------------------------

def test_list_backward_matches_float64_and_the_jit_op(installed):
    fn, jit = installed["module"].gemm_bf16_tn, installed["jit"]
    a = [stored(m, k, "row").requires_grad_() for m, k, _ in LIST_SIZES]
    b = [stored(k, n, "col").requires_grad_() for _, k, n in LIST_SIZES]
    d = fn(a, b)
    grads = [torch.randn(m, n, device="cuda").to(DTYPE) for m, _, n in LIST_SIZES]
    poison(*[(max(m, 1), k) for m, k, _ in LIST_SIZES])
    with PackageCalls() as mode:
        got = torch.autograd.grad(d, (*a, *b), grads)
    torch.cuda.synchronize()
    assert mode.calls == [(installed["grad_a"], "grouped_list"), (installed["grad_b"], "grouped_list")], mode.calls
    theirs = torch.autograd.grad(jit(a, b), (*a, *b), grads)
    count = len(LIST_SIZES)
    for i, (x, y, gd) in enumerate(zip(a, b, grads)):
        x64, y64, g64 = x.detach().double(), y.detach().double(), gd.double()
        check_grad(got[i], g64 @ y64.t(), x, f"dA[{i}]")
        check_grad(got[count + i], x64.t() @ g64, y, f"dB[{i}]")
    assert all(torch.equal(u, v) for u, v in zip(got, theirs)), "the list form's gradients differ from the JIT op's"


# -- the masked form -----------------------------------------------------------------------------------------------

def test_masked_matches_float64_and_the_jit_op(installed):
    """The package's .masked (forward only): each slab's valid rows against float64 and bit-equal to the JIT op's,
    the rows past each count left as they were (NaN: D is allocated, not zeroed, so a NaN-filled block freed just
    before lands under it), and a refusal of grad in the JIT op's words."""
    fn, jit = installed["module"].gemm_bf16_tn.masked, installed["jit"]
    counts_list, max_m, n, k = [5, 0, 17, 64], 64, 72, 200
    slabs = torch.randn(len(counts_list), max_m, k, device="cuda").to(DTYPE)
    b = experts(len(counts_list), k, n, "col")
    counts = torch.tensor(counts_list, dtype=torch.int32, device="cuda")
    poison((len(counts_list) * max_m, n))
    d = fn(slabs, b, counts)
    assert d.shape == (len(counts_list), max_m, n)
    for g, count in enumerate(counts_list):
        want = slabs[g, :count].double() @ b[g].double()
        if count:
            assert rel_error(d[g, :count], want) <= BOUND, g
        assert torch.isnan(d[g, count:]).all(), f"slab {g}: rows past its count written"
    theirs = jit.masked(slabs, b, counts)   # only the valid rows compare: the rest hold whatever memory held
    assert all(torch.equal(d[g, :c], theirs[g, :c]) for g, c in enumerate(counts_list)), "differs from the JIT op's"
    with pytest.raises(RuntimeError, match=r"masked calls have no backward pass yet, but B require\(s\) grad"):
        fn(slabs, b.clone().requires_grad_(), counts)
