"""The pure parts of the GPU sweep tools under gpu/: what their command lines mean (no GPU needed)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "gpu"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import midm_tiles  # noqa: E402


def test_midm_candidates_take_split_k_and_stages() -> None:
    parsed = midm_tiles.parse_candidates("64x64x64:2x1:pp:s8,128x128x64:1x1:coop:sk,64x128x64:1x1:pp")
    assert parsed == [((64, 64, 64), (2, 1), "pingpong", False, 8, None),
                      ((128, 128, 64), (1, 1), "cooperative", True, None, None),
                      ((64, 128, 64), (1, 1), "pingpong", False, None, None)]
    rastered, = midm_tiles.parse_candidates("128x192x64:1x2:coop:g8m")
    assert rastered.raster == ("m", 8) and rastered.hints()["raster_group"] == 8
    for bad in ("64x64x64:1x1:fast", "64x64x64:1x1:pp:s8:s9", "64x64x64:1x1:pp:turbo", "64x64x64:1x1:pp:g8m:g1n"):
        with pytest.raises(SystemExit, match="write TILE:CLUSTER:pp|coop"):
            midm_tiles.parse_candidates(bad)


def test_midm_configs_follow_the_layout_and_skip_what_is_illegal(capsys: pytest.CaptureFixture[str]) -> None:
    candidates = midm_tiles.parse_candidates("64x64x64:1x1:pp:sk,128x144x64:1x1:coop,64x64x64:1x1:pp:s8")
    forward = midm_tiles.configs_for(1, 2048, 4096, candidates, "tn")
    backward = midm_tiles.configs_for(1, 2048, 4096, candidates, "tt")
    assert all(c.layout.tag == "tn" for c in forward) and all(c.layout.tag == "tt" for c in backward)
    assert any(c.stream_k for c in backward) and any(c.stages == 8 for c in backward)
    assert any(c.tile == (128, 144, 64) for c in forward)          # an odd N tile takes a K-major B ...
    assert not any(c.tile == (128, 144, 64) for c in backward)     # ... and is skipped, with the reason, for tt
    assert "skip (128, 144, 64)" in capsys.readouterr().out


def test_midm_variants_change_fields_of_the_pick(capsys: pytest.CaptureFixture[str]) -> None:
    """--variants raster=n,raster_group=4: the pick, then the pick with those fields changed; an illegal variant is
    skipped with the reason, a field that is not a config's refused."""
    variants = midm_tiles.parse_variants("raster=n,raster_group=4,raster_group=3")
    assert variants == [{"raster": "n"}, {"raster_group": 4}, {"raster_group": 3}]
    pick, *others = midm_tiles.configs_for(512, 2048, 2048, [], "tn", variants)
    assert [(c.raster, c.raster_group) for c in others] == [("n", pick.raster_group), (pick.raster, 4)]
    assert "skip" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="FIELD=VALUE"):
        midm_tiles.parse_variants("colour=blue")


def test_midm_k_fits_a_line_per_kernel_where_k_was_swept() -> None:
    """A sweep of K at a fixed M x N: each kernel's time and cuBLAS's as fixed + per-1024-of-K cost; a kernel timed at
    fewer than three K values (another M x N, or a pick that changed along the sweep) gets none."""
    rows = [dict(m=256, n=512, k=k, kernel="ours", ms=(5.0 + 3.0 * k / 1024) / 1e3, cublas_ms=(7.0 + k / 1024) / 1e3)
            for k in (512, 1024, 2048, 4096)]
    rows.append(dict(m=512, n=512, k=512, kernel="ours", ms=1e-2, cublas_ms=1e-2))
    fits = midm_tiles.k_fits(rows)
    assert set(fits) == {(256, 512, "ours"), (256, 512, "cuBLAS")}
    assert fits[(256, 512, "ours")]["fixed_us"] == pytest.approx(5.0)
    assert fits[(256, 512, "ours")]["us_per_1024_k"] == pytest.approx(3.0)
    assert fits[(256, 512, "cuBLAS")]["us_per_1024_k"] == pytest.approx(1.0)


def test_no_script_folder_shadows_a_standard_module():
    """Tests put gpu/ and benchmarks/ on sys.path, which processes they spawn inherit: a gpu/profile.py there once
    made torch.distributed.checkpoint's `import cProfile` fail in tests/test_fsdp_cpu.py's ranks."""
    shadowing = sorted(f"{folder}/{path.name}" for folder in ("gpu", "benchmarks", "examples", "tests")
                       for path in (ROOT / folder).glob("*.py") if path.stem in sys.stdlib_module_names)
    assert not shadowing, f"rename these scripts, they shadow standard modules: {shadowing}"


def test_midm_plans_for_the_visible_gpu_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """arch=None (--arch visible, the default) plans with the visible part's rules: on an H200 a 128x128 pingpong pick
    takes the filling odd width (rule 19), shown beside the model's pick; arch=90 keeps the H100's plan."""
    from tune_cases import visible_h200

    visible_h200(monkeypatch)
    pick, model = midm_tiles.configs_for(384, 3072, 2048, [], beside_model=True, arch=None)
    assert pick.tile[:2] == (128, 80) and model.tile[:2] == (128, 128)
    assert midm_tiles.configs_for(384, 3072, 2048, [], arch=90)[0].tile[:2] == (128, 128)


def test_a_staging_variant_moves_the_stages_its_buffers_take() -> None:
    """bench.variant_of: staging_in_ring without stages gives or takes the stages of the staging buffers' bytes (a
    staged 128x96 pingpong pick: 8 stages, unstaged 6); other fields are set as given; an illegal one raises."""
    from bench import variant_of
    from generator import Gemm

    pick = Gemm("bf16", "tn", arch=90, schedule="pingpong", tile_shape=(128, 96, 64), cluster_shape=(1, 1)).config
    assert pick.staging_in_ring and pick.stages == 8
    unstaged = variant_of(pick, {"staging_in_ring": False})
    assert not unstaged.staging_in_ring and unstaged.stages == 6
    assert variant_of(pick, {"raster_group": 4}).raster_group == 4
    with pytest.raises(ValueError):
        variant_of(pick, {"stages": 40})
