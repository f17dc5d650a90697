"""Batched GEMM on the GPU (issue 21 part 3): ops called on 3-D operands, D[b] = epilogue(A[b] @ B[b]).

A is (M, K) or (batch, M, K), B (K, N) or (batch, K, N); each matrix stored in the plan's order for its operand
(the rules of a 2-D operand), the batch stride anything >= 0: packed, padded (NaN between the matrices, so that a
wrong batch stride reads NaN), 0 (a 2-D operand shared by every problem, or a size-1 batch .expand()-ed) and a batch
of 1 broadcast against the other operand's, as torch.matmul. Both families (arch=80 plans: sm80; arch=90 plans:
sm90 cooperative with a 2x1 and a 1x2 cluster, pingpong with a 2x1 cluster, ws, stream-K), every layout, bf16 and
fp16, ragged M, N, K; the small-M kernel (M <= 16 per problem on layout tn), the unaligned kernel (an odd leading
dimension or batch stride), out= with a padded batch stride (the padding stays NaN), the allocated D (batch-contiguous,
each D[b] in the plan's D order), vector and scalar epilogue operands shared across the batch, K = 0, empty batches
(no launch), the refusals (each of its documented type, the next call right), bit-identical stream-K repeats, CUDA
graph capture and replay, and torch.compile(fullgraph=True).

Every check draws fresh random inputs, writes D into a NaN-poisoned out= first, and compares each problem with a
float64 reference by ||D[b] - ref[b]|| / ||ref[b]|| <= gpu_cases.BOUND[dtype]. Where B is shared and A's matrices
are row-major and packed, the library may fold the batch into M: the path may then be that of the folded problem,
and the results must be right either way.

All kernels (12 plans) are built in one parallel ninja run (module fixture)."""
from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from gpu_cases import BOUND, ops_for_this_gpu, op_of, smallest_normal  # noqa: E402
from generator import Gemm  # noqa: E402
from generator import epilogue as ep  # noqa: E402
from generator.runtime.evaluate import evaluate, operand_values  # noqa: E402
from generator.spec.config import REPACK_MIN_VOLUME, SMALL_M_MAX_ROWS, has_small_m_kernel, takes_small_m  # noqa: E402

pytestmark = pytest.mark.gpu
NAMESPACE = "gemmgen_batched_test"
NAN = float("nan")


def vectors(acc, bias: ep.Col, scale: ep.Row, alpha: ep.Scalar):
    """Per-column and per-row vectors and a runtime scalar: shared by every problem of a batch."""
    return ep.silu(alpha * acc * scale + bias)


def residual(acc, C: ep.Matrix):
    """A matrix operand: refused on a batched call."""
    return acc + C


# (id, Gemm kwargs). arch=80 plans are of the sm80 family (built for the visible GPU), arch=90 ones of sm90.
PLANS: dict[str, dict] = {
    "sm80_tn_fp16": dict(dtype="fp16", layout="tn", arch=80),
    "sm80_nt_bf16": dict(dtype="bf16", layout="nt", arch=80),
    "sm80_nn_bf16": dict(dtype="bf16", layout="nn", arch=80),
    "sm80_tt_fp16_dcol": dict(dtype="fp16", layout="tt", layout_c="col", arch=80),   # each D[b] column-major
    "sm80_tn_bf16_vectors": dict(dtype="bf16", layout="tn", epilogue=vectors, arch=80),
    "sm80_tn_fp16_matrix": dict(dtype="fp16", layout="tn", epilogue=residual, arch=80),
    "sm90_tn_bf16_coop_c2x1": dict(dtype="bf16", layout="tn", arch=90, schedule="cooperative",
                                   tile_shape=(128, 256, 64), cluster_shape=(2, 1)),
    "sm90_nt_fp16_coop_c1x2": dict(dtype="fp16", layout="nt", arch=90, schedule="cooperative",
                                   tile_shape=(128, 128, 64), cluster_shape=(1, 2)),
    "sm90_tt_bf16_pp_c2x1": dict(dtype="bf16", layout="tt", arch=90, schedule="pingpong",
                                 tile_shape=(128, 128, 64), cluster_shape=(2, 1)),
    "sm90_nn_fp16_ws": dict(dtype="fp16", layout="nn", arch=90, schedule="ws", tile_shape=(128, 128, 64),
                            cluster_shape=(1, 1)),
    "sm90_tn_fp16_vectors_pp": dict(dtype="fp16", layout="tn", epilogue=vectors, arch=90, schedule="pingpong",
                                    tile_shape=(64, 256, 64), cluster_shape=(1, 1)),
}
#: Stream-K is not a Gemm knob: the cooperative config with stream_k=True (as tests/gpu/test_stream_k.py).
STREAM_K = "sm90_tn_bf16_stream_k"
STREAM_K_PLAN = dict(dtype="bf16", layout="tn", arch=90, schedule="cooperative", tile_shape=(128, 64, 64),
                     cluster_shape=(1, 1))
