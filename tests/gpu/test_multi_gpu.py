"""Several GPUs (issue 22): an op called with tensors on cuda:1 runs there, whatever the current device, on cuda:1's
current stream; operands on two devices are refused with the fix (the C++ kernel and the Python checks alike), and
the process is right afterwards; two threads, one per GPU, call ops at once; every call form on cuda:1; an emitted
package's op on cuda:1.

Needs two GPUs (skipped otherwise, with the reason); the sm90 cases need both to be Hopper. Results against a
float64 reference on fresh random inputs (gpu_cases.BOUND). Every kernel is built in one parallel ninja run (module
fixture); the threads' kernels are launched first by the two threads at once (the per-device shared-memory opt-in
and cluster occupancy of templates/common/launch.cuh and sm90/launch.cuh, set on two devices concurrently)."""
from __future__ import annotations

import contextlib
import itertools
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpu_cases import BOUND  # noqa: E402
from generator import Gemm  # noqa: E402
from generator.runtime import BucketedOp, compile_many  # noqa: E402
from toolchain import find_cuda_home, pip_install_and_import  # noqa: E402

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
BOTH_SM90 = TWO_GPUS and all(torch.cuda.get_device_capability(d) == (9, 0) for d in (0, 1))
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs (torch.cuda.device_count() >= 2)")]
needs_sm90 = pytest.mark.skipif(not BOTH_SM90, reason="the sm90 family needs both GPUs to be Hopper (sm_90)")

NAMESPACE = "gemmgen_multi_gpu"
EXAMPLE = Path(__file__).resolve().parents[2] / "emitted" / "gemmgen_example"
NAN = float("nan")
#: Plain plans of both families; "*_bias" with a fused epilogue operand; "*_threads" launched first by two threads.
PLANS = {
    "sm90_tn": dict(dtype="bf16", layout="tn", arch=90, schedule="cooperative", tile_shape=(128, 256, 64),
                    cluster_shape=(2, 1)),
    "sm90_nn": dict(dtype="bf16", layout="nn", arch=90),
    "sm80_tn": dict(dtype="bf16", layout="tn", arch=80),
    "sm80_nt": dict(dtype="bf16", layout="nt", arch=80),
    "sm80_bias": dict(dtype="bf16", layout="tn", arch=80, bias="col", activation="relu"),
    "sm90_threads": dict(dtype="bf16", layout="tn", arch=90, schedule="pingpong", tile_shape=(128, 128, 64),
                         cluster_shape=(1, 1)),
    "sm80_threads": dict(dtype="bf16", layout="nn", arch=80),
}
PLAIN = ("sm90_tn", "sm90_nn", "sm80_tn", "sm80_nt")
#: Aligned (leading dimensions padded to 16 bytes), ragged, and few rows (the small-M kernel of K-major plans).
SHAPES = [(256, 384, 512), (1000, 1500, 333), (129, 65, 2049), (8, 1024, 520)]
#: A wait on a stream long enough that a launch on any other stream would run first (~0.1 s).
SLEEP_CYCLES = 200_000_000
THREAD_CALLS = 48


def plan_params(keys):
    return [pytest.param(k, marks=needs_sm90) if PLANS[k]["arch"] == 90 else k for k in keys]


@pytest.fixture(scope="module")
def ops():
    """The PLANS' ops (sm80 ones only unless both GPUs are sm_90), and on sm_90 a split-K op and the bucketed op of
    the default plan; one parallel build."""
    configs = {k: Gemm(**kw).config for k, kw in PLANS.items() if BOTH_SM90 or kw["arch"] == 80}
    buckets = []
    if BOTH_SM90:
        configs["split_k"] = replace(Gemm("bf16", "tn", arch=90, schedule="cooperative", tile_shape=(128, 64, 64),
                                          cluster_shape=(1, 1)).config, stream_k=True)
        buckets = [(bound, p.config) for bound, p in Gemm("bf16", "tn", arch=90, n=4096, k=4096).bucket_plans()]
    unique = list(dict.fromkeys([*configs.values(), *(c for _, c in buckets)]))
    built = dict(zip(unique, compile_many(unique, namespace=NAMESPACE)))
    found = {k: built[c] for k, c in configs.items()}
    if buckets:
        found["buckets"] = BucketedOp.from_built(buckets, built)
    return found


@pytest.fixture(autouse=True)
def current_device_0():
    """Every test starts, and must end, with cuda:0 current: an op on cuda:1 does not leave its device current."""
    torch.cuda.set_device(0)
    yield
    assert torch.cuda.current_device() == 0


