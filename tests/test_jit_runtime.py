"""The JIT runtime on a machine without a GPU: it builds with the first kernel, registers each JIT op's
C++ CUDA kernel and autograd formula (templates/torch/gemm_op.h and gemm_autograd.h, the emitted
packages' code) beside the Python path, says the same as the Python checks, and its absence costs a
warning, never an op. (The C++ formula itself is run by tests/test_autograd_cpu.py, on CPU stand-in
kernels.)

The C++ kernel is reached without a GPU by redispatching straight to the CUDA key with CPU tensors: its
checks run A's rank, dtype and device first, so those are exercised here (B's checks and the rest come
after A's device check); the others and the launch are tests/gpu/test_jit_runtime_gpu.py's, and every
CUDA call of a JIT op in tests/gpu/ goes through this kernel."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from generator import Gemm  # noqa: E402
from generator.runtime import jit_runtime  # noqa: E402
from generator.runtime import compile_op, registered_op  # noqa: E402

CUDA_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)


@pytest.fixture(scope="module")
def op(build_cache):
    return Gemm(dtype="bf16", layout="tn", arch=90, namespace="gemmgen_rt").compile()


def cuda_kernel_source(qualname: str, key: str = "CUDA") -> str | None:
    """The file that registered the op's kernel for ``key`` (CUDA, or Autograd[alias]), from the
    dispatcher's own table."""
    for line in torch._C._dispatch_dump(qualname).splitlines():
        if line.startswith(f"{key}: registered at "):
            return line.removeprefix(f"{key}: registered at ")
    return None


def test_compile_registers_the_cpp_cuda_kernel_and_autograd(op):
    assert op.cpp_kernel and op.cpp_autograd and jit_runtime.RUNTIME.failure is None
    for overload in ("", ".out"):
        for key in ("CUDA", "Autograd[alias]"):
            where = cuda_kernel_source(f"gemmgen_rt::{op.name}{overload}", key)
            assert where is not None and "jit_runtime.cpp" in where, (key, where)
    # the other keys stay Python's: CPU tensors hear the Python checks, meta tensors the fake
    assert "op.py" in torch._C._dispatch_dump(f"gemmgen_rt::{op.name}").split("CompositeExplicitAutograd")[1]


def _raise(call):
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


BAD = {
    "A 3-D": lambda: (torch.randn(2, 4, 8).bfloat16(), torch.randn(4, 8).bfloat16().t()),
    "A float32": lambda: (torch.randn(4, 8), torch.randn(4, 8).bfloat16().t()),
    "A on the CPU": lambda: (torch.randn(4, 8).bfloat16(), torch.randn(4, 8).bfloat16().t()),
}


@pytest.mark.parametrize("case", BAD)
def test_cpp_checks_say_what_the_python_checks_say(op, case):
    a, b = BAD[case]()
    cpp = _raise(lambda: op.op.default.redispatch(CUDA_KEY, a, b))
    python = _raise(lambda: op.run(a, b, (), None))
    assert cpp == python and cpp[0] in (TypeError, ValueError)
    out = torch.empty(4, 4, dtype=torch.bfloat16)
    assert _raise(lambda: op.op.out.redispatch(CUDA_KEY, a, b, out=out)) == _raise(lambda: op.run(a, b, (), out))


def test_an_op_built_on_first_use_gets_its_cpp_kernel_then(op):
    lazy = registered_op(Gemm("bf16", "nt", arch=90).config, "gemmgen_rt")
    assert not lazy.built and not lazy.cpp_kernel and cuda_kernel_source(f"gemmgen_rt::{lazy.name}") is None
    assert lazy.cpp_autograd   # the formula is registered with the op, before any build
    lazy.library  # noqa: B018  (the first launch's build)
    assert lazy.cpp_kernel and "jit_runtime.cpp" in cuda_kernel_source(f"gemmgen_rt::{lazy.name}")
    again = compile_op(lazy.config, namespace="gemmgen_rt")   # a second compile registers nothing twice
    assert again.cpp_kernel and again.op is lazy.op


def test_a_second_handle_built_first_registers_through_the_registered_one(op, recwarn):
    from generator.runtime import GemmOp

    config = Gemm("bf16", "tt", arch=90).config
    registered = registered_op(config, "gemmgen_rt")            # registered, not built
    second = GemmOp(config, None, "gemmgen_rt")                  # another handle of the same op
    second.library  # noqa: B018  (built through the second handle)
    assert second.cpp_kernel and registered.cpp_kernel and registered.built
    dump = torch._C._dispatch_dump(f"gemmgen_rt::{config.name}")
    assert dump.count("CUDA: registered at ") == 1 and "jit_runtime.cpp" in dump
    assert not [w for w in recwarn if "Overriding" in str(w.message)]


def test_without_the_runtime_ops_still_work_and_a_warning_says_why(build_cache, monkeypatch):
    broken = jit_runtime._Runtime()
    monkeypatch.setattr(jit_runtime, "RUNTIME", broken)
    request = jit_runtime.runtime_request()
    bad = jit_runtime.BuildRequest(name="gemmgen_jit_runtime_broken", sources={"jit_runtime.cpp": "#error no\n"},
                                   gencode="", include_dirs=request.include_dirs)
    monkeypatch.setattr(jit_runtime, "runtime_request", lambda: bad)
    with pytest.warns(RuntimeWarning, match="JIT runtime .* did not build.*results are the same"):
        op = Gemm(dtype="fp16", layout="tn", arch=90, namespace="gemmgen_rt_none").compile()
    assert not op.cpp_kernel and not op.cpp_autograd and op.built and "#error no" in broken.failure
    assert cuda_kernel_source(f"gemmgen_rt_none::{op.name}") is None
    autograd = cuda_kernel_source(f"gemmgen_rt_none::{op.name}", "Autograd[alias]")
    assert autograd is not None and "jit_runtime.cpp" not in autograd   # the Python formula
    with pytest.raises(ValueError, match=r"pass A\.cuda\(\)"):   # the Python path serves every key
        op(torch.randn(4, 8).half(), torch.randn(4, 8).half().t())
