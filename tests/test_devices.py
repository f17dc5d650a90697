"""Several GPUs, on a machine without one: operands on two devices refused with the fix, results on the operands'
device, and the host code's device handling (each launch on the operands' device, per-device state kept per device
and safe for threads on several GPUs at once).

Fake tensors stand for tensors on cuda:0 and cuda:1: they reach the fake implementations (torch.compile's view of
the op) and GemmOp's eager checks, which raise before any data is read. The C++ twins of these checks (templates/
torch/gemm_op.h) say the same sentences; tests/gpu/test_multi_gpu.py compares them on a two-GPU machine, with the
launches themselves."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from generator import Gemm  # noqa: E402
from generator.render import render, templates_dir  # noqa: E402
from generator.runtime import jit_runtime, registered_op  # noqa: E402

NAMESPACE = "gemmgen_devices_cpu"
TEMPLATES = templates_dir()
M, N, K, E = 64, 48, 32, 3


@pytest.fixture(scope="module", autouse=True)
def python_autograd():
    """Ops registered unbuilt, with the Python autograd formula: no nvcc build of the JIT runtime."""
    mp = pytest.MonkeyPatch()
    mp.setattr(jit_runtime.RUNTIME, "register_autograd", lambda op, configs, epilogue=None: False)
    yield
    mp.undo()


@pytest.fixture(scope="module")
def op():
    return registered_op(Gemm("bf16", "tn", arch=90).config, NAMESPACE)


@pytest.fixture(scope="module")
def bias_op():
    return registered_op(Gemm("bf16", "tn", arch=90, bias="col", activation="relu").config, NAMESPACE)


@pytest.fixture
def fake():
    with FakeTensorMode() as mode:
        yield mode


def a_on(device: str, rows: int = M) -> torch.Tensor:
    return torch.empty(rows, K, dtype=torch.bfloat16, device=device)


def b_on(device: str) -> torch.Tensor:   # (K, N) column-major: layout tn
    return torch.empty(N, K, dtype=torch.bfloat16, device=device).t()


def experts_on(device: str) -> torch.Tensor:   # (E, K, N), each matrix column-major
    return torch.empty(E, N, K, dtype=torch.bfloat16, device=device).transpose(1, 2)


def offsets_on(device: str) -> torch.Tensor:
    return torch.empty(E, dtype=torch.int32, device=device)


def refusal(call) -> str:
    with pytest.raises(ValueError) as err:
        call()
    return str(err.value)


# -- operands on two devices: the fake (torch.compile) and the eager checks say the same, with the fix ---------------

AB = "A is on cuda:0 and B on cuda:1: put both on one GPU, e.g. pass B.to('cuda:0')"


def test_a_and_b_on_two_gpus(op, fake) -> None:
    a, b = a_on("cuda:0"), b_on("cuda:1")
    assert refusal(lambda: op(a, b)) == AB                      # the fake
    assert refusal(lambda: op.run(a, b, (), None)) == AB        # the eager checks (the C++ kernel's twin)
    assert refusal(lambda: op(a[None], b)) == AB                # a batched call
    assert refusal(lambda: op(a_on("cuda:1"), b_on("cuda:0"))) == (
        "A is on cuda:1 and B on cuda:0: put both on one GPU, e.g. pass B.to('cuda:1')")


def test_out_on_another_gpu(op, fake) -> None:
    a, b, out = a_on("cuda:0"), b_on("cuda:0"), torch.empty(M, N, dtype=torch.bfloat16, device="cuda:1")
    message = "out is on cuda:1 but A and B on cuda:0: allocate out on cuda:0"
    assert refusal(lambda: op(a, b, out=out)) == message
    assert refusal(lambda: op.run(a, b, (), out)) == message


def test_an_epilogue_operand_on_another_gpu(bias_op, fake) -> None:
    a, b, bias = a_on("cuda:1"), b_on("cuda:1"), torch.empty(N, dtype=torch.bfloat16, device="cuda:0")
    message = "bias is on cuda:0 but A and B on cuda:1: pass bias.to('cuda:1')"
    assert refusal(lambda: bias_op(a, b, bias)) == message
    assert refusal(lambda: bias_op.run(a, b, (bias,), None)) == message


def test_a_grouped_call_on_two_gpus(op, fake) -> None:
    a, b, offsets = a_on("cuda:0"), experts_on("cuda:1"), offsets_on("cuda:0")
    assert refusal(lambda: op.grouped(a, b, offsets)) == AB
    assert refusal(lambda: op.run_grouped(a, b, offsets)) == AB
    b, offsets = experts_on("cuda:0"), offsets_on("cuda:1")
    message = "offsets is on cuda:1 but A and B on cuda:0: pass offsets.to('cuda:0')"
    assert refusal(lambda: op.grouped(a, b, offsets)) == message
    assert refusal(lambda: op.run_grouped(a, b, offsets)) == message


def test_a_list_call_on_two_gpus(op, fake) -> None:
    A = [a_on("cuda:0"), a_on("cuda:0", rows=17)]
    B = [b_on("cuda:0"), b_on("cuda:1")]
    message = "B[1] is on cuda:1 but A[0] on cuda:0: put every matrix of A and B on one GPU, e.g. pass B[1].to('cuda:0')"
    assert refusal(lambda: op(A, B)) == message
    assert refusal(lambda: op.run_grouped_list(A, B)) == message


def test_results_are_on_the_operands_gpu(op, bias_op, fake) -> None:
    a, b = a_on("cuda:1"), b_on("cuda:1")
    assert op(a, b).device == torch.device("cuda:1")
    assert bias_op(a, b, torch.empty(N, dtype=torch.bfloat16, device="cuda:1")).device == torch.device("cuda:1")
    assert op.grouped(a, experts_on("cuda:1"), offsets_on("cuda:1")).device == torch.device("cuda:1")
    assert [d.device for d in op([a, a_on("cuda:1", rows=5)], [b, b])] == [torch.device("cuda:1")] * 2
    # eager: D is allocated on A's device, whatever the current one
    assert op._empty_out(a, b).device == torch.device("cuda:1")


def test_the_cpp_checks_word_the_fix_alike() -> None:
    """gemm_op.h's twins of the refusals above, as text (the sentences are compared on two GPUs)."""
    source = (TEMPLATES / "torch" / "gemm_op.h").read_text()
    assert '": put both on one GPU, e.g. pass B.to(\'", A.device().str(), "\')"' in source
    assert source.count("check_same_device(A, B);") == 3    # plain (and batched) calls, grouped calls, along K
    assert '": put every matrix of A and B on one GPU, e.g. pass ", what, ".to(\'",' in source
    assert '"out is on ", out.device().str(), " but A and B on ",' in source
    assert '"offsets is on ", offsets.device().str(), " but A and B on ",' in source
    assert 'o.name, " is on ", t.device().str(), " but A and B on ",' in source