#: The plain plans (no epilogue operands), one per family and layout, and stream-K.
PLAIN = ["sm80_tn_fp16", "sm80_nt_bf16", "sm80_nn_bf16", "sm80_tt_fp16_dcol", "sm90_tn_bf16_coop_c2x1",
         "sm90_nt_fp16_coop_c1x2", "sm90_tt_bf16_pp_c2x1", "sm90_nn_fp16_ws", STREAM_K]
#: Layouts tn and tt (A K-major): the plans with the small-M kernel (an N-major B within its bounds: takes_small_m).
SMALL_M_PLANS = ["sm80_tn_fp16", "sm90_tn_bf16_coop_c2x1", STREAM_K, "sm80_tn_bf16_vectors", "sm90_tn_fp16_vectors_pp",
                 "sm80_tt_fp16_dcol", "sm90_tt_bf16_pp_c2x1"]
VECTOR_PLANS = ["sm80_tn_bf16_vectors", "sm90_tn_fp16_vectors_pp"]


def configs() -> dict:
    found = {key: Gemm(**kw).config for key, kw in PLANS.items()}
    found[STREAM_K] = replace(Gemm(**STREAM_K_PLAN).config, stream_k=True)
    return found


@pytest.fixture(scope="module")
def ops():
    return ops_for_this_gpu(configs(), NAMESPACE)


# -- operands --------------------------------------------------------------------------------------------------

#: How an operand's matrices are stored along the batch.
#:   packed: (batch, r, c), batch stride = the matrix's outer size x its leading dimension
#:   padded: (batch, r, c), 3 more leading dimensions between the matrices, NaN there
#:   shared: (r, c), 2-D: every problem reads it (batch stride 0)
#:   expand: (1, r, c).expand(batch, r, c): batch stride 0 on a 3-D tensor
#:   one:    (1, r, c): a batch of 1, broadcast against the other operand's batch