def operand(rows: int, cols: int, order: str, device: str, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Fresh random (rows, cols) on ``device``, row- or column-major, leading dimension padded to 16 bytes."""
    if order == "row":
        return torch.randn(rows, -(-cols // 8) * 8, device=device).to(dtype)[:, :cols]
    return torch.randn(cols, -(-rows // 8) * 8, device=device).to(dtype)[:, :rows].t()


def operands(op, m: int, n: int, k: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    layout = op.config.layout
    return operand(m, k, layout.a.value, device, op.dtype), operand(k, n, layout.b.value, device, op.dtype)


def rel_error(d: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (d.double() - ref).norm()
    return (diff / ref.norm().clamp_min(1e-30)).item() if torch.isfinite(diff) else float("inf")


def check(d: torch.Tensor, ref: torch.Tensor, device: str, what: str) -> None:
    assert d.device == torch.device(device), f"{what}: D is on {d.device}, not {device}"
    err = rel_error(d, ref)
    assert err <= BOUND[d.dtype], f"{what}: rel error {err:.3g}"


def check_product(d: torch.Tensor, a: torch.Tensor, b: torch.Tensor, device: str, what: str) -> None:
    check(d, a.double() @ b.double(), device, what)


def refusal(call) -> str:
    with pytest.raises(ValueError) as err:
        call()
    return str(err.value)


# -- (a) an op on cuda:1 runs there ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", plan_params(PLAIN))
def test_an_op_on_cuda1_runs_there(ops, key):
    """cuda:0 current, operands on cuda:1: the C++ kernel (op), .out into a NaN-poisoned D, and the Python path
    (op.run: ctypes)."""
    op = ops[key]
    for m, n, k in SHAPES:
        what = f"{op.name} {m}x{n}x{k} on cuda:1"
        a, b = operands(op, m, n, k, "cuda:1")
        check_product(op(a, b), a, b, "cuda:1", what)
        out = op._empty_out(a, b).fill_(NAN)
        assert op(a, b, out=out) is out
        check_product(out, a, b, "cuda:1", f"{what}, out=")
        check_product(op.run(a, b, (), None), a, b, "cuda:1", f"{what}, the Python path")
        assert torch.cuda.current_device() == 0


@pytest.mark.parametrize("key", plan_params(PLAIN))
def test_an_op_on_cuda0_with_cuda1_current(ops, key):
    op = ops[key]
    with torch.cuda.device(1):
        for m, n, k in SHAPES:
            a, b = operands(op, m, n, k, "cuda:0")
            check_product(op(a, b), a, b, "cuda:0", f"{op.name} {m}x{n}x{k} on cuda:0, cuda:1 current")
            check_product(op.run(a, b, (), None), a, b, "cuda:0", f"{op.name} {m}x{n}x{k}, the Python path")
        assert torch.cuda.current_device() == 1


# -- (b) on cuda:1's current stream ---------------------------------------------------------------------------------


@pytest.mark.parametrize("current", [1, 0], ids=["cuda1-current", "cuda0-current"])
@pytest.mark.parametrize("path", ["cpp", "python"])
@pytest.mark.parametrize("key", plan_params(("sm90_tn", "sm80_tn")))
def test_the_launch_is_on_cuda1s_current_stream(ops, key, path, current):
    """A is written on a side stream of cuda:1 after a long wait, then the op is called there (with cuda:1 or cuda:0
    current: the side stream stays cuda:1's current one): only a launch on that stream reads A's values; one on any
    other stream (cuda:1's default) runs during the wait and reads NaN. Synchronizing only the side stream suffices."""
    op = ops[key]
    m, n, k = 1000, 1500, 333
    a, b = operands(op, m, n, k, "cuda:1")
    values = a.clone()
    torch.cuda.synchronize(1)
    side = torch.cuda.Stream(device="cuda:1")
    with torch.cuda.stream(side):
        a.fill_(NAN)
        torch.cuda._sleep(SLEEP_CYCLES)
        a.copy_(values)
        with torch.cuda.device(current):
            d = op(a, b) if path == "cpp" else op.run(a, b, (), None)
    side.synchronize()
    check_product(d, values, b, "cuda:1", f"{op.name} on a side stream of cuda:1 ({path}, cuda:{current} current)")


# -- (c) operands on two devices ------------------------------------------------------------------------------------


def test_operands_on_two_gpus_are_refused_alike(ops):
    """The C++ kernel (op) and the Python checks (op.run) say the same, with the fix; the next calls are right."""
    op, bias_op = ops["sm80_tn"], ops["sm80_bias"]
    a, b = operands(op, 64, 48, 32, "cuda:0")
    b1 = b.to("cuda:1")
    out1 = torch.empty(64, 48, dtype=torch.bfloat16, device="cuda:1")
    cases = {
        "A is on cuda:0 and B on cuda:1: put both on one GPU, e.g. pass B.to('cuda:0')":
            [lambda: op(a, b1), lambda: op.run(a, b1, (), None), lambda: op(a[None], b1)],
        "A is on cuda:1 and B on cuda:0: put both on one GPU, e.g. pass B.to('cuda:1')":
            [lambda: op(a.to("cuda:1"), b), lambda: op.run(a.to("cuda:1"), b, (), None)],
        "out is on cuda:1 but A and B on cuda:0: allocate out on cuda:0":
            [lambda: op(a, b, out=out1), lambda: op.run(a, b, (), out1)],
        "bias is on cuda:1 but A and B on cuda:0: pass bias.to('cuda:0')":
            [lambda: bias_op(a, b, torch.zeros(48, dtype=torch.bfloat16, device="cuda:1")),
             lambda: bias_op.run(a, b, (torch.zeros(48, dtype=torch.bfloat16, device="cuda:1"),), None)],
    }
    for message, calls in cases.items():
        for call in calls:
            assert refusal(call) == message
    assert op.cpp_kernel   # (the first call of each pair went through the C++ kernel)
    for device in ("cuda:0", "cuda:1"):
        x, y = operands(op, 300, 200, 100, device)
        check_product(op(x, y), x, y, device, f"{op.name} on {device} after the refusals")
        bias = torch.randn(200, device=device).bfloat16()
        check(bias_op(x, y, bias), torch.relu(x.double() @ y.double() + bias.double()), device,
              f"{bias_op.name} on {device} after the refusals")


@needs_sm90
def test_grouped_and_list_operands_on_two_gpus_are_refused_alike(ops):
    op = ops["sm90_tn"]
    A = torch.randn(300, 64, device="cuda:0").bfloat16()
    B = torch.randn(3, 96, 64, device="cuda:0").bfloat16().transpose(1, 2)
    offsets = torch.tensor([100, 100, 300], dtype=torch.int32, device="cuda:0")
    cases = {
        "A is on cuda:0 and B on cuda:1: put both on one GPU, e.g. pass B.to('cuda:0')":
            (op.grouped, op.run_grouped, (A, B.to("cuda:1"), offsets)),
        "offsets is on cuda:1 but A and B on cuda:0: pass offsets.to('cuda:0')":
            (op.grouped, op.run_grouped, (A, B, offsets.to("cuda:1"))),
        "B[1] is on cuda:1 but A[0] on cuda:0: put every matrix of A and B on one GPU, e.g. pass B[1].to('cuda:0')":
            (op.grouped_list, op.run_grouped_list, ([A, A[:7]], [B[0], B[1].to("cuda:1")])),
    }
    for message, (cpp, python, args) in cases.items():
        assert refusal(lambda: cpp(*args)) == refusal(lambda: python(*args)) == message
    D = op.grouped(A, B, offsets)
    check(D[100:], A[100:].double() @ B[2].double(), "cuda:0", "grouped after the refusals")


# -- (d) two threads, one per GPU ------------------------------------------------------------------------------------


def test_two_threads_on_two_gpus_at_once(ops):
    """Each thread makes fresh operands on its GPU and calls ops there (cuda:0 current in both threads, half the calls
    on a side stream of the thread's GPU) THREAD_CALLS times, at the same time as the other; the ops' first launches
    happen here, on both devices at once."""
    keys = ["sm90_threads", "sm80_threads"] if BOTH_SM90 else ["sm80_threads"]
    failures: list[str] = []
    start = threading.Barrier(2)

    # every shape with every op, on the thread's GPU's default stream and on a side stream of it
    combinations = list(itertools.product(SHAPES, keys, (False, True)))

    def calls(device: str) -> None:
        side = torch.cuda.Stream(device=device)
        start.wait()
        for i in range(THREAD_CALLS):
            (m, n, k), key, on_side = combinations[i % len(combinations)]
            op = ops[key]
            # (the side stream's context makes its device current: cuda:0 is made current again inside it)
            with torch.cuda.stream(side) if on_side else contextlib.nullcontext(), torch.cuda.device(0):
                a, b = operands(op, m, n, k, device)
                d = op(a, b)
                err = rel_error(d, a.double() @ b.double())
            if d.device != torch.device(device) or not err <= BOUND[torch.bfloat16]:
                failures.append(f"{device} call {i}: {op.name} {m}x{n}x{k} on {d.device}, rel error {err:.3g}")

    def run(device: str) -> None:
        try:
            calls(device)
        except BaseException as exc:   # reported below: a thread's exception would be lost
            failures.append(f"{device}: {type(exc).__name__}: {exc}")
            start.abort()

    threads = [threading.Thread(target=run, args=(f"cuda:{d}",)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    assert not failures, "\n".join(failures)


# -- (e) every call form on cuda:1 ----------------------------------------------------------------------------------


@needs_sm90
def test_the_bucketed_op_and_small_m_on_cuda1(ops):
    op = ops["buckets"]
    for m in (8, 1000):
        a, b = operand(m, 4096, "row", "cuda:1"), operand(4096, 1024, "col", "cuda:1")
        if m == 8:
            assert op.path(a, b).endswith(": small_m"), op.path(a, b)
        check_product(op(a, b), a, b, "cuda:1", f"bucketed op, M = {m}: {op.path(a, b)}")


def test_a_batched_call_on_cuda1(ops):
    op = ops["sm90_tn" if BOTH_SM90 else "sm80_tn"]
    a = torch.randn(3, 200, 96, device="cuda:1").bfloat16()
    b = torch.randn(3, 136, 96, device="cuda:1").bfloat16().transpose(1, 2)
    check(op(a, b), a.double() @ b.double(), "cuda:1", f"{op.name} batched on cuda:1")
    check(op(a, b[0]), a.double() @ b[0].double(), "cuda:1", f"{op.name} batched, B shared, on cuda:1")


def test_a_repacked_call_on_cuda1(ops):
    """A's rows off the 16-byte rule in a problem big enough to repay a copy: the aligned copy lives in the workspace
    pool of cuda:1 (templates/common/workspace.cuh)."""
    op = ops["sm90_tn" if BOTH_SM90 else "sm80_tn"]
    m, n, k = 512, 512, 264
    a = torch.randn(m, k + 1, device="cuda:1").bfloat16()[:, :k]
    b = operand(k, n, "col", "cuda:1")
    assert op.path(a, b) == "repacked"
    check_product(op(a, b), a, b, "cuda:1", f"{op.name} repacked on cuda:1")


@needs_sm90
def test_grouped_calls_on_cuda1(ops):
    op = ops["sm90_tn"]
    sizes, n, k = [100, 0, 257], 200, 192
    ends = torch.tensor(sizes).cumsum(0)
    A = torch.randn(int(ends[-1]), k, device="cuda:1").bfloat16()
    B = torch.randn(len(sizes), n, k, device="cuda:1").bfloat16().transpose(1, 2)
    offsets = ends.to(device="cuda:1", dtype=torch.int32)
    for what, D in (("op.grouped", op.grouped(A, B, offsets)), ("the Python path", op.run_grouped(A, B, offsets))):
        assert D.device == torch.device("cuda:1")
        for g, (start, end) in enumerate(zip([0, *ends[:-1].tolist()], ends.tolist())):
            if end > start:
                check(D[start:end], A[start:end].double() @ B[g].double(), "cuda:1", f"{what}, group {g}")
    As = [A[:100], A[100:117]]
    Bs = [B[0], B[2][:, :72]]
    for what, Ds in (("op(As, Bs)", op(As, Bs)), ("the Python path", op.run_grouped_list(As, Bs))):
        for i, (a, b, d) in enumerate(zip(As, Bs, Ds)):
            check_product(d, a, b, "cuda:1", f"{what}, problem {i}")


@needs_sm90
def test_split_k_on_cuda1(ops):
    """Stream-K's partial sums and flags live in cuda:1's workspace pool; its grid is sized by cuda:1's occupancy."""
    op = ops["split_k"]
    assert "_sk_" in op.name
    a, b = operand(128, 4096, "row", "cuda:1"), operand(4096, 2048, "col", "cuda:1")
    d = op(a, b)
    check_product(d, a, b, "cuda:1", f"{op.name} on cuda:1")
    assert torch.equal(op(a, b), d), "split-K on cuda:1 differs between runs"


# -- (f) an emitted package --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The committed example package (emitted/gemmgen_example: gemm_bf16_tn on sm_90, gemm_fp16_nn on sm_80),
    pip-installed from a copy."""
    cuda_home = find_cuda_home()
    if cuda_home is None:
        pytest.skip("nvcc not found (set CUDA_HOME): cannot build the emitted package")
    root = tmp_path_factory.mktemp("multi_gpu_example")
    pkg = root / "gemmgen_example"
    shutil.copytree(EXAMPLE, pkg, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.so"))
    module, _ = pip_install_and_import(pkg, "gemmgen_example", root, cuda_home)
    return module


@needs_sm90
def test_an_emitted_package_op_on_cuda1(example):
    for fn, dtype, layout in ((example.gemm_bf16_tn, torch.bfloat16, "tn"), (example.gemm_fp16_nn, torch.float16, "nn")):
        orders = ["row" if c == "t" else "col" for c in layout]
        for m, n, k in ((1000, 1500, 333), (8, 1024, 520)):
            a, b = operand(m, k, orders[0], "cuda:1", dtype), operand(k, n, orders[1], "cuda:1", dtype)
            check_product(fn(a, b), a, b, "cuda:1", f"{fn.__name__} {m}x{n}x{k} on cuda:1")
        assert refusal(lambda: fn(a, b.to("cuda:0"))) == (
            "A is on cuda:1 and B on cuda:0: put both on one GPU, e.g. pass B.to('cuda:1')")
        assert torch.cuda.current_device() == 0
