"""The op stage on a machine without a GPU: the kernel library builds, loads with ctypes, registers as a
torch op with a fake implementation, and refuses bad operands before any launch."""
from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")

from generator import Gemm  # noqa: E402
from generator.runtime import GemmArgsStruct, leading_dim  # noqa: E402
from generator.runtime.checks import batch_stride  # noqa: E402
from generator.runtime.library import GemmListProblemStruct  # noqa: E402
from generator.spec.types import Order  # noqa: E402


@pytest.fixture(scope="module")
def op(build_cache):
    return Gemm(dtype="bf16", layout="tn", arch=90).compile()


def test_library_loads_and_op_is_registered(op):
    assert op.library.path.is_file()
    assert getattr(torch.ops.gemmgen, op.name) is op.op
    assert "bf16" in op.__doc__ and "row-major" in op.__doc__


def test_launch_codes_name_their_cause(op):
    """Launch codes reach the user's message through the library's error_string: CUDA runtime errors by
    their number and runtime text, a refused tensor map (code 1 << 16 + CUresult, templates/sm90/launch.cuh) with
    the encoder and its CUresult, not as a bare "invalid argument"."""
    assert op.library.error_string(2).decode() == "CUDA error 2 (out of memory)"
    message = op.library.error_string((1 << 16) + 1).decode()
    assert message.startswith("cuTensorMapEncodeTiled refused an operand's tensor map: CUresult 1 (")
    # The driver names the CUresult where there is one; without a driver (CI) the name is "?".
    assert message.endswith(("(CUDA_ERROR_INVALID_VALUE)", "(?)")), message


def test_cpu_tensors_are_refused_with_the_fix(op):
    a = torch.randn(8, 16).bfloat16()
    b = torch.randn(4, 16).bfloat16().t()
    with pytest.raises(ValueError, match=r"A is on cpu; this op runs on CUDA tensors: pass A\.cuda\(\)"):
        op(a, b)
    with pytest.raises(ValueError, match="pass A.cuda()"):
        getattr(torch.ops.gemmgen, op.name)(a, b)


def test_non_tensor_is_a_type_error(op):
    with pytest.raises(TypeError, match="B must be a torch.Tensor, got list"):
        op(torch.randn(2, 2).bfloat16(), [[1.0]])


def test_fake_tensors_give_the_output_shape(op):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(64, 32, dtype=torch.bfloat16, device="cuda")
        b = torch.empty(48, 32, dtype=torch.bfloat16, device="cuda").t()
        d = op(a, b)
    assert tuple(d.shape) == (64, 48) and d.dtype == torch.bfloat16


@pytest.mark.parametrize("shapes, expected", [
    (((5, 64, 32), (48, 32)), (5, 64, 48)),      # x @ W.t() on a 3-D x: W shared
    (((64, 32), (5, 48, 32)), (5, 64, 48)),      # A shared
    (((5, 64, 32), (5, 48, 32)), (5, 64, 48)),
    (((1, 64, 32), (5, 48, 32)), (5, 64, 48)),   # a batch of 1 broadcasts, as torch.matmul
])
def test_fake_tensors_give_the_batched_output_shape(op, shapes, expected):
    from torch._subclasses.fake_tensor import FakeTensorMode

    (a_shape, b_shape) = shapes
    with FakeTensorMode():
        a = torch.empty(*a_shape, dtype=torch.bfloat16, device="cuda")
        b = torch.empty(*b_shape, dtype=torch.bfloat16, device="cuda").transpose(-1, -2)
        d = op(a, b)
        with pytest.raises(ValueError, match=r"D = A @ B is 3-D \(batch, M, N\)"):
            op(a, b, out=torch.empty(64, 48, dtype=torch.bfloat16, device="cuda"))
    assert (tuple(d.shape), d.stride(), d.dtype) == (expected, (64 * 48, 48, 1), torch.bfloat16)