def ceil8(x: int) -> int:
    """The smallest leading dimension >= x that is a multiple of 8 elements (16 bytes of a 16-bit type), at least 8."""
    return max(8, -(-x // 8) * 8)


def matrices(mode: str, batch: int, rows: int, cols: int, order: str, dtype: torch.dtype, *,
             ld: int | None = None, gap: int | None = None) -> torch.Tensor:
    """Fresh random (rows, cols) matrices stored `order`-major ("row" / "col") with leading dimension `ld` (default:
    padded to 16 bytes, finite random values in the padding), `gap` elements of NaN after each matrix's last leading
    dimension (default: none, or 3 leading dimensions for mode "padded"), laid out along the batch as `mode` says."""
    outer, inner = (rows, cols) if order == "row" else (cols, rows)
    ld = ceil8(inner) if ld is None else ld
    gap = (3 * ld if mode == "padded" else 0) if gap is None else gap
    count = batch if mode in ("packed", "padded") else 1
    stride = outer * ld + gap
    buf = torch.full((count * stride + 16,), NAN, dtype=dtype, device="cuda")
    blocks = buf.as_strided((count, outer, ld), (stride, ld, 1))
    blocks.copy_(torch.randn(count, outer, ld, device="cuda"))
    t = buf.as_strided((count, rows, cols), (stride, ld, 1) if order == "row" else (stride, 1, ld))
    if mode == "shared":
        return t[0]
    if mode == "expand":
        return t.expand(batch, rows, cols)
    return t


def operands(op, batch: int, m: int, n: int, k: int, a_mode: str = "packed", b_mode: str = "packed"
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh A and B of the op's dtype, each matrix in the plan's order (matrices' modes)."""
    cfg = op.config
    a = matrices(a_mode, batch, m, k, cfg.layout.a.value, op.dtype)
    b = matrices(b_mode, batch, k, n, cfg.layout.b.value, op.dtype)
    return a, b


def epilogue_values(op, m: int, n: int) -> list:
    """Fresh values of the plan's epilogue operands: vectors of D's dtype, scalars in [0.5, 2]."""
    values = []
    for o in op.config.epilogue.operands:
        if o.kind == "scalar":
            values.append(float(torch.empty(()).uniform_(0.5, 2.0)))
        elif o.kind in ("row", "col"):
            values.append(torch.randn(m if o.kind == "row" else n, device="cuda").to(op.out_dtype))
        else:
            raise AssertionError(f"{o.kind} operands are refused on batched calls: not under test here")
    return values


def reference(op, a: torch.Tensor, b: torch.Tensor, values) -> torch.Tensor:
    """The float64 result of every problem, broadcast as torch.matmul does: (batch, M, N), or (M, N) for 2-D A and B."""
    ep_ = op.config.epilogue
    acc = a.double() @ b.double()
    return evaluate(ep_, acc, operand_values(ep_, values, torch.float64))[0]


def poisoned_out(op, shape: tuple[int, ...], gap: int = 0, tight: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """out= in the plan's D order inside a NaN buffer: each D[b]'s leading dimension padded to 16 bytes (unless
    `tight`), `gap` more leading dimensions between the matrices (a padded batch stride). Returns (out, buffer)."""
    batch, (m, n) = (shape[0] if len(shape) == 3 else 1), shape[-2:]
    row = op.config.layout.c.value == "row"
    outer, inner = (m, n) if row else (n, m)
    ld = max(inner, 1) if tight else ceil8(inner)
    stride = (outer + gap) * ld
    buf = torch.full((batch * stride + 16,), NAN, dtype=op.out_dtype, device="cuda")
    out = buf.as_strided((batch, m, n), (stride, ld, 1) if row else (stride, 1, ld))
    return (out if len(shape) == 3 else out[0]), buf


def untouched_outside(out: torch.Tensor, buf: torch.Tensor) -> bool:
    """Whether every element of buf outside the view out is still NaN."""
    rest = buf.clone()
    rest.as_strided(out.shape, out.stride(), out.storage_offset()).fill_(0)
    return int(torch.isnan(rest).sum()) == rest.numel() - out.numel()


def rel_errors(d: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """||D[b] - ref[b]|| / ||ref[b]|| per problem, a norm below D's smallest normal counting as that normal
    (smallest_normal)."""
    d3, r3 = (d, ref) if d.dim() == 3 else (d.unsqueeze(0), ref.unsqueeze(0))
    diff = (d3.double() - r3).flatten(1).norm(dim=1)
    return diff / r3.flatten(1).norm(dim=1).clamp_min(smallest_normal(d.dtype))


def assert_batch_contiguous(op, d: torch.Tensor) -> None:
    """The allocated D: batch-contiguous, each D[b] in the plan's D order (strides of size-1 dimensions are free)."""
    batch, m, n = d.shape
    want = (m * n, n, 1) if op.config.layout.c.value == "row" else (m * n, 1, m)
    got = tuple(s if size > 1 else w for s, w, size in zip(d.stride(), want, d.shape))
    assert got == want, f"{op.name}: allocated D of shape {tuple(d.shape)} has strides {d.stride()}, not {want}"


def foldable(op, a_mode: str, b_mode: str) -> bool:
    """B the same for every problem (batch stride 0) and A's matrices row-major back to back, D row-major, no per-row
    epilogue operand: the library may run one GEMM of batch x M rows (docs/batched.md, fold_batch), so that op.path
    (whose D is packed) names the folded problem's path."""
    cfg = op.config
    return (cfg.layout.a.value == "row" and cfg.layout.c.value == "row" and a_mode == "packed"
            and b_mode in ("shared", "expand", "one") and not any(o.kind == "row" for o in cfg.epilogue.operands))


def expected_paths(op, m: int, n: int, k: int, a_mode: str, b_mode: str) -> set[str] | None:
    """The paths a call on aligned operands (as `matrices` makes them) may take; None where a size of 1 makes the
    other size the leading dimension, unpadded (as in test_sm90.py), or a size is 0."""
    for x, y in ((m, k), (k, m), (k, n), (n, k)):
        if x == 0 or (x == 1 and y % 8):
            return None
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    if takes_small_m(op.config, m, n, k, sms):
        return {"small_m", "fast"} if foldable(op, a_mode, b_mode) else {"small_m"}
    return {"fast"}


def check(op, batch: int, m: int, n: int, k: int, a_mode: str = "packed", b_mode: str = "packed", *,
          out_gap: int = 0, tight_out: bool = False, path: str | set[str] | None = "auto",
          args: tuple | None = None, label: str = "") -> torch.Tensor:
    """One call on fresh operands (or `args`: A, B) into a NaN-poisoned out=, then one allocating D: each problem
    against the float64 reference, the padding of out untouched, the allocated D batch-contiguous. path: the path
    op.path must name ("auto": expected_paths; None: unchecked). Returns the out= result."""
    a, b = operands(op, batch, m, n, k, a_mode, b_mode) if args is None else args
    values = epilogue_values(op, m, n)
    what = (f"{op.name} {label}batch={batch} M={m} N={n} K={k} A {a_mode} {tuple(a.stride())} "
            f"B {b_mode} {tuple(b.stride())}")
    if path == "auto":
        path = expected_paths(op, m, n, k, a_mode, b_mode)
    if path is not None:
        got = op.path(a, b, *values)
        assert got in ({path} if isinstance(path, str) else path), f"{what}: path {got!r}, expected {path}"
    ref = reference(op, a, b, values)
    out, buf = poisoned_out(op, tuple(ref.shape), out_gap, tight_out)
    d = op(a, b, *values, out=out)
    assert d.data_ptr() == out.data_ptr() and d.shape == ref.shape, what
    assert untouched_outside(out, buf), f"{what}: wrote outside out (its batch or row padding)"
    allocated = op(a, b, *values)
    assert allocated.shape == ref.shape and allocated.dtype == op.out_dtype, what
    if allocated.dim() == 3:
        assert_batch_contiguous(op, allocated)
    if ref.numel() == 0:
        return d
    for name, result in (("out=", d), ("allocated", allocated)):
        assert torch.isfinite(result).all(), f"{what} ({name}): unwritten elements (NaN), or NaN read from a gap"
        if k == 0 and not op.config.epilogue.operands:
            assert (result == 0).all(), f"{what} ({name}): K = 0 must give zeros"
            continue
        errors = rel_errors(result, ref)
        worst = int(errors.argmax())
        assert errors[worst] <= BOUND[op.dtype], (f"{what} ({name}): problem {worst} rel error "
                                                  f"{errors[worst].item():.3g} > {BOUND[op.dtype]}")
    return d


# -- numerics ------------------------------------------------------------------------------------------------

#: (batch, M, N, K, A's mode, B's mode): ragged sizes of 1, 7, 65, 129, 1000 mixed; batches of 1, 3, 17; every
#: batch stride. Each row is also run with out= of a padded batch stride (even rows) or a tight one (odd rows).
RAGGED_CASES = (
    (1, 1000, 129, 65, "packed", "packed"),
    (3, 129, 1000, 7, "packed", "packed"),
    (17, 65, 7, 1000, "packed", "packed"),
    (3, 1000, 65, 129, "padded", "padded"),
    (17, 7, 129, 65, "padded", "packed"),       # M = 7: the small-M kernel on layouts tn and tt
    (3, 65, 1000, 1000, "packed", "shared"),    # B 2-D (batch stride 0): x @ W on a 3-D x
    (17, 129, 65, 129, "shared", "padded"),     # A 2-D
    (3, 1000, 7, 65, "expand", "packed"),       # A (1, M, K).expand(3, M, K)
    (17, 65, 129, 7, "padded", "expand"),
    (3, 129, 65, 1000, "one", "packed"),        # A (1, M, K) against B (3, K, N): broadcast
    (17, 1, 1000, 129, "packed", "one"),
    (3, 65, 7, 1, "packed", "packed"),          # K = 1
    (3, 7, 1, 65, "padded", "padded"),          # N = 1
    (1, 1, 1, 1, "packed", "packed"),
    (17, 1000, 1000, 129, "padded", "shared"),
    (3, 129, 129, 1000, "packed", "padded"),
)


@pytest.mark.parametrize("key", PLAIN)
def test_ragged_against_float64(ops, key):
    """Every layout of both families (and stream-K): ragged sizes, batches of 1, 3 and 17, packed, padded, shared
    (2-D), expanded and size-1-broadcast operands; out= with a padded and a tight batch stride."""
    op = op_of(ops, key)
    for i, (batch, m, n, k, a_mode, b_mode) in enumerate(RAGGED_CASES):
        check(op, batch, m, n, k, a_mode, b_mode, out_gap=3 if i % 2 == 0 else 0, tight_out=i % 2 == 1)


#: (batch, M, N, K, A's mode, B's mode): at most 16 rows per problem, N and K ragged against the kernel's steps.
SMALL_M_CASES = (
    (3, 1, 4096, 4096, "packed", "packed"),
    (17, 2, 1000, 2048, "padded", "packed"),
    (3, 7, 129, 1000, "packed", "padded"),
    (1, 8, 65, 128, "packed", "packed"),
    (17, 9, 4097, 520, "padded", "shared"),     # B shared, A padded: not foldable, each problem small
    (3, 13, 1000, 72, "shared", "packed"),      # A shared
    (3, 16, 3000, 4104, "packed", "one"),       # B broadcast: may be folded (48 rows: the fast kernel)
    (17, 5, 129, 64, "packed", "shared"),       # may be folded (85 rows)
    (3, 5, 7, 100, "padded", "expand"),
    (3, 3, 1, 8, "packed", "packed"),
)


@pytest.mark.parametrize("key", SMALL_M_PLANS)
def test_small_m(ops, key):
    """M <= 16 per problem on layouts tn and tt takes the small-M kernel (op.path says so) unless the batch may be
    folded into M (or an N-major B is past its bounds); M = 17 the fast one."""
    op = op_of(ops, key)
    assert has_small_m_kernel(op.config)
    for batch, m, n, k, a_mode, b_mode in SMALL_M_CASES:
        check(op, batch, m, n, k, a_mode, b_mode, out_gap=2)
    check(op, 3, SMALL_M_MAX_ROWS + 1, 1000, 520, "packed", "packed", path="fast")


def test_small_m_only_where_a_is_k_major(ops):
    """At most 16 rows on a plan without the small-M kernel (A M-major): the fast kernel, right."""
    for key in ("sm80_nt_bf16", "sm80_nn_bf16", "sm90_nt_fp16_coop_c1x2", "sm90_nn_fp16_ws"):
        if key not in ops:
            continue
        op = ops[key]
        assert not has_small_m_kernel(op.config)
        for batch, m in ((3, 1), (17, 8), (3, 16)):
            check(op, batch, m, 520, 1000, "padded", "packed", path="fast" if m > 1 else None)


def odd(x: int) -> int:
    """An odd leading dimension >= x: never a multiple of 16 bytes."""
    return x if x % 2 else x + 1


@pytest.mark.parametrize("key", ["sm80_tn_fp16", "sm80_nn_bf16", "sm90_tn_bf16_coop_c2x1", "sm90_tt_bf16_pp_c2x1"])
def test_unaligned(ops, key):
    """An odd leading dimension of A or B, or an odd batch stride (every other matrix off the 16-byte rule): the
    unaligned kernel (problems far below the repacking volume), right, and op.path says so."""
    op = op_of(ops, key)
    cfg = op.config
    batch, m, n, k = 3, 100, 96, 98
    assert batch * m * n * k < REPACK_MIN_VOLUME
    a_outer_inner = (m, k) if cfg.layout.a.value == "row" else (k, m)
    b_outer_inner = (k, n) if cfg.layout.b.value == "row" else (n, k)
    cases = {
        "A odd leading dimension": dict(a=dict(ld=odd(a_outer_inner[1]))),
        "B odd leading dimension": dict(b=dict(ld=odd(b_outer_inner[1]))),
        "A odd batch stride": dict(a=dict(gap=1)),
        "B odd batch stride, A shared": dict(a_mode="shared", b=dict(gap=1)),
        "A odd leading dimension, B shared": dict(a=dict(ld=odd(a_outer_inner[1])), b_mode="shared"),
    }
    for label, case in cases.items():
        a_mode, b_mode = case.get("a_mode", "packed"), case.get("b_mode", "packed")
        a = matrices(a_mode, batch, m, k, cfg.layout.a.value, op.dtype, **case.get("a", {}))
        b = matrices(b_mode, batch, k, n, cfg.layout.b.value, op.dtype, **case.get("b", {}))
        check(op, batch, m, n, k, a_mode, b_mode, args=(a, b), path="unaligned", out_gap=1, label=f"{label}: ")
    if cfg.layout.blas == "tn":   # at most 16 rows with odd rows of A: the small-M kernel cannot take them either
        a = matrices("packed", batch, 5, 511, "row", op.dtype, ld=511)
        b = matrices("packed", batch, 511, n, "col", op.dtype)
        check(op, batch, 5, n, 511, args=(a, b), path="unaligned", label="M = 5, K = 511: ")


VECTOR_CASES = ((3, 129, 65, 1000, "packed", "packed"), (17, 7, 1000, 72, "padded", "packed"),
                (3, 1000, 129, 65, "packed", "shared"), (17, 65, 7, 129, "shared", "padded"),
                (3, 5, 4096, 520, "padded", "shared"), (3, 129, 1000, 64, "one", "expand"),
                (1, 65, 129, 1000, "packed", "packed"), (3, 65, 129, 0, "packed", "packed"))


@pytest.mark.parametrize("key", VECTOR_PLANS)
def test_vector_epilogue_shared_across_batch(ops, key):
    """silu(alpha * acc * scale + bias): one bias (N,), one scale (M,) and one alpha for every problem; the fast and
    small-M kernels, shared and broadcast operands, K = 0 (D = silu(bias) in every problem)."""
    op = op_of(ops, key)
    for batch, m, n, k, a_mode, b_mode in VECTOR_CASES:
        check(op, batch, m, n, k, a_mode, b_mode, out_gap=1)


@pytest.mark.parametrize("key", ["sm80_tn_fp16", "sm80_tt_fp16_dcol", "sm90_tn_bf16_coop_c2x1", STREAM_K])
def test_k_zero(ops, key):
    """K = 0: every D[b] = 0, written into the poisoned out= (the plain plans; epilogue(0): the vector test)."""
    op = op_of(ops, key)
    for batch, m, n, a_mode, b_mode in ((3, 129, 65, "packed", "packed"), (17, 7, 1000, "packed", "shared"),
                                        (3, 1000, 7, "shared", "padded")):
        check(op, batch, m, n, 0, a_mode, b_mode, out_gap=2, path=None)


def cuda_kernels(fn) -> list[str]:
    """The names of the CUDA kernels `fn` launched (empty where the profiler cannot see kernels)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("key", ["sm80_tn_fp16", "sm90_nt_fp16_coop_c1x2"])
def test_empty_problems_launch_nothing(ops, key):
    """M = 0 or N = 0 in each problem (or a batch of 0): an empty (batch, M, N) result, as torch.matmul, and no
    kernel launched."""
    op = op_of(ops, key)
    for batch, m, n, k in ((3, 0, 65, 129), (3, 129, 0, 65), (17, 0, 0, 7), (3, 0, 65, 0), (0, 129, 65, 72)):
        a, b = operands(op, batch, m, n, k)
        assert op(a, b).shape == (batch, m, n)
        out, buf = poisoned_out(op, (batch, m, n))
        assert cuda_kernels(lambda: op(a, b)) == [], f"{op.name}: batch={batch} M={m} N={n} K={k} launched a kernel"
        assert cuda_kernels(lambda: op(a, b, out=out)) == []
        assert untouched_outside(out, buf)
    a, b = operands(op, 3, 0, 65, 129, b_mode="shared")
    assert op(a, b).shape == (3, 0, 65)


# -- refusals --------------------------------------------------------------------------------------------------

def assert_still_right(op) -> None:
    check(op, 3, 129, 65, 200, "padded", "packed", label="after a refusal: ")
    check(op, 1, 129, 65, 200, "shared", "shared", label="after a refusal, 2-D: ")


REFUSED = {
    # name: (make (A, B, out or None) from the op, the error type)
    "batch sizes 3 and 2": (lambda op: (operands(op, 3, 64, 64, 64)[0], operands(op, 2, 64, 64, 64)[1], None),
                            ValueError),
    "A 4-D": (lambda op: (operands(op, 6, 64, 64, 64)[0].reshape(2, 3, 64, 64), operands(op, 3, 64, 64, 64)[1],
                          None), ValueError),
    "B 4-D": (lambda op: (operands(op, 3, 64, 64, 64)[0], operands(op, 6, 64, 64, 64)[1].reshape(2, 3, 64, 64),
                          None), ValueError),
    "out with batch stride 0": (lambda op: (*operands(op, 3, 64, 64, 64),
                                            poisoned_out(op, (1, 64, 64))[0].expand(3, 64, 64)), ValueError),
    "out of another batch size": (lambda op: (*operands(op, 3, 64, 64, 64), poisoned_out(op, (2, 64, 64))[0]),
                                  ValueError),
    "A requires grad": (lambda op: (operands(op, 3, 64, 64, 64)[0].detach().clone().requires_grad_(),
                                    operands(op, 3, 64, 64, 64)[1], None), RuntimeError),
    "shared B requires grad": (lambda op: (operands(op, 3, 64, 64, 64)[0],
                                           operands(op, 3, 64, 64, 64, b_mode="shared")[1].detach().clone()
                                           .requires_grad_(), None), RuntimeError),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refusals_then_right(ops, case):
    """Each refusal raises its documented type before any launch; the next calls (batched and 2-D) are right."""
    make, error = REFUSED[case]
    for key in ("sm80_tn_fp16", "sm90_tn_bf16_coop_c2x1"):
        if key not in ops:
            continue
        op = ops[key]
        a, b, out = make(op)
        with pytest.raises(error):
            op(a, b) if out is None else op(a, b, out=out)
        assert_still_right(op)


def test_matrix_operand_refused_on_batched_calls(ops):
    """An epilogue with an M x N operand takes no batched call (ValueError), whether C is 2-D or 3-D; its 2-D calls
    stay right."""
    op = ops["sm80_tn_fp16_matrix"]
    batch, m, n, k = 3, 129, 65, 200
    a, b = operands(op, batch, m, n, k)
    for c in (torch.randn(m, n, device="cuda").half(), torch.randn(batch, m, n, device="cuda").half()):
        with pytest.raises(ValueError):
            op(a, b, c)
        with pytest.raises(ValueError):
            op(a[0], b, c)   # A 2-D, B 3-D: batched too
    a2, b2 = a[1], b[2]
    c = torch.randn(m, n, device="cuda").half()
    d = op(a2, b2, c)
    ref = a2.double() @ b2.double() + c.double()
    assert rel_errors(d, ref).max() <= BOUND[torch.float16]
    assert_still_right(ops["sm80_tn_fp16"])


# -- stream-K, CUDA graphs, torch.compile ------------------------------------------------------------------------

def test_stream_k_batched_and_bit_identical(ops):
    """Stream-K over the tiles of every problem: few tiles (k tiles split), a partial last wave; right, and the same
    bits on every run (the partial sums are added in a fixed order)."""
    op = op_of(ops, STREAM_K)
    assert "_sk_" in op.name
    for batch, m, n, k, a_mode, b_mode in ((3, 17, 1000, 2048, "packed", "packed"),
                                           (17, 300, 520, 1104, "padded", "packed"),
                                           (3, 128, 4096, 4096, "packed", "shared"),
                                           (1, 2048, 4096, 512, "packed", "packed"),
                                           (17, 129, 65, 4104, "shared", "padded")):
        a, b = operands(op, batch, m, n, k, a_mode, b_mode)
        first = check(op, batch, m, n, k, a_mode, b_mode, args=(a, b), path={"fast"}).clone()
        for _ in range(3):
            assert torch.equal(op(a, b), first), f"{op.name} batch={batch} {m}x{n}x{k}: differs between runs"


def refill(static: torch.Tensor) -> None:
    """New random values in the matrices of `static` (a view: its padding and gaps keep theirs)."""
    static.copy_(torch.randn(static.shape, device="cuda").to(static.dtype))


@pytest.mark.parametrize("m", [8, 300])   # the small-M kernel where the plan has it, then the fast one
def test_cuda_graph_capture_and_replay(ops, m):
    """A batched call (3-D A and B; 3-D A and a shared B; vectors in the epilogue; stream-K's workspace) captured with
    torch.cuda.graph and replayed on new data in the same tensors: equal to eager calls."""
    for key in ("sm80_tn_fp16", "sm80_tn_bf16_vectors", "sm90_tn_bf16_coop_c2x1", STREAM_K):
        if key not in ops:
            continue
        op = ops[key]
        for a_mode, b_mode in (("padded", "packed"), ("packed", "shared")):
            batch, n, k = 3, 1024, 520
            a, b = operands(op, batch, m, n, k, a_mode, b_mode)
            values = epilogue_values(op, m, n)
            out = poisoned_out(op, (batch, m, n), gap=1)[0]
            op(a, b, *values, out=out)   # build and warm up outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                op(a, b, *values, out=out)
            for _ in range(2):
                for t in (a, b, *(v for v in values if isinstance(v, torch.Tensor))):
                    refill(t)
                graph.replay()
                torch.cuda.synchronize()
                # Eager into an out of the same strides: a packed D could let the batch fold into one taller problem
                # (common/batch.cuh fold_batch), whose tiles sum in another order.
                eager = poisoned_out(op, (batch, m, n), gap=1)[0]
                op(a, b, *values, out=eager)
                assert torch.equal(out, eager), (f"{op.name} batch={batch} M={m} A {a_mode} B {b_mode} "
                                                 f"({op.path(a, b, *values)}): replay differs from eager")
                assert rel_errors(out, reference(op, a, b, values)).max() <= BOUND[op.dtype]


@pytest.mark.parametrize("via", ["call", "torch.ops", "out="])
def test_torch_compile_fullgraph(ops, via):
    """torch.compile(fullgraph=True) of a function calling the op on 3-D inputs (and 3-D with 2-D): the fake gives
    (batch, M, N) in the plan's D order, and the compiled result equals the eager one."""
    for key in ("sm80_tn_fp16", "sm80_tt_fp16_dcol", "sm90_tn_bf16_coop_c2x1"):
        if key not in ops:
            continue
        op = ops[key]
        if via == "out=" and op.config.layout.c.value == "col":
            continue   # a non-contiguous out= is a graph break by Dynamo's own rule (README, torch integration)

        def f(a, b):
            if via == "call":
                d = op(a, b)
            elif via == "torch.ops":
                d = getattr(getattr(torch.ops, NAMESPACE), op.name)(a, b)
            else:
                batch = a.shape[0] if a.dim() == 3 else b.shape[0]
                d = torch.empty(batch, a.shape[-2], b.shape[-1], dtype=op.out_dtype, device="cuda")
                op(a, b, out=d)
            return torch.relu(d) * 2

        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True)
        with torch.no_grad():
            for a_mode, b_mode in (("packed", "packed"), ("packed", "shared"), ("shared", "padded")):
                a, b = operands(op, 3, 129, 65, 200, a_mode, b_mode)
                got, want = compiled(a, b), f(a, b)
                assert got.shape == want.shape == (3, 129, 65)
                torch.testing.assert_close(got, want)
                assert rel_errors(want, 2 * torch.relu(a.double() @ b.double())).max() <= BOUND[op.dtype]