# -- the host code --------------------------------------------------------------------------------------------------


def _functions(source: str) -> dict[str, str]:
    """The inline functions of a header by name: each one's text up to the next top-level definition."""
    starts = [(m.group(1), m.start()) for m in re.finditer(r"^inline [^\n(]*?\b(\w+)\(", source, re.M)]
    return {name: source[start:(starts[i + 1][1] if i + 1 < len(starts) else len(source))]
            for i, (name, start) in enumerate(starts)}


def test_every_launch_runs_on_the_operands_device() -> None:
    """Each entry point of gemm_op.h that launches makes its operands' device current (an OptionalCUDAGuard of A's
    device) before it allocates D or launches: a tensor on cuda:1 with cuda:0 current runs on cuda:1, on cuda:1's
    current stream (call_launch takes the stream of the device, not of the current one)."""
    functions = _functions((TEMPLATES / "torch" / "gemm_op.h").read_text())
    launching = {name: body for name, body in functions.items()
                 if name != "launch" and re.search(r"\b(call_)?launch\(op,", body)}
    assert set(launching) == {"gemm", "gemm_out", "gemm_grouped", "gemm_grouped_k", "gemm_grouped_list", "gemm_masked",
                              "gemm_epilogue", "gemm_epilogue_out"}
    for name, body in launching.items():
        guard = re.search(r"OptionalCUDAGuard guard\(launch_device\(op, A(\[0\])?\)\);", body)
        assert guard is not None, f"{name} launches without making A's device current"
        first_use = min(m.start() for m in re.finditer(r"\bempty_\w*\(|\b(call_)?launch\(op,|\.zero_\(\)", body))
        assert guard.start() < first_use, f"{name} allocates or launches before it makes A's device current"
    assert "getCurrentCUDAStream(device.index())" in functions["call_launch"]
    assert "A.options()" in functions["empty_d"]   # D on A's device