def test_args_struct_matches_the_c_header():
    # templates/common/gemm_args.h: three pointers, then six int64 fields; the batch fields, group_ends and
    # group_rows, then a list call's host array and the launch's device copy, groups along K, the amax.
    assert GemmArgsStruct.m.offset == 24 and GemmArgsStruct.ldd.offset == 64
    assert GemmArgsStruct.batch.offset == GemmArgsStruct.ldaux.offset + 8
    assert GemmArgsStruct.group_ends.offset == GemmArgsStruct.batch_stride_d.offset + 8
    assert GemmArgsStruct.group_rows.offset == GemmArgsStruct.group_ends.offset + 8
    assert GemmArgsStruct.list.offset == GemmArgsStruct.group_rows.offset + 8
    assert GemmArgsStruct.list_device.offset == GemmArgsStruct.list.offset + 8
    assert GemmArgsStruct.groups_along_k.offset == GemmArgsStruct.list_device.offset + 8
    assert GemmArgsStruct.amax.offset == GemmArgsStruct.groups_along_k.offset + 8   # (a quantized D's amax, last)
    assert GemmArgsStruct.amax.offset + 8 == ctypes.sizeof(GemmArgsStruct)
    # GemmListProblem: a, b, d, then m, n, k, lda, ldb, ldd (int64): GemmArgs' first nine fields
    assert [f for f, _ in GemmListProblemStruct._fields_] == [f for f, _ in GemmArgsStruct._fields_[:9]]
    assert GemmListProblemStruct.m.offset == 24 and ctypes.sizeof(GemmListProblemStruct) == 72


