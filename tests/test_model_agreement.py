"""benchmarks/model_agreement.py without a GPU: a kernel name becomes the config it names, and a pair's verdict is
the measured and the modelled winner agreeing."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import model_agreement  # noqa: E402
from generator import Gemm  # noqa: E402


@pytest.mark.parametrize("m, n, k", [(192, 1024, 8192), (768, 3072, 3072), (96, 1024, 4096), (2048, 4672, 4544)])
def test_a_planned_kernel_is_rebuilt_from_its_name(m, n, k):
    """The picks at these sizes: split-K, an odd N tile, 64x64 pingpong, a 2x1 cluster."""
    cfg = Gemm("bf16", "tn", arch=90, m=m, n=n, k=k).config
    assert model_agreement.config_of(cfg.name + "_bwd_512x1x1", m, n, k).name == cfg.name


def test_raster_and_cluster_come_from_the_name():
    name = "sm90_bf16_tn_128x256x64_c1x2_s4_coop_g4n"
    cfg = model_agreement.config_of(name, 1024, 4096, 2048)
    assert (cfg.name, cfg.raster, cfg.raster_group, cfg.cluster) == (name, "n", 4, (1, 2))


def test_a_name_it_cannot_rebuild_is_refused():
    with pytest.raises(ValueError, match="not a plain sm90 kernel name"):
        model_agreement.config_of("sm80_bf16_tn_128x128x32_w2x2_s4_g8", 128, 128, 128)


def test_a_pair_agrees_when_the_model_picks_the_faster_kernel():
    rows = [dict(m=768, n=4096, k=3584, kernel="sm90_bf16_tn_128x192x64_c1x1_s4_coop_g8m", ours_ms=1.0,
                 alt_kernel="sm90_bf16_tn_128x256x64_c1x1_s4_coop_g8n", alt_ms=0.8)]
    (pair,) = model_agreement.pairs_of(rows + rows)   # the same GEMM twice is one pair
    assert pair.measured == pytest.approx(0.8)
    assert pair.modelled > 1   # the model prefers 128x192 (one full wave) here, which measured slower
    assert not pair.agrees