#: The per-process state of the host code (templates/), each with why it is right on several GPUs at once: per device
#: where the device matters, and safe for threads (atomic, under a mutex, a const initialised once, or thread_local).
HOST_STATE = {
    "static PyModuleDef module": "the Python module of an emitted package (no device)",
    "static std::mutex mutex;": "guards the pools below, and stream-K's kept flags",
    "static std::map<std::pair<int, unsigned long long>, StreamKFlags> kept;": "stream-K's flags per (device, stream "
                                                                              "id), under the mutex",
    "static cudaMemPool_t pools[kMaxDevices] = {};": "one workspace pool per device, under the mutex",
    "thread_local char text[": "an error message, per thread",
    "static DeviceFlags smem_raised = {};": "the shared-memory opt-in, per kernel and device: atomic",
    "static const EncodeTiledFn fn =": "a driver entry point (no device), initialised once",
    "static const GetErrorNameFn fn =": "a driver entry point (no device), initialised once",
    "static std::atomic<int> known[kMaxDevices] = {};": "resident clusters (sm90/launch.cuh), SM count "
                                                          "(common/launch.cuh) and compute capability (gemm_op.h) "
                                                          "per device: atomic",
    "thread_local CachedMap map_": "a TMA map, per thread, keyed by the operand's address (unique across devices)",
    "static const at::Tensor undefined;": "an empty tensor (no device)",
    "static const std::vector<at::Tag> tags =": "the ops' tags (no device)",
    "static std::atomic<int> state[kMaxDevices] = {};": "whether the block order is measured (sm90/block_order.cuh), per "
                                                        "device: atomic",
    "static BlockOrder orders[kMaxDevices];": "the block order per device, written once under `measuring` before its "
                                              "state's release store, read after its acquire load",
    "static std::mutex measuring;": "guards the block order's one measurement per device",
    "thread_local CheckedOffsets last;": "the offsets a grouped call checked last, per thread, held weakly (no device: "
                                         "a tensor of any device matches only itself)",
}


def _host_state(text: str) -> list[str]:
    """The static and thread_local variables of ``text``: not constants, functions or members."""
    declared = re.findall(r"^\s*((?:static|thread_local)\b[^\n]*)", text, re.M)
    skip = re.compile(r"static_assert|static (constexpr|inline|__device__|__host__|__forceinline__)|\w+\(.*\)\s*\{?$"
                      r"|static at::Tensor forward|static torch::autograd::variable_list backward")
    return [d.strip() for d in declared if not skip.search(d)]


def test_host_state_is_per_device_and_thread_safe() -> None:
    """A per-process flag set once (e.g. the shared-memory opt-in, an attribute of a kernel on one device) breaks the
    second GPU; a plain array written by two threads is a data race. New host state must be reviewed for both."""
    files = [p for p in TEMPLATES.rglob("*") if p.suffix in (".h", ".cuh", ".cpp", ".j2") and p.is_file()]
    found = {(p.relative_to(TEMPLATES).as_posix(), d) for p in files for d in _host_state(p.read_text())}
    unknown = sorted(f"{path}: {d}" for path, d in found if not any(d.startswith(k) for k in HOST_STATE))
    assert not unknown, "host state to review for several GPUs and threads (then list it in HOST_STATE):\n" + \
        "\n".join(unknown)
    assert not any(re.match(r"static (bool|int)\b", d) for _, d in found)


@pytest.mark.parametrize("plan", [dict(arch=90), dict(arch=80), dict(arch=90, family="sm80")], ids=str)
def test_rendered_kernels_keep_no_state_of_their_own(plan: dict) -> None:
    """A kernel library's entry point launches on the stream it is given (the caller's, of the operands' device) and
    keeps no state; the shared headers' state is the test above's."""
    name = Gemm("bf16", "tn", **plan).name
    source = render(Gemm("bf16", "tn", **plan).config)[f"{name}.cu"]
    assert _host_state(source) == []
    assert f"int {name}_launch(const GemmArgs* args, void* stream)" in source
    assert "static_cast<cudaStream_t>(stream)" in source