@pytest.mark.parametrize("struct, mirror", [("GemmArgs", GemmArgsStruct), ("GemmListProblem", GemmListProblemStruct)])
def test_args_struct_has_the_c_compilers_layout(tmp_path, struct, mirror):
    """Every field of the ctypes mirror at the offset (and of the size) a C compiler gives gemm_args.h's, and no
    field missing: a field added to the header but not to the mirror (or in another place) fails here."""
    import shutil
    import subprocess

    from generator.render import templates_dir

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to read templates/common/gemm_args.h's layout")
    fields = [name for name, _ in mirror._fields_]
    lines = "\n".join(f'  printf("{f} %zu %zu\\n", offsetof({struct}, {f}), sizeof((({struct}*)0)->{f}));'
                      for f in fields)
    (tmp_path / "layout.c").write_text(f"""#include <stddef.h>
#include <stdio.h>
#include "common/gemm_args.h"
int main(void) {{
{lines}
  printf("sizeof %zu 0\\n", sizeof({struct}));
  return 0;
}}
""")
    build = subprocess.run([cc, f"-I{templates_dir()}", str(tmp_path / "layout.c"), "-o", str(tmp_path / "layout")],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout.split("\n")
    c = {name: (int(offset), int(size)) for name, offset, size in (line.split() for line in out if line)}
    offsets = {f: (getattr(mirror, f).offset, getattr(mirror, f).size) for f in fields}
    assert {f: c[f] for f in fields} == offsets
    assert c["sizeof"][0] == ctypes.sizeof(mirror)   # nothing after the mirror's last field


@pytest.mark.parametrize("shape, strides, order, expected", [
    ((4, 8), (8, 1), Order.row, 8),
    ((4, 8), (16, 1), Order.row, 16),      # a slice of a wider tensor
    ((4, 8), (1, 4), Order.row, None),     # column-major is not row-major
    ((4, 8), (1, 4), Order.col, 4),
    ((1, 8), (99, 1), Order.row, 8),       # one row: its stride means nothing
    ((4, 8), (2, 1), Order.row, None),     # rows overlap
    # 3-D: each matrix's (its last two dimensions), whatever the batch stride
    ((3, 4, 8), (32, 8, 1), Order.row, 8),
    ((3, 4, 8), (0, 16, 1), Order.row, 16),   # one matrix for every problem
    ((3, 4, 8), (40, 1, 4), Order.col, 4),
    ((3, 4, 8), (40, 1, 4), Order.row, None),
    ((3, 1, 8), (8, 99, 1), Order.row, 8),
])
def test_leading_dim(shape, strides, order, expected):
    t = torch.empty_strided(shape, strides)
    assert leading_dim(t, order) == expected


@pytest.mark.parametrize("shape, strides, expected", [
    ((4, 8), (8, 1), 0),            # 2-D: one matrix
    ((3, 4, 8), (32, 8, 1), 32),
    ((3, 4, 8), (40, 8, 1), 40),    # padded
    ((3, 4, 8), (0, 8, 1), 0),      # expanded
    ((1, 4, 8), (99, 8, 1), 0),     # a batch of one: its stride means nothing
])
def test_batch_stride(shape, strides, expected):
    assert batch_stride(torch.empty_strided(shape, strides)) == expected


def test_grouped_overload_of_a_built_op(op):
    """The real op's .grouped: registered with the tags of the other overloads; CPU tensors refused with the fix
    (the Python kernel); fake tensors (torch.compile) give D (total_M, N) row-major whatever the offsets' values."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    grouped = op.op.grouped
    assert torch.Tag.needs_fixed_stride_order in grouped.tags and torch.Tag.pt2_compliant_tag in grouped.tags
    a = torch.randn(64, 32).bfloat16()
    b = torch.randn(4, 48, 32).bfloat16().transpose(1, 2)   # experts' weights W (E, N, K) -> B (E, K, N)
    offsets = torch.tensor([10, 10, 40, 64], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^A is on cpu; this op runs on CUDA tensors: pass A\.cuda\(\)$"):
        op.grouped(a, b, offsets)
    with FakeTensorMode() as mode:
        d = op.grouped(*(mode.from_tensor(t, static_shapes=True).to("cuda") for t in (a, b, offsets)))
    assert (tuple(d.shape), d.stride(), d.dtype, d.device.type) == ((64, 48), (48, 1), torch.bfloat16, "cuda")
    assert (tuple(b.shape), b.stride()) == ((4, 32, 48), (48 * 32, 1, 32))


def test_a_list_call_skips_its_autograd_kernel_only_where_no_gradient_is_wanted():
    """op.grouped_list calls below autograd (no Python formula's kernel in between) only where that kernel would do
    nothing else: no matrix requires grad or grad mode is off, no forward-mode AD level is open (a dual tensor does
    not require grad), and no trace is under way."""
    import torch.autograd.forward_ad as fwAD

    from generator.runtime.op import _needs_autograd

    plain, wanting = [torch.randn(2, 2)], [torch.randn(2, 2, requires_grad=True)]
    assert not _needs_autograd(plain, plain)
    assert _needs_autograd(plain, wanting) and _needs_autograd(wanting, plain)
    with torch.no_grad():
        assert not _needs_autograd(plain, wanting)
    with fwAD.dual_level():
        assert _needs_autograd([fwAD.make_dual(plain[0], torch.ones(2, 2))], plain)


def test_grouped_list_overload_of_a_built_op(op):
    """The real op's .grouped_list: its schema, registered with the tags of the other overloads; CPU tensors refused
    with the fix (the Python kernel), by op(As, Bs) too; fake tensors (torch.compile) give each D[i] (M_i, N_i)
    row-major."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    overload = op.op.grouped_list
    assert str(overload._schema).endswith(".grouped_list(Tensor[] A, Tensor[] B) -> Tensor[]")
    assert torch.Tag.needs_fixed_stride_order in overload.tags and torch.Tag.pt2_compliant_tag in overload.tags
    a = [torch.randn(64, 32).bfloat16(), torch.randn(8, 16).bfloat16()]
    b = [torch.randn(48, 32).bfloat16().t(), torch.randn(24, 16).bfloat16().t()]   # weights W (N, K) -> B = W.t()
    on_cpu = r"^A\[0\] is on cpu; this op runs on CUDA tensors: pass A\[0\]\.cuda\(\)$"
    for call in (lambda: op.grouped_list(a, b), lambda: op(a, b), lambda: overload(a, b)):
        with pytest.raises(ValueError, match=on_cpu):
            call()
    with FakeTensorMode() as mode:
        d = op([mode.from_tensor(t).to("cuda") for t in a], [mode.from_tensor(t).to("cuda") for t in b])
    assert [(tuple(t.shape), t.stride(), t.dtype, t.device.type) for t in d] == [
        ((64, 48), (48, 1), torch.bfloat16, "cuda"), ((8, 24), (24, 1), torch.bfloat16, "cuda")]


def test_compile_many_refuses_problems_that_do_not_match_the_configs_before_building(monkeypatch):
    from generator import Gemm
    from generator.runtime import op as op_module

    monkeypatch.setattr(op_module, "build_libraries", lambda *a, **k: pytest.fail("built before refusing"))
    config = Gemm("bf16", "tn", arch=90).config
    with pytest.raises(ValueError, match="compile_many: 2 configs but 1 problems: give one problem \\(or None\\) per "
                                         "config"):
        op_module.compile_many([config, config], namespace="gemmgen_refusal_test", problems=[None])
