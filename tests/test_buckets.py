"""M-bucketed ops on the CPU: the plans Gemm.bucket_plans makes (pinned for the H100's decode-to-prefill range),
merging of equal neighbours, refusals, and BucketedOp's choice per call with stand-in ops (the GPU side:
tests/gpu/test_buckets_gpu.py)."""
from __future__ import annotations

import pytest

from generator import Gemm
from generator.gemm import M_BUCKETS

torch = pytest.importorskip("torch")

from generator.runtime import BucketedOp, MBucket  # noqa: E402


def test_bucket_plans_for_an_llm_layer():
    plans = Gemm("bf16", "tn", n=4096, k=4096, arch=90).bucket_plans()
    assert [(bound, plan.name) for bound, plan in plans] == [
        (64, "sm90_bf16_tn_64x64x64_c1x1_s12_pp_g1m"),    # 32 tiles of 64x128 would leave 3/4 of the SMs idle
        (128, "sm90_bf16_tn_128x64x64_c1x1_s8_coop_sk_g1m"),   # 64 tiles over 64 k tiles: split in two
        (256, "sm90_bf16_tn_64x128x64_c2x1_s8_pp_g8m"),   # 192 plans it too: merged
        # 384 plans 512's kernel too, but not its backward: dX at 384 tokens is computed swapped, in 128x96 tiles
        # (planner.backward.swaps_operands)
        (384, "sm90_bf16_tn_128x128x64_c2x1_s6_pp_g8m"),
        (512, "sm90_bf16_tn_128x128x64_c2x1_s6_pp_g8m"),
        (640, "sm90_bf16_tn_128x192x64_c2x1_s4_coop_g8m"),
        (768, "sm90_bf16_tn_128x192x64_c2x1_s4_coop_g8m"),
        (1024, "sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m"),
        (1536, "sm90_bf16_tn_128x192x64_c2x1_s4_coop_g8m"),   # 12 rows of 128x192 tiles: 2 waves on 132 SMs
        (2048, "sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m"),
        (2560, "sm90_bf16_tn_128x128x64_c2x1_s6_pp_g8m"),
        (3072, "sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m"),
        (3584, "sm90_bf16_tn_128x128x64_c2x1_s6_pp_g8m"),
        (None, "sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m"),
    ]
    # N = 6144 from 2560 rows: one kernel, three buckets, because their backward kernels (planned for each bucket's
    # problem) differ
    plans = Gemm("bf16", "tn", n=6144, k=4096, arch=90).bucket_plans()
    assert [(bound, plan.name) for bound, plan in plans][-4:] == [
        (2560, "sm90_bf16_tn_128x192x64_c2x1_s4_coop_g8m"),
        (3072, "sm90_bf16_tn_128x192x64_c2x1_s4_coop_g8m"),
        (3584, "sm90_bf16_tn_128x192x64_c2x1_s4_coop_g8m"),
        (None, "sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m"),
    ]
    # a bound every tile row (128) up to 1024, then every 256 and 512 rows
    assert M_BUCKETS == (64, 112, 128, 192, 256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072,
                         3584)
    # 112: the 64x128 pingpong tile of two tile rows below 128 (planner two_tile_rows_tile), a kernel of its own
    assert [plan.name for _, plan in Gemm("bf16", "tn", n=4544, k=4544, arch=90).bucket_plans()][1:3] == [
        "sm90_bf16_tn_64x128x64_c1x1_s8_pp_g8m", "sm90_bf16_tn_128x64x64_c1x1_s8_coop_g1m"]


def test_equal_neighbours_merge_and_knobs_stay():
    plans = Gemm("bf16", "tn", arch=80).bucket_plans((64, 128, 512))
    assert [bound for bound, _ in plans] == [128, None]   # M = 512 plans the large-M kernel: one bucket
    fixed = Gemm("bf16", "tn", n=4096, k=4096, arch=90, tile_shape=(128, 128, 64)).bucket_plans()
    assert {plan.config.tile for _, plan in fixed} == {(128, 128, 64)}


@pytest.mark.parametrize("bounds", [(512, 128), (0, 128), (128, 128)])
def test_bad_bounds_are_refused(bounds):
    with pytest.raises(ValueError, match="distinct positive row counts in increasing order"):
        Gemm("bf16", "tn", arch=90).bucket_plans(bounds)


class Recorder:
    def __init__(self, name: str) -> None:
        self.name, self.config, self.dtype, self.out_dtype, self.device_type = name, name, torch.bfloat16, \
            torch.bfloat16, "cuda"
        self.calls: list[int] = []

    def __call__(self, A, B, *operands, out=None, **named):
        self.calls.append(A.shape[0])
        return A @ B

    def path(self, A, B, *operands, **named) -> str:
        return "small_m" if A.shape[0] <= 16 else "fast"


def test_each_call_takes_its_buckets_kernel(monkeypatch):
    small, mid, large = Recorder("small"), Recorder("mid"), Recorder("large")
    op = BucketedOp([MBucket(128, small), MBucket(512, mid), MBucket(None, large)])
    for m in (1, 128, 129, 512, 513, 5000):
        op(torch.randn(m, 8), torch.randn(8, 4))
    assert (small.calls, mid.calls, large.calls) == ([1, 128], [129, 512], [513, 5000])
    assert op.path(torch.randn(4, 8), torch.randn(8, 4)) == "small: small_m"
    assert op.path(torch.randn(300, 8), torch.randn(8, 4)) == "mid: fast"
    assert op.config == "large" and "M <= 128: small" in repr(op)
    # Under torch.compile the graph calls one op for every M (no guard on M); reference ops have no op over all
    # buckets (BucketSetOp, tests/gpu/test_buckets_gpu.py), so the large-M one serves.
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    op(torch.randn(4, 8), torch.randn(8, 4))
    assert large.calls[-1] == 4


def test_batched_calls_take_the_bucket_of_all_their_rows():
    """A 3-D call is bucketed by M times its problems (the rows its grid fills), not by the batch size that a 3-D
    A's first dimension holds."""
    small, mid, large = Recorder("small"), Recorder("mid"), Recorder("large")
    op = BucketedOp([MBucket(128, small), MBucket(512, mid), MBucket(None, large)])
    op(torch.randn(4, 16, 8), torch.randn(8, 4))          # 64 rows: small, although M is 16
    op(torch.randn(8, 64, 8), torch.randn(8, 8, 4))        # 512 rows
    op(torch.randn(100, 8), torch.randn(3, 8, 4))          # a 2-D A times 3 matrices: 300 rows
    op(torch.randn(600, 1, 8), torch.randn(8, 4))          # 600 problems of one row
    assert (len(small.calls), len(mid.calls), len(large.calls)) == (1, 2, 1)
    assert BucketedOp.rows(torch.randn(5, 8), torch.randn(8, 4)) == 5


@pytest.mark.parametrize("bounds, message", [
    ((128, 64, None), r"bucket bounds \[128, 64\] must be distinct, increasing integers"),
    ((128, 512), r"the last one for any larger M \(max_m=None\)"),
    ((128, None, None), r"bucket bounds \[128, None\] must be distinct, increasing integers"),
])
def test_bucket_order_is_checked(bounds, message):
    with pytest.raises(ValueError, match=message):
        BucketedOp([MBucket(b, Recorder(str(b))) for b in bounds])
