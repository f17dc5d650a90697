"""What the GPU numerics tests share (test_numerics.py for the sm80 family, test_sm90.py for sm90): the
error bound per input dtype, the dtypes and layouts every family is checked with, and the ragged sizes
of the foundation issue (M, N, K each drawn from these); for the tests that build one module's plans of both
families at once (batched, grouped, list): the ops this GPU runs, and a skip for the others; and the NaN-padded
operands of the grouped backward tests (JIT ops and emitted packages)."""
from __future__ import annotations

import torch

#: ||D - ref|| / ||ref|| per input dtype.
BOUND = {torch.bfloat16: 1e-2, torch.float16: 5e-3}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
LAYOUTS = ("nn", "nt", "tn", "tt")
RAGGED = (1, 7, 8, 63, 64, 65, 127, 129, 1000, 4097)

#: Whether this GPU runs the sm90 family's kernels (built for sm_90a: compute capability 9.0 exactly).
IS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def ops_for_this_gpu(configs: dict, namespace: str) -> dict:
    """{key: op} for the configs ({key: KernelConfig}) this GPU runs (sm80 everywhere, sm90 on an sm_90 GPU), built
    in one parallel ninja run."""
    from generator.runtime import compile_many

    wanted = {key: cfg for key, cfg in configs.items() if IS_SM90 or cfg.family == "sm80"}
    return dict(zip(wanted, compile_many(list(wanted.values()), namespace=namespace)))


def op_of(ops: dict, key: str):
    """``ops[key]``, or a skip where this GPU does not run its kernel."""
    import pytest

    if key not in ops:
        pytest.skip("sm90 kernels need an sm_90 GPU")
    return ops[key]


def padded_ld(x: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """A leading dimension of at least ``x`` elements of ``dtype`` (at least one), a multiple of 16 bytes."""
    step = 16 // dtype.itemsize
    return max(step, -(-x // step) * step)


def nan_padded(rows: int, cols: int, order: str, dtype: torch.dtype, count: int | None = None) -> torch.Tensor:
    """A fresh random (rows, cols) matrix (with ``count``: (count, rows, cols) matrices), each stored ``order``-major
    with its leading dimension padded to 16 bytes and NaN in the padding (a wrong leading dimension reads NaN)."""
    outer, inner = (rows, cols) if order == "row" else (cols, rows)
    batch = () if count is None else (count,)
    buf = torch.full((*batch, outer, padded_ld(inner, dtype)), float("nan"), dtype=dtype, device="cuda")
    buf[..., :inner] = torch.randn(*batch, outer, inner, device="cuda").to(dtype)
    view = buf[..., :inner]
    return view if order == "row" else view.transpose(-1, -2)


def poison(dtype: torch.dtype, *shapes) -> None:
    """NaN blocks of these sizes, freed at once: the next allocations of those sizes (a backward's gradients) likely
    get them, so an unwritten element reads NaN."""
    for shape in shapes:
        torch.full(shape, float("nan"), dtype=dtype, device="cuda")


#: Where D's norm falls below this share of what the products' magnitudes make typical (||(|A| |B|)|| / sqrt(K): a sum
#: of K products of random signs), the error is measured against that instead: 1 x 1 x 4097 and 1 x 1 x 16384 products
#: whose sums cancelled read 1-9 % off relative to themselves, while their errors stayed below 2e-4 of ||(|A| |B|)||
#: as on every other call (gpu/repeat_ragged.py, docs/defects.md).
CANCELLATION_FLOOR = 0.1


def smallest_normal(dtype: torch.dtype) -> float:
    """Below it D's values are subnormals, rounded to a fixed absolute step (a 1 x 1 x 1 fp16 product of 3e-6 lands
    1 % off): the least norm an error is measured against. 1e-30 for integer D."""
    return torch.finfo(dtype).tiny if dtype.is_floating_point else 1e-30


def gemm_error(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| against float64's ``ref`` = A @ B, the denominator at least CANCELLATION_FLOOR of the
    norm a product of A's and B's magnitudes would typically have, and at least got's smallest normal; inf where got
    is not finite."""
    diff = (got.double() - ref).norm()
    if not torch.isfinite(diff):
        return float("inf")
    k = a.shape[-1]
    typical = (a.double().abs() @ b.double().abs()).norm() / max(k, 1) ** 0.5
    return (diff / torch.maximum(ref.norm(), CANCELLATION_FLOOR * typical).clamp_min(smallest_normal(got.dtype))).item()


def rel_error64(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| against a float64 ``ref``."""
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_grad(got, ref: torch.Tensor, t: torch.Tensor, what: str, bound: float) -> None:
    """A gradient of t: t's dtype, shape and storage order, packed; finite; within ``bound`` of float64's ``ref``."""
    assert got is not None, f"{what}: no gradient"
    assert got.dtype == t.dtype and got.shape == t.shape, f"{what}: {got.dtype} {tuple(got.shape)}"
    if got.numel() == 0:
        return
    if min(got.shape[-2:]) > 1:
        row = t.stride(-1) == 1
        assert (got.stride(-1) == 1) == row and (got.is_contiguous() or got.transpose(-1, -2).is_contiguous()), (
            f"{what}: strides {got.stride()}, the input's {t.stride()}")
    bad = ~torch.isfinite(got)
    assert not bad.any(), f"{what}: {int(bad.sum())} non-finite elements (unwritten, or read from NaN padding)"
    err = rel_error64(got, ref)
    assert err <= bound, f"{what}: rel error {err:.3g} > {bound}"
